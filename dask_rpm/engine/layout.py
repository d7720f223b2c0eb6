"""From a :class:`~dask_rpm.partition.Plan` to what each worker needs to know of it.

Pure: no ``distributed``. The driver builds one :class:`Layout` per planned
worker and sends it with the worker's setup or remap task; the block loop
(:mod:`dask_rpm.engine.block`) needs nothing else to exchange with its peers.

Exchanges (docs/architecture.md)
--------------------------------
* **Vertical**, inside a column: the partial products ``f_i V_i^T`` of the
  column's workers are summed in column order (top to bottom). With
  ``allgather`` every member sends its partial to every other member and each
  sums them itself (one message hop); with ``leader`` the members send to the
  column's leader, which sums, computes the output deltas and sends them back
  (two hops, ``2 (k - 1)`` messages instead of ``k (k - 1)``). ``auto`` picks
  allgather up to ``rpm.engine.allgather-max`` members.
* **Horizontal**, across columns: every worker sends the rows of its
  weight-update sums that overlap each worker of another column to that
  worker (one message per overlapping pair, bands with the same pair merged),
  and sums what it receives in column order, so every holder of a row gets
  identical bits.
"""

from __future__ import annotations

from collections.abc import Sequence

from .. import config
from ..partition import Plan
from ..records import Layout, Peer

__all__ = ["layouts", "VERTICAL_ALGORITHMS"]

VERTICAL_ALGORITHMS = ("auto", "allgather", "leader")


def _vertical(k: int, algorithm: str | None) -> str:
    algorithm = str(config.get("engine.vertical", algorithm))
    if algorithm not in VERTICAL_ALGORITHMS:
        raise ValueError(
            f"rpm.engine.vertical={algorithm!r}; valid: {', '.join(VERTICAL_ALGORITHMS)}"
        )
    if algorithm == "auto":
        return "allgather" if k <= int(config.get("engine.allgather-max")) else "leader"
    return algorithm


def layouts(
    plan: Plan,
    addresses: Sequence[str],
    *,
    run: str,
    version: int,
    vertical: str | None = None,
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
    vertical : {"auto", "allgather", "leader"}, optional
        In-column exchange; default ``rpm.engine.vertical``.
    """
    n_cols = plan.n_columns
    rects = {w: plan.rectangle(w) for w in plan.planned_workers}
    columns = [[w for w in col if w in rects] for col in plan.columns]
    # top to bottom inside each column
    columns = [sorted(col, key=lambda w: rects[w].hidden[0]) for col in columns]
    out: dict[int, Layout] = {}
    for c, col in enumerate(columns):
        members = tuple(Peer(w, addresses[w], rects[w].hidden) for w in col)
        algorithm = _vertical(len(col), vertical)
        # The fastest member sums (it has the most to wait for otherwise); ties: lowest index.
        leader = max(col, key=lambda w: (plan.abilities[w], -w))
        for w in col:
            a, b = rects[w].hidden
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
                partners=tuple(partners),
                vertical=algorithm,
                leader=leader,
            )
    return out
