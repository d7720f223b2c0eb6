"""A worker's mini-batch rows, fetched from the Dask chunks that hold them, and the handler
that serves them.

A :class:`ChunkReader` travels to every worker in its
:class:`~dask_rpm.engine.samples.SampleSource` (``"chunks"``; small: the chunk keys, not their
rows). On the worker, :meth:`ChunkReader.take` gets each window's training samples: from the
worker's own chunks where it holds them, else straight from a worker that does, whose
``rpm_chunk_rows`` handler (installed by :class:`RowServer`) cuts the rows out; the client
never sees them. Every worker counts the rows and bytes it fetched from others
(:func:`fetched_counts`).
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import numpy as np
from distributed import WorkerPlugin

from .._distributed import sync, to_serialize
from .peers import call_peer

__all__ = ["ChunkReader", "RowServer", "fetched_counts"]

#: how long a worker keeps asking for a chunk no live worker holds (Dask recomputes a lost one)
_HOLDER_WAIT = 120.0


class ChunkReader:
    """A worker's fetcher of its mini-batches' training samples, from the chunks on the cluster.

    Sent to every worker with its :class:`~dask_rpm.engine.samples.SampleSource` (small: the
    chunk keys, not their rows). :meth:`take` runs on the worker, off its event loop.

    Parameters
    ----------
    run : str
        The run, for the counts of what was fetched.
    x_keys, d_keys : tuple
        The Dask keys of the row chunks of ``x`` and ``d``, in order.
    bounds : numpy.ndarray
        The data row where each chunk starts, and the number of rows.
    rows : numpy.ndarray or None
        Training sample ``i`` is data row ``rows[i]``; None: row ``i``.
    window : int
        Most rows one load takes (``rpm.engine.sample-window``).
    row_bytes : int
        Bytes of one row of ``x`` and ``d``.
    last : int
        The run's iterations: no rows are fetched ahead for iterations from here on.
    """

    def __init__(
        self,
        run: str,
        x_keys: tuple,
        d_keys: tuple,
        bounds: np.ndarray,
        rows: np.ndarray | None,
        window: int,
        row_bytes: int,
        last: int,
    ) -> None:
        self.run, self.x_keys, self.d_keys = run, x_keys, d_keys
        self.bounds, self.rows, self.window, self.row_bytes = bounds, rows, window, row_bytes
        self.last = last

    def take(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Training samples ``idx`` as ``(x, d)`` rows, in that order (on a worker)."""
        from distributed import get_worker

        worker = get_worker()
        data = np.asarray(idx, dtype=np.int64)
        data = data if self.rows is None else np.asarray(self.rows)[data]
        chunk = np.searchsorted(self.bounds, data, side="right") - 1
        by = np.argsort(chunk, kind="stable")
        need, first = np.unique(chunk[by], return_index=True)
        places = np.split(by, first[1:])  # where each needed chunk's rows go, in idx order
        cuts = [data[p] - self.bounds[j] for j, p in zip(need.tolist(), places)]
        keys = [self.x_keys[j] for j in need.tolist()] + [self.d_keys[j] for j in need.tolist()]
        blocks, moved = sync(worker.loop, _fetch, worker, keys, cuts + cuts)
        k = len(cuts)
        if not k:
            return np.empty((0, 0)), np.empty((0, 0))
        x = np.empty((data.size, blocks[0].shape[1]), dtype=blocks[0].dtype)
        d = np.empty((data.size, blocks[k].shape[1]), dtype=blocks[k].dtype)
        for i, p in enumerate(places):
            x[p], d[p] = blocks[i], blocks[k + i]
        with _LOCK:
            count = _FETCHED.setdefault((self.run, worker.address), [0, 0, 0])
            count[0] += moved[0]  # rows of x from others (d's mostly come with them)
            count[1] += moved[1]
            count[2] += 1
        return x, d


async def _fetch(worker: Any, keys: list[Any], cuts: list[np.ndarray]) -> tuple[list[Any], tuple]:
    """Rows ``cuts[i]`` of the chunk with key ``keys[i]``, each from this worker if it holds the
    chunk, else from a worker that does; and the rows (of ``x``'s keys, the first half) and
    bytes that came from others."""
    out: list[Any] = [None] * len(keys)
    todo = list(range(len(keys)))
    moved = nbytes = 0
    deadline = time.monotonic() + _HOLDER_WAIT
    while todo:
        who = await worker.scheduler.who_has(keys=[keys[i] for i in todo])
        who = {_key(k): list(v) for k, v in who.items()}
        by_holder: dict[str, list[int]] = {}
        for i in todo:
            holders = who.get(keys[i], [])
            # its own chunk where it holds one (none yet: asked below, then again)
            holder = worker.address if worker.address in holders or not holders else min(holders)
            by_holder.setdefault(holder, []).append(i)

        async def ask(holder: str, items: list[int]) -> tuple[str, list[int], Any]:
            pick = [keys[i] for i in items]
            sel = [cuts[i] for i in items]
            if holder == worker.address:
                return holder, items, await _cut(worker, pick, sel)
            try:
                got = await call_peer(
                    worker, holder, "rpm_chunk_rows", keys=pick, rows=[to_serialize(c) for c in sel]
                )
            except OSError:  # the holder left (PeerLeftError too): ask the scheduler again
                return holder, items, None
            return holder, items, got

        missing: list[int] = []
        for holder, items, got in await asyncio.gather(
            *(ask(h, its) for h, its in by_holder.items())
        ):
            if got is None:
                missing += items
                continue
            lost = set(got["missing"])
            for pos, i in enumerate(items):
                if pos in lost:
                    missing.append(i)
                    continue
                out[i] = _unwrap(got["rows"][pos])
                if holder != worker.address:
                    nbytes += int(out[i].nbytes)
                    moved += int(cuts[i].size) if i < len(keys) // 2 else 0
        if missing and time.monotonic() > deadline:
            raise RuntimeError(
                f"no worker holds the training data's chunk {keys[missing[0]]!r} after "
                f"{_HOLDER_WAIT:.0f} s"
            )
        if missing:
            await asyncio.sleep(0.2)  # a lost chunk is recomputed by Dask meanwhile
        todo = missing
    return out, (moved, nbytes)


#: what each worker fetched from others for its mini-batches: (run, address) -> rows, bytes, loads
_FETCHED: dict[tuple[str, str], list[int]] = {}
_LOCK = threading.Lock()


def _key(k: Any) -> Any:
    """A Dask key as sent over a comm (tuples may arrive as lists)."""
    return tuple(_key(v) for v in k) if isinstance(k, (list, tuple)) else k


def _unwrap(v: Any) -> np.ndarray:
    """An array as received: the inproc transport leaves it wrapped for serialisation."""
    return np.asarray(getattr(v, "data", v))


async def _cut(worker: Any, keys: list[Any], rows: list[Any]) -> dict[str, Any]:
    """Rows ``rows[i]`` of the chunks ``keys[i]`` this worker holds; ``missing``: the positions
    of those it does not hold.

    A chunk Dask spilled to disk is read from there without being moved back into memory
    (``worker.data`` is a ``zict.Buffer``: its ``slow`` mapping): a window that draws from
    many spilled chunks would otherwise bring them all in, one evicting the next, faster
    than the worker's memory monitor runs. The event loop gets a turn after each chunk.
    """
    data = worker.data
    fast, slow = getattr(data, "fast", {}), getattr(data, "slow", {})
    out: list[Any] = []
    missing: list[int] = []
    for pos, (key, sel) in enumerate(zip(keys, rows)):
        k = _key(key)
        try:
            block = fast[k] if k in fast else slow[k] if k in slow else data[k]
        except KeyError:
            missing.append(pos)
            out.append(None)
            continue
        out.append(np.ascontiguousarray(np.asarray(block)[_unwrap(sel)]))
        del block
        await asyncio.sleep(0)
    return {"rows": out, "missing": missing}


async def _serve_rows(worker: Any, keys: list[Any], rows: list[Any]) -> dict[str, Any]:
    """The ``rpm_chunk_rows`` handler: :func:`_cut` for a peer, its arrays sent as they are."""
    got = await _cut(worker, keys, rows)
    got["rows"] = [None if a is None else to_serialize(a) for a in got["rows"]]
    return got


class RowServer(WorkerPlugin):
    """Installs the ``rpm_chunk_rows`` handler on every worker, those that join later (or are
    restarted by their nanny) included; idempotent."""

    name = "rpm-chunk-rows"
    idempotent = True

    def setup(self, worker: Any) -> None:
        _serve(worker)


def _serve(dask_worker: Any) -> None:
    """Install the ``rpm_chunk_rows`` handler on a worker."""

    async def rpm_chunk_rows(keys: list[Any], rows: list[Any]) -> dict[str, Any]:
        return await _serve_rows(dask_worker, keys, rows)  # named: Dask logs handler names

    dask_worker.handlers["rpm_chunk_rows"] = rpm_chunk_rows


def fetched_counts(run: str, dask_worker: Any = None) -> tuple[int, int, int]:
    """What this worker fetched from others for ``run`` (``client.run``), forgotten once told."""
    with _LOCK:
        rows, nbytes, loads = _FETCHED.pop((run, dask_worker.address), (0, 0, 0))
    return rows, nbytes, loads
