"""Calls from the driver to chosen workers that give up on a worker as soon as it has left.

``client.run(fn, workers=[address])`` on a worker that has just left waits out
Dask's connect timeout (``distributed.comm.timeouts.connect``, 30 s) before it
fails: the scheduler keeps dialling the address - a 30 s stall when a worker is
retired or killed just before a checkpoint's writers (or an abort, a rollback,
a commit) are called. :func:`run_each` asks
the scheduler every ``rpm.engine.poll-seconds`` whether the workers still
waited on are gone or retiring, and drops those at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from .errors import WorkerLostError

__all__ = ["run_each"]


async def run_each(
    client: Any,
    calls: Mapping[str, tuple[Any, tuple]],
    *,
    leaving: Callable[[Sequence[str]], Awaitable[list[str]]],
    iteration: int,
    poll: float = 0.25,
) -> dict[str, Any]:
    """``client.run`` of ``fn(*args)`` on each worker of ``calls`` (address -> (fn, args)), at once.

    Parameters
    ----------
    client : distributed.Client
        An asynchronous client.
    calls : mapping
        Worker address -> ``(fn, args)``.
    leaving : async callable
        Of some addresses, those gone or retiring (the driver's
        :meth:`~dask_rpm.engine.driver.Driver.leaving`).
    iteration : int
        The iteration a :class:`WorkerLostError` names.
    poll : float
        Seconds between looks at who left (the run's ``rpm.engine.poll-seconds``).

    Returns
    -------
    dict
        Each worker's result, or the exception its call raised; a worker that
        left while its call was pending gets :class:`WorkerLostError`.
    """
    tasks = {
        a: asyncio.ensure_future(client.run(fn, *args, workers=[a]))
        for a, (fn, args) in calls.items()
    }
    pending, gone = set(tasks.values()), set()
    while pending:
        _, pending = await asyncio.wait(pending, timeout=poll)
        waiting = [a for a, t in tasks.items() if t in pending]
        if waiting:
            for a in await leaving(waiting):
                tasks[a].cancel()
                pending.discard(tasks[a])
                gone.add(a)
    # the cancelled calls end at once (they only wait on the scheduler)
    await asyncio.gather(*(tasks[a] for a in gone), return_exceptions=True)
    out: dict[str, Any] = {}
    for a, t in tasks.items():
        if a in gone:
            out[a] = WorkerLostError([a], iteration)
        elif t.exception() is not None:
            out[a] = t.exception()
        else:
            out[a] = t.result()[a]
    return out
