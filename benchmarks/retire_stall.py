"""How long training stalls when a worker is retired from outside (issue 14).

``client.retire_workers`` (or an adaptive scale-down) closes a worker gracefully: the scheduler
keeps listing it while it retires, which takes seconds to tens of seconds (its data moves to
other workers first). The driver used to count a worker lost only once the scheduler dropped
it, so training waited that long; it now asks the scheduler plugin (``rpm_leaving``), which
names a retiring worker at once.

Run it against the tree to measure (``PYTHONPATH`` picks it), e.g. before and after a change::

    PYTHONPATH=/path/to/old python benchmarks/retire_stall.py --repeats 3
    PYTHONPATH=$PWD         python benchmarks/retire_stall.py --repeats 3

Four local workers of equal speed (nothing is EMULATED), mini-batches from arrays (each worker
holds a copy of the training set, so retiring one moves data), a fixed SRPM plan; at iteration
``--at`` a thread retires worker 2. Reported: seconds from the retire call to the first block
boundary after the recovery, and whether the result still equals the serial run.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from typing import Any

import numpy as np


def one_run(at: int, iterations: int, seed: int, interval: int, hidden: int) -> dict[str, Any]:
    """Train once, retire a worker at iteration ``at``; the stall it caused, in seconds."""
    from distributed import Client, LocalCluster

    from dask_rpm import fit, fit_serial, ordered_workers

    rng = np.random.default_rng(seed)
    x = rng.normal(size=(2048, 16))
    d = 1 / (1 + np.exp(-x[:, :4] @ rng.normal(size=(4, 2)) * 0.3))
    kw: dict[str, Any] = dict(
        hidden=hidden, iterations=iterations, learning_rate=0.02, batch_size=256, seed=seed
    )
    marks: dict[str, float] = {}
    with (
        LocalCluster(
            n_workers=4, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        victim = ordered_workers(client.scheduler_info())[2]

        def retire() -> None:
            client.retire_workers(workers=[victim], close_workers=True)

        def callback(info: dict[str, Any]) -> None:
            now = time.monotonic()
            if "retire" not in marks and info["iteration"] >= at:
                marks["retire"] = now
                threading.Thread(target=retire, daemon=True).start()
            elif "retire" in marks and "resumed" not in marks:
                if any(victim in (rec.get("lost") or ()) for rec in info["remaps"]):
                    marks["resumed"] = now  # the first boundary after the recovery

        r = fit(
            x,
            d,
            client=client,
            mapping="srpm",
            interval=interval,
            callback=callback,
            progress="none",
            **kw,
        )
    W_serial = fit_serial(x, d, **kw).params[0]
    lost = [rec for rec in r.remaps if victim in (rec.get("lost") or ())]
    return {
        "stall_seconds": marks.get("resumed", float("nan")) - marks.get("retire", float("nan")),
        "recovered": bool(lost),
        "max_rel_diff_W": float(np.max(np.abs(r.params[0] - W_serial)) / np.max(np.abs(W_serial))),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--at", type=int, default=40, help="retire at this iteration")
    ap.add_argument("--iterations", type=int, default=200)
    ap.add_argument("--interval", type=int, default=10, help="iterations per block")
    ap.add_argument("--hidden", type=int, default=32)
    args = ap.parse_args(argv)
    runs = [
        one_run(args.at, args.iterations, seed, args.interval, args.hidden)
        for seed in range(args.repeats)
    ]
    stalls = [r["stall_seconds"] for r in runs]
    print(json.dumps({"runs": runs, "median_stall_seconds": float(np.median(stalls))}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
