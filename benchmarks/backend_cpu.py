"""REAL: the torch-CPU backend against numpy, per BP iteration, on this machine's cores (issue #25).

``fit_serial`` on the three workloads of the REAL bench (paper: 203-80-26 on 1024 samples;
compute: 203-1024-26 on 32768, full batch; minibatch: the same network, B = 1024), with 1 and
with all of this machine's threads (threadpoolctl for numpy's BLAS, ``torch.set_num_threads``
for torch). Per iteration: a run's time over its iterations (what a call pays once, checking
the data, is under 1 % of it at these lengths); the backends alternate, ``--repeats`` times, and
the fastest run is reported (other load on a shared machine only slows a run) with the median. Prints a Markdown table; ``--json FILE`` writes the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

import numpy as np
import torch
from threadpoolctl import threadpool_limits

from dask_rpm import fit_serial
from dask_rpm.bench.real import real_data

WORKLOADS: dict[str, tuple[tuple[int, int, int], int, int | None, int]] = {
    "paper": ((203, 80, 26), 1024, None, 200),
    "compute": ((203, 1024, 26), 32768, None, 3),
    "minibatch": ((203, 1024, 26), 32768, 1024, 32),
}


def per_iteration(
    x: np.ndarray, d: np.ndarray, hidden: int, batch: int | None, backend: str, it: int
) -> float:
    kw: dict[str, Any] = dict(
        hidden=hidden, learning_rate=1e-6, batch_size=batch, backend=backend, device="cpu"
    )
    t0 = time.perf_counter()
    fit_serial(x, d, iterations=it, **kw)
    return (time.perf_counter() - t0) / it


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json")
    args = ap.parse_args()
    cores = os.cpu_count() or 1
    rows = []
    for name, (shape, samples, batch, it) in WORKLOADS.items():
        x, d = real_data(shape, samples)
        for threads in sorted({1, cores}):
            torch.set_num_threads(threads)
            got: dict[str, list[float]] = {"numpy": [], "torch": []}
            with threadpool_limits(threads):
                for b in got:  # warm both
                    per_iteration(x, d, shape[1], batch, b, 1)
                for _ in range(args.repeats):
                    for b in got:
                        got[b].append(per_iteration(x, d, shape[1], batch, b, it))
            med = {b: float(np.min(v)) for b, v in got.items()}
            rows.append({"workload": name, "threads": threads, "seconds": got, "median": med})
            print(
                f"[REAL] {name:9s} {threads} thread(s): numpy {med['numpy'] * 1e3:8.2f} ms "
                f"(median {np.median(got['numpy']) * 1e3:.2f}), torch {med['torch'] * 1e3:8.2f} ms "
                f"(median {np.median(got['torch']) * 1e3:.2f}), torch/numpy "
                f"{med['torch'] / med['numpy']:.2f}",
                flush=True,
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"label": "REAL", "cores": cores, "torch": torch.__version__, "rows": rows},
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
