"""Checkpoint time: the workers writing their rows into a store vs the driver gathering the weights.

Issue 14. Before, every checkpoint gathered ``W``, ``V`` and the optimizer state from the
first column to the client, which then wrote them (``fit(on_checkpoint=...)``; a ``dask-rpm
train`` job writes one netCDF file). Now (``fit(checkpoint_dir=...)``) every worker writes its
own rows into a directory store in parallel and the driver writes a small manifest
(``dask_rpm.engine.store``). Both arms end with the checkpoint durable on disk: the driver arm's
``on_checkpoint`` writes the gathered arrays through the same atomic writer (one ``.npz``).

Arms, interleaved in every repeat (rotating the order), on one local cluster of ``--workers``
processes of equal speed (nothing EMULATED), a fixed SRPM plan, Adam (two state slots: the
checkpoint holds 3 x the weights):

* ``none``: no checkpoints (the iteration time reference);
* ``driver``: ``checkpoint_every=K`` with ``on_checkpoint`` (the driver path);
* ``store``: ``checkpoint_every=K`` with ``checkpoint_dir`` (the workers write).

Reported per arm: the median seconds of one checkpoint (``FitResult.stats["checkpoints"]``,
from the block's end to the checkpoint being on disk), the run's extra wall time per checkpoint
against the same repeat's ``none`` run (the training time the checkpoints cost), the median
iteration time, and the bytes of weights that reached the driver per checkpoint.
Run it under the exclusive CPU lock::

    flock -x /tmp/rpm-cpu.lock env PYTHONPATH=$PWD python benchmarks/checkpoint.py
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from typing import Any

import numpy as np


def _driver_writer(directory: str) -> Any:
    """The driver path's ``on_checkpoint``: the gathered arrays into one ``.npz``, atomically."""
    from dask_rpm._files import atomic_write

    def on_checkpoint(state: dict[str, Any]) -> None:
        arrays = dict(zip(("W", "V"), state["params"]))
        for slot, (Ws, Vs) in (state["optimizer_state"] or {}).items():
            arrays[f"{slot}_W"], arrays[f"{slot}_V"] = Ws, Vs

        def write(tmp: str) -> None:
            with open(tmp, "wb") as f:
                np.savez(f, **arrays)

        atomic_write(os.path.join(directory, "checkpoint.npz"), write)

    return on_checkpoint


def one_run(client: Any, arm: str, x: Any, d: Any, args: argparse.Namespace, plan: Any) -> dict:
    from dask_rpm import fit

    tmp = tempfile.mkdtemp(prefix=f"rpm-ckpt-{arm}-", dir=args.dir)
    kw: dict[str, Any] = {}
    if arm == "driver":
        kw = dict(checkpoint_every=args.every, on_checkpoint=_driver_writer(tmp))
    elif arm == "store":
        kw = dict(checkpoint_every=args.every, checkpoint_dir=os.path.join(tmp, "store"))
    t0 = time.perf_counter()
    r = fit(
        x,
        d,
        hidden=args.hidden,
        iterations=args.iterations,
        learning_rate=1e-4,
        optimizer="adam",
        mapping=plan,
        client=client,
        interval=args.every,
        progress="none",
        **kw,
    )
    wall = time.perf_counter() - t0
    shutil.rmtree(tmp, ignore_errors=True)
    times = [s for _, s in r.stats["checkpoints"]]
    return {
        "arm": arm,
        "checkpoint_seconds": times,
        "seconds_per_iteration": float(r.seconds_per_iteration),
        "wall": wall,
        "W": r.params[0],
    }


def problem_arguments(p: argparse.ArgumentParser, hidden: int, samples: int) -> None:
    """The network, data and cluster options of the checkpoint benchmarks (also resume.py's)."""
    p.add_argument("--inputs", type=int, default=203)
    p.add_argument("--hidden", type=int, default=hidden)
    p.add_argument("--outputs", type=int, default=26)
    p.add_argument("--samples", type=int, default=samples)
    p.add_argument("--workers", type=int, default=4)


def problem(args: argparse.Namespace, method: str = "srpm") -> tuple[Any, Any, tuple, Any]:
    """``(x, d, shape, plan)``: seeded data and a fixed plan on ``args.workers`` equal workers."""
    from dask_rpm import make_plan

    rng = np.random.default_rng(0)
    x = rng.normal(size=(args.samples, args.inputs))
    x[:, -1] = 1.0
    d = rng.uniform(0.1, 0.9, size=(args.samples, args.outputs))
    shape = (args.inputs, args.hidden, args.outputs)
    return x, d, shape, make_plan([1.0] * args.workers, shape, args.samples, method=method)


def largest_difference(runs: list[dict], ref: Any) -> float:
    """Largest relative difference (to ``ref``'s largest entry) of any run's final ``W`` from ``ref``."""
    return max(float(np.abs(r["W"] - ref).max() / np.abs(ref).max()) for r in runs)


def report(summary: dict, runs: list[dict], path: str | None) -> None:
    """Print ``summary``; with ``path`` also write it and the raw runs (weights left out) as JSON."""
    print(json.dumps(summary, indent=1))
    if path:
        with open(path, "w") as f:
            json.dump({"summary": summary, "runs": [dict(r, W=None) for r in runs]}, f, indent=1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    problem_arguments(p, hidden=1024, samples=8192)
    p.add_argument("--iterations", type=int, default=20)
    p.add_argument("--every", type=int, default=5)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--dir", default=None, help="where the checkpoints go (default: the temp dir)")
    p.add_argument("--json", default=None, help="write the raw numbers here")
    args = p.parse_args()

    from distributed import Client, LocalCluster

    x, d, shape, plan = problem(args)
    arms = ["none", "driver", "store"]
    runs: list[dict] = []
    with (
        LocalCluster(
            n_workers=args.workers, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        one_run(client, "store", x, d, args, plan)  # warm-up: imports, plugins, first kernels
        for rep in range(args.repeats):
            order = arms[rep % 3 :] + arms[: rep % 3]
            for arm in order:
                runs.append(dict(one_run(client, arm, x, d, args, plan), repeat=rep))
    worst = largest_difference(runs, next(r["W"] for r in runs if r["arm"] == "none"))
    itemsize, n, m, l = 8, *shape
    state_bytes = 3 * (m * n + l * m) * itemsize  # W, V and Adam's two slots
    summary = {
        "shape": "-".join(map(str, shape)),
        "samples": args.samples,
        "workers": args.workers,
        "iterations": args.iterations,
        "every": args.every,
        "repeats": args.repeats,
        "checkpoint_bytes": state_bytes,
        "same_weights_max_relative_difference": worst,
        "arms": {},
    }
    for arm in arms:
        mine = [r for r in runs if r["arm"] == arm]
        cks = [s for r in mine for s in r["checkpoint_seconds"]]
        summary["arms"][arm] = {
            "checkpoint_seconds_median": statistics.median(cks) if cks else None,
            "checkpoint_seconds_min": min(cks) if cks else None,
            "checkpoint_seconds_max": max(cks) if cks else None,
            "checkpoints": len(cks),
            "seconds_per_iteration_median": statistics.median(
                r["seconds_per_iteration"] for r in mine
            ),
            "wall_per_iteration_median": statistics.median(
                r["wall"] / args.iterations for r in mine
            ),
            "weight_bytes_to_driver_per_checkpoint": state_bytes if arm == "driver" else 0,
        }
        if cks:  # the run's extra wall time per checkpoint, against the same repeat's "none" run
            none = {r["repeat"]: r["wall"] for r in runs if r["arm"] == "none"}
            summary["arms"][arm]["extra_wall_per_checkpoint_median"] = statistics.median(
                (r["wall"] - none[r["repeat"]]) / len(r["checkpoint_seconds"]) for r in mine
            )
    report(summary, runs, args.json)


if __name__ == "__main__":
    main()
