"""From abilities to a validated integer plan: :func:`make_plan` and :func:`fastest_grid`."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..cost import CostModel, predict_iteration_seconds
from ..plan.partition import Plan, PlanError, RealPartition, snap_with_count, to_integer
from .grids import divisors
from .idle import fastest_subset, idle_note, predicted, subset_network
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
from .settings import PlannerSettings

if TYPE_CHECKING:  # the pure layer reaches no torch, not even through nn.cnn's helpers
    from ..nn.cnn import ConvLayers

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
    idle: bool | None = None,
    min_gain: float | None = None,
) -> Plan:
    """Plan one BP iteration for workers of the given abilities.

    Parameters
    ----------
    abilities
        One positive, finite number per worker (relative speed, any scale).
        Worker ``i`` of the plan is ``abilities[i]``.
    shape
        Network ``(n, m, l)``, a string ``"n-m-l"``, or a CNN's geometry: the
        :class:`~dask_rpm.nn.cnn.ConvLayers` that :func:`~dask_rpm.nn.cnn_records.conv_layers`
        builds from a ``torch.nn.Sequential`` or layer records and the image shape. A CNN is
        planned for its :attr:`~dask_rpm.nn.cnn.ConvLayers.plan_shape` (the planners cut the
        narrowest stage's channels; every stage follows the same rows) and counted with its
        :attr:`~dask_rpm.nn.cnn.ConvLayers.cost_shape`. With ``dp`` columns that cannot each
        hold a worker per channel (more than ``dp x m`` workers), the slowest workers beyond
        that stay idle (in ``excluded``, the reason in ``notes``) instead of an error.
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
        Band threshold for :func:`~dask_rpm.plan.partition.snap_small_groups` as a
        fraction of m; ``None`` reads ``rpm.planner.small-group``; 0 disables.
    workers
        Optional worker names/addresses, one per ability (see ``Plan.with_workers``).
    rates, network
        For planners that minimise predicted seconds (``srpm-time``): each
        worker's speed in work units per second (index-aligned with
        ``abilities``) and the :class:`~dask_rpm.comm.Interconnect` (its
        ``hosts``/``groups`` index-aligned too). Other planners use them only with
        ``idle=True``.
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
        <dask_rpm.nn.layers.Layers.cost_shape>`); the plan records it for its remaps. Leave
        it out with a :class:`~dask_rpm.nn.cnn.ConvLayers` ``shape``, which gives its own.
    idle
        Leave workers idle (in ``excluded``, holding no rows, the reason in ``notes``) when a
        plan on the fastest few is predicted faster than on every worker
        (:func:`~dask_rpm.planners.idle.fastest_subset`: the cost model at ``rates`` over
        ``network``). ``None``: for the planners that minimise seconds (``srpm-time``) only;
        ``True`` with any planner given ``rates`` (DRPM's SRPM plans); never with ``dp``.
    min_gain
        A plan on more workers is chosen only when predicted at least this much (relative)
        faster than one on fewer (DRPM passes ``rpm.drpm.min-gain``); ``None``: 0, any gain.
        With 0 ``srpm-time`` is never predicted slower than any plan it considered.

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
    conv = _conv_layers(shape)
    if conv is not None:
        if cost_shape is not None:
            raise PlanError(
                f"cost_shape={cost_shape!r} given with a CNN's ConvLayers, which has its own "
                f"({'-'.join(map(str, conv.cost_shape))}); leave cost_shape out"
            )
        shape, cost_shape = conv.plan_shape, conv.cost_shape
    shape = parse_shape(shape)
    cost = shape if cost_shape is None else parse_shape(cost_shape)
    samples = check_count("samples", samples, "give the number of training samples, e.g. 1024")
    for what, given in (("worker names", workers), ("rates", rates)):
        if given is not None and len(given) != len(ab):
            raise PlanError(
                f"{len(given)} {what} given for {len(ab)} abilities; give one per ability"
            )
    gain = _min_gain(min_gain)
    settings = PlannerSettings.from_config()  # rpm.planner.*, once for the whole call
    if conv is not None:  # srpm-time's rate without rates: a CNN's rows are heavier
        settings = settings.for_network(conv.unit_work())
    planner, _ = _resolve_method(method, settings)
    model = None  # the cost model (rpm.cost.*, rpm.engine.*), read once where plans are timed
    if getattr(planner, "time_objective", False) or (idle and rates is not None):
        model = CostModel.from_config(network)
    kw: dict[str, Any] = dict(
        rates=rates,
        model=model,
        idle=idle,
        min_gain=gain,
        small_group=small_group,
        settings=settings,
    )
    dp, carried = _columns_for_batch(abilities, cost, samples, method, dp, batch, **kw)
    if dp is not None:
        dp = check_count(
            "dp", dp, "give the number of columns (data-parallel degree) or leave it out"
        )
    if conv is not None and dp is not None:
        carried = _fewer_members(ab, dp, conv)
    plan, _, _ = _make(ab, shape, cost, samples, method, dp, carried, **kw)
    if workers is not None:
        plan = plan.with_workers(list(workers))
    return plan


def _conv_layers(shape: Any) -> ConvLayers | None:
    """``shape`` when it is a CNN's :class:`~dask_rpm.nn.cnn.ConvLayers`, else ``None``.

    Recognised by what it has rather than by its class: importing :mod:`dask_rpm.nn.cnn` here
    would give the planners a path to torch (its ``torch.nn`` readers), which this pure layer
    must not import.
    """
    if all(hasattr(shape, a) for a in ("image", "stages", "plan_shape", "cost_shape")):
        return shape
    return None


def _fewer_members(ab: np.ndarray, dp: int, conv: ConvLayers) -> tuple[list[int], str] | None:
    """The workers a CNN's ``dp`` columns leave idle, and the note saying why (``None``: all fit).

    A worker needs at least one channel of every stage, so a column holds at most ``m`` workers
    (the narrowest stage's channels): the slowest beyond ``dp x m`` stay idle, which keeps every
    column feasible for every planner (a grid's ``N_DP`` then divides the ``dp x m`` kept).
    """
    room = dp * conv.m
    if len(ab) <= room:
        return None
    # slowest first; among equal abilities the later worker (the order the user gave)
    order = sorted(range(len(ab)), key=lambda w: (ab[w], -w))
    idle = sorted(order[: len(ab) - room])
    narrow = min(range(conv.depth), key=lambda k: (conv.hidden[k], k))
    bias = (
        ", its output bias channel included" if narrow == conv.depth - 1 and conv.out_bias else ""
    )
    note = (
        f"left {worker_names(idle)} idle (the slowest): dp={dp} columns hold at most "
        f"{conv.m} workers each, one per row of the network's narrowest stage (stage "
        f"{narrow + 1}: {conv.m} rows{bias}), so {room} of the {len(ab)} workers; give a larger "
        f"dp or a network with more channels to use them"
    )
    return idle, note


def _min_gain(min_gain: float | None) -> float:
    """``min_gain`` (``None``: 0), checked: a fraction in [0, 1)."""
    v = 0.0 if min_gain is None else min_gain
    try:
        gain = float(v)
    except (TypeError, ValueError):
        gain = math.nan
    if not (math.isfinite(gain) and 0 <= gain < 1):
        raise PlanError(f"min_gain={v!r}; give a fraction in [0, 1), e.g. 0.02 (rpm.drpm.min-gain)")
    return gain


def _make(
    ab: np.ndarray,
    shape: tuple[int, int, int],
    cost: tuple[int, int, int],
    samples: int,
    method: str | Planner | None,
    dp: int | None,
    carried: tuple[list[int], str] | None,
    *,
    rates: Sequence[float] | None,
    model: CostModel | None,
    idle: bool | None,
    min_gain: float,
    small_group: float | None,
    settings: PlannerSettings,
    per_batch: int | None = None,
) -> tuple[Plan, list[int], str]:
    """:func:`make_plan` on checked input; also returns the workers left idle and why.

    ``model``: the cost model of :func:`make_plan`'s ``network`` (``None`` where no plan is
    timed); ``settings``: ``rpm.planner.*`` as :func:`make_plan` read them.

    ``carried``: workers already left idle (by the plan of one mini-batch) and the note
    saying why; they are not planned and no further subset is searched. ``per_batch``: the
    problem is one mini-batch of that many samples (said in the note).
    """
    planner, name = _resolve_method(method, settings)
    snap = check_fraction(
        "small_group", settings.small_group if small_group is None else small_group
    )
    min_units = settings.min_units
    if not (math.isfinite(min_units) and min_units >= 0):
        raise PlanError(f"rpm.planner.min-units={min_units} must be a non-negative number")
    p_all = normalise(ab)
    time_objective = getattr(planner, "time_objective", False)  # a planner minimising seconds
    # Leave workers idle when fewer are predicted faster: planners minimising seconds always,
    # others when asked and given rates to predict with; never with forced columns.
    search = (time_objective if idle is None else bool(idle)) and dp is None and carried is None
    search = search and (time_objective or rates is not None)

    def plan_on(active: list[int]) -> PlannerResult:
        sub_rates = None if rates is None else [float(rates[i]) for i in active]
        sub_model = None
        if model is not None:
            sub_model = model._replace(network=subset_network(model.network, active))
        p = normalise(p_all[active])
        if time_objective:  # such a planner takes the rates and the records read once
            extra: dict[str, Any] = {"rates": sub_rates, "model": sub_model, "settings": settings}
            return planner(p, cost, samples, dp=dp, **extra)
        res = planner(p, cost, samples, dp=dp)
        if search:  # fastest_subset compares predicted seconds
            assert sub_rates is not None and sub_model is not None
            res = predicted(
                res, p, cost, samples, small_group=snap, rates=sub_rates, model=sub_model
            )
        return res

    def run(active: list[int]) -> PlannerResult:
        if not search:
            return plan_on(active)
        speed = p_all if rates is None else np.asarray(rates, dtype=float)
        return fastest_subset(plan_on, active, speed, min_gain)

    start = list(range(len(p_all)))
    if carried is not None:
        start = [w for w in start if w not in carried[0]]
    res, active, excluded, notes = _plan_without_slow(
        run, p_all, shape[1], samples, min_units, start
    )
    part = res.partition
    mapped = RealPartition(
        tuple(tuple(active[i] for i in col) for col in part.columns), part.widths, part.heights
    )
    planned = {w for col in mapped.columns for w in col}
    idle_now = [w for w in active if w not in planned]
    note = idle_note(idle_now, res.meta, batch=per_batch) if idle_now else ""
    if note:
        notes.append(note)
    if carried is not None:
        idle_now, note = sorted([*carried[0], *idle_now]), carried[1]
        notes.append(note)
    excluded = [*excluded, *idle_now]
    if "small_group" in res.meta:  # the planner chose the threshold by its own objective
        snap = float(res.meta["small_group"])
    snapped, merged = snap_with_count(mapped, snap)
    if merged:
        notes.append(
            f"snapped {merged} thin horizontal band(s) of at most {snap:g} of m "
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
    return plan, idle_now, note


#: planners whose number of columns is chosen for one mini-batch (``make_plan(batch=...)``)
_BATCH_AWARE = ("srpm", "srpm-time")


def _columns_for_batch(
    abilities: Sequence[float] | np.ndarray,
    shape: tuple[int, int, int],
    samples: int,
    method: str | Planner | None,
    dp: int | None,
    batch: int | None,
    **kw: Any,
) -> tuple[int | None, tuple[list[int], str] | None]:
    """``dp`` as given, or for SRPM (and ``srpm-time``) on mini-batches the columns of a
    one-batch problem, and the workers that problem leaves idle with the note saying why
    (``None`` when it was not planned).

    An iteration exchanges the partial products of one batch, so the number of columns (and
    whether a worker's share pays for its messages) is chosen for ``batch`` samples; the cuts
    are then made on the whole set. ``kw``: :func:`_make`'s keywords.
    """
    name = str(method or kw["settings"].method)
    if batch is None or dp is not None or batch >= samples or name not in _BATCH_AWARE:
        return dp, None
    ab = validate_abilities(abilities)
    try:
        one, idle, note = _make(ab, shape, shape, batch, name, None, None, per_batch=batch, **kw)
    except PlanError:  # a batch too small to plan (fewer samples than columns): plan the set
        return None, None
    # only a chosen subset is carried (idle asked, or a planner minimising seconds): without
    # that choice the one-batch problem gives the number of columns alone, as it always did
    chosen = kw.get("idle") or getattr(
        _resolve_method(name, kw["settings"])[0], "time_objective", False
    )
    return one.n_columns, ((idle, note) if idle and chosen else None)


def _resolve_method(method: str | Planner | None, settings: PlannerSettings) -> tuple[Planner, str]:
    """The planner function and the name recorded in the plan (``None``: rpm.planner.method)."""
    method = settings.method if method is None else method
    if callable(method):
        return method, getattr(method, "__name__", "custom")
    return get_planner(method), str(method).strip().lower()


def _plan_without_slow(
    run: Callable[[list[int]], PlannerResult],
    p_all: np.ndarray,
    m: int,
    samples: int,
    min_units: float,
    start: list[int],
) -> tuple[PlannerResult, list[int], list[int], list[str]]:
    """Plan, leaving out workers whose rectangle would be below ``min_units`` whole units.

    Returns the planner's result for the workers kept, those workers (indices into
    ``p_all``), the ones left out and a note for each.
    """
    active = list(start)
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
    model = CostModel.from_config(
        network, latency=latency, bandwidth=bandwidth, vertical=vertical, horizontal=horizontal
    )
    for dp in divisors(len(abilities)):
        try:
            plan = make_plan(abilities, shape, samples, method=method, dp=dp, cost_shape=cost_shape)
        except PlanError:
            continue
        t = predict_iteration_seconds(plan, speeds, model=model)
        if best is None or t < best[1]:
            best = (plan, t)
    if best is None:
        raise PlanError(
            f"{method}: no N_DP dividing {len(abilities)} workers gives a feasible plan"
        )
    return best
