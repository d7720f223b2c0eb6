"""``srpm-time``: SRPM's column structure chosen by predicted seconds instead of element counts.

Pure module (numpy only). The paper's SRPM (:func:`dask_rpm.planners.srpm`)
minimises an element count; this planner minimises the predicted seconds per
iteration of :func:`dask_rpm.cost.predict_breakdown` for given absolute
worker rates (work units per second, e.g. from the probe), latency,
bandwidth, per-message overhead and link classes, and for the exchange
algorithms the model charges (``rpm.cost.vertical`` / ``rpm.cost.horizontal``).

How it searches
---------------
1. **Columns** are runs of an ordering of the workers, as in SRPM: ascending
   ability, and, when the network has link classes, also grouped by
   (group, host) first, so that a column can stay inside fast links. A run's
   cost is its slowest member's compute plus its vertical exchange,

       w(q', q) = m s max_{q' < i <= q} p_i / r_i + V(k = q - q', l s (P_q - P_q'), link(q', q)),

   where ``V`` is the model's in-column allreduce for ``k`` members and that
   many bytes over the run's slowest link class. ``w`` is non-increasing when
   the run shrinks (all three parts are), so SRPM's three monotonicity facts
   hold and its vectorised binary-search DP gives ``t(C, N)``, the smallest
   slowest-column time with ``C`` columns, for every ``C`` in
   ``O(N^2 log min(N, m))``.
2. **Shortlist**: ``t(C, N)`` plus a cheap estimate of the horizontal
   exchange for ``C`` holders; the few best ``C``, one column per worker and
   one column for everybody are kept.
3. **Cuts and snapping**: every shortlisted ``C`` is built as an integer plan
   with several small-group thresholds (0, ``rpm.planner.small-group``,
   0.2 of ``m``), plus the heterogeneity-aware aligned grid (method H_rev)
   at the worker-count divisors nearest the best ``C``; each is predicted
   exactly with :func:`~dask_rpm.cost.predict_breakdown` and the fastest
   wins (ties: fewer columns). So ``srpm-time`` is never predicted slower than
   any plan it considered, the proportional 1-D split included.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..comm import SCALABLE, EngineRule, Interconnect, LinkClass
from ..cost import CostModel, predict_breakdown, t_comm_partition
from ..plan.partition import PlanError, RealPartition, snap_with_count, to_integer
from .grids import divisors, grid_hrev, split_1d
from .inputs import normalise
from .registry import PlannerResult
from .settings import PlannerSettings
from .srpm import first_true

__all__ = ["srpm_time", "time_table", "vertical_seconds", "resolve_vertical"]


# ------------------------------------------------------------ closed forms
def vertical_seconds(
    mode: str,
    k: np.ndarray,
    nbytes: np.ndarray,
    latency: np.ndarray,
    bandwidth: np.ndarray,
    overhead: float,
    rule: EngineRule | None = None,
) -> np.ndarray:
    """In-column allreduce seconds of :func:`dask_rpm.comm.collective_seconds`, vectorised (0 for k = 1).

    Without the receivers' additions (the DP charges those through the
    bytes); ``halving`` is made non-decreasing in ``k`` (see the code). ``mode`` ``"engine"``
    charges what ``rule`` picks (:func:`resolve_vertical`).
    """
    k = np.asarray(k, dtype=float)
    a = np.asarray(latency, dtype=float)
    b = np.asarray(nbytes, dtype=float) / bandwidth
    o = overhead

    def one(alg: str, k: np.ndarray = k) -> np.ndarray:
        if alg == "tree":
            return 2 * np.ceil(np.log2(np.maximum(k, 1))) * (a + o + b)
        if alg == "halving":

            def halving(kk: np.ndarray) -> np.ndarray:
                p = 2.0 ** np.floor(np.log2(np.maximum(kk, 1)))
                t = 2 * np.log2(p) * (a + 2 * o) + 2 * (1 - 1 / p) * b
                return t + np.where(kk > p, 2 * (a + o + b), 0.0)

            # A power of two can cost less than one member fewer (no fold-in rounds); the DP needs
            # costs that never fall when a column grows, so it uses the running maximum, which only
            # differs there. Plans are then predicted exactly.
            return np.maximum(halving(k), np.where(k >= 3, halving(k - 1), 0.0))
        if alg == "ring":
            return 2 * (k - 1) * (a + 2 * o + b / np.maximum(k, 1))
        if alg == "direct":
            return 2 * (a + 2 * (k - 1) * o + (k - 1) * b / np.maximum(k, 1))
        if alg == "allgather":
            return a + 2 * (k - 1) * o + (k - 1) * b
        if alg in ("leader", "gather"):
            return 2 * (a + (k - 1) * (o + b))
        raise ValueError(f"vertical mode {alg!r} has no closed form")

    if mode == "best":
        out = np.minimum.reduce([one(alg) for alg in SCALABLE])
    elif mode == "engine" or mode.startswith("auto:"):
        v = resolve_vertical(mode, rule)
        if v.startswith("auto:"):
            # the engine's rule (cost.engine_algorithm): one hop up to K members, else the least.
            # Above K that can cost less than allgather did at K; the DP needs costs that never
            # fall as a column grows, so it is charged at least that much there (an upper bound
            # in those few cases; the candidate plans are then predicted exactly).
            K = int(v[5:])
            least = np.minimum.reduce([one(alg) for alg in ("allgather", "leader", *SCALABLE)])
            floor = one("allgather", np.minimum(k, K))
            out = np.where(k <= K, one("allgather"), np.maximum(least, floor))
        else:
            out = one(v)
    else:
        out = one(mode)
    return np.where(k <= 1, 0.0, out)


def resolve_vertical(mode: str, rule: EngineRule | None) -> str:
    """``"engine"`` as what the engine's ``rule`` runs: ``"auto:K"`` (allgather up to K members,
    else the cheapest of ``leader`` and the scalable schedules) or a name; other modes as given."""
    if mode != "engine":
        return mode
    if rule is None:
        raise ValueError('vertical="engine" needs the engine\'s rule (EngineRule.from_config())')
    return f"auto:{rule.one_hop_max}" if rule.vertical == "auto" else rule.vertical


class _RangeMax:
    """Sparse table: max of ``values[i:j]`` for arrays of ``i < j`` in O(1) numpy ops."""

    def __init__(self, values: np.ndarray) -> None:
        self.levels = [np.asarray(values, dtype=float)]
        span = 1
        while 2 * span <= len(values):
            prev = self.levels[-1]
            self.levels.append(np.maximum(prev[:-span], prev[span:]))
            span *= 2

    def __call__(self, i: np.ndarray, j: np.ndarray) -> np.ndarray:
        length = np.maximum(j - i, 1)
        lv = np.floor(np.log2(length)).astype(np.int64)
        out = np.empty(len(np.atleast_1d(i)))
        i, j, lv = np.atleast_1d(i), np.atleast_1d(j), np.atleast_1d(lv)
        for level in np.unique(lv):
            sel = lv == level
            arr = self.levels[level]
            out[sel] = np.maximum(arr[i[sel]], arr[j[sel] - (1 << int(level))])
        return out


class _RunCost:
    """``w(q', q)`` of the module doc, vectorised over arrays of ``q'`` and ``q``."""

    def __init__(
        self,
        ps: np.ndarray,
        rs: np.ndarray,
        labels: np.ndarray | None,
        shape: tuple[int, int, int],
        samples: int,
        net: Interconnect,
        vertical: str,
        cap: int,
        rule: EngineRule | None = None,
    ) -> None:
        n, m, l = shape
        self.prefix = np.concatenate([[0.0], np.cumsum(ps)])
        ratio = ps / rs
        # rates proportional to shares (the usual case): every worker computes equally long
        self.ratio_value = float(ratio.max()) if ratio.max() <= ratio.min() * (1 + 1e-12) else None
        self.ratio = _RangeMax(ratio)
        self.ms, self.ls, self.cap = float(m) * samples, float(l) * samples * net.itemsize, cap
        self.net, self.vertical = net, resolve_vertical(vertical, rule)
        # link class of a run: the worst class among its members (labels: class rank boundaries)
        self.classes = None
        if labels is not None and net.classes:
            host_change = np.concatenate([[0], np.cumsum(labels[1:, 0] != labels[:-1, 0])])
            group_change = np.concatenate([[0], np.cumsum(labels[1:, 1] != labels[:-1, 1])])
            self.classes = (host_change, group_change)

    def link(self, qp: np.ndarray, q: np.ndarray) -> tuple[Any, Any]:
        net = self.net
        if self.classes is None:
            return float(net.latency), float(net.bandwidth)
        lat = np.full(len(qp), float(net.latency))
        bw = np.full(len(qp), float(net.bandwidth))
        host_change, group_change = self.classes
        first, last = qp, np.maximum(q - 1, qp)
        same_host = host_change[last] == host_change[first]
        same_group = group_change[last] == group_change[first]
        for name, sel in (
            ("across", ~same_group),
            ("group", same_group & ~same_host),
            ("host", same_host),
        ):
            cls = (net.classes or {}).get(name, LinkClass(net.latency, net.bandwidth))
            lat[sel], bw[sel] = cls.latency, cls.bandwidth
        return lat, bw

    def __call__(self, qp: np.ndarray, q: np.ndarray) -> np.ndarray:
        qp, q = np.atleast_1d(qp), np.atleast_1d(q)
        k = q - qp
        lat, bw = self.link(qp, q)
        v = vertical_seconds(
            self.vertical,
            k,
            self.ls * (self.prefix[q] - self.prefix[qp]),
            lat,
            bw,
            self.net.overhead,
        )
        compute = self.ms * (
            self.ratio_value if self.ratio_value is not None else self.ratio(qp, q)
        )
        t = compute + v
        return np.where(k > self.cap, np.inf, t)


def time_table(w: _RunCost, n: int, last: int) -> tuple[list[float], np.ndarray]:
    """``t(C, N)`` for C = 1..last and the argmin rows (``args[C, q]``), by SRPM's binary-search DP."""
    dtype = np.int16 if n < 32000 else np.int32
    args = np.zeros((last + 1, n + 1), dtype=dtype)
    q = np.arange(1, n + 1)
    row = np.full(n + 1, np.inf)
    row[1:] = w(np.zeros_like(q), q)
    out = [float(row[n])]
    for c in range(2, last + 1):
        q = np.arange(c, n + 1)
        first = np.maximum(q - w.cap, c - 1)
        # first_true calls the predicate before the loop moves on.
        star = first_true(lambda mid: row[mid] >= w(mid, q), first, q - 1)  # noqa: B023
        before = star - 1
        has_before = before >= first
        safe = np.maximum(before, first)
        f_before = np.where(has_before, np.maximum(w(safe, q), row[safe]), np.inf)
        f_star = np.maximum(w(star, q), row[star])
        take = has_before & (f_before <= f_star)
        new = np.full(n + 1, np.inf)
        new[c:] = np.where(take, f_before, f_star)
        args[c, c:] = np.where(take, before, star)
        row = new
        out.append(float(row[n]))
    return out, args


def _sizes(args: np.ndarray, n: int, c_best: int) -> list[int]:
    sizes, q = [], n
    for c in range(c_best, 0, -1):
        qp = 0 if c == 1 else int(args[c, q])
        sizes.append(q - qp)
        q = qp
    return sizes[::-1]


def _horizontal_estimate(
    mode: str,
    C: np.ndarray,
    n: int,
    shape: tuple[int, int, int],
    net: Interconnect,
    rule: EngineRule | None,
) -> np.ndarray:
    """Rough horizontal seconds with ``C`` columns of ``n`` workers (shortlisting only)."""
    _, m, l = shape
    nbytes = (shape[0] + l) * m * C / n * net.itemsize  # an average worker's rows
    one_hop = net.latency + (C - 1) * (4 * net.overhead + nbytes / net.bandwidth)

    def scheduled(name: str) -> np.ndarray:
        lat, bw = np.full(len(C), net.latency), np.full(len(C), net.bandwidth)
        return vertical_seconds(name, C, nbytes, lat, bw, net.overhead)

    if mode == "engine":  # what rpm.engine.horizontal runs (cost.engine_algorithm's rule)
        assert rule is not None  # CostModel.from_config reads it for an "engine" mode
        if rule.horizontal == "auto":
            least = np.minimum(one_hop, scheduled("best"))
            return np.where(C <= rule.one_hop_max, one_hop, least)
        mode = rule.horizontal
    if mode in ("pairwise", "bands"):
        return one_hop
    return scheduled(mode)


def _order(
    p: np.ndarray, net: Interconnect, n_all: int
) -> list[tuple[str, np.ndarray, np.ndarray | None]]:
    """Worker orderings to try: by ability, and grouped by (group, host) when links differ."""
    by_ability = np.argsort(p, kind="stable")
    out: list[tuple[str, np.ndarray, np.ndarray | None]] = [("ability", by_ability, None)]
    if net.classes and (net.hosts is not None or net.groups is not None):
        hosts = [str(net.hosts[i]) if net.hosts is not None else str(i) for i in range(n_all)]
        groups = [str(net.groups[i]) if net.groups is not None else "" for i in range(n_all)]
        hid = {h: j for j, h in enumerate(sorted(set(hosts)))}
        gid = {g: j for j, g in enumerate(sorted(set(groups)))}
        lab = np.array([[hid[hosts[i]], gid[groups[i]]] for i in range(n_all)])
        linked = np.array(sorted(range(n_all), key=lambda i: (lab[i, 1], lab[i, 0], p[i], i)))
        out = [("ability", by_ability, lab[by_ability]), ("links", linked, lab[linked])]
    return out


def srpm_time(
    abilities: np.ndarray,
    shape: tuple[int, int, int],
    samples: int,
    *,
    dp: int | None = None,
    rates: Sequence[float] | None = None,
    network: Interconnect | None = None,
    vertical: str | None = None,
    horizontal: str | None = None,
    shortlist: int = 4,
    max_dp_columns: int = 256,
    model: CostModel | None = None,
    settings: PlannerSettings | None = None,
) -> PlannerResult:
    """SRPM minimising predicted seconds per iteration (see the module doc).

    Parameters
    ----------
    abilities
        Positive abilities (normalised here): each worker's share of the work.
    shape, samples
        ``(n, m, l)`` and ``s``.
    dp
        Force this number of columns.
    rates
        Absolute speed of each worker in work units (hidden unit x sample) per
        second; ``None``: abilities scaled so that an average worker does
        ``rpm.planner.rate`` units per second.
    network
        Latency, bandwidth, overhead, link classes and worker hosts/groups
        (by position in ``abilities``); ``None`` reads ``rpm.cost.*``.
    vertical, horizontal
        Exchange algorithms the model charges (``rpm.cost.vertical`` /
        ``rpm.cost.horizontal`` when ``None``).
    model
        ``network``, ``vertical`` and ``horizontal`` read once
        (:class:`~dask_rpm.cost.CostModel`, what :func:`~dask_rpm.planners.make_plan` passes);
        not together with them.
    settings
        ``rpm.planner.*`` (:class:`~dask_rpm.planners.settings.PlannerSettings`); ``None``
        reads them now.
    shortlist
        How many column counts of the DP are built and predicted exactly.
    max_dp_columns
        Rows of the DP (column counts) computed; more columns are tried as
        equal runs of 1, 2, 3, 4, 6, 8, 12 or 16 workers. Keeps N = 4096 within seconds.
    """
    p = normalise(abilities)
    N = len(p)
    if model is None:
        model = CostModel.from_config(network, vertical=vertical, horizontal=horizontal)
    elif not (network is None and vertical is None and horizontal is None):
        raise TypeError("give model= or network/vertical/horizontal, not both")
    if settings is None:
        settings = PlannerSettings.from_config()
    net, vmode, hmode = model.network, model.vertical, model.horizontal
    r = _absolute_rates(p, rates, settings.rate)
    if dp is not None and not (1 <= dp <= min(N, samples)):
        raise PlanError(
            f"dp={dp} columns must be between 1 and min(workers={N}, samples={samples})"
        )
    default_snap = float(settings.small_group)
    cands = _Candidates(p, r, shape, samples, model, sorted({0.0, default_snap, 0.2}))
    for name, order, labels in _order(p, net, N):
        _sorted_run_candidates(cands, name, order, labels, dp, shortlist, max_dp_columns)
    if dp is None and N <= samples:
        cands.consider(split_1d(p, shape, samples).partition, "one column per worker", 0.0)
    if dp is None and cands.built:
        best_c = min(cands.built, key=lambda x: (x[0], x[1]))[1]
        for d in sorted(divisors(N), key=lambda d: (abs(math.log(d / best_c)), d))[:2]:
            try:
                g = grid_hrev(p, shape, samples, dp=d).partition
            except PlanError:
                continue
            cands.consider(g, f"aligned grid C={d}", 0.0)
    if not cands.built:
        raise PlanError(
            f"srpm-time found no feasible plan for {N} workers, shape {shape}, samples={samples}"
        )
    t, c, label, part, snap = min(cands.built, key=lambda x: (x[0], x[1]))
    note = (
        f"srpm-time: {label}, small-group {snap:g}; predicted {t:.6g} s/iteration "
        f"({vmode} vertical, {hmode} horizontal exchanges) among {len(cands.built)} plans built"
    )
    return PlannerResult(
        part,
        t_comm_partition(part, shape, samples),
        (),
        method="srpm-time",
        notes=(note,),
        meta={"predicted_seconds": t, "small_group": snap, "candidate": label},
    )


# make_plan passes rates and the network to planners that say they minimise seconds
srpm_time.time_objective = True  # type: ignore[attr-defined]


def _absolute_rates(p: np.ndarray, rates: Sequence[float] | None, rate: float) -> np.ndarray:
    """Each worker's work units per second: given, or abilities scaled by ``rate``
    (rpm.planner.rate)."""
    N = len(p)
    if rates is None:
        return p * N * float(rate)
    r = np.asarray(rates, dtype=float)
    if r.shape != p.shape or not np.all(np.isfinite(r)) or np.any(r <= 0):
        raise PlanError(
            f"rates must be {N} positive finite work units per second, one per worker; got {list(r)}"
        )
    return r


class _Candidates:
    """The plans built so far, each with its predicted seconds per iteration."""

    def __init__(
        self,
        p: np.ndarray,
        r: np.ndarray,
        shape: tuple[int, int, int],
        samples: int,
        model: CostModel,
        snaps: Sequence[float],
    ) -> None:
        self.p, self.r, self.shape, self.samples = p, r, shape, samples
        self.model, self.net, self.snaps = model, model.network, tuple(snaps)
        #: (predicted seconds, columns, label, real partition, small-group threshold)
        self.built: list[tuple[float, int, str, RealPartition, float]] = []

    def consider(self, part: RealPartition, label: str, snap: float) -> None:
        """Snap, round and predict ``part``; infeasible integer plans are skipped."""
        snapped, _ = snap_with_count(part, snap)
        try:
            plan = to_integer(
                snapped,
                abilities=self.p,
                shape=self.shape,
                samples=self.samples,
                method="srpm-time",
                t_comm=float("nan"),
            )
        except PlanError:
            return
        t = predict_breakdown(plan, list(self.r), model=self.model)["total"]
        self.built.append((t, len(part.columns), label, part, snap))

    def runs(self, order: np.ndarray, sizes: Sequence[int]) -> RealPartition:
        """Columns of consecutive workers of ``order``, ``sizes[c]`` in column ``c``."""
        p = self.p
        cols, i = [], 0
        for k in sizes:
            cols.append(tuple(int(v) for v in order[i : i + k]))
            i += k
        widths = tuple(float(p[list(col)].sum()) for col in cols)
        heights = tuple(tuple(float(p[j]) / wd for j in col) for col, wd in zip(cols, widths))
        return RealPartition(tuple(cols), widths, heights)


def _sorted_run_candidates(
    cands: _Candidates,
    name: str,
    order: np.ndarray,
    labels: np.ndarray | None,
    dp: int | None,
    shortlist: int,
    max_dp_columns: int,
) -> None:
    """The DP's shortlisted column counts of one worker order, then equal runs beyond them."""
    p, r, shape, samples, net = cands.p, cands.r, cands.shape, cands.samples, cands.net
    N, cap = len(p), shape[1]
    need = -(-N // cap)
    model = cands.model
    w = _RunCost(p[order], r[order], labels, shape, samples, net, model.vertical, cap, model.rule)
    last = min(N if dp is None else dp, samples, max_dp_columns if dp is None else N)
    tv, args = time_table(w, N, last)
    cs = np.arange(1, last + 1)
    est = np.array(tv) + _horizontal_estimate(
        model.horizontal, cs.astype(float), N, shape, net, model.rule
    )
    est[cs < need] = np.inf
    if dp is not None:
        pick = [dp]
    else:
        finite = [int(c) for c in cs[np.argsort(est, kind="stable")] if math.isfinite(est[c - 1])]
        pick = finite[:shortlist]
    for c in sorted(set(pick)):
        if math.isfinite(tv[c - 1]):
            part = cands.runs(order, _sizes(args, N, c))
            for snap in cands.snaps if c > 1 else (0.0,):
                cands.consider(part, f"{name} C={c}", snap)
    if dp is None:
        # beyond the DP's rows: equal runs of k workers (k = 1 is the proportional 1-D split)
        for k in (1, 2, 3, 4, 6, 8, 12, 16):
            c = -(-N // k)
            if k <= cap and c <= samples and c > last:
                sizes = [k] * (N // k) + ([N % k] if N % k else [])
                for snap in cands.snaps if k > 1 else (0.0,):
                    cands.consider(cands.runs(order, sizes), f"{name} runs of {k}", snap)
