"""Column sample ranges snapped to the chunk boundaries of the training data.

Pure: a plan and the row counts of the data's chunks in, a plan out. A column whose sample
range starts and ends on chunk boundaries reads whole chunks, so a column whose chunks already
live on its workers moves no rows (:mod:`dask_rpm.engine.dask_data`). Moving a cut changes
the columns' areas, so a cut moves only where the plan's imbalance stays within
``rpm.planner.chunk-imbalance`` of the unsnapped plan's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from ..plan.partition import Plan, PlanError, Rectangle, t_comm_model

__all__ = ["chunk_bounds", "snap_to_chunks"]


def chunk_bounds(chunks: Sequence[int]) -> np.ndarray:
    """The row offsets where chunks start and end: ``[0, c0, c0 + c1, ..., s]``."""
    sizes = np.asarray([int(c) for c in chunks], dtype=np.int64)
    if sizes.size == 0 or (sizes < 0).any():
        raise PlanError(f"chunks {list(sizes)}; give the row count of every chunk (>= 0)")
    return np.concatenate([[0], np.cumsum(sizes)])


def snap_to_chunks(plan: Plan, chunks: Sequence[int], tolerance: float) -> Plan:
    """``plan`` with its column sample cuts moved onto chunk boundaries where that pays.

    Parameters
    ----------
    plan : Plan
        A column-fixed plan over ``sum(chunks)`` samples.
    chunks : sequence of int
        The rows of each chunk of the training data, in order.
    tolerance : float
        How much the plan's :meth:`~dask_rpm.plan.partition.Plan.imbalance` may grow, as a
        fraction of the unsnapped plan's (``0.05``: up to 5 % more); ``>= 0``.

    Returns
    -------
    Plan
        The plan with each interior cut on its nearest chunk boundary, cut by cut from the
        left, every move kept that leaves each column at least one sample and the imbalance
        within the tolerance; ``plan`` itself when no cut moves. Hidden ranges are unchanged.
    """
    if not (np.isfinite(tolerance) and tolerance >= 0):
        raise PlanError(
            f"rpm.planner.chunk-imbalance={tolerance!r}; it must be a number >= 0 "
            f"(0.05: the snapped plan may be up to 5 % more imbalanced)"
        )
    bounds = chunk_bounds(chunks)
    if int(bounds[-1]) != plan.samples:
        raise PlanError(
            f"chunks of {int(bounds[-1])} rows for a plan of {plan.samples} samples; "
            f"they must cover the plan's samples"
        )
    cuts = [plan.column_samples(c)[0] for c in range(plan.n_columns)] + [plan.samples]
    limit = plan.imbalance() * (1.0 + tolerance)
    best = plan
    for i in range(1, len(cuts) - 1):
        if cuts[i] in bounds:
            continue
        # the nearest boundary strictly between the neighbouring cuts (one sample each side)
        inside = bounds[(bounds > cuts[i - 1]) & (bounds < cuts[i + 1])]
        if inside.size == 0:
            continue
        trial = list(cuts)
        trial[i] = int(inside[np.argmin(np.abs(inside - cuts[i]))])
        candidate = _with_cuts(plan, trial)
        if candidate.imbalance() <= limit:
            cuts, best = trial, candidate
    if best is plan:
        return plan
    return replace(best, notes=(*plan.notes, "sample cuts snapped to the data's chunk boundaries"))


def _with_cuts(plan: Plan, cuts: Sequence[int]) -> Plan:
    """``plan`` with column ``c`` over samples ``[cuts[c], cuts[c + 1])``, its communication
    cost counted again (it depends on the column widths)."""
    rects = tuple(
        Rectangle(r.worker, r.column, (int(cuts[r.column]), int(cuts[r.column + 1])), r.hidden)
        for r in plan.rectangles
    )
    widths = [int(cuts[c + 1] - cuts[c]) for c in range(plan.n_columns)]
    sizes = [len(col) for col in plan.columns]
    t_comm = t_comm_model(widths, sizes, plan.cost_shape or plan.shape, plan.samples)
    return replace(plan, rectangles=rects, t_comm=t_comm).validate()
