"""Changes of the worker set: workers lost (recovery) and workers joining (elastic)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from ..drpm.remap import MigrationError
from ..plan.partition import Plan
from ..planners import make_plan
from ..progress import weight_bytes
from ..records import RemapRecord, remap_record
from .checkpoint import StoredCheckpoint
from .driver import Driver, ordered_workers
from .errors import TrainingError, WorkerLostError
from .records import Checkpoint

__all__ = ["whole_plan", "rebalance", "recover", "Checkpoint"]

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
    source, at = "columns", driver.iteration
    rec: RemapRecord
    try:
        rec = await driver.remap(new, "whole", lost=lost)
    except MigrationError:
        k = fallback.iteration
        driver.log.forget_from(k)
        await driver.client.scheduler.rpm_update(run=driver.run, info={"forget_from": k})
        placed = await driver.install(
            new.with_workers(driver.addresses) if new.workers is None else new, fallback
        )
        source = "checkpoint"
        n, _, l = new.shape
        rec = remap_record(
            k,
            "whole",
            bytes=placed.client_bytes,  # shards cut on the client (a checkpoint it holds)
            store_bytes=placed.store_bytes,  # or row files the workers read from the store
            transfers=len(new.planned_workers),
            samples_reloaded=len(new.planned_workers),
            sample_bytes=int(new.samples * (n + l) * np.dtype(driver.dtype).itemsize),
        )
    rec["seconds"] = time.perf_counter() - t0
    rec["reason"] = reason
    rec["lost"] = lost
    rec["joined"] = joined
    rec["recovered_from"] = source if lost else None
    rec["replayed"] = at - driver.iteration
    return rec


async def recover(
    driver: Driver, exc: WorkerLostError, fallback: Checkpoint | StoredCheckpoint
) -> RemapRecord:
    """After a worker loss: whole remap onto the workers left (the survivors are at a consistent iteration)."""
    failed_at = exc.iteration
    for attempt in range(len(driver.addresses) + 1):
        await asyncio.sleep(0.5 if attempt else 0.0)
        alive = ordered_workers(await driver.client.scheduler.identity(n_workers=-1))
        # A worker named lost is gone even if its address is still listed (closing).
        alive = [a for a in alive if a not in exc.workers]
        try:
            rec = await rebalance(
                driver, alive, fallback, f"worker(s) {', '.join(exc.workers)} lost"
            )
            break
        except WorkerLostError as again:  # another worker left during recovery
            exc = WorkerLostError([*exc.workers, *again.workers], again.iteration)
    else:  # pragma: no cover - every attempt lost a worker
        raise exc
    rec["replayed"] = max(failed_at - driver.iteration, 0)
    logger.warning(
        f"iteration {failed_at}: {exc}; recovered from the {rec['recovered_from']} -> whole remap onto "
        f"{len(driver.plan.planned_workers)} worker(s), {weight_bytes(rec)} in {rec['seconds']:.3f} s, "
        f"continuing from iteration {driver.iteration}"
    )
    return rec
