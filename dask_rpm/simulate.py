"""``dask-rpm simulate``: predicted gamma and iteration time for large clusters (SIMULATION).

Pure module (numpy, xarray, matplotlib for the plot; no ``distributed``).
Nothing here is measured: iteration times come from the latency-bandwidth
model :func:`dask_rpm.cost.predict_iteration_seconds` applied to the plans
SRPM-time, SRPM, the proportional 1-D split and method 1 (uniform) make for
``N`` workers of a given speed distribution.

Exchanges (``exchanges=``): ``scalable`` (default) charges the tree / ring /
recursive-halving / direct allreduces of :mod:`dask_rpm.exchange`, the
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

import argparse
import json
import math
import os
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["speeds_for", "simulate", "check_against_bench", "add_simulate_parser", "DEFAULT_NS"]

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

    ``equal``; ``A`` / ``B`` (the bench's EMULATED truth of SPEC section 7,
    repeated); ``uniform:LO,HI`` (seeded random); ``two:FRACTION,SLOW``
    (that fraction of workers at speed SLOW, the rest at 1).
    """
    from .bench import true_profile

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
    import dask.config

    from .cost import predict_iteration_seconds
    from .planners import fastest_grid, make_plan

    vertical, horizontal = modes
    kw = dict(network=network, vertical=vertical, horizontal=horizontal)
    if method == "uniform":
        plan, t = fastest_grid(np.ones(len(speeds)), shape, samples, "uniform", list(rates), **kw)
        return t, plan
    with dask.config.set({"rpm.cost.vertical": vertical, "rpm.cost.horizontal": horizontal}):
        plan = make_plan(speeds, shape, samples, method=method, rates=list(rates), network=network)
    return predict_iteration_seconds(plan, list(rates), **kw), plan


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
) -> Any:
    """Predicted seconds per iteration and gamma, dims ``(method, N)`` (SIMULATION, not measured).

    ``overhead`` is the seconds per message at each end (``rpm.cost.overhead``
    when None); ``exchanges`` one of ``scalable``, ``engine``, ``paper`` (module doc).
    """
    import xarray as xr

    from . import config
    from .planners import parse_shape

    shape = parse_shape(shape)
    from .cost import Network

    latency = float(config.get("cost.latency", latency))
    bandwidth = float(config.get("cost.bandwidth", bandwidth))
    overhead = float(config.get("cost.overhead", overhead))
    if exchanges not in EXCHANGES:
        raise SimulateError(f"exchanges={exchanges!r} is not one of {', '.join(EXCHANGES)}")
    if not (overhead >= 0 and math.isfinite(overhead)):
        raise SimulateError(f"overhead={overhead} must be >= 0 seconds per message")
    ns = [int(n) for n in ns]
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
    secs = np.full((len(methods), len(ns)), np.nan)
    gam = np.full_like(secs, np.nan)
    cols = np.zeros(secs.shape, dtype=int)
    network = Network(
        latency=latency,
        bandwidth=bandwidth,
        overhead=overhead,
        itemsize=int(config.get("cost.itemsize")),
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

    The plan is the one the run used (stored as JSON), speeds are the measured
    ``m s / T_series(i)``, latency and bandwidth the probed values of that case
    unless given.
    """
    import xarray as xr

    from .cost import predict_iteration_seconds
    from .partition import Plan

    if not os.path.isfile(path):
        raise SimulateError(
            f"bench result {path!r} not found; give the bench.nc written by dask-rpm bench"
        )
    with xr.open_dataset(path, engine="h5netcdf") as ds:
        ds = ds.load()
    rows = []
    for c in range(ds.sizes["case"]):
        n = int(ds["N"].values[c])
        m, s = int(str(ds["shape"].values[c]).split("-")[1]), int(ds["samples"].values[c])
        series = ds["series_seconds"].values[c, :n]
        rates = m * s / series
        lat = latency if latency is not None else float(ds["latency"].values[c])
        bw = bandwidth if bandwidth is not None else float(ds["bandwidth"].values[c])
        for k, method in enumerate(ds["method"].values.tolist()):
            if method not in ("srpm-probed", "split-1d", "uniform") or not str(
                ds["plan"].values[c, k]
            ):
                continue
            plan = Plan.from_dict(json.loads(str(ds["plan"].values[c, k])))
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

    from .bench import _atomic

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
    _atomic(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
    plt.close(fig)
    return path


def markdown(ds: Any) -> str:
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


# --------------------------------------------------------------------- CLI
_DESCRIPTION = """\
Predict the time per iteration and the parallel efficiency gamma of SRPM, the
proportional 1-D split and a uniform plan for clusters of 16 to 4096 workers
whose speeds follow a distribution you choose. Nothing is run or measured:
this is a SIMULATION with a latency-bandwidth cost model (weak scaling: the
number of samples grows with the number of workers). Writes simulate.png,
simulate.md and simulate.nc to --out and prints a table.

gamma = (1 / T_parallel) / sum over workers of (1 / T_alone(i)): 1 means
every worker's speed is used.
"""

_EPILOG = """\
examples:
  dask-rpm simulate                                    # 16..4096 workers, speeds uniform in [0.25, 1] (seconds)
  dask-rpm simulate --distribution two:0.5,0.25 --latency 1e-3   # half the workers 4x slower, slow links
  dask-rpm simulate --n 64,256 --json                  # two sizes, as JSON rows
  dask-rpm simulate --check rpm-bench/bench.nc         # the model against a dask-rpm bench result

distributions: equal | A | B (the paper's profiles, at most 8 workers) |
  uniform:LO,HI (speeds uniform in [LO, HI]) | two:FRACTION,SLOW (that
  fraction of the workers at speed SLOW, the others at 1)
"""


def add_simulate_parser(subparsers: Any) -> None:
    """Register ``dask-rpm simulate``."""
    p = subparsers.add_parser(
        "simulate",
        help="predict gamma and iteration time for 16..4096 workers from the cost model (SIMULATION)",
        description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=_EPILOG,
    )
    p.add_argument("--n", dest="ns", help="worker counts, comma-separated (default 16,32,...,4096)")
    p.add_argument(
        "--distribution",
        default="uniform:0.25,1",
        help="equal | A | B | uniform:LO,HI | two:FRACTION,SLOW (default uniform:0.25,1)",
    )
    p.add_argument("--shape", default="203-1024-26", help="network n-m-l (default 203-1024-26)")
    p.add_argument(
        "--samples-per-worker",
        type=int,
        default=4096,
        help="weak scaling: s = this x N (default 4096)",
    )
    p.add_argument(
        "--latency", type=float, default=None, help="seconds per message (default rpm.cost.latency)"
    )
    p.add_argument(
        "--bandwidth",
        type=float,
        default=None,
        help="bytes/s per link (default rpm.cost.bandwidth)",
    )
    p.add_argument(
        "--overhead",
        type=float,
        default=None,
        help="seconds per message at each end (default rpm.cost.overhead)",
    )
    p.add_argument(
        "--exchanges",
        default="scalable",
        choices=sorted(EXCHANGES),
        help="exchange algorithms charged: scalable (trees/rings, default), engine (what the engine "
        "sends today), paper (one gatherer, bands one after another)",
    )
    p.add_argument(
        "--methods",
        default=",".join(SIM_METHODS),
        help=f"comma-separated, from {','.join(SIM_METHODS)} (default all)",
    )
    p.add_argument(
        "--unit-rate",
        type=float,
        default=DEFAULT_UNIT_RATE,
        help=f"work units/s of a speed-1.0 worker (default {DEFAULT_UNIT_RATE:g})",
    )
    p.add_argument(
        "--check", metavar="BENCH_NC", help="instead: predict the rows of a dask-rpm bench result"
    )
    p.add_argument(
        "--out", default="rpm-simulate", help="output directory for simulate.png/.md/.nc"
    )
    p.add_argument("--json", action="store_true", help="print JSON rows")
    p.set_defaults(func=_cmd_simulate)


def _cmd_simulate(args: argparse.Namespace) -> int:
    from .bench import _atomic
    from .cli import CLIError
    from .partition import PlanError

    try:
        if args.check:
            rows = check_against_bench(args.check, latency=args.latency, bandwidth=args.bandwidth)
            if args.json:
                print(json.dumps(rows))
            else:
                print(
                    "| case | method | predicted s/it | measured s/it | error |\n| --- | --- | ---: | ---: | ---: |"
                )
                for r in rows:
                    print(
                        f"| {r['case']} | {r['method']} | {r['predicted']:.3f} | {r['measured']:.3f} | "
                        f"{100 * r['error']:+.0f} % |"
                    )
            return 0
        ns = DEFAULT_NS
        if args.ns:
            try:
                ns = [int(v) for v in args.ns.split(",") if v.strip()]
            except ValueError:
                raise CLIError(
                    f"--n {args.ns!r}: give comma-separated whole numbers, e.g. 16,64,256"
                ) from None
        ds = simulate(
            ns=ns,
            distribution=args.distribution,
            shape=args.shape,
            samples_per_worker=args.samples_per_worker,
            latency=args.latency,
            bandwidth=args.bandwidth,
            unit_rate=args.unit_rate,
            overhead=args.overhead,
            exchanges=args.exchanges,
            methods=[m for m in args.methods.split(",") if m.strip()],
        )
    except (SimulateError, PlanError) as e:
        raise CLIError(str(e)) from None
    os.makedirs(args.out, exist_ok=True)
    _atomic(os.path.join(args.out, "simulate.nc"), lambda tmp: ds.to_netcdf(tmp, engine="h5netcdf"))
    table = markdown(ds)
    _atomic(os.path.join(args.out, "simulate.md"), lambda tmp: open(tmp, "w").write(table))
    plot_simulation(ds, os.path.join(args.out, "simulate.png"))
    if args.json:
        rows = [
            {
                "method": m,
                "N": int(n),
                "gamma": float(ds["gamma"].values[k, j]),
                "seconds_per_iteration": float(ds["seconds_per_iteration"].values[k, j]),
            }
            for k, m in enumerate(ds["method"].values.tolist())
            for j, n in enumerate(ds["N"].values)
        ]
        print(json.dumps(rows))
    else:
        print(table)
        print(
            f"wrote {args.out}/simulate.nc, simulate.md, simulate.png  (SIMULATION, not measured)",
            file=sys.stderr,
        )
    return 0
