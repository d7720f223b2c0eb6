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
from .records import BlockResult, BlockSpec, Layout, RunSpec
from .samples import ColumnData, SampleSource
from .store import StoreRows, file_digest, read_rows, write_mark, write_rows
from .worker import PLUGIN_NAME, RunState, Shard, get_state

__all__ = [
    "t_setup",
    "t_block",
    "t_stage",
    "t_gather",
    "run_commit",
    "run_rollback",
    "run_revert",
    "run_abort",
    "run_clear",
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
    state = RunState(worker, layout, _shard(weights, layout, spec.recipe, be), column, spec)
    state.iteration = iteration
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
    from .._distributed import sync  # here, as get_worker above: only tasks on a worker use it

    worker = _worker()
    plugin = worker.plugins[PLUGIN_NAME]
    run, dtype = spec.run, spec.dtype
    state = plugin.runs.get(run)
    layers, rows = _layers(layout, spec.recipe), layout.rows
    params = layers.zeros(rows, dtype)
    opt_state = {slot: layers.zeros(rows, dtype) for slot in spec.recipe.optimizer.slots}

    async def fetch(a: int, b: int, src: str) -> dict[str, Any]:
        return await worker.rpc(src).rpm_rows(run=run, a=a, b=b)

    def unwrap(v: Any) -> np.ndarray:
        return getattr(v, "data", v)  # inproc transport: still wrapped

    for a, b, src in pieces:
        got = state.shard.rows(a, b) if src is None else sync(worker.loop, fetch, a, b, src)
        layers.put(params, [unwrap(p) for p in got["params"]], (a, b), rows[0])
        for slot, arrays in got["state"].items():
            layers.put(opt_state[slot], [unwrap(p) for p in arrays], (a, b), rows[0])
    be = _backend(spec.placement)
    if samples is None:
        column = state.data
    else:
        column = _column(samples, data, layout, spec, be)
        column.load(iteration)
    shard = Shard(layers, rows[0], params, opt_state, be)
    if state is None:  # a worker new to the run: nothing reads its state before the commit
        state = plugin.runs[run] = RunState(worker, layout, shard, column, spec)
        state.iteration = iteration
    state.staged[layout.version] = (layout, shard, column)
    return layout.worker


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
    state: RunState | None = plugin.runs.get(run)
    if state is None:
        return False
    staged = state.staged.pop(version, None)
    state.staged.clear()
    if staged is None:
        plugin.runs.pop(run).close()  # not in the new plan
        return False
    state.layout, state.shard, state.data = staged
    state.iteration = iteration
    return True


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
