"""Mini-batch plans (issue 11): SRPM planned for the training set vs for one mini-batch.

SRPM's communication model counts the vertical exchange of a column as
``2 l s`` with ``s`` the samples of an iteration. With mini-batches ``fit``
plans on the whole training set (``s = 16384``) although an iteration
exchanges only its batch's rows (``B``), so the plan has more columns (more
horizontal weight-row traffic) than one iteration needs. This measures what
planning on ``B`` would give, without changing the engine: static SRPM plans
on the EMULATED true speeds, one with the columns SRPM chooses for ``s``
samples and one with the columns it chooses for ``B`` samples (``dp=`` forced,
cuts over the whole set), and DRPM as the bench runs it, side by side on one
cluster per N (**EMULATED heterogeneity on one machine**: not hardware
figures). Every arm's final weights are checked against ``fit_serial``.

Usage::

    python benchmarks/minibatch_plan.py --n 4 --batch-sizes 256,1024     # ~1 minute
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import numpy as np


def run(n: int, batch_sizes: list[int], iterations: int, interval: int) -> list[dict[str, Any]]:
    from distributed import Client

    from dask_rpm import fit, fit_serial, local_cluster
    from dask_rpm.bench.profiles import WORKLOADS, steady_seconds, true_profile, weights_difference
    from dask_rpm.demo.train import demo_data
    from dask_rpm.emulation import worker_addresses
    from dask_rpm.planners import make_plan

    work = WORKLOADS["minibatch"]
    shape, s = work.shape, work.samples
    m = work.hidden[0]
    speeds = list(true_profile("A", n))
    x, d = demo_data(s, shape, seed=0)
    rows = []
    with (
        local_cluster(speeds, dashboard_address=None, silence_logs=50) as cluster,
        Client(cluster) as client,
    ):
        addresses = worker_addresses(client)
        print(f"N={n}: {cluster.emulation_label}", file=sys.stderr, flush=True)
        for b in batch_sizes:
            lr = 0.5 / (b * m)
            W, V = fit_serial(
                x, d, hidden=m, iterations=iterations, learning_rate=lr, seed=0, batch_size=b
            ).params
            c_set = make_plan(speeds, shape, s, method="srpm").n_columns
            c_batch = make_plan(speeds, shape, b, method="srpm").n_columns
            arms = {
                f"srpm planned for s (C={c_set})": make_plan(
                    speeds, shape, s, method="srpm", dp=c_set
                ),
                f"srpm planned for B (C={c_batch})": make_plan(
                    speeds, shape, s, method="srpm", dp=c_batch
                ),
                "drpm": "drpm",
            }
            for name, mapping in arms.items():
                mp = mapping if isinstance(mapping, str) else mapping.with_workers(addresses)
                res = fit(
                    x,
                    d,
                    hidden=m,
                    iterations=iterations,
                    learning_rate=lr,
                    mapping=mp,
                    client=client,
                    seed=0,
                    interval=interval,
                    batch_size=b,
                    progress="none",
                )
                it = np.asarray(res.history["iteration_time"].values, dtype=float)
                row = {
                    "N": n,
                    "B": b,
                    "arm": name,
                    "columns": res.plan.n_columns,
                    "seconds_per_iteration": steady_seconds(it, iterations // 2),
                    "horizontal_ms": 1e3
                    * float(
                        np.nanmean(
                            np.nanmedian(
                                res.history["horizontal"].values[iterations // 2 :], axis=0
                            )
                        )
                    ),
                    "weights_vs_serial": weights_difference(res.params, (W, V)),
                }
                rows.append(row)
                print(
                    f"  B={b} {name}: {row['seconds_per_iteration']:.4f} s/it, {row['columns']} column(s), "
                    f"horizontal {row['horizontal_ms']:.1f} ms, weights vs fit_serial "
                    f"{row['weights_vs_serial']:.1e}",
                    file=sys.stderr,
                    flush=True,
                )
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--batch-sizes", default="256,1024")
    ap.add_argument("--iterations", type=int, default=32)
    ap.add_argument("--interval", type=int, default=8)
    ap.add_argument("--json", help="also write the rows to this file")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    rows = run(
        args.n, [int(v) for v in args.batch_sizes.split(",")], args.iterations, args.interval
    )
    print("| N | B | arm | columns | s/iteration | horizontal ms | vs first arm |")
    print("|---:|---:|---|---:|---:|---:|---:|")
    for r in rows:
        ref = next(q for q in rows if q["B"] == r["B"])
        print(
            f"| {r['N']} | {r['B']} | {r['arm']} | {r['columns']} | {r['seconds_per_iteration']:.4f} | "
            f"{r['horizontal_ms']:.1f} | {r['seconds_per_iteration'] / ref['seconds_per_iteration']:.2f} |"
        )
    print(
        f"EMULATED heterogeneity on one machine; {time.perf_counter() - t0:.0f} s", file=sys.stderr
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
