"""What a worker's engine calls around its kernels and messages, without knowing what it does.

The engine asks :func:`worker_hooks` for a worker's :class:`WorkerHooks` and
calls them: ``pace(...)`` around every kernel, ``before_send(peer, nbytes)``
before every message, ``paced`` to decide whether a kernel may run on the
event loop, ``describe()`` for a run's EMULATED label. A real cluster leaves them as they are: no-ops, and no
emulation code runs. The EMULATED workers' plugins (:mod:`dask_rpm.emulation`)
put their pacing and link delays here when they are set up on a worker, and
take them back at teardown - the injected-transport pattern of distributed's
P2P shuffle.

A leaf: it imports nothing of dask_rpm, so both sides import it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Hashable
from typing import Any

__all__ = ["WorkerHooks", "worker_hooks"]

_ATTRIBUTE = "_dask_rpm_hooks"


def _no_pace(
    iteration: int | None = None, key: Hashable = None, work: float | None = None, dtype: Any = None
) -> contextlib.AbstractContextManager[None]:
    return contextlib.nullcontext()


class WorkerHooks:
    """One worker's hooks; the defaults do nothing.

    Attributes
    ----------
    pace : callable
        ``pace(iteration, key, work, dtype)`` -> a context manager around a
        kernel (EMULATED: it sleeps the kernel out to the worker's speed).
    paced : bool
        Whether ``pace`` sleeps: such kernels must not run on the event loop.
    before_send : async callable or None
        ``await before_send(peer_address, nbytes)`` before each engine message
        (EMULATED links: the link's added delay). None: nothing to wait.
    describe : callable or None
        ``describe()`` -> what the worker emulates (its speed, scale, schedule, host, index:
        :mod:`dask_rpm.runtime.labels` makes a run's EMULATED label of them). None: a real
        worker.
    """

    def __init__(self) -> None:
        self.pace: Callable[..., contextlib.AbstractContextManager[Any]] = _no_pace
        self.paced = False
        self.before_send: Callable[[str, int], Awaitable[Any]] | None = None
        self.describe: Callable[[], dict[str, Any]] | None = None

    def reset_pace(self) -> None:
        self.pace, self.paced = _no_pace, False


def worker_hooks(worker: Any) -> WorkerHooks:
    """The hooks of ``worker`` (a Dask worker), created on first use."""
    hooks = getattr(worker, _ATTRIBUTE, None)
    if hooks is None:
        hooks = WorkerHooks()
        setattr(worker, _ATTRIBUTE, hooks)
    return hooks
