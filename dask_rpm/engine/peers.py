"""A call from one worker to another that gives up as soon as the scheduler says the peer left.

A worker building its shard of a new plan (a remap's :func:`~dask_rpm.engine.tasks.t_stage`, a
recovery's :func:`~dask_rpm.engine.tasks.t_restore`) fetches rows from their holders, and waits
for them in its only thread. A holder killed meanwhile refuses connections, and Dask's
``connect`` retries a refused connection until ``distributed.comm.timeouts.connect`` (30 s by
default): the thread, and the retried remap queued behind it, would wait that long for a worker
the driver already knows is gone. So the call is raced against the scheduler's view of who left
(the scheduler plugin's ``rpm_leaving``), asked every ``poll`` seconds while the call is pending:
a call that answers within ``poll`` costs nothing more.
"""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["PeerLeftError", "call_peer"]


class PeerLeftError(ConnectionError):
    """The peer a worker was calling left the cluster before it answered."""


async def call_peer(worker: Any, address: str, op: str, poll: float = 0.5, **kwargs: Any) -> Any:
    """``worker.rpc(address).<op>(**kwargs)``; raises :class:`PeerLeftError` once the scheduler
    lists ``address`` as gone or leaving while the call is pending."""
    call = asyncio.ensure_future(getattr(worker.rpc(address), op)(**kwargs))
    try:
        while True:
            done, _ = await asyncio.wait([call], timeout=poll)
            if done:
                return call.result()
            if await worker.scheduler.rpm_leaving(workers=[address]):
                raise PeerLeftError(
                    f"worker {address} left before answering {op!r} (the scheduler lists it as "
                    f"gone or leaving)"
                )
    finally:
        if not call.done():
            call.cancel()
