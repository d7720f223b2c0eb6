"""Leaving workers idle: the plan on the fastest few when it is predicted faster than on all.

Pure module (numpy only). With a 1 : 100 speed mix (a GPU beside one-thread CPU workers), or a
job so small that messages dominate, a worker's rectangle can cost more in messages than its
share of the work saves. :func:`fastest_subset` plans on every worker and on the fastest ``k``
alone (``k`` in :data:`SUBSET_SIZES`), predicts one iteration of each with the cost model
(:func:`dask_rpm.cost.predict_breakdown`: compute at each worker's rate, latency, bandwidth,
per-message overhead) and keeps the fewest workers unless more are predicted at least
``min_gain`` faster. The workers left out hold no rows: they stay in the cluster, idle, and a
later plan (DRPM's whole remap) takes them back when the estimate says they pay.

:func:`make_plan <dask_rpm.planners.make_plan>` runs it for the planners that minimise
seconds (``srpm-time``) and, with ``idle=True`` and measured ``rates``, for any other planner
(DRPM's SRPM plans: its first plan from the probe, its whole remaps).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from ..cost import CostModel, predict_breakdown
from ..plan.partition import PlanError, RealPartition, snap_with_count, to_integer
from .inputs import worker_names
from .registry import PlannerResult

__all__ = ["SUBSET_SIZES", "fastest_subset", "idle_note", "predicted", "subset_network"]

#: how many of the fastest workers :func:`fastest_subset` tries (and every worker): enough to
#: find "one worker" and "a few" on a latency-bound job without planning N times for large N
SUBSET_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)


def fastest_subset(
    plan_on: Callable[[list[int]], PlannerResult],
    active: list[int],
    speed: Sequence[float] | np.ndarray,
    min_gain: float = 0.0,
) -> PlannerResult:
    """The plan on the fewest of the fastest workers of ``active`` that no larger set beats.

    ``plan_on`` plans the workers it is given and returns ``meta["predicted_seconds"]``.
    Candidates are the fastest ``k`` workers of ``active`` by ``speed`` (indexed like
    ``active``'s values) for ``k`` in :data:`SUBSET_SIZES`, and all of them; from the fewest
    up, a larger set replaces the one kept only if it is predicted more than ``min_gain``
    (relative) faster. So the plan chosen is never predicted slower than the fastest worker
    alone, and more workers must pay for their messages by a margin the cost model's error
    cannot erase. The result's partition indexes ``active``; workers it leaves out hold no
    rows (idle). ``meta`` gains ``predicted_seconds_all`` (every worker of ``active``) and
    ``min_gain``.
    """
    whole = plan_on(active)  # infeasible for every worker: the caller's error to report
    fastest = sorted(range(len(active)), key=lambda i: (-float(speed[active[i]]), i))
    best: PlannerResult | None = None
    t_best = math.inf
    for k in [k for k in SUBSET_SIZES if k < len(active)] + [len(active)]:
        keep = sorted(fastest[:k])
        if k == len(active):
            res = whole
        else:
            try:
                res = plan_on([active[i] for i in keep])
            except PlanError:
                continue
        t = float(res.meta["predicted_seconds"])
        if best is None or t < (1.0 - min_gain) * t_best:
            part = res.partition
            cols = tuple(tuple(keep[i] for i in col) for col in part.columns)
            best = replace(res, partition=RealPartition(cols, part.widths, part.heights))
            t_best = t
    assert best is not None  # the whole set always is a candidate
    meta = {
        **best.meta,
        "predicted_seconds_all": float(whole.meta["predicted_seconds"]),
        "min_gain": float(min_gain),
    }
    return replace(best, meta=meta)


def predicted(
    res: PlannerResult,
    abilities: np.ndarray,
    shape: tuple[int, int, int],
    samples: int,
    *,
    small_group: float,
    rates: Sequence[float],
    model: CostModel,
) -> PlannerResult:
    """``res`` with ``meta["predicted_seconds"]``: its integer plan (snapped with
    ``small_group``, as :func:`make_plan <dask_rpm.planners.make_plan>` will) predicted with
    the cost ``model`` at ``rates`` (work units per second, indexed like ``abilities``).

    For the planners that do not minimise seconds themselves (SRPM), so that
    :func:`fastest_subset` can compare their plans on fewer workers.
    """
    snapped, _ = snap_with_count(res.partition, small_group)
    plan = to_integer(
        snapped,
        abilities=abilities,
        shape=shape,
        samples=samples,
        method=res.method or "plan",
        t_comm=math.nan,
    )
    t = float(predict_breakdown(plan, [float(r) for r in rates], model=model)["total"])
    return replace(res, meta={**res.meta, "predicted_seconds": t})


def subset_network(network: Any, active: Sequence[int]) -> Any:
    """``network`` with its per-worker host/group labels restricted to the planned workers."""
    if network is None:
        return None
    repl = {}
    for name in ("hosts", "groups"):
        labels = getattr(network, name)
        if labels is not None:
            repl[name] = tuple(labels[i] for i in active)
    return network._replace(**repl) if repl else network


def idle_note(idle: Sequence[int], meta: dict[str, Any], *, batch: int | None = None) -> str:
    """Why ``idle`` hold no rows, for ``Plan.notes`` (``meta``: :func:`fastest_subset`'s)."""
    if "predicted_seconds_all" not in meta:
        return f"left {worker_names(idle)} idle: the planner gave them no rectangle"
    t, t_all = float(meta["predicted_seconds"]), float(meta["predicted_seconds_all"])
    gain = float(meta.get("min_gain", 0.0))
    per = "" if batch is None else f" (one mini-batch of {batch} samples)"
    if t_all >= t:
        why = (
            f"the plan without them is predicted faster ({t:.4g} s/iteration{per} against "
            f"{t_all:.4g} s with every worker; messages would cost more than their share of the "
            f"work saves)"
        )
    else:
        why = (
            f"the plan with every worker is predicted only {1 - t_all / t:.2%} faster "
            f"({t_all:.4g} against {t:.4g} s/iteration{per}), less than the {gain:.0%} more "
            f"workers must gain (min_gain; DRPM: rpm.drpm.min-gain): within the cost model's "
            f"error their messages may cost more than their share of the work saves"
        )
    return f"left {worker_names(idle)} idle: {why}"
