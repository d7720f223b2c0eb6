"""How many threads a worker's kernels use: the cores it was given, not the one its nanny leaves.

Dask's nanny starts every worker process with ``OMP_NUM_THREADS``,
``OPENBLAS_NUM_THREADS`` and ``MKL_NUM_THREADS`` at 1
(``distributed.nanny.pre-spawn-environ``), so that many one-thread tasks do
not oversubscribe the cores. dask_rpm runs one kernel at a time per worker
(one block task), so on a worker with ``nthreads = T`` it lifts that limit to
``T`` for the duration of the block and puts it back afterwards: a SLURM job
with ``cores: 8`` and one process trains on eight cores, not one.

``rpm.engine.threads`` overrides the count for every worker (``auto``: each
worker's own ``nthreads``). The limit covers the BLAS and OpenMP pools that
threadpoolctl sees, and torch's intra-op pool when torch is loaded in the
worker.

The limit is process-wide (that is how BLAS libraries work), with one catch
measured on the OpenBLAS numpy ships (0.3.31, pthreads): the first thread that
sets a limit owns it, and later calls from any other thread are ignored. A Dask
worker must therefore set it from its event-loop thread (the process's main
thread), as the block tasks do; code in a worker's task threads uses
:func:`dask_rpm.probe.kernel.worker_threads`, which enters this context there.
``kernel_threads`` yields the count really in effect, so a limit that did not
take is reported (``FitResult.stats["threads"]``), not assumed.

Several workers in
one process (``LocalCluster(processes=False)``) may run blocks at once, so the
entries are counted: the largest request is in effect while any block runs,
and the first entry's saved limits are restored when the last one leaves.
Pure Python: no ``distributed``.
"""

from __future__ import annotations

import math
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy  # noqa: F401  (loaded before any limit, so that the limits reach its BLAS)
from threadpoolctl import ThreadpoolController, threadpool_limits

from .. import config

__all__ = ["threads_setting", "kernel_threads", "blas_threads", "limit_blas"]

_lock = threading.Lock()
_active: list[int] = []  # the thread counts of the blocks running in this process
_saved: dict[str, Any] = {}  # the limits before the first block entered


def threads_setting(value: Any = None) -> int:
    """``rpm.engine.threads`` (or ``value``) as a count: 0 for ``auto`` (each worker's nthreads).

    Raises
    ------
    ValueError
        When the setting is neither ``auto`` nor a positive whole number.
    """
    v = config.get("engine.threads", value)
    if isinstance(v, str) and v.strip().lower() == "auto":
        return 0
    n = float("nan")
    if not isinstance(v, bool) and isinstance(v, (int, float, str)):
        try:
            n = float(v)
        except ValueError:
            pass
    if not (math.isfinite(n) and n >= 1 and n == int(n)):
        raise ValueError(
            f"rpm.engine.threads={v!r}: expected 'auto' (each worker uses its nthreads) or a "
            f"whole number >= 1 of threads per worker, e.g. 4"
        )
    return int(n)


_controllers: dict[tuple[bool, bool], Any] = {}  # by (numpy, torch) loaded: what a controller sees


def _controller() -> Any:
    """threadpoolctl's view of the loaded thread pools, made once per process (0.15 ms each time
    otherwise), again when numpy or torch has been loaded since (each brings its own pools)."""
    key = ("numpy" in sys.modules, "torch" in sys.modules)
    if key not in _controllers:
        _controllers[key] = ThreadpoolController()
    return _controllers[key]


def limit_blas(threads: int) -> Any:
    """Limit this process's loaded BLAS and OpenMP pools to ``threads``: a limiter, in effect
    until its ``restore()`` or the end of its ``with`` block (threadpoolctl). For a process's
    own pinning (an EMULATED worker, a timing on the client); a worker's kernels during a block
    use :func:`kernel_threads`."""
    return threadpool_limits(limits=threads)


def blas_threads() -> int:
    """The threads this process's BLAS libraries use now (the smallest, if several; 1 without)."""
    ctl = _controller()
    counts = [int(i["num_threads"]) for i in ctl.info() if i["user_api"] == "blas"]
    return min(counts) if counts else 1


def _torch() -> Any:
    # only a torch this process already imported: the engine never loads it for this
    return sys.modules.get("torch")


def _apply(n: int) -> None:
    ctl = _controller()
    if ctl is not None:
        limiter = ctl.limit(limits=n)
        _saved.setdefault("limiter", limiter)  # the first one holds the limits from before
    torch = _torch()
    if torch is not None:
        _saved.setdefault("torch", torch.get_num_threads())
        torch.set_num_threads(n)


def _restore() -> None:
    limiter = _saved.pop("limiter", None)
    if limiter is not None:
        limiter.restore_original_limits()
    torch, before = _torch(), _saved.pop("torch", None)
    if torch is not None and before is not None:
        torch.set_num_threads(before)


def here(fn: Any, *args: Any) -> Any:
    """``fn(*args)`` with torch's pool at the count of the blocks running, set in the calling
    thread first: OpenMP keeps its thread count per thread, so in a compute thread that
    :func:`kernel_threads` (entered on the event loop) never touched, torch's kernels would
    otherwise run on every core, whatever the worker was given."""
    torch = _torch()
    if torch is not None:
        with _lock:
            n = max(_active, default=0)
        if n:
            torch.set_num_threads(n)
    return fn(*args)


@contextmanager
def kernel_threads(threads: int) -> Iterator[int]:
    """Within the block: BLAS, OpenMP (and torch) pools at ``threads``; yields the BLAS threads in
    effect (what the kernels really get: a library may cap the request)."""
    threads = max(int(threads), 1)
    with _lock:
        before = max(_active, default=0)
        _active.append(threads)
        if threads > before:
            _apply(threads)
        effective = blas_threads()
    try:
        yield effective
    finally:
        with _lock:
            _active.remove(threads)
            if not _active:
                _restore()
            elif max(_active) < threads:
                _apply(max(_active))
