"""Re-mapping a plan to new abilities, and the weight rows that must move (DRPM).

Two kinds of remap (docs/method.md §6):

* :func:`column_remap` keeps the number of columns ``C``, every ``k(c)``, the
  worker order and the excluded workers; only the column widths and the row
  cuts inside each column move to the new abilities.
* :func:`whole_remap` plans from scratch with SRPM on the new abilities.

:func:`migration` lists the rows of ``W`` (``n`` elements each) and columns of
``V`` (``l`` elements each) - one *row* below means hidden unit ``j``, i.e. both
``W[j, :]`` and ``V[:, j]`` - that each worker of the new plan must fetch.
Every column of the old plan holds a full copy of the weights, so a row can come
from the worker that held it in *any* old column. Samples never move: every
worker reads its new sample range from the dataset itself (:func:`sample_changes`).

Worker identity across plans
----------------------------
Plans name workers by index into ``abilities``. When both plans carry
``workers`` (Dask addresses, :meth:`Plan.with_workers`) workers are matched by
address and transfers name addresses; this is the only safe choice once a
worker was lost or added, because a new plan re-numbers its workers. Otherwise
workers are matched by index and transfers name indices.

Pure module: numpy only.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..comm.network import CostSettings
from ..plan.partition import Plan, PlanError, RealPartition, snap_small_groups, to_integer
from ..planners import make_plan
from ..planners.settings import PlannerSettings

__all__ = [
    "MigrationError",
    "SampleChange",
    "Transfer",
    "ability_vector",
    "column_remap",
    "migration",
    "stage_pieces",
    "migration_bytes",
    "migration_seconds",
    "rows_gained",
    "sample_changes",
    "whole_remap",
]

Abilities = Sequence[float] | Mapping[Hashable, float]


class MigrationError(PlanError):
    """Some weight rows of the new plan have no surviving holder in the old plan."""


@dataclass(frozen=True)
class Transfer:
    """Plan rows ``[rows[0], rows[1])`` of every parameter (:mod:`dask_rpm.nn.layers`) sent
    ``src -> dst``."""

    src: Hashable
    dst: Hashable
    rows: tuple[int, int]
    nbytes: int

    @property
    def n_rows(self) -> int:
        return self.rows[1] - self.rows[0]


@dataclass(frozen=True)
class SampleChange:
    """A worker whose sample range changed; ``old`` is ``None`` for a worker new to the plan."""

    worker: int | str  # a plan index, or an address when the plans are bound to workers
    old: tuple[int, int] | None
    new: tuple[int, int]


# --------------------------------------------------------------------- abilities
def ability_vector(plan: Plan, abilities: Abilities) -> np.ndarray:
    """New abilities as a vector index-aligned with ``plan.abilities``.

    Parameters
    ----------
    plan
        The plan whose workers the abilities describe.
    abilities
        A sequence with one value per plan worker (``len(plan.abilities)``), or
        a mapping keyed by worker index or, if the plan has ``workers``, by
        address (what :class:`~dask_rpm.drpm.estimator.AbilityEstimator` returns).
        Excluded workers may be missing from a mapping: they keep their old
        share, rescaled to the planned workers' new total.

    Raises
    ------
    PlanError
        Wrong length, a planned worker missing, or a planned worker's ability
        not a positive finite number.
    """
    n_all = len(plan.abilities)
    planned = plan.planned_workers
    if isinstance(abilities, Mapping):
        vec = np.full(n_all, np.nan)
        addr: dict[Any, int] = (
            {a: i for i, a in enumerate(plan.workers)} if plan.workers is not None else {}
        )
        for key, val in abilities.items():
            idx = addr.get(key, key)
            if not (isinstance(idx, (int, np.integer)) and 0 <= idx < n_all):
                known = list(plan.workers) if plan.workers else f"0..{n_all - 1}"
                raise PlanError(
                    f"ability given for unknown worker {key!r}; the plan has workers {known}"
                )
            vec[int(idx)] = float(val)
        missing = [w for w in planned if math.isnan(vec[w])]
        if missing:
            names = [plan.workers[w] if plan.workers else w for w in missing]
            raise PlanError(f"no ability for planned worker(s) {names!r}")
        old = np.asarray(plan.abilities, dtype=float)
        gaps = np.isnan(vec)
        if gaps.any():
            scale = vec[list(planned)].sum() / old[list(planned)].sum()
            vec[gaps] = old[gaps] * scale
    else:
        vec = np.asarray(list(abilities), dtype=float)
        if vec.shape != (n_all,):
            raise PlanError(
                f"need {n_all} abilities (one per plan worker, excluded included), got {vec.size}"
            )
    bad = [w for w in planned if not (math.isfinite(vec[w]) and vec[w] > 0)]
    if bad:
        raise PlanError(
            f"planned worker(s) {bad} need a positive finite ability, got {[vec[w] for w in bad]}"
        )
    return vec


# ------------------------------------------------------------------------ remaps
def column_remap(plan: Plan, abilities: Abilities, *, small_group: float | None = None) -> Plan:
    """Move the cuts of ``plan`` to new abilities, keeping its structure.

    Column ``c`` gets width ``sum(p_i for i in c) / sum(p)`` and worker ``i`` in
    it height ``p_i / sum(p_j for j in c)``; then thin bands are snapped
    (:func:`~dask_rpm.plan.partition.snap_small_groups`) and the cuts are rounded to
    whole samples and units (:func:`~dask_rpm.plan.partition.to_integer`).

    Parameters
    ----------
    plan
        The current plan.
    abilities
        New abilities, see :func:`ability_vector` (``t1`` estimates in DRPM).
    small_group
        Band threshold as a fraction of ``m``; ``None`` reads ``rpm.planner.small-group``.

    Returns
    -------
    Plan
        Same ``columns``, ``excluded``, ``workers`` and ``method``; ``notes`` gains
        ``"column remap"``.
    """
    vec = ability_vector(plan, abilities)
    if small_group is None:
        small_group = PlannerSettings.from_config().small_group
    small_group = float(small_group)
    sums = [float(sum(vec[w] for w in col)) for col in plan.columns]
    total = sum(sums)
    part = RealPartition(
        plan.columns,
        tuple(sc / total for sc in sums),
        tuple(tuple(float(vec[w]) / sc for w in col) for col, sc in zip(plan.columns, sums)),
    )
    part = snap_small_groups(part, small_group)
    return to_integer(
        part,
        abilities=vec,
        shape=plan.shape,
        samples=plan.samples,
        method=plan.method,
        excluded=plan.excluded,
        notes=(*plan.notes, "column remap"),
        workers=plan.workers,
    )


def whole_remap(plan: Plan, abilities: Abilities, **kw: Any) -> Plan:
    """Plan from scratch with SRPM on new abilities (``t2`` estimates in DRPM).

    Parameters
    ----------
    plan
        The current plan (gives ``shape``, ``samples`` and worker addresses).
    abilities
        A sequence (one per worker of the *new* plan; when its length equals the
        old plan's and the old plan has addresses, they are kept), or a mapping.
        A mapping naming every planned worker of the old plan and nobody else,
        by address or by index (excluded workers may be missing), is aligned
        with it, see
        :func:`ability_vector`; any other mapping - e.g. addresses after a worker
        was lost or added - defines the new worker set in its key order, and
        string keys become the new plan's ``workers``.
    **kw
        Passed to :func:`dask_rpm.planners.make_plan`.
    """

    workers: tuple[Hashable, ...] | None = None
    if isinstance(abilities, Mapping):
        keys = tuple(abilities)
        indices = set(range(len(plan.abilities)))
        known = set(plan.workers) if plan.workers is not None else indices
        planned = {plan.workers[w] if plan.workers else w for w in plan.planned_workers}
        same_by_index = (
            set(plan.planned_workers) <= set(keys) <= indices
        )  # what the estimator returns
        if same_by_index or planned <= set(keys) <= known:
            # The same workers (excluded ones may lack an estimate): keep indices and addresses.
            vec = ability_vector(plan, abilities)
            workers = plan.workers
        else:
            vec = np.asarray([float(abilities[k]) for k in keys])
            if all(isinstance(k, str) for k in keys):
                workers = keys
    else:
        vec = np.asarray(list(abilities), dtype=float)
        if plan.workers is not None and vec.size == len(plan.abilities):
            workers = plan.workers
    kw.setdefault("cost_shape", plan.cost_shape)  # a deep network's exchanges, as first planned
    new = make_plan(vec, plan.shape, plan.samples, method="srpm", **kw)
    new = replace(new, notes=(*new.notes, "whole remap"))
    if workers is not None:
        new = new.with_workers(workers)  # type: ignore[arg-type]
    return new


# --------------------------------------------------------------------- migration
def _ids(plan: Plan, by_address: bool) -> list[Hashable]:
    """Identity of each plan worker index."""
    if by_address:
        return list(plan.workers)  # type: ignore[arg-type]
    return list(range(len(plan.abilities)))


def migration(
    old: Plan,
    new: Plan,
    itemsize: int | None = None,
    *,
    lost: Iterable[Hashable] = (),
    row_bytes: Callable[[int, int], int] | None = None,
) -> list[Transfer]:
    """The weight rows each worker of ``new`` must fetch, and from whom.

    Every new worker needs hidden rows ``[m0, m1)`` of its rectangle. Rows it
    already held in ``old`` stay local; that is the least any migration can
    move, since every other row costs ``(n + l) * itemsize`` bytes from whichever
    source. Sources are chosen, per row range, by

    1. the holder in the destination's own old column (a column remap then
       moves rows only inside a column, between vertically adjacent workers
       unless a cut moved past a neighbour's whole rectangle);
    2. otherwise the holder whose range reaches furthest (fewest messages);
    3. then the holder that has sent the fewest bytes so far (spreads load);
    4. then the leftmost old column (determinism).

    Parameters
    ----------
    old, new
        Plans before and after the remap, same ``shape``.
    itemsize
        Bytes per weight element; ``None`` reads ``rpm.cost.itemsize``.
    lost
        Identities of workers that are gone and cannot send. Workers of ``old``
        absent from ``new``'s worker set (addresses, or indices when plans have
        no addresses) are treated as gone too.
    row_bytes
        ``row_bytes(x, y)``: bytes of plan rows ``[x, y)`` of every parameter (several hidden
        layers: :meth:`Layers.nbytes <dask_rpm.nn.layers.Layers.nbytes>`); default
        ``(y - x) (n + l) itemsize``, one hidden layer's.

    Returns
    -------
    list of Transfer
        Ordered by destination (``new``'s column order, top to bottom), then rows.

    Raises
    ------
    PlanError
        Different network shapes, or a lost worker planned in ``new``.
    MigrationError
        Some rows are held by no surviving worker (every old column lost its
        holder): the weights are gone and recovery needs a checkpoint.
    """
    if old.shape != new.shape:
        raise PlanError(f"plans have different network shapes {old.shape} and {new.shape}")
    itemsize = int(CostSettings.from_config().itemsize if itemsize is None else itemsize)
    n, _, l = new.shape  # noqa: E741
    if row_bytes is None:

        def row_bytes(x: int, y: int) -> int:
            return (y - x) * (n + l) * itemsize

    by_address = old.workers is not None and new.workers is not None
    old_id, new_id = _ids(old, by_address), _ids(new, by_address)
    gone = set(lost) | (set(old_id) - set(new_id))
    back = sorted(gone & {new_id[w] for w in new.planned_workers}, key=repr)
    if back:
        raise PlanError(f"lost worker(s) {back} cannot be planned in the new plan")

    # Per old column, its holders as (m0, m1, identity, alive), top to bottom.
    holders = [
        [
            (r.hidden[0], r.hidden[1], old_id[r.worker], old_id[r.worker] not in gone)
            for r in map(old.rectangle, col)
        ]
        for col in old.columns
    ]
    old_rect = {old_id[r.worker]: r for r in old.rectangles}
    sent: dict[Hashable, int] = {}
    out: list[Transfer] = []

    def holder_at(col: int, x: int) -> tuple[int, int, Hashable, bool]:
        for h in holders[col]:
            if h[0] <= x < h[1]:
                return h
        raise AssertionError("old plan does not tile its columns")  # validate() guarantees it

    for w in new.planned_workers:
        dst = new_id[w]
        a, b = new.rectangle(w).hidden
        mine = old_rect.get(dst)
        own_col = mine.column if mine is not None else None
        # Rows still to fetch: the new range minus the rows held locally.
        need = [(a, b)]
        if mine is not None:
            c0, c1 = mine.hidden
            need = [(x, y) for x, y in ((a, min(b, c0)), (max(a, c1), b)) if x < y]
        for x, e in need:
            while x < e:
                pick = None
                cap = e
                if own_col is not None:
                    h = holder_at(own_col, x)
                    if h[3]:
                        pick = (own_col, h)
                    else:
                        cap = min(e, h[1])  # back to the own column once the lost range ends
                if pick is None:
                    alive = [(c, h) for c in range(len(holders)) if (h := holder_at(c, x))[3]]
                    if not alive:
                        raise MigrationError(
                            f"hidden rows from {x} (needed by worker {dst!r}) are held by no surviving "
                            f"worker: every old column lost its holder ({sorted(map(repr, gone))}); "
                            f"the weights cannot be rebuilt by migration - recovery needs a checkpoint"
                        )
                    pick = min(
                        alive, key=lambda ch: (-min(ch[1][1], cap), sent.get(ch[1][2], 0), ch[0])
                    )
                src = pick[1][2]
                y = min(pick[1][1], cap)
                nbytes = row_bytes(x, y)
                sent[src] = sent.get(src, 0) + nbytes
                prev = out[-1] if out else None
                if prev is not None and prev.src == src and prev.dst == dst and prev.rows[1] == x:
                    out[-1] = Transfer(src, dst, (prev.rows[0], y), prev.nbytes + nbytes)
                else:
                    out.append(Transfer(src, dst, (x, y), nbytes))
                x = y
    return out


def migration_bytes(transfers: Iterable[Transfer]) -> int:
    """Total bytes moved by ``transfers``."""
    return int(sum(t.nbytes for t in transfers))


def migration_seconds(
    transfers: Sequence[Transfer],
    *,
    latency: float | None = None,
    bandwidth: float | None = None,
    concurrent: bool = False,
) -> float:
    """Predicted wall time of a migration.

    Parameters
    ----------
    transfers
        From :func:`migration`.
    latency, bandwidth
        Seconds per message and bytes per second per link; ``None`` reads
        ``rpm.cost.latency`` / ``rpm.cost.bandwidth``.
    concurrent
        ``False`` (default, conservative): transfers one after another,
        ``bytes / bandwidth + latency * messages``. ``True``: point-to-point
        transfers overlap, and the busiest worker (the larger of what it sends
        and what it receives) sets the time.
    """
    if latency is None or bandwidth is None:
        prices = CostSettings.from_config(latency=latency, bandwidth=bandwidth)
        latency, bandwidth = prices.latency, prices.bandwidth
    latency, bandwidth = float(latency), float(bandwidth)
    if bandwidth <= 0 or latency < 0:
        raise ValueError(f"need bandwidth > 0 and latency >= 0, got {bandwidth}, {latency}")
    if not transfers:
        return 0.0
    if not concurrent:
        return migration_bytes(transfers) / bandwidth + latency * len(transfers)
    busy: dict[tuple[str, Hashable], float] = {}
    for t in transfers:
        cost = t.nbytes / bandwidth + latency
        for key in (("send", t.src), ("recv", t.dst)):
            busy[key] = busy.get(key, 0.0) + cost
    return max(busy.values())


def stage_pieces(
    old: Plan,
    new: Plan,
    w: int,
    transfers: Sequence[Transfer],
    addresses: Sequence[str],
    lost: Iterable[str] = (),
) -> list[tuple[int, int, str | None]]:
    """Row ranges of worker ``w``'s rectangle in ``new`` and where each comes from: the address of
    its source in ``transfers`` (:func:`migration`), or None for rows it keeps; ``addresses``
    index the plans' workers. :class:`MigrationError` if they do not cover its rows once."""
    m0, m1 = new.rectangle(w).hidden
    me = addresses[w]
    pieces: list[tuple[int, int, str | None]] = []
    for t in transfers:
        dst = t.dst if isinstance(t.dst, str) else addresses[int(t.dst)]  # type: ignore[call-overload]
        if dst == me:
            src = t.src if isinstance(t.src, str) else addresses[int(t.src)]  # type: ignore[call-overload]
            pieces.append((t.rows[0], t.rows[1], src))
    if w in old.planned_workers and me not in set(lost):
        a, b = max(m0, old.rectangle(w).hidden[0]), min(m1, old.rectangle(w).hidden[1])
        if a < b:
            pieces.append((a, b, None))
    pieces.sort(key=lambda p: p[0])
    edges = [(a, b) for a, b, _ in pieces]
    if (
        not edges
        or edges[0][0] != m0
        or edges[-1][1] != m1
        or any(p[1] != q[0] for p, q in zip(edges[:-1], edges[1:]))
    ):
        raise MigrationError(
            f"internal error: migration does not cover rows [{m0}, {m1}) of worker {w}: {edges}"
        )
    return pieces


def sample_changes(old: Plan, new: Plan) -> list[SampleChange]:
    """Workers of ``new`` whose sample range differs from ``old`` (new workers included).

    Samples are never sent between workers: each listed worker re-reads its
    ``new`` range from the dataset. Workers are named as in :func:`migration`.
    """
    by_address = old.workers is not None and new.workers is not None
    old_id, new_id = _ids(old, by_address), _ids(new, by_address)
    before = {old_id[r.worker]: r.samples for r in old.rectangles}
    out = []
    for w in new.planned_workers:
        key = new_id[w]
        now = new.rectangle(w).samples
        if before.get(key) != now:
            out.append(SampleChange(key, before.get(key), now))  # type: ignore[arg-type]
    return out


def rows_gained(old: Plan, new: Plan) -> int:
    """Sample rows the workers of ``new`` hold that they did not hold under ``old``: what a remap
    makes reach them (from other workers, a dataset file or the client), summed over workers."""
    out = 0
    for change in sample_changes(old, new):
        a, b = change.new
        if change.old is not None:
            kept = max(0, min(b, change.old[1]) - max(a, change.old[0]))
        else:
            kept = 0
        out += (b - a) - kept
    return out
