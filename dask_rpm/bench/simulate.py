"""``dask-rpm simulate``: predicted gamma and iteration time for large clusters (SIMULATION).

Pure module (numpy, xarray, matplotlib for the plot; no ``distributed``, no torch:
the profiles ``A`` and ``B`` come from :mod:`dask_rpm.bench.profiles`).
The command line is :mod:`dask_rpm.cli.simulate`.
Nothing here is measured: iteration times come from the latency-bandwidth
model :func:`dask_rpm.cost.predict_iteration_seconds` applied to the plans
SRPM-time, SRPM, the proportional 1-D split and method 1 (uniform) make for
``N`` workers of a given speed distribution.

Exchanges (``exchanges=``): ``scalable`` (default) charges the tree / ring /
recursive-halving / direct allreduces of :mod:`dask_rpm.comm.exchange`, the
cheapest per column and per band group; ``engine`` what the engine sends
today (allgather or leader in a column, one message per overlapping pair
across columns); ``paper`` the paper-style model (one gatherer, bands one
after another). Every method is charged with the same exchanges.

Model of one worker: speed ``v_i`` (relative) times ``unit_rate`` work units
(hidden unit x sample) per second. ``T_series(i) = m s / (unit_rate v_i)``
(the job alone on worker i, no communication), so

    gamma = (1 / T_parallel) / sum_i (1 / T_series(i))
          = m s / (T_parallel * unit_rate * sum_i v_i).

Weak scaling: ``s = samples_per_worker * N``. Method 1 uses the N_DP (divisor
of N) with the smallest predicted time; SRPM-time gets the workers' rates and
the network and minimises the predicted time itself.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import dask.config
import numpy as np

from .._files import atomic_write
from ..comm import CostSettings, Interconnect
from ..cost import predict_iteration_seconds
from ..nn.batches import batch_plan
from ..plan.partition import Plan
from ..planners import fastest_grid, make_plan, parse_shape
from .profiles import true_profile

if TYPE_CHECKING:  # xarray costs about 0.3 s to import: only functions building datasets load it
    import xarray as xr

__all__ = [
    "DEFAULT_NS",
    "SIM_METHODS",
    "EXCHANGES",
    "DEFAULT_UNIT_RATE",
    "SimulateError",
    "speeds_for",
    "simulate",
    "check_against_bench",
    "plot_simulation",
    "markdown",
]

DEFAULT_NS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
SIM_METHODS = ("srpm-time", "srpm", "split-1d", "uniform")
#: exchanges= name -> (vertical, horizontal) modes of dask_rpm.cost.predict_breakdown
EXCHANGES = {
    "scalable": ("best", "best"),
    "engine": ("engine", "engine"),
    "paper": ("gather", "bands"),
}
#: One core of this machine runs the float64 kernels at ~25 GFLOP/s, ~968 flop per work unit
#: for n-l = 203-26 (docs/benchmarks.md): about 2.6e7 work units per second.
DEFAULT_UNIT_RATE = 2.6e7


class SimulateError(ValueError):
    """Bad simulation arguments."""


def speeds_for(distribution: str, n: int, *, seed: int = 0) -> np.ndarray:
    """Relative speeds of ``n`` workers.

    ``equal``; ``A`` / ``B`` (the bench's EMULATED truth of docs/method.md §8,
    repeated); ``uniform:LO,HI`` (seeded random); ``two:FRACTION,SLOW``
    (that fraction of workers at speed SLOW, the rest at 1).
    """
    d = distribution.strip()
    if d == "equal":
        return np.ones(n)
    if d in ("A", "B"):
        prof = np.asarray(true_profile(d, 8))
        return np.resize(prof, n)
    kind, _, arg = d.partition(":")
    try:
        vals = [float(v) for v in arg.split(",")] if arg else []
    except ValueError:
        vals = []
    if (
        kind == "uniform"
        and len(vals) == 2
        and 0 < vals[0] <= vals[1]
        and all(map(math.isfinite, vals))
    ):
        return np.random.default_rng(seed).uniform(vals[0], vals[1], size=n)
    if (
        kind == "two"
        and len(vals) == 2
        and 0 <= vals[0] <= 1
        and 0 < vals[1]
        and math.isfinite(vals[1])
    ):
        k = int(round(vals[0] * n))
        return np.array([vals[1]] * k + [1.0] * (n - k))
    raise SimulateError(
        f"distribution {distribution!r} is not valid; use equal, A, B, uniform:LO,HI (0 < LO <= HI) "
        f"or two:FRACTION,SLOW (0 <= FRACTION <= 1, SLOW > 0)"
    )


def _gamma(seconds: float, work: float, rates: np.ndarray) -> float:
    return float(work / (seconds * rates.sum()))


def _predict(
    method: str,
    speeds: np.ndarray,
    shape: tuple[int, int, int],
    samples: int,
    rates: np.ndarray,
    network: Any,
    modes: tuple[str, str],
) -> tuple[float, Any]:
    vertical, horizontal = modes
    kw = dict(network=network, vertical=vertical, horizontal=horizontal)
    if method == "uniform":
        plan, t = fastest_grid(np.ones(len(speeds)), shape, samples, "uniform", list(rates), **kw)
        return t, plan
    with dask.config.set({"rpm.cost.vertical": vertical, "rpm.cost.horizontal": horizontal}):
        plan = make_plan(speeds, shape, samples, method=method, rates=list(rates), network=network)
    return predict_iteration_seconds(plan, list(rates), **kw), plan


def _check_arguments(
    ns: list[int],
    samples_per_worker: int,
    latency: float,
    bandwidth: float,
    overhead: float,
    unit_rate: float,
    methods: Sequence[str],
    exchanges: str,
) -> None:
    """Refuse (:class:`SimulateError`) settings the model cannot price."""
    if exchanges not in EXCHANGES:
        raise SimulateError(f"exchanges={exchanges!r} is not one of {', '.join(EXCHANGES)}")
    if not (overhead >= 0 and math.isfinite(overhead)):
        raise SimulateError(f"overhead={overhead} must be >= 0 seconds per message")
    if not ns or any(n < 1 for n in ns):
        raise SimulateError(f"worker counts {ns} must be positive whole numbers, e.g. 16,64,256")
    if not (samples_per_worker >= 1):
        raise SimulateError(
            f"samples_per_worker={samples_per_worker} must be a positive whole number"
        )
    if not (latency >= 0 and math.isfinite(latency)) or not (
        bandwidth > 0 and math.isfinite(bandwidth)
    ):
        raise SimulateError(
            f"latency={latency} must be >= 0 s and bandwidth={bandwidth} > 0 bytes/s"
        )
    if not (unit_rate > 0 and math.isfinite(unit_rate)):
        raise SimulateError(
            f"unit_rate={unit_rate} must be a positive number of work units per second"
        )
    for m in methods:
        if m not in SIM_METHODS:
            raise SimulateError(f"method {m!r} is not one of {', '.join(SIM_METHODS)}")


def simulate(
    *,
    ns: Sequence[int] = DEFAULT_NS,
    distribution: str = "uniform:0.25,1",
    shape: Any = (203, 1024, 26),
    samples_per_worker: int = 4096,
    latency: float | None = None,
    bandwidth: float | None = None,
    unit_rate: float = DEFAULT_UNIT_RATE,
    methods: Sequence[str] = SIM_METHODS,
    seed: int = 0,
    overhead: float | None = None,
    exchanges: str = "scalable",
) -> xr.Dataset:
    """Predicted seconds per iteration and gamma, dims ``(method, N)`` (SIMULATION, not measured).

    ``overhead`` is the seconds per message at each end (``rpm.cost.overhead``
    when None); ``exchanges`` one of ``scalable``, ``engine``, ``paper`` (module doc).
    """
    import xarray as xr  # see TYPE_CHECKING above

    shape = parse_shape(shape)
    cost = CostSettings.from_config(latency=latency, bandwidth=bandwidth, overhead=overhead)
    latency, bandwidth, overhead = cost.latency, cost.bandwidth, cost.overhead
    ns = [int(n) for n in ns]
    _check_arguments(
        ns, samples_per_worker, latency, bandwidth, overhead, unit_rate, methods, exchanges
    )
    secs = np.full((len(methods), len(ns)), np.nan)
    gam = np.full_like(secs, np.nan)
    cols = np.zeros(secs.shape, dtype=int)
    network = Interconnect(
        latency=latency,
        bandwidth=bandwidth,
        overhead=overhead,
        itemsize=cost.itemsize,
    )
    for j, n in enumerate(ns):
        speeds = speeds_for(distribution, n, seed=seed)
        rates = unit_rate * speeds
        s = samples_per_worker * n
        for k, method in enumerate(methods):
            t, plan = _predict(method, speeds, shape, s, rates, network, EXCHANGES[exchanges])
            secs[k, j] = t
            gam[k, j] = _gamma(t, shape[1] * s, rates)
            cols[k, j] = plan.n_columns
    return xr.Dataset(
        {
            "seconds_per_iteration": (
                ("method", "N"),
                secs,
                {"units": "s", "description": "SIMULATED (cost model)"},
            ),
            "gamma": (
                ("method", "N"),
                gam,
                {"units": "1", "description": "SIMULATED parallel efficiency"},
            ),
            "n_columns": (("method", "N"), cols, {"units": "1"}),
        },
        coords={"method": list(methods), "N": ns},
        attrs={
            "title": "dask-rpm simulate: SIMULATION from the cost model, not measured",
            "distribution": distribution,
            "shape": "-".join(map(str, shape)),
            "samples_per_worker": samples_per_worker,
            "latency": latency,
            "bandwidth": bandwidth,
            "overhead": overhead,
            "exchanges": exchanges,
            "unit_rate": unit_rate,
            "seed": seed,
        },
    )


def check_against_bench(
    path: str, *, latency: float | None = None, bandwidth: float | None = None
) -> list[dict]:
    """Predict the measured bench rows of ``srpm-probed``, ``split-1d`` and ``uniform``; rows with the error.

    The plan is the one the run used (stored as JSON) as one iteration sees it (on mini-batches
    each column's share of a batch, :func:`dask_rpm.nn.batches.batch_plan`), speeds are the
    measured ``m B / T_series(i)`` (``B``: samples per iteration), latency and bandwidth the probed values of that case
    unless given.
    """
    import xarray as xr  # see TYPE_CHECKING above

    if not os.path.isfile(path):
        raise SimulateError(
            f"bench result {path!r} not found; give the bench.nc written by dask-rpm bench"
        )
    with xr.open_dataset(path, engine="h5netcdf") as ds:
        ds = ds.load()
    rows = []
    for c in range(ds.sizes["case"]):
        n = int(ds["N"].values[c])
        # the plan's rows: the narrowest hidden layer (n-m-l, or n-m_1-...-m_L-l for a deep network)
        m = min(int(v) for v in str(ds["shape"].values[c]).split("-")[1:-1])
        s = int(ds["samples"].values[c])
        series = ds["series_seconds"].values[c, :n]
        # one iteration's samples: the mini-batch (T_series times one iteration of it), else all
        batch = int(ds["batch_size"].values[c]) if "batch_size" in ds.coords else s
        rates = m * batch / series
        lat = latency if latency is not None else float(ds["latency"].values[c])
        bw = bandwidth if bandwidth is not None else float(ds["bandwidth"].values[c])
        for k, method in enumerate(ds["method"].values.tolist()):
            if method not in ("srpm-probed", "split-1d", "uniform") or not str(
                ds["plan"].values[c, k]
            ):
                continue
            plan = batch_plan(Plan.from_dict(json.loads(str(ds["plan"].values[c, k]))), batch)
            pred = predict_iteration_seconds(
                plan,
                list(rates),
                latency=None if not math.isfinite(lat) else lat,
                bandwidth=None if not math.isfinite(bw) else bw,
            )
            meas = float(ds["seconds_per_iteration"].values[c, k])
            rows.append(
                {
                    "case": str(ds["case"].values[c]),
                    "method": method,
                    "predicted": pred,
                    "measured": meas,
                    "error": pred / meas - 1.0,
                }
            )
    return rows


def plot_simulation(ds: Any, path: str) -> str:
    """Log-log plot of predicted s/iteration and gamma vs N (PNG, labelled SIMULATION)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.3))
    for k, method in enumerate(ds["method"].values.tolist()):
        a.loglog(ds["N"].values, ds["seconds_per_iteration"].values[k], marker="o", label=method)
        b.semilogx(ds["N"].values, ds["gamma"].values[k], marker="o", label=method)
    a.set_xlabel("workers N")
    a.set_ylabel("predicted s / iteration")
    b.set_xlabel("workers N")
    b.set_ylabel("predicted gamma")
    for ax in (a, b):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(
        f"SIMULATION (cost model, not measured): {ds.attrs['distribution']} speeds, "
        f"{ds.attrs['shape']}, {ds.attrs['samples_per_worker']} samples/worker, "
        f"latency {ds.attrs['latency'] * 1e6:g} us, {ds.attrs['bandwidth'] / 1e9:g} GB/s, "
        f"{ds.attrs.get('exchanges', 'scalable')} exchanges",
        fontsize=9,
    )
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
    plt.close(fig)
    return path


def markdown(ds: Any) -> str:
    """The simulation as a markdown table headed by its SIMULATION label and settings."""
    lines = [
        f"SIMULATION (cost model, not measured): {ds.attrs['distribution']} speeds, n-m-l {ds.attrs['shape']}, "
        f"{ds.attrs['samples_per_worker']} samples per worker, latency {ds.attrs['latency']:g} s, "
        f"bandwidth {ds.attrs['bandwidth']:g} B/s, overhead {ds.attrs.get('overhead', 0):g} s/message, "
        f"{ds.attrs.get('exchanges', 'scalable')} exchanges, unit rate {ds.attrs['unit_rate']:g} units/s",
        "",
        "| N | " + " | ".join(f"{m} s/it | {m} gamma" for m in ds["method"].values) + " |",
        "| ---: |" + " ---: | ---: |" * ds.sizes["method"],
    ]
    for j, n in enumerate(ds["N"].values):
        cells = " | ".join(
            f"{ds['seconds_per_iteration'].values[k, j]:.4f} | {ds['gamma'].values[k, j]:.3f}"
            for k in range(ds.sizes["method"])
        )
        lines.append(f"| {n} | {cells} |")
    return "\n".join(lines) + "\n"
