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

__all__ = ["due", "iterations_before", "retire"]

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


async def retire(driver: Any, addresses: Sequence[str], reason: str) -> RemapRecord:
    """Whole remap onto the other workers (rows fetched from the retiring ones), then retire them.

    Returns the remap record (``retired``: the addresses; ``replayed`` 0).
    """
    t0 = time.perf_counter()
    driver.gone |= {driver.addresses.index(a) for a in addresses}  # never planned again
    new = whole_plan(driver, note=reason)
    rec = await driver.remap(
        new, "whole"
    )  # they are alive: no lost workers, every row has a source
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
