"""Planners: from worker abilities to a column-fixed rectangle plan.

A *planner* turns normalised abilities into a real-valued
:class:`~dask_rpm.partition.RealPartition`; :func:`make_plan` validates the
input, leaves out workers too slow to hold one hidden unit or one sample, snaps thin
horizontal bands (:func:`~dask_rpm.partition.snap_small_groups`) and maps the
result to whole samples and hidden units
(:func:`~dask_rpm.partition.to_integer`).

Planners are plain functions with one signature and live in a registry keyed
by name, so new ones can be added without touching :func:`make_plan`::

    def planner(abilities, shape, samples, *, dp=None) -> PlannerResult

``abilities`` is a float array of positive values summing to 1; the indices in
the returned partition refer to positions in that array.

=============  ===============================================================
name           what it does
=============  ===============================================================
``srpm``       SPEC section 4: optimal columns of the sorted order (DP)
``uniform``    method 1: equal work on a regular grid (heterogeneity ignored)
``grid-h``     method H: regular grid, samples by the slowest of each group,
               hidden units split equally
``grid-hrev``  method H_rev: as H, hidden units in the ability ratio of the
               slowest group (alias ``grid``)
``split-1d``   proportional 1-D batch split: every worker a column of its own
               holding all hidden units, samples in proportion to ability
               (what heterogeneity-aware data-parallel systems do)
=============  ===============================================================

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
import numbers
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from . import config
from .cost import predict_iteration_seconds, t_comm_partition
from .partition import Plan, PlanError, RealPartition, _snap, to_integer

__all__ = [
    "DYNAMIC_MAPPING",
    "PLANNERS",
    "Planner",
    "PlannerResult",
    "SRPMResult",
    "fastest_grid",
    "describe_names",
    "get_planner",
    "mapping_names",
    "planner_aliases",
    "make_plan",
    "parse_shape",
    "register_planner",
    "srpm",
    "srpm_dp",
    "srpm_dp_reference",
    "srpm_table",
    "uniform",
    "grid_h",
    "grid_hrev",
    "split_1d",
    "validate_abilities",
]


# ---------------------------------------------------------------- interface
@dataclass(frozen=True)
class PlannerResult:
    """What a planner returns.

    Attributes
    ----------
    partition : RealPartition
        Worker indices refer to positions in the abilities given to the planner.
    t_comm : float
        The paper's communication model of this partition (elements).
    t_comm_by_columns : tuple of float
        ``t_comm(C)`` for C = 1..N where the planner computes it (SRPM), else empty.
    method : str
        Canonical planner name recorded in the plan.
    notes : tuple of str
        Human-readable remarks copied into ``Plan.notes``.
    meta : dict
        Anything else worth keeping (for example the chosen ``dp``).
    """

    partition: RealPartition
    t_comm: float
    t_comm_by_columns: tuple[float, ...] = ()
    method: str = ""
    notes: tuple[str, ...] = ()
    meta: dict[str, Any] = field(default_factory=dict)


class Planner(Protocol):
    """Signature every registered planner follows."""

    def __call__(
        self,
        abilities: np.ndarray,
        shape: tuple[int, int, int],
        samples: int,
        *,
        dp: int | None = None,
    ) -> PlannerResult: ...


PLANNERS: dict[str, Planner] = {}


def register_planner(name: str, fn: Planner) -> Planner:
    """Register ``fn`` under ``name`` (case-insensitive); replaces an existing entry.

    Returns ``fn`` so it can be used as a plain call or inside a decorator.
    """
    if not isinstance(name, str) or not name.strip():
        raise PlanError(f"planner name must be a non-empty string, got {name!r}")
    if not callable(fn):
        raise PlanError(f"planner {name!r} must be callable, got {type(fn).__name__}")
    PLANNERS[name.strip().lower()] = fn
    return fn


def get_planner(name: str) -> Planner:
    """The planner registered under ``name``; :class:`PlanError` names the valid ones."""
    key = str(name).strip().lower()
    try:
        return PLANNERS[key]
    except KeyError:
        raise PlanError(
            f"unknown planner method {name!r}; valid methods are {describe_names(sorted(PLANNERS))}"
        ) from None


# --------------------------------------------------------------- validation
def _label(i: int) -> str:
    return f"P{i + 1}"


def validate_abilities(abilities: Iterable[Any]) -> np.ndarray:
    """Abilities as a float array, or :class:`PlanError` naming the first bad value.

    Valid abilities are one positive, finite number per worker (any scale; they
    are normalised to sum 1).
    """
    if isinstance(abilities, (str, bytes)) or isinstance(abilities, Mapping):
        raise PlanError(
            f"abilities must be a sequence of numbers, one per worker, got {type(abilities).__name__}"
        )
    try:
        items = list(abilities)
    except TypeError:
        raise PlanError(
            f"abilities must be a sequence of numbers, one per worker, got {abilities!r}"
        ) from None
    if not items:
        raise PlanError(
            "abilities is empty: give one positive number per worker, e.g. 0.05,0.10,0.20"
        )
    out = np.empty(len(items))
    for i, a in enumerate(items):
        where = f"ability #{i + 1} ({_label(i)})"
        if isinstance(a, (bool, np.bool_)):
            raise PlanError(
                f"{where} is {a!r}, not a number: abilities must be positive finite numbers"
            )
        if not isinstance(a, (numbers.Real, np.floating, np.integer)):
            try:
                a = float(a)  # numeric strings and 0-d arrays are fine
            except (TypeError, ValueError):
                raise PlanError(
                    f"{where} is {a!r}, not a number: abilities must be positive finite numbers"
                ) from None
        v = float(a)
        if math.isnan(v) or math.isinf(v):
            raise PlanError(f"{where} is {v}: abilities must be positive finite numbers")
        if v < 0:
            raise PlanError(
                f"{where} is {v}: abilities must be positive (relative speeds); give its speed "
                f"or drop the worker"
            )
        if v == 0:
            raise PlanError(
                f"{where} is 0: a worker with no ability cannot hold a rectangle; "
                f"drop it from the list or give it a positive speed"
            )
        out[i] = v
    if not np.isfinite(out.sum()):
        raise PlanError("abilities overflow when summed; rescale them (only their ratios matter)")
    return out


def parse_shape(shape: Any) -> tuple[int, int, int]:
    """Network shape ``(n, m, l)`` from a 3-sequence or a string ``"n-m-l"``.

    Raises :class:`PlanError` unless there are exactly three positive integers.
    """
    hint = "shape must be three positive integers n-m-l (inputs-hidden-outputs), e.g. 203-80-26"
    if isinstance(shape, str):
        text = shape.strip()
        if "-" in text.lstrip("-"):
            parts = re.split(r"(?<=[^-])-", text)  # keeps a leading minus with its number
        else:
            parts = re.split(r"[x,]", text)
    else:
        try:
            parts = list(shape)
        except TypeError:
            raise PlanError(f"{hint}; got {shape!r}") from None
    if len(parts) != 3:
        raise PlanError(f"{hint}; got {shape!r} ({len(parts)} values)")
    out = []
    for name, v in zip(("n", "m", "l"), parts):
        try:
            if isinstance(v, bool):
                raise ValueError
            if isinstance(v, str):
                iv = int(v.strip())
            else:
                iv = int(v)
                if iv != v:
                    raise ValueError
        except (TypeError, ValueError):
            raise PlanError(f"{hint}; {name}={v!r} in {shape!r} is not an integer") from None
        if iv < 1:
            raise PlanError(f"{hint}; {name}={iv} in {shape!r} must be at least 1")
        out.append(iv)
    return out[0], out[1], out[2]


def _check_count(name: str, value: Any, hint: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (numbers.Integral, np.integer)):
        try:
            if isinstance(value, str):
                value = int(value.strip())
            elif isinstance(value, float) and value.is_integer():
                value = int(value)
            else:
                raise ValueError
        except (TypeError, ValueError):
            raise PlanError(f"{name}={value!r} is not a whole number; {hint}") from None
    if int(value) < 1:
        raise PlanError(f"{name}={int(value)} must be at least 1; {hint}")
    return int(value)


def _normalise(p: np.ndarray) -> np.ndarray:
    # fsum is exactly rounded, so the result does not depend on the workers' order.
    p = np.asarray(p, dtype=float)
    return p / math.fsum(p)


# --------------------------------------------------------------------- SRPM
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
    abilities: Sequence[float], max_per_column: int | None
) -> tuple[np.ndarray, np.ndarray, int]:
    p = validate_abilities(abilities)
    order = np.argsort(p, kind="stable")
    ps = _normalise(p[order])
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


def _search(pred: Callable[[np.ndarray], np.ndarray], lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
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
    star = _search(lambda mid: tprev[mid] >= _w(prefix, pq, mid, q), first, q - 1)
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
            args[idx] = _search(
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
    abilities: Sequence[float],
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
    abilities: Sequence[float],
    shape: tuple[int, int, int],
    samples: int,
    *,
    max_per_column: int | None = None,
    columns: int | None = None,
) -> SRPMResult:
    """The plain ``O(N^3)`` DP of SPEC section 4, kept as a reference for tests.

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


def srpm_table(
    abilities: Sequence[float], *, max_per_column: int | None = None, reference: bool = False
) -> np.ndarray:
    """The full table ``t(C, q)``, shape ``(N + 1, N + 1)``, ``inf`` where undefined.

    Row ``C``, column ``q`` is the smallest possible ``max_c s_c* (k(c) - 1)`` over
    splits of the ``q`` slowest workers into ``C`` columns of consecutive sorted
    workers. ``reference=True`` computes it with the plain DP.
    """
    order, prefix, cap = _prepare(abilities, max_per_column)
    n = len(order)
    if reference:
        return _reference_table(prefix, cap, n)[0]
    t = np.full((n + 1, n + 1), np.inf)
    t[0, 0] = 0.0
    t[1] = row = _first_row(prefix, cap)
    for c in range(2, n + 1):
        row, _ = _next_row(prefix, row, c, cap)
        t[c] = row
    return t


def _srpm_partition(p: np.ndarray, res: SRPMResult) -> RealPartition:
    cols = res.columns()
    widths = tuple(float(p[list(col)].sum()) for col in cols)
    heights = tuple(tuple(float(p[i]) / w for i in col) for col, w in zip(cols, widths))
    return RealPartition(cols, widths, heights)


def srpm(
    abilities: np.ndarray, shape: tuple[int, int, int], samples: int, *, dp: int | None = None
) -> PlannerResult:
    """SRPM planner (SPEC section 4); ``dp`` forces the number of columns.

    ``t_comm`` and ``t_comm_by_columns`` are the model values of the real-valued
    partition, before small-group snapping and integer rounding (neither changes
    the columns, and snapping changes only row cuts).
    """
    p = _normalise(abilities)
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


# ---------------------------------------------------------------- baselines
def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _grid_dp_values(
    n_workers: int, shape: tuple[int, int, int], samples: int, dp: int | None, method: str
) -> list[int]:
    """The data-parallel degrees to try; PlanError if ``dp`` is given and invalid."""
    m = shape[1]
    divs = _divisors(n_workers)
    ok = [d for d in divs if d <= samples and n_workers // d <= m]
    if dp is not None:
        if n_workers % dp:
            raise PlanError(
                f"dp={dp} does not divide the {n_workers} workers; {method} needs N_DP to divide N: "
                f"use one of {', '.join(map(str, divs))}"
            )
        if dp > samples:
            raise PlanError(
                f"samples={samples} is fewer than the dp={dp} columns; each column needs at least "
                f"one sample: use one of {', '.join(map(str, ok)) or 'no N_DP (add samples)'}"
            )
        if n_workers // dp > m:
            raise PlanError(
                f"dp={dp} puts {n_workers // dp} workers in a column but the network has only "
                f"m={m} hidden units and each worker needs one: use one of "
                f"{', '.join(map(str, ok)) or 'no N_DP (add hidden units)'}"
            )
        return [dp]
    if not ok:
        raise PlanError(
            f"no data-parallel degree N_DP dividing {n_workers} workers gives at most m={m} workers "
            f"per column and at most samples={samples} columns; use more samples or hidden units, "
            f"or another worker count"
        )
    return ok


def _best_grid(
    build: Callable[[int], RealPartition],
    dps: list[int],
    shape: tuple[int, int, int],
    samples: int,
    method: str,
) -> PlannerResult:
    scored = []
    for d in dps:
        part = build(d)
        scored.append((t_comm_partition(part, shape, samples), d, part))
    tc, d, part = min(scored, key=lambda x: (x[0], x[1]))  # ties -> fewer columns
    if len(dps) > 1:
        note = f"{method}: N_DP={d} is best by the t_comm model among {', '.join(map(str, dps))}"
    else:
        note = f"{method}: N_DP={d}"
    return PlannerResult(part, tc, (), method=method, notes=(note,), meta={"dp": d})


def uniform(
    abilities: np.ndarray, shape: tuple[int, int, int], samples: int, *, dp: int | None = None
) -> PlannerResult:
    """Method 1: equal work for everyone on a regular ``N_DP x N/N_DP`` grid.

    Heterogeneity is ignored, so workers fill the columns in the order given.
    ``dp=None`` picks the ``N_DP`` (a divisor of N) with the smallest ``t_comm``.
    """
    n = len(abilities)

    def build(d: int) -> RealPartition:
        k = n // d
        cols = tuple(tuple(range(c * k, (c + 1) * k)) for c in range(d))
        return RealPartition(cols, (1.0 / d,) * d, ((1.0 / k,) * k,) * d)

    return _best_grid(
        build, _grid_dp_values(n, shape, samples, dp, "uniform"), shape, samples, "uniform"
    )


def _grid(
    abilities: np.ndarray, shape: tuple[int, int, int], samples: int, dp: int | None, rev: bool
) -> PlannerResult:
    p = _normalise(abilities)
    n = len(p)
    order = np.argsort(p, kind="stable")
    method = "grid-hrev" if rev else "grid-h"

    def build(d: int) -> RealPartition:
        k = n // d
        groups = [order[g * k : (g + 1) * k] for g in range(d)]
        slowest = np.array([p[g[0]] for g in groups])  # groups are sorted ascending
        widths = tuple(float(v) for v in slowest / slowest.sum())
        if rev:
            first = p[groups[0]]
            rows = tuple(float(v) for v in first / first.sum())
        else:
            rows = (1.0 / k,) * k
        cols = tuple(tuple(int(i) for i in g) for g in groups)
        return RealPartition(cols, widths, (rows,) * d)

    return _best_grid(build, _grid_dp_values(n, shape, samples, dp, method), shape, samples, method)


def grid_h(
    abilities: np.ndarray, shape: tuple[int, int, int], samples: int, *, dp: int | None = None
) -> PlannerResult:
    """Method H (Azuma et al.): sorted groups of ``N/N_DP``; samples by each group's
    slowest member, hidden units split equally; a regular grid."""
    return _grid(abilities, shape, samples, dp, rev=False)


def grid_hrev(
    abilities: np.ndarray, shape: tuple[int, int, int], samples: int, *, dp: int | None = None
) -> PlannerResult:
    """Method H_rev: as :func:`grid_h`, but hidden units split in the ability ratio
    of the slowest group's workers (the same row cuts in every column)."""
    return _grid(abilities, shape, samples, dp, rev=True)


def split_1d(
    abilities: np.ndarray, shape: tuple[int, int, int], samples: int, *, dp: int | None = None
) -> PlannerResult:
    """Proportional 1-D batch split: pure data parallelism, samples by ability.

    Every worker is a column of its own (all ``m`` hidden units, no vertical
    exchange) and gets a share of the samples proportional to its ability;
    the weight updates are exchanged among all ``N`` columns. ``dp`` must be
    ``None`` or ``N`` (the number of columns is fixed).
    """
    p = _normalise(abilities)
    n = len(p)
    if dp is not None and dp != n:
        raise PlanError(
            f"dp={dp} but split-1d always has one column per worker ({n}); leave dp out"
        )
    if samples < n:
        raise PlanError(
            f"samples={samples} is fewer than the {n} workers; split-1d gives each worker "
            f"at least one sample: use more samples or fewer workers"
        )
    part = RealPartition(
        tuple((i,) for i in range(n)), tuple(float(v) for v in p), tuple((1.0,) for _ in range(n))
    )
    return PlannerResult(
        part,
        t_comm_partition(part, shape, samples),
        (),
        method="split-1d",
        notes=(f"split-1d: {n} columns of one worker each, samples by ability",),
        meta={"dp": n},
    )


register_planner("srpm", srpm)
register_planner("uniform", uniform)
register_planner("grid-h", grid_h)
register_planner("grid-hrev", grid_hrev)
register_planner("grid", grid_hrev)
register_planner("split-1d", split_1d)

#: The mapping that is not a planner: re-estimate abilities while training and
#: re-plan with SRPM (``fit(mapping="drpm")``, the default).
DYNAMIC_MAPPING = "drpm"


def planner_aliases() -> dict[str, str]:
    """Registered names that are a second name of an earlier-registered planner: ``{alias: name}``.

    Derived from the registry (the same function under two names), so a new
    alias needs no second list.
    """
    first: dict[int, str] = {}
    out: dict[str, str] = {}
    for name, fn in PLANNERS.items():
        if id(fn) in first:
            out[name] = first[id(fn)]
        else:
            first[id(fn)] = name
    return out


def mapping_names() -> list[str]:
    """Every name ``fit(mapping=...)``, job files and ``dask-rpm train --mapping`` accept.

    ``drpm`` first, then each registered planner in registration order
    (aliases included). ``dask-rpm plan --method`` accepts the planners.
    """
    return [DYNAMIC_MAPPING, *PLANNERS]


def describe_names(names: Iterable[str]) -> str:
    """``names`` for people: comma-separated, an alias as ``grid (= grid-hrev)``."""
    aliases = planner_aliases()
    return ", ".join(f"{n} (= {aliases[n]})" if n in aliases else n for n in names)


# ------------------------------------------------------------ entry point
def make_plan(
    abilities: Sequence[float],
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
        ``abilities``) and the :class:`~dask_rpm.cost.Network` (its
        ``hosts``/``groups`` index-aligned too). Other planners ignore them.
    batch
        Samples per iteration when training on mini-batches (``None``: all
        ``samples``, full batch). An iteration then exchanges partial
        products of ``batch`` samples, not ``samples``, so with ``srpm`` the
        number of columns is chosen for a problem of ``batch`` samples and
        the cuts are then made on ``samples`` (a column takes the same share
        of every mini-batch). Measured on this 2-core machine (EMULATED,
        docs/benchmarks.md): 1.2-2.3x faster per iteration at batch sizes
        256 and 1024 than the plan for the whole training set.

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
    samples = _check_count("samples", samples, "give the number of training samples, e.g. 1024")
    if (
        batch is not None
        and dp is None
        and batch < samples
        and str(method or config.get("planner.method")) == "srpm"
    ):
        # the columns for one mini-batch's exchanges, the cuts for the whole set
        try:
            dp = make_plan(abilities, shape, batch, "srpm", small_group=small_group).n_columns
        except (
            PlanError
        ):  # a batch too small to plan (fewer samples than columns): plan the set as is
            dp = None
    if dp is not None:
        dp = _check_count(
            "dp", dp, "give the number of columns (data-parallel degree) or leave it out"
        )
    method = config.get("planner.method", method)
    if callable(method):
        planner, name = method, getattr(method, "__name__", "custom")
    else:
        planner, name = get_planner(method), str(method).strip().lower()
    small_group = _fraction("small_group", config.get("planner.small-group", small_group))
    min_units = float(config.get("planner.min-units"))
    if not (math.isfinite(min_units) and min_units >= 0):
        raise PlanError(f"rpm.planner.min-units={min_units} must be a non-negative number")
    if workers is not None and len(workers) != len(ab):
        raise PlanError(
            f"{len(workers)} worker names given for {len(ab)} abilities; give one per ability"
        )
    if rates is not None and len(rates) != len(ab):
        raise PlanError(f"{len(rates)} rates given for {len(ab)} abilities; give one per ability")
    timed = bool(getattr(planner, "time_objective", False))

    p_all = _normalise(ab)
    m = shape[1]
    active = list(range(len(ab)))
    excluded: list[int] = []
    notes: list[str] = []
    while True:
        try:
            if timed:
                res = planner(
                    _normalise(p_all[active]),
                    shape,
                    samples,
                    dp=dp,
                    rates=None if rates is None else [float(rates[i]) for i in active],
                    network=_subset_network(network, active),
                )
            else:
                res = planner(_normalise(p_all[active]), shape, samples, dp=dp)
        except PlanError as e:
            if excluded:
                raise PlanError(
                    f"after leaving out {_names(excluded)} (too slow for one hidden unit): {e}"
                ) from None
            raise
        # A worker's real rectangle, in whole units along each axis.
        shares = [
            (active[i], m * h, samples * wd)
            for col, hs, wd in zip(
                res.partition.columns, res.partition.heights, res.partition.widths
            )
            for i, h in zip(col, hs)
        ]
        low = [(w, hu, su) for w, hu, su in shares if hu < min_units or su < min_units]
        if not low or len(low) == len(active):
            break
        # Leave out the slowest offenders (within a factor 2 of the slowest)
        # and replan: faster offenders are usually only victims of sharing a
        # column or row with them (grid baselines) and recover in the replan.
        # Factor-2 bands bound the number of replans by log2(max/min ability).
        floor = 2 * min(p_all[w] for w, _, _ in low)
        low = [x for x in low if p_all[x[0]] <= floor]
        for w, hu, su in sorted(low):
            notes.append(
                f"excluded {_label(w)} (ability {p_all[w]:.4g}): its rectangle would be {hu:.3g} hidden "
                f"units x {su:.3g} samples, below rpm.planner.min-units={min_units:g} of a unit; "
                f"planned without it"
            )
        gone = {w for w, _, _ in low}
        excluded += sorted(gone)
        active = [w for w in active if w not in gone]

    part = res.partition
    mapped = RealPartition(
        tuple(tuple(active[i] for i in col) for col in part.columns), part.widths, part.heights
    )
    if "small_group" in res.meta:  # the planner chose the threshold by its own objective
        small_group = float(res.meta["small_group"])
    snapped, merged = _snap(mapped, small_group)
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
    )
    if workers is not None:
        plan = plan.with_workers(list(workers))
    return plan


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


def _names(ws: Iterable[int]) -> str:
    return ", ".join(_label(w) for w in sorted(ws))


def _fraction(name: str, v: Any) -> float:
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise PlanError(
            f"{name}={v!r} is not a number; give a fraction of m in [0, 1), e.g. 0.06"
        ) from None
    if not (math.isfinite(f) and 0 <= f < 1):
        raise PlanError(
            f"{name}={v!r} must be a fraction of m in [0, 1), e.g. 0.06 (0 disables snapping)"
        )
    return f


def fastest_grid(
    abilities: Sequence[float],
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
) -> tuple[Plan, float]:
    """The ``N_DP`` plan of a grid baseline predicted fastest in seconds.

    ``dp=None`` in :func:`make_plan` picks ``N_DP`` by the element-count
    ``t_comm``; this picks it by :func:`~dask_rpm.cost.predict_iteration_seconds`
    with the workers' ``speeds`` (work units per second), which also counts
    compute imbalance. Every divisor of N is tried; infeasible ones are
    skipped; ties go to the smaller ``N_DP``. ``network``, ``vertical`` and
    ``horizontal`` are passed to the model as they are.

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
    for dp in _divisors(len(abilities)):
        try:
            plan = make_plan(abilities, shape, samples, method=method, dp=dp)
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


# srpm-time registers itself; imported last because it builds on this module.
from . import planner_time  # noqa: E402,F401
