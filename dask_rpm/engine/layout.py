"""From a :class:`~dask_rpm.plan.partition.Plan` to what each worker needs to know of it.

Pure: no ``distributed``. The driver builds one :class:`Layout` per planned
worker and sends it with the worker's setup or remap task; the block loop
(:mod:`dask_rpm.engine.block`) needs nothing else to exchange with its peers.

Exchanges (docs/architecture.md)
--------------------------------
Both exchanges are allreduces whose result every holder gets bit-identical.

* **Vertical**, inside a column: the partial products ``f_i V_i^T`` of the
  column's workers. ``allgather``: every member sends its partial to every
  other member and each sums them in column order (one hop); ``leader``: the
  members send to the column's leader, which sums, computes the output
  deltas and sends them back; ``tree``, ``halving``, ``ring``, ``direct``:
  the schedules of :mod:`dask_rpm.comm.exchange` (rounds of slices).
* **Horizontal**, across columns: ``pairwise``: every worker sends the rows of
  its weight-update sums that overlap each worker of another column to that
  worker (one message per overlapping pair) and sums what it receives in
  column order; or one schedule of :mod:`dask_rpm.comm.exchange` per group of
  bands with the same holders (the bands merged into one buffer).

``rpm.engine.vertical`` / ``rpm.engine.horizontal`` name the algorithm or
say ``auto``: the one-hop exchange up to ``rpm.engine.allgather-max``
holders, above it the one the cost model (``rpm.cost.*``) predicts fastest
for the group's size and bytes (:func:`dask_rpm.comm.engine_algorithm`, the
rule :func:`dask_rpm.cost.predict_breakdown` charges too).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..comm import EngineRule, Interconnect
from ..nn.layers import Layers
from ..plan.partition import Plan
from .records import BandGroup, Layout, Peer

__all__ = [
    "layouts",
    "layout_layers",
    "band_groups",
    "exchanges_summary",
]


def band_groups(plan: Plan, addresses: Sequence[str], rule: EngineRule) -> list[BandGroup]:
    """The horizontal allreduces of ``plan``: bands with the same holders merged, in band order.

    Their algorithms come from ``rule`` (:meth:`dask_rpm.comm.EngineRule.horizontal_for`);
    an empty list when the exchange is ``pairwise`` (or there is one column).
    """
    groups = plan.band_groups() if plan.n_columns > 1 else []
    per_row = plan.n + plan.l
    algorithms = rule.horizontal_for(
        plan.n_columns, [(h, per_row * sum(b - a for a, b in bands)) for h, bands in groups]
    )
    if algorithms is None:
        return []
    return [
        BandGroup(holders, tuple(addresses[w] for w in holders), tuple(bands), alg)
        for (holders, bands), alg in zip(groups, algorithms)
    ]


def layouts(
    plan: Plan,
    addresses: Sequence[str],
    *,
    run: str,
    version: int,
    vertical: str | None = None,
    horizontal: str | None = None,
    network: Interconnect | None = None,
    hidden: Sequence[int] = (),
) -> dict[int, Layout]:
    """One :class:`Layout` per planned worker of ``plan``.

    Parameters
    ----------
    plan : Plan
        Worker indices of the plan index ``addresses``.
    addresses : sequence of str
        Worker addresses, by plan index.
    run, version : str, int
        Run name and plan version (a counter the driver advances at each remap).
    vertical : str, optional
        In-column exchange (:data:`dask_rpm.comm.ENGINE_VERTICAL`); default
        ``rpm.engine.vertical``.
    horizontal : str, optional
        Across-column exchange (``auto``, ``pairwise`` or a schedule name);
        default ``rpm.engine.horizontal``.
    network : Interconnect, optional
        What ``auto`` predicts with; default from ``rpm.cost.*``.
    hidden : sequence of int, optional
        Units of every hidden layer as planned (default: one layer of the plan's ``m``).
    """
    rule = EngineRule.from_config(vertical, horizontal, network)
    n_cols = plan.n_columns
    rects = {w: plan.rectangle(w) for w in plan.planned_workers}
    columns = [[w for w in col if w in rects] for col in plan.columns]
    # top to bottom inside each column
    columns = [sorted(col, key=lambda w: rects[w].hidden[0]) for col in columns]
    groups = band_groups(plan, addresses, rule)
    out: dict[int, Layout] = {}
    for c, col in enumerate(columns):
        members = tuple(Peer(w, addresses[w], rects[w].hidden) for w in col)
        s0, s1 = plan.column_samples(c)
        algorithm = rule.vertical_for(col, plan.l * (s1 - s0))
        # The fastest member sums (it has the most to wait for otherwise); ties: lowest index.
        leader = max(col, key=lambda w: (plan.abilities[w], -w))
        for w in col:
            a, b = rects[w].hidden
            out[w] = Layout(
                run=run,
                version=version,
                worker=w,
                address=addresses[w],
                shape=plan.shape,
                column=c,
                n_columns=n_cols,
                samples=rects[w].samples,
                rows=(a, b),
                members=members,
                partners=_partners(columns, rects, addresses, c, (a, b)),
                vertical=algorithm,
                leader=leader,
                horizontal="groups" if groups else "pairwise",
                bands=tuple(g for g in groups if w in g.holders),
                hidden=tuple(int(v) for v in hidden),
            )
    return out


def _partners(
    columns: list[list[int]], rects: dict, addresses: Sequence[str], c: int, rows: tuple[int, int]
) -> tuple[tuple[Peer, ...], ...]:
    """Per column, the workers whose rows overlap ``rows``, with the overlap (none for column ``c``)."""
    a, b = rows
    partners: list[tuple[Peer, ...]] = []
    for c2, col2 in enumerate(columns):
        if c2 == c:
            partners.append(())
            continue
        overlap = []
        for v in col2:
            lo, hi = max(a, rects[v].hidden[0]), min(b, rects[v].hidden[1])
            if lo < hi:
                overlap.append(Peer(v, addresses[v], (lo, hi)))
        partners.append(tuple(overlap))
    return tuple(partners)


def exchanges_summary(lays: dict[int, Layout]) -> str:
    """The exchanges a set of layouts runs, for people: e.g. ``"vertical: tree x2, allgather;
    horizontal: ring x3 (groups of bands)"``."""

    def counted(names: list[str]) -> str:
        seen: dict[str, int] = {}
        for a in names:
            seen[a] = seen.get(a, 0) + 1
        return ", ".join(a if k == 1 else f"{a} x{k}" for a, k in seen.items())

    first: dict[int, Layout] = {}
    for lay in lays.values():
        first.setdefault(lay.column, lay)
    columns = [first[c] for c in sorted(first)]
    vertical = counted([lay.vertical if len(lay.members) > 1 else "none" for lay in columns])
    if len(columns) < 2:
        return f"vertical: {vertical}; horizontal: none"
    groups = {g for lay in lays.values() for g in lay.bands}
    if not groups:
        return f"vertical: {vertical}; horizontal: pairwise"
    ordered = sorted(groups, key=lambda g: g.rows[0])
    return f"vertical: {vertical}; horizontal: {counted([g.algorithm for g in ordered])} (groups of bands)"


def layout_layers(lay: Layout) -> Layers:
    """The network's :class:`~dask_rpm.nn.layers.Layers` a layout's worker trains."""
    n, m, l = lay.shape  # noqa: E741
    return Layers(n, lay.hidden or (m,), l)
