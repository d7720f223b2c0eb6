"""From abilities to a validated integer plan: :func:`make_plan` and :func:`fastest_grid`."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from .. import config
from ..cost import predict_iteration_seconds
from ..partition import Plan, PlanError, RealPartition, snap_with_count, to_integer
from .grids import divisors
from .inputs import (
    check_count,
    check_fraction,
    normalise,
    parse_shape,
    validate_abilities,
    worker_label,
    worker_names,
)
from .registry import Planner, PlannerResult, get_planner

__all__ = ["fastest_grid", "make_plan"]


def make_plan(
    abilities: Sequence[float] | np.ndarray,
    shape: Any,
    samples: int,
    method: str | Planner | None = None,
    *,
    dp: int | None = None,
    small_group: float | None = None,
    workers: Sequence[Any] | None = None,
    rates: Sequence[float] | None = None,
    network: Any = None,
    batch: int | None = None,
    cost_shape: Any = None,
) -> Plan:
    """Plan one BP iteration for workers of the given abilities.

    Parameters
    ----------
    abilities
        One positive, finite number per worker (relative speed, any scale).
        Worker ``i`` of the plan is ``abilities[i]``.
    shape
        Network ``(n, m, l)`` or a string ``"n-m-l"``.
    samples
        Number of training samples ``s``.
    method
        A registered planner name (``srpm``, ``uniform``, ``grid-h``,
        ``grid-hrev``/``grid``) or a planner callable; ``None`` reads
        ``rpm.planner.method``.
    dp
        Number of columns (data-parallel degree). Baselines: ``N_DP``, must
        divide N; SRPM: forces ``C``. ``None`` lets the planner choose by the
        ``t_comm`` model.
    small_group
        Band threshold for :func:`~dask_rpm.partition.snap_small_groups` as a
        fraction of m; ``None`` reads ``rpm.planner.small-group``; 0 disables.
    workers
        Optional worker names/addresses, one per ability (see ``Plan.with_workers``).
    rates, network
        For planners that minimise predicted seconds (``srpm-time``): each
        worker's speed in work units per second (index-aligned with
        ``abilities``) and the :class:`~dask_rpm.cost.Interconnect` (its
        ``hosts``/``groups`` index-aligned too). Other planners ignore them.
    batch
        Samples per iteration when training on mini-batches (``None``: all
        ``samples``, full batch). An iteration then exchanges partial
        products of ``batch`` samples, not ``samples``, so with ``srpm`` (and ``srpm-time``) the
        number of columns is chosen for a problem of ``batch`` samples and
        the cuts are then made on ``samples`` (a column takes the same share
        of every mini-batch). Measured on this 2-core machine (EMULATED,
        docs/benchmarks.md): 1.2-2.3x faster per iteration at batch sizes
        256 and 1024 than the plan for the whole training set.
    cost_shape
        ``(n, m, l)`` the communication model counts with instead of ``shape`` (a network of
        several hidden layers exchanges each layer's activations in a column and every
        layer's rows across columns: :attr:`Layers.cost_shape
        <dask_rpm.nn.layers.Layers.cost_shape>`); the plan records it for its remaps.

    Returns
    -------
    Plan
        Validated integer plan. ``t_comm`` is the model value of the real
        partition (before snapping and rounding). Workers too slow for one
        whole unit - whose real rectangle would be thinner than
        ``rpm.planner.min-units`` hidden units, or narrower than that many
        samples (rounding would then overload them by 2x or more) - are left
        out: the plan is recomputed without them, they are listed in
        ``excluded`` and explained in ``notes``.

    Raises
    ------
    PlanError
        For invalid input; the message names the value and how to fix it.
    """
    ab = validate_abilities(abilities)
    shape = parse_shape(shape)
    cost = shape if cost_shape is None else parse_shape(cost_shape)
    samples = check_count("samples", samples, "give the number of training samples, e.g. 1024")
    dp = _columns_for_batch(
        abilities, cost, samples, method, dp, batch, small_group, rates=rates, network=network
    )
    if dp is not None:
        dp = check_count(
            "dp", dp, "give the number of columns (data-parallel degree) or leave it out"
        )
    planner, name = _resolve_method(method)
    small_group = check_fraction("small_group", config.get("planner.small-group", small_group))
    min_units = float(config.get("planner.min-units"))
    if not (math.isfinite(min_units) and min_units >= 0):
        raise PlanError(f"rpm.planner.min-units={min_units} must be a non-negative number")
    for what, given in (("worker names", workers), ("rates", rates)):
        if given is not None and len(given) != len(ab):
            raise PlanError(
                f"{len(given)} {what} given for {len(ab)} abilities; give one per ability"
            )

    p_all = normalise(ab)

    time_objective = getattr(planner, "time_objective", False)  # a planner minimising seconds

    def plan_on(active: list[int]) -> PlannerResult:
        extra: dict[str, Any] = {}
        if time_objective:
            extra["rates"] = None if rates is None else [float(rates[i]) for i in active]
            extra["network"] = _subset_network(network, active)
        return planner(normalise(p_all[active]), cost, samples, dp=dp, **extra)

    def run(active: list[int]) -> PlannerResult:
        if not time_objective or dp is not None:
            return plan_on(active)
        return _fastest_subset(plan_on, active, p_all)

    res, active, excluded, notes = _plan_without_slow(run, p_all, shape[1], samples, min_units)
    part = res.partition
    mapped = RealPartition(
        tuple(tuple(active[i] for i in col) for col in part.columns), part.widths, part.heights
    )
    planned = {w for col in mapped.columns for w in col}
    idle = [w for w in active if w not in planned]
    if idle:
        excluded = [*excluded, *idle]
        why = "the planner gave them no rectangle"
        if "predicted_seconds_all" in res.meta:  # _fastest_subset's choice
            why = (
                f"the plan without them is predicted faster ({res.meta['predicted_seconds']:.4g} "
                f"s/iteration against {res.meta['predicted_seconds_all']:.4g} s with every "
                f"worker; messages would cost more than their share of the work saves)"
            )
        notes.append(f"left {worker_names(idle)} idle: {why}")
    if "small_group" in res.meta:  # the planner chose the threshold by its own objective
        small_group = float(res.meta["small_group"])
    snapped, merged = snap_with_count(mapped, small_group)
    if merged:
        notes.append(
            f"snapped {merged} thin horizontal band(s) of at most {small_group:g} of m "
            f"(rpm.planner.small-group); t_comm values are before snapping"
        )
    plan = to_integer(
        snapped,
        abilities=p_all,
        shape=shape,
        samples=samples,
        method=res.method or name,
        t_comm=float(res.t_comm),
        t_comm_by_columns=tuple(float(v) for v in res.t_comm_by_columns),
        excluded=tuple(sorted(excluded)),
        notes=(*res.notes, *notes),
        cost_shape=None if cost == shape else cost,
    )
    if workers is not None:
        plan = plan.with_workers(list(workers))
    return plan


#: planners whose number of columns is chosen for one mini-batch (``make_plan(batch=...)``)
_BATCH_AWARE = ("srpm", "srpm-time")


def _columns_for_batch(
    abilities: Sequence[float] | np.ndarray,
    shape: tuple[int, int, int],
    samples: int,
    method: str | Planner | None,
    dp: int | None,
    batch: int | None,
    small_group: float | None,
    *,
    rates: Sequence[float] | None = None,
    network: Any = None,
) -> int | None:
    """``dp`` as given, or for SRPM (and ``srpm-time``) on mini-batches the columns of a
    one-batch problem.

    An iteration exchanges the partial products of one batch, so the number of columns is
    chosen for ``batch`` samples; the cuts are then made on the whole set.
    """
    name = str(method or config.get("planner.method"))
    if batch is None or dp is not None or batch >= samples or name not in _BATCH_AWARE:
        return dp
    try:
        one = make_plan(
            abilities, shape, batch, name, small_group=small_group, rates=rates, network=network
        )
        return one.n_columns
    except PlanError:  # a batch too small to plan (fewer samples than columns): plan the set
        return None


def _resolve_method(method: str | Planner | None) -> tuple[Planner, str]:
    """The planner function and the name recorded in the plan (``None``: rpm.planner.method)."""
    method = config.get("planner.method", method)
    if callable(method):
        return method, getattr(method, "__name__", "custom")
    return get_planner(method), str(method).strip().lower()


def _plan_without_slow(
    run: Callable[[list[int]], PlannerResult],
    p_all: np.ndarray,
    m: int,
    samples: int,
    min_units: float,
) -> tuple[PlannerResult, list[int], list[int], list[str]]:
    """Plan, leaving out workers whose rectangle would be below ``min_units`` whole units.

    Returns the planner's result for the workers kept, those workers (indices into
    ``p_all``), the ones left out and a note for each.
    """
    active = list(range(len(p_all)))
    excluded: list[int] = []
    notes: list[str] = []
    while True:
        try:
            res = run(active)
        except PlanError as e:
            if excluded:
                raise PlanError(
                    f"after leaving out {worker_names(excluded)} (too slow for one hidden unit): {e}"
                ) from None
            raise
        # A worker's real rectangle, in whole units along each axis.
        part = res.partition
        shares = [
            (active[i], m * h, samples * wd)
            for col, hs, wd in zip(part.columns, part.heights, part.widths)
            for i, h in zip(col, hs)
        ]
        low = [(w, hu, su) for w, hu, su in shares if hu < min_units or su < min_units]
        if not low or len(low) == len(active):
            return res, active, excluded, notes
        # Leave out the slowest offenders (within a factor 2 of the slowest) and replan:
        # faster offenders are usually only victims of sharing a column or row with them
        # (grid baselines) and recover in the replan. Factor-2 bands bound the number of
        # replans by log2(max/min ability).
        floor = 2 * min(p_all[w] for w, _, _ in low)
        low = [x for x in low if p_all[x[0]] <= floor]
        for w, hu, su in sorted(low):
            notes.append(
                f"excluded {worker_label(w)} (ability {p_all[w]:.4g}): its rectangle would be "
                f"{hu:.3g} hidden units x {su:.3g} samples, below rpm.planner.min-units="
                f"{min_units:g} of a unit; planned without it"
            )
        gone = {w for w, _, _ in low}
        excluded += sorted(gone)
        active = [w for w in active if w not in gone]


#: how many of the fastest workers :func:`_fastest_subset` tries (and every worker): enough to
#: find "one worker" and "a few" on a latency-bound job without planning N times for large N
_SUBSET_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)


def _fastest_subset(
    plan_on: Callable[[list[int]], PlannerResult], active: list[int], p_all: np.ndarray
) -> PlannerResult:
    """The plan on every worker of ``active``, or on its fastest ``k`` alone when that is
    predicted faster (a job so small that messages cost more than a worker's share saves).

    ``plan_on`` is a planner that minimises seconds (``meta["predicted_seconds"]``). The result's
    partition indexes ``active``; workers it leaves out hold no rows (idle).
    """
    whole = plan_on(active)
    t_all = float(whole.meta["predicted_seconds"])
    best, t_best = whole, t_all
    fastest = sorted(range(len(active)), key=lambda i: (-p_all[active[i]], i))
    for k in (k for k in _SUBSET_SIZES if k < len(active)):
        keep = sorted(fastest[:k])
        try:
            res = plan_on([active[i] for i in keep])
        except PlanError:
            continue
        t = float(res.meta["predicted_seconds"])
        if t < t_best:  # strictly faster: a tie keeps more workers
            part = res.partition
            cols = tuple(tuple(keep[i] for i in col) for col in part.columns)
            best = replace(res, partition=RealPartition(cols, part.widths, part.heights))
            t_best = t
    meta = {**best.meta, "predicted_seconds_all": t_all}
    return replace(best, meta=meta)


def _subset_network(network: Any, active: Sequence[int]) -> Any:
    """``network`` with its per-worker host/group labels restricted to the planned workers."""
    if network is None:
        return None
    repl = {}
    for name in ("hosts", "groups"):
        labels = getattr(network, name)
        if labels is not None:
            repl[name] = tuple(labels[i] for i in active)
    return network._replace(**repl) if repl else network


def fastest_grid(
    abilities: Sequence[float] | np.ndarray,
    shape: Any,
    samples: int,
    method: str,
    speeds: Sequence[float] | Mapping[Any, float],
    *,
    latency: float | None = None,
    bandwidth: float | None = None,
    network: Any = None,
    vertical: str | None = None,
    horizontal: str | None = None,
    cost_shape: Any = None,
) -> tuple[Plan, float]:
    """The ``N_DP`` plan of a grid baseline predicted fastest in seconds.

    ``dp=None`` in :func:`make_plan` picks ``N_DP`` by the element-count
    ``t_comm``; this picks it by :func:`~dask_rpm.cost.predict_iteration_seconds`
    with the workers' ``speeds`` (work units per second), which also counts
    compute imbalance. Every divisor of N is tried; infeasible ones are
    skipped; ties go to the smaller ``N_DP``. ``network``, ``vertical`` and
    ``horizontal`` are passed to the model as they are; ``cost_shape`` to
    :func:`make_plan` (a network of several hidden layers).

    Returns
    -------
    (Plan, float)
        The plan and its predicted seconds per iteration.

    Raises
    ------
    PlanError
        No ``N_DP`` gives a feasible plan.
    """
    best: tuple[Plan, float] | None = None
    for dp in divisors(len(abilities)):
        try:
            plan = make_plan(abilities, shape, samples, method=method, dp=dp, cost_shape=cost_shape)
        except PlanError:
            continue
        t = predict_iteration_seconds(
            plan,
            speeds,
            latency=latency,
            bandwidth=bandwidth,
            network=network,
            vertical=vertical,
            horizontal=horizontal,
        )
        if best is None or t < best[1]:
            best = (plan, t)
    if best is None:
        raise PlanError(
            f"{method}: no N_DP dividing {len(abilities)} workers gives a feasible plan"
        )
    return best
