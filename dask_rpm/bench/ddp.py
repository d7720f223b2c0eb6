"""The PyTorch DistributedDataParallel peer of ``dask-rpm bench``: the same MLP, plain DDP.

:func:`run_ddp` trains the network dask_rpm trains (one hidden layer or several: stacked
bias-free ``Linear`` layers, each followed by a sigmoid), on the same mini-batches,
with one gloo process per EMULATED speed on this machine (CPU, one thread
each), every rank taking an equal share of each batch. Each rank's forward +
backward is paced like a Dask worker's kernel block, so both systems run at the
same EMULATED speeds whatever their kernels cost. torch is an optional
dependency (``pip install '.[bench]'``): it is imported only inside the rank
processes and :func:`torch_available`.
"""

from __future__ import annotations

import json
import math
import multiprocessing as mp
import os
import queue as queue_mod
import socket
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import config
from ..nn.batches import BatchSchedule, schedule
from ..nn.kernels import init_params, rectangle_work
from ..nn.layers import Layers, layers_of
from ..nn.options import TrainingOptions
from .profiles import STEP_FACTOR, BenchCase, BenchError, steady_seconds
from .report import MethodResult

__all__ = ["torch_available", "run_ddp", "run_ddp_method"]


def torch_available() -> tuple[bool, str]:
    """Whether the DDP peer can run; the reason when it cannot."""
    try:  # torch is optional and heavy: imported only when the peer is asked for
        import torch
        import torch.distributed as dist
    except ImportError:
        return False, "torch is not installed (pip install '.[bench]' adds torch==2.13.0)"
    if not dist.is_available() or not dist.is_gloo_available():
        return False, f"torch {torch.__version__} has no gloo backend for torch.distributed"
    return True, ""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _RankRows:
    """This rank's rows of every mini-batch, in dask_rpm's batch order.

    The mini-batches of dask_rpm's schedule (same seed, same order): this rank
    takes the share of every batch that a column with samples ``cut`` takes
    (DistributedSampler-like, equal shares), so the ranks' gradients sum to the
    batch gradient. Full batch: ``cut``. One gather per epoch (as ColumnData
    does); each iteration is then a view.
    """

    def __init__(self, cfg: dict[str, Any], rank: int) -> None:
        self.x_all = np.load(cfg["x"], mmap_mode="r")
        self.d_all = np.load(cfg["d"], mmap_mode="r")
        samples = int(self.x_all.shape[0])
        bounds = np.linspace(0, samples, cfg["world"] + 1).round().astype(int)  # equal shares
        self.cut = (int(bounds[rank]), int(bounds[rank + 1]))
        self.sched = BatchSchedule(
            samples, cfg.get("batch_size"), bool(cfg.get("shuffle", True)), int(cfg.get("seed", 0))
        )
        self.epoch: int | None = None

    def __call__(self, it: int, device: str = "cpu") -> tuple[Any, Any]:
        import torch  # the rank process's optional dependency (see the module docstring)

        # full batch: every epoch is the same rows, gathered (and moved to a GPU) once, as
        # dask_rpm's ColumnData does
        e = 0 if self.sched.full_batch else self.sched.epoch(it)
        if self.epoch != e:
            idx, self.offsets = self.sched.epoch_plan(e, self.cut)
            self.epoch, self.first = e, e * self.sched.per_epoch
            self.x = torch.from_numpy(np.ascontiguousarray(self.x_all[idx])).to(device)
            self.d = torch.from_numpy(np.ascontiguousarray(self.d_all[idx])).to(device)
        j = 0 if self.sched.full_batch else it - self.first
        lo, hi = self.offsets[j], self.offsets[j + 1]
        return self.x[lo:hi], self.d[lo:hi]


class _Pacer:
    """Pads a rank's compute to its EMULATED speed before its gradients go out.

    The same work model and kernel rate as the Dask workers' pace(): forward +
    backward of this iteration's rows of this rank x all units of every hidden layer
    (:func:`dask_rpm.nn.kernels.rectangle_work`), padded to
    ``max(cpu, work / rate) / (speed * scale)``.
    """

    def __init__(self, cfg: dict[str, Any], rank: int, layers: Layers) -> None:
        self.speed = self.base = float(cfg["speeds"][rank])
        self.scale, self.rate = float(cfg["scale"]), float(cfg["rate"])
        self.layers = layers
        self.cpu = self.wall = self.work = 0.0

    def start(self, rows: int) -> None:
        """The start of an iteration of ``rows`` samples: its work and both clocks."""
        units = self.layers.hidden
        self.work = rectangle_work("forward", rows, units, self.layers) + rectangle_work(
            "backward", rows, units, self.layers
        )
        self.cpu, self.wall = time.thread_time(), time.perf_counter()

    def wait(self) -> None:
        """Sleep until this rank's compute so far took its EMULATED time."""
        cpu = time.thread_time() - self.cpu
        target = max(cpu, self.work / self.rate) / (self.speed * self.scale)
        late = target - (time.perf_counter() - self.wall)
        if late > 0:
            time.sleep(late)


def _rank_device(cfg: dict[str, Any], rank: int) -> str:
    """Where rank ``rank`` trains: ``cpu``, or its own GPU ``cuda:<rank>``."""
    return "cpu" if cfg.get("device", "cpu") == "cpu" else f"cuda:{rank}"


def _ddp_model(cfg: dict[str, Any], device: str = "cpu") -> Any:
    """The MLP wrapped in DDP: a bias-free ``Linear`` + sigmoid per weight matrix ``W_1 .. W_L, V``
    (dask_rpm's network with ``bias=False``: the inputs carry a constant-1 column), initialised
    from ``cfg``'s parameter files, on ``device``."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    stack = []
    for path in cfg["params"]:
        w = torch.from_numpy(np.load(path))
        lin = torch.nn.Linear(int(w.shape[1]), int(w.shape[0]), bias=False, dtype=w.dtype)
        with torch.no_grad():
            lin.weight.copy_(w)
        stack += [lin, torch.nn.Sigmoid()]
    return DDP(torch.nn.Sequential(*stack).to(device))


def _weights(model: Any) -> list[np.ndarray]:
    """The final ``W_1 .. W_L, V`` of the DDP model, as numpy copies."""
    return [
        m.weight.detach().cpu().numpy().copy()
        for m in model.module
        if hasattr(m, "weight")  # the Linear layers; the sigmoids hold no weights
    ]


def _train_rank(rank: int, cfg: dict[str, Any], model: Any, pacer: _Pacer) -> dict[str, Any]:
    """The training loop of one rank; rank 0's iteration times, last loss and final weights."""
    import torch
    import torch.distributed as dist

    rows_of = _RankRows(cfg, rank)
    world, step = cfg["world"], cfg.get("step")  # step: (rank, iteration, factor)
    device = _rank_device(cfg, rank)
    opt = torch.optim.SGD(model.parameters(), lr=cfg["lr"])
    times, errors = [], []
    dist.barrier()
    last = time.perf_counter()
    for it in range(cfg["iterations"]):
        if step is not None and rank == step[0] and it >= step[1]:
            pacer.speed = pacer.base / step[2]
        x, d = rows_of(it, device)
        pacer.start(int(x.shape[0]))
        opt.zero_grad(set_to_none=True)
        h = model(x)
        # DDP averages gradients over ranks; x world makes it the batch sum (docs/method.md §1).
        loss = 0.5 * ((h - d) ** 2).sum()
        (loss * world).backward()
        opt.step()
        now = time.perf_counter()
        times.append(now - last)
        last = now
        errors.append(float(loss.detach()))
    # the final weights too: the bench checks that the peer trained the same batches
    params = _weights(model)
    return {"times": times, "error": errors[-1], "params": params}


def _ddp_rank(rank: int, cfg: dict[str, Any], queue: Any) -> None:
    """One DDP rank: gloo on loopback, CPU, its threads (one unless REAL ranks are given more),
    paced to its EMULATED speed unless the peer runs REAL (unpaced)."""
    threads = int(cfg.get("threads", [1] * cfg["world"])[rank])
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(threads)
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    torch.set_num_threads(threads)
    gpu = _rank_device(cfg, rank) != "cpu"
    if gpu:
        torch.cuda.set_device(rank)
    dist.init_process_group(
        "nccl" if gpu else "gloo",
        init_method=f"tcp://127.0.0.1:{cfg['port']}",
        rank=rank,
        world_size=cfg["world"],
    )
    try:
        model = _ddp_model(cfg, _rank_device(cfg, rank))
        pacer = _Pacer(cfg, rank, layers_of(cfg["shape"]))

        def paced_allreduce(state, bucket):  # no annotations: DDP checks them against GradBucket
            # this rank's compute so far (forward + backward up to this bucket) takes its
            # EMULATED time before its gradients go out, as pace() does for a Dask worker's block
            pacer.wait()
            return default_hooks.allreduce_hook(dist.group.WORLD, bucket)

        if cfg.get("paced", True):
            model.register_comm_hook(None, paced_allreduce)
        result = _train_rank(rank, cfg, model, pacer)
        if rank == 0:
            queue.put(result)
    finally:
        dist.destroy_process_group()


def run_ddp(
    x: np.ndarray,
    d: np.ndarray,
    *,
    hidden: int | Sequence[int],
    speeds: Sequence[float],
    scale: float,
    iterations: int,
    learning_rate: float,
    step: tuple[int, int, float] | None = None,
    seed: int = 0,
    timeout: float = 1800.0,
    rate: float | None = None,
    batch_size: int | None = None,
    shuffle: bool | None = None,
    threads: Sequence[int] | None = None,
    paced: bool = True,
    device: str = "cpu",
) -> dict[str, Any]:
    """Train the same MLP with plain DDP, one process per EMULATED speed; rank 0's iteration times.

    ``hidden``: the hidden units, or of each hidden layer (``(1024, 1024, 1024)``: three).

    ``paced=False`` runs the peer REAL: no pacing (``speeds``, ``scale`` and ``rate`` only
    count the ranks), each rank with ``threads[rank]`` torch/BLAS threads (default one).

    ``device="cuda"`` runs each rank on its own GPU (NCCL; REAL, unpaced): one rank is the
    single-GPU run a user compares a heterogeneous run with.

    ``batch_size`` / ``shuffle`` (defaults ``rpm.train.*``): the mini-batches of
    :mod:`dask_rpm.nn.batches` with the same ``seed`` as :func:`dask_rpm.fit`,
    so DDP trains on exactly the batches dask_rpm does; every rank takes an
    equal share of each batch and DDP all-reduces the gradients every step.
    Returns ``{"times", "error", "params"}``: rank 0's iteration times and
    last local loss, and the final weights ``W_1 .. W_L, V``.

    Each rank's forward + backward is paced like a Dask worker's kernel block
    (:func:`dask_rpm.emulation.pace`): to ``max(cpu, work / rate) / (speed *
    scale)`` with the flop model :func:`dask_rpm.nn.kernels.rectangle_work`, so both
    systems run at the same EMULATED speeds whatever their kernels cost.
    ``rate`` (flop equivalents per second at speed 1, scale 1) defaults to this
    process's calibrated rate x ``rpm.emulation.rate-fraction``, the rate
    :func:`dask_rpm.local_cluster` gives its workers.
    """
    if device != "cpu":
        _check_gpus(len(speeds))
        paced = False
    if rate is None and not paced:
        rate = math.inf
    if rate is None:
        # imported here, not at the top: the spawned ranks import this module, and the
        # emulation package loads distributed, which they do not need
        from ..emulation import process_rate

        rate = float(config.get("emulation.rate-fraction")) * process_rate("float64")
    # the mini-batches dask_rpm's fit would draw: its defaults (rpm.train.*) where None
    given = TrainingOptions(batch_size=batch_size, shuffle=shuffle).resolved()
    sched = schedule(x.shape[0], given.batch_size, shuffle=given.shuffle, seed=seed)
    units = (int(hidden),) if isinstance(hidden, (int, np.integer)) else tuple(map(int, hidden))
    layers = Layers(int(x.shape[1]), units, int(d.shape[1]))
    with tempfile.TemporaryDirectory(prefix="rpm-ddp-") as tmp:
        # dask_rpm's initial parameters (same seed, same order): init_params
        arrays = {"x": x, "d": d}
        arrays.update({f"P{k}": p for k, p in enumerate(init_params(layers, seed=seed))})
        paths = {k: os.path.join(tmp, f"{k}.npy") for k in arrays}
        for k, v in arrays.items():
            np.save(paths[k], np.ascontiguousarray(v, dtype="float64"))
        cfg = {
            "x": paths["x"],
            "d": paths["d"],
            "params": [paths[f"P{k}"] for k in range(len(layers.params))],
            "shape": list(layers.shape),
            "world": len(speeds),
            "port": _free_port(),
            "speeds": list(speeds),
            "scale": scale,
            "lr": learning_rate,
            "iterations": iterations,
            "step": step,
            "rate": float(rate),
            "batch_size": sched.batch_size,
            "shuffle": sched.shuffle,
            "seed": sched.seed,
            "threads": [int(t) for t in (threads or [1] * len(speeds))],
            "paced": bool(paced),
            "device": device,
        }
        return _run_ranks(cfg, timeout)


def _check_gpus(world: int) -> None:
    """A rank per GPU: refuse more ranks than this machine's GPUs (NCCL cannot share one)."""
    import torch

    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if world > have:
        raise BenchError(
            f"the DDP peer on device='cuda' needs a GPU per rank: {world} rank(s), {have} GPU(s) "
            f"here; use one rank per GPU, or device='cpu'"
        )


def _run_ranks(cfg: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Start the ranks (spawned), wait for rank 0's result; no rank outlives the call."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [
        ctx.Process(target=_ddp_rank, args=(r, cfg, queue), daemon=True)
        for r in range(cfg["world"])
    ]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                return queue.get(timeout=1.0)
            except queue_mod.Empty:
                codes = [p.exitcode for p in procs]
                if any(c not in (None, 0) for c in codes) or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"the DDP peer produced no result (rank exit codes {codes}; see their stderr)"
                    ) from None
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.terminate()


def run_ddp_method(
    case: BenchCase,
    x: np.ndarray,
    d: np.ndarray,
    *,
    iterations: int,
    lr: float,
    scale: float,
    start: int,
    rate: float | None = None,
) -> MethodResult:
    """The ``ddp`` method of a bench case: :func:`run_ddp` at the case's speeds (skipped without torch)."""
    ok, why = torch_available()
    if not ok:
        return MethodResult(skipped=why)
    step = None
    if case.step_worker is not None and case.step_at is not None:
        step = (case.step_worker, int(case.step_at), STEP_FACTOR)
    t0 = time.perf_counter()
    res = run_ddp(
        x,
        d,
        hidden=case.layers.hidden,
        speeds=case.speeds,
        scale=scale,
        iterations=iterations,
        learning_rate=lr,
        step=step,
        rate=rate,
        batch_size=case.batch_size,
    )
    it = np.asarray(res["times"], dtype=float)
    return MethodResult(
        seconds_per_iteration=steady_seconds(it, min(start, it.size - 1)),
        seconds_mean=float(np.mean(it)),
        iteration_time=it,
        iterations=int(it.size),
        n_columns=case.n,
        final_error=float(res["error"]),
        plan=json.dumps(
            {
                "method": "ddp",
                "samples_per_rank": "equal",
                "ranks": case.n,
                "batch_size": case.batch_size,
            }
        ),
        wall=time.perf_counter() - t0,
        weights=[np.asarray(p) for p in res["params"]],
    )
