"""Whole-plan exchange schedules run in-process: the reference the engine's collectives must
match bit for bit, and the algorithm chosen by the cost model for a whole plan.

Test code: the engine runs one worker's steps of a schedule (``dask_rpm.comm.exchange``);
these run every holder's at once on numpy arrays.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np

from dask_rpm.comm import Interconnect, LinkClass, best_collective, network_from_config
from dask_rpm.comm.exchange import Schedule, Transfer, build, fold
from dask_rpm.plan.partition import Plan


def apply_round(
    buffers: dict[int, np.ndarray], transfers: Sequence[Transfer], position: Mapping[int, int]
) -> None:
    """Apply one round in place: payloads are the senders' slices at the round's start.

    ``"sum"``: for each receiver and range, the receiver's own slice and the
    received ones are added left to right in the order of their holders'
    positions. ``"copy"``: the receiver takes the slice as sent.
    """
    payload = [buffers[t.src][t.lo : t.hi].copy() for t in transfers]
    sums: dict[tuple[int, int, int], list[tuple[int, np.ndarray]]] = {}
    for t, data in zip(transfers, payload):
        if t.op == "copy":
            buffers[t.dst][t.lo : t.hi] = data
        elif t.op == "sum":
            sums.setdefault((t.dst, t.lo, t.hi), []).append((position[t.src], data))
        else:
            raise ValueError(f"transfer op {t.op!r}; valid: sum, copy")
    for (dst, lo, hi), parts in sums.items():
        buffers[dst][lo:hi] = fold(position[dst], buffers[dst][lo:hi], parts)


def execute(schedule: Schedule, contributions: Mapping[int, np.ndarray]) -> dict[int, np.ndarray]:
    """Run ``schedule`` in-process: every holder's buffer after the exchange (the inputs are not changed)."""
    bufs = {w: np.array(contributions[w], copy=True).ravel() for w in schedule.holders}
    for w, b in bufs.items():
        if b.size != schedule.size:
            raise ValueError(
                f"holder {w} contributes {b.size} elements; the schedule is for {schedule.size}"
            )
    position = {w: i for i, w in enumerate(schedule.holders)}
    for r in schedule.rounds:
        apply_round(bufs, r, position)
    return bufs


def choose(
    q: int, nbytes: float, link: LinkClass, overhead: float = 0.0, reduce: float = 0.0
) -> str:
    """The scalable algorithm (``tree``, ``halving``, ``ring``, ``direct``) predicted fastest.

    Deterministic: every worker computing it from the same plan and network
    gets the same answer (ties go to the order listed).
    """
    return best_collective(q, nbytes, link, overhead, reduce)[0]


def vertical_schedule(
    plan: Plan, column: int, network: Interconnect | None = None, algorithm: str | None = None
) -> Schedule:
    """The in-column allreduce of column ``column``'s ``l x s_c`` partials (top to bottom order).

    ``algorithm=None`` chooses by the model (:func:`choose`) with ``network``
    (default: ``rpm.cost.*``).
    """
    net = network_from_config(network)
    col = sorted(plan.columns[column], key=lambda w: plan.rectangle(w).hidden[0])
    s0, s1 = plan.column_samples(column)
    size = plan.l * (s1 - s0)
    if algorithm is None:
        algorithm = choose(len(col), size * net.itemsize, net.worst_link(col), net.overhead)
    return build(algorithm, col, size)


class BandExchange(NamedTuple):
    """The horizontal allreduce of the bands held by ``holders`` (one per column, left to right).

    ``rows`` are the merged hidden-unit ranges; the buffer packs, for those
    rows in order, ``dW[rows]`` (rows x n) then ``dV[:, rows]`` (l x rows).
    """

    holders: tuple[int, ...]
    rows: tuple[tuple[int, int], ...]
    schedule: Schedule


def horizontal_schedules(
    plan: Plan, network: Interconnect | None = None, algorithm: str | None = None
) -> list[BandExchange]:
    """One allreduce per group of bands with the same holders, in band order.

    Bands with the same holder set are merged into one buffer (one message
    per transfer instead of one per band). ``algorithm=None`` chooses per
    group by the model.
    """
    net = network_from_config(network)
    if plan.n_columns == 1:
        return []
    out = []
    per_row = plan.n + plan.l
    for holders, rows in plan.band_groups():
        size = per_row * sum(b - a for a, b in rows)
        alg = algorithm or choose(
            len(holders), size * net.itemsize, net.worst_link(holders), net.overhead
        )
        out.append(BandExchange(holders, tuple(rows), build(alg, holders, size)))
    return out
