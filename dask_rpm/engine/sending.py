"""The samples the driver sends each worker, and the copies it reuses instead.

A worker reads its samples itself from a netCDF file or from Dask's chunks
(:mod:`dask_rpm.engine.dask_data`); in-memory arrays are scattered to it: its
column's rows for full batch, every row for mini-batches. What this client
already sent is named by a content key (:mod:`dask_rpm.engine.sent`), so a next
``fit`` of the same arrays on the same cluster reuses the workers' copies.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import numpy as np

from ..nn import sparse
from ..plan.partition import Plan
from .dask_data import ChunkedRows
from .samples import SampleSource
from .sent import aligned, content_key, sent_samples

if TYPE_CHECKING:
    from .driver import Driver

__all__ = ["SampleSender"]


class SampleSender:
    """One run's sending of samples: this client's earlier copies, and what the run sent.

    Parameters
    ----------
    client : distributed.Client
        The run's client; the copies it sent are kept per client (:func:`~.sent.sent_samples`).
    workers : sequence of str or None
        The cluster's workers now: copies held by workers no longer there are freed.
    """

    def __init__(self, client: Any, workers: Any) -> None:
        # what this client already sent each worker (engine.sent): a next fit of the same arrays
        # reuses it; the content key of the arrays is computed at the first send
        self.sent = sent_samples(client)
        if workers is not None:
            self.sent.keep_only(workers)
        self._content: str | None = None
        self.sent_bytes = 0  # samples scattered to workers in this run
        self.reused = 0  # sample copies a worker already held from an earlier fit

    def snapped(self, driver: Driver, plan: Plan) -> Plan:
        """``plan`` as the run's samples take it: on Dask's chunks, its column cuts on chunk
        boundaries where that pays (:meth:`.dask_data.ChunkedRows.snapped`); else as it is."""
        if isinstance(driver.source, ChunkedRows):
            return driver.source.snapped(plan, driver.recipe.schedule)
        return plan

    def row_bytes(self, driver: Driver) -> int:
        """Bytes of one sample row that a remap makes reach a worker whose sample range grows
        (DRPM's cost model): 0 where the workers' rows do not follow their ranges (mini-batches
        on arrays sent whole, or fetched window by window from a file or Dask's chunks)."""
        sched, src = driver.recipe.schedule, driver.source
        chunked = isinstance(src, ChunkedRows)
        if not (sched.full_batch or (sched.local and chunked)):
            return 0
        if chunked:
            return int(src.row_bytes)
        n, l = driver.layers.n, driver.layers.l
        return (n + l + int(driver.recipe.net.weighted)) * np.dtype(driver.dtype).itemsize

    async def for_workers(
        self, driver: Driver, plan: Plan, ws: Any
    ) -> dict[int, tuple[SampleSource, Any]]:
        """:meth:`samples` of each worker in ``ws``, all sent before any shard is: the tasks
        that cut rows from Dask's chunks then wait together, and the scheduler's active memory
        manager keeps each chunk where a waiting task needs it (a chunk copied to one worker's
        task could otherwise lose its replica on the worker that holds it for its own rows)."""
        return {w: await self.samples(driver, plan, w) for w in ws}

    async def samples(self, driver: Driver, plan: Plan, w: int) -> tuple[SampleSource, Any]:
        """Worker ``w``'s :class:`~.samples.SampleSource` and what is sent for it: nothing (a file), its
        column's rows (full batch) or every row (mini-batches); Dask chunks: :mod:`.dask_data`."""
        if isinstance(driver.source, str):
            return SampleSource("file", path=driver.source, rows=driver.rows), None
        if driver.source is not None:  # chunks on the cluster: a task on w cuts its rows from them
            return await driver.source.samples(driver, plan, w)
        x, d = driver.arrays  # type: ignore[misc]
        if self._content is None:  # hashed off the event loop: SHA-1 releases the GIL
            self._content = await asyncio.to_thread(content_key, x, d)
        # One key per worker, not one broadcast key: the scheduler's active memory manager
        # (ReduceReplicas, on by default) drops the extra replicas of a broadcast key within
        # seconds, and losing the worker left holding it would lose the training set for
        # every recovery.
        if not driver.recipe.schedule.full_batch:
            part: Any = "all"
            kind, rows, obj = "arrays", int(x.shape[0]), (x, d)
        else:
            part = s0, s1 = plan.rectangle(w).samples
            kind, rows, obj = "slice", s1 - s0, (x[s0:s1], d[s0:s1])
        addr = driver.addresses[w]
        copy = self.sent.get(addr, self._content, part)
        if copy is not None:
            self.reused += 1
            return SampleSource(kind), copy
        sent = await driver._scatter_to(obj, w)
        # the worker's copy, aligned (engine.sent.aligned): the scattered one is freed with `sent`
        copy = driver.client.submit(
            aligned, sent, key=driver._key("samples", driver.version, w), workers=[addr], pure=False
        )
        self.sent.put(addr, self._content, part, copy, rows, limit=int(x.shape[0]))
        self.sent_bytes += sparse.nbytes(obj[0]) + int(obj[1].nbytes)
        return SampleSource(kind), copy
