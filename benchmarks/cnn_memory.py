"""REAL: a CNN whose weights and Adam state exceed one worker's memory limit, on one column of workers.

Issue 32's goal: "memory follows the rectangle: a CNN whose weights and Adam state exceed one
worker's ``memory_limit`` trains on 4 workers", as ``benchmarks/deep_memory.py`` shows for MLPs.

The CNN: 3x32x32 inputs, conv 3->16 and conv 16->32 (k3 p1, ReLU, max-pool 2), flatten, fc1
linear 2048->``--hidden`` (40960; ReLU) and the output layer ->10; fc1 and the output layer hold 99.9 %
of the weights. float64, cross-entropy, Adam, ``--samples`` images, full batch. One column of
``--workers`` unpaced worker processes (a ``LocalCluster`` with ``memory_limit`` = ``--limit-mib``
each; 0: no limit, to measure what a worker needs) splits every stage's channels in equal parts,
so each worker holds 1/k of every weight and of its Adam moments. After ``--iterations`` Adam
steps the script prints what each worker held (``FitResult.stats["memory"]``) and its peak
resident memory next to the limit and to one replica's weights and Adam state, checks the weights
against ``fit_serial`` (float64, relative 1e-10), and says whether the goal holds: the limit is
below one replica's weights + Adam state, and every worker stayed under it.

Run::

    python3 benchmarks/cnn_memory.py                                   # 8 workers, about 1-2 min
    python3 benchmarks/cnn_memory.py --workers 4 --limit-mib 0         # what 4 workers need

Every figure is REAL (unpaced worker processes on this machine's cores). Torch is imported only
in the client (to build the module); the workers train with ``backend="numpy"``.
"""

from __future__ import annotations

import argparse
import logging
import resource
import time
from typing import Any

import numpy as np

MiB = 2**20
IMAGE = (3, 32, 32)
CLASSES = 10


def peak_rss() -> int:
    """This process's peak resident memory, bytes (Linux reports KiB)."""
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def current_rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def network(hidden: int) -> Any:
    import torch  # here, not at the top: the worker processes need not import torch

    tnn = torch.nn
    torch.manual_seed(0)
    return tnn.Sequential(
        tnn.Conv2d(3, 16, 3, padding=1),
        tnn.ReLU(),
        tnn.MaxPool2d(2),
        tnn.Conv2d(16, 32, 3, padding=1),
        tnn.ReLU(),
        tnn.MaxPool2d(2),
        tnn.Flatten(),
        tnn.Linear(32 * 8 * 8, hidden),
        tnn.ReLU(),
        tnn.Linear(hidden, CLASSES),
    ).double()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=40960, help="fc1's units")
    ap.add_argument(
        "--limit-mib", type=int, default=1800, help="each worker's memory limit (0: none)"
    )
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--iterations", type=int, default=3)
    args = ap.parse_args()

    from distributed import Client, LocalCluster

    import dask_rpm
    from dask_rpm.nn.cnn_records import conv_layers
    from dask_rpm.plan.partition import Plan

    rng = np.random.default_rng(0)
    x = rng.normal(size=(args.samples, *IMAGE))
    y = rng.permutation(np.arange(args.samples) % CLASSES)
    net = network(args.hidden)
    layers = conv_layers(net, IMAGE, CLASSES)
    weights = sum(int(np.prod(s)) for s in layers.full_shapes()) * 8
    replica = 3 * weights  # weights and Adam's two moments
    limit = args.limit_mib * MiB
    k = args.workers
    print(f"# REAL, {k} unpaced worker processes of one thread on this machine")
    print(f"# network: {' | '.join(layers.describe())}")
    print(
        f"# {weights / MiB:.0f} MiB of float64 weights; with Adam's two moments "
        f"{replica / MiB:.0f} MiB (one replica); PyTorch DDP adds the gradients: "
        f"{4 * weights / MiB:.0f} MiB; each worker's memory limit: "
        f"{f'{args.limit_mib} MiB ({limit / replica:.2f}x a replica)' if limit else 'none'}"
    )
    m = layers.m
    plan = Plan.from_columns(
        [list(range(k))],
        [args.samples],
        [[m // k + (1 if i < m % k else 0) for i in range(k)]],
        shape=layers.plan_shape,
    )
    kw: dict[str, Any] = dict(
        loss="cross-entropy",
        optimizer="adam",
        iterations=args.iterations,
        learning_rate=1e-4,
        seed=0,
    )
    with (
        LocalCluster(
            n_workers=k,
            threads_per_worker=1,
            memory_limit=f"{args.limit_mib}MiB" if limit else 0,
            dashboard_address=":0",
            # the shards are unmanaged memory to Dask: its "unmanaged memory is high" warnings
            # say what this script shows on purpose
            silence_logs=logging.ERROR,
        ) as cluster,
        Client(cluster) as client,
    ):
        base = client.run(current_rss)
        t0 = time.perf_counter()
        res = dask_rpm.fit(
            x,
            y,
            network=net,
            mapping=plan,
            client=client,
            progress="none",
            backend="numpy",
            **kw,
        )
        seconds = time.perf_counter() - t0
        rss = client.run(peak_rss)
        alive = len(client.scheduler_info()["workers"])
    print(f"dask_rpm.fit: {args.iterations} Adam steps in {seconds:.1f} s; plan {res.plan!r}")
    print(f"{alive} of {k} workers alive at the end (a worker past its limit is restarted)")
    print(
        "| worker | holds (stats['memory']) | RSS before fit | peak RSS | peak - before | limit |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    ratios = []
    for addr in res.plan.workers:
        held = res.stats["memory"].get(addr)
        if held is None:
            continue
        ratios.append((rss[addr] - base[addr]) / held)
        print(
            f"| {addr} | {held / MiB:.1f} MiB | {base[addr] / MiB:.0f} MiB | "
            f"{rss[addr] / MiB:.0f} MiB | {(rss[addr] - base[addr]) / MiB:.0f} MiB "
            f"({ratios[-1]:.1f}x held) | {f'{args.limit_mib} MiB' if limit else 'none'} |"
        )
    serial = dask_rpm.fit_serial(x, y, network=network(args.hidden), **kw)
    worst = max(
        float(np.max(np.abs(np.asarray(a) - b)) / np.max(np.abs(b)))
        for a, b in zip(res.params, serial.params)
    )
    print(f"equal to fit_serial: largest relative difference {worst:.1e}")
    top = max(rss.values())
    if limit:
        ok = top < limit and alive == k and limit < replica and worst <= 1e-10
        print(
            f"# goal (limit below one replica's weights + Adam, every worker under it, exact): "
            f"{'met' if ok else 'NOT met'}: limit {args.limit_mib} MiB vs replica "
            f"{replica / MiB:.0f} MiB; highest peak {top / MiB:.0f} MiB"
        )
    else:
        print(
            f"# no limit: highest worker peak {top / MiB:.0f} MiB against one replica's weights + Adam "
            f"{replica / MiB:.0f} MiB ({top / replica:.2f}x): a limit below the replica "
            f"{'can' if top < replica else 'cannot'} hold these workers"
        )
    assert worst <= 1e-10
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
