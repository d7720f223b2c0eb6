"""Changes of the worker set: workers lost (recovery) and workers joining (elastic)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from ..drpm.remap import MigrationError, sample_changes
from ..plan.partition import Plan
from ..planners import make_plan
from ..progress import weight_bytes
from ..records import RemapRecord, remap_record
from .buddies import Holding, Restore, pieces_for, restore_point, rows_source
from .checkpoint import StoredCheckpoint
from .driver import Driver, ordered_workers
from .errors import TrainingError, WorkerLostError
from .records import Checkpoint
from .tasks import run_commit, run_holdings, t_restore

__all__ = ["whole_plan", "rebalance", "recover", "restore", "Checkpoint"]

logger = logging.getLogger("dask_rpm")


def whole_plan(
    driver: Driver, abilities: dict[int, float] | None = None, note: str = "whole remap"
) -> Plan:
    """SRPM over every worker not lost (joined ones included), indexed like ``driver.addresses``.

    ``abilities`` maps worker index to ability; workers without one get the
    ability they have in the current plan, workers new to the run the mean of
    the planned workers' abilities.
    """
    active = [i for i in range(len(driver.addresses)) if i not in driver.gone]
    if not active:
        raise TrainingError("no workers left to train on: every worker of the run was lost")
    abilities = dict(abilities or {})
    cur = np.asarray(driver.plan.abilities, dtype=float)
    known = [w for w in abilities if w < cur.size and cur[w] > 0]
    if known:  # measured abilities (work per second): bring the plan's shares to their scale
        cur = cur * (sum(abilities[w] for w in known) / cur[known].sum())
    planned = [cur[w] for w in driver.plan.planned_workers if w not in driver.gone] or [1.0]
    fill = float(np.mean(planned))
    vec = []
    for i in active:
        v = abilities.get(i, cur[i] if i < len(cur) and cur[i] > 0 else fill)
        vec.append(float(v) if np.isfinite(v) and v > 0 else fill)
    compact = make_plan(
        vec,
        driver.plan.shape,
        driver.plan.samples,
        method="srpm",
        batch=driver.recipe.schedule.batch,
        cost_shape=driver.plan.cost_shape,
    )
    full = np.zeros(len(driver.addresses))
    full[active] = np.asarray(vec) / np.sum(vec)
    lift = dict(enumerate(active))
    new = replace(
        compact,
        abilities=tuple(float(v) for v in full),
        columns=tuple(tuple(lift[w] for w in col) for col in compact.columns),
        rectangles=tuple(replace(r, worker=lift[r.worker]) for r in compact.rectangles),
        excluded=tuple(lift[w] for w in compact.excluded),
        notes=(*compact.notes, note),
        workers=tuple(driver.addresses),
    )
    return new.validate()


async def rebalance(
    driver: Driver, alive: Sequence[str], fallback: Checkpoint | StoredCheckpoint, reason: str
) -> RemapRecord:
    """Whole remap onto the workers ``alive`` now: absorb new ones, drop lost ones.

    Rows a lost worker held come from another column holding the same rows.
    When no column does (a single column, or every holder lost), training
    restarts from ``fallback``, the last checkpoint (read from its store only
    then, when the workers wrote it), and the iterations since are computed
    again.
    """
    t0 = time.perf_counter()
    alive_set = set(alive)
    planned = set(driver.plan.planned_workers)
    # Lost: workers that left, and planned workers already marked gone by an attempt that failed (another
    # worker left during that recovery): their rows must not be fetched from them.
    lost = [
        a
        for i, a in enumerate(driver.addresses)
        if (i not in driver.gone and a not in alive_set) or (i in driver.gone and i in planned)
    ]
    driver.gone |= {driver.addresses.index(a) for a in lost}
    joined = [a for a in alive if a not in set(driver.addresses)]
    driver.addresses.extend(joined)
    new = whole_plan(driver, note=reason)
    old, at = driver.plan, driver.iteration
    point = await _restore_point(driver) if lost and driver.book is not None else None
    rec: RemapRecord
    try:
        if (
            point is not None
            and point.kinds != {"current"}
            and point.iteration >= fallback.iteration
        ):
            rec, source = await restore(driver, new, point), "buddy"
        else:  # every lost row has a live holder now, or no copy is newer than the checkpoint
            rec, source, point = await driver.remap(new, "whole", lost=lost), "columns", None
    except MigrationError:
        rec, source = await _from_checkpoint(driver, new, fallback), "checkpoint"
    rec["seconds"] = time.perf_counter() - t0
    rec["reason"] = reason
    rec["lost"] = lost
    rec["joined"] = joined
    rec["recovered_from"] = source if lost else None
    if lost:
        rec["rows_from"] = {a: _rows_from(old, a, source, point, fallback) for a in lost}
    rec["replayed"] = at - driver.iteration
    return rec


async def _from_checkpoint(
    driver: Driver, new: Plan, fallback: Checkpoint | StoredCheckpoint
) -> RemapRecord:
    """Start again from ``fallback``, the last checkpoint: on the client, in the store the workers
    read, or the initial weights."""
    k = fallback.iteration
    driver.log.forget_from(k)
    await driver.client.scheduler.rpm_update(run=driver.run, info={"forget_from": k})
    placed = await driver.install(
        new.with_workers(driver.addresses) if new.workers is None else new, fallback
    )
    if driver.book is not None:
        driver.book.rolled_back(k)
    n, _, l = new.shape
    return remap_record(
        k,
        "whole",
        bytes=placed.client_bytes,  # shards cut on the client (a checkpoint it holds)
        store_bytes=placed.store_bytes,  # or row files the workers read from the store
        transfers=len(new.planned_workers),
        samples_reloaded=len(new.planned_workers),
        sample_bytes=int(new.samples * (n + l) * np.dtype(driver.dtype).itemsize),
    )


def _rows_from(
    old: Plan,
    address: str,
    source: str,
    point: Restore | None,
    fallback: Checkpoint | StoredCheckpoint,
) -> str:
    """Where lost worker ``address``'s rows came from: ``buddy``, ``other column``, ``disk`` (a
    checkpoint store), ``driver`` (a checkpoint held on the client) or ``initial`` (weights)."""
    if source == "checkpoint":
        if isinstance(fallback, StoredCheckpoint):
            return "disk"
        return "driver" if fallback.iteration else "initial"
    index = list(old.workers or ()).index(address) if address in (old.workers or ()) else None
    if point is None or index is None or index not in old.planned_workers:
        return "other column"
    return rows_source(point, old.rectangle(index).hidden)


async def _restore_point(driver: Driver) -> Restore | None:
    """The latest iteration whose rows the live workers hold between them (live shards, own and
    buddy copies: :func:`~dask_rpm.engine.buddies.restore_point`), not before ``driver.floor``."""
    alive = [a for i, a in enumerate(driver.addresses) if i not in driver.gone]
    got = await driver.run_on(run_holdings, driver.run, workers=alive)
    held = [
        Holding(int(k), (int(rows[0]), int(rows[1])), a, kind)
        for a, r in got.items()
        if not isinstance(r, BaseException)
        for k, rows, kind in r
    ]
    top, errors = driver.iteration, driver.aborted[1]
    while top in errors:  # forward only as far as the aborted block's errors are known
        top += 1
    return restore_point(held, driver.plan.shape[1], driver.floor, top)


async def restore(driver: Driver, new: Plan, point: Restore) -> RemapRecord:
    """Switch to plan ``new`` at iteration ``point.iteration``: every worker of ``new`` builds its
    shard of that iteration from the copies and live shards that hold it
    (:func:`~dask_rpm.engine.tasks.t_restore`), then all switch together and training goes on
    from there.
    """
    old, k = driver.plan, point.iteration
    new = driver.sender.snapped(driver, new)  # Dask's data: new sample ranges on whole chunks
    if new.workers is None:
        new = new.with_workers(driver.addresses)
    index = {a: i for i, a in enumerate(driver.addresses)}
    changed = {
        index[c.worker] if isinstance(c.worker, str) else int(c.worker)
        for c in sample_changes(old, new)
    }
    driver.version += 1
    futures, remote = [], 0
    lays = driver._layouts(new)
    given = await driver.sender.for_workers(driver, new, [w for w in lays if w in changed])
    for w, lay in lays.items():
        pieces = pieces_for(point, lay.rows, driver.addresses[w])
        remote += sum(1 for p in pieces if p[2] != driver.addresses[w])
        samples, data = given.get(w, (None, None))
        futures.append(
            driver._submit(
                t_restore,
                driver.spec,
                lay,
                pieces,
                samples,
                data,
                k,
                key=driver._key("restore", driver.version, w),
                worker=w,
            )
        )
    holders = {h.holder for s in point.segments for h in s.holders[:1]}
    driver._watch = {driver.addresses[w] for w in new.planned_workers} | holders
    try:
        fetched = await driver._wait_all(futures)
    finally:
        driver._watch = None
    alive = [a for i, a in enumerate(driver.addresses) if i not in driver.gone]
    # errors ignored: a worker that left meanwhile is found lost by the next block
    await driver.run_on(run_commit, driver.run, driver.version, k, workers=alive)
    # going back to k may mean forward from the aborted block's start: its iterations before k
    # were done (every worker finished them) and stay in the history
    records, errors = driver.aborted
    driver.log.add(r for r in records if driver.iteration <= r.iteration < k)
    driver.log.add_errors({it: e for it, e in errors.items() if driver.iteration <= it < k})
    driver.plan, driver.iteration = new, k
    driver.log.forget_from(k)
    await driver.client.scheduler.rpm_update(run=driver.run, info={"forget_from": k})
    if driver.book is not None:
        driver.book.rolled_back(k)
    n, _, l = new.shape
    itemsize = np.dtype(driver.dtype).itemsize
    return remap_record(
        k,
        "whole",
        bytes=int(sum(fetched)),
        transfers=remote,
        samples_reloaded=len(changed),
        sample_bytes=int(sum(new.rectangle(w).n_samples for w in changed) * (n + l) * itemsize),
    )


async def recover(
    driver: Driver, exc: WorkerLostError, fallback: Checkpoint | StoredCheckpoint
) -> RemapRecord:
    """After a worker loss: whole remap onto the workers left (the survivors are at a consistent iteration)."""
    failed_at = exc.iteration
    for attempt in range(len(driver.addresses) + 1):
        await asyncio.sleep(0.5 if attempt else 0.0)
        alive = await _alive(driver, exc.workers)
        try:
            rec = await rebalance(
                driver, alive, fallback, f"worker(s) {', '.join(exc.workers)} lost"
            )
            break
        except WorkerLostError as again:  # another worker left during recovery
            exc = WorkerLostError([*exc.workers, *again.workers], again.iteration)
    else:  # pragma: no cover - every attempt lost a worker
        raise exc
    # the loss was seen where the furthest worker got (the aborted block's iterations are lost too)
    seen = max(failed_at, driver.reached)
    driver.reached = 0
    rec["replayed"] = max(seen - driver.iteration, 0)
    logger.warning(
        f"iteration {seen}: {exc}; recovered from the {rec['recovered_from']} -> whole remap onto "
        f"{len(driver.plan.planned_workers)} worker(s), {weight_bytes(rec)} in {rec['seconds']:.3f} s, "
        f"continuing from iteration {driver.iteration}{_fallback_note(driver, rec)}"
    )
    return rec


async def _alive(driver: Driver, lost: Sequence[str]) -> list[str]:
    """The workers up now that the run can train on: not ``lost`` (a worker named lost is gone
    even if still listed, closing), not leaving, and not one the run counted as gone before.

    When there are none (every worker killed while the others restart; the last ones listed
    still closing), the first to come up, waiting at most ``rpm.train.wait-workers`` seconds:
    a recovery that took the listed ones would find every worker of its plan gone."""
    deadline = time.monotonic() + driver.engine.wait_workers
    gone = {driver.addresses[i] for i in driver.gone}
    while True:
        info = await driver.client.scheduler.identity(n_workers=-1)
        listed = [a for a in ordered_workers(info) if a not in lost and a not in gone]
        leaving = set(await driver.leaving(listed)) if listed else set()
        alive = [a for a in listed if a not in leaving]
        if alive or time.monotonic() >= deadline:
            return alive
        await asyncio.sleep(0.5)


def _fallback_note(driver: Driver, rec: RemapRecord) -> str:
    """Why a run with buddy copies went back to a checkpoint (or to the start), and what to set."""
    if driver.book is None or rec.get("recovered_from") != "checkpoint":
        return ""
    sources = set((rec.get("rows_from") or {}).values())
    why = (
        "; no buddy copy of the lost rows survived (a worker and the buddy that kept its copies "
        "were lost together)"
    )
    if "initial" in sources and rec.get("replayed"):
        return (
            why + ", and no checkpoint was configured: the run restarted from iteration 0 "
            "(checkpoint_every with checkpoint_dir, or rpm.checkpoint.*, keeps a disk copy)"
        )
    return why
