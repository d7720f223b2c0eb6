"""``dask-rpm simulate``: predicted gamma and iteration time for large clusters (SIMULATION).

The model is :mod:`dask_rpm.bench.simulate`; this module holds the options and the
files written (``simulate.nc``, ``simulate.md``, ``simulate.png``). With
``--cnn-seed`` it prints the seed's CNN time model instead
(:mod:`dask_rpm.bench.cnn_seed`; files ``cnn_seed.md``, ``cnn_seed.png``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import Any

from .._files import atomic_write, atomic_write_text
from ..bench import cnn_seed
from ..bench.simulate import (
    DEFAULT_NS,
    DEFAULT_UNIT_RATE,
    EXCHANGES,
    SIM_METHODS,
    SimulateError,
    check_against_bench,
    markdown,
    plot_simulation,
    simulate,
)
from ..cost.cnn_model import BATCHES
from ..plan.partition import PlanError
from ._common import CLIError, split_list

__all__ = ["add_parser", "run"]

_DESCRIPTION = """\
Predict the time per iteration and the parallel efficiency gamma of SRPM, the
proportional 1-D split and a uniform plan for clusters of 16 to 4096 workers
whose speeds follow a distribution you choose. Nothing is run or measured:
this is a SIMULATION with a latency-bandwidth cost model (weak scaling: the
number of samples grows with the number of workers). Writes simulate.png,
simulate.md and simulate.nc to --out and prints a table.

gamma = (1 / T_parallel) / sum over workers of (1 / T_alone(i)): 1 means
every worker's speed is used.

--cnn-seed: instead, the channel-wise hybrid seed's CNN time model (its
section 4, Tables 1 and 2): seconds per iteration of data parallelism, the
hybrids hv1-hv3 and the rectangle model's channel-split plan (rpm) against the
global mini-batch per node, where they cross, and whether the seed's Fig. 10
claims hold. A MODEL: nothing is run.
"""

_EPILOG = """\
examples:
  dask-rpm simulate                                    # 16..4096 workers, speeds uniform in [0.25, 1] (seconds)
  dask-rpm simulate --distribution two:0.5,0.25 --latency 1e-3   # half the workers 4x slower, slow links
  dask-rpm simulate --n 64,256 --json                  # two sizes, as JSON rows
  dask-rpm simulate --check rpm-bench/bench.nc         # the model against a dask-rpm bench result
  dask-rpm simulate --cnn-seed --out cnn               # the seed's CNN model: table, cnn_seed.png, .md

distributions: equal | A | B (the paper's profiles, at most 8 workers) |
  uniform:LO,HI (speeds uniform in [LO, HI]) | two:FRACTION,SLOW (that
  fraction of the workers at speed SLOW, the others at 1)
"""


def add_parser(subparsers: Any) -> None:
    """Add the ``simulate`` subcommand."""
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
        "--out",
        default=None,
        help="also write simulate.png, simulate.md and simulate.nc into this directory "
        "(default: print the table only)",
    )
    p.add_argument("--json", action="store_true", help="print JSON rows")
    p.add_argument(
        "--cnn-seed",
        action="store_true",
        help="instead: the seed's CNN time model (data, hv1-hv3, rpm) against the global "
        "mini-batch per node; with --out writes cnn_seed.png and cnn_seed.md (MODEL)",
    )
    p.add_argument(
        "--batches",
        default=None,
        help="with --cnn-seed: global mini-batches per node, comma-separated numbers > 0 "
        f"(default {','.join(map(str, BATCHES))})",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Runner of ``dask-rpm simulate``."""
    if args.cnn_seed:
        return _run_cnn_seed(args)
    if args.batches is not None:
        raise CLIError("--batches goes with --cnn-seed (the CNN model's mini-batches per node)")
    try:
        if args.check:
            _print_check(args)
            return 0
        ns = list(DEFAULT_NS)
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
    table = markdown(ds)
    if args.out is not None:  # files only where the user asked for them
        os.makedirs(args.out, exist_ok=True)
        atomic_write(
            os.path.join(args.out, "simulate.nc"), lambda tmp: ds.to_netcdf(tmp, engine="h5netcdf")
        )
        atomic_write_text(os.path.join(args.out, "simulate.md"), table)
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
        wrote = (
            f"wrote {args.out}/simulate.nc, simulate.md, simulate.png"
            if args.out is not None
            else "--out DIR also writes simulate.nc, .md and .png"
        )
        print(f"{wrote}  (SIMULATION, not measured)", file=sys.stderr)
    return 0


def _print_check(args: argparse.Namespace) -> None:
    """``--check BENCH_NC``: the model's predictions of a bench result's rows, with their errors."""
    rows = check_against_bench(args.check, latency=args.latency, bandwidth=args.bandwidth)
    if args.json:
        print(json.dumps(rows))
        return
    print(
        "| case | method | predicted s/it | measured s/it | error |\n| --- | --- | ---: | ---: | ---: |"
    )
    for r in rows:
        print(
            f"| {r['case']} | {r['method']} | {r['predicted']:.3f} | {r['measured']:.3f} | "
            f"{100 * r['error']:+.0f} % |"
        )


#: The cluster simulation's options and their defaults: none of them means anything to --cnn-seed.
_CLUSTER_OPTIONS = {
    "ns": ("--n", None),
    "distribution": ("--distribution", "uniform:0.25,1"),
    "shape": ("--shape", "203-1024-26"),
    "samples_per_worker": ("--samples-per-worker", 4096),
    "latency": ("--latency", None),
    "bandwidth": ("--bandwidth", None),
    "overhead": ("--overhead", None),
    "exchanges": ("--exchanges", "scalable"),
    "methods": ("--methods", ",".join(SIM_METHODS)),
    "unit_rate": ("--unit-rate", DEFAULT_UNIT_RATE),
    "check": ("--check", None),
}


def _run_cnn_seed(args: argparse.Namespace) -> int:
    """``--cnn-seed``: the seed's CNN time model as a table (and cnn_seed.png, .md with --out)."""
    given = [
        opt for dest, (opt, default) in _CLUSTER_OPTIONS.items() if getattr(args, dest) != default
    ]
    if given:
        raise CLIError(
            f"--cnn-seed takes none of the cluster simulation's options; drop {', '.join(given)} "
            "(it has --batches, --out and --json)"
        )
    batches: list[float] = list(BATCHES)
    if args.batches is not None:
        items = split_list(args.batches)
        try:
            batches = [float(v) for v in items]
        except ValueError:
            batches = []
        if not batches or not all(math.isfinite(b) and b > 0 for b in batches):
            raise CLIError(
                f"--batches {args.batches!r}: give comma-separated numbers > 0, e.g. 1,2,4,8"
            )
    rep = cnn_seed.report(sorted(set(batches)))
    table = cnn_seed.markdown(rep)
    if args.out is not None:
        os.makedirs(args.out, exist_ok=True)
        atomic_write_text(os.path.join(args.out, "cnn_seed.md"), table)
        cnn_seed.plot_cnn_seed(rep, os.path.join(args.out, "cnn_seed.png"))
    if args.json:
        t = rep.table
        print(
            json.dumps(
                {
                    "label": cnn_seed.LABEL,
                    "rows": [
                        {
                            "batch_per_node": float(b),
                            **{n: float(t.seconds[i, j]) for i, n in enumerate(t.names)},
                            "rpm_k": int(t.rpm_k[j]),
                        }
                        for j, b in enumerate(t.batches)
                    ],
                    "crossovers": [c._asdict() for c in rep.crossovers],
                    "claims": [c._asdict() for c in rep.claims],
                }
            )
        )
    else:
        print(table)
        wrote = (
            f"wrote {args.out}/cnn_seed.md, cnn_seed.png"
            if args.out is not None
            else "--out DIR also writes cnn_seed.md and cnn_seed.png"
        )
        print(f"{wrote}  (MODEL, not measured)", file=sys.stderr)
    return 0
