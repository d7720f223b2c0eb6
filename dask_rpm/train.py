"""``dask-rpm train``: the main job.

With ``--config FILE`` it runs the training job described in a YAML file
(:mod:`dask_rpm.job`: data, network, iterations or target error, workers -
SLURM worker groups, a local EMULATED cluster or an existing scheduler - and
the output file); ``--resume`` continues from the job's checkpoint.

Without ``--config`` it trains on an embedded default: a local cluster of
workers with EMULATED heterogeneous speeds (no SLURM needed) and a seeded
synthetic data set, then prints the final error and the iteration time.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, Sequence

import numpy as np

__all__ = ["demo_data", "run_demo", "add_train_parser"]

#: The embedded default job: four emulated workers of speeds 1 : 0.6 : 0.4 : 0.25.
DEMO_SPEEDS = (1.0, 0.6, 0.4, 0.25)
#: n (incl. a constant bias input), m, l: large enough that an iteration is compute, not latency
#: (about 0.1 s on the fastest EMULATED worker alone on a 2-core machine), so the timings show the method.
DEMO_SHAPE = (33, 128, 8)
DEMO_SAMPLES = 4096
#: Iterations of each same-run comparison (the fastest worker alone, a uniform plan).
DEMO_COMPARE_ITERATIONS = 12


def demo_data(samples: int = DEMO_SAMPLES, shape: Sequence[int] = DEMO_SHAPE, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A learnable synthetic task: targets produced by a random 'teacher' network.

    Inputs are standard normal with a constant-1 last column (the bias);
    targets are the teacher's sigmoid outputs, so the error can approach zero.
    """
    from .kernels import forward_partial, sigmoid

    n, m, l = shape
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(samples, n))
    x[:, -1] = 1.0
    Wt = rng.normal(scale=1.0 / np.sqrt(n), size=(m // 2, n))
    Vt = rng.normal(scale=2.0 / np.sqrt(m // 2), size=(l, m // 2))
    _, u = forward_partial(x, Wt, Vt)
    return x, sigmoid(u)


def _compare(client: Any, x: np.ndarray, d: np.ndarray, m: int, lr: float, speeds: Sequence[float],
             iterations: int) -> dict[str, float]:
    """Seconds per iteration, on the same cluster and data, of the fastest worker alone and of a uniform plan."""
    from .engine import fit, ordered_workers
    from .partition import Plan

    addresses = ordered_workers(client.scheduler_info())
    fastest = int(np.argmax(speeds))
    n, l = x.shape[1], d.shape[1]
    alone = Plan.from_columns([[0]], [x.shape[0]], [[m]], shape=(n, m, l), method="single worker")
    alone = alone.with_workers([addresses[fastest]])
    kw = dict(hidden=m, iterations=iterations, learning_rate=lr, client=client, seed=0, progress="none",
              elastic=False)
    t_alone = fit(x, d, mapping=alone, **kw).seconds_per_iteration
    t_uniform = fit(x, d, mapping="uniform", **kw).seconds_per_iteration
    return {"fastest_alone": t_alone, "uniform": t_uniform}


def run_demo(
    *,
    speeds: Sequence[float] | None = None,
    iterations: int | None = None,
    mapping: str | None = None,
    samples: int = DEMO_SAMPLES,
    as_json: bool = False,
    compare: bool = True,
    out: Any = None,
) -> Any:
    """Train the embedded default job on a local EMULATED heterogeneous cluster.

    With ``compare`` the same cluster then runs a few iterations on the fastest
    worker alone and with a uniform plan, so the output shows what the
    mapping bought, measured in the same run.
    """
    from distributed import Client

    from .emulation import local_cluster
    from .engine import fit

    out = out or sys.stdout
    speeds = tuple(speeds or DEMO_SPEEDS)
    iterations = int(iterations or 60)
    x, d = demo_data(samples)
    n, m, l = DEMO_SHAPE
    lr = 1.0 / samples  # stable at this size (2 / samples overshoots)
    t0 = time.perf_counter()
    with local_cluster(speeds, dashboard_address=":0") as cluster, Client(cluster) as client:
        if not as_json:
            print(cluster.emulation_label, file=out)
            print(f"dashboard: {client.dashboard_link}", file=out)
        result = fit(x, d, hidden=m, iterations=iterations, learning_rate=lr, mapping=mapping, client=client, seed=0)
        wall = time.perf_counter() - t0
        others = _compare(client, x, d, m, lr, speeds, DEMO_COMPARE_ITERATIONS) if compare else {}
    summary = _summary(result, speeds, samples, wall, others)
    if as_json:
        print(json.dumps(summary), file=out)
    else:
        _print_summary(result, summary, out)
    return result


def _summary(result: Any, speeds: Sequence[float], samples: int, wall: float, others: dict[str, float]) -> dict:
    n, m, l = DEMO_SHAPE
    err = result.history["error"].values
    t = result.seconds_per_iteration
    summary: dict[str, Any] = {
        "emulation": result.emulation,
        "workers": len(speeds),
        "speeds": list(speeds),
        "network": f"{n}-{m}-{l}",
        "samples": samples,
        "iterations": int(err.size),
        "initial_error": float(err[0]) if err.size else None,
        "final_error": result.error,
        "seconds_per_iteration": t,
        "wall_seconds": wall,
        "plan": result.plan.to_dict(),
        "remaps": result.remaps,
    }
    if others:
        alone = others["fastest_alone"]
        # gamma = (1 / T) / sum_i (1 / T_i alone); T_i from the fastest worker's and the EMULATED speed ratios
        summary.update({
            "seconds_per_iteration_fastest_alone": alone,
            "seconds_per_iteration_uniform": others["uniform"],
            "speedup_vs_fastest_alone": alone / t,
            "speedup_vs_uniform": others["uniform"] / t,
            "gamma": (1.0 / t) / ((1.0 / alone) * sum(speeds) / max(speeds)),
        })
    return summary


def _print_summary(result: Any, summary: dict[str, Any], out: Any) -> None:
    print(f"final plan: {result.plan!r}", file=out)
    for r in result.remaps:
        print(f"remap at iteration {r['iteration']}: {r['kind']}, {r['bytes']} weight bytes, "
              f"{r.get('sample_bytes', 0)} sample bytes re-read, {r['seconds']:.3f} s", file=out)
    k = summary["workers"]
    print(
        f"trained {summary['network']} on {summary['samples']} samples for {summary['iterations']} iterations on "
        f"{k} emulated worker{'s' if k != 1 else ''}: error {summary['initial_error']:.4f} -> "
        f"{summary['final_error']:.4f}, {summary['seconds_per_iteration'] * 1e3:.1f} ms/iteration "
        f"({summary['wall_seconds']:.1f} s wall incl. cluster start)",
        file=out,
    )
    if "gamma" in summary:
        print(
            f"measured in this run, per iteration: this plan {summary['seconds_per_iteration'] * 1e3:.1f} ms | "
            f"fastest worker alone {summary['seconds_per_iteration_fastest_alone'] * 1e3:.1f} ms "
            f"({summary['speedup_vs_fastest_alone']:.2f}x faster here) | uniform plan "
            f"{summary['seconds_per_iteration_uniform'] * 1e3:.1f} ms ({summary['speedup_vs_uniform']:.2f}x) | "
            f"parallel efficiency gamma {summary['gamma']:.2f} (1 = every worker's speed used; EMULATED speeds)",
            file=out,
        )


def add_train_parser(subparsers: Any) -> None:
    """Register ``dask-rpm train``."""
    p = subparsers.add_parser(
        "train",
        help="train a network (default: an embedded demo on a local EMULATED heterogeneous cluster)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=(
            "examples:\n"
            "  dask-rpm train                      # embedded demo, 4 emulated workers\n"
            "  dask-rpm train --speeds 1,0.5,0.25 --iterations 100 --mapping srpm\n"
            "  dask-rpm train --json               # machine-readable summary\n"
            "  dask-rpm train --config job.yaml    # a job file (docs/slurm.md); output to one netCDF\n"
            "  dask-rpm train --config job.yaml --resume   # continue from its checkpoint\n"
        ),
    )
    p.add_argument("--config", metavar="FILE", help="YAML job file: data, network, workers, output (see dask_rpm.job)")
    p.add_argument("--resume", action="store_true", help="with --config: continue from the job's checkpoint")
    p.add_argument("--overwrite", action="store_true",
                   help="with --config: replace an existing output file (as overwrite: true in the job file)")
    p.add_argument("--speeds", help="comma-separated EMULATED relative worker speeds (demo)")
    p.add_argument("--iterations", type=int, help="number of BP iterations")
    p.add_argument("--mapping", help="drpm, or a planner: srpm, uniform, split-1d, grid (= grid-hrev), grid-h, grid-hrev")
    p.add_argument("--json", action="store_true", help="print a JSON summary")
    p.set_defaults(func=_cmd_train)


def _cmd_train(args: argparse.Namespace) -> int:
    from .cli import CLIError

    if args.config is not None or args.resume or args.overwrite:
        return _cmd_job(args)

    speeds = None
    if args.speeds:
        try:
            speeds = [float(v) for v in args.speeds.split(",")]
        except ValueError:
            raise CLIError(f"--speeds {args.speeds!r} is not a comma-separated list of numbers; use e.g. 1,0.5,0.25") from None
        if any(not np.isfinite(v) or v <= 0 for v in speeds):
            raise CLIError(f"--speeds {args.speeds!r}: every speed must be a finite number > 0")
    if args.iterations is not None and args.iterations < 1:
        raise CLIError(f"--iterations {args.iterations}: must be a positive integer")
    from .planners import PLANNERS

    # the same names fit() and job files accept: drpm, every registered planner, and the alias grid
    valid = ("drpm", *sorted(PLANNERS), *(["grid"] if "grid" not in PLANNERS else []))
    if args.mapping is not None and args.mapping not in valid:
        raise CLIError(f"--mapping {args.mapping!r} is not one of {', '.join(valid)}")
    run_demo(speeds=speeds, iterations=args.iterations, mapping=args.mapping, as_json=args.json)
    return 0


def _cmd_job(args: argparse.Namespace) -> int:
    from .cli import CLIError
    from .data import DataError
    from .engine import TrainingError
    from .job import JobError, run_job

    if args.config is None:
        flag = "--resume" if args.resume else "--overwrite"
        raise CLIError(f"{flag} needs --config FILE (the job whose {'checkpoint to continue' if args.resume else 'output to replace'})")
    demo = [f"--{k}" for k in ("speeds", "iterations", "mapping") if getattr(args, k) is not None]
    if demo or args.json:
        raise CLIError(f"{', '.join(demo + (['--json'] if args.json else []))} belong to the demo; with --config put them in the job file")
    try:
        summary = run_job(args.config, resume=args.resume, overwrite=args.overwrite)
    except JobError as e:
        raise CLIError(str(e)) from None
    except DataError as e:  # found by a worker reading its samples, before the first iteration
        raise CLIError(f"job file: data: {e}") from None
    except TrainingError as e:
        print(f"dask-rpm train: training failed: {' '.join(str(e).split())}; no output written", file=sys.stderr)
        return 1
    return 1 if summary.get("rescued") else 0  # saved, but not where the job asked
