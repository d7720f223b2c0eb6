"""The real-valued partition a planner produces, and what is done to it before rounding.

* :class:`RealPartition` - column widths and per-worker heights as fractions of the unit
  square (samples x hidden units);
* :func:`t_comm_model` - the paper's communication model of a column structure (elements);
* :func:`snap_small_groups` - the conference paper's small-communication-group rule;
* :func:`round_cuts` - cut positions rounded to whole units (see :mod:`dask_rpm.plan.partition`).

Below :mod:`dask_rpm.plan.partition` (the integer plan), which re-exports these names. Pure (numpy).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "PlanError",
    "RealPartition",
    "count_noun",
    "round_cuts",
    "snap_small_groups",
    "snap_with_count",
    "t_comm_model",
]


def count_noun(k: int, noun: str) -> str:
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
