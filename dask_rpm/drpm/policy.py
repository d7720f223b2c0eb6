"""When to re-map: the paper's threshold rule, a cost rule, and the check interval (DRPM).

Paper rule (``policy="paper"``, docs/method.md §6)
-----------------------------------------------
Every ``R`` iterations compare the fastest and slowest worker's ``t1``:

* first check and no initial abilities were given -> ``"whole"`` (the run
  started from a uniform mapping, which is rarely close);
* ``t_min / t_max < T_whole`` -> ``"whole"``;
* ``t_min / t_max < T_line``  -> ``"column"``;
* otherwise keep the mapping.

Cost rule (``policy="cost"``, beyond the paper)
-----------------------------------------------
The paper's thresholds ignore how long the run still has to go and what a remap
costs. The cost rule builds the candidate plans (column remap on the ``t1``
speeds, whole remap on the ``t2`` speeds), predicts one iteration of each with
the current speeds (:func:`predict_step_seconds`: the slowest worker's
``area / speed`` plus optional communication seconds), and remaps only if::

    (T_current - T_new) * remaining_iterations  >  migration_seconds(current -> new)

choosing the candidate with the largest net saving. A candidate must also be
predicted at least ``min_gain`` (relative) faster, so estimation noise alone
does not trigger migrations.

Check interval (``R = "auto"``)
-------------------------------
See :func:`auto_interval`.

Pure module: numpy only.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ..comm.network import CostSettings
from ..plan.partition import Plan
from .remap import (
    Abilities,
    ability_vector,
    column_remap,
    migration,
    migration_seconds,
    rows_gained,
    whole_remap,
)
from .settings import DRPMSettings

__all__ = [
    "Decision",
    "auto_interval",
    "cost_decision",
    "decide",
    "first_interval",
    "imbalance_ratio",
    "paper_decision",
    "predict_step_seconds",
    "predict_worker_seconds",
]

RemapKind = Literal["whole", "column"]
CommSeconds = float | Callable[[Plan], float]


@dataclass(frozen=True)
class Decision:
    """The outcome of one remap check.

    Attributes
    ----------
    kind
        ``"whole"``, ``"column"`` or ``None`` (keep the mapping).
    ratio
        ``t_min / t_max`` over workers (measured, or predicted for the current
        plan when the cost rule was given no times).
    reason
        One line saying which rule fired, with its numbers.
    saving
        Cost rule: predicted seconds saved over the remaining iterations by the
        chosen (or best rejected) candidate; NaN for the paper rule.
    cost
        Cost rule: predicted migration seconds of that candidate; NaN otherwise.
    plan
        Cost rule: the chosen new plan, so the caller need not plan again.
    """

    kind: RemapKind | None
    ratio: float
    reason: str
    saving: float = math.nan
    cost: float = math.nan
    plan: Plan | None = field(default=None, compare=False, repr=False)

    def __bool__(self) -> bool:
        return self.kind is not None


# ------------------------------------------------------------------ paper rule
def imbalance_ratio(times: Mapping[Any, float] | Sequence[float]) -> float:
    """``t_min / t_max`` over workers (1.0 is perfectly balanced).

    Raises
    ------
    ValueError
        No times, or a time that is not finite and >= 0, or all times zero.
    """
    vals = list(times.values()) if isinstance(times, Mapping) else list(times)
    if not vals:
        raise ValueError("no worker times to compare")
    bad = [v for v in vals if not (math.isfinite(v) and v >= 0)]
    if bad:
        raise ValueError(f"worker times must be finite and >= 0 seconds, got {bad}")
    t_max = max(vals)
    if t_max == 0:
        raise ValueError("every worker time is zero: cannot judge the imbalance (check the timer)")
    return float(min(vals) / t_max)


def paper_decision(
    times: Mapping[Hashable, float] | Sequence[float],
    *,
    first_check: bool = False,
    initial_abilities: bool = True,
    t_whole: float | None = None,
    t_line: float | None = None,
    settings: DRPMSettings | None = None,
) -> Decision:
    """The paper's remap rule (see the module notes).

    Parameters
    ----------
    times
        Per-worker ``t1`` (e.g. :meth:`AbilityEstimator.recent_times`).
    first_check
        This is the first check of the run.
    initial_abilities
        The run started from given abilities (``False``: from a uniform mapping).
    t_whole, t_line
        Thresholds; ``None``: those of ``settings``.
    settings
        ``rpm.drpm.*`` (:class:`~dask_rpm.drpm.settings.DRPMSettings`); ``None`` reads them now.
    """
    s = DRPMSettings.resolve(settings, t_whole=t_whole, t_line=t_line)
    t_whole, t_line = s.t_whole, s.t_line
    if not 0 <= t_whole <= t_line <= 1:
        raise ValueError(
            f"need 0 <= t_whole <= t_line <= 1, got t_whole={t_whole}, t_line={t_line}"
        )
    ratio = imbalance_ratio(times)
    if first_check and not initial_abilities:
        return Decision(
            "whole", ratio, f"first check without initial abilities (t_min/t_max={ratio:.3f})"
        )
    if ratio < t_whole:
        return Decision("whole", ratio, f"t_min/t_max={ratio:.3f} < T_whole={t_whole}")
    if ratio < t_line:
        return Decision("column", ratio, f"t_min/t_max={ratio:.3f} < T_line={t_line}")
    return Decision(None, ratio, f"t_min/t_max={ratio:.3f} >= T_line={t_line}: keep the mapping")


# ------------------------------------------------------------------- cost rule
def predict_worker_seconds(plan: Plan, speeds: Abilities) -> dict[int, float]:
    """Compute seconds per planned worker: ``area / speed``.

    ``speeds`` are in work units (hidden units x samples) per second, as
    :meth:`AbilityEstimator.estimate` returns them; see
    :func:`~dask_rpm.drpm.remap.ability_vector` for the accepted forms.
    """
    vec = ability_vector(plan, speeds)
    return {w: plan.rectangle(w).area / float(vec[w]) for w in plan.planned_workers}


def predict_step_seconds(plan: Plan, speeds: Abilities, comm_seconds: CommSeconds = 0.0) -> float:
    """Predicted seconds of one iteration: the slowest worker's ``area / speed`` plus communication.

    Workers synchronise at the vertical and horizontal exchanges, so the
    slowest one sets the pace. ``comm_seconds`` is a number or a function of the
    plan (communication differs between plans of different structure).

    This is deliberately simpler than the alpha-beta model
    :func:`dask_rpm.cost.predict_iteration_seconds`: DRPM's ``t1`` speeds already
    contain the vertical exchange and its waiting, so adding a modelled vertical
    exchange would count it twice. To add the modelled horizontal exchange pass
    ``comm_seconds=lambda p: dask_rpm.cost.predict_breakdown(p, speeds)["horizontal"]``.
    """
    comm = comm_seconds(plan) if callable(comm_seconds) else float(comm_seconds)
    return max(predict_worker_seconds(plan, speeds).values()) + comm


def cost_decision(
    plan: Plan,
    speeds: Abilities,
    *,
    remaining: int,
    whole_speeds: Abilities | None = None,
    times: Mapping[Hashable, float] | Sequence[float] | None = None,
    comm_seconds: CommSeconds = 0.0,
    latency: float | None = None,
    bandwidth: float | None = None,
    itemsize: int | None = None,
    concurrent: bool = False,
    min_gain: float | None = None,
    kinds: Sequence[RemapKind] = ("column", "whole"),
    whole_kwargs: Mapping[str, Any] | None = None,
    settings: DRPMSettings | None = None,
    row_bytes: int = 0,
) -> Decision:
    """Remap only when the predicted saving beats the predicted migration cost.

    Parameters
    ----------
    plan
        The current plan.
    speeds
        Estimated speeds (``t1``), used for the column candidate and for every
        time prediction (one yardstick for all plans).
    remaining
        Iterations left in the run.
    whole_speeds
        Speeds for planning the whole candidate (``t2``); default ``speeds``.
    times
        Measured per-worker times for the reported ratio; default: predicted.
    comm_seconds
        Communication seconds per iteration, a number or a function of a plan.
    latency, bandwidth, itemsize, concurrent
        Migration cost model, see :func:`~dask_rpm.drpm.remap.migration_seconds`;
        ``None`` reads ``rpm.cost.*`` (once, for every candidate).
    min_gain
        Smallest relative iteration-time gain worth a remap; ``None``: that of ``settings``.
    kinds
        Candidates to consider.
    whole_kwargs
        Extra arguments for :func:`~dask_rpm.drpm.remap.whole_remap`.
    settings
        ``rpm.drpm.*`` (:class:`~dask_rpm.drpm.settings.DRPMSettings`); ``None`` reads them now.
    row_bytes
        Bytes of one sample row that reaches a worker whose sample range grows
        (:func:`~dask_rpm.drpm.remap.rows_gained`), priced at ``bandwidth`` on top of the
        weights' migration; 0 where every worker already holds every row.
    """
    if remaining < 0:
        raise ValueError(f"remaining iterations must be >= 0, got {remaining}")
    min_gain = DRPMSettings.resolve(settings, min_gain=min_gain).min_gain
    if latency is None or bandwidth is None or itemsize is None:
        prices = CostSettings.from_config(latency=latency, bandwidth=bandwidth, itemsize=itemsize)
        latency, bandwidth, itemsize = prices.latency, prices.bandwidth, prices.itemsize
    t_cur = predict_step_seconds(plan, speeds, comm_seconds)
    ratio = (
        imbalance_ratio(times)
        if times is not None
        else imbalance_ratio(predict_worker_seconds(plan, speeds))
    )
    cands: list[Decision] = []
    for kind in kinds:
        if kind == "column":
            new = column_remap(plan, speeds)
        elif kind == "whole":
            new = whole_remap(
                plan, whole_speeds if whole_speeds is not None else speeds, **(whole_kwargs or {})
            )
        else:
            raise ValueError(f"unknown remap kind {kind!r}; use 'column' or 'whole'")
        t_new = predict_step_seconds(new, speeds, comm_seconds)
        saving = (t_cur - t_new) * remaining
        moves = migration(plan, new, itemsize)
        cost = migration_seconds(moves, latency=latency, bandwidth=bandwidth, concurrent=concurrent)
        rows = rows_gained(plan, new) if row_bytes else 0
        cost += rows * row_bytes / bandwidth
        reason = (
            f"{kind}: iteration {t_cur:.4g}s -> {t_new:.4g}s over {remaining} iterations saves "
            f"{saving:.4g}s, migration costs {cost:.4g}s"
            + (f" ({rows} sample rows included)" if rows else "")
        )
        ok = t_new <= (1 - min_gain) * t_cur and saving > cost
        cands.append(
            Decision(kind if ok else None, ratio, reason, saving, cost, new if ok else None)
        )
    if not cands:
        return Decision(None, ratio, "keep: no candidate remap kinds")
    # The largest net saving among accepted candidates; else report the closest rejected one.
    best = max(cands, key=lambda d: (d.kind is not None, d.saving - d.cost))
    if best.kind is None:
        return Decision(
            None, ratio, f"keep ({best.reason}; min gain {min_gain:.0%})", best.saving, best.cost
        )
    return best


def decide(
    times: Mapping[Hashable, float] | Sequence[float],
    *,
    policy: str | None = None,
    first_check: bool = False,
    initial_abilities: bool = True,
    t_whole: float | None = None,
    t_line: float | None = None,
    settings: DRPMSettings | None = None,
    **cost_kw: Any,
) -> Decision:
    """Run the configured policy (``None``: that of ``settings``, ``None`` reading ``rpm.drpm.*``).

    ``"paper"`` uses ``times``, ``first_check``, ``initial_abilities`` and the
    thresholds; ``"cost"`` passes ``times`` and ``cost_kw`` (``plan``, ``speeds``,
    ``remaining`` and the options of :func:`cost_decision`). The cost rule has
    no first-check special case: starting from a uniform mapping simply makes
    the predicted saving large.
    """
    s = DRPMSettings.resolve(settings, policy=policy)
    policy = s.policy
    if policy == "paper":
        if cost_kw:
            raise TypeError(f"the paper policy takes no {sorted(cost_kw)}")
        return paper_decision(
            times,
            first_check=first_check,
            initial_abilities=initial_abilities,
            t_whole=t_whole,
            t_line=t_line,
            settings=s,
        )
    if policy == "cost":
        missing = [k for k in ("plan", "speeds", "remaining") if k not in cost_kw]
        if missing:
            raise TypeError(f"the cost policy needs {', '.join(missing)}=")
        return cost_decision(
            cost_kw.pop("plan"), cost_kw.pop("speeds"), times=times, settings=s, **cost_kw
        )
    raise ValueError(f"unknown remap policy {policy!r}; use 'paper' or 'cost'")


# ------------------------------------------------------------- check interval
def auto_interval(
    iteration_seconds: float,
    *,
    check_seconds: float | None = None,
    target_overhead: float | None = None,
    react_seconds: float | None = None,
    min_interval: int | None = None,
    max_interval: int | None = None,
    settings: DRPMSettings | None = None,
) -> int:
    """Iterations between remap checks, from the measured iteration time.

    A check costs about one client round trip (``check_seconds``, tens of ms:
    gather the times, decide). Three needs pull ``R`` apart:

    * overhead - checks should cost at most ``target_overhead`` of the run:
      ``check_seconds / (R * T) <= target_overhead``, a lower bound on ``R``;
    * reaction - a load change should be acted on within ``react_seconds`` of
      wall time: ``R * T <= react_seconds``, an upper bound; it wins over the
      overhead bound when the two conflict, and ``max_interval`` caps ``R`` too;
    * estimation - ``R >= L`` (``min_interval``, default the window), so the
      times a check sees were all measured under the current mapping; this wins
      over everything, since a check on mixed data is worse than a late one.

    The result never increases as ``iteration_seconds`` grows. With the
    defaults (30 ms, 1 %, 60 s, ``L`` = 6, 1000) an iteration of 0.15 s gives
    the paper's ``R`` = 20.

    Parameters
    ----------
    iteration_seconds
        A robust measure of one iteration's wall time (e.g. a median).
    check_seconds, target_overhead, react_seconds, min_interval, max_interval
        ``None``: those of ``settings`` (``rpm.drpm.auto.*``; ``min-interval: null`` -> ``rpm.drpm.window``).
    settings
        ``rpm.drpm.*`` (:class:`~dask_rpm.drpm.settings.DRPMSettings`); ``None`` reads them now.
    """
    t = float(iteration_seconds)
    if not (math.isfinite(t) and t > 0):
        raise ValueError(
            f"iteration_seconds must be a positive finite time, got {iteration_seconds!r}"
        )
    s = DRPMSettings.resolve(
        settings,
        check_seconds=check_seconds,
        target_overhead=target_overhead,
        react_seconds=react_seconds,
        min_interval=min_interval,
        max_interval=max_interval,
    )
    check, target, react = s.check_seconds, s.target_overhead, s.react_seconds
    lo, hi = s.interval_floor, s.max_interval
    if check < 0 or not 0 < target <= 1 or react <= 0 or lo < 1 or hi < lo:
        raise ValueError(
            f"bad auto-interval settings: check_seconds={check}, target_overhead={target}, "
            f"react_seconds={react}, min_interval={lo}, max_interval={hi}"
        )
    want = math.ceil(check / (target * t) - 1e-9)
    cap = max(lo, min(hi, math.floor(react / t)))
    return int(min(max(want, lo), cap))


def first_interval(
    interval: int | str | None = None,
    *,
    min_interval: int | None = None,
    settings: DRPMSettings | None = None,
) -> tuple[int, bool]:
    """``R`` before any iteration time is measured, and whether it is ``"auto"``.

    The one place :func:`dask_rpm.fit` takes it from: an int
    as given (``None``: that of ``settings``, ``None`` reading ``rpm.drpm.*``); ``"auto"``
    starts at the estimation bound of :func:`auto_interval` (``min_interval``, else
    ``rpm.drpm.auto.min-interval``, else the window ``L``) and at least 2, so the first check
    sees a whole window of times.

    Raises
    ------
    ValueError
        ``interval`` is not ``"auto"`` or an integer >= 1.
    """
    s = DRPMSettings.resolve(settings, interval=interval, min_interval=min_interval)
    interval = s.interval
    if interval == "auto":
        return max(s.interval_floor, 2), True
    try:
        r = int(interval)
        if isinstance(interval, bool) or r != interval:
            raise ValueError
    except (TypeError, ValueError):
        r = 0
    if r < 1:
        raise ValueError(
            f"interval={interval!r}; it must be a positive number of iterations (>= 1) or 'auto'"
        )
    return r, False
