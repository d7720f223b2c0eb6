"""DRPM's idle workers: who pays for their messages, at whole remaps and at every check.

Beyond the paper. With a 1 : 100 speed mix (a GPU beside one-thread CPU workers) a slow
worker's rectangle can cost more in messages than its share of the work saves. DRPM then
leaves it idle - it stays in the cluster, holds no rows (``Plan.excluded``, the reason in
``Plan.notes``) - and takes it back when a remap says it pays:

* :func:`worker_rates` gives every worker of a plan an SRPM ability and an absolute rate
  (work units per second of forward + backward compute, what the cost model's
  ``area / speed`` means): measured (the estimator's ``t2`` and ``tc`` fits, for workers
  planned now or before), else remembered (the probe's throughput), else its plan share
  scaled like :func:`~dask_rpm.drpm.remap.ability_vector` does;
* :func:`idle_remap` is the whole remap that leaves workers idle: SRPM on every worker and
  on the fastest few, each predicted with :mod:`dask_rpm.cost` (latency, bandwidth,
  per-message overhead; :func:`dask_rpm.planners.idle.fastest_subset`);
* :func:`idle_decision` runs at every check: when :func:`idle_remap` plans another set of
  workers than the current plan (idle ones back, or more left idle) and is predicted at
  least ``rpm.drpm.min-gain`` faster per iteration, with a saving over the remaining
  iterations above the migration's cost, it asks for a whole remap. The paper's rule never
  does: with the slow workers idle the planned ones are balanced (``t_min / t_max`` near 1).

Pure module: numpy only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .. import config
from ..cost import predict_iteration_seconds
from ..partition import Plan, PlanError, RealPartition, to_integer
from ..planners.inputs import worker_names
from .policy import Decision
from .remap import migration, migration_seconds, whole_remap

__all__ = ["batch_plan", "idle_decision", "idle_remap", "worker_rates"]


def worker_rates(
    plan: Plan,
    rates: Mapping[int, float],
    abilities: Mapping[int, float],
    remembered: Mapping[int, float] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """``(abilities, rates)`` of every worker of ``plan`` (index-aligned with ``plan.abilities``).

    Parameters
    ----------
    plan
        The current plan; its planned workers must all be in ``rates`` and ``abilities``.
    rates
        Measured rates by worker index: work units per second of compute (``tc`` estimates).
    abilities
        Measured SRPM abilities by worker index (``t2`` estimates, what whole remaps plan on).
    remembered
        Rates measured otherwise (the probe's throughput) by worker index, for workers
        without a measured rate.

    A worker with neither gets its plan share times the planned workers' rate per share.
    A worker without a measured ability gets its rate times the measured workers'
    ability per rate (the two estimates differ by the forward pass).

    Raises
    ------
    PlanError
        A planned worker without a positive finite measured rate or ability.
    """
    n_all = len(plan.abilities)
    planned = list(plan.planned_workers)
    for name, given in (("rate", rates), ("ability", abilities)):
        bad = [w for w in planned if not (math.isfinite(given.get(w, math.nan)) and given[w] > 0)]
        if bad:
            raise PlanError(f"no measured {name} for planned worker(s) {worker_names(bad)}")
    share = np.asarray(plan.abilities, dtype=float)
    per_share = sum(rates[w] for w in planned) / max(float(share[planned].sum()), 1e-300)
    remembered = remembered or {}
    r = np.empty(n_all)
    for w in range(n_all):
        v = rates.get(w, remembered.get(w, share[w] * per_share))
        r[w] = v if math.isfinite(v) and v > 0 else share[w] * per_share
    both = [w for w in abilities if w in rates and 0 <= w < n_all]
    per_rate = sum(abilities[w] for w in both) / sum(rates[w] for w in both)
    a = np.array([abilities.get(w, r[w] * per_rate) for w in range(n_all)], dtype=float)
    # a worker of no share and no measurement (lost, or planned never): the fastest's rate would
    # be a guess; the slowest measured keeps it out of the plan unless it pays even then
    low = [w for w in range(n_all) if not (r[w] > 0 and a[w] > 0)]
    if low:
        r[low], a[low] = min(rates[w] for w in planned), min(abilities[w] for w in planned)
    return a, r


def idle_remap(
    plan: Plan,
    abilities: Sequence[float] | np.ndarray,
    rates: Sequence[float] | np.ndarray,
    *,
    network: Any = None,
    batch: int | None = None,
    min_gain: float | None = None,
) -> Plan:
    """DRPM's whole remap that leaves idle the workers not worth their messages.

    SRPM on ``abilities`` (one per worker of ``plan``), on every worker and on the fastest
    few, the plan predicted fastest at ``rates`` over ``network`` kept
    (:func:`dask_rpm.planners.make_plan` with ``idle=True``); ``min_gain``: the planner's
    margin for more workers (``rpm.planner.min-gain``). The note ``"whole remap"`` is added.
    """
    return whole_remap(
        plan,
        [float(v) for v in abilities],
        rates=[float(v) for v in rates],
        network=network,
        batch=batch,
        idle=True,
        min_gain=min_gain,
    )


def batch_plan(plan: Plan, batch: int | None) -> Plan:
    """``plan`` cut for one mini-batch of ``batch`` samples (each column its share of the batch),
    what one iteration computes and exchanges; ``plan`` itself for full batches (or a batch
    too small for its columns)."""
    if batch is None or batch >= plan.samples:
        return plan
    widths = []
    heights = []
    for c, col in enumerate(plan.columns):
        s0, s1 = plan.column_samples(c)
        widths.append((s1 - s0) / plan.samples)
        heights.append(tuple(plan.rectangle(w).n_hidden / plan.m for w in col))
    try:
        return to_integer(
            RealPartition(plan.columns, tuple(widths), tuple(heights)),
            abilities=plan.abilities,
            shape=plan.shape,
            samples=batch,
            method=plan.method,
            excluded=plan.excluded,
            cost_shape=plan.cost_shape,
        )
    except PlanError:
        return plan


def idle_decision(
    plan: Plan,
    abilities: Sequence[float] | np.ndarray,
    rates: Sequence[float] | np.ndarray,
    *,
    remaining: int,
    ratio: float = math.nan,
    network: Any = None,
    batch: int | None = None,
    min_gain: float | None = None,
    itemsize: int | None = None,
) -> Decision:
    """A whole remap when :func:`idle_remap` plans other workers and that pays.

    Both plans are predicted with the cost model at ``rates`` (one mini-batch's iteration
    with ``batch``); the new one must be at least ``min_gain`` (``rpm.drpm.min-gain``)
    faster, and its saving over ``remaining`` iterations larger than the migration's
    predicted seconds (:func:`~dask_rpm.drpm.remap.migration_seconds`). ``ratio`` is only
    reported. Returns ``Decision("whole", ..., plan=new)`` or a keep with the reason.
    """
    gain = float(config.get("drpm.min-gain", min_gain))
    new = idle_remap(plan, abilities, rates, network=network, batch=batch)
    now, then = set(plan.planned_workers), set(new.planned_workers)
    if now == then:
        return Decision(None, ratio, f"idle check: {_who(plan)} stay as they are")
    speeds = [float(v) for v in rates]
    t_cur = predict_iteration_seconds(batch_plan(plan, batch), speeds, network=network)
    t_new = predict_iteration_seconds(batch_plan(new, batch), speeds, network=network)
    cost = migration_seconds(migration(plan, new, itemsize))
    saving = (t_cur - t_new) * remaining
    back, leave = sorted(then - now), sorted(now - then)
    what = "; ".join(
        s
        for s in (
            f"{worker_names(back)} back" if back else "",
            f"{worker_names(leave)} idle" if leave else "",
        )
        if s
    )
    reason = (
        f"idle check: {what}: iteration {t_cur:.4g} s -> {t_new:.4g} s predicted (rpm.cost at the "
        f"measured rates) over {remaining} iterations saves {saving:.4g} s, migration costs "
        f"{cost:.4g} s"
    )
    ok = t_new <= (1.0 - gain) * t_cur and saving > cost
    if not ok:
        return Decision(None, ratio, f"keep ({reason}; min gain {gain:.0%})", saving, cost)
    return Decision("whole", ratio, reason, saving, cost, new)


def _who(plan: Plan) -> str:
    idle = plan.excluded
    return f"the idle workers ({worker_names(idle)})" if idle else "all workers planned"
