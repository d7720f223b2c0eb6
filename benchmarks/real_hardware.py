"""REAL figures on a many-core machine (prepared for a 16-core x86 host; runs anywhere).

Everything here is REAL: unpaced Dask workers on the machine's own cores, no
emulation, and the PyTorch DDP peer unpaced with the same threads per rank.
Three parts, one JSON file, one Markdown summary:

1. **Thread sweep** (203-1024-26, s = 16384): one worker of T threads, T = 1,
   8, 16 (capped at the cores): numpy ``fit_serial`` with T BLAS threads, a
   plain torch loop with T threads, and ``fit`` on one worker of T threads.
2. **Equal one-thread workers**, N = 8 and 16: every dask_rpm method and DDP
   at the compute, minibatch and paper workloads (``dask-rpm bench --real``).
3. **A heterogeneous mix**: workers of 1, 2, 4 and 8 threads (15 cores): DRPM,
   SRPM and srpm-time from probed abilities, split-1d, uniform and DDP (ranks
   with the same threads).

Usage (``bash benchmarks/real_hardware.sh`` installs nothing from the network)::

    python benchmarks/real_hardware.py --out real-hw          # all parts (~7 min on 16 cores)
    python benchmarks/real_hardware.py --quick --out real-hw  # fewer iterations, N = 8 only
    python benchmarks/real_hardware.py --parts sweep --ns 2   # one part; N = 2 on a 2-core machine
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import numpy as np


def _log(msg: str) -> None:
    print(f"[real {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _torch_loop(x: np.ndarray, d: np.ndarray, m: int, threads: int, iterations: int) -> float:
    """A plain torch training loop of the same network on ``threads`` threads (seconds/iteration)."""
    import torch

    from dask_rpm.nn.kernels import init_weights

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        W0, V0 = init_weights(x.shape[1], m, d.shape[1])
        W = torch.tensor(W0, requires_grad=True)
        V = torch.tensor(V0, requires_grad=True)
        xt, dt = torch.from_numpy(x), torch.from_numpy(d)
        opt = torch.optim.SGD([W, V], lr=1e-6)

        def step() -> None:
            opt.zero_grad(set_to_none=True)
            h = torch.sigmoid(torch.sigmoid(xt @ W.T) @ V.T)
            (0.5 * ((h - dt) ** 2).sum()).backward()
            opt.step()

        step()
        t0 = time.perf_counter()
        for _ in range(iterations):
            step()
        return (time.perf_counter() - t0) / iterations
    finally:
        torch.set_num_threads(before)


def sweep(threads: list[int], iterations: int) -> list[dict[str, Any]]:
    """Part 1: one worker of T threads against fit_serial and a torch loop on T threads."""
    from distributed import Client
    from threadpoolctl import threadpool_limits

    import dask_rpm
    from dask_rpm.bench.real import real_cluster, real_data
    from dask_rpm.plan.partition import Plan

    n, m, l, s = 203, 1024, 26, 16384
    x, d = real_data((n, m, l), s)
    rows = []
    for t in threads:
        with real_cluster([t]) as cluster, Client(cluster) as client:
            (a,) = dask_rpm.ordered_workers(client.scheduler_info())
            plan = Plan.from_columns([[0]], [s], [[m]], shape=(n, m, l)).with_workers([a])
            kw = dict(hidden=m, learning_rate=1e-6, mapping=plan, client=client, progress="none")
            dask_rpm.fit(x, d, iterations=2, **kw)
            serial, torch_t, ours = [], [], []
            for _ in range(2):  # arms alternate: the machine's noise hits all three
                with threadpool_limits(t):
                    t0 = time.perf_counter()
                    dask_rpm.fit_serial(x, d, hidden=m, iterations=iterations, learning_rate=1e-6)
                    serial.append((time.perf_counter() - t0) / iterations)
                try:
                    torch_t.append(_torch_loop(x, d, m, t, iterations))
                except ImportError:
                    torch_t.append(float("nan"))
                ours.append(dask_rpm.fit(x, d, iterations=iterations, **kw).seconds_per_iteration)
        row = {
            "label": "REAL",
            "threads": t,
            "fit_serial": float(np.median(serial)),
            "torch": float(np.median(torch_t)),
            "fit_one_worker": float(np.median(ours)),
        }
        row["fit_vs_serial"] = row["fit_one_worker"] / row["fit_serial"]
        rows.append(row)
        _log(
            f"sweep T={t}: fit_serial {row['fit_serial'] * 1e3:.1f} ms, torch {row['torch'] * 1e3:.1f} ms, "
            f"fit on 1 worker {row['fit_one_worker'] * 1e3:.1f} ms ({row['fit_vs_serial']:.3f}x)"
        )
    return rows


def markdown(result: dict[str, Any]) -> str:
    from dask_rpm.bench.real import real_table

    out = [f"REAL figures, {result['cores']} cores, {result['machine']}", ""]
    if result.get("sweep"):
        out += [
            "| REAL | T | fit_serial (T BLAS threads) | torch loop (T threads) | fit, 1 worker of T threads | fit / fit_serial |",
            "|---|---|---|---|---|---|",
        ]
        for r in result["sweep"]:
            out.append(
                f"| REAL | {r['threads']} | {r['fit_serial'] * 1e3:.1f} ms | {r['torch'] * 1e3:.1f} ms | "
                f"{r['fit_one_worker'] * 1e3:.1f} ms | {r['fit_vs_serial']:.3f}x |"
            )
        out.append("")
    if result.get("cases"):
        out.append(real_table(result["cases"]))
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="real-hw", help="output directory (real.json, real.md)")
    p.add_argument("--parts", default="sweep,equal,mix", help="comma-separated: sweep, equal, mix")
    p.add_argument("--ns", default=None, help="equal workers, e.g. 8,16 (default 8,16; --quick 8)")
    p.add_argument("--mix", default="1,2,4,8", help="threads per worker of the mix")
    p.add_argument("--workloads", default="compute,minibatch,paper")
    p.add_argument("--quick", action="store_true", help="fewer iterations, N = 8 only")
    args = p.parse_args(argv)
    cores = os.cpu_count() or 1
    parts = args.parts.split(",")
    ns = [int(v) for v in (args.ns or ("8" if args.quick else "8,16")).split(",")]
    ns = [n for n in ns if n <= cores] or [min(2, cores)]
    mix = [int(v) for v in args.mix.split(",")]
    while sum(mix) > cores and len(mix) > 1:  # a smaller machine: drop the widest worker
        mix = mix[:-1]
    iterations = 6 if args.quick else None
    result: dict[str, Any] = {
        "label": "REAL",
        "cores": cores,
        "machine": os.uname().machine,
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    t0 = time.perf_counter()
    os.makedirs(args.out, exist_ok=True)

    def save() -> None:  # after every part: a run cut at its time limit keeps what it finished
        result["seconds"] = time.perf_counter() - t0
        with open(os.path.join(args.out, "real.json"), "w") as f:
            json.dump(result, f, indent=1)
        with open(os.path.join(args.out, "real.md"), "w") as f:
            f.write(markdown(result) + "\n")

    if "sweep" in parts:
        result["sweep"] = sweep(
            sorted({t for t in (1, 8, 16) if t <= cores} | {min(2, cores)}), 3 if args.quick else 5
        )
        save()
    workloads = args.workloads.split(",")
    threads_list = []
    if "equal" in parts:
        threads_list += [[1] * n for n in ns]
    if "mix" in parts:
        threads_list.append(mix)
    from dask_rpm.bench.real import run_real

    result["cases"] = []
    run_real(
        threads_list,
        workloads,
        iterations=iterations,
        log=_log,
        rows=result["cases"],
        on_row=lambda row: save(),
    )
    save()
    print(markdown(result))
    _log(f"done in {result['seconds']:.0f} s; wrote {args.out}/real.json and real.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
