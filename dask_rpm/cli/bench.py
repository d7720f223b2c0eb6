"""``dask-rpm bench``: every mapping method side by side on EMULATED heterogeneous workers.

The run is :func:`dask_rpm.bench.harness.run_bench` (see :mod:`dask_rpm.bench`);
this module holds the options, their checks and the printed summary.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from ..bench.ddp import torch_available
from ..bench.profiles import MAX_N, METHODS, BenchError
from ..bench.report import markdown_table, summary_rows, write_outputs
from ..planners import parse_network_shape
from ._common import CLIError, split_list

__all__ = ["add_parser", "run"]

_EPILOG = """\
examples:
  dask-rpm bench --quick                      # condition A, N = 4 and 8, compute workload (about 17 min on 2 cores)
  dask-rpm bench --quick --json               # the summary as a JSON list of rows
  dask-rpm bench --conditions A,B --n 4-8 --workloads paper,compute     # the full set (hours)
  dask-rpm bench --conditions A-step --n 8 --iterations 40             # one worker slows 3x mid-run
  dask-rpm bench --workloads custom --shape 20-16-4 --samples 512 --n 3 --methods srpm-assumed,drpm
  dask-rpm bench --workloads minibatch --conditions A --n 4,8 --methods drpm,split-1d,uniform,ddp \
      --batch-sizes 256,1024,4096           # mini-batch SGD, 203-1024-26, s = 16384
  dask-rpm bench --workloads deep --conditions A --n 4 --methods drpm,split-1d,uniform,ddp
                                            # deep: 784-1024-1024-1024-10, B = 256, 1024, 4096
  dask-rpm bench --real --n 2               # REAL: 2 unpaced one-thread workers vs 2 DDP ranks
  dask-rpm bench --real --n 8,16 --mix 1,2,4,8   # REAL on a 16-core machine (benchmarks/real_hardware.py)

Without --real all figures are EMULATED heterogeneity on one machine (docs/emulation.md);
with --real they are REAL: unpaced workers on this machine's cores.
"""


def add_parser(subparsers: Any) -> None:
    """Add the ``bench`` subcommand."""
    p = subparsers.add_parser(
        "bench",
        help="every mapping method side by side on an EMULATED heterogeneous local cluster",
        description=(
            "Run uniform, H_rev, SRPM (assumed and probed abilities), DRPM (with and without initial "
            "abilities), the proportional 1-D split and a PyTorch DDP peer side by side on "
            "dask_rpm.local_cluster with EMULATED speeds; write bench.nc, bench.md and bench.png."
        ),
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="condition A, N = 4 and 8, compute workload, 16 iterations (about 17 min on 2 cores)",
    )
    p.add_argument("--conditions", help="comma-separated: A, B, A-step, B-step (default A,B)")
    p.add_argument(
        "--n", dest="ns", metavar="N", help="worker counts, e.g. 4,8 or 4-8 (default 4-8)"
    )
    p.add_argument(
        "--workloads",
        help="comma-separated: paper, compute, minibatch, deep, custom (default paper,compute)",
    )
    p.add_argument(
        "--batch-sizes",
        metavar="B,B,...",
        help="mini-batch sizes of the minibatch and deep workloads (default 256,1024,4096) and of "
        "custom (default full batch); paper and compute are full batch",
    )
    p.add_argument("--methods", help=f"comma-separated subset of {','.join(METHODS)} (default all)")
    p.add_argument(
        "--iterations", type=int, help="iterations per method run (default 40; --quick 16)"
    )
    p.add_argument(
        "--series-iterations",
        type=int,
        default=None,
        help="iterations per T_series run (default 2)",
    )
    p.add_argument(
        "--interval",
        type=int,
        default=None,
        help="R: iterations between DRPM checks (default iterations/4)",
    )
    p.add_argument(
        "--step-at",
        type=int,
        default=None,
        help="iteration of the load step (default iterations/4)",
    )
    p.add_argument(
        "--dp-search",
        choices=("model", "measured"),
        default="model",
        help="how the baselines' best N_DP is found (default model)",
    )
    _add_real_arguments(p)
    p.add_argument(
        "--shape", help="custom workload network n-m-l, or n-m1-...-mL-l (several hidden layers)"
    )
    p.add_argument("--samples", type=int, help="custom workload samples")
    p.add_argument("--out", default="rpm-bench", help="output directory (default ./rpm-bench)")
    p.add_argument("--no-plot", action="store_true", help="skip the PNG")
    p.add_argument("--json", action="store_true", help="print the summary rows as JSON on stdout")
    p.add_argument(
        "--no-weight-check",
        action="store_true",
        help="skip comparing every method's final weights with fit_serial (weights_vs_serial)",
    )
    p.set_defaults(func=run)


def _add_real_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``dask-rpm bench --real`` (REAL, unpaced workers)."""
    p.add_argument(
        "--real",
        action="store_true",
        help="REAL instead: unpaced local workers (--n of them, --threads-per-worker each, or "
        "--mix), every dask_rpm method against an unpaced DDP peer with the same threads, at the "
        "compute, minibatch and paper workloads (--workloads); writes <out>/real.json",
    )
    p.add_argument(
        "--threads-per-worker",
        type=int,
        default=1,
        metavar="T",
        help="--real: threads of each of the --n equal workers (default 1)",
    )
    p.add_argument(
        "--mix",
        metavar="T,T,...",
        help="--real: also a heterogeneous case, one worker per entry with that many threads, "
        "e.g. 1,2,4,8",
    )


def _parse_ns(text: str | None, default: Sequence[int]) -> list[int]:
    if text is None:
        return list(default)
    out: list[int] = []
    for tok in split_list(text, ()):
        try:
            if "-" in tok:
                a, b = (int(v) for v in tok.split("-", 1))
                out.extend(range(a, b + 1))
            else:
                out.append(int(tok))
        except ValueError:
            raise CLIError(
                f"--n {text!r}: give whole numbers from 1 to {MAX_N}, e.g. 4,8 or 4-8"
            ) from None
    if not out:
        raise CLIError(
            f"--n {text!r} is empty: give whole numbers from 1 to {MAX_N}, e.g. 4,8 or 4-8"
        )
    return out


def _parse_batch_sizes(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        sizes = [int(t) for t in split_list(text, ())]
    except ValueError:
        raise CLIError(
            f"--batch-sizes {text!r}: give whole numbers of samples per mini-batch, "
            f"e.g. 256,1024,4096"
        ) from None
    if not sizes:
        raise CLIError(f"--batch-sizes {text!r} is empty: give e.g. 256,1024,4096")
    return sizes


def _run_real(args: argparse.Namespace) -> int:
    """``dask-rpm bench --real``: REAL, unpaced workers against an unpaced DDP peer."""
    # imported here: the REAL bench loads distributed, which --help and plan need not pay
    from ..bench.real import REAL_METHODS, REAL_WORKLOADS, real_table, run_real

    ns = _parse_ns(args.ns, [2])
    workloads = split_list(args.workloads, list(REAL_WORKLOADS))
    bad = [w for w in workloads if w not in REAL_WORKLOADS]
    if bad:
        raise CLIError(
            f"--workloads {','.join(bad)}: --real runs {', '.join(REAL_WORKLOADS)}; choose from those"
        )
    methods = split_list(args.methods, list(REAL_METHODS))
    bad = [m for m in methods if m not in REAL_METHODS]
    if bad:
        raise CLIError(f"--methods {','.join(bad)}: --real runs {', '.join(REAL_METHODS)}")
    if args.threads_per_worker < 1:
        raise CLIError(f"--threads-per-worker {args.threads_per_worker}: give a whole number >= 1")
    cases = [[args.threads_per_worker] * n for n in ns]
    if args.mix is not None:
        try:
            mix = [int(t) for t in split_list(args.mix, ())]
        except ValueError:
            mix = []
        if not mix or min(mix) < 1:
            raise CLIError(f"--mix {args.mix!r}: give threads per worker, e.g. 1,2,4,8")
        cases.append(mix)
    out_dir = args.out
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise CLIError(f"--out {out_dir!r} exists and is not a directory; give a directory path")
    rows = run_real(
        cases,
        workloads,
        methods,
        args.iterations,
        log=lambda msg: print(msg, file=sys.stderr, flush=True),
    )
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "real.json")
    with open(path, "w") as f:
        json.dump(rows, f, indent=1)
    if args.json:
        print(json.dumps(rows))
    else:
        print(real_table(rows))
        print(f"wrote {path}  (REAL: unpaced workers on this machine's cores, no emulation)")
    return 0


def run(args: argparse.Namespace) -> int:
    """Runner of ``dask-rpm bench``."""
    if args.real:
        return _run_real(args)
    if args.quick:
        conditions, ns, workloads, iterations = ["A"], [4, 8], ["compute"], 16
    else:
        conditions, ns, workloads, iterations = (
            ["A", "B"],
            [4, 5, 6, 7, 8],
            ["paper", "compute"],
            40,
        )
    conditions = split_list(args.conditions, conditions)
    ns = _parse_ns(args.ns, ns)
    workloads = split_list(args.workloads, workloads)
    methods = split_list(args.methods, METHODS)
    iterations = args.iterations if args.iterations is not None else iterations
    custom = None
    if (args.shape is None) != (args.samples is None):
        raise CLIError(
            "--shape and --samples go together (a custom workload); give both or neither"
        )
    if args.shape is not None:
        dims = parse_network_shape(args.shape)
        if args.samples < 1:
            raise CLIError(f"--samples {args.samples}: must be a positive number of samples")
        custom = (*dims, int(args.samples))
        if args.workloads is None:
            workloads = ["custom"]
    if "ddp" in methods:
        ok, why = torch_available()
        if not ok:
            print(f"dask-rpm bench: ddp will be skipped: {why}", file=sys.stderr)
    out_dir = args.out
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise CLIError(f"--out {out_dir!r} exists and is not a directory; give a directory path")
    # imported here: the harness loads distributed (about 0.6 s), which --help and plan need not pay
    from ..bench.harness import run_bench

    try:
        ds = run_bench(
            workloads=workloads,
            conditions=conditions,
            ns=ns,
            methods=methods,
            iterations=iterations,
            series_iterations=args.series_iterations if args.series_iterations is not None else 2,
            interval=args.interval,
            step_at=args.step_at,
            dp_search=args.dp_search,
            custom=custom,
            batch_sizes=_parse_batch_sizes(args.batch_sizes),
            check_weights=not args.no_weight_check,
        )
    except BenchError as e:
        raise CLIError(str(e)) from None
    paths = write_outputs(ds, out_dir, plot=not args.no_plot)
    if args.json:
        print(json.dumps(summary_rows(ds)))
    else:
        print(markdown_table(ds))
        print("wrote " + ", ".join(paths.values()) + "  (EMULATED heterogeneity on one machine)")
    return 0
