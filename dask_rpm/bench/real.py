"""``dask-rpm bench --real``: dask_rpm against PyTorch DDP on REAL, unpaced workers.

No emulation anywhere: every worker is a Dask nanny process with the threads
it is given, its kernels run at whatever speed its cores have, and the DDP peer
runs unpaced with the same threads per rank. Every figure this module produces
is REAL (the EMULATED bench, :mod:`dask_rpm.bench.harness`, shows the method).

A case is a list of threads per worker: ``[1, 1]`` is two one-thread workers,
``[1, 2, 4, 8]`` a heterogeneous mix. For each workload it measures, in one run
and with the arms interleaved where it matters:

* ``alone``: :func:`dask_rpm.fit_serial` on a worker, on that worker's
  threads (the one-worker time a user compares with, ``T_series``; timed on one
  worker per distinct thread count);
* the dask_rpm methods (``drpm``, ``srpm`` and ``split-1d`` from probed
  abilities, ``srpm-time`` from probed rates and links, ``uniform``);
* ``ddp``: the PyTorch DDP peer, one rank per worker with the same threads.

Each method's time is the median iteration time after its first third
(DRPM's first remap falls in that third). ``gamma`` is the parallel efficiency
``(1 / T) / sum_i (1 / T_alone(i))`` (docs/method.md §8).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from distributed import Client, Nanny, Scheduler, SpecCluster

from ..engine import fit, ordered_workers
from ..nn.serial import fit_serial
from ..probe.kernel import worker_threads
from .ddp import run_ddp, torch_available
from .profiles import BenchError, gamma, steady_seconds

__all__ = [
    "REAL_WORKLOADS",
    "REAL_METHODS",
    "real_cluster",
    "real_data",
    "run_real_case",
    "run_real",
    "real_table",
]

#: name -> (n-m-l, samples, batch size or None for full batch, iterations per method)
REAL_WORKLOADS: dict[str, tuple[tuple[int, int, int], int, int | None, int]] = {
    "compute": ((203, 1024, 26), 32768, None, 12),
    "minibatch": ((203, 1024, 26), 32768, 1024, 150),
    "paper": ((203, 80, 26), 1024, None, 300),
}
REAL_METHODS = ("drpm", "srpm", "srpm-time", "split-1d", "uniform", "ddp")
#: learning rate per sample: small enough that every method trains the same stable trajectory
_LR = 1e-6


def real_data(shape: tuple[int, int, int], samples: int) -> tuple[np.ndarray, np.ndarray]:
    """Inputs (the last a constant 1) and targets of a REAL workload: seeded, well conditioned at
    the bench's small learning rate."""
    n, _, l = shape
    rng = np.random.default_rng(1)
    x = rng.normal(size=(samples, n))
    x[:, -1] = 1.0
    return x, rng.uniform(0.1, 0.9, size=(samples, l))


def real_cluster(threads: Sequence[int]) -> SpecCluster:
    """A local cluster of nanny workers, worker ``i`` with ``threads[i]`` threads, no emulation.

    Worker names ``r<i>-t<threads>`` sort in the given order (:func:`dask_rpm.ordered_workers`).
    """
    if not threads or any(int(t) < 1 for t in threads):
        raise BenchError(
            f"threads per worker {list(threads)}: give whole numbers >= 1, e.g. 1,2,4,8"
        )
    width = len(str(len(threads) - 1))
    workers = {
        f"r{i:0{width}d}-t{int(t)}": {
            "cls": Nanny,
            "options": {"nthreads": int(t), "host": "127.0.0.1", "silence_logs": logging.ERROR},
        }
        for i, t in enumerate(threads)
    }
    scheduler = {"cls": Scheduler, "options": {"dashboard_address": ":0", "host": "127.0.0.1"}}
    return SpecCluster(workers=workers, scheduler=scheduler, silence_logs=logging.ERROR)


def _alone_on_worker(
    x: np.ndarray, d: np.ndarray, hidden: int, iterations: int, batch: int | None
) -> float:
    """fit_serial's seconds per iteration here, on this worker's threads (runs on the worker)."""
    from distributed import get_worker  # runs on a worker

    worker = get_worker()
    with worker_threads(worker, worker.state.nthreads):
        kw: dict[str, Any] = dict(hidden=hidden, learning_rate=_LR, batch_size=batch)
        fit_serial(x, d, iterations=2, **kw)  # warm: BLAS buffers, caches
        t0 = time.perf_counter()
        fit_serial(x, d, iterations=iterations, **kw)
        return (time.perf_counter() - t0) / iterations


def _steady(times: Any) -> float:
    """The median iteration time after the first third (warm-up, DRPM's first remap)."""
    t = np.asarray(times, dtype=float)
    return steady_seconds(t, len(t) // 3)


def _method(
    client: Client,
    method: str,
    x: np.ndarray,
    d: np.ndarray,
    hidden: int,
    batch: int | None,
    it: int,
) -> dict[str, Any]:
    kw: dict[str, Any] = dict(
        hidden=hidden,
        learning_rate=_LR,
        batch_size=batch,
        client=client,
        progress="none",
        elastic=False,
    )
    if method == "drpm":
        kw.update(mapping="drpm", interval=max(it // 6, 6))
    elif method == "uniform":
        kw.update(mapping="uniform")
    else:
        kw.update(mapping=method, abilities="probe")
    fit(x, d, iterations=3, **({**kw, "interval": 3} if method == "drpm" else kw))  # warm
    t0 = time.perf_counter()
    res = fit(x, d, iterations=it, **kw)
    return {
        "seconds": _steady(res.history["iteration_time"].values),
        "wall": time.perf_counter() - t0,
        "workers_used": len(res.plan.planned_workers),
        "columns": res.plan.n_columns,
        "remaps": len(res.remaps),
        "threads": sorted(res.stats["threads"].values()),
    }


def run_real_case(
    client: Client,
    threads: Sequence[int],
    workload: str,
    methods: Sequence[str] = REAL_METHODS,
    iterations: int | None = None,
    log: Any = print,
) -> dict[str, Any]:
    """Every method of one workload on the workers of ``client`` (REAL; see the module doc)."""
    if workload not in REAL_WORKLOADS:
        raise BenchError(f"workload {workload!r}: choose from {', '.join(REAL_WORKLOADS)}")
    shape, samples, batch, default_it = REAL_WORKLOADS[workload]
    it = int(iterations or default_it)
    x, d = real_data(shape, samples)
    addresses = ordered_workers(client.scheduler_info())
    series_it = max(it // 6, 2)
    # one worker per distinct thread count: equal workers are equal cores of one machine (on
    # 16 workers, timing each alone would take longer than the methods)
    by_threads: dict[int, float] = {}
    for a, t in zip(addresses, threads):
        if int(t) not in by_threads:
            xf, df = client.scatter([x, d], workers=[a], broadcast=False)
            fut = client.submit(
                _alone_on_worker, xf, df, shape[1], series_it, batch, workers=[a], pure=False
            )
            by_threads[int(t)] = float(fut.result())
            del xf, df, fut
    alone = [by_threads[int(t)] for t in threads]
    row: dict[str, Any] = {
        "label": "REAL",
        "workload": workload,
        "shape": "-".join(map(str, shape)),
        "samples": samples,
        "batch": batch,
        "threads": list(map(int, threads)),
        "alone": alone,
        "methods": {},
    }
    log(f"[REAL] {workload} threads={list(threads)}: alone {[f'{a * 1e3:.2f}' for a in alone]} ms")
    for method in methods:
        if method == "ddp":
            ok, why = torch_available()
            if not ok:
                row["methods"]["ddp"] = {"skipped": why}
                continue
            res = run_ddp(
                x,
                d,
                hidden=shape[1],
                speeds=[1.0] * len(threads),
                scale=1.0,
                iterations=it,
                learning_rate=_LR,
                batch_size=batch,
                threads=threads,
                paced=False,
            )
            out = {"seconds": _steady(res["times"])}
        else:
            out = _method(client, method, x, d, shape[1], batch, it)
        out["gamma"] = gamma(out["seconds"], alone)
        row["methods"][method] = out
        log(f"[REAL]   {method:9s} {out['seconds'] * 1e3:9.2f} ms  gamma {out['gamma']:.2f}")
    return row


def run_real(
    cases: Sequence[Sequence[int]],
    workloads: Sequence[str],
    methods: Sequence[str] = REAL_METHODS,
    iterations: int | None = None,
    log: Any = print,
    rows: list[dict[str, Any]] | None = None,
    on_row: Any = None,
) -> list[dict[str, Any]]:
    """:func:`run_real_case` for every workload on a fresh :func:`real_cluster` per case (threads
    per worker). Each finished row is appended to ``rows`` (a new list by default) and handed to
    ``on_row`` at once, so a run cut short keeps what it finished."""
    rows = [] if rows is None else rows
    for threads in cases:
        with real_cluster(threads) as cluster, Client(cluster) as client:
            for w in workloads:
                rows.append(run_real_case(client, threads, w, methods, iterations, log=log))
                if on_row is not None:
                    on_row(rows[-1])
    return rows


def real_table(rows: Sequence[dict[str, Any]]) -> str:
    """The rows as one Markdown table: ms per iteration, gamma, and dask_rpm's best against DDP."""
    lines = [
        "| REAL | workload | threads per worker | fastest alone | "
        + " | ".join(REAL_METHODS)
        + " | DDP / best dask_rpm |",
        "|---|---|---|---|" + "---|" * len(REAL_METHODS) + "---|",
    ]
    for r in rows:
        cells = []
        for m in REAL_METHODS:
            v = r["methods"].get(m)
            if v is None or "seconds" not in v:
                cells.append("-")
                continue
            extra = (
                f" ({v['workers_used']} used)"
                if v.get("workers_used", len(r["threads"])) < len(r["threads"])
                else ""
            )
            cells.append(f"{v['seconds'] * 1e3:.2f} ms, γ {v['gamma']:.2f}{extra}")
        ours = [v["seconds"] for m, v in r["methods"].items() if m != "ddp" and "seconds" in v]
        ddp = r["methods"].get("ddp", {}).get("seconds")
        ratio = f"{ddp / min(ours):.2f}x" if ours and ddp else "-"
        lines.append(
            f"| REAL | {r['workload']} | {','.join(map(str, r['threads']))} | "
            f"{min(r['alone']) * 1e3:.2f} ms | " + " | ".join(cells) + f" | {ratio} |"
        )
    return "\n".join(lines)
