"""REAL: a LeNet-size CNN at mini-batch 256 on this machine's cores - dask_rpm against PyTorch.

What issue 32's speed goals compare, side by side in one run (runs interleaved, repeated; the
best of the repeats is reported, as this machine is shared and noisy):

* ``torch-1``: a plain PyTorch loop, one process, one thread (``torch.optim.SGD``);
* ``rpm-1``: ``dask_rpm.fit`` on one one-thread worker (a real ``LocalCluster`` of nanny
  processes), the backend ``auto`` picks (numpy arrays, torch's ``conv2d`` kernels);
* ``ddp-2``: PyTorch DistributedDataParallel, 2 one-thread gloo ranks, each half of every batch;
* ``rpm-2``: ``dask_rpm.fit`` on two one-thread workers, the default mapping.

Per iteration is the whole call's wall time over its iterations (data sent included, after one
warm-up call on the same cluster), and for dask_rpm also the engine's median iteration
(``seconds_per_iteration``). float32 and float64. Every figure is REAL (unpaced cores).

Run: ``python3 benchmarks/cnn_real.py [--iterations 40] [--repeats 3] [--json out.json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time

import numpy as np

B = 256
IMAGE = (1, 28, 28)


def lenet(torch):  # noqa: ANN001 - torch passed in: imported late in the rank processes
    tnn = torch.nn
    torch.manual_seed(0)
    return tnn.Sequential(
        tnn.Conv2d(1, 6, 5, padding=2),
        tnn.ReLU(),
        tnn.MaxPool2d(2),
        tnn.Conv2d(6, 16, 5),
        tnn.ReLU(),
        tnn.MaxPool2d(2),
        tnn.Flatten(),
        tnn.Linear(400, 120),
        tnn.ReLU(),
        tnn.Linear(120, 84),
        tnn.ReLU(),
        tnn.Linear(84, 10),
    )


def data(iterations: int, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(B * iterations, *IMAGE)).astype(dtype)
    return x, rng.integers(0, 10, size=B * iterations)


def torch_loop(iterations: int, dtype: str) -> float:
    import torch

    torch.set_num_threads(1)
    x, y = data(iterations, dtype)
    model = lenet(torch).to(getattr(torch, dtype))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    X, Y = torch.from_numpy(x), torch.from_numpy(y)
    t0 = time.perf_counter()
    for k in range(iterations):
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(
            model(X[k * B : (k + 1) * B]), Y[k * B : (k + 1) * B]
        )
        loss.backward()
        opt.step()
    return (time.perf_counter() - t0) / iterations


def _ddp_rank(rank: int, world: int, port: int, iterations: int, dtype: str, out: str) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    x, y = data(iterations, dtype)
    model = DDP(lenet(torch).to(getattr(torch, dtype)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    X, Y = torch.from_numpy(x), torch.from_numpy(y)
    half = B // world
    dist.barrier()
    t0 = time.perf_counter()
    for k in range(iterations):
        lo = k * B + rank * half
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(X[lo : lo + half]), Y[lo : lo + half])
        loss.backward()
        opt.step()
    dist.barrier()
    seconds = (time.perf_counter() - t0) / iterations
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"seconds": seconds}, f)
    dist.destroy_process_group()


def ddp(iterations: int, dtype: str) -> float:
    import tempfile

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "ddp.json")
        mp.spawn(_ddp_rank, args=(2, port, iterations, dtype, out), nprocs=2, join=True)
        with open(out) as f:
            return float(json.load(f)["seconds"])


def rpm(client, iterations: int, dtype: str) -> tuple[float, float]:  # noqa: ANN001
    import torch

    import dask_rpm

    x, y = data(iterations, dtype)
    kw = dict(
        network=lenet(torch).to(getattr(torch, dtype)),
        loss="cross-entropy",
        reduction="mean",
        optimizer="sgd",
        learning_rate=0.01,
        batch_size=B,
        shuffle=False,
        dtype=dtype,
        client=client,
        progress="none",
    )
    dask_rpm.fit(x[: 4 * B], y[: 4 * B], iterations=4, **kw)  # warm: the cluster, the kernels
    t0 = time.perf_counter()
    r = dask_rpm.fit(x, y, iterations=iterations, **kw)
    return (time.perf_counter() - t0) / iterations, r.seconds_per_iteration


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dtypes", default="float32,float64")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    from distributed import Client

    from dask_rpm.bench.real import real_cluster

    rows = []
    for dtype in args.dtypes.split(","):
        best: dict[str, float] = {}
        with (
            real_cluster([1]) as c1,
            Client(c1) as client1,
            real_cluster([1, 1]) as c2,
            Client(c2) as client2,
        ):
            for rep in range(args.repeats):
                runs = {
                    "torch-1": lambda dtype=dtype: torch_loop(args.iterations, dtype),
                    "rpm-1": lambda dtype=dtype: rpm(client1, args.iterations, dtype),
                    "ddp-2": lambda dtype=dtype: ddp(args.iterations, dtype),
                    "rpm-2": lambda dtype=dtype: rpm(client2, args.iterations, dtype),
                }
                for name, run in runs.items():
                    got = run()
                    call, engine = got if isinstance(got, tuple) else (got, float("nan"))
                    best[name] = min(best.get(name, np.inf), call)
                    if not np.isnan(engine):
                        best[name + " (engine)"] = min(best.get(name + " (engine)", np.inf), engine)
                    print(f"{dtype} rep {rep} {name}: {call * 1e3:.1f} ms/iteration", flush=True)
        row = {"dtype": dtype, **{k: v * 1e3 for k, v in best.items()}}
        row["rpm-1 / torch-1"] = best["rpm-1"] / best["torch-1"]
        row["rpm-2 / ddp-2"] = best["rpm-2"] / best["ddp-2"]
        rows.append(row)
    print("\nREAL, ms per iteration (best of the repeats), LeNet-5 on 1x28x28, batch 256, SGD")
    for row in rows:
        print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
