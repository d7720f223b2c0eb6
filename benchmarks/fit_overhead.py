"""REAL: a whole ``fit`` call against PyTorch DDP, per iteration, before and after issue 33.

Two workloads on 2 one-thread workers (a LocalCluster of 2 worker processes, unpaced: this
machine's cores):

* ``deep``: 784-256-128-10, ReLU, softmax and cross-entropy, Adam (lr 1e-3, the gradient's mean),
  mini-batches of 512 of 20,000 synthetic MNIST-sized images, float64, 240 iterations;
* ``paper``: 203-80-26, sigmoid and squared error, SGD, 1024 samples, full batch, 300 iterations.

``fit`` runs with the default mapping (``rpm.train.mapping``: DRPM) on a running cluster; its
figure is the whole call's wall time over its iterations, after one warm-up call of the same
arrays, data sent included. Each call is also cut into its parts (prepare, plan, setup, place:
the shards and samples sent, blocks, gather, close, history), timed from outside by wrapping the
engine's steps, so that an older tree is cut the same way. DDP runs its loop on 2 one-thread
gloo ranks over the same iterations (process group up, 20 warm-up steps first): the deep
workload with torch's own layers (``Linear`` + ReLU, ``CrossEntropyLoss``, ``Adam``), each rank
half of each batch; the paper's with :func:`dask_rpm.bench.ddp.run_ddp` (unpaced).

"Before" is another tree of the package (``--before DIR``: e.g. ``git worktree add
/tmp/wt-before <commit>``), imported through ``PYTHONPATH`` in a child process, as "after" is
this tree; every arm runs in its own child (its own cluster or ranks), the arms interleaved in
rotating order, ``--rounds`` times; the medians are the figures.

Usage::

    git worktree add /tmp/wt-before 7166cd3
    python benchmarks/fit_overhead.py --before /tmp/wt-before           # about 6 min on 2 cores
    python benchmarks/fit_overhead.py --before /tmp/wt-before --rounds 3 --json out.json
    git worktree add /tmp/wt-after HEAD                                 # after: a clean tree too
    python benchmarks/fit_overhead.py --before /tmp/wt-before --after /tmp/wt-after
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import time
from typing import Any

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
TREE = os.path.dirname(HERE)
WORKLOADS: dict[str, dict[str, Any]] = {
    "deep": {"samples": 20000, "iterations": 240},
    "paper": {"samples": 1024, "iterations": 300},
}
PARTS = ("prepare", "plan", "setup", "place", "blocks", "gather", "close", "history")


def deep_data(samples: int) -> tuple[np.ndarray, np.ndarray]:
    """Synthetic MNIST-sized images (784 inputs in [0, 1)) and 10 class labels, seeded."""
    rng = np.random.default_rng(0)
    return rng.random((samples, 784)), rng.integers(0, 10, size=samples)


def paper_data(samples: int) -> tuple[np.ndarray, np.ndarray]:
    """The paper's size: 203 inputs (the last a constant 1) and 26 targets in (0.1, 0.9)."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=(samples, 203))
    x[:, -1] = 1.0
    return x, rng.uniform(0.1, 0.9, size=(samples, 26))


def _fit_kwargs(workload: str) -> dict[str, Any]:
    if workload == "deep":
        return dict(
            hidden=(256, 128),
            activation="relu",
            loss="cross-entropy",
            optimizer="adam",
            learning_rate=1e-3,
            reduction="mean",
            batch_size=512,
        )
    return dict(hidden=80, learning_rate=1e-6)


# ------------------------------------------------------------------------------ dask_rpm child
class _Parts:
    """Seconds of each part of a ``fit`` call, from wrappers around the engine's steps."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def wrap(self, owner: Any, name: str, part: str) -> None:
        fn = getattr(owner, name)
        parts = self.seconds

        async def timed_async(*a: Any, **k: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return await fn(*a, **k)
            finally:
                parts[part] = parts.get(part, 0.0) + time.perf_counter() - t0

        def timed(*a: Any, **k: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                parts[part] = parts.get(part, 0.0) + time.perf_counter() - t0

        import inspect

        setattr(owner, name, timed_async if inspect.iscoroutinefunction(fn) else timed)


def _dask_child(workload: str, reps: int) -> dict[str, Any]:
    """One arm: a 2-worker cluster, a warm-up call, ``reps`` timed calls of ``fit``."""
    import importlib

    from distributed import Client, LocalCluster

    import dask_rpm
    from dask_rpm.engine.loop import TrainingLoop

    fit_module = importlib.import_module("dask_rpm.engine.fit")

    parts = _Parts()
    parts.wrap(fit_module, "prepare", "prepare")
    parts.wrap(fit_module, "first_plan", "plan")
    parts.wrap(TrainingLoop, "install", "place")
    parts.wrap(TrainingLoop, "run", "blocks")
    parts.wrap(TrainingLoop, "final_weights", "gather")
    parts.wrap(fit_module.Driver, "close", "close")
    parts.wrap(fit_module, "_history", "history")
    spec = WORKLOADS[workload]
    x, d = (deep_data if workload == "deep" else paper_data)(spec["samples"])
    kw = _fit_kwargs(workload)
    out: dict[str, Any] = {"calls": [], "parts": [], "plans": []}
    with (
        LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            dashboard_address=":0",
            silence_logs=logging.ERROR,
        ) as cluster,
        Client(cluster) as client,
    ):
        fit_module.fit(x, d, iterations=spec["iterations"], client=client, progress="none", **kw)
        for _ in range(reps):
            parts.seconds.clear()
            t0 = time.perf_counter()
            r = fit_module.fit(
                x, d, iterations=spec["iterations"], client=client, progress="none", **kw
            )
            total = time.perf_counter() - t0
            its = int(r.history.sizes["iteration"])
            known = sum(parts.seconds.values())
            out["calls"].append(total / its)
            out["parts"].append({**parts.seconds, "setup": total - known, "total": total})
            out["plans"].append(
                f"{len(r.plan.planned_workers)} worker(s) in {r.plan.n_columns} column(s)"
            )
            out["iteration_median"] = float(np.nanmedian(r.history["iteration_time"].values))
    out["version"] = dask_rpm.__version__
    return out


# ------------------------------------------------------------------------------ DDP children
def _deep_rank(rank: int, world: int, port: int, iterations: int, queue: Any) -> None:
    """One gloo rank of the deep workload: torch's layers, cross-entropy, Adam, 1 thread."""
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = "1"
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    try:
        spec = WORKLOADS["deep"]
        x_np, y_np = deep_data(spec["samples"])
        x, y = torch.from_numpy(x_np), torch.from_numpy(y_np)
        torch.manual_seed(0)
        net = torch.nn.Sequential(
            torch.nn.Linear(784, 256),
            torch.nn.ReLU(),
            torch.nn.Linear(256, 128),
            torch.nn.ReLU(),
            torch.nn.Linear(128, 10),
        ).double()
        model = DDP(net)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        loss_fn = torch.nn.CrossEntropyLoss()
        batch, samples = 512, spec["samples"]
        gen = torch.Generator().manual_seed(0)
        order = torch.randperm(samples, generator=gen)
        per_epoch = -(-samples // batch)

        def step(it: int) -> None:
            nonlocal order
            b = it % per_epoch
            if b == 0 and it:
                order = torch.randperm(samples, generator=gen)
            rows = order[b * batch : (b + 1) * batch]
            half = -(-len(rows) // world)
            mine = rows[rank * half : (rank + 1) * half]
            opt.zero_grad(set_to_none=True)
            loss_fn(model(x[mine]), y[mine]).backward()
            opt.step()

        for it in range(20):  # warm-up
            step(it)
        dist.barrier()
        t0 = time.perf_counter()
        for it in range(iterations):
            step(20 + it)
        dist.barrier()
        if rank == 0:
            queue.put((time.perf_counter() - t0) / iterations)
    finally:
        dist.destroy_process_group()


def _ddp_child(workload: str, reps: int) -> dict[str, Any]:
    import multiprocessing as mp
    import socket

    spec = WORKLOADS[workload]
    out: dict[str, Any] = {"calls": []}
    for _ in range(reps):
        if workload == "deep":
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = int(s.getsockname()[1])
            ctx = mp.get_context("spawn")
            queue = ctx.Queue()
            procs = [
                ctx.Process(target=_deep_rank, args=(r, 2, port, spec["iterations"], queue))
                for r in range(2)
            ]
            for p in procs:
                p.start()
            out["calls"].append(float(queue.get(timeout=600)))
            for p in procs:
                p.join(timeout=60)
        else:
            from dask_rpm.bench.ddp import run_ddp

            x, d = paper_data(spec["samples"])
            res = run_ddp(
                x,
                d,
                hidden=80,
                speeds=[1.0, 1.0],
                scale=1.0,
                iterations=spec["iterations"] + 20,
                learning_rate=1e-6,
                batch_size=None,
                paced=False,
                threads=[1, 1],
            )
            out["calls"].append(
                float(np.mean(res["times"][20:]))
            )  # the loop after 20 warm-up steps
    return out


# ------------------------------------------------------------------------------ parent
def _child(arm: str, tree: str, workload: str, reps: int) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=tree, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    cmd = [sys.executable, os.path.abspath(__file__), "--child", arm, workload, str(reps)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{arm} ({tree}) failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _ms(v: float) -> str:
    return f"{1e3 * v:.2f}"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", help="a tree of the package before (git worktree add ...)")
    ap.add_argument("--after", default=TREE, help="the tree after (default: this one)")
    ap.add_argument("--rounds", type=int, default=4, help="interleaved rounds (default 4)")
    ap.add_argument("--reps", type=int, default=2, help="timed calls per child (default 2)")
    ap.add_argument("--workloads", default="deep,paper")
    ap.add_argument("--json", help="write every measurement here")
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        arm, workload, reps = args.child
        run = _dask_child if arm == "dask" else _ddp_child
        print(json.dumps(run(workload, int(reps))))
        return
    arms = [("after", "dask", os.path.abspath(args.after)), ("ddp", "ddp", TREE)]
    if args.before:
        arms.insert(0, ("before", "dask", os.path.abspath(args.before)))
    results: dict[str, dict[str, list[Any]]] = {}
    for workload in args.workloads.split(","):
        got: dict[str, list[Any]] = {name: [] for name, _, _ in arms}
        results[workload] = got
        for r in range(args.rounds):
            turn = arms[r % len(arms) :] + arms[: r % len(arms)]  # rotating order
            for name, kind, tree in turn:
                res = _child(kind, tree, workload, args.reps)
                got[name].append(res)
                print(
                    f"{workload} round {r}: {name:6s} "
                    + " ".join(_ms(c) for c in res["calls"])
                    + " ms/iteration"
                    + (f"  [{res['plans'][-1]}]" if "plans" in res else ""),
                    flush=True,
                )
    print()
    print("REAL, 2 one-thread workers / ranks; ms per iteration, whole call (medians):")
    for workload, got in results.items():
        med = {n: statistics.median(c for res in v for c in res["calls"]) for n, v in got.items()}
        line = f"{workload}: " + ", ".join(f"{n} {_ms(m)}" for n, m in med.items())
        line += "".join(f"; {n} / ddp {med[n] / med['ddp']:.2f}x" for n in med if n != "ddp")
        print(line)
        for n, v in got.items():
            if not v or "parts" not in v[0]:
                continue
            parts = [p for res in v for p in res["parts"]]
            print(
                f"  {n} parts, ms per call: "
                + ", ".join(
                    f"{k} {_ms(statistics.median(p.get(k, 0.0) for p in parts))}"
                    for k in (*PARTS, "total")
                )
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
