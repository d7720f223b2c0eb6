"""``dask-rpm train``: the demo on a local EMULATED cluster, or a training job from a YAML file.

The demo itself is :func:`dask_rpm.demo.train.run_demo`; a job file is
:func:`dask_rpm.job.run_job`. This module holds the options, their checks and
the exit codes (2: bad input, 1: training failed or the output was saved
elsewhere).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import dask
import numpy as np

from ..nn.backend import BackendError, check_names
from ..nn.data import DataError
from ..nn.optim import OPTIMIZERS
from ..planners import describe_names, mapping_names
from ._common import CLIError

__all__ = ["add_parser", "run"]

_DESCRIPTION = """\
Train a 3-layer network by batch back-propagation on Dask workers.

Without --config: a demo that needs nothing installed beyond dask-rpm. It
starts a local cluster of 4 workers whose speeds are EMULATED (1 : 0.6 : 0.4 :
0.25; emulation on this machine, not hardware), trains a synthetic task with
DRPM, and prints the final plan, each remap, the error and the time per
iteration next to the fastest worker alone and a uniform plan measured in the
same run.

With --config FILE: the training job described in a YAML file - data (a
netCDF file), network, iterations or a target error, workers (SLURM worker
groups, a local EMULATED cluster, or a running scheduler) and the output
file, which receives weights, history and plans. --resume continues from the
job's checkpoint.
"""

_EPILOG = """\
examples:
  dask-rpm train                                  # the demo (about 10 s on 2 cores)
  dask-rpm train --speeds 1,0.5,0.25 --iterations 100 --mapping srpm
  dask-rpm train --json                           # the demo's summary as JSON
  dask-rpm train --config job.yaml                # a job file (see docs/slurm.md)
  dask-rpm train --config job.yaml --resume       # continue from its checkpoint
  sbatch slurm/train.sbatch job.yaml              # the same job as a SLURM batch job

mappings: {mappings}
  drpm re-measures the workers' speeds while training and re-plans; the
  others plan once (srpm: the optimal rectangles for speeds given up front,
  equal speeds if none are).
"""


def add_parser(subparsers: Any) -> None:
    """Add the ``train`` subcommand."""
    p = subparsers.add_parser(
        "train",
        help="train a network (default: a demo on a local EMULATED heterogeneous cluster)",
        description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=_EPILOG.format(mappings=describe_names(mapping_names())),
    )
    p.add_argument(
        "--config",
        metavar="FILE",
        help="YAML job file: data, network, workers, output (docs/slurm.md)",
    )
    p.add_argument(
        "--resume", action="store_true", help="with --config: continue from the job's checkpoint"
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="with --config: replace an existing output file (as overwrite: true in the job file)",
    )
    p.add_argument(
        "--speeds",
        metavar="S1,S2,...",
        help="demo: EMULATED relative worker speeds (default rpm.demo.speeds: 1,0.6,0.4,0.25)",
    )
    p.add_argument(
        "--iterations", type=int, help="demo: number of BP iterations (default rpm.demo.iterations)"
    )
    p.add_argument(
        "--mapping",
        metavar="NAME",
        help=f"demo: how the work is mapped onto the workers; one of {describe_names(mapping_names())} "
        f"(default drpm)",
    )
    p.add_argument(
        "--batch-size",
        type=int,
        metavar="B",
        help="demo: train on mini-batches of B samples (default: full batch, the paper's)",
    )
    p.add_argument(
        "--optimizer",
        choices=tuple(OPTIMIZERS),
        help="demo: sgd (default, the paper's), momentum or adam",
    )
    p.add_argument(
        "--backend",
        metavar="NAME",
        help="the kernels' array library on every worker: numpy, torch, cupy or auto (torch on a "
        "worker with a GPU); as rpm.engine.backend (a job file's backend: wins)",
    )
    p.add_argument(
        "--device",
        metavar="NAME",
        help="auto (a worker's GPU where it has one), cpu, cuda or cuda:<index>; as rpm.engine.device",
    )
    p.add_argument(
        "--json", action="store_true", help="demo: print a JSON summary instead of the report"
    )
    p.set_defaults(func=run)


def _placement(args: argparse.Namespace) -> dict[str, Any]:
    """``--backend`` / ``--device`` as ``rpm.engine.*`` settings, checked as names."""
    given = {"rpm.engine.backend": args.backend, "rpm.engine.device": args.device}
    try:
        check_names(args.backend or "numpy", args.device or "auto")
    except BackendError as exc:
        flag = "--backend" if "backend=" in str(exc).split(";")[0] else "--device"
        raise CLIError(f"{flag}: {exc}") from None
    return {k: v for k, v in given.items() if v is not None}


def run(args: argparse.Namespace) -> int:
    """Runner of ``dask-rpm train``: the demo, or a job file with ``--config``."""
    with dask.config.set(_placement(args)):
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    if args.config is not None or args.resume or args.overwrite:
        return _run_job(args)

    speeds = None
    if args.speeds:
        try:
            speeds = [float(v) for v in args.speeds.split(",")]
        except ValueError:
            raise CLIError(
                f"--speeds {args.speeds!r} is not a comma-separated list of numbers; use e.g. 1,0.5,0.25"
            ) from None
        if any(not np.isfinite(v) or v <= 0 for v in speeds):
            raise CLIError(f"--speeds {args.speeds!r}: every speed must be a finite number > 0")
    if args.iterations is not None and args.iterations < 1:
        raise CLIError(f"--iterations {args.iterations}: must be a positive integer")
    # the same names fit() and job files accept: drpm and every registered planner
    if args.mapping is not None and args.mapping not in mapping_names():
        raise CLIError(
            f"--mapping {args.mapping!r} is not one of {describe_names(mapping_names())}"
        )
    if args.batch_size is not None and args.batch_size < 1:
        raise CLIError(
            f"--batch-size {args.batch_size}: must be a positive integer (omit it for full-batch training)"
        )
    training = {"rpm.train.batch-size": args.batch_size, "rpm.train.optimizer": args.optimizer}
    # imported here: the demo loads distributed (about 0.6 s), which --help and plan need not pay
    from ..demo.train import run_demo

    with dask.config.set({k: v for k, v in training.items() if v is not None}):
        run_demo(speeds=speeds, iterations=args.iterations, mapping=args.mapping, as_json=args.json)
    return 0


def _run_job(args: argparse.Namespace) -> int:
    """``dask-rpm train --config FILE [--resume] [--overwrite]``."""
    # imported here: a job loads distributed (about 0.6 s), which --help and plan need not pay
    from ..engine import TrainingError  # loads distributed: only when the command runs
    from ..engine.store import StoreError  # (the engine package's __init__ loads distributed)
    from ..job import JobError, run_job  # loads distributed: only when the command runs

    if args.config is None:
        flag = "--resume" if args.resume else "--overwrite"
        raise CLIError(
            f"{flag} needs --config FILE (the job whose {'checkpoint to continue' if args.resume else 'output to replace'})"
        )
    demo = [
        f"--{k.replace('_', '-')}"
        for k in ("speeds", "iterations", "mapping", "batch_size", "optimizer")
        if getattr(args, k) is not None
    ]
    if demo or args.json:
        raise CLIError(
            f"{', '.join(demo + (['--json'] if args.json else []))} belong to the demo; with --config put them in the job file"
        )
    try:
        summary = run_job(args.config, resume=args.resume, overwrite=args.overwrite)
    except KeyboardInterrupt:  # a second Ctrl-C: at once, without the stop's checkpoint
        print(
            f"dask-rpm train: interrupted; the job's last checkpoint (if one was written) stays: "
            f"continue with dask-rpm train --config {args.config} --resume",
            file=sys.stderr,
        )
        return 130
    except JobError as e:
        raise CLIError(str(e)) from None
    except StoreError as e:  # a worker reading its rows of the checkpoint store found it damaged
        raise CLIError(f"{'--resume' if args.resume else 'checkpoint'}: {e}") from None
    except DataError as e:  # found by a worker reading its samples, before the first iteration
        raise CLIError(f"job file: data: {e}") from None
    except TrainingError as e:
        print(
            f"dask-rpm train: training failed: {' '.join(str(e).split())}; no output written",
            file=sys.stderr,
        )
        return 1
    if summary.get("signal") == "SIGINT":  # stopped by Ctrl-C, checkpoint written: the shell's code
        return 130
    return 1 if summary.get("rescued") else 0  # saved, but not where the job asked
