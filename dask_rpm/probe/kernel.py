"""The kernel probe's measuring side: one repetition on a worker, and the block calibration.

:func:`t_probe` runs on the workers (one task per repetition);
:func:`calibrate` runs once in the client to size the probe block. Both run
the real BP kernels of one rectangle (:func:`kernel_pass`).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
from distributed import get_worker

from ..emulation import PLUGIN_NAME, pace
from ..nn import backend as xb
from ..nn.backend import NUMPY, Backend, Placement, resolve, synchronize
from ..nn.cnn import ConvLayers, cnn_work
from ..nn.kernels import Workspace, block_work, init_weights, kernel_pass
from ..nn.workspaces import workspace
from ..runtime.allocator import kernel_buffers
from ..runtime.threads import blas_threads, kernel_threads, limit_blas, threads_setting

__all__ = [
    "block_data",
    "conv_block_data",
    "conv_pass",
    "conv_pass_work",
    "conv_units",
    "calibrate_conv",
    "t_probe",
    "robust_mean",
    "calibrate",
    "worker_threads",
    "shrink",
    "MAX_LOOPS",
    "PASSES_PER_TARGET",
    "TRIM",
]

#: Rough upper bound on the flops of one calibration pass, so that calibrating
#: a huge job never runs a huge block (about 0.1 s on a slow core).
CALIBRATION_FLOPS = 1.0e8
#: Upper bound on kernel passes per repetition (keeps absurd configs finite).
MAX_LOOPS = 100_000
#: One kernel pass takes at most target-seconds / this at full speed on the
#: client, so a worker many times slower still finishes a pass in about a
#: repetition's time, and fast workers average over many passes.
PASSES_PER_TARGET = 8
#: CPU seconds of unpaced kernel passes before each timed block (see t_probe).
WARM_CPU_SECONDS = 0.002
#: Fraction of the repetitions cut at each end before averaging their times.
TRIM = 0.125
#: Serialises probe repetitions within one worker process.
_REPETITION_LOCK = threading.Lock()


def block_data(
    n: int, m: int, l: int, s: int, dtype: str, seed: int, backend: Backend = NUMPY
) -> tuple[Any, ...]:
    """The kernel buffers, synthetic inputs, teachers and weights of one probe block (values are
    irrelevant) on ``backend``: the arguments of :func:`~dask_rpm.nn.kernels.kernel_pass`."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((s, n)).astype(dtype)
    d = rng.uniform(0.1, 0.9, size=(s, l)).astype(dtype)
    W, V = init_weights(n, m, l, seed=seed, dtype=dtype)
    ws = Workspace(s, m, n, l, dtype, backend=backend)
    return (ws, *(backend.asarray(a) for a in (x, d, W, V)))


def conv_units(layers: ConvLayers, rows: int) -> tuple[int, ...]:
    """Each stage's channels of a rectangle of ``rows`` plan rows (the top ones, so the bias
    channel only with all of them): what a worker with that share of a column computes."""
    return layers.units((0, rows))


def conv_pass_work(layers: ConvLayers, s: int, units: tuple[int, ...]) -> float:
    """Flop equivalents of one :func:`conv_pass` on ``s`` samples and ``units`` channels of every
    stage (:func:`~dask_rpm.nn.cnn.cnn_work`): what an EMULATED worker paces it by, as the
    engine paces the same kernels in training."""
    return sum(
        cnn_work(kind, k, s, units, layers)
        for k in range(layers.depth)
        for kind in ("forward", "backward")
    )


def conv_block_data(
    layers: ConvLayers, rows: int, s: int, dtype: str, seed: int, backend: Backend = NUMPY
) -> tuple[Any, ...]:
    """:func:`block_data` of a CNN rectangle: ``rows`` plan rows (:func:`conv_units` channels
    of every stage) by ``s`` samples, its workspace, inputs, teachers and its rows of every
    parameter, on ``backend``: the arguments of :func:`conv_pass`."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((s, layers.n)).astype(dtype)
    d = rng.uniform(0.1, 0.9, size=(s, layers.l)).astype(dtype)
    params = [
        (rng.uniform(-1.0, 1.0, size=shape) * 0.1).astype(dtype)
        for shape in layers.shapes(layers.layer_rows((0, rows)))
    ]
    ws = workspace(
        s,
        dtype=dtype,
        layers=layers,
        units=conv_units(layers, rows),
        bias_rows=layers.bias_rows((0, rows)),
        backend=backend,
    )
    # The column's gathered stage outputs (the other members' channels, which the engine's
    # all-gather fills): any finite values time the same; garbage could hold slow denormals.
    for k in range(layers.depth - 1):
        ws.full(k)[...] = 0.5
    return (ws, *(backend.asarray(a) for a in (x, d, *params)))


def conv_pass(ws: Workspace, x: Any, d: Any, *params: Any) -> float:
    """:func:`~dask_rpm.nn.kernels.kernel_pass` of a CNN rectangle, which may hold only part of
    its column's channels: stage by stage, each stage reading the whole of the stage before it
    (``ws.full``), its own part of the gradient for that input kept (the engine's column
    all-gathers and reduce-scatters these; what they cost the link probe measures). With every
    channel it is :func:`~dask_rpm.nn.kernels.kernel_pass` itself; returns the loss."""
    layers = ws.layers
    assert isinstance(layers, ConvLayers)
    if ws.units == layers.hidden:
        return kernel_pass(ws, x, d, *params)
    depth = layers.depth
    inp = x
    for k in range(depth):
        out = ws.layer_forward(k, inp, params)
        if k < depth - 1:
            inp = ws.full(k)
            xb.copyto(inp[:, : ws.units[k]], out)  # my part of the gathered outputs
    delta2, err = ws.output_delta(ws.output_partial(params), d)
    ws.output_backward(params, delta2)
    for k in range(depth - 1, -1, -1):
        g = ws.layer_backward(k, ws.full(k - 1) if k else x, params)
        if g is not None:  # my channels' part of the summed input gradient
            xb.copyto(ws.delta(k - 1), g[:, : ws.units[k - 1]])
    return err


def t_probe(
    block: tuple[int, int, int, int],
    loops: int,
    dtype: str,
    seed: int,
    pass_seconds: float = 0.0,
    placement: tuple[str, str] = Placement(),
    layers: ConvLayers | None = None,
) -> tuple[float, int, float]:
    """One repetition on a worker: ``loops`` kernel passes in one paced block.

    The kernels run on the worker's threads (``rpm.engine.threads``, by default its
    ``nthreads``), as its training blocks do. Returns ``(seconds, overruns, cpu_seconds)``: the block's wall time, how
    many EMULATED paced blocks overran their target meanwhile (0 without
    emulation; an overrun means other load, not the emulated speed, set the
    time) and the block's CPU time. Repetitions on one worker process run one
    at a time (a lock), even on a worker with several threads, as one
    rectangle task would. The kernels run on the backend the worker trains with (``placement``:
    a worker with a GPU is measured on it). With ``layers`` (a CNN) the block is that network's
    rectangle of ``m`` plan rows (:func:`conv_block_data`, :func:`conv_pass`).
    """
    n, m, l, s = block
    if layers is not None:
        data = conv_block_data(layers, m, s, dtype, seed, resolve(*placement))
        one_pass, units = conv_pass, conv_units(layers, m)
        pass_work = conv_pass_work(layers, s, units)
    else:
        data = block_data(n, m, l, s, dtype, seed, resolve(*placement))
        one_pass = kernel_pass
        pass_work = block_work("forward", s, m, n, l) + block_work("backward", s, m, n, l)
    worker = get_worker()
    # timed on the threads the worker trains with (dask_rpm.runtime.threads)
    # and with the allocator training has (dask_rpm.runtime.allocator)
    with (
        _REPETITION_LOCK,
        worker_threads(worker, threads_setting() or worker.state.nthreads),
        kernel_buffers(),
    ):
        # Unpaced, untimed passes first: a thread that idled (a slow worker
        # sleeps most of the time) spends more CPU on its next millisecond or
        # so of work (cold caches). Measured here: 10-30 % more CPU per pass
        # for the slower workers, whose timed blocks are shorter, without
        # this; ~0 with it.
        c_start = time.thread_time()
        one_pass(*data)
        while time.thread_time() - c_start < WARM_CPU_SECONDS:
            one_pass(*data)
        plugin = worker_plugin(PLUGIN_NAME)
        overruns0 = getattr(plugin, "overruns", 0)
        t0, c0 = time.perf_counter(), time.thread_time()
        work = loops * pass_work
        if plugin is not None and pass_seconds > 0:
            work = max(work, _pass_work(plugin, loops * pass_seconds, dtype))
        # Paced like a training block: by its work, and for a tiny job's block
        # (per-call overhead, not flops, sets its time) by the smallest CPU
        # time this worker has seen for the same block and loop count - the
        # engine's kernels pace by such a key too. Without the key the block's
        # own CPU time set the target, and on a loaded host (load average 2.3
        # on 2 cores) that moved a slow worker's measured ratio by 10-40 %.
        with pace(key=("probe", block, loops, dtype), work=work, dtype=dtype):
            for _ in range(loops):
                one_pass(*data)
            synchronize(data[1])  # a GPU's last kernels, queued
        seconds = time.perf_counter() - t0
        cpu = time.thread_time() - c0
    return seconds, int(getattr(plugin, "overruns", 0) - overruns0), cpu


def _pass_work(plugin: Any, seconds: float, dtype: str) -> float:
    """The work (flop equivalents) one full core does in ``seconds`` at the EMULATED rate.

    A tiny job's pass costs per-call overhead, not flops, so its flop model understates it and
    each worker's pacing fell back on its own smallest CPU time, which differs between worker
    processes on a shared host: the probe then measured that, not the EMULATED speeds.
    Stated from the
    client's timed pass (:func:`calibrate`) the work is the same on every worker, and paced, as
    large blocks are, to ``1 / rpm.emulation.rate-fraction`` of one core's time.
    """
    rate = plugin.rates.get(dtype)
    if not rate:
        return 0.0
    return seconds * float(rate) / float(plugin.rate_fraction)  # rpm.emulation.rate-fraction


@contextmanager
def worker_threads(worker: Any, threads: int) -> Iterator[int]:
    """:func:`dask_rpm.runtime.threads.kernel_threads` for code in a worker's task thread: the limit is
    set and restored from the worker's event-loop thread, the only one whose limit OpenBLAS
    honours once that thread has set one (see :mod:`dask_rpm.runtime.threads`)."""
    from .._distributed import sync  # a worker-side helper: distributed is loaded there

    if blas_threads() == threads:  # nothing to change (every EMULATED worker): no loop hops
        yield threads
        return
    cm = kernel_threads(threads)

    async def enter() -> int:
        return cm.__enter__()

    async def leave() -> None:
        cm.__exit__(None, None, None)

    effective = sync(worker.loop, enter)
    try:
        yield effective
    finally:
        sync(worker.loop, leave)


def robust_mean(seconds: np.ndarray, trim: float) -> np.ndarray:
    """Per column (worker): mean of the finite values after cutting ``trim`` at each end.

    Why not the median: on a shared host the CPU cost of a kernel pass is
    often *bimodal*, the mode switching every few tens of milliseconds. The
    median of a few such repetitions jumps between the modes; a trimmed mean
    averages them, and like the median it drops outliers (a pause, a hiccup).
    docs/benchmarks.md has the measurements.
    """
    out = np.empty(seconds.shape[1])
    for i in range(seconds.shape[1]):
        col = np.sort(seconds[np.isfinite(seconds[:, i]), i])
        k = int(len(col) * trim)
        out[i] = col[k : len(col) - k].mean() if len(col) else np.nan
    return out


def worker_plugin(name: str) -> Any:
    """The running worker's plugin ``name``, or None (not on a worker / not installed)."""
    try:
        return get_worker().plugins.get(name)
    except ValueError:
        return None


def calibrate(n: int, m: int, l: int, s: int, dtype: str, target: float) -> tuple[int, int, float]:
    """Shrink an ``m x s`` block until one pass takes at most ``target`` seconds here.

    Returns ``(m_p, s_p, seconds_per_pass)``. Timed on the client with BLAS
    limited to one thread, like the workers' (only the block *size* depends
    on it; the abilities come from the workers' own timings).
    """
    limiter = limit_blas(1)
    try:
        # a cheap flop estimate first, so the first timed block is never huge
        flops = 4.0 * m * s * (n + 1.5 * l) + 1.0
        if flops > CALIBRATION_FLOPS:
            m, s = shrink(m, s, CALIBRATION_FLOPS / flops)
        for _ in range(4):
            data = block_data(n, m, l, s, dtype, 0)
            kernel_pass(*data)  # warm
            t = math.inf
            for _ in range(3):
                t0 = time.perf_counter()
                kernel_pass(*data)
                t = min(t, time.perf_counter() - t0)
            if t <= target or (m == 1 and s == 1):
                break
            # 0.8: aim a little under the target, passes do not scale exactly
            m, s = shrink(m, s, 0.8 * target / t)
        return m, s, max(t, 1e-7)
    finally:
        limiter.restore_original_limits()


def calibrate_conv(
    layers: ConvLayers, rows: int, s: int, dtype: str, target: float
) -> tuple[int, float]:
    """:func:`calibrate` for a CNN rectangle of ``rows`` plan rows: only its samples shrink.

    The channels are what the probe is sized to measure (a GPU's, or a CPU's cache behaviour,
    changes with the share of each stage it computes), so the block keeps them and runs fewer
    samples until a pass takes at most ``target`` seconds here (one sample at least). Returns
    ``(s_p, seconds_per_pass)``.
    """
    limiter = limit_blas(1)
    try:
        units = conv_units(layers, rows)
        per_sample = conv_pass_work(layers, 1, units)
        s = max(1, min(s, int(CALIBRATION_FLOPS / max(per_sample, 1.0))))
        for _ in range(4):
            data = conv_block_data(layers, rows, s, dtype, 0)
            conv_pass(*data)  # warm
            t = math.inf
            for _ in range(3):
                t0 = time.perf_counter()
                conv_pass(*data)
                t = min(t, time.perf_counter() - t0)
            if t <= target or s == 1:
                break
            s = max(1, int(s * 0.8 * target / t))
        return s, max(t, 1e-7)
    finally:
        limiter.restore_original_limits()


def shrink(m: int, s: int, factor: float) -> tuple[int, int]:
    """Scale the block area by ``factor`` (< 1), keeping the aspect ratio."""
    r = math.sqrt(max(factor, 0.0))
    return max(1, int(m * r)), max(1, int(s * r))
