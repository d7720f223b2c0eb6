"""Restart time: the workers reading their rows of a checkpoint store vs the driver handing them out.

Issue 14. Before, ``fit(resume=<store>)`` (and a recovery from a store) read the whole
checkpoint on the driver, cut it into shards and scattered one to every worker of the new plan
(each column holds a full copy, so the weights crossed the client's link once per column).
Now the driver reads only ``manifest.json`` and every worker reads the row files of its own rows
(``dask_rpm.engine.store.StoreRows``).

One store is written once (``fit(checkpoint_dir=...)``, stopped at ``--at``), then two arms are
timed, interleaved in every repeat (the order rotating), on one local cluster of ``--workers``
processes of equal speed (nothing EMULATED), a fixed plan (``--method``, SRPM by default), Adam
(the checkpoint holds 3 x the weights):

* ``driver``: ``fit(resume=store.load(dir))``: the old path, the driver reading the store and
  scattering the shards (the read is timed and added);
* ``workers``: ``fit(resume=dir)``: the workers read their rows.

Reported per arm: the median seconds until every worker holds its shard (the driver's read plus
``FitResult.stats["start"]["seconds"]``), the bytes through the client and read by the workers,
and the wall time of the resumed run (two iterations). Both arms must end with the same weights.
Run it under the exclusive CPU lock::

    flock -x /tmp/rpm-cpu.lock env PYTHONPATH=$PWD python benchmarks/resume.py
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from typing import Any

from checkpoint import (  # benchmarks/checkpoint.py, beside this script
    largest_difference,
    problem,
    problem_arguments,
    report,
)


def _fit(client: Any, x: Any, d: Any, args: argparse.Namespace, plan: Any, **kw: Any) -> Any:
    from dask_rpm import fit

    return fit(
        x,
        d,
        hidden=args.hidden,
        learning_rate=1e-4,
        optimizer="adam",
        mapping=plan,
        client=client,
        interval=args.at,
        progress="none",
        **kw,
    )


def one_run(
    client: Any, arm: str, ck: str, x: Any, d: Any, args: argparse.Namespace, plan: Any
) -> dict:
    from dask_rpm.engine import store

    t0 = time.perf_counter()
    read = 0.0
    if arm == "driver":
        resume: Any = store.load(ck)
        read = time.perf_counter() - t0
    else:
        resume = ck
    r = _fit(client, x, d, args, plan, iterations=args.at + 2, resume=resume)
    wall = time.perf_counter() - t0
    start = r.stats["start"]
    return {
        "arm": arm,
        "driver_read_seconds": read,
        "place_seconds": start["seconds"],
        "restart_seconds": read + start["seconds"],
        "client_bytes": start["client_bytes"],
        "store_bytes": start["store_bytes"],
        "wall": wall,
        "W": r.params[0],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    problem_arguments(p, hidden=8192, samples=2048)
    p.add_argument("--at", type=int, default=4, help="iteration of the checkpoint resumed from")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument(
        "--method",
        default="srpm",
        help="planner of the fixed plan (srpm: few columns; split-1d: one column per worker, each "
        "holding all rows, so the old path scattered the whole checkpoint once per worker)",
    )
    p.add_argument("--dir", default=None, help="where the store goes (default: the temp dir)")
    p.add_argument("--json", default=None, help="write the raw numbers here")
    args = p.parse_args()

    from distributed import Client, LocalCluster

    x, d, shape, plan = problem(args, args.method)
    arms = ["driver", "workers"]
    runs: list[dict] = []
    tmp = tempfile.mkdtemp(prefix="rpm-resume-", dir=args.dir)
    ck = os.path.join(tmp, "store")
    try:
        with (
            LocalCluster(
                n_workers=args.workers, threads_per_worker=1, processes=True, dashboard_address=":0"
            ) as cluster,
            Client(cluster) as client,
        ):
            _fit(
                client,
                x,
                d,
                args,
                plan,
                iterations=args.at,
                checkpoint_every=args.at,
                checkpoint_dir=ck,
            )
            one_run(client, "workers", ck, x, d, args, plan)  # warm-up: imports, first kernels
            for rep in range(args.repeats):
                for arm in arms[rep % 2 :] + arms[: rep % 2]:
                    runs.append(dict(one_run(client, arm, ck, x, d, args, plan), repeat=rep))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    worst = largest_difference(runs, runs[0]["W"])
    n, m, l = shape
    summary: dict[str, Any] = {
        "shape": "-".join(map(str, shape)),
        "samples": args.samples,
        "workers": args.workers,
        "method": args.method,
        "columns": len(plan.columns),
        "checkpoint_bytes": 3 * (m * n + l * m) * 8,  # W, V and Adam's two slots
        "repeats": args.repeats,
        "same_weights_max_relative_difference": worst,
        "arms": {},
    }
    for arm in arms:
        mine = [r for r in runs if r["arm"] == arm]
        summary["arms"][arm] = {
            key: statistics.median(r[key] for r in mine)
            for key in ("restart_seconds", "driver_read_seconds", "place_seconds", "wall")
        } | {
            "restart_seconds_all": [round(r["restart_seconds"], 4) for r in mine],
            "client_bytes": mine[0]["client_bytes"],
            "store_bytes": mine[0]["store_bytes"],
        }
    report(summary, runs, args.json)


if __name__ == "__main__":
    main()
