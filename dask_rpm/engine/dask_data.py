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
"""

from __future__ import annotations

import dataclasses
from concurrent.futures import CancelledError
from typing import Any, NamedTuple

import numpy as np
from distributed import futures_of

from .._distributed import wait_async
from ..nn.chunked import LazySamples, as_chunked
from ..nn.data import DataError
from ..nn.options import TrainingOptions
from ..nn.recipe import holdout, one_hot
from ..planners.chunks import chunk_bounds
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
        by_key = {f.key: f for f in (*futures_of(x), *futures_of(d))}
        # one key per row chunk: both arrays have a single chunk across columns
        self.x_futures = [by_key[k[0]] for k in x.__dask_keys__()]
        self.d_futures = [by_key[k[0]] for k in d.__dask_keys__()]
        row_bytes = x.shape[1] * x.dtype.itemsize + d.shape[1] * d.dtype.itemsize
        self.chunk_bytes = [int(c) * int(row_bytes) for c in x.chunks[0]]
        self.moved: list[Moved] = []
        self._whole: dict[str, Any] = {}  # mini-batches: every training row, one task per worker

    def _indices(self, a: int, b: int) -> np.ndarray:
        """Data rows of training samples ``[a, b)``."""
        return np.arange(a, b) if self.rows is None else np.asarray(self.rows[a:b])

    async def samples(self, driver: Any, plan: Any, w: int) -> tuple[SampleSource, Any]:
        """Worker ``w``'s :class:`~dask_rpm.engine.samples.SampleSource` and the future of its
        rows: its column's range (full batch) or every training row (mini-batches, once per
        worker), cut on the worker from the chunks that hold them."""
        address = driver.addresses[w]
        if not driver.recipe.schedule.full_batch:
            have = self._whole.get(address)
            if have is None or have.status != "finished":
                n = plan.samples
                have = self._whole[address] = await self._rows(driver, w, self._indices(0, n))
            return SampleSource("arrays"), have
        s0, s1 = plan.rectangle(w).samples
        return SampleSource("slice"), await self._rows(driver, w, self._indices(s0, s1))

    async def _rows(self, driver: Any, w: int, idx: np.ndarray) -> Any:
        """A task pinned to worker ``w`` giving data rows ``idx`` of ``x`` and ``d``."""
        address = driver.addresses[w]
        need = np.unique(np.searchsorted(self.bounds, idx, side="right") - 1)
        xs = [self.x_futures[j] for j in need]
        ds = [self.d_futures[j] for j in need]
        try:
            holders = await driver.client.who_has([*xs, *ds])
        except CancelledError:  # a chunk lost for good (checked below)
            holders = {}
        gone = [(int(j), f) for j, f in zip([*need, *need], [*xs, *ds]) if not holders.get(f.key)]
        if gone:  # lost with a worker: Dask recomputes it, if it can (else a clear error now)
            await _recomputable(driver.client, gone)
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

    def stats(self) -> dict[str, Any]:
        """``FitResult.stats["dask"]``: the chunks, what moved to whom, the notes."""
        return {
            "chunks": len(self.x_futures),
            "chunk_rows": [int(c) for c in self.x.chunks[0]],
            "bytes_moved": int(sum(m.nbytes for m in self.moved)),
            "moved": [m._asdict() for m in self.moved],
            "notes": list(self.notes),
        }


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
    """Each key's state on the scheduler (``client.run_on_scheduler``; ``Scheduler.tasks`` and
    ``TaskState.state`` are documented in distributed's "Scheduling State"); None: unknown."""
    tasks = dask_scheduler.tasks
    return {k: (tasks[k].state if k in tasks else None) for k in keys}


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
    for field, what in (("network", "network="), ("sample_weight", "sample_weight=")):
        if getattr(o, field) is not None:
            raise DataError(
                f"{what} with dask data is not supported yet; compute the arrays first "
                f"(x.compute(), d.compute()) and pass numpy arrays"
            )
    pair = as_chunked(x, d)
    xd, dd = pair.x, pair.d
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
    xd, dd = _persisted(client, [xd, dd], ["x", "d"])
    _check_values(client, xd, dd, o)
    s, n, l = int(xd.shape[0]), int(xd.shape[1]), int(dd.shape[1])
    rows = None
    val = o.validation
    if val is not None and not isinstance(val, (tuple, list, bool)):
        rows, held = holdout(s, float(val), int(o.seed))
        xv, dv = client.compute([xd[held], dd[held]], sync=True)
        training = dataclasses.replace(training, validation=(np.asarray(xv), np.asarray(dv)))
        s = len(rows)
    holder = ChunkedRows(xd, dd, rows, pair.notes)
    chunks = tuple(int(c) for c in xd.chunks[0]) if rows is None else None
    return LazySamples((s, n, l), classes, chunks, holder), training


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
