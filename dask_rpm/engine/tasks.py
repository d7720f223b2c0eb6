"""Functions the driver runs on the workers: Dask tasks (pinned) and ``client.run`` calls.

Tasks carry data (weights, samples, results) and are keyed
``("rpm-<what>-<run>", <block or version>, <worker>)`` so the task stream
shows ``rpm-block``, ``rpm-setup``, ``rpm-remap`` and ``rpm-gather``; the
``run_*`` functions are small control calls executed on the worker's event
loop through ``client.run`` (they touch only flags and buffer pointers).
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any

import numpy as np

from .. import config
from ..nn import backend as xb
from ..nn.data import DataError
from ..nn.recipe import Recipe
from ..runtime.allocator import kernel_buffers
from ..runtime.hooks import worker_hooks
from ..runtime.threads import kernel_threads
from .block import run_block
from .layout import layout_layers
from .peers import call_peer
from .records import BlockResult, BlockSpec, Layout, RunSpec
from .samples import ColumnData, SampleSource
from .store import StoreRows, file_digest, read_rows, write_mark, write_rows
from .worker import PLUGIN_NAME, RunState, Shard, get_state, held_rows

__all__ = [
    "t_setup",
    "t_block",
    "t_stage",
    "t_gather",
    "t_restore",
    "run_commit",
    "run_holdings",
    "run_rollback",
    "run_revert",
    "run_abort",
    "run_clear",
    "run_copy_peak",
    "run_deadline",
    "run_write_rows",
]


def _worker() -> Any:
    from distributed import get_worker

    return get_worker()


def _backend(placement: tuple[str, str]) -> xb.Backend:
    """The backend this worker trains with, for the ``(backend, device)`` names of the run
    (``auto`` resolved here: a worker with a GPU uses it; :func:`~dask_rpm.nn.backend.resolve`)."""
    # rpm.engine.cpu-backend, which "auto" reads, is a per-node setting read here, on the worker;
    # it is part of the key: it can change in the process
    return _resolve(tuple(placement), config.get("engine.cpu-backend"))


@functools.cache
def _resolve(placement: tuple[str, ...], cpu_backend: Any) -> xb.Backend:
    return xb.resolve(*placement)


def _column(
    samples: SampleSource, data: Any, layout: Layout, spec: RunSpec, be: xb.Backend
) -> ColumnData:
    """The column's samples (:class:`~dask_rpm.engine.samples.ColumnData`); ``data`` is the
    ``(x, d)`` the driver scattered for an ``arrays`` or ``slice`` source (None for a file)."""
    if data is not None:
        samples = samples._replace(x=data[0], d=data[1])
    return ColumnData(
        samples, layout.samples, spec.recipe.schedule, spec.recipe.net, spec.dtype, be
    )


def _layers(layout: Layout, recipe: Recipe) -> Any:
    """The network's geometry: a CNN's travels in its recipe, an MLP's sizes in the layout."""
    return recipe.layers if recipe.layers is not None else layout_layers(layout)


def _shard(rows: dict[str, Any], layout: Layout, recipe: Recipe, be: xb.Backend) -> Shard:
    """A shard from :func:`~dask_rpm.engine.worker.rows_of`; without optimizer state (the start of
    training) the optimizer's state starts at zero."""
    layers, origin = _layers(layout, recipe), layout.rows[0]
    if rows["state"]:  # a checkpoint's
        return Shard(layers, origin, rows["params"], rows["state"], be)
    return Shard.fresh(layers, origin, rows["params"], recipe.optimizer, be)


def t_setup(
    spec: RunSpec,
    layout: Layout,
    weights: dict[str, Any] | StoreRows,
    samples: SampleSource,
    data: Any,
    iteration: int,
) -> int | DataError:
    """Create this worker's state for a run: its shard and its samples, on the backend the
    run's ``spec`` places it; returns the bytes read from a checkpoint store, or the
    :class:`~dask_rpm.nn.data.DataError` its samples (or a backend this worker cannot run) raised.

    ``weights`` are the shard's rows the driver scattered, or which rows of a
    checkpoint store to read (:class:`~dask_rpm.engine.store.StoreRows`):
    then this worker reads them itself, checked against the manifest. ``samples`` says where
    the column's samples come from; ``data`` is what the driver scattered for them, or None.
    """
    worker = _worker()
    plugin = worker.plugins[PLUGIN_NAME]
    read = 0
    if isinstance(weights, StoreRows):
        weights = read_rows(weights, spec.dtype)
        read = weights.pop("bytes")
    try:
        be = _backend(spec.placement)
        column = _column(samples, data, layout, spec, be)
        column.load(iteration)  # bad values in a dataset file are found here, before the first one
    except DataError as exc:
        # the user's data, not a failure of the task: returned, so the worker logs no "Compute
        # Failed" traceback, and the driver raises it as one line
        return exc
    shard = _shard(weights, layout, spec.recipe, be)
    state = RunState(worker, layout, shard, column, spec)
    state.iteration = iteration
    state.copies = plugin.keeper(layout.run, shard.layers)
    state.copies.drop_after(iteration)  # copies of later iterations are of a past run over
    old = plugin.runs.get(layout.run)
    if old is not None:  # a recovery from a checkpoint: keep the epoch floor
        state.mailbox.epoch = old.mailbox.epoch
    plugin.runs[layout.run] = state
    return int(read)


async def t_block(run: str, spec: BlockSpec) -> BlockResult:
    """One block of iterations on this worker (:func:`dask_rpm.engine.block.run_block`), on its event loop."""
    worker = _worker()
    state = get_state(run, worker)
    # a paced (EMULATED) kernel sleeps, and must not sleep on the event loop; a GPU's kernels
    # hold the loop only while the host waits for them
    on_cpu, on_gpu, emulated = state.spec.inline_work
    if worker_hooks(worker).paced:
        inline_work = emulated
    elif state.shard.backend.device != "cpu":
        inline_work = on_gpu
    else:
        inline_work = on_cpu
    async with state.busy:
        # the worker's cores, not the one thread its nanny leaves BLAS (dask_rpm.runtime.threads),
        # and the kernels' buffers reused, not remapped (dask_rpm.runtime.allocator)
        with kernel_threads(spec.threads or worker.state.nthreads) as threads, kernel_buffers():
            res = await run_block(
                state,
                spec,
                log=lambda msg: worker.log_event("rpm", msg),
                inline_work=inline_work,
            )
        return res._replace(threads=threads, backend=state.shard.backend.label)


def t_stage(
    spec: RunSpec,
    layout: Layout,
    pieces: list[tuple[int, int, str | None]],
    samples: SampleSource | None,
    data: Any,
    iteration: int,
) -> int:
    """Build this worker's shard of a new plan: keep own rows, fetch the others from their holders.

    ``pieces`` are ``(a, b, source)`` covering the new rows in order, ``source``
    ``None`` for rows held here; the others are fetched worker to worker
    (``rpm_rows`` on the source, which serves its *current* shard until every
    stage task is done and the new shards are committed). Optimizer state
    travels with its rows. ``samples`` is None when the sample range is unchanged.
    """
    worker = _worker()
    state = worker.plugins[PLUGIN_NAME].runs.get(spec.run)

    async def fetch(a: int, b: int, src: str) -> dict[str, Any]:
        return await call_peer(worker, src, "rpm_rows", run=spec.run, a=a, b=b)

    def get(a: int, b: int, src: str | None) -> Any:
        return state.shard.rows(a, b) if src is None else _sync(worker, fetch, a, b, src)

    shard = _assemble(worker, spec, layout, [(a, b, (a, b, src)) for a, b, src in pieces], get)
    _stage(worker, spec, layout, shard, samples, data, iteration)
    return layout.worker


def t_restore(
    spec: RunSpec,
    layout: Layout,
    pieces: list[tuple[int, int, str, str]],
    samples: SampleSource | None,
    data: Any,
    iteration: int,
) -> int:
    """Build this worker's shard of a new plan at iteration ``iteration`` from what the live
    workers hold of it: buddy copies, own copies, live shards (a recovery,
    :func:`dask_rpm.engine.recovery.rebalance`); returns the bytes fetched from other workers.

    ``pieces`` are ``(a, b, holder, kind)`` covering the new rows in order
    (:func:`dask_rpm.engine.buddies.pieces_for`); a piece this worker holds is read here, the
    others through ``rpm_copy`` on their holder. Staged like :func:`t_stage`'s shard, switched
    to by :func:`run_commit`.
    """
    worker = _worker()
    plugin = worker.plugins[PLUGIN_NAME]
    fetched = 0

    async def fetch(a: int, b: int, holder: str, kind: str) -> dict[str, Any]:
        return await call_peer(
            worker, holder, "rpm_copy", run=spec.run, iteration=iteration, a=a, b=b, kind=kind
        )

    def get(a: int, b: int, holder: str, kind: str) -> Any:
        nonlocal fetched
        if holder == worker.address:
            return held_rows(plugin, spec.run, iteration, a, b, kind)
        got = _sync(worker, fetch, a, b, holder, kind)
        fetched += sum(np.asarray(_unwrap(p)).nbytes for p in got["params"])
        fetched += sum(np.asarray(_unwrap(p)).nbytes for v in got["state"].values() for p in v)
        return got

    shard = _assemble(worker, spec, layout, [(a, b, (a, b, h, k)) for a, b, h, k in pieces], get)
    _stage(worker, spec, layout, shard, samples, data, iteration)
    return int(fetched)


def _sync(worker: Any, fn: Any, *args: Any) -> Any:
    from .._distributed import sync  # here, as get_worker above: only tasks on a worker use it

    return sync(worker.loop, fn, *args)


def _unwrap(v: Any) -> Any:
    return getattr(v, "data", v)  # inproc transport: still wrapped


def _assemble(
    worker: Any, spec: RunSpec, layout: Layout, pieces: list[tuple[int, int, tuple]], get: Any
) -> Shard:
    """The shard of ``layout``'s rows from ``pieces`` (``(a, b, args)``: ``get(*args)`` gives
    rows ``[a, b)`` as :func:`~dask_rpm.engine.worker.rows_of` does)."""
    plugin = worker.plugins[PLUGIN_NAME]
    layers, rows = _layers(layout, spec.recipe), layout.rows
    params = layers.zeros(rows, spec.dtype)
    opt_state = {slot: layers.zeros(rows, spec.dtype) for slot in spec.recipe.optimizer.slots}
    for a, b, args in pieces:
        got = get(*args)
        layers.put(params, [_unwrap(p) for p in got["params"]], (a, b), rows[0])
        for slot, arrays in got["state"].items():
            layers.put(opt_state[slot], [_unwrap(p) for p in arrays], (a, b), rows[0])
    plugin.keeper(spec.run, layers)
    return Shard(layers, rows[0], params, opt_state, _backend(spec.placement))


def _stage(
    worker: Any,
    spec: RunSpec,
    layout: Layout,
    shard: Shard,
    samples: SampleSource | None,
    data: Any,
    iteration: int,
) -> None:
    """Stage ``shard`` with the column's samples (the current ones when ``samples`` is None)
    under the plan's version; a worker new to the run gets its state."""
    plugin = worker.plugins[PLUGIN_NAME]
    run = spec.run
    state = plugin.runs.get(run)
    if samples is None:
        column = state.data
    else:
        column = _column(samples, data, layout, spec, shard.backend)
        column.load(iteration)
    if state is None:  # a worker new to the run: nothing reads its state before the commit
        state = plugin.runs[run] = RunState(worker, layout, shard, column, spec)
        state.iteration = iteration
        state.copies = plugin.keeper(run)
    state.staged[layout.version] = (layout, shard, column)


def t_gather(run: str) -> tuple[list[np.ndarray], int, dict[str, list[np.ndarray]]]:
    """This worker's current shard (host copies), the iteration it is at, and its optimizer state
    (host copies)."""
    state = get_state(run)
    sh = state.shard
    return (
        [xb.host_copy(p) for p in sh.params],
        state.iteration,
        {k: [xb.host_copy(a) for a in v] for k, v in sh.state.items()},
    )


# ------------------------------------------------------------ control calls
def _plugin(dask_worker: Any) -> Any:
    return dask_worker.plugins[PLUGIN_NAME]


def run_commit(run: str, version: int, iteration: int, dask_worker: Any = None) -> bool:
    """Switch to the staged shard of plan ``version`` (or drop the run if this worker has none)."""
    plugin = _plugin(dask_worker)
    keeper = plugin.copies.get(run)
    if keeper is not None:  # a recovery went back to `iteration`: later copies are of the past
        keeper.drop_after(iteration)
    state: RunState | None = plugin.runs.get(run)
    if state is None:
        return False
    staged = state.staged.pop(version, None)
    state.staged.clear()
    if staged is None:
        plugin.runs.pop(
            run
        ).close()  # not in the new plan (its copies stay: a recovery may need them)
        return False
    state.layout, state.shard, state.data = staged
    state.iteration = iteration
    return True


def run_holdings(run: str, dask_worker: Any = None) -> list[tuple[int, tuple[int, int], str]]:
    """What this worker holds of ``run`` for a recovery: ``(iteration, rows, kind)`` of its live
    shard (``current``) and of its buddy copies (``own``, ``buddy``)."""
    plugin = _plugin(dask_worker)
    keeper = plugin.copies.get(run)
    out = keeper.holdings() if keeper is not None else []
    state = plugin.runs.get(run)
    if state is not None and state.shard.finite:
        out.append((state.iteration, tuple(state.layout.rows), "current"))
    return out


def run_copy_peak(run: str, dask_worker: Any = None) -> int:
    """The most bytes of ``run``'s buddy copies this worker held at once (0: none)."""
    keeper = _plugin(dask_worker).copies.get(run)
    return keeper.peak if keeper is not None else 0


def run_rollback(run: str, first: int, dask_worker: Any = None) -> int | None:
    """Back to the weights of iteration ``first``, the start of an aborted block (None: no state).

    A worker whose block never started is already there; one that got further
    goes back to the snapshot its block took at ``first``.
    """
    state = _plugin(dask_worker).runs.get(run)
    if state is None:
        return None
    if state.iteration != first:
        if state.shard.snap_iteration != first:
            raise RuntimeError(
                f"worker is at iteration {state.iteration} with a snapshot of {state.shard.snap_iteration}; "
                f"cannot go back to {first}"
            )
        state.iteration = state.shard.rollback()
    return state.iteration


def run_revert(run: str, dask_worker: Any = None) -> int:
    """Back to the weights before the last update (divergence); returns the iteration."""
    state = get_state(run, dask_worker)
    state.shard.revert()
    state.iteration -= 1
    return state.iteration


def run_abort(run: str, epoch: int, reason: str, dask_worker: Any = None) -> bool:
    """Make block ``epoch`` of ``run`` stop waiting (all of its receives fail at once)."""
    state = _plugin(dask_worker).runs.get(run)
    if state is None:
        return False
    state.mailbox.abort(epoch, reason)
    return True


def run_clear(run: str, dask_worker: Any = None) -> int:
    """Forget ``run`` on this worker."""
    plugin = _plugin(dask_worker)
    keeper = plugin.copies.pop(run, None)
    if keeper is not None:
        keeper.close()
    state = plugin.runs.pop(run, None)
    if state is None:
        return 0
    state.close()
    return 1


def run_deadline(dask_worker: Any = None) -> float | None:
    """When this worker's Dask lifetime ends (``time.time()``), or None (no lifetime)."""
    plugin = dask_worker.plugins.get(PLUGIN_NAME)
    return None if plugin is None else plugin.deadline


async def run_file_digest(path: str) -> str | None:
    """:func:`~dask_rpm.engine.store.file_digest` of ``path`` as this worker sees it, in a thread."""
    return await asyncio.to_thread(file_digest, path)


async def run_write_mark(directory: str, name: str, text: str) -> None:
    """Write a check file into a checkpoint store (:func:`~dask_rpm.engine.store.write_mark`), in a thread."""
    await asyncio.to_thread(write_mark, directory, name, text)


async def run_write_rows(
    run: str,
    directory: str,
    iteration: int,
    ranges: list[tuple[int, int]],
    dask_worker: Any = None,
) -> list[tuple[str, tuple[int, int], int, str]]:
    """Write hidden rows ``ranges`` (global numbering) of this worker's shard into a checkpoint store.

    The rows are copied on the event loop at the block boundary (the shard is
    not touched while the copy is taken), then written in a thread, so the
    worker's event loop stays responsive. Returns each file's ``(name, rows,
    bytes, sha256)`` (:class:`~dask_rpm.engine.store.RowFile`): all the driver
    receives.
    """
    state = get_state(run, dask_worker)
    if state.iteration != iteration:
        raise RuntimeError(
            f"worker {state.layout.address} is at iteration {state.iteration}, not {iteration}: "
            f"no checkpoint of its rows"
        )
    m0, m1 = state.layout.rows
    if any(not (m0 <= a < b <= m1) for a, b in ranges):
        raise ValueError(f"rows {ranges} are not within this worker's rows [{m0}, {m1})")
    copies = [(a, b, state.shard.rows(a, b)) for a, b in ranges]

    def write() -> list[tuple[str, tuple[int, int], int, str]]:
        names = state.shard.layers.names
        return [tuple(write_rows(directory, iteration, a, b, rows, names)) for a, b, rows in copies]  # type: ignore[misc]

    return await asyncio.to_thread(write)
