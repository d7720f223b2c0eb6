"""What a bench run measured, as one ``xarray.Dataset``, and the files written from it.

:class:`MethodResult` (one method on one case) and :class:`CaseResult` (one
case: its cluster, ``T_series`` runs, probe and methods) are filled by the
harness (:mod:`dask_rpm.bench.harness`); :func:`bench_dataset` turns a run's
case results into the dataset, and :func:`summary_rows`,
:func:`markdown_table`, :func:`plot_bench` and :func:`write_outputs` are the
``--json`` rows, ``bench.md``, ``bench.png`` and ``bench.nc``. No
``distributed`` here: results written earlier can be reported again.
"""

from __future__ import annotations

import datetime
import math
import os
import platform
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from .._files import atomic_write, atomic_write_text
from ..records import PHASES
from .profiles import BenchCase, gamma

if TYPE_CHECKING:  # xarray costs about 0.3 s to import: only functions building datasets load it
    import xarray as xr

__all__ = [
    "MethodResult",
    "CaseResult",
    "bench_dataset",
    "summary_rows",
    "markdown_table",
    "plot_bench",
    "write_outputs",
]


@dataclass
class MethodResult:
    """What one method measured on one case."""

    seconds_per_iteration: float = math.nan
    seconds_mean: float = math.nan
    iteration_time: np.ndarray = field(default_factory=lambda: np.zeros(0))
    iterations: int = 0
    remaps: int = 0
    n_columns: int = 0
    final_error: float = math.nan
    plan: str = ""
    skipped: str = ""
    wall: float = math.nan
    #: final parameters (W, V; W_1 .. W_L, V for a deep network), to check that every method
    #: trained the same batches (not written out)
    weights: Sequence[np.ndarray] | None = None
    #: relative max difference of the final weights to fit_serial's (same data, batches, lr); NaN: not checked
    weights_vs_serial: float = math.nan
    #: seconds per engine phase (PHASES), steady-state median, mean over workers; empty for ddp
    phases: dict[str, float] = field(default_factory=dict)


@dataclass
class CaseResult:
    """What one case measured: its cluster, the ``T_series`` runs, the probe and every method."""

    case: BenchCase
    #: seconds per iteration of the job on worker i alone
    series: np.ndarray = field(default_factory=lambda: np.zeros(0))
    label: str = ""  # the cluster's EMULATED label
    scale: float = math.nan  # what speed 1.0 stands for, in cores
    #: probed throughputs (work units per second), when a method needed them
    probed: list[float] | None = None
    latency: float = math.nan
    bandwidth: float = math.nan
    methods: dict[str, MethodResult] = field(default_factory=dict)
    overrun_fraction: float = math.nan
    load_start: float = math.nan
    load_end: float = math.nan


def bench_dataset(
    results: Sequence[CaseResult], methods: Sequence[str], *, iterations: int, attrs: dict[str, Any]
) -> xr.Dataset:
    """The dataset of a run: ``(case, method)`` timings, per-worker speeds, the weight check.

    ``attrs`` are the run's settings (iterations, interval, ...); the
    machine, the date and the EMULATED labels are added here.
    """
    import xarray as xr  # see TYPE_CHECKING above

    methods = list(methods)
    cases = [r.case for r in results]
    ds = xr.Dataset(
        {
            **_method_vars(results, methods, iterations),
            **_worker_vars(results),
            **_case_vars(results),
        },
        coords=_coords(cases, methods, iterations),
        attrs={**_machine_attrs(), **attrs},
    )
    _add_batch_fields(ds, results, methods)
    return ds


def _method_vars(
    results: Sequence[CaseResult], methods: list[str], iterations: int
) -> dict[str, Any]:
    """The ``(case, method)`` and ``(case, method, iteration)`` variables."""
    C, M = len(results), len(methods)
    spi, mean, gam, ratio, err = (np.full((C, M), np.nan) for _ in range(5))
    its, remaps, cols = (np.zeros((C, M), dtype=int) for _ in range(3))
    plan, skipped = (np.full((C, M), "", dtype=object) for _ in range(2))
    itime = np.full((C, M, iterations), np.nan)
    for c, res in enumerate(results):
        for k, method in enumerate(methods):
            r = res.methods[method]
            spi[c, k], mean[c, k] = r.seconds_per_iteration, r.seconds_mean
            gam[c, k] = gamma(r.seconds_per_iteration, res.series)
            its[c, k], remaps[c, k], cols[c, k] = r.iterations, r.remaps, r.n_columns
            err[c, k], plan[c, k], skipped[c, k] = r.final_error, r.plan, r.skipped
            n_it = min(iterations, r.iteration_time.size)
            itime[c, k, :n_it] = r.iteration_time[:n_it]
        if "drpm" in methods:
            ratio[c] = spi[c] / spi[c, methods.index("drpm")]
    cm = ("case", "method")
    return {
        "seconds_per_iteration": (
            cm,
            spi,
            {
                "units": "s",
                "description": "median iteration time over the second half of the run (steady state)",
            },
        ),
        "seconds_per_iteration_mean": (
            cm,
            mean,
            {
                "units": "s",
                "description": "mean iteration time over the whole run (DRPM's learning included)",
            },
        ),
        "gamma": (
            cm,
            gam,
            {
                "units": "1",
                "description": "parallel efficiency (1/T_parallel) / sum_i 1/T_series(i)",
            },
        ),
        "ratio_to_drpm": (
            cm,
            ratio,
            {
                "units": "1",
                "description": "seconds_per_iteration / DRPM's (above 1: slower than DRPM)",
            },
        ),
        "iterations": (cm, its, {"units": "1"}),
        "remaps": (cm, remaps, {"units": "1"}),
        "n_columns": (cm, cols, {"units": "1", "description": "columns of the final plan"}),
        "final_error": (cm, err, {"units": "1"}),
        "plan": (cm, plan, {"description": "final plan as JSON"}),
        "skipped": (cm, skipped, {"description": "why the method did not run, else empty"}),
        "iteration_time": (("case", "method", "iteration"), itime, {"units": "s"}),
    }


def _worker_vars(results: Sequence[CaseResult]) -> dict[str, Any]:
    """The ``(case, worker)`` variables: ``T_series``, the EMULATED, assumed and probed speeds."""
    C, W = len(results), max(r.case.n for r in results)
    series, speeds, assumed, probed = (np.full((C, W), np.nan) for _ in range(4))
    for c, res in enumerate(results):
        n = res.case.n
        series[c, :n], speeds[c, :n], assumed[c, :n] = res.series, res.case.speeds, res.case.assumed
        if res.probed is not None:
            p = np.asarray(res.probed, dtype=float)
            probed[c, :n] = p / p.max()
    cw = ("case", "worker")
    return {
        "series_seconds": (
            cw,
            series,
            {
                "units": "s",
                "description": "T_series(i): the same job on worker i alone, s/iteration",
            },
        ),
        "speed": (cw, speeds, {"units": "1", "description": "EMULATED true relative speed"}),
        "ability_assumed": (
            cw,
            assumed,
            {"units": "1", "description": "the paper's assumed ability profile"},
        ),
        "ability_probed": (cw, probed, {"units": "1", "description": "probed, max 1"}),
    }


def _case_vars(results: Sequence[CaseResult]) -> dict[str, Any]:
    """The per-case variables: the cluster's scale, contention, links and load."""

    def per_case(name: str) -> np.ndarray:
        return np.array([float(getattr(r, name)) for r in results])

    return {
        "scale": (
            ("case",),
            per_case("scale"),
            {"units": "core", "description": "EMULATED: what speed 1.0 stands for"},
        ),
        "overrun_fraction": (
            ("case",),
            per_case("overrun_fraction"),
            {"units": "1", "description": "paced blocks that overran their target (contention)"},
        ),
        "latency": (
            ("case",),
            per_case("latency"),
            {"units": "s", "description": "probed worker-to-worker latency"},
        ),
        "bandwidth": (
            ("case",),
            per_case("bandwidth"),
            {"units": "bytes/s", "description": "probed bandwidth"},
        ),
        "load_start": (
            ("case",),
            per_case("load_start"),
            {"units": "1", "description": "1-minute load average"},
        ),
        "load_end": (("case",), per_case("load_end"), {"units": "1"}),
        "emulation_label": (("case",), np.asarray([r.label for r in results], dtype=object)),
    }


def _coords(cases: list[BenchCase], methods: list[str], iterations: int) -> dict[str, Any]:
    return {
        "case": [c.name for c in cases],
        "workload": ("case", [c.workload for c in cases]),
        "condition": ("case", [c.condition for c in cases]),
        "N": ("case", [c.n for c in cases]),
        "shape": ("case", ["-".join(map(str, c.shape)) for c in cases]),
        "samples": ("case", [c.samples for c in cases]),
        "step_worker": ("case", [-1 if c.step_worker is None else c.step_worker for c in cases]),
        "step_at": ("case", [-1 if c.step_at is None else c.step_at for c in cases]),
        "method": methods,
        "worker": np.arange(max(c.n for c in cases)),
        "iteration": np.arange(iterations),
    }


def _machine_attrs() -> dict[str, Any]:
    """The EMULATED label, the machine and the date every bench dataset carries."""
    return {
        "title": "dask-rpm bench: EMULATED heterogeneity on one machine (not hardware figures)",
        "emulation": "EMULATED heterogeneity on one machine: workers share the cores; slow workers sleep "
        "in proportion to their CPU time (docs/emulation.md)",
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_implementation()} "
        f"{platform.python_version()}",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cores": int(os.cpu_count() or 0),
    }


def _add_batch_fields(ds: xr.Dataset, results: Sequence[CaseResult], methods: list[str]) -> None:
    """Mini-batch size per case, the weight check against ``fit_serial`` and the phase profile."""
    cases = [r.case for r in results]
    ds.coords["batch_size"] = (
        "case",
        np.array([c.batch for c in cases], dtype=int),
        {
            "units": "samples",
            "description": "samples per iteration: the mini-batch size (= samples for full-batch training)",
        },
    )
    ds.coords["full_batch"] = ("case", np.array([c.batch_size is None for c in cases], dtype=bool))
    check = np.full((len(cases), len(methods)), np.nan)
    phases = np.full((len(cases), len(methods), len(PHASES)), np.nan)
    for c, res in enumerate(results):
        for k, method in enumerate(methods):
            r = res.methods[method]
            check[c, k] = r.weights_vs_serial
            for j, p in enumerate(PHASES):
                phases[c, k, j] = r.phases.get(p, np.nan)
    ds["weights_vs_serial"] = (
        ("case", "method"),
        check,
        {
            "units": "1",
            "description": "max |final weights - fit_serial's| / max |fit_serial's| (same data, "
            "mini-batches, learning rate): every method trained the same batches; "
            "NaN: not checked",
        },
    )
    ds.coords["phase"] = list(PHASES)
    ds["phase_seconds"] = (
        ("case", "method", "phase"),
        phases,
        {
            "units": "s",
            "description": "steady-state seconds per engine phase (median over the second half, mean "
            "over workers; forward/backward paced compute, *_wait/horizontal exchanges "
            "incl. waiting); NaN for the DDP peer",
        },
    )


def summary_rows(ds: Any) -> list[dict[str, Any]]:
    """One row per (case, method) that ran: the ``--json`` list."""

    def num(v: Any) -> float | None:
        v = float(v)
        return v if math.isfinite(v) else None

    rows = []
    for c in range(ds.sizes["case"]):
        for k, method in enumerate(ds["method"].values.tolist()):
            if str(ds["skipped"].values[c, k]):
                continue
            rows.append(
                {
                    "method": method,
                    "condition": str(ds["condition"].values[c]),
                    "N": int(ds["N"].values[c]),
                    "gamma": num(ds["gamma"].values[c, k]),
                    "seconds_per_iteration": num(ds["seconds_per_iteration"].values[c, k]),
                    "workload": str(ds["workload"].values[c]),
                    "ratio_to_drpm": num(ds["ratio_to_drpm"].values[c, k]),
                    "batch_size": _batch_of(ds, c),
                }
            )
    return rows


def _batch_of(ds: Any, c: int) -> int | None:
    """Mini-batch size of case ``c``; None for full batch (and for results written before mini-batches existed)."""
    if "full_batch" not in ds.coords or bool(ds["full_batch"].values[c]):
        return None
    return int(ds["batch_size"].values[c])


def markdown_table(ds: Any) -> str:
    """The summary as a markdown table headed by the EMULATED label."""
    lines = [
        "**EMULATED heterogeneity on one machine** (not hardware figures): "
        f"{ds.attrs.get('machine', '')}, {ds.attrs.get('date', '')}, {ds.attrs.get('iterations')} iterations "
        f"per method (steady state: median of the second half), T_series over "
        f"{ds.attrs.get('series_iterations')} iteration(s), R = {ds.attrs.get('interval')}.",
        "",
        "| workload | condition | N | method | s/iteration | gamma | vs DRPM | columns | remaps |",
        "| --- | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    notes = []
    for c in range(ds.sizes["case"]):
        wl, cond, n = _workload_label(ds, c), str(ds["condition"].values[c]), int(ds["N"].values[c])
        for k, method in enumerate(ds["method"].values.tolist()):
            why = str(ds["skipped"].values[c, k])
            if why:
                lines.append(f"| {wl} | {cond} | {n} | {method} | skipped | | | | |")
                notes.append(f"{method} skipped: {why}")
                continue
            r = float(ds["ratio_to_drpm"].values[c, k])
            lines.append(
                f"| {wl} | {cond} | {n} | {method} | {float(ds['seconds_per_iteration'].values[c, k]):.3f} | "
                f"{float(ds['gamma'].values[c, k]):.3f} | {'' if not math.isfinite(r) else f'{r:.2f}x'} | "
                f"{int(ds['n_columns'].values[c, k])} | {int(ds['remaps'].values[c, k])} |"
            )
    lines.append("")
    for c in range(ds.sizes["case"]):
        n = int(ds["N"].values[c])
        ts = ", ".join(f"{v:.3g}" for v in ds["series_seconds"].values[c, :n])
        sp = ", ".join(f"{v:g}" for v in ds["speed"].values[c, :n])
        lines.append(
            f"* {ds['case'].values[c]} ({ds['shape'].values[c]}, s = {int(ds['samples'].values[c])}): "
            f"EMULATED speeds {sp} x scale {float(ds['scale'].values[c]):.3f} of a core; T_series {ts} s; "
            f"paced blocks overrun {100 * float(ds['overrun_fraction'].values[c]):.0f} %; "
            f"load {float(ds['load_start'].values[c]):.1f} -> {float(ds['load_end'].values[c]):.1f}"
            f"{_weights_note(ds, c)}"
        )
    for note in dict.fromkeys(notes):
        lines.append(f"* {note}")
    lines.extend(_phase_lines(ds))
    return "\n".join(lines) + "\n"


def _workload_label(ds: Any, c: int) -> str:
    wl, b = str(ds["workload"].values[c]), _batch_of(ds, c)
    return wl if b is None else f"{wl} B={b}"


def _weights_note(ds: Any, c: int) -> str:
    """``; final weights vs fit_serial ...`` for the markdown case line (empty when not checked)."""
    if "weights_vs_serial" not in ds:
        return ""
    v = np.asarray(ds["weights_vs_serial"].values[c], dtype=float)
    v = v[np.isfinite(v)]
    if not v.size:
        return ""
    b = _batch_of(ds, c)
    batches = (
        ""
        if b is None
        else f"mini-batches of {b} ({-(-int(ds['samples'].values[c]) // b)} per epoch); "
    )
    return f"; {batches}final weights of every method vs fit_serial: max relative difference {float(v.max()):.1e}"


def _phase_lines(ds: Any) -> list[str]:
    """Where the time goes (engine phases, steady state) for the mini-batch cases."""
    if "phase_seconds" not in ds:
        return []
    mini = [c for c in range(ds.sizes["case"]) if _batch_of(ds, c) is not None]
    phases = ds["phase"].values.tolist()
    rows = []
    for c in mini:
        for k, method in enumerate(ds["method"].values.tolist()):
            v = ds["phase_seconds"].values[c, k]
            if str(ds["skipped"].values[c, k]) or not np.isfinite(v).any():
                continue
            rows.append(
                f"| {ds['case'].values[c]} | {method} | "
                + " | ".join(f"{1e3 * float(t):.1f}" for t in v)
                + f" | {1e3 * float(ds['seconds_per_iteration'].values[c, k]):.1f} |"
            )
    if not rows:
        return []
    return [
        "",
        "Engine phases, ms per iteration (steady state, mean over workers; EMULATED):",
        "",
        "| case | method | " + " | ".join(phases) + " | iteration |",
        "| --- | --- |" + " ---: |" * (len(phases) + 1),
        *rows,
    ]


def plot_bench(ds: Any, path: str) -> str:
    """Bar charts of gamma and s/iteration per case and method (PNG); returns the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = ds["method"].values.tolist()
    cases = ds["case"].values.tolist()
    steps = [c for c in range(len(cases)) if int(ds["step_worker"].values[c]) >= 0]
    ncols = 3 if steps else 2
    fig, axes = plt.subplots(1, ncols, figsize=(6 * ncols, 4.8))
    xs = np.arange(len(cases))
    width = 0.8 / max(len(methods), 1)
    for k, method in enumerate(methods):
        for ax, var in zip(axes[:2], ("gamma", "seconds_per_iteration")):
            ax.bar(
                xs + (k - (len(methods) - 1) / 2) * width, ds[var].values[:, k], width, label=method
            )
    for ax, title in zip(
        axes[:2], ("parallel efficiency gamma", "seconds per iteration (steady state)")
    ):
        ax.set_xticks(xs, [c.replace("/", "\n") for c in cases], fontsize=8)
        ax.set_title(title)
        ax.grid(axis="y", alpha=0.3)
    axes[0].axhline(0.85, color="k", lw=0.8, ls="--")
    axes[0].legend(fontsize=7, ncol=2)
    if steps:
        c = steps[0]
        ax = axes[2]
        for k, method in enumerate(methods):
            ax.plot(
                ds["iteration"].values, ds["iteration_time"].values[c, k], marker=".", label=method
            )
        ax.axvline(int(ds["step_at"].values[c]), color="k", lw=0.8, ls="--")
        ax.set_title(f"load step: {cases[c]}")
        ax.set_xlabel("iteration")
        ax.set_ylabel("s")
        ax.legend(fontsize=7, ncol=2)
    fig.suptitle(
        f"EMULATED heterogeneity on one {ds.attrs.get('cores', os.cpu_count())}-core machine "
        f"(not hardware figures) - dask-rpm bench"
    )
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
    plt.close(fig)
    return path


def write_outputs(ds: Any, out_dir: str, *, plot: bool = True) -> dict[str, str]:
    """Write ``bench.nc`` (netCDF), ``bench.md`` and ``bench.png`` into ``out_dir`` atomically."""
    os.makedirs(out_dir, exist_ok=True)
    paths = {
        "netcdf": os.path.join(out_dir, "bench.nc"),
        "markdown": os.path.join(out_dir, "bench.md"),
    }
    atomic_write(paths["netcdf"], lambda tmp: ds.to_netcdf(tmp, engine="h5netcdf"))
    table = markdown_table(ds)
    atomic_write_text(paths["markdown"], table)
    if plot:
        paths["png"] = plot_bench(ds, os.path.join(out_dir, "bench.png"))
    return paths
