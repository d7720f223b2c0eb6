"""The C allocator while a worker's kernels run: reuse their transient buffers, do not remap them.

Dask's nanny starts every worker process with ``MALLOC_TRIM_THRESHOLD_=65536``
(``distributed.nanny.pre-spawn-environ``), so that a worker hands freed memory back to the
system soon. On glibc, setting that threshold also turns off the allocator's adaptive mmap
threshold, which stays at its 128 KiB default: every buffer above it is mapped fresh and unmapped
on free. The MLP kernels allocate nothing per iteration (:class:`~dask_rpm.nn.kernels.Workspace`),
but a convolution's output, torch's im2col columns and the pooling indices are allocated on every
call, and there each new mapping is page faults on first touch: measured here, LeNet at batch
256 (float32, one thread) took 38 ms per iteration in a nanny's worker and 17 ms with the
thresholds below - the same as in a plain process.

:func:`kernel_buffers` raises the mmap threshold to 32 MiB (glibc's largest) and the trim
threshold to 512 MiB while any block runs in the process, so freed buffers are reused by the next
call, and puts the nanny's values back when the last block leaves (the memory above the trim
threshold then goes back to the system at the next free). Elsewhere than glibc it does nothing.
Pure Python: no ``distributed``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["kernel_buffers", "MMAP_THRESHOLD", "TRIM_THRESHOLD"]

#: Allocations up to this size come from the heap while blocks run (glibc's maximum on 64 bits).
MMAP_THRESHOLD = 32 * 2**20
#: Free memory kept at the top of the heap while blocks run.
TRIM_THRESHOLD = 512 * 2**20

# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
# glibc's defaults, what a process has without the environment variables
_DEFAULT_MMAP, _DEFAULT_TRIM = 128 * 1024, 128 * 1024

_lock = threading.Lock()
_depth = 0  # blocks running in this process (LocalCluster(processes=False) runs several)


def _libc() -> Any:
    """glibc, or None (another C library: nothing to tune)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
        libc.gnu_get_libc_version  # noqa: B018 - raises AttributeError where it is not glibc
        return libc
    except (OSError, AttributeError):
        return None


_LIBC = _libc()


def _env(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


@contextmanager
def kernel_buffers() -> Iterator[None]:
    """Within: large transient buffers are reused from the heap (module docstring)."""
    global _depth
    with _lock:
        _depth += 1
        if _depth == 1 and _LIBC is not None:
            _LIBC.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
            _LIBC.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _LIBC is not None:
                _LIBC.mallopt(_M_MMAP_THRESHOLD, _env("MALLOC_MMAP_THRESHOLD_", _DEFAULT_MMAP))
                _LIBC.mallopt(_M_TRIM_THRESHOLD, _env("MALLOC_TRIM_THRESHOLD_", _DEFAULT_TRIM))
