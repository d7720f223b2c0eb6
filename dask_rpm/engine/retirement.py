"""Retiring workers before their Dask lifetime ends: their rows move first, nothing is recomputed.

Worker jobs on a batch system end at their walltime. Started with Dask's
``--lifetime`` (dask-jobqueue's recommendation; the SLURM groups of
:mod:`dask_rpm.slurm` set it from the walltime), a worker closes itself
when its lifetime is up, and a training run that still has rows on it would
lose them and fall back to another column or the last checkpoint. Instead,
the driver asks each worker when its lifetime ends
(:func:`dask_rpm.engine.worker.lifetime_deadline`), ends blocks so that a
boundary comes before that (:func:`iterations_before`), and at the boundary
where a worker is due (:func:`due`) it re-plans without it — a whole remap
whose rows still come from the retiring worker, which is alive — and only
then retires it (:func:`retire`). No iteration is computed twice and no byte
is read from a checkpoint.

A graceful retirement someone else asks for (``client.retire_workers``, an adaptive
scale-down) goes the same way: the scheduler plugin holds it while the worker holds a run's
rows (at most ``rpm.train.retire-margin`` seconds), the driver sees it at its next block
boundary (:meth:`~dask_rpm.engine.driver.Driver.retiring`) and moves the rows with the same
whole remap, and the retirement then goes on.

``due`` and ``iterations_before`` are pure decisions; ``retire`` is the action.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

from ..records import RemapRecord
from .recovery import whole_plan

__all__ = ["due", "hand_over", "iterations_before", "retire"]

logger = logging.getLogger("dask_rpm")


def due(
    deadlines: Mapping[str, float | None],
    planned: Sequence[str],
    now: float,
    margin: float,
    block_seconds: float,
) -> list[str]:
    """Planned workers whose lifetime ends before the next block would be over, plus ``margin`` seconds."""
    horizon = now + margin + (block_seconds if math.isfinite(block_seconds) else 0.0)
    return [a for a in planned if (t := deadlines.get(a)) is not None and t <= horizon]


def iterations_before(
    deadlines: Mapping[str, float | None],
    planned: Sequence[str],
    now: float,
    margin: float,
    seconds_per_iteration: float,
) -> int | None:
    """Iterations that fit before the first planned worker is due (None: no deadline or no timing yet)."""
    ends = [t for a in planned if (t := deadlines.get(a)) is not None]
    if not ends or not (math.isfinite(seconds_per_iteration) and seconds_per_iteration > 0):
        return None
    return max(int((min(ends) - margin - now) / seconds_per_iteration), 1)


async def retire(
    driver: Any, addresses: Sequence[str], reason: str, *, ask: bool = True
) -> RemapRecord:
    """Whole remap onto the other workers (rows fetched from the retiring ones), then retire them.

    ``ask=False``: someone else asked Dask to retire them (``client.retire_workers``, an adaptive
    scale-down), and that retirement waits in the scheduler plugin until the remap has moved
    their rows (:meth:`~dask_rpm.engine.scheduler_plugin.RPMSchedulerPlugin.retire_workers`);
    it goes on by itself once the driver says they hold none.

    Returns the remap record (``retired``: the addresses; ``replayed`` 0).
    """
    t0 = time.perf_counter()
    driver.gone |= {driver.addresses.index(a) for a in addresses}  # never planned again
    new = whole_plan(driver, note=reason)
    rec = await driver.remap(
        new, "whole"
    )  # they are alive: no lost workers, every row has a source
    if ask:
        try:
            await driver.client.retire_workers(workers=list(addresses), close_workers=True)
        except Exception:  # pragma: no cover - they leave by their own lifetime anyway
            logger.debug("retire_workers(%s) failed", addresses, exc_info=True)
    rec.update(
        seconds=time.perf_counter() - t0,
        reason=reason,
        retired=list(addresses),
        lost=[],
        joined=[],
        recovered_from=None,
        replayed=0,
    )
    return rec


async def hand_over(driver: Any) -> RemapRecord | None:
    """Move the rows of the planned workers someone asked Dask to retire (``client.retire_workers``)
    to the others, as at the end of a lifetime (:func:`retire` with ``ask=False``): the
    retirement waits for it in the scheduler plugin and goes on once they hold no rows.

    Returns the remap record, or None when no planned worker was asked to retire, or when no
    other worker is there to take the rows (training then goes on until they leave).
    """
    asked = await driver.retiring()
    if not asked:
        return None
    left = [a for i, a in enumerate(driver.addresses) if i not in driver.gone and a not in asked]
    if not left:
        logger.warning(
            f"iteration {driver.iteration}: worker(s) {', '.join(asked)} asked to retire, and no "
            f"other worker is there to take their rows; training goes on until they leave"
        )
        return None
    reason = f"worker(s) {', '.join(asked)} retiring (retire_workers)"
    rec = await retire(driver, asked, reason, ask=False)
    logger.info(
        f"iteration {driver.iteration}: {reason} -> whole remap, {rec['bytes']} weight bytes in "
        f"{rec['seconds']:.3f} s, no iteration recomputed"
    )
    return rec
