"""The rectangle model: one rectangle of (samples x hidden units) per worker.

The work of one BP iteration is the unit square: samples along the horizontal
axis, hidden units along the vertical axis (SPEC section 3). A *plan* gives every
worker a rectangle ``[s0, s1) x [m0, m1)``. Plans here are *column-fixed*:
workers in one column share a sample range and split the hidden units, columns
split the samples.

This module is pure (numpy only). It holds

* :class:`RealPartition` - the real-valued plan a planner produces (column
  widths and per-worker heights as fractions of the unit square);
* :class:`Rectangle` and :class:`Plan` - the integer plan the engine runs, with
  exact-tiling validation;
* :func:`snap_small_groups` - the conference paper's small-communication-group
  rule (sec. 4.5);
* :func:`to_integer` - the integer mapping.

Integer mapping
---------------
We round *cut positions*, not sizes: the cut after the first ``j`` items sits at
``round(s * cumulative_fraction_j)``. Every size is then within one unit of its
real value, the sizes sum exactly to ``s`` (or ``m``), and - the reason for this
choice over largest-remainder rounding of sizes - cuts that coincide in the real
plan (columns whose row cuts were snapped together) stay identical after
rounding, so rounding never re-creates a thin horizontal communication band.
Rounding is half-up on exact ties so results do not depend on float parity.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

import numpy as np

from .plan_dataset import plan_dataset

__all__ = [
    "PlanError",
    "RealPartition",
    "Rectangle",
    "Plan",
    "snap_small_groups",
    "snap_with_count",
    "to_integer",
    "round_cuts",
]


def _count(k: int, noun: str) -> str:
    """``1 worker``, ``2 workers``: counts in messages people read."""
    return f"{k} {noun}{'' if k == 1 else 's'}"


class PlanError(ValueError):
    """A plan or a planner input is invalid; the message says what and how to fix it."""


@dataclass(frozen=True)
class RealPartition:
    """A real-valued column-fixed partition of the unit square.

    Parameters
    ----------
    columns
        Worker indices per column, left to right; inside a column, top to bottom.
    widths
        Fraction of the samples per column; sums to 1.
    heights
        Per column, the fraction of the hidden units of each worker; each sums to 1.
    """

    columns: tuple[tuple[int, ...], ...]
    widths: tuple[float, ...]
    heights: tuple[tuple[float, ...], ...]

    def __post_init__(self) -> None:
        if len(self.columns) != len(self.widths) or len(self.columns) != len(self.heights):
            raise PlanError(
                f"columns, widths and heights must have one entry per column; got "
                f"{len(self.columns)}, {len(self.widths)}, {len(self.heights)}"
            )
        for col, hs in zip(self.columns, self.heights):
            if len(col) != len(hs):
                raise PlanError(f"column {col} has {len(hs)} heights; expected {len(col)}")

    def row_cuts(self) -> list[list[float]]:
        """Interior row-cut positions (fractions of m) per column."""
        return [list(np.cumsum(hs)[:-1]) for hs in self.heights]


def t_comm_model(
    widths: Sequence[float], sizes: Sequence[int], shape: tuple[int, int, int], samples: int
) -> float:
    """The paper's communication model (elements), ``2 l s max_c(s_c* (k(c) - 1)) + 2 (l + n) m (C - 1)`` from column widths and sizes.

    Parameters
    ----------
    widths
        Sample fraction ``s_c*`` of each column (any positive scale; normalised here).
    sizes
        Number of workers ``k(c)`` of each column.
    shape
        ``(n, m, l)``.
    samples
        ``s``.
    """
    n, m, l = shape
    total = float(sum(widths))
    vertical = max(w / total * (k - 1) for w, k in zip(widths, sizes))
    return float(2 * l * samples * vertical + 2 * (l + n) * m * (len(sizes) - 1))


def round_cuts(fractions: Sequence[float], total: int) -> list[int]:
    """Integer sizes summing to ``total`` by rounding cumulative cut positions.

    The cut after the first ``j`` parts goes to ``round(total * F_j)`` where
    ``F_j`` is the cumulative fraction, rounded half-up. ``F_j`` is first rounded
    to 12 decimals so that two columns whose cuts coincide in the real plan
    (their cumulative sums may differ in the last bits) get the same integer
    cut. Every cut is then within 1/2 of its real position, so every size is
    within one unit of its real value.

    Each size is at least 1 when ``total >= len(fractions)``: cuts that collide
    after rounding are pushed apart (forward, then backward from the end), which
    moves any cut by the minimum needed. Only this push can take a size more
    than one unit away from its real value.

    Parameters
    ----------
    fractions
        Non-negative part sizes with a positive sum (normalised here).
    total
        Number of whole units to share out.

    Returns
    -------
    list of int
        ``len(fractions)`` sizes, each >= 1, summing to ``total``.

    Raises
    ------
    PlanError
        If ``total < len(fractions)`` (not every part can get one unit), or the
        fractions are negative, not finite, or sum to zero.
    """
    k = len(fractions)
    if k == 0:
        raise PlanError("cannot split into zero parts")
    if total < k:
        raise PlanError(f"cannot give {k} parts at least one unit each out of {total}")
    fr = np.asarray(fractions, dtype=float)
    if not np.all(np.isfinite(fr)) or np.any(fr < 0) or not fr.sum() > 0:
        raise PlanError(
            f"fractions must be finite, non-negative and sum to more than 0; got {list(fr)}"
        )
    cum = np.cumsum(fr) / fr.sum()
    cuts = [int(math.floor(total * round(float(c), 12) + 0.5)) for c in cum[:-1]]
    # Keep every part non-empty: cut j must lie in [j+1, total-(k-1-j)].
    for j in range(len(cuts)):
        lo = (cuts[j - 1] + 1) if j else 1
        cuts[j] = max(cuts[j], lo)
    for j in range(len(cuts) - 1, -1, -1):
        hi = (cuts[j + 1] - 1) if j + 1 < len(cuts) else total - 1
        cuts[j] = min(cuts[j], hi)
    edges = [0, *cuts, total]
    return [b - a for a, b in zip(edges[:-1], edges[1:])]


_EPS = 1e-12
_TOL = 1e-9  # slack on threshold comparisons: 0.56 - 0.5 is 0.06000000000000005 in floats


def snap_small_groups(part: RealPartition, threshold: float) -> RealPartition:
    """Merge thin horizontal communication bands (conference paper, sec. 4.5).

    The interior row cuts of all columns, taken together, split the hidden
    units into bands; the workers holding one band across the columns form a
    horizontal communication group. A band no thicker than ``threshold`` (a
    fraction of m; the paper uses 0.06 and "a <= 0.06") costs a message per
    column for very little data. It is removed by moving *every* cut at one of
    its two edges onto the other edge, so the two cut positions become one.

    Rules (the paper only shows one example; these are our choices):

    * thinnest band first, then re-evaluate (merging widens the neighbouring
      bands, so a chain of thin bands is not collapsed all at once);
    * all-or-nothing: if one column has cuts at both edges, the band is a whole
      rectangle of that column and cannot go without emptying it, so it stays;
      moving only some of the cuts would cost balance without removing the band;
    * of the two directions, take the one whose affected rectangles end up
      least overloaded (largest new-area / original-area); ties move the upper
      edge down;
    * no cut ever ends further than ``threshold`` from its original position,
      so snapping changes any worker's height by at most ``2 * threshold``.

    Bands touching the top or bottom edge are a single rectangle's height in
    the column that owns the cut and are never snapped. Runs in
    ``O(K log K)`` for ``K`` interior cuts (heap of gaps, linked positions).

    Parameters
    ----------
    part
        The real-valued partition.
    threshold
        Band thickness, as a fraction of the hidden units, at or below which a
        band is removed. ``threshold <= 0`` returns ``part`` unchanged.

    Returns
    -------
    RealPartition
        Same columns and widths; heights changed where cuts moved.
    """
    return snap_with_count(part, threshold)[0]


def snap_with_count(part: RealPartition, threshold: float) -> tuple[RealPartition, int]:
    """:func:`snap_small_groups` that also returns the number of merged bands."""
    import heapq

    if threshold <= 0 or len(part.columns) < 2:
        return part, 0
    # Edges per column: [0, cut_1, ..., cut_{k-1}, 1]; targets are the original areas.
    edges = [[0.0, *(float(v) for v in np.cumsum(hs)[:-1]), 1.0] for hs in part.heights]
    orig = [list(e) for e in edges]
    width = [float(w) for w in part.widths]
    target = [[width[c] * float(h) for h in hs] for c, hs in enumerate(part.heights)]

    # Distinct interior cut positions (grouped at 12 decimals), each with its members.
    groups: dict[float, list[tuple[int, int]]] = {}
    for c, e in enumerate(edges):
        for j in range(1, len(e) - 1):
            groups.setdefault(round(e[j], 12), []).append((c, j))
    keys = sorted(groups)
    if len(keys) < 2:
        return part, 0
    value = [float(edges[groups[k][0][0]][groups[k][0][1]]) for k in keys]
    members = [groups[k] for k in keys]
    cols = [{c for c, _ in groups[k]} for k in keys]
    # Give every member of a group exactly the group's value.
    for g, mem in enumerate(members):
        for c, j in mem:
            edges[c][j] = value[g]
    prev = list(range(-1, len(keys) - 1))
    nxt = [*range(1, len(keys)), -1]
    alive = [True] * len(keys)
    heap = [(value[g + 1] - value[g], value[g], g, g + 1) for g in range(len(keys) - 1)]
    heapq.heapify(heap)

    def option(src: int, dst: int) -> float | None:
        """Worst overload if group ``src`` moves onto ``dst``; None if not allowed."""
        worst = 0.0
        for c, j in members[src]:
            if abs(value[dst] - orig[c][j]) > threshold + _TOL:
                return None
            e = edges[c]
            for r, (lo, hi) in ((j - 1, (e[j - 1], value[dst])), (j, (value[dst], e[j + 1]))):
                if hi - lo <= _EPS:
                    return None
                t = target[c][r]
                worst = max(worst, width[c] * (hi - lo) / t if t > 0 else math.inf)
        return worst

    merged = 0
    while heap:
        gap, _, a, b = heapq.heappop(heap)
        if gap > threshold + _TOL:
            break
        if not (alive[a] and alive[b] and nxt[a] == b) or abs(value[b] - value[a] - gap) > _EPS:
            continue  # stale entry
        if cols[a] & cols[b]:
            continue  # the band is a whole rectangle of some column
        down, up = option(b, a), option(a, b)
        if down is None and up is None:
            continue
        if up is None or (down is not None and down <= up):
            src, dst = b, a
        else:
            src, dst = a, b
        for c, j in members[src]:
            edges[c][j] = value[dst]
        members[dst] = members[dst] + members[src]
        cols[dst] |= cols[src]
        alive[src] = False
        # Unlink src and push the gaps that changed.
        p, q = prev[src], nxt[src]
        if p >= 0:
            nxt[p] = q
        if q >= 0:
            prev[q] = p
        merged += 1
        for x, y in ((prev[dst], dst), (dst, nxt[dst])):
            if x >= 0 and y >= 0:
                heapq.heappush(heap, (value[y] - value[x], value[x], x, y))
    if not merged:
        return part, 0
    heights = tuple(tuple(e1 - e0 for e0, e1 in zip(e[:-1], e[1:])) for e in edges)
    return RealPartition(part.columns, part.widths, heights), merged


@dataclass(frozen=True)
class Rectangle:
    """One worker's share of an iteration: samples ``[s0, s1)``, hidden units ``[m0, m1)``."""

    worker: int
    column: int
    samples: tuple[int, int]
    hidden: tuple[int, int]

    @property
    def area(self) -> int:
        return (self.samples[1] - self.samples[0]) * (self.hidden[1] - self.hidden[0])

    @property
    def n_samples(self) -> int:
        return self.samples[1] - self.samples[0]

    @property
    def n_hidden(self) -> int:
        return self.hidden[1] - self.hidden[0]

    def to_dict(self) -> dict[str, Any]:
        return {
            "worker": self.worker,
            "column": self.column,
            "samples": list(self.samples),
            "hidden": list(self.hidden),
        }


@dataclass(frozen=True)
class Plan:
    """An integer, column-fixed plan for one BP iteration.

    Worker indices refer to positions in ``abilities`` (the order the user gave
    them). ``columns`` lists, left to right, the workers of each column top to
    bottom. ``excluded`` are workers deliberately left out (too slow to get one
    hidden unit); ``notes`` says why.

    Attributes
    ----------
    method : str
        Name of the planner that produced the plan.
    abilities : tuple of float
        Normalised abilities (sum 1) of *all* workers, including excluded ones.
    shape : tuple of int
        Network shape ``(n, m, l)``.
    samples : int
        Number of samples ``s``.
    columns : tuple of tuple of int
    rectangles : tuple of Rectangle
        One per planned worker, ordered as in ``columns``.
    t_comm : float
        The paper's element-count communication cost of this (integer) plan.
    t_comm_by_columns : tuple of float
        SRPM's ``t_comm(C)`` for C = 1..N (empty for other planners).
    excluded : tuple of int
    notes : tuple of str
    workers : tuple of str, optional
        Dask worker addresses or names, index-aligned with ``abilities``.
    """

    method: str
    abilities: tuple[float, ...]
    shape: tuple[int, int, int]
    samples: int
    columns: tuple[tuple[int, ...], ...]
    rectangles: tuple[Rectangle, ...]
    t_comm: float = float("nan")
    t_comm_by_columns: tuple[float, ...] = ()
    excluded: tuple[int, ...] = ()
    notes: tuple[str, ...] = ()
    workers: tuple[str, ...] | None = None
    meta: dict[str, Any] = field(default_factory=dict, compare=False)

    # ------------------------------------------------------------------ access
    @property
    def n(self) -> int:
        return self.shape[0]

    @property
    def m(self) -> int:
        return self.shape[1]

    @property
    def l(self) -> int:  # noqa: E743 - the paper's name for the output size
        return self.shape[2]

    @property
    def n_columns(self) -> int:
        return len(self.columns)

    @property
    def planned_workers(self) -> tuple[int, ...]:
        return tuple(w for col in self.columns for w in col)

    @cached_property
    def _by_worker(self) -> dict[int, Rectangle]:
        # Index built once per (immutable) plan: rectangle() is called per
        # worker by imbalance(), t_comm() and the engine, O(N^2) without it.
        # cached_property writes the instance __dict__, which frozen allows.
        out: dict[int, Rectangle] = {}
        for r in self.rectangles:
            out.setdefault(r.worker, r)
        return out

    def rectangle(self, worker: int) -> Rectangle:
        """The rectangle of plan worker ``worker``."""
        try:
            return self._by_worker[worker]
        except KeyError:
            raise KeyError(f"worker {worker} has no rectangle in this plan") from None

    def column_of(self, worker: int) -> int:
        return self.rectangle(worker).column

    def column_samples(self, column: int) -> tuple[int, int]:
        return self.rectangle(self.columns[column][0]).samples

    def bands(self) -> list[tuple[int, int]]:
        """Horizontal communication bands: hidden ranges between consecutive cuts of all columns."""
        cuts = sorted({r.hidden[0] for r in self.rectangles} | {self.m})
        return [(a, b) for a, b in zip(cuts[:-1], cuts[1:])]

    def holders(self, band: tuple[int, int]) -> list[int]:
        """Workers (one per column, left to right) whose rows contain ``band``."""
        out = []
        for col in self.columns:
            for w in col:
                r = self.rectangle(w)
                if r.hidden[0] <= band[0] and band[1] <= r.hidden[1]:
                    out.append(w)
                    break
        return out

    def imbalance(self) -> float:
        """Load imbalance: max over planned workers of area share / ability share.

        1.0 is perfect balance; 1.1 means the most overloaded worker has 10 %
        more work than its ability warrants (and sets the pace).
        """
        planned = self.planned_workers
        p = np.array([self.abilities[w] for w in planned], dtype=float)
        p = p / p.sum()
        total = self.samples * self.m
        a = np.array([self.rectangle(w).area / total for w in planned])
        return float(np.max(a / p))

    # -------------------------------------------------------------- validation
    def validate(self) -> Plan:
        """Check that the rectangles tile ``[0, s) x [0, m)`` exactly, column-fixed.

        Returns the plan itself so it can be chained; raises :class:`PlanError`.
        """
        s, m = self.samples, self.m
        if s < 1 or m < 1:
            raise PlanError(f"plan needs samples >= 1 and hidden >= 1, got s={s}, m={m}")
        seen: set[int] = set()
        by_worker = {}
        for r in self.rectangles:
            if r.worker in seen:
                raise PlanError(f"worker {r.worker} has more than one rectangle")
            seen.add(r.worker)
            by_worker[r.worker] = r
            (s0, s1), (m0, m1) = r.samples, r.hidden
            if not (0 <= s0 < s1 <= s and 0 <= m0 < m1 <= m):
                raise PlanError(
                    f"rectangle of worker {r.worker} is samples [{s0}, {s1}) x hidden "
                    f"[{m0}, {m1}); each must be non-empty and inside [0, {s}) x [0, {m})"
                )
        if seen != set(self.planned_workers) or len(self.planned_workers) != len(seen):
            raise PlanError(
                f"columns {self.columns} must list each rectangle's worker exactly once; "
                f"rectangles are for workers {sorted(seen)}"
            )
        if set(self.excluded) & seen:
            raise PlanError(
                f"excluded workers {sorted(set(self.excluded) & seen)} also have rectangles"
            )
        n_all = len(self.abilities)
        for w in seen | set(self.excluded):
            if not 0 <= w < n_all:
                raise PlanError(f"worker index {w} is outside 0..{n_all - 1} (one per ability)")
        s_edge = 0
        for c, col in enumerate(self.columns):
            if not col:
                raise PlanError(f"column {c} is empty")
            rs = [by_worker[w] for w in col]
            srange = rs[0].samples
            if srange[0] != s_edge:
                raise PlanError(
                    f"column {c} starts at sample {srange[0]}; expected {s_edge} (gap or overlap)"
                )
            m_edge = 0
            for r in rs:
                if r.column != c:
                    raise PlanError(
                        f"rectangle of worker {r.worker} says column {r.column}, listed in {c}"
                    )
                if r.samples != srange:
                    raise PlanError(
                        f"worker {r.worker} has samples {list(r.samples)} but its column {c} "
                        f"spans {list(srange)}: plans must be column-fixed"
                    )
                if r.hidden[0] != m_edge:
                    raise PlanError(
                        f"worker {r.worker} in column {c} starts at hidden unit {r.hidden[0]}; "
                        f"expected {m_edge} (gap or overlap)"
                    )
                m_edge = r.hidden[1]
            if m_edge != m:
                raise PlanError(
                    f"column {c} covers hidden units [0, {m_edge}); must cover [0, {m})"
                )
            s_edge = srange[1]
        if s_edge != s:
            raise PlanError(f"columns cover samples [0, {s_edge}); must cover [0, {s})")
        return self

    # ---------------------------------------------------------- construction
    @classmethod
    def from_columns(
        cls,
        columns: Sequence[Sequence[int]],
        sample_sizes: Sequence[int],
        hidden_sizes: Sequence[Sequence[int]],
        *,
        abilities: Sequence[float] | np.ndarray | None = None,
        shape: tuple[int, int, int],
        method: str = "custom",
        **kwargs: Any,
    ) -> Plan:
        """Build and validate a plan from per-column sample counts and per-worker unit counts."""
        cols = tuple(tuple(int(w) for w in c) for c in columns)
        n_workers = max(w for c in cols for w in c) + 1
        if abilities is None:
            abilities = [1.0] * n_workers
        given = np.asarray(abilities, dtype=float)
        ab = tuple(float(a) for a in given / given.sum())
        rects = []
        s0 = 0
        for c, (col, sc, hs) in enumerate(zip(cols, sample_sizes, hidden_sizes)):
            m0 = 0
            for w, h in zip(col, hs):
                rects.append(Rectangle(w, c, (s0, s0 + int(sc)), (m0, m0 + int(h))))
                m0 += int(h)
            s0 += int(sc)
        plan = cls(
            method=method,
            abilities=ab,
            shape=(int(shape[0]), int(shape[1]), int(shape[2])),
            samples=int(s0),
            columns=cols,
            rectangles=tuple(rects),
            **kwargs,
        )
        plan.validate()
        if math.isnan(plan.t_comm):
            widths = [
                plan.column_samples(c)[1] - plan.column_samples(c)[0] for c in range(len(cols))
            ]
            tc = t_comm_model(widths, [len(col) for col in cols], plan.shape, plan.samples)
            plan = replace(plan, t_comm=tc)
        return plan

    def with_workers(self, workers: Sequence[str]) -> Plan:
        """Return a copy bound to Dask worker addresses (index-aligned with abilities)."""
        if len(workers) != len(self.abilities):
            raise PlanError(
                f"plan has {len(self.abilities)} workers but {len(workers)} addresses were given"
            )
        return replace(self, workers=tuple(workers))

    # ----------------------------------------------------------- serialising
    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "abilities": list(self.abilities),
            "shape": list(self.shape),
            "samples": self.samples,
            "columns": [list(c) for c in self.columns],
            "t_comm": self.t_comm,
            "t_comm_by_columns": list(self.t_comm_by_columns),
            "imbalance": self.imbalance(),
            "excluded": list(self.excluded),
            "notes": list(self.notes),
            "workers": list(self.workers) if self.workers is not None else None,
            "rectangles": [r.to_dict() for r in self.rectangles],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    def to_dataset(self) -> Any:
        """The plan as an ``xarray.Dataset`` per worker, with units (:func:`dask_rpm.results.plan_dataset`)."""
        return plan_dataset(self)

    @classmethod
    def from_dataset(cls, ds: Any) -> Plan:
        """The plan stored by :meth:`to_dataset` (exact round trip)."""
        text = getattr(ds, "attrs", {}).get("plan_json")
        if not text:
            raise PlanError(
                "this dataset holds no plan: it has no 'plan_json' attribute; "
                "make it with Plan.to_dataset() (or dask_rpm.results.plan_dataset)"
            )
        return cls.from_dict(json.loads(text))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Plan:
        rects = tuple(
            Rectangle(int(r["worker"]), int(r["column"]), tuple(r["samples"]), tuple(r["hidden"]))
            for r in d["rectangles"]
        )
        plan = cls(
            method=d.get("method", "custom"),
            abilities=tuple(float(a) for a in d["abilities"]),
            shape=tuple(int(v) for v in d["shape"]),  # type: ignore[arg-type]
            samples=int(d["samples"]),
            columns=tuple(tuple(int(w) for w in c) for c in d["columns"]),
            rectangles=rects,
            t_comm=float(d.get("t_comm", float("nan"))),
            t_comm_by_columns=tuple(d.get("t_comm_by_columns", ())),
            excluded=tuple(d.get("excluded", ())),
            notes=tuple(d.get("notes", ())),
            workers=tuple(d["workers"]) if d.get("workers") else None,
        )
        return plan.validate()

    def __repr__(self) -> str:
        cols = " | ".join("{" + ",".join(f"P{w + 1}" for w in c) + "}" for c in self.columns)
        return (
            f"<Plan {self.method}: {_count(len(self.rectangles), 'worker')} in {_count(self.n_columns, 'column')} "
            f"{cols}; s={self.samples}, n-m-l={self.n}-{self.m}-{self.l}, "
            f"t_comm={self.t_comm:.1f}, imbalance={self.imbalance():.3f}>"
        )


def to_integer(
    part: RealPartition,
    *,
    abilities: Sequence[float] | np.ndarray,
    shape: tuple[int, int, int],
    samples: int,
    method: str,
    **kwargs: Any,
) -> Plan:
    """Map a real-valued partition to whole samples and whole hidden units (see module doc)."""
    n, m, l = shape
    if samples < len(part.columns):
        raise PlanError(
            f"samples={samples} is fewer than the {len(part.columns)} columns of the plan; "
            f"each column needs at least one sample (use more samples or fewer workers)"
        )
    for c, col in enumerate(part.columns):
        if len(col) > m:
            raise PlanError(
                f"column {c} has {len(col)} workers but the network has only hidden={m} units; "
                f"each worker needs at least one (use more hidden units or fewer workers)"
            )
    sample_sizes = round_cuts(part.widths, samples)
    hidden_sizes = [round_cuts(hs, m) for hs in part.heights]
    return Plan.from_columns(
        part.columns,
        sample_sizes,
        hidden_sizes,
        abilities=abilities,
        shape=shape,
        method=method,
        **kwargs,
    )


def iter_rectangles(plan: Plan) -> Iterable[Rectangle]:
    """Rectangles in column order (left to right, top to bottom)."""
    for col in plan.columns:
        for w in col:
            yield plan.rectangle(w)
