"""The rectangle model: one rectangle of (samples x hidden units) per worker.

The work of one BP iteration is the unit square: samples along the horizontal
axis, hidden units along the vertical axis (docs/method.md §3). A *plan* gives every
worker a rectangle ``[s0, s1) x [m0, m1)``. Plans here are *column-fixed*:
workers in one column share a sample range and split the hidden units, columns
split the samples.

This module is pure (numpy only). It holds

* :class:`RealPartition` - the real-valued plan a planner produces (column
  widths and per-worker heights as fractions of the unit square), defined with
  the snapping rule in :mod:`dask_rpm.plan.real_partition` and re-exported here;
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
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

import numpy as np

from .dataset import plan_dataset
from .real_partition import (
    PlanError,
    RealPartition,
    count_noun,
    round_cuts,
    snap_small_groups,
    snap_with_count,
    t_comm_model,
)

__all__ = [
    "PlanError",
    "RealPartition",
    "Rectangle",
    "Plan",
    "snap_small_groups",
    "snap_with_count",
    "to_integer",
    "round_cuts",
    "t_comm_model",
]


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
    cost_shape : tuple of int, optional
        ``(n, m, l)`` the communication model counts with, when it is not ``shape``: a network
        of several hidden layers (:attr:`Layers.cost_shape <dask_rpm.nn.layers.Layers.cost_shape>`).
        Remaps plan with it again.
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
    cost_shape: tuple[int, int, int] | None = None
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

    def column_samples(self, column: int) -> tuple[int, int]:
        return self.rectangle(self.columns[column][0]).samples

    def bands(self) -> list[tuple[int, int]]:
        """Horizontal communication bands: hidden ranges between consecutive cuts of all columns."""
        cuts = sorted({r.hidden[0] for r in self.rectangles} | {self.m})
        return [(a, b) for a, b in zip(cuts[:-1], cuts[1:])]

    def band_groups(self) -> list[tuple[tuple[int, ...], list[tuple[int, int]]]]:
        """Bands with the same holders merged: ``(holders left to right, their bands)``, in band order.

        One horizontal allreduce each (the engine's groups of bands, and what
        the cost model charges). Vectorised over the columns - a plan of
        thousands of workers has thousands of bands - rather than
        :meth:`holders` per band.
        """
        cuts = np.array(sorted({r.hidden[0] for r in self.rectangles} | {self.m}))
        lo = cuts[:-1]
        holders = np.empty((len(lo), len(self.columns)), dtype=np.int64)
        for c, col in enumerate(self.columns):
            ws = sorted(col, key=lambda w: self.rectangle(w).hidden[0])
            starts = np.array([self.rectangle(w).hidden[0] for w in ws])
            holders[:, c] = np.asarray(ws)[np.searchsorted(starts, lo, side="right") - 1]
        groups: dict[tuple[int, ...], list[tuple[int, int]]] = {}
        for h, a, b in zip(map(tuple, holders.tolist()), lo.tolist(), cuts[1:].tolist()):
            groups.setdefault(h, []).append((int(a), int(b)))
        return list(groups.items())

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
            cost = plan.cost_shape or plan.shape
            tc = t_comm_model(widths, [len(col) for col in cols], cost, plan.samples)
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
            **({"cost_shape": list(self.cost_shape)} if self.cost_shape is not None else {}),
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
            cost_shape=tuple(int(v) for v in d["cost_shape"]) if d.get("cost_shape") else None,  # type: ignore[arg-type]
        )
        return plan.validate()

    def __repr__(self) -> str:
        cols = " | ".join("{" + ",".join(f"P{w + 1}" for w in c) + "}" for c in self.columns)
        return (
            f"<Plan {self.method}: {count_noun(len(self.rectangles), 'worker')} in {count_noun(self.n_columns, 'column')} "
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
