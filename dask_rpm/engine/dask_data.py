"""Training on Dask's own data where its chunks live: persisted, located, moved worker to worker.

:func:`on_cluster` (on the client, before the run) turns a Dask user's data
(:mod:`dask_rpm.nn.chunked`: a ``dask.array``, xarray backed by dask, a zarr store) into
:class:`~dask_rpm.nn.chunked.LazySamples` for :func:`~dask_rpm.nn.prepare.prepare`: it
persists ``x`` and ``d`` on the workers (a collection already persisted keeps its chunks where
they are), finds and one-hot encodes 1-D class labels there, holds out a validation fraction
(only those rows reach the client) and checks the values with reductions on the cluster.

:class:`ChunkedRows` then gives each worker its samples, as the driver asks
(:meth:`ChunkedRows.samples`): one task pinned to the worker, depending on the chunk keys it
needs, cuts its rows out of them. Dask moves a chunk the worker does not hold from a worker
that does, never through the client; the bytes of every chunk that moves are counted
(``FitResult.stats["dask"]``). A column whose chunks its workers already hold moves nothing,
which is why the first plan's column cuts snap to chunk boundaries
(:func:`dask_rpm.planners.chunks.snap_to_chunks`).

With mini-batches a worker holds no more than a window of its column's rows: its
:class:`~dask_rpm.engine.chunk_reader.ChunkReader` (:class:`~dask_rpm.engine.samples.SampleSource` ``"chunks"``) fetches,
window after window of iterations, only the training samples its column uses in them
(:meth:`~dask_rpm.nn.batches.BatchSchedule.epoch_plan`), each straight from a worker that holds
its chunk (the ``rpm_chunk_rows`` handler there cuts the rows out; the client never sees them).
The shuffle is drawn on global sample indices, so the batches do not depend on the chunks;
the chunk-local shuffle (``shuffle="chunks"``) keeps a column's samples in its own range, whose
chunks it holds when they match the plan. Every worker counts the rows and bytes it fetched
from others; :meth:`ChunkedRows.collect` adds them to the stats at the end of the run.
"""

from __future__ import annotations

import dataclasses
from concurrent.futures import CancelledError
from typing import Any, NamedTuple

import numpy as np
from distributed import futures_of

from .. import config
from .._distributed import wait_async
from ..nn.chunked import LazySamples, as_chunked, chunk_order, chunked_weights
from ..nn.data import DataError
from ..nn.options import TrainingOptions
from ..nn.prepare import sample_weights
from ..nn.recipe import holdout, one_hot
from ..plan.partition import Plan
from ..planners.chunks import chunk_bounds, snap_to_chunks
from .chunk_reader import ChunkReader, RowServer, fetched_counts
from .samples import SampleSource

__all__ = ["ChunkedRows", "Moved", "on_cluster", "take_rows"]


class Moved(NamedTuple):
    """One chunk that moved to a worker for its samples (``nbytes`` of ``x`` and ``d``)."""

    worker: str
    chunk: int
    nbytes: int
    version: int  # the plan version (install or remap) that asked for it


class ChunkedRows:
    """``x`` and ``d`` persisted on the cluster, and who got which rows from where.

    Parameters
    ----------
    x, d : dask.array.Array
        Persisted, 2-D, with the same row chunks and one chunk across columns.
    rows : numpy.ndarray or None
        Training sample ``i`` is data row ``rows[i]`` (a validation split); None: row ``i``.
    notes : tuple of str
        What was changed on the way (rechunks), for the stats.
    """

    def __init__(self, x: Any, d: Any, rows: np.ndarray | None, notes: tuple[str, ...]) -> None:
        self.x, self.d, self.rows, self.notes = x, d, rows, notes
        self.bounds = chunk_bounds(x.chunks[0])
        self.chunk_rows = [int(c) for c in x.chunks[0]]
        by_key = {f.key: f for f in (*futures_of(x), *futures_of(d))}
        # one key per row chunk: both arrays have a single chunk across columns
        self.x_futures = [by_key[k[0]] for k in x.__dask_keys__()]
        self.d_futures = [by_key[k[0]] for k in d.__dask_keys__()]
        row_bytes = x.shape[1] * x.dtype.itemsize + d.shape[1] * d.dtype.itemsize
        self.chunk_bytes = [int(c) * int(row_bytes) for c in x.chunks[0]]
        self.row_bytes = int(row_bytes)
        self.moved: list[Moved] = []
        #: mini-batches: what each worker fetched from others (rows, bytes, loads), from collect
        self.fetched: dict[str, list[int]] = {}
        self._served = False  # whether the workers serve rows of chunks (RowServer)
        self._reader: ChunkReader | None = None
        self._held: tuple[int, dict] | None = None  # (plan version, who holds each chunk)

    def snapped(self, plan: Plan, schedule: Any) -> Plan:
        """``plan`` with its column cuts on chunk boundaries where that pays
        (:func:`~dask_rpm.planners.chunks.snap_to_chunks`, within ``rpm.planner.chunk-imbalance``).

        Full batch and the chunk-local shuffle read each column's sample range, so a column on
        whole chunks reads them where they live; other mini-batches draw every column's rows
        from every chunk and gain nothing. Training rows picked by a validation split do not
        follow the chunks: ``plan`` as it is then.
        """
        if self.rows is not None or not (schedule.full_batch or schedule.local):
            return plan
        tolerance = float(config.get("planner.chunk-imbalance"))
        return snap_to_chunks(plan, self.chunk_rows, tolerance)

    def _indices(self, a: int, b: int) -> np.ndarray:
        """Data rows of training samples ``[a, b)``."""
        return np.arange(a, b) if self.rows is None else np.asarray(self.rows[a:b])

    async def samples(self, driver: Any, plan: Any, w: int) -> tuple[SampleSource, Any]:
        """Worker ``w``'s :class:`~dask_rpm.engine.samples.SampleSource` and the future of its
        rows: its column's range (full batch), cut on the worker from the chunks that hold them,
        or (mini-batches) a :class:`~.chunk_reader.ChunkReader` that fetches each window's rows itself."""
        if not driver.recipe.schedule.full_batch:
            if not self._served:  # every worker serves the chunks it holds, new ones too
                await driver.client.register_plugin(RowServer())
                self._served = True
            if self._reader is None:
                self._reader = ChunkReader(
                    driver.run,
                    tuple(f.key for f in self.x_futures),
                    tuple(f.key for f in self.d_futures),
                    self.bounds,
                    self.rows,
                    _window_rows(self.row_bytes),
                    self.row_bytes,
                    int(driver.recipe.iterations),
                )
            # every chunk may be read: one lost for good is a clear error now, not a reader
            # asking for it until it gives up
            everything = np.arange(len(self.x_futures))
            await self._check_held(driver, everything, self.x_futures, self.d_futures)
            return SampleSource("chunks", reader=self._reader), None
        s0, s1 = plan.rectangle(w).samples
        return SampleSource("slice"), await self._rows(driver, w, self._indices(s0, s1))

    async def _rows(self, driver: Any, w: int, idx: np.ndarray) -> Any:
        """A task pinned to worker ``w`` giving data rows ``idx`` of ``x`` and ``d``."""
        address = driver.addresses[w]
        need = np.unique(np.searchsorted(self.bounds, idx, side="right") - 1)
        xs = [self.x_futures[j] for j in need]
        ds = [self.d_futures[j] for j in need]
        holders = await self._check_held(driver, need, xs, ds)
        for j, f in zip(need.tolist(), xs):
            if address not in holders.get(f.key, ()):
                self.moved.append(Moved(address, j, self.chunk_bytes[j], driver.version))
        driver.tasks_submitted += 1
        return driver.client.submit(
            take_rows,
            self.bounds[need],
            idx,
            *xs,
            *ds,
            key=(f"rpm-rows-{driver.run}", driver.version, w),
            workers=[address],
            allow_other_workers=False,
            pure=False,
        )

    async def _check_held(self, driver: Any, need: Any, xs: list, ds: list) -> dict:
        """Who holds each chunk (:meth:`_holders`), after checking that chunks ``need`` (their
        futures ``xs`` of x, ``ds`` of d) that no worker holds, lost with a worker, are ones
        Dask computes again (else a clear :class:`DataError`)."""
        holders = await self._holders(driver)
        gone = [(int(j), f) for j, f in zip([*need, *need], [*xs, *ds]) if not holders.get(f.key)]
        if gone:
            await _recomputable(driver.client, gone)
        return holders

    async def _holders(self, driver: Any) -> dict:
        """Who holds each chunk as the plan of ``driver.version`` is placed: asked once per
        plan, so a chunk that one worker's rows task copied (and that the active memory manager
        may then thin out) does not count as held elsewhere for the next worker."""
        if self._held is None or self._held[0] != driver.version:
            try:
                held = await driver.client.who_has([*self.x_futures, *self.d_futures])
            except CancelledError:  # a chunk lost for good (checked by the caller)
                held = {}
            self._held = (driver.version, held)
        return self._held[1]

    async def collect(self, driver: Any) -> None:
        """At the end of the run: add what each live worker fetched from others for its
        mini-batches to :attr:`fetched` (a worker lost on the way took its counts with it), and
        let go of the chunks this run persisted. The driver holds this object in a reference
        cycle: the chunks would stay in the workers' memory until Python's cyclic garbage
        collector ran. A collection the caller persisted keeps its own references."""
        if self._reader is not None:
            got = await driver.client.run(fetched_counts, driver.run)
            for address, (rows, nbytes, loads) in got.items():
                mine = self.fetched.setdefault(address, [0, 0, 0])
                mine[0], mine[1], mine[2] = mine[0] + rows, mine[1] + nbytes, mine[2] + loads
        self.x = self.d = None
        self.x_futures, self.d_futures = [], []

    def stats(self) -> dict[str, Any]:
        """``FitResult.stats["dask"]``: the chunks, what moved to whom, the notes.

        ``bytes_moved`` counts both ways rows reach a worker from another: whole chunks for a
        full-batch column (``moved``) and the mini-batch rows fetched window by window
        (``fetched``: per worker ``rows``, ``bytes``, ``loads``; ``rows_moved`` their sum).
        """
        fetched = {
            a: {"rows": r, "bytes": b, "loads": n} for a, (r, b, n) in sorted(self.fetched.items())
        }
        return {
            "chunks": len(self.chunk_rows),
            "chunk_rows": list(self.chunk_rows),
            "bytes_moved": int(sum(m.nbytes for m in self.moved))
            + int(sum(f["bytes"] for f in fetched.values())),
            "rows_moved": int(sum(f["rows"] for f in fetched.values())),
            "moved": [m._asdict() for m in self.moved],
            "fetched": fetched,
            "window_rows": None if self._reader is None else int(self._reader.window),
            "notes": list(self.notes),
        }


def _window_rows(row_bytes: int) -> int:
    """Rows per mini-batch load: ``rpm.engine.sample-window`` bytes of them (at least one)."""
    from dask.utils import parse_bytes

    value = config.get("engine.sample-window")
    try:
        limit = parse_bytes(value) if isinstance(value, str) else int(value)
    except (TypeError, ValueError):
        limit = -1
    if limit < 1:
        raise DataError(
            f"rpm.engine.sample-window={value!r}; give the bytes of rows a worker loads at once "
            f"for its mini-batches of Dask data (a number or a size such as '64 MiB')"
        )
    return max(1, limit // max(int(row_bytes), 1))


async def _recomputable(client: Any, gone: list[tuple[int, Any]]) -> None:
    """Chunks no worker holds (lost with the worker that held them) must be ones Dask can compute
    again: a :class:`DataError` for the first that it cannot, instead of a task that waits for it
    forever. ``gone`` pairs each chunk's index with its future."""
    states = await client.run_on_scheduler(_task_states, [f.key for _, f in gone])
    for j, f in gone:
        state = states.get(f.key)
        if f.status == "cancelled" or state in (None, "forgotten"):
            raise DataError(
                f"chunk {j} of the training data (key {f.key!r}) was lost with the worker that "
                f"held it, and Dask cannot compute it again: no task makes it (data scattered "
                f"with client.scatter, or futures). Build x and d from tasks Dask can rerun "
                f"(da.from_array, da.from_zarr, xarray.open_zarr or open_mfdataset) or keep a "
                f"second copy (client.replicate), and call fit again"
            )
        if state == "no-worker":
            raise DataError(
                f"chunk {j} of the training data (key {f.key!r}) was lost with the worker that "
                f"held it, and no worker in the cluster may compute it again: its task may run "
                f"only on workers that have left (dask.annotate(workers=..., "
                f"allow_other_workers=False)). Persist x and d with allow_other_workers=True "
                f"(the chunks still start where you put them) and call fit again"
            )


def _task_states(keys: list[Any], dask_scheduler: Any = None) -> dict[Any, str | None]:
    """Each key's state on the scheduler (``client.run_on_scheduler``; ``Scheduler.tasks``,
    ``TaskState.state`` and ``waiting_on`` are documented in distributed's "Scheduling State");
    None: unknown. ``"no-worker"`` also for a key waiting, directly or not, on a task in that
    state: a lost chunk is computed again from tasks (the reads it was made from) that may be
    the ones no worker may run."""
    tasks = dask_scheduler.tasks

    def state(ts: Any) -> str:
        todo, seen = [ts], {ts.key}
        while todo:
            t = todo.pop()
            if t.state == "no-worker":
                return "no-worker"
            for dep in t.waiting_on or ():
                if dep.key not in seen:
                    seen.add(dep.key)
                    todo.append(dep)
        return str(ts.state)

    return {k: (state(tasks[k]) if k in tasks else None) for k in keys}


def take_rows(
    starts: np.ndarray, idx: np.ndarray, *blocks: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Rows ``idx`` of ``x`` and ``d`` from their chunks (on a worker).

    ``blocks`` are the chunks of ``x`` that hold the rows, then those of ``d``, in row order;
    ``starts`` the data row where each begins.
    """
    k = len(starts)
    xs, ds = blocks[:k], blocks[k:]
    offsets = np.concatenate([[0], np.cumsum([b.shape[0] for b in xs])])
    j = np.searchsorted(starts, idx, side="right") - 1
    pos = offsets[j] + (idx - np.asarray(starts)[j])
    x = xs[0] if k == 1 else np.concatenate(xs)
    d = ds[0] if k == 1 else np.concatenate(ds)
    if pos.size and np.array_equal(pos, np.arange(pos[0], pos[0] + pos.size)):
        return x[pos[0] : pos[0] + pos.size], d[pos[0] : pos[0] + pos.size]  # a range: views
    return x[pos], d[pos]


def _one_hot_block(labels: np.ndarray, classes: np.ndarray) -> np.ndarray:
    """One chunk of labels as one-hot rows (on a worker; the classes found on the cluster)."""
    return one_hot(labels, classes)[0]


def _persisted(client: Any, arrays: list[Any], names: list[str]) -> list[Any]:
    """``arrays`` persisted and computed on the cluster; a chunk whose task failed raises one
    :class:`DataError` naming its key and the cause."""
    out = client.persist(arrays)
    for arr, name in zip(out, names):
        futures = futures_of(arr)
        client.sync(wait_async, futures)  # this client's, not the default one
        for f in futures:
            if f.status == "error":
                exc = f.exception()
                raise DataError(
                    f"computing chunk {f.key!r} of {name} failed: {type(exc).__name__}: {exc}. "
                    f"Fix the tasks that make {name} ({name}.compute() shows the same error) "
                    f"and call fit again"
                )
    return list(out)


def on_cluster(
    client: Any, x: Any, d: Any, training: TrainingOptions
) -> tuple[LazySamples, TrainingOptions]:
    """Dask's data, persisted and checked on the cluster, as :func:`~dask_rpm.nn.prepare.prepare`
    takes them; ``training`` with a validation fraction replaced by its rows (computed from the
    cluster: the same rows :func:`~dask_rpm.nn.serial.fit_serial` holds out)."""
    import dask.array as da  # imported with dask data only

    o: Any = training.resolved()  # the rpm.train.* defaults filled in
    pair = as_chunked(x, d)
    xd, dd = pair.x, pair.d
    image = None
    if xd.ndim == 4:  # a CNN's images travel as rows, one flattened image each
        if o.network is None:
            raise DataError(
                f"x has shape {xd.shape}: images (samples, channels, height, width) train a "
                f"CNN: pass network= (conv layers), or give an MLP x as (samples, inputs), "
                f"e.g. x.reshape(x.shape[0], -1)"
            )
        image = (int(xd.shape[1]), int(xd.shape[2]), int(xd.shape[3]))
        xd = xd.reshape(xd.shape[0], -1)
    classes = None
    if dd.ndim == 1:
        if o.loss != "cross-entropy":
            raise DataError(
                f"d is 1-D (shape {dd.shape}); class labels need loss='cross-entropy', "
                f"other losses take d as (samples, outputs)"
            )
        (dd,) = _persisted(client, [dd], ["d"])
        classes = np.unique(client.compute(da.unique(dd)).result())
        dd = dd.map_blocks(
            _one_hot_block,
            classes,
            new_axis=1,
            chunks=(dd.chunks[0], (len(classes),)),
            dtype=np.float64,
        )
    l = int(dd.shape[1])
    weights = None
    if o.sample_weight is not None and o.network is None:  # a CNN's: refused by prepare
        # persisted first: brought here and joined to d below, its tasks run once
        wd = chunked_weights(o.sample_weight, xd.chunks[0])
        (wd,) = _persisted(client, [wd], ["sample_weight"])
        weights = sample_weights(client.compute(wd, sync=True), int(xd.shape[0]))
        # the weights ride in the targets' last column (dask_rpm.nn.network), chunk by chunk
        dd = da.concatenate([dd.astype(np.float64), wd.astype(np.float64)[:, None]], axis=1)
        dd = dd.rechunk({1: -1})  # one chunk across columns, as the rows' holder takes them
    xd, dd = _persisted(client, [xd, dd], ["x", "d"])
    _check_values(client, xd, dd[:, :l], o)
    s, n = int(xd.shape[0]), int(xd.shape[1])
    rows = held_out = None
    val = o.validation
    if val is not None and not isinstance(val, (tuple, list, bool)):
        rows, held = holdout(s, float(val), int(o.seed))
        xv, dv = client.compute([xd[held], dd[held]], sync=True)
        held_out = (np.asarray(xv), np.asarray(dv))  # weighted: the held-out rows keep theirs
        weights = None if weights is None else weights[rows]
        s = len(rows)
    if isinstance(o.shuffle, str) and o.shuffle in ("chunks", "stream"):  # over the chunks
        order = chunk_order(xd.chunks[0], rows, o.shuffle == "stream")
        training = dataclasses.replace(training, shuffle=order)
    holder = ChunkedRows(xd, dd, rows, pair.notes)
    lazy = LazySamples((s, n, l), classes, holder, image, weights, held_out)
    return lazy, training


def _check_values(client: Any, x: Any, d: Any, o: Any) -> None:
    """Finite inputs and targets, and cross-entropy targets that are distributions: reductions
    on the cluster (a few numbers reach the client)."""
    import dask.array as da  # imported with dask data only

    checks = [da.isfinite(x).all(), da.isfinite(d).all()]
    if o.loss == "cross-entropy" and o.output != "sigmoid":
        checks += [(d >= 0).all(), (abs(d.sum(axis=1) - 1.0) <= 1e-9).all()]
    got = [bool(v) for v in client.compute(checks, sync=True)]
    for ok, name in zip(got[:2], ("x", "d")):
        if not ok:
            raise DataError(f"{name} contains NaN or infinite values; remove or fill them")
    if not all(got[2:]):
        raise DataError(
            "with loss='cross-entropy' every row of d must be >= 0 and sum to 1 (one-hot or class "
            "probabilities); pass 1-D integer labels to have them one-hot encoded"
        )
