"""DRPM's idle workers: who pays for their messages, at whole remaps and at every check.

Beyond the paper. With a 1 : 100 speed mix (a GPU beside one-thread CPU workers) a slow
worker's rectangle can cost more in messages than its share of the work saves. DRPM then
leaves it idle - it stays in the cluster, holds no rows (``Plan.excluded``, the reason in
``Plan.notes``) - and takes it back when a remap says it pays:

* :func:`iteration_rates` puts the estimator's rates in the work of one iteration (a
  mini-batch's), the unit the cost model predicts in;
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
  does: with the slow workers idle the planned ones are balanced (``t_min / t_max`` near 1);
* :func:`comm_scale` is how much more (or less) the run's communication costs than the
  model says: the plans' measured seconds per iteration less their predicted compute, over
  their predicted communication (:func:`comm_excess`, a least-squares slope over the last
  ``rpm.drpm.window`` checks). Both choices above price communication at that scale
  (:func:`scaled_network`), so a machine whose messages cost more than ``rpm.cost.*``
  assumes (a busy host, a slow comm stack) leaves more workers idle, as it should.

Pure module: numpy only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..comm import CostSettings, LinkClass, network_from_config
from ..cost import CostModel, predict_breakdown, predict_iteration_seconds
from ..plan.partition import Plan, PlanError, RealPartition, to_integer
from ..planners.inputs import worker_names
from .policy import Decision
from .remap import migration, migration_seconds, whole_remap
from .settings import DRPMSettings

__all__ = [
    "batch_plan",
    "comm_excess",
    "comm_scale",
    "idle_decision",
    "idle_remap",
    "iteration_rates",
    "scaled_network",
    "worker_rates",
]


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


def iteration_rates(
    rates: Mapping[int, float], samples: int, batch: int | None
) -> dict[int, float]:
    """Measured rates in the work of one iteration: what the cost model's ``area / speed`` takes.

    DRPM's estimator counts a worker's work as its plan rectangle's area, hidden units times
    its column's samples of the whole training set (:meth:`dask_rpm.plan.partition.Plan.rectangle`),
    and its rate as that over the seconds of one iteration's compute. A mini-batch iteration
    computes ``batch / samples`` of that area, and the idle choices predict one mini-batch's
    iteration (:func:`batch_plan`), so they take the rates times ``batch / samples``; the probe's
    throughput is already per unit computed. Without this a mini-batch's compute is predicted
    ``samples / batch`` times too fast, every measured second lands in communication
    (:func:`comm_excess`), and workers whose share pays are left idle (two equal one-thread
    workers at 784-256-128-10 with batches of 512 of 20,000: one was left idle).

    Parameters
    ----------
    rates
        Work units (plan area) per second of compute, by worker index (the ``tc`` estimates).
    samples
        Training samples (the plan's).
    batch
        Samples per iteration; ``None`` (full batch) or at least ``samples``: the rates as given.

    Returns
    -------
    dict
        The rates per unit of one iteration's work, by worker index.
    """
    if batch is None or batch >= samples:
        return dict(rates)
    fraction = batch / samples
    return {w: v * fraction for w, v in rates.items()}


def idle_remap(
    plan: Plan,
    abilities: Sequence[float] | np.ndarray,
    rates: Sequence[float] | np.ndarray,
    *,
    network: Any = None,
    comm_scale: float = 1.0,
    batch: int | None = None,
    min_gain: float | None = None,
    settings: DRPMSettings | None = None,
) -> Plan:
    """DRPM's whole remap that leaves idle the workers not worth their messages.

    SRPM on ``abilities`` (one per worker of ``plan``), on every worker and on the fastest
    few, the plan predicted fastest at ``rates`` over ``network`` (its communication times
    ``comm_scale``, :func:`scaled_network`) kept (:func:`dask_rpm.planners.make_plan` with
    ``idle=True``); more workers only when predicted ``min_gain`` faster than fewer
    (``None``: that of ``settings``, ``None`` reading ``rpm.drpm.*``). The note
    ``"whole remap"`` is added.
    """
    return whole_remap(
        plan,
        [float(v) for v in abilities],
        rates=[float(v) for v in rates],
        network=scaled_network(network, comm_scale),
        batch=batch,
        idle=True,
        min_gain=DRPMSettings.resolve(settings, min_gain=min_gain).min_gain,
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
    comm_scale: float = 1.0,
    batch: int | None = None,
    min_gain: float | None = None,
    itemsize: int | None = None,
    settings: DRPMSettings | None = None,
) -> Decision:
    """A whole remap when :func:`idle_remap` plans other workers and that pays.

    Both plans are predicted with the cost model at ``rates`` over ``network`` with its
    communication times ``comm_scale`` (one mini-batch's iteration with ``batch``); the new
    one must be at least ``min_gain`` (``None``: that of ``settings``, ``rpm.drpm.min-gain``)
    faster, and its saving over ``remaining`` iterations larger than the migration's
    predicted seconds (:func:`~dask_rpm.drpm.remap.migration_seconds` at ``rpm.cost.*``,
    ``itemsize`` winning when given). ``ratio`` is only reported. Returns
    ``Decision("whole", ..., plan=new)`` or a keep with the reason. ``settings``: ``rpm.drpm.*``
    (:class:`~dask_rpm.drpm.settings.DRPMSettings`); ``None`` reads them now.
    """
    s = DRPMSettings.resolve(settings)
    gain = s.min_gain if min_gain is None else float(min_gain)
    new = idle_remap(
        plan, abilities, rates, network=network, comm_scale=comm_scale, batch=batch, settings=s
    )
    now, then = set(plan.planned_workers), set(new.planned_workers)
    if now == then:
        return Decision(None, ratio, f"idle check: {_who(plan)} stay as they are")
    speeds = [float(v) for v in rates]
    model = CostModel.from_config(scaled_network(network, comm_scale))
    t_cur = predict_iteration_seconds(batch_plan(plan, batch), speeds, model=model)
    t_new = predict_iteration_seconds(batch_plan(new, batch), speeds, model=model)
    prices = CostSettings.from_config(itemsize=itemsize)
    cost = migration_seconds(
        migration(plan, new, prices.itemsize), latency=prices.latency, bandwidth=prices.bandwidth
    )
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
        f"measured rates, communication x{comm_scale:.3g} as measured) over {remaining} "
        f"iterations saves {saving:.4g} s, migration costs {cost:.4g} s"
    )
    ok = t_new <= (1.0 - gain) * t_cur and saving > cost
    if not ok:
        return Decision(None, ratio, f"keep ({reason}; min gain {gain:.0%})", saving, cost)
    return Decision("whole", ratio, reason, saving, cost, new)


def comm_excess(
    plan: Plan,
    rates: Sequence[float] | np.ndarray,
    seconds: float,
    *,
    network: Any = None,
    batch: int | None = None,
) -> tuple[float, float] | None:
    """The communication the model predicts for ``plan`` and what the run measured: a point of
    :func:`comm_scale`'s fit.

    ``(predicted - compute - fixed, seconds - compute - fixed)``: ``seconds`` is the plan's
    measured time per iteration (a median), ``compute`` its slowest worker's predicted compute
    at ``rates`` (measured too: the ``tc`` fits), ``predicted`` the model's iteration over
    ``network`` and ``fixed`` its plan-independent seconds. Everything the model does not see
    - the engine's bookkeeping per message and per worker, a busy host - lands in the
    measured part. ``None`` when ``plan`` has no communication (one worker) or ``seconds`` is
    not a time. Approximate where the slowest column is not the one with the slowest worker.
    """
    if not (math.isfinite(seconds) and seconds > 0) or len(plan.planned_workers) < 2:
        return None
    net = network_from_config(network)
    b = predict_breakdown(batch_plan(plan, batch), [float(v) for v in rates], network=net)
    compute = max(b["compute"].values())
    comm = float(b["total"]) - compute - float(net.fixed)
    if not comm > 0:
        return None
    return comm, max(seconds - compute - float(net.fixed), 0.0)


def comm_scale(points: Sequence[tuple[float, float]]) -> float:
    """How much more the run's communication costs than the model says: the least-squares slope
    through the origin of measured over predicted communication (:func:`comm_excess` points
    of the plans the run had), ``sum(p m) / sum(p^2)``; 1 without points (the model as given).

    One slope over several plans, not the last plan's ratio: the model's communication of
    two plans may be off by different factors, and a ratio measured on one plan would make
    the other look better, and back.
    """
    den = sum(p * p for p, _ in points)
    return sum(p * m for p, m in points) / den if den > 0 else 1.0


def scaled_network(network: Any, scale: float) -> Any:
    """``network`` (``None``: ``rpm.cost.*``) with every communication cost times ``scale``:
    latencies, per-message overheads, additions and per-worker bookkeeping ``x scale``,
    bandwidths ``/ scale``; the plan-independent ``fixed`` stays. ``scale`` 1: as given."""
    if scale == 1.0:
        return network
    net = network_from_config(network)
    k = max(float(scale), 0.0)

    def per(bw: float) -> float:  # bandwidth: time per byte times k
        return bw / k if k > 0 else math.inf

    classes = (
        None
        if net.classes is None
        else {c: LinkClass(v.latency * k, per(v.bandwidth)) for c, v in net.classes.items()}
    )
    return net._replace(
        latency=net.latency * k,
        bandwidth=per(net.bandwidth),
        overhead=net.overhead * k,
        host_bandwidth=per(net.host_bandwidth),
        reduce=net.reduce * k,
        worker_cpu=net.worker_cpu * k,
        classes=classes,
    )


def _who(plan: Plan) -> str:
    idle = plan.excluded
    return f"the idle workers ({worker_names(idle)})" if idle else "all workers planned"
