"""REAL: a network whose weights and Adam state exceed one worker's memory limit trains on eight.

Each worker of a dask_rpm run holds only its rows of every layer and their optimizer state
(the rectangle model shards the model); a data-parallel peer (PyTorch DDP) holds all weights,
gradients and Adam moments on every worker. This script starts a local cluster of eight
worker processes with ``--memory-limit`` set below what the weights and Adam state of the
network need together, trains the network for a few Adam steps with ``dask_rpm.fit``, checks
the result against ``fit_serial`` (float64, relative 1e-10), and reports what each worker
held (``FitResult.stats["memory"]``) and its peak resident memory next to the limit and
next to what one replica needs.

Run::

    python benchmarks/deep_memory.py            # about 2 minutes on a 2-core machine

The figures are REAL (unpaced worker processes on this machine's cores).
"""

from __future__ import annotations

import argparse
import logging
import resource
import time

import numpy as np
from distributed import Client, LocalCluster

import dask_rpm
from dask_rpm.nn.layers import Layers

MiB = 2**20


def peak_rss() -> int:
    """This process's peak resident memory, bytes (Linux reports KiB)."""
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--limit-mib", type=int, default=640, help="each worker's memory limit")
    ap.add_argument("--hidden", default="4096,4096,2048")
    ap.add_argument("--inputs", type=int, default=1024)
    ap.add_argument("--samples", type=int, default=128)
    ap.add_argument("--iterations", type=int, default=3)
    args = ap.parse_args()
    hidden = tuple(int(v) for v in args.hidden.split(","))
    rng = np.random.default_rng(0)
    x = rng.normal(size=(args.samples, args.inputs))
    y = rng.integers(0, 10, args.samples)
    layers = Layers(args.inputs + 1, tuple(m + 1 for m in hidden), 10)  # with bias terms
    weights = layers.nbytes((0, layers.m), 8)
    replica = 3 * weights  # weights and Adam's two moments, before any gradient or activation
    limit = args.limit_mib * MiB
    print(
        f"network {args.inputs}-{'-'.join(map(str, hidden))}-10 with biases: "
        f"{weights / MiB:.0f} MiB of float64 weights; with Adam's two moments "
        f"{replica / MiB:.0f} MiB: more than one worker's memory limit of {args.limit_mib} MiB"
    )
    kw = dict(
        hidden=hidden,
        loss="cross-entropy",
        bias=True,
        optimizer="adam",
        iterations=args.iterations,
        learning_rate=1e-4,
        seed=0,
    )
    with (
        LocalCluster(
            n_workers=args.workers,
            threads_per_worker=1,
            memory_limit=f"{args.limit_mib}MiB",
            dashboard_address=":0",
            # the shards are unmanaged memory to Dask: its "unmanaged memory is high" warnings
            # say what this script shows on purpose
            silence_logs=logging.ERROR,
        ) as cluster,
        Client(cluster) as client,
    ):
        t0 = time.perf_counter()
        res = dask_rpm.fit(x, y, client=client, mapping="uniform", progress=False, **kw)
        seconds = time.perf_counter() - t0
        rss = client.run(peak_rss)
        nannies_alive = len(client.scheduler_info()["workers"])
    print(
        f"dask_rpm.fit on {args.workers} workers: {args.iterations} Adam steps in {seconds:.1f} s; plan {res.plan!r}"
    )
    print(
        f"  {nannies_alive} of {args.workers} workers alive at the end (a worker past its limit is restarted)"
    )
    for addr in res.plan.workers:
        held = res.stats["memory"].get(addr)
        if held is not None:
            print(
                f"  {addr}: holds {held / MiB:6.1f} MiB of weights and Adam state "
                f"(with its spare copies and update buffers about {held * 11 / 3 / MiB:6.1f} MiB); "
                f"peak RSS {rss[addr] / MiB:6.1f} MiB of the {args.limit_mib} MiB limit"
            )
    assert max(rss.values()) < limit, "a worker went past its memory limit"
    assert nannies_alive == args.workers
    serial = dask_rpm.fit_serial(x, y, **kw)
    worst = max(
        float(np.max(np.abs(a - b)) / np.max(np.abs(b))) for a, b in zip(res.params, serial.params)
    )
    print(f"equal to fit_serial: largest relative difference {worst:.1e}")
    assert worst <= 1e-10
    print(
        f"a data-parallel replica needs {replica / MiB:.0f} MiB for weights and Adam state alone "
        f"(PyTorch DDP adds the gradients: {(replica + weights) / MiB:.0f} MiB), "
        f"{(replica + weights) / limit:.1f}x a worker's {args.limit_mib} MiB"
    )


if __name__ == "__main__":
    main()
