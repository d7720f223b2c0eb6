"""Driver side of the engine: one :class:`Driver` per training run (async, on the client).

The driver places shards, submits one task per worker per block, watches the
block (worker loss, failed peers, progress streamed through the scheduler
plugin) and moves rows between workers at remaps. It never touches the
weights inside a block: the workers exchange partial products and
weight-update sums among themselves (:mod:`dask_rpm.engine.block`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from .._distributed import FIRST_COMPLETED, wait_async
from ..drpm.remap import migration, sample_changes, stage_pieces
from ..nn.cnn import ConvLayers
from ..nn.data import DataError
from ..nn.layers import Layers
from ..ordering import ordered_workers
from ..plan.partition import Plan
from ..records import RemapRecord, remap_record
from . import store
from .buddies import BuddyBook
from .buddy_fields import copy_fields
from .calls import run_each
from .checkpoint import StoredCheckpoint
from .errors import TrainingError, WorkerLostError
from .layout import exchanges_summary, layouts
from .options import EngineSettings
from .records import BlockResult, BlockSpec, Checkpoint, RunSpec
from .sending import SampleSender
from .tasks import (
    run_abort,
    run_clear,
    run_commit,
    run_copy_peak,
    run_revert,
    run_rollback,
    t_block,
    t_gather,
    t_setup,
    t_stage,
)
from .timing import TimingLog
from .worker import rows_of

__all__ = ["Driver", "BlockOutcome", "Placed", "ordered_workers"]

logger = logging.getLogger("dask_rpm")


def _users(error: DataError) -> DataError:
    """A worker's :class:`~dask_rpm.nn.data.DataError` (the user's to fix) raised anew on the
    driver: its own class and message, without the remote traceback."""
    return type(error)(str(error))


class Placed(NamedTuple):
    """What placing the shards moved (:meth:`Driver.install`)."""

    client_bytes: int  # weights cut on the client and scattered to the workers
    store_bytes: int  # row files the workers read from a checkpoint store themselves
    seconds: float  # until every worker held its shard and samples


@dataclass
class BlockOutcome:
    """How a block ended, as the driver reads it from every worker's :class:`BlockResult`.

    ``keep`` is set on divergence: the number of updates after which the
    weights were last finite (the workers hold those weights again).
    """

    status: str
    first: int
    stop: int
    keep: int | None = None


class Driver:
    """State and actions of one distributed training run (async; see :func:`dask_rpm.fit`).

    Worker indices are positions in ``addresses``, which only grows: a worker
    that joins is appended, one that is lost stays (in ``gone``) but is never
    planned again, so indices in timings, estimates and history stay valid.
    """

    def __init__(
        self,
        client: Any,
        *,
        spec: RunSpec,
        plan: Plan,
        source: Any,
        arrays: tuple[np.ndarray, np.ndarray] | None,
        rows: Any = None,
        threads: int = 0,
        layers: Layers | ConvLayers | None = None,
        engine: EngineSettings | None = None,
    ) -> None:
        self.client = client
        self.spec = spec  # what every worker is told at setup (recipe, dtype, placement, settings)
        self.engine = engine or EngineSettings()
        self.layers = layers or Layers(plan.shape[0], (plan.shape[1],), plan.shape[2])  # 1 layer
        self.threads = threads  # the kernels' threads (rpm.engine.threads; 0: each nthreads)
        self.kernel_threads: dict[str, int] = {}  # what each worker's kernels last ran with
        self.kernel_backends: dict[str, str] = {}  # ... and where (Backend.label)
        self.run = spec.run
        self.plan = plan
        # While a remap or an install is under way: the workers it depends on (None: the current
        # plan's); workers of the old plan already declared lost must not count as lost again.
        self._watch: set[str] | None = None
        self.source = source  # a netCDF path the workers read, Dask chunks, or None (arrays)
        self.rows = rows  # file rows of the training samples (a validation split), or None: all
        self.arrays = arrays
        self.recipe = spec.recipe
        self.eps = spec.recipe.learning_rate
        self.dtype = spec.dtype
        # each worker's samples, and what this client already sent (engine.sending)
        self.sender = SampleSender(client, plan.workers)
        self.addresses: list[str] = list(plan.workers or ())
        self.gone: set[int] = set()
        self.log = TimingLog()
        self.iteration = 0
        self.version = 0
        self.exchanges = ""  # the exchanges of the plan installed last (exchanges_summary)
        self.epoch = 0
        self.seq = 0  # last batch pulled from the scheduler plugin
        self.tasks_submitted = 0
        self.on_progress: Callable[[Driver], None] | None = None
        self.book: BuddyBook | None = None  # buddy copies (engine.buddies); None: none
        self.floor = 0  # a recovery goes back no further (engine.recovery; the loop sets it)
        # the block a loss aborted: how far it got, and its records and errors (recovery.restore)
        self.reached, self.aborted = 0, self.log.forget_from(0)

    # ------------------------------------------------------------ placing
    def _submit(self, fn: Any, *args: Any, key: tuple, worker: int) -> Any:
        self.tasks_submitted += 1
        return self.client.submit(
            fn,
            *args,
            key=key,
            workers=[self.addresses[worker]],
            allow_other_workers=False,
            pure=False,
        )

    def _key(self, what: str, n: int, worker: int) -> tuple[str, int, int]:
        return (f"rpm-{what}-{self.run}", n, worker)

    def _layouts(self, plan: Plan) -> dict[int, Any]:
        lays = layouts(
            plan, self.addresses, run=self.run, version=self.version, hidden=self.layers.hidden
        )
        self.exchanges = exchanges_summary(lays)
        return lays

    async def _scatter_to(self, obj: Any, w: int) -> Any:
        """Scatter ``obj`` to worker ``w``; a worker that left meanwhile raises :class:`WorkerLostError`.

        A worker killed while a remap sends it its samples must lead to a recovery, not end
        ``fit`` with a ``CommClosedError``.
        """
        try:
            [fut] = await self.client.scatter([obj], workers=[self.addresses[w]], hash=False)
        except Exception:
            if not await self.left(self.addresses[w]):
                raise
            raise WorkerLostError([self.addresses[w]], self.iteration) from None
        return fut

    async def install(self, plan: Plan, start: Checkpoint | StoredCheckpoint) -> Placed:
        """Give every planned worker its shard of ``start`` and its samples.

        A :class:`~dask_rpm.engine.records.Checkpoint` (weights on the client: the
        initial ones, or the last gathered) is cut into shards and scattered;
        of a :class:`~dask_rpm.engine.checkpoint.StoredCheckpoint` the driver
        reads only the manifest and every worker reads its own rows from the
        store. Without optimizer state it starts at zero.
        """
        t0 = time.perf_counter()
        self.version += 1
        lays = self._layouts(plan)
        manifest = start.manifest() if isinstance(start, StoredCheckpoint) else None
        futures, sent = [], 0
        given = await self.sender.for_workers(self, plan, lays)
        for w, lay in lays.items():
            m0, m1 = lay.rows
            weights: Any
            if isinstance(start, StoredCheckpoint):
                weights = store.rows_to_read(start.directory, manifest, m0, m1)  # type: ignore[arg-type]
            else:
                shard = rows_of(self.layers, start.params, start.state, m0, m1)
                sent += sum(a.nbytes for a in shard["params"]) + sum(
                    a.nbytes for v in shard["state"].values() for a in v
                )
                weights = await self._scatter_to(shard, w)
            samples, data = given[w]
            futures.append(
                self._submit(
                    t_setup,
                    self.spec,
                    lay,
                    weights,
                    samples,
                    data,
                    start.iteration,
                    key=self._key("setup", self.version, w),
                    worker=w,
                )
            )
        # the old plan's workers do not matter
        self._watch = {self.addresses[w] for w in plan.planned_workers}
        try:
            read = await self._wait_all(futures)
        finally:
            self._watch = None
        n = len(self.addresses)
        others = [self.addresses[i] for i in range(n) if i not in lays and i not in self.gone]
        if others:  # workers of an earlier plan that have no rectangle now
            await self.run_on(run_clear, self.run, workers=others)  # errors ignored: best effort
        self.plan, self.iteration = plan, start.iteration
        await self._hold()
        return Placed(sent, int(sum(read)), time.perf_counter() - t0)

    # ------------------------------------------------------------ blocks
    def _receive_timeout(self) -> float:
        value, floor = self.engine.receive_timeout, self.engine.receive_timeout_min
        if value is not None:
            return value
        # a generous multiple of the slowest iteration seen so far
        recent = self.log.iteration_times(range(max(self.iteration - 20, 0), self.iteration))
        recent = recent[np.isfinite(recent)]
        return max(floor, 20.0 * float(recent.max())) if recent.size else floor

    async def run_block(self, count: int, target_error: float | None = None) -> BlockOutcome:
        """Run ``count`` iterations (fewer if the target error is reached or training diverges).

        Raises :class:`WorkerLostError` when a planned worker left (the
        survivors are aborted and rolled back to the block's start) and
        :class:`TrainingError` when a peer failed otherwise.
        """
        spec = BlockSpec(
            epoch=self.epoch,
            first=self.iteration,
            count=int(count),
            learning_rate=self.eps,
            target_error=target_error,
            receive_timeout=self._receive_timeout(),
            report_seconds=self.engine.report_seconds,
            threads=self.threads,
        )
        if self.book is not None:
            spec = spec._replace(**await copy_fields(self, self.book))
        self.epoch += 1
        futures = {
            w: self._submit(
                t_block, self.run, spec, key=self._key("block", spec.epoch, w), worker=w
            )
            for w in self.plan.planned_workers
        }
        results = await self._watch_block(futures, spec)
        return await self._conclude(spec, results)

    async def _watch_block(
        self, futures: dict[int, Any], spec: BlockSpec
    ) -> dict[int, BlockResult]:
        """Wait for a block's tasks; abort the block on the first failure or lost worker."""
        pending = set(futures.values())
        results: dict[int, BlockResult] = {}
        by_key = {f.key: w for w, f in futures.items()}
        poll = self.engine.poll_seconds
        last_check = time.monotonic()
        while pending:
            try:
                await wait_async(list(pending), timeout=poll, return_when=FIRST_COMPLETED)
            except TimeoutError:
                pass
            for f in [f for f in pending if f.status != "pending"]:
                pending.discard(f)
                try:
                    res = await self._result(f)
                except WorkerLostError as exc:
                    await self._abort(spec, str(exc), futures)
                    raise WorkerLostError(exc.workers, spec.first) from None
                except Exception as exc:  # the task itself failed (or its worker died)
                    await self._abort(spec, f"task {f.key} failed: {exc!r}", futures)
                    await self._raise_lost(spec.first, grace=2.0)
                    if isinstance(exc, DataError):
                        raise _users(exc) from None
                    raise TrainingError(f"block task {f.key} failed: {exc!r}") from exc
                results[by_key[f.key]] = res
                if res.status in ("failed", "aborted"):
                    await self._abort(spec, res.message, futures)
                    await self._raise_lost(spec.first, grace=2.0)
                    raise TrainingError(
                        f"training failed in iterations {spec.first}.. : {res.message}"
                    )
            if pending and time.monotonic() - last_check >= 0.5:
                last_check = time.monotonic()
                lost = await self._lost()
                if lost:
                    await self._abort(
                        spec, f"worker(s) {', '.join(lost)} left the cluster", futures
                    )
                    raise WorkerLostError(lost, spec.first)
                await self.pull_progress()
        return results

    async def _abort(self, spec: BlockSpec, reason: str, futures: dict[int, Any]) -> None:
        """Make every worker of the block stop, wait for them, roll the survivors back to the block start."""
        alive = set(await self.client.scheduler.ncores())
        targets = [self.addresses[w] for w in futures if self.addresses[w] in alive]
        # errors ignored (also below): a worker that left has nothing to stop or roll back
        await self.run_on(run_abort, self.run, spec.epoch, reason, workers=targets)
        live = [f for w, f in futures.items() if self.addresses[w] in alive]
        try:
            await wait_async(live, timeout=max(spec.receive_timeout, 5.0))
        except Exception:  # a task that errs or a worker dying meanwhile: nothing left to wait for
            pass
        await self.client.cancel(list(futures.values()))
        await self.pull_progress()  # how far the block got: a recovery computes again from there
        self.reached = max([spec.first, *(it + 1 for it in self.log.errors)])
        await self.run_on(run_rollback, self.run, spec.first, workers=targets)
        self.iteration = spec.first
        self.aborted = self.log.forget_from(spec.first)  # a recovery may keep some (restore)
        await self.client.scheduler.rpm_update(run=self.run, info={"forget_from": spec.first})

    async def _conclude(self, spec: BlockSpec, results: dict[int, BlockResult]) -> BlockOutcome:
        """Merge the workers' results; agree on where the block stopped; revert on divergence."""
        statuses = {(r.status, r.stop) for r in results.values()}
        if len(statuses) != 1:
            raise TrainingError(
                f"internal error: workers ended block {spec.epoch} differently: {sorted(statuses)}"
            )
        ((status, stop),) = statuses
        for r in results.values():
            self.log.add(r.records)
            self.log.add_errors(r.errors)
            self.kernel_threads[self.addresses[r.worker]] = r.threads
            self.kernel_backends[self.addresses[r.worker]] = r.backend
            if self.book is not None:
                self.book.observe(self.addresses[r.worker], r.copies)
        self.iteration = stop
        finite = all(r.finite for r in results.values())
        keep = None
        if status == "diverged" or not finite:
            keep = stop
            if not finite:  # the last update made the weights non-finite: go back one
                got = await self.run_on(run_revert, self.run, workers=self._planned_addresses())
                errors = [v for v in got.values() if isinstance(v, BaseException)]
                if errors:
                    raise errors[0]
                keep = stop - 1
            self.iteration = keep
            self.log.forget_from(keep)
            status = "diverged"
        if self.on_progress is not None:
            self.on_progress(self)
        return BlockOutcome(status, spec.first, self.iteration, keep)

    async def pull_progress(self) -> None:
        """Fetch what the workers streamed since the last pull (progress bar, dashboard)."""
        got = await self.client.scheduler.rpm_pull(run=self.run, since=self.seq)
        self.seq = got["seq"]
        self.log.add(got["records"])
        self.log.add_errors(got["errors"])
        if self.on_progress is not None:
            self.on_progress(self)

    # ------------------------------------------------------------ workers
    def _planned_addresses(self) -> list[str]:
        return [self.addresses[w] for w in self.plan.planned_workers]

    async def _lost(self) -> list[str]:
        """Watched workers that left or are leaving (a graceful retirement from outside too)."""
        watch = self._watch if self._watch is not None else set(self._planned_addresses())
        return await self.leaving(sorted(watch))

    async def run_each(self, calls: Mapping[str, tuple[Any, tuple]]) -> dict[str, Any]:
        """:func:`dask_rpm.engine.calls.run_each` with this run's scheduler view of who left."""
        return await run_each(
            self.client,
            calls,
            leaving=self.leaving,
            iteration=self.iteration,
            poll=self.engine.poll_seconds,
        )

    async def run_on(self, fn: Any, *args: Any, workers: Sequence[str]) -> dict[str, Any]:
        """:meth:`run_each` of the same call on every worker of ``workers``."""
        return await self.run_each({a: (fn, args) for a in workers})

    async def left(self, address: str, grace: float = 2.0) -> bool:
        """Whether ``address`` left or is leaving, waiting up to ``grace`` s for the scheduler to
        notice (a call to it that just failed may be the first sign)."""
        deadline = time.monotonic() + grace
        while not await self.leaving([address]):
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.1)
        return True

    async def leaving(self, addresses: Sequence[str]) -> list[str]:
        """Of ``addresses``, the workers gone or retiring (the scheduler plugin's ``rpm_leaving``)."""
        return sorted(await self.client.scheduler.rpm_leaving(workers=list(addresses)))

    async def _raise_lost(self, iteration: int, grace: float = 0.0) -> None:
        """Raise :class:`WorkerLostError` if a planned worker left (waiting up to ``grace`` s to notice)."""
        deadline = time.monotonic() + grace
        while True:
            lost = await self._lost()
            if lost:
                raise WorkerLostError(lost, iteration)
            if time.monotonic() >= deadline:
                return
            await asyncio.sleep(0.1)

    async def _wait_all(self, futures: Sequence[Any]) -> list[Any]:
        """Wait for setup/remap/gather tasks; a lost worker raises :class:`WorkerLostError`."""
        while True:
            try:
                await wait_async(list(futures), timeout=0.5)
                break
            except TimeoutError:
                await self._raise_lost(self.iteration)
            except Exception as exc:
                await self._raise_lost(self.iteration, grace=2.0)
                raise TrainingError(
                    f"training failed at iteration {self.iteration}: {exc}"
                ) from exc
        out = []
        for f in futures:
            if f.status == "error":
                await self._raise_lost(self.iteration, grace=2.0)
                error = await f.exception()
                if isinstance(error, DataError):
                    raise _users(error) from None
                raise TrainingError(f"task {f.key} failed: {error!r}") from error
            result = await self._result(f)
            if isinstance(result, DataError):  # a refusal t_setup returned (the user's data)
                raise _users(result) from None
            out.append(result)
        return out

    async def _result(self, future: Any) -> Any:
        """A finished task's result; :class:`WorkerLostError` if a planned worker leaves meanwhile.

        Fetching a result whose holder has just died would wait for a recomputation that
        can never happen (the task is pinned to that worker), so the fetch is watched."""

        async def fetch() -> Any:
            return await future

        task = asyncio.ensure_future(fetch())
        while True:
            done, _ = await asyncio.wait({task}, timeout=0.5)
            if done:
                try:
                    return task.result()
                except Exception:  # the scheduler forgot a finished task whose worker just died
                    await self._raise_lost(self.iteration, grace=2.0)
                    raise
            lost = await self._lost()
            if lost:
                task.cancel()
                raise WorkerLostError(lost, self.iteration)

    # ------------------------------------------------------------ weights
    async def gather(self, with_state: bool = False) -> Any:
        """The whole parameters ``[W_1, ..., W_L, V]`` from the first column (every column holds a
        full, identical copy); with ``with_state`` ``(params, state)``, the optimizer state
        ``{slot: [one array per parameter]}``."""
        col = sorted(self.plan.columns[0], key=lambda w: self.plan.rectangle(w).hidden[0])
        # The key carries the plan version: a gather repeated after a recovery must not get the first's
        what = f"gather-v{self.version}"
        futures = [
            self._submit(t_gather, self.run, key=self._key(what, self.iteration, w), worker=w)
            for w in col
        ]
        shards = await self._wait_all(futures)
        its = {s[1] for s in shards}
        if its != {self.iteration}:
            raise TrainingError(
                f"internal error: shards are at iterations {sorted(its)}, not {self.iteration}"
            )
        params = self.layers.join([s[0] for s in shards])
        if not with_state:
            return params
        state = {k: self.layers.join([s[2][k] for s in shards]) for k in shards[0][2]}
        return params, state

    async def remap(self, new: Plan, kind: str, lost: Sequence[str] = ()) -> RemapRecord:
        """Switch to plan ``new`` between blocks, moving only the rows that change owner, worker to worker.

        Each worker keeps the rows it already holds and fetches the others from
        the holder :func:`dask_rpm.drpm.remap.migration` chooses (every column holds
        a full copy); workers whose sample range changed read their new samples
        (from the dataset file; from the client for in-memory arrays). The new
        shards are staged on every worker first and switched to together.
        """
        t0, old = time.perf_counter(), self.plan
        new = self.sender.snapped(self, new)  # Dask's data: new sample ranges on whole chunks
        if new.workers is None:  # keep the plan bound to addresses (dashboard, results)
            new = new.with_workers(self.addresses)
        itemsize = np.dtype(self.dtype).itemsize
        transfers = migration(
            old,
            new,
            itemsize=itemsize,
            lost=lost,
            row_bytes=lambda a, b: self.layers.nbytes((a, b), itemsize),
        )
        index = {a: i for i, a in enumerate(self.addresses)}
        changed = {
            index[c.worker] if isinstance(c.worker, str) else int(c.worker)
            for c in sample_changes(old, new)
        }
        self.version += 1
        lays = self._layouts(new)
        futures = []
        given = await self.sender.for_workers(self, new, [w for w in lays if w in changed])
        for w, lay in lays.items():
            pieces = stage_pieces(old, new, w, transfers, self.addresses, lost)
            samples, data = given.get(w, (None, None))
            futures.append(
                self._submit(
                    t_stage,
                    self.spec,
                    lay,
                    pieces,
                    samples,
                    data,
                    self.iteration,
                    key=self._key("remap", self.version, w),
                    worker=w,
                )
            )
        # the sources (old plan) and targets (new plan), but not the workers this remap replaces as lost
        self._watch = {
            self.addresses[w] for w in (*old.planned_workers, *new.planned_workers)
        } - set(lost)
        try:
            await self._wait_all(futures)
        finally:
            self._watch = None
        involved = sorted(
            {self.addresses[w] for w in (*old.planned_workers, *new.planned_workers)} - set(lost)
        )
        # errors ignored: a worker that left meanwhile is found lost by the next block
        await self.run_on(run_commit, self.run, self.version, self.iteration, workers=involved)
        self.plan = new
        await self._hold()
        n, _, l = new.shape
        # each worker of `changed` reads its column's samples (x and d rows) again
        reloaded = sum(new.rectangle(w).n_samples for w in changed) * (n + l) * itemsize
        return remap_record(
            self.iteration,
            kind,
            bytes=int(sum(t.nbytes for t in transfers)),
            seconds=time.perf_counter() - t0,
            transfers=len(transfers),
            samples_reloaded=len(changed),
            sample_bytes=int(reloaded),
        )

    async def _hold(self) -> None:
        """Tell the scheduler plugin which workers hold this run's rows now: a graceful retirement
        of one (``client.retire_workers``) then waits up to ``rpm.train.retire-margin`` seconds
        for them to move (:meth:`retiring`, the loop's next boundary) instead of losing them."""
        await self.client.scheduler.rpm_hold(
            run=self.run, workers=self._planned_addresses(), seconds=self.engine.retire_margin
        )

    async def retiring(self) -> list[str]:
        """Planned workers asked to retire gracefully that wait for their rows to move."""
        return sorted(await self.client.scheduler.rpm_retiring(workers=self._planned_addresses()))

    async def close(self) -> None:
        try:  # the run holds no rows any more: a retirement waiting for them goes on
            await self.client.scheduler.rpm_hold(run=self.run, workers=[], seconds=0.0)
        except Exception:  # pragma: no cover - best effort on shutdown
            logger.debug("could not release the run's workers", exc_info=True)
        if self.book is not None:  # what the buddy copies took, idle buddies' included
            try:
                peaks = await self.client.run(run_copy_peak, self.run, on_error="return")
                self.book.held({a: v for a, v in peaks.items() if isinstance(v, int) and v})
            except Exception:  # pragma: no cover - best effort on shutdown
                logger.debug("could not ask the workers for their copies' bytes", exc_info=True)
        try:
            await self.client.run(run_clear, self.run, on_error="ignore")
        except Exception:  # pragma: no cover - best effort on shutdown
            logger.debug("could not clear the run's state on the workers", exc_info=True)
