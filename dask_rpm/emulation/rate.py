"""One warm core's throughput on the BP kernels: the yardstick EMULATED speeds multiply.

A block that states its work lasts ``work / (rate * speed * scale)`` on an
emulated worker; every worker of a cluster shares one ``rate``, so their
speeds differ by exactly their ratios (see :mod:`dask_rpm.emulation`).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from ..nn.kernels import Workspace, block_work, kernel_pass
from ..runtime.threads import limit_blas

__all__ = ["calibrate_rate", "process_rate"]


def calibrate_rate(
    repeats: int = 7,
    shape: tuple[int, int, int, int] = (256, 256, 16, 1024),
    dtype: Any = "float64",
) -> float:
    """Throughput of one warm core on the BP kernels, in flop equivalents per second.

    Runs the training kernels (:func:`~dask_rpm.nn.kernels.kernel_pass`) on a ``(n, m, l, s)`` block a
    few times after a warm-up and divides their work
    (:func:`~dask_rpm.nn.kernels.block_work`) by the median process CPU time
    with BLAS limited to one thread (process time, so that a BLAS that could
    not be limited is counted whole). About 0.1-0.3 s. EMULATED workers of one cluster share the result, so their
    speeds differ by exactly their ratios.
    """
    n, m, l, s = shape
    rng = np.random.default_rng(0)
    x, W, V, d = (
        a.astype(dtype)
        for a in (
            rng.normal(size=(s, n)),
            rng.normal(size=(m, n)) * 0.1,
            rng.normal(size=(l, m)) * 0.1,
            rng.uniform(0.1, 0.9, size=(s, l)),
        )
    )
    ws = Workspace(s, m, n, l, dtype)
    work = block_work("forward", s, m, n, l) + block_work("backward", s, m, n, l)
    limiter = limit_blas(1)  # one BLAS thread, as on the workers
    cpu = []
    try:
        for i in range(repeats + 1):
            c0 = time.process_time()
            kernel_pass(ws, x, d, W, V)
            if i:  # the first pass warms caches and BLAS up
                cpu.append(time.process_time() - c0)
    finally:
        limiter.restore_original_limits()
    cpu.sort()
    return work / max(cpu[len(cpu) // 2], 1e-9)


_RATES: dict[str, float] = {}


def process_rate(dtype: str) -> float:
    """:func:`calibrate_rate` once per process and dtype.

    Every emulated cluster a session starts then runs at the same absolute
    speeds, so their timings compare (a benchmark's arms, a test's reference
    run).
    """
    if dtype not in _RATES:
        _RATES[dtype] = calibrate_rate(dtype=dtype)
    return _RATES[dtype]
