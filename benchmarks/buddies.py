"""REAL: what buddy copies (issue 36) cost per iteration, from interleaved runs with and without them.

The deep mini-batch workload of the issue: a 784-256-128-10 network (ReLU, softmax and
cross-entropy), Adam, batches of 512 drawn from 4096 synthetic samples, on a LocalCluster of
2 worker processes x 1 thread (unpaced: REAL, this machine's cores). Each pair of runs trains
the same network once with ``rpm.resilience.buddies: false`` and once with buddy copies on
(``every: auto``, the default), in alternating order, on the same cluster; the time per
iteration of a run is the median of its iterations after the first ``--skip``. The overhead
of a pair is ``on / off - 1``; the report gives each pair's and their median, and what the
copies were (``R`` chosen, copies taken and sent, bytes held). The machine may be shared:
the pairs are interleaved so that a busy spell weighs on both arms, and the median of the
pairs is the figure.

Usage::

    python benchmarks/buddies.py                      # 6 pairs of 150 iterations: about 3 min on 2 cores
    python benchmarks/buddies.py --pairs 3 --iterations 100 --json buddies.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

import numpy as np

SHAPE = (784, (256, 128), 10)


def problem(samples: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(samples, SHAPE[0]))
    y = rng.integers(0, SHAPE[2], size=samples)
    return x, y


def one_run(client: Any, x: np.ndarray, y: np.ndarray, buddies: bool, a: Any) -> dict[str, Any]:
    import dask.config

    from dask_rpm import fit

    t0 = time.perf_counter()
    with dask.config.set({"rpm.resilience.buddies": buddies}):
        r = fit(
            x,
            y,
            hidden=SHAPE[1],
            iterations=a.iterations,
            learning_rate=1e-3,
            batch_size=a.batch,
            optimizer="adam",
            activation="relu",
            loss="cross-entropy",
            mapping="srpm",
            client=client,
            progress="none",
        )
    times = r.history["iteration_time"].values[a.skip :]
    b = r.stats["buddies"]
    return {
        "buddies": buddies,
        "seconds_per_iteration": float(np.median(times)),
        "mean_seconds_per_iteration": float(np.mean(times)),
        "wall_seconds": round(time.perf_counter() - t0, 2),
        "plan": repr(r.plan),
        "R": b.get("every"),
        "R_chosen": b.get("every_chosen"),
        "copies_taken": b.get("copies_taken"),
        "copies_sent": b.get("copies_sent"),
        "sends_skipped": b.get("sends_skipped"),
        "copy_seconds": b.get("copy_seconds"),
        "copy_memory": b.get("memory"),
        # stats["memory"] counts the copies with the shard: the shard alone
        "shard_memory": {
            a: v - (b.get("memory") or {}).get(a, 0) for a, v in r.stats["memory"].items()
        },
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--iterations", type=int, default=150)
    ap.add_argument("--skip", type=int, default=20, help="warm-up iterations left out")
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--samples", type=int, default=4096)
    ap.add_argument("--json", metavar="PATH")
    a = ap.parse_args(argv)
    from distributed import Client, LocalCluster

    x, y = problem(a.samples)
    runs: list[dict[str, Any]] = []
    with (
        LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            dashboard_address=":0",
            silence_logs=50,
        ) as cluster,
        Client(cluster) as client,
    ):
        client.wait_for_workers(2)
        one_run(client, x, y, True, argparse.Namespace(**{**vars(a), "iterations": 30}))  # warm
        for p in range(a.pairs):
            order = (False, True) if p % 2 == 0 else (True, False)
            pair = {on: one_run(client, x, y, on, a) for on in order}
            runs += [pair[False], pair[True]]
            ratio = pair[True]["seconds_per_iteration"] / pair[False]["seconds_per_iteration"]
            print(
                f"pair {p + 1}: off {pair[False]['seconds_per_iteration'] * 1e3:.2f} ms, on "
                f"{pair[True]['seconds_per_iteration'] * 1e3:.2f} ms (R {pair[True]['R']}, "
                f"{pair[True]['copies_sent']} copies sent): overhead {100 * (ratio - 1):+.2f} %",
                flush=True,
            )
    overheads = [
        on["seconds_per_iteration"] / off["seconds_per_iteration"] - 1
        for off, on in zip(runs[::2], runs[1::2])
    ]
    report = {
        "setup": {
            "network": "784-256-128-10 (relu, softmax, cross-entropy), Adam, float64",
            "batch": a.batch,
            "samples": a.samples,
            "iterations": a.iterations,
            "skip": a.skip,
            "cluster": f"LocalCluster(processes=True), 2 workers x 1 thread, REAL (unpaced), "
            f"{os.cpu_count()} cores shared",
        },
        "runs": runs,
        "overhead_per_pair": overheads,
        "median_overhead": statistics.median(overheads),
        "median_off_ms": 1e3 * statistics.median(r["seconds_per_iteration"] for r in runs[::2]),
        "median_on_ms": 1e3 * statistics.median(r["seconds_per_iteration"] for r in runs[1::2]),
    }
    print(
        f"median overhead over {a.pairs} pairs: {100 * report['median_overhead']:+.2f} % "
        f"(pairs: {', '.join(f'{100 * o:+.1f}' for o in overheads)} %); medians off "
        f"{report['median_off_ms']:.2f} ms, on {report['median_on_ms']:.2f} ms per iteration"
    )
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(report, fh, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
