"""The engine cost model against measured runs of the real engine (EMULATED workers).

Two steps, so the model can be re-checked without re-running the cluster:

``--measure out.json``
    Runs :func:`dask_rpm.fit` on :func:`dask_rpm.local_cluster` (EMULATED
    speeds on this machine) for

    * **calibration** cases: tiny compute, message patterns that differ in
      count and size (one column / two columns / all-to-all at N = 2..8).
      They fix the network parameters of :class:`dask_rpm.comm.Interconnect`
      (latency, per-message overhead, bandwidth, host bandwidth, fixed cost
      per iteration) by least squares (:func:`dask_rpm.cost.fit_network`);
    * **validation** cases: a compute-bearing workload at N = 4, 8, 16, 32
      workers, equal speeds and a condition-A-like mix, the SRPM plan and
      split-1d. They are predicted, not fitted.

    Per case it stores the plan, the emulation rate and scale, the speeds and
    the median measured seconds per iteration (iterations after the first
    two). Run it under ``flock -x /tmp/rpm-cpu.lock``.

``--table out.json``
    Fits the network on the calibration cases, predicts every case with
    :func:`dask_rpm.cost.predict_breakdown` from the workers' speeds (the
    emulation's kernel rate x speed x scale, i.e. what the probe measures, not
    the measured iteration times) and prints the markdown table of measured vs
    predicted seconds per iteration with the error per case.

Usage::

    flock -x /tmp/rpm-cpu.lock python benchmarks/cost_model.py --measure cost_model.json   # ~5 min
    python benchmarks/cost_model.py --table cost_model.json
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from typing import Any, NamedTuple  # noqa: E402

import numpy as np  # noqa: E402


class Case(NamedTuple):
    """One measured configuration."""

    name: str
    role: str  # "calibration" or "validation"
    speeds: tuple[float, ...]
    shape: tuple[int, int, int]
    samples: int
    method: str
    iterations: int
    vertical: str = "auto"


#: Condition A of the paper's profile, as the bench emulates it (0.63 measured as 0.5), repeated to N.
_A = (0.25, 0.3125, 0.5, 1.0, 1.0, 0.4167, 0.6667, 0.5)


def _profile(kind: str, n: int) -> tuple[float, ...]:
    return tuple([1.0] * n) if kind == "equal" else tuple(np.resize(np.array(_A), n).tolist())


def cases(quick: bool = False) -> list[Case]:
    out = [
        # calibration: almost no compute; message count and size vary
        Case("cal 2 cols, small msgs", "calibration", (1.0,) * 2, (8, 8, 1), 16, "split-1d", 200),
        Case(
            "cal 2 cols, 1.6 MB msgs", "calibration", (1.0,) * 2, (8, 20000, 2), 16, "split-1d", 60
        ),
        Case(
            "cal 1 col of 4, 0.8 MB partials",
            "calibration",
            (1.0,) * 4,
            (4, 8, 8),
            12800,
            "srpm1",
            60,
            "allgather",
        ),
        Case(
            "cal 1 col of 6 (leader), 0.8 MB",
            "calibration",
            (1.0,) * 6,
            (4, 12, 8),
            12800,
            "srpm1",
            60,
            "leader",
        ),
        Case("cal 8 cols, small msgs", "calibration", (1.0,) * 8, (8, 8, 1), 64, "split-1d", 100),
        Case(
            "cal 8 cols, 160 kB msgs", "calibration", (1.0,) * 8, (8, 2000, 2), 64, "split-1d", 60
        ),
        Case("cal 16 cols, small msgs", "calibration", (1.0,) * 16, (8, 8, 1), 64, "split-1d", 60),
        Case("cal 32 cols, small msgs", "calibration", (1.0,) * 32, (8, 8, 1), 64, "split-1d", 30),
        # with compute, on another workload than the validation rows (a quarter of the work); the
        # "equal srpm" ones also give each N's per-iteration time outside the phases (fixed_cost)
        Case(
            "cal N=4 equal srpm, 203-256-26",
            "calibration",
            (1.0,) * 4,
            (203, 256, 26),
            8192,
            "srpm",
            16,
        ),
        Case(
            "cal N=8 equal srpm, 203-256-26",
            "calibration",
            (1.0,) * 8,
            (203, 256, 26),
            8192,
            "srpm",
            16,
        ),
        Case(
            "cal N=16 equal srpm, 203-256-26",
            "calibration",
            (1.0,) * 16,
            (203, 256, 26),
            8192,
            "srpm",
            16,
        ),
        Case(
            "cal N=32 equal srpm, 203-256-26",
            "calibration",
            (1.0,) * 32,
            (203, 256, 26),
            8192,
            "srpm",
            12,
        ),
        Case(
            "cal N=16 equal split-1d, 203-256-26",
            "calibration",
            (1.0,) * 16,
            (203, 256, 26),
            8192,
            "split-1d",
            16,
        ),
    ]
    shape, s = (203, 512, 26), 16384
    for n in (4, 8, 16) if quick else (4, 8, 16, 32):
        for kind in ("equal", "A"):
            out.append(
                Case(f"N={n} {kind} srpm", "validation", _profile(kind, n), shape, s, "srpm", 16)
            )
        if n in (8, 16):
            out.append(
                Case(f"N={n} A split-1d", "validation", _profile("A", n), shape, s, "split-1d", 16)
            )
    return out


def _data(n: int, l: int, s: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    x = rng.normal(size=(s, n))
    x[:, -1] = 1.0
    return x, rng.uniform(0.1, 0.9, size=(s, l))


def _plan(case: Case, addresses: list[str]) -> Any:
    from dask_rpm.planners import make_plan

    if case.method == "srpm1":  # one column holding everybody
        return make_plan(
            list(case.speeds), case.shape, case.samples, method="srpm", dp=1, workers=addresses
        )
    return make_plan(
        list(case.speeds), case.shape, case.samples, method=case.method, workers=addresses
    )


def measure_case(case: Case, repeats: int = 3) -> dict[str, Any]:
    import dask
    from distributed import Client

    import dask_rpm

    n, m, l = case.shape
    x, d = _data(n, l, case.samples)
    t0 = time.perf_counter()
    with (
        dask.config.set({"rpm.engine.vertical": case.vertical}),
        dask_rpm.local_cluster(list(case.speeds), dashboard_address=None) as cluster,
        Client(cluster) as client,
    ):
        addresses = dask_rpm.ordered_workers(client.scheduler_info())
        plan = _plan(case, addresses)
        kw = dict(
            hidden=m,
            learning_rate=1e-7,
            mapping=plan,
            client=client,
            progress="none",
            elastic=False,
        )
        dask_rpm.fit(x, d, iterations=2, interval=2, **kw)  # warm-up: connections, imports, caches
        hs = []
        for _ in range(repeats):  # the machine is shared and noisy: several runs, pooled
            r = dask_rpm.fit(x, d, iterations=case.iterations, interval=case.iterations, **kw)
            hs.append(r.history.isel(iteration=slice(2, None)))
        label = cluster.emulation_label
        rate, scale = float(cluster.rates["float64"]), float(cluster.scale_factor)
    import xarray as xr

    h = xr.concat(hs, dim="iteration")
    t = h["iteration_time"].values
    t = t[np.isfinite(t)]
    per_run = [float(np.nanmedian(x["iteration_time"].values)) for x in hs]
    # per worker spread of its compute over the iterations (IQR / 1.349: a robust standard deviation)
    comp = (h["forward"] + h["backward"] + h["modify"]).values[:, : len(case.speeds)]
    spread = [float((np.nanpercentile(c, 75) - np.nanpercentile(c, 25)) / 1.349) for c in comp.T]
    # per worker medians of each phase (what the model's parts should match)
    phases = {
        p: [float(v) for v in h[p].median("iteration").values[: len(case.speeds)]]
        for p in ("forward", "vertical_wait", "backward", "horizontal", "modify")
    }
    row = {
        **case._asdict(),
        "plan": plan.to_dict(),
        "rate": rate,
        "scale": scale,
        "measured": float(np.median(t)),
        "phases": phases,
        "per_run": per_run,
        "compute_spread": spread,
        "measured_iqr": [float(np.percentile(t, 25)), float(np.percentile(t, 75))],
        "emulation": label,
        "loadavg": os.getloadavg()[0],
        "wall": time.perf_counter() - t0,
    }
    print(
        f"  {case.name}: {row['measured'] * 1e3:.2f} ms/it (IQR {row['measured_iqr'][0] * 1e3:.2f}-"
        f"{row['measured_iqr'][1] * 1e3:.2f}; runs {', '.join(f'{v * 1e3:.1f}' for v in per_run)}), "
        f"{plan.n_columns} columns, load {row['loadavg']:.1f}, "
        f"{row['wall']:.0f} s",
        file=sys.stderr,
    )
    return row


def measure(
    path: str,
    quick: bool = False,
    only: Sequence[str] = (),
    repeats: int = 3,
    names: Sequence[str] = (),
) -> list[dict[str, Any]]:
    rows = []
    print(
        f"cost-model measurement on {os.cpu_count()} cores (EMULATED heterogeneity)",
        file=sys.stderr,
    )
    for case in cases(quick):
        if (only and case.role not in only) or (names and case.name not in names):
            continue
        rows.append(measure_case(case, repeats))
        with open(path, "w") as f:  # keep what was measured if a later case fails
            json.dump({"cases": rows, "cores": os.cpu_count()}, f, indent=1)
    return rows


# --------------------------------------------------------------- prediction
def work_speeds(row: dict[str, Any]) -> list[float]:
    """Work units (hidden unit x sample) per second of each worker: the emulation's paced rate."""
    from dask_rpm.nn.kernels import block_work

    n, m, l = row["shape"]
    per_unit = block_work("forward", 1, 1, n, l) + block_work("backward", 1, 1, n, l)
    return [row["rate"] * v * row["scale"] / per_unit for v in row["speeds"]]


def _plan_of(row: dict[str, Any]) -> Any:
    from dask_rpm.plan.partition import Plan

    return Plan.from_dict(row["plan"])


def measured_speeds(row: dict[str, Any]) -> list[float]:
    """Work units per second each worker showed in the run: area / median (forward + backward + modify).

    What DRPM's timing records give the planner (its ``tc``), contention on
    this machine included (on the tiny calibration networks the kernels' fixed
    costs, which their flop count misses)."""
    if "phases" not in row:
        return work_speeds(row)
    plan = _plan_of(row)
    ph = row["phases"]
    return [
        plan.rectangle(w).area / (ph["forward"][w] + ph["backward"][w] + ph["modify"][w])
        for w in range(len(row["speeds"]))
    ]


def outside_phases(row: dict[str, Any]) -> float:
    """Seconds per iteration outside every recorded phase: measured minus the slowest worker's phase sum.

    The time between a worker's update and its next forward pass (flushing
    the previous iteration's sends, loop bookkeeping); not a property of the
    plan's exchanges, so it is measured per cluster size, not modelled.
    """
    ph = row["phases"]
    n = len(row["speeds"])
    busiest = max(
        sum(ph[k][w] for k in ("forward", "vertical_wait", "backward", "horizontal", "modify"))
        for w in range(n)
    )
    return max(row["measured"] - busiest, 0.0)


def fixed_costs(rows: Sequence[dict[str, Any]]) -> dict[int, float]:
    """Per worker count N: the time outside the phases of that N's "cal N=.. equal srpm" row."""
    return {
        len(r["speeds"]): outside_phases(r)
        for r in rows
        if r["role"] == "calibration"
        and r["name"].startswith("cal N=")
        and "equal srpm" in r["name"]
    }


def table(path: str) -> str:
    from dask_rpm.cost import fit_network, predict_breakdown

    with open(path) as f:
        data = json.load(f)
    rows = data["cases"]
    cores = int(data.get("cores", os.cpu_count() or 1))
    cal = [r for r in rows if r["role"] == "calibration"]
    # the exchanges are fitted to what the phases took; the rest is each N's measured fixed cost
    net = fit_network(
        [
            (
                _plan_of(r),
                measured_speeds(r),
                r["measured"] - outside_phases(r),
                r["vertical"],
                r.get("compute_spread"),
            )
            for r in cal
        ],
        host_cores=cores,
        duplex=False,
    )
    fixed = fixed_costs(rows)
    lines = [
        "EMULATED heterogeneity on one machine: measured on the real engine (dask_rpm.fit on "
        f"dask_rpm.local_cluster, {cores} cores shared by all workers); predicted by "
        "dask_rpm.cost.predict_breakdown (engine exchanges) with the network fitted on the calibration rows only "
        "and each N's fixed cost measured on its calibration row.",
        "",
        f"Fitted network (every worker on one host, {cores} cores, one thread sends and receives): "
        f"latency {net.latency * 1e6:.0f} us, overhead {net.overhead * 1e6:.0f} us/message, "
        f"bandwidth {net.bandwidth / 1e9:.2f} GB/s per worker, host {net.host_bandwidth / 1e9:.2f} GB/s, "
        f"reduce {net.reduce * 1e9:.1f} ns/element, worker bookkeeping {net.worker_cpu * 1e6:.0f} us CPU/iteration. "
        "Fixed cost per iteration (outside the phases) measured at N = "
        + ", ".join(f"{n}: {v * 1e3:.1f} ms" for n, v in sorted(fixed.items()))
        + ".",
        "",
        "| case | role | N | columns | measured s/it (IQR) | outside phases | predicted, measured speeds | error | "
        "predicted, emulated speeds | error |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        plan = _plan_of(r)
        n = len(r["speeds"])
        is_fixed_row = r["role"] == "calibration" and n in fixed and fixed[n] == outside_phases(r)
        # calibration rows: their own time outside the phases; validation rows: their N's fixed cost
        f_cost = outside_phases(r) if r["role"] == "calibration" else fixed.get(n, 0.0)
        local = net._replace(hosts=("localhost",) * n, fixed=f_cost)
        vert = "engine" if r["vertical"] == "auto" else r["vertical"]
        t_meas = predict_breakdown(
            plan,
            measured_speeds(r),
            network=local,
            vertical=vert,
            horizontal="engine",
            spread=r.get("compute_spread"),
        )["total"]
        t_nom = predict_breakdown(
            plan, work_speeds(r), network=local, vertical=vert, horizontal="engine"
        )["total"]
        lo, hi = r["measured_iqr"]
        mark = " (fixed-cost row)" if is_fixed_row else ""
        lines.append(
            f"| {r['name']}{mark} | {r['role']} | {n} | {plan.n_columns} | "
            f"{r['measured']:.4f} ({lo:.4f}-{hi:.4f}) | {outside_phases(r) * 1e3:.1f} ms | {t_meas:.4f} | "
            f"{100 * (t_meas / r['measured'] - 1):+.1f} % | "
            f"{t_nom:.4f} | {100 * (t_nom / r['measured'] - 1):+.1f} % |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--measure", metavar="JSON", help="run the cases and write the measurements here"
    )
    p.add_argument("--only", default="", help="calibration and/or validation (comma-separated)")
    p.add_argument("--quick", action="store_true", help="N up to 16")
    p.add_argument("--repeats", type=int, default=3, help="fits per case, pooled (default 3)")
    p.add_argument("--cases", default="", help="only these case names (';'-separated)")
    p.add_argument(
        "--table", metavar="JSON", help="print the measured-vs-predicted table of a measurement"
    )
    args = p.parse_args(argv)
    if args.measure:
        measure(
            args.measure,
            args.quick,
            [v for v in args.only.split(",") if v],
            args.repeats,
            [v.strip() for v in args.cases.split(";") if v.strip()],
        )
    if args.table:
        print(table(args.table))
    if not (args.measure or args.table):
        p.error("give --measure JSON and/or --table JSON")


if __name__ == "__main__":
    main()
