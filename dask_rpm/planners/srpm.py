"""SRPM: the optimal columns of the sorted order, by dynamic programming.

SRPM and its speed
------------------
Sort abilities ascending, ``P`` their prefix sums, and let the cost of a column
holding the sorted items ``q'+1 .. q`` be ``w(q', q) = (P_q - P_q') (q - q' - 1)``.
The paper's table is

    t(C, q) = min_{C-1 <= q' < q} max( w(q', q), t(C-1, q') ),    t(0, 0) = 0.

Three facts make it fast (``p_i > 0`` throughout):

1. ``w(q', q)`` is non-increasing in ``q'`` (both factors shrink) and
   non-decreasing in ``q``.
2. ``t(C, q)`` is non-decreasing in ``q``. Take an optimal split of the first
   ``q2`` items into ``C`` runs and drop the last ``q2 - q1`` items. Shrinking a
   run never raises its cost (1.), runs that became empty are refilled by
   splitting a run of two or more items, and splitting a run never raises
   the cost either (``sum_1 (k_1 - 1) <= sum (k - 1)``). This gives a split of
   ``q1 >= C`` items into ``C`` runs that costs no more.
3. So, for fixed ``(C, q)``, ``f(q') = max(w(q', q), t(C-1, q'))`` is the maximum of
   a non-increasing and a non-decreasing function of ``q'``. It decreases
   until the first ``q'*`` where ``t(C-1, q') >= w(q', q)`` and does not decrease
   after it, so the minimum is at ``q'* - 1`` or at ``q'*``. The predicate is
   monotone in ``q'`` and true at ``q' = q - 1`` (``w = 0``), so ``q'*`` is found by
   binary search.

The same three facts hold for the float values exactly: prefix sums of
positive floats are non-decreasing, and rounding is monotone, so the fast table
is bit-for-bit the table of the plain DP (:func:`srpm_dp_reference`, kept as the
reference) with the same argmins in every feasible cell: among several ``q'``
reaching the minimum both take the smallest.

Each row ``C`` is one binary search vectorised over every ``q`` with numpy.
A column holds at most ``m`` workers (see below), so only ``q' >= q - m`` can
be optimal and each search spans ``min(N, m)`` candidates: ``O(N log min(N, m))``
work per row and ``O(N^2 log min(N, m))`` in all, against ``O(N^3)`` for the
plain DP, with ``O(N)`` memory per row. (``q'*`` is also non-decreasing in
``q`` by 1., which would give ``O(N^2)`` with two pointers, but a Python-level
pointer walk is slower than the vectorised search.) We keep the argmin rows
only while ``C`` can still win: ``2 (l + n) m (C - 1)`` is a lower bound of
``t_comm(C)``, so once it reaches the best value seen, no larger ``C`` can be
chosen (ties go to fewer columns). With ``early_stop=True`` the rows themselves
stop there too; by default all rows are computed because the plan reports the
exact ``t_comm(C)`` for every ``C``.

Two constraints of the integer plan enter the model: a column holds at most
``m`` workers (one hidden unit each), so ``w = inf`` for longer runs (this keeps
1.-3. true), and there are at most ``s`` columns (one sample each). Such
infeasible ``C`` get ``t_comm(C) = inf``.

Why sorted runs
---------------
The paper restricts columns to consecutive runs of the ascending order. That
makes the search a polynomial DP, and it is what we implement, but it is a
restriction, not a free lunch: for ``p = (0.1, 0.2, 0.3, 0.4)`` and two columns
of two workers, the runs ``{0.1, 0.2} {0.3, 0.4}`` cost ``0.7`` while the split
``{0.1, 0.4} {0.2, 0.3}`` costs ``0.5``. Balancing column sums over arbitrary
subsets contains multiway number partitioning (NP-hard). What sorting does
guarantee: the plan depends only on the multiset of abilities (stable sort
for ties), the DP is exactly optimal among sorted runs, and it gives each
column workers of similar speed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..plan.partition import PlanError, RealPartition
from .inputs import normalise, parse_shape, validate_abilities
from .registry import PlannerResult

__all__ = ["SRPMResult", "first_true", "srpm", "srpm_dp", "srpm_dp_reference"]


@dataclass(frozen=True)
class SRPMResult:
    """Outcome of the SRPM dynamic programme.

    Attributes
    ----------
    order : tuple of int
        Indices of the abilities sorted ascending (stable).
    sizes : tuple of int
        ``k(1..C)`` of the chosen (or forced) number of columns.
    t_vertical : tuple of float
        ``t(C, N)`` for C = 1, 2, ... (``inf`` where infeasible).
    t_comm_by_columns : tuple of float
        ``t_comm(C)`` for the same C (``inf`` where infeasible).
    """

    order: tuple[int, ...]
    sizes: tuple[int, ...]
    t_vertical: tuple[float, ...]
    t_comm_by_columns: tuple[float, ...]

    @property
    def n_columns(self) -> int:
        return len(self.sizes)

    @property
    def t_comm(self) -> float:
        return self.t_comm_by_columns[self.n_columns - 1]

    def columns(self) -> tuple[tuple[int, ...], ...]:
        """Original indices per column, slowest first."""
        out, i = [], 0
        for k in self.sizes:
            out.append(tuple(self.order[i : i + k]))
            i += k
        return tuple(out)


def _prepare(
    abilities: Sequence[float] | np.ndarray, max_per_column: int | None
) -> tuple[np.ndarray, np.ndarray, int]:
    p = validate_abilities(abilities)
    order = np.argsort(p, kind="stable")
    ps = normalise(p[order])
    prefix = np.concatenate([[0.0], np.cumsum(ps)])
    cap = len(p) if max_per_column is None else int(max_per_column)
    if cap < 1:
        raise PlanError(f"max_per_column={cap} must be at least 1")
    return order, prefix, cap


def _block_cost(prefix: np.ndarray, qp: Any, q: Any, cap: int) -> Any:
    """``w(q', q)``: cost of one column holding sorted items ``q'+1..q``; inf above ``cap``."""
    w = (prefix[q] - prefix[qp]) * (q - qp - 1)
    return np.where(q - qp > cap, np.inf, w)


def _first_row(prefix: np.ndarray, cap: int) -> np.ndarray:
    n = len(prefix) - 1
    row = np.full(n + 1, np.inf)
    q = np.arange(1, n + 1)
    row[1:] = _block_cost(prefix, np.zeros_like(q), q, cap)
    return row


def _w(prefix: np.ndarray, pq: np.ndarray, qp: np.ndarray, q: np.ndarray) -> np.ndarray:
    """``w(q', q)`` without the cap (callers stay within ``q - q' <= cap``); same floats as
    :func:`_block_cost`."""
    return (pq - prefix[qp]) * (q - qp - 1)


def first_true(
    pred: Callable[[np.ndarray], np.ndarray], lo: np.ndarray, hi: np.ndarray
) -> np.ndarray:
    """Vectorised binary search: first index in ``[lo, hi]`` where ``pred`` holds (it holds at hi)."""
    lo, hi = lo.copy(), hi.copy()
    span = int((hi - lo).max(initial=0))
    for _ in range(span.bit_length()):
        mid = (lo + hi) >> 1
        ok = pred(mid)
        np.copyto(hi, mid, where=ok)
        np.copyto(lo, mid + 1, where=~ok)
    return lo


def _next_row(
    prefix: np.ndarray, tprev: np.ndarray, c: int, cap: int
) -> tuple[np.ndarray, np.ndarray]:
    """Row ``c >= 2`` of the table and its argmins, by vectorised binary search (module doc).

    Only ``q' >= q - cap`` can hold a finite optimum (a longer last column costs
    inf), so each search runs over at most ``cap`` candidates. In infeasible
    cells (value inf) the argmin may differ from the plain DP's; those cells
    are never on a backtracking path.
    """
    n = len(prefix) - 1
    q = np.arange(c, n + 1)
    pq = prefix[c:]
    first = np.maximum(q - cap, c - 1)
    # q'*: first q' with t(c-1, q') >= w(q', q); true at q' = q - 1 where w = 0.
    star = first_true(lambda mid: tprev[mid] >= _w(prefix, pq, mid, q), first, q - 1)
    before = star - 1
    has_before = before >= first
    safe = np.maximum(before, first)
    f_before = np.where(has_before, np.maximum(_w(prefix, pq, safe, q), tprev[safe]), np.inf)
    f_star = np.maximum(_w(prefix, pq, star, q), tprev[star])
    take_before = has_before & (f_before <= f_star)
    vals = np.where(take_before, f_before, f_star)
    args = np.where(take_before, before, star)
    # Left of q'* the objective equals w. The plain DP takes the first index of
    # the minimum, so where w repeats in floats move left to the first q' with
    # w(q', q) <= the minimum; w is non-increasing, so this is another search.
    more = take_before & (args - 1 >= first)
    if more.any():
        idx = np.nonzero(more)[0]
        idx = idx[_w(prefix, pq[idx], args[idx] - 1, q[idx]) <= vals[idx]]
        if idx.size:
            pqi, qi, vi = pq[idx], q[idx], vals[idx]
            args[idx] = first_true(
                lambda mid: _w(prefix, pqi, mid, qi) <= vi, first[idx], args[idx] - 1
            )
    row = np.full(n + 1, np.inf)
    row[c:] = vals
    return row, args


def _t_comm_rows(
    t_vertical: Sequence[float], shape: tuple[int, int, int], samples: int, first: int = 1
) -> tuple[float, ...]:
    """``t_comm(C)`` from ``t(C, N)`` for C = first, first + 1, ...; inf where infeasible."""
    n, m, l = shape
    out = []
    for c, t in enumerate(t_vertical, start=first):
        if not math.isfinite(t) or c > samples:
            out.append(math.inf)
        else:
            out.append(2 * l * samples * t + 2 * (l + n) * m * (c - 1))
    return tuple(out)


def _pick(tc: Sequence[float], columns: int | None) -> int:
    """Chosen number of columns: the forced one, or the first minimum."""
    if columns is not None:
        return columns
    best = min(range(len(tc)), key=lambda i: (tc[i], i))
    return best + 1


def _backtrack(args: Mapping[int, np.ndarray], n: int, c_best: int) -> tuple[int, ...]:
    sizes = []
    q = n
    for c in range(c_best, 0, -1):
        qp = 0 if c == 1 else int(args[c][q - c])
        sizes.append(q - qp)
        q = qp
    return tuple(reversed(sizes))


def _check_srpm_feasible(
    n_workers: int, shape: tuple[int, int, int], samples: int, columns: int | None
) -> None:
    m = shape[1]
    need = -(-n_workers // m)
    if columns is not None:
        if columns > n_workers:
            raise PlanError(
                f"dp={columns} columns is more than the {n_workers} workers; use dp between 1 and {n_workers}"
            )
        if columns > samples:
            raise PlanError(
                f"samples={samples} is fewer than the dp={columns} columns; each column needs at "
                f"least one sample: use dp <= {samples} or more samples"
            )
        if columns < need:
            raise PlanError(
                f"dp={columns} columns would put more than m={m} workers in a column, but each "
                f"worker needs at least one hidden unit: use dp >= {need} or more hidden units"
            )
    elif need > samples:
        raise PlanError(
            f"{n_workers} workers need at least {need} columns (a column holds at most m={m} "
            f"workers, one hidden unit each) but samples={samples} allows at most {samples} "
            f"columns: use more samples, more hidden units or fewer workers"
        )


def srpm_dp(
    abilities: Sequence[float] | np.ndarray,
    shape: tuple[int, int, int],
    samples: int,
    *,
    max_per_column: int | None = None,
    columns: int | None = None,
    early_stop: bool = False,
) -> SRPMResult:
    """SRPM's dynamic programme, ``O(N^2 log min(N, m))`` (see the module docstring).

    Parameters
    ----------
    abilities
        Positive abilities in any order (normalised here).
    shape
        ``(n, m, l)``.
    samples
        ``s``; at most ``s`` columns are allowed.
    max_per_column
        Most workers in one column; ``None`` means ``m`` (one hidden unit each).
    columns
        Force this number of columns instead of choosing it.
    early_stop
        Stop computing rows once ``2 (l + n) m (C - 1)`` reaches the best
        ``t_comm`` so far; ``t_comm_by_columns`` then covers only the computed ``C``.

    Returns
    -------
    SRPMResult
    """
    shape = parse_shape(shape)
    n_, m, l = shape
    cap = m if max_per_column is None else max_per_column
    order, prefix, cap = _prepare(abilities, cap)
    n = len(order)
    _check_srpm_feasible(n, shape, samples, columns)
    horizontal = 2 * (l + n_) * m
    last = n if columns is None else columns
    row = _first_row(prefix, cap)
    t_vertical = [float(row[n])]
    best = _t_comm_rows(t_vertical, shape, samples)[0]
    args: dict[int, np.ndarray] = {}
    keep = True  # store argmin rows only while this C can still be chosen
    for c in range(2, last + 1):
        if columns is None and horizontal * (c - 1) >= best:
            keep = False  # lower bound of t_comm(C) reached: no larger C can win
            if early_stop:
                break
        row, arg = _next_row(prefix, row, c, cap)
        if keep:
            args[c] = arg
        t_vertical.append(float(row[n]))
        best = min(best, _t_comm_rows(t_vertical[-1:], shape, samples, first=c)[0])
    tcs = _t_comm_rows(t_vertical, shape, samples)
    c_best = _pick(tcs, columns)
    if not math.isfinite(tcs[c_best - 1]):
        raise PlanError(
            f"no feasible plan with {c_best} columns for {n} workers"
        )  # pragma: no cover
    sizes = _backtrack(args, n, c_best)
    return SRPMResult(tuple(int(i) for i in order), sizes, tuple(t_vertical), tcs)


def srpm_dp_reference(
    abilities: Sequence[float] | np.ndarray,
    shape: tuple[int, int, int],
    samples: int,
    *,
    max_per_column: int | None = None,
    columns: int | None = None,
) -> SRPMResult:
    """The plain ``O(N^3)`` DP of docs/method.md §5, kept as a reference for tests.

    Same inputs, float operations and tie rules as :func:`srpm_dp`: for each
    ``(C, q)`` the smallest minimising ``q'``, and the smallest minimising ``C``.
    """
    shape = parse_shape(shape)
    cap = shape[1] if max_per_column is None else max_per_column
    order, prefix, cap = _prepare(abilities, cap)
    n = len(order)
    _check_srpm_feasible(n, shape, samples, columns)
    table, args = _reference_table(prefix, cap, n if columns is None else columns)
    tv = tuple(float(table[c, n]) for c in range(1, table.shape[0]))
    tcs = _t_comm_rows(tv, shape, samples)
    c_best = _pick(tcs, columns)
    sizes = _backtrack({c: args[c, c:] for c in range(2, table.shape[0])}, n, c_best)
    return SRPMResult(tuple(int(i) for i in order), sizes, tv, tcs)


def _reference_table(prefix: np.ndarray, cap: int, last: int) -> tuple[np.ndarray, np.ndarray]:
    n = len(prefix) - 1
    t = np.full((last + 1, n + 1), np.inf)
    arg = np.full((last + 1, n + 1), -1, dtype=np.int64)
    t[0, 0] = 0.0
    for c in range(1, last + 1):
        for q in range(c, n + 1):
            qp = np.arange(c - 1, q)
            f = np.maximum(_block_cost(prefix, qp, q, cap), t[c - 1, qp])
            j = int(np.argmin(f))
            t[c, q] = f[j]
            arg[c, q] = qp[j]
    return t, arg


def _srpm_partition(p: np.ndarray, res: SRPMResult) -> RealPartition:
    cols = res.columns()
    widths = tuple(float(p[list(col)].sum()) for col in cols)
    heights = tuple(tuple(float(p[i]) / w for i in col) for col, w in zip(cols, widths))
    return RealPartition(cols, widths, heights)


def srpm(
    abilities: np.ndarray, shape: tuple[int, int, int], samples: int, *, dp: int | None = None
) -> PlannerResult:
    """SRPM planner (docs/method.md §5); ``dp`` forces the number of columns.

    ``t_comm`` and ``t_comm_by_columns`` are the model values of the real-valued
    partition, before small-group snapping and integer rounding (neither changes
    the columns, and snapping changes only row cuts).
    """
    p = normalise(abilities)
    res = srpm_dp(p, shape, samples, columns=dp)
    ks = ", ".join(map(str, res.sizes))
    how = "forced by dp" if dp is not None else f"min over C=1..{len(p)}"
    note = f"srpm: C={res.n_columns} columns with k=({ks}); t_comm {res.t_comm:.1f} ({how})"
    return PlannerResult(
        _srpm_partition(p, res),
        res.t_comm,
        res.t_comm_by_columns,
        method="srpm",
        notes=(note,),
        meta={"sizes": res.sizes, "order": res.order},
    )
