"""A worker's samples: what its column takes of each iteration's (mini-)batch.

Pure (numpy; the dataset reader in :mod:`dask_rpm.nn.data`): no ``distributed``.

How samples reach the workers
-----------------------------
* **Full batch** (the paper's): a column always uses the same samples, its
  plan range ``[a, b)``. From in-memory arrays the driver sends each worker
  just that slice; from a dataset file each worker reads just that slice.
* **Mini-batches**: column ``c`` takes its share of every batch
  (:mod:`dask_rpm.nn.batches`), and the batches are drawn from the whole
  training set. From in-memory arrays every worker holds the whole training
  set (as in the paper, where every processor holds it; the driver
  sends each worker its copy once, and again only to a worker new to the run). From a dataset file on shared storage each worker
  reads, at the start of each epoch, only the rows its column will use in
  that epoch, about ``(b - a) / s`` of the file — so a training set larger
  than one worker's memory trains from a file, each worker holding its
  share, never the whole. From Dask chunks on the cluster
  (:mod:`dask_rpm.engine.dask_data`) each worker likewise fetches only the rows
  its column uses, from the workers that hold them, in windows of iterations of
  at most ``rpm.engine.sample-window`` bytes (a window, not the epoch: a
  column's share of an epoch may be more than the worker's memory), the next
  window fetched while the current one trains (so a worker holds two); with the
  chunk-local shuffle (``shuffle="chunks"``) those rows are its own chunks'.

Either way the rows of one iteration are a contiguous slice of an array the
worker already holds, so an iteration copies no samples.

Sparse inputs (scipy CSR, :mod:`dask_rpm.nn.sparse`) stay sparse on the way: the driver's
column slices and the copies of the training set are CSR rows, and a numpy worker keeps its
rows as CSR, its first layer multiplying them as they are; a torch or cupy worker densifies
its rows once per load, since its products take dense operands. Sample weights ride in the
targets' last column (:mod:`dask_rpm.nn.network`): they reach a column with its samples.
"""

from __future__ import annotations

import contextvars
import threading
from typing import Any, NamedTuple

import numpy as np

from ..nn import sparse
from ..nn.backend import NUMPY, Backend
from ..nn.batches import BatchSchedule
from ..nn.data import load_rows, load_slice
from ..nn.network import Network

__all__ = ["SampleSource", "ColumnData"]


class SampleSource(NamedTuple):
    """Where a worker gets samples from.

    ``kind`` is ``"slice"`` (``x``, ``d`` are the column's full-batch range),
    ``"arrays"`` (``x``, ``d`` are the whole training set), ``"range"`` (mini-batches within
    the column's range, whose rows ``x``, ``d`` are: the chunk-local shuffle), ``"file"``
    (``path``; ``rows`` maps training sample ``i`` to file row ``rows[i]``,
    None: the identity) or ``"chunks"`` (mini-batches: ``reader.take(idx)``
    gives training samples ``idx`` as ``(x, d)``, at most ``reader.window``
    rows a load, none for iterations from ``reader.last`` on).
    """

    kind: str
    x: Any = None
    d: Any = None
    path: str | None = None
    rows: Any = None
    reader: Any = None


class ColumnData:
    """The samples of one column, served iteration by iteration.

    Parameters
    ----------
    source : SampleSource
    cut : (int, int)
        The column's sample range in the plan (of ``schedule.samples``).
    schedule : BatchSchedule
    net : Network
        Appends the constant bias input when the network has bias terms.
    dtype : str
    backend : Backend
        Where the samples are placed for the kernels (default numpy).
    """

    def __init__(
        self,
        source: SampleSource,
        cut: tuple[int, int],
        schedule: BatchSchedule,
        net: Network,
        dtype: str,
        backend: Backend = NUMPY,
    ) -> None:
        self.source, self.cut, self.schedule, self.net, self.dtype = (
            source,
            tuple(cut),
            schedule,
            net,
            dtype,
        )
        self.backend = backend
        self._x: np.ndarray | None = None
        self._d: np.ndarray | None = None
        self._first = 0  # iteration whose rows start at offset 0
        self._stop = 0  # the first iteration past the rows loaded
        self._offsets: list[int] = []
        self._epoch: int | None = None
        self._ahead: _Ahead | None = None  # the next window's rows, being fetched meanwhile
        # an in-memory training set's rows are gathered into these from one load to the next:
        # a fresh epoch-sized array at every epoch is page faults on every page (a worker maps
        # large arrays anew: dask_rpm.runtime.allocator), more than the copy itself
        self._rows: tuple[np.ndarray, np.ndarray] | None = None

    @property
    def capacity(self) -> int:
        """Most rows one iteration can have (kernel buffers are sized for it)."""
        return self.schedule.capacity(self.cut)  # type: ignore[arg-type]

    @property
    def nbytes(self) -> int:
        if self._x is None or self._d is None:
            return 0
        return sparse.nbytes(self._x) + int(self._d.nbytes)

    def _take(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        src = self.source
        if src.kind == "arrays":
            x = sparse.take(src.x, idx) if sparse.issparse(src.x) else np.asarray(src.x)[idx]
            return x, np.asarray(src.d)[idx]
        if src.kind == "file":
            rows = idx if src.rows is None else np.asarray(src.rows)[idx]
            return load_rows(src.path, rows, self.dtype)  # type: ignore[arg-type]
        if src.kind == "chunks":
            return src.reader.take(idx)
        if src.kind == "range":
            j = np.asarray(idx) - self.cut[0]
            return src.x[j], src.d[j]
        raise ValueError(f"a {src.kind!r} sample source cannot serve mini-batches")

    def _gather(self, idx: np.ndarray) -> bool:
        """Rows ``idx`` of an in-memory dense training set into the buffers of the last load (made
        or grown when too small), the bias input appended; False where this does not apply (sparse
        rows, another source or backend, a cast, images), and :meth:`_take` serves them."""
        src = self.source
        if src.kind != "arrays" or self.backend.name != "numpy" or sparse.issparse(src.x):
            return False
        x, d = np.asarray(src.x), np.asarray(src.d)
        if x.ndim != 2 or d.ndim != 2 or x.dtype != self.dtype or d.dtype != self.dtype:
            return False
        k, n = len(idx), x.shape[1]
        width = n + 1 if self.net.bias else n
        rows = self._rows
        if rows is None or rows[0].shape[0] < k or rows[0].shape[1] != width:
            rows = (np.empty((k, width), x.dtype), np.empty((k, d.shape[1]), d.dtype))
            if self.net.bias:
                rows[0][:, n] = 1.0
            self._rows = rows
        bx, bd = rows[0][:k], rows[1][:k]
        # a block of rows at a time through a small contiguous buffer: numpy's take into the
        # strided columns [:, :n] would buffer the whole result. take's own loop is slow on
        # unaligned data (1.8 s for 125 MB, against 0.02 s), and a training set received in a
        # message may start at any byte: there, indexing (a block-sized temporary) instead
        step = max(1, 2**17 // max(n, 1))
        part = np.empty((min(step, k), n), x.dtype)
        for a in range(0, k, step):
            i = idx[a : a + step]
            if x.flags.aligned:  # (valid indices: no check)
                bx[a : a + len(i), :n] = np.take(x, i, axis=0, out=part[: len(i)], mode="clip")
            else:
                bx[a : a + len(i), :n] = x[i]
        if d.flags.aligned:
            np.take(d, idx, axis=0, out=bd, mode="clip")
        else:
            bd[...] = d[idx]
        self._x, self._d = bx, bd
        return True

    def _load_full(self) -> None:
        src = self.source
        a, b = self.cut
        xs = src.x if sparse.issparse(src.x) else np.asarray(src.x)
        if src.kind == "slice":
            x, d = xs, np.asarray(src.d)
        elif src.kind == "arrays":
            x, d = xs[a:b], np.asarray(src.d)[a:b]
        elif src.rows is None:
            x, d = load_slice(src.path, a, b, self.dtype)  # type: ignore[arg-type]
        else:
            x, d = load_rows(src.path, np.asarray(src.rows)[a:b], self.dtype)  # type: ignore[arg-type]
        self._set(x, d)
        self._epoch = -1

    def _set(self, x: np.ndarray, d: np.ndarray) -> None:
        # on the worker's backend once per load: every iteration's batch is a view of these
        be = self.backend
        if sparse.issparse(x):
            self._x = sparse.placed(be, self.net.augment(sparse.as_csr(x, self.dtype)))
        else:
            self._x = be.asarray(self.net.augment(np.ascontiguousarray(x, dtype=self.dtype)))
        self._d = be.asarray(np.ascontiguousarray(d, dtype=self.dtype))

    def ready(self, iteration: int) -> bool:
        """Whether :meth:`batch` of ``iteration`` needs no loading."""
        if self.schedule.full_batch:
            return self._x is not None
        return (
            self._epoch == self.schedule.epoch(iteration) and self._first <= iteration < self._stop
        )

    def load(self, iteration: int) -> None:
        """Load what ``iteration`` (and the rest of its epoch, or of its window) needs."""
        if self.schedule.full_batch:
            self._load_full()
            return
        sched = self.schedule
        a, b = self.cut
        if self.source.kind == "chunks" and sched.local and b - a <= self.source.reader.window:
            # the chunk-local shuffle draws every epoch's rows from the column's own range: held
            # whole, they are fetched once (from the chunks' holders), not window by window
            x, d = self.source.reader.take(np.arange(a, b))
            self.source = SampleSource("range", x=x, d=d)
        e = sched.epoch(iteration)
        stop = self._window_end(iteration)
        idx, self._offsets = sched.epoch_plan(e, self.cut, start=iteration, stop=stop)  # type: ignore[arg-type]
        self._x = self._d = None  # the last window's rows are not needed: free them first
        ahead, self._ahead = self._ahead, None
        rows = ahead.result() if ahead is not None and ahead.start == iteration else None
        if rows is not None:
            self._set(*rows)
        elif not self._gather(idx):
            self._set(*self._take(idx))
        self._epoch, self._first, self._stop = e, iteration, stop
        if self.source.kind == "chunks" and stop < self.source.reader.last:
            # the next window's rows come while this one trains (none past the run's end)
            following, _ = sched.epoch_plan(
                sched.epoch(stop),
                self.cut,  # type: ignore[arg-type]
                start=stop,
                stop=self._window_end(stop),
            )
            self._ahead = _Ahead(stop, self._take, following)

    def _window_end(self, iteration: int) -> int:
        """The first iteration past the window that starts at ``iteration``: its epoch's end, or
        (rows fetched from Dask chunks) as many iterations as ``reader.window`` rows hold."""
        sched = self.schedule
        end = (sched.epoch(iteration) + 1) * sched.per_epoch
        if self.source.kind != "chunks":
            return end
        per = max(sched.capacity(self.cut), 1)  # type: ignore[arg-type]
        return min(end, iteration + max(1, int(self.source.reader.window) // per))

    def batch(self, iteration: int) -> tuple[np.ndarray, np.ndarray]:
        """The column's rows of ``iteration`` (views; bias input appended)."""
        if not self.ready(iteration):
            self.load(iteration)
        assert self._x is not None and self._d is not None
        if self.schedule.full_batch:
            return self._x, self._d
        j = iteration - self._first
        lo, hi = self._offsets[j], self._offsets[j + 1]
        return self._x[lo:hi], self._d[lo:hi]


class _Ahead:
    """The rows of the window that starts at iteration ``start``, fetched in a thread meanwhile
    (in the loading thread's context: the worker it runs on). A fetch that failed gives None:
    the load that wanted the rows fetches them itself, and raises what fails."""

    def __init__(self, start: int, take: Any, idx: np.ndarray) -> None:
        self.start = start
        self._rows: tuple[np.ndarray, np.ndarray] | None = None
        ctx = contextvars.copy_context()
        self._thread = threading.Thread(
            target=ctx.run, args=(self._run, take, idx), name="rpm-rows-ahead", daemon=True
        )
        self._thread.start()

    def _run(self, take: Any, idx: np.ndarray) -> None:
        try:
            self._rows = take(idx)
        except Exception:  # fetched again by the load that wants them, which raises it
            self._rows = None

    def result(self) -> tuple[np.ndarray, np.ndarray] | None:
        """The rows, once fetched (waits for the thread)."""
        self._thread.join()
        return self._rows
