"""Exchange schedules: who sends which part of a buffer to whom, round by round.

Pure module (numpy only). Both exchanges of an iteration are *allreduces*:
every holder contributes a buffer of the same size and must end with the sum
of all contributions, bit-identical on every holder (the replicas of a weight
row must never drift apart, and the column's output deltas must be the same
on every member):

* **vertical**, inside a column: the ``l x s_c`` partial products of the
  column's workers (the engine's ``u``, raveled);
* **horizontal**, across columns: for each group of bands with the same
  holders (one worker per column), the weight-update rows of those bands,
  packed as ``[dW[rows].ravel(), dV[:, rows].ravel()]``, ``(n + l) x rows``
  elements.

A :class:`Schedule` lists rounds of :class:`Transfer` (``src`` sends
``buffer[lo:hi]`` to ``dst``, which either adds it or copies it). Everything is
deterministic: the order in which a receiver adds is fixed by the holders'
positions (column order), each element's final value is computed by exactly
one holder (or by every holder in the same order, for ``allgather``) and then
copied, so every holder gets identical bits. :func:`execute` runs a schedule
in-process on numpy arrays; it is the reference an engine implementation
must match, and what the tests run.

Algorithms (``q`` holders, ``B`` bytes; costs in :func:`dask_rpm.comm.collective_seconds`):

============  ===============================  ======================================
name          rounds                           sum order / when it wins
============  ===============================  ======================================
``allgather`` 1: everyone to everyone          column order on every holder; the
                                               engine's vertical for small columns
``gather``    2: to a leader, back             column order; the engine's ``leader``
``direct``    2: share ``j`` to holder ``j``,  column order (exact); few holders,
              then back to everyone            big buffers
``ring``      ``2 (q - 1)`` of ``B / q``       ring order; bandwidth-bound, ``q`` small
``tree``      ``2 ceil(log2 q)`` of ``B``      binomial tree; latency-bound
``halving``   ``2 log2 q`` (+2) of ``B / 2^r`` recursive halving/doubling (Rabenseifner):
                                               latency ``log q``, bandwidth ``2 B``
============  ===============================  ======================================

``direct``, ``gather`` and ``allgather`` give exactly the column-order sum;
``ring``, ``tree`` and ``halving`` give a fixed other grouping of the same
terms, equal to it to rounding (and identical on every holder). The
selection (:func:`choose`) takes the algorithm with the least predicted
seconds for the buffer and link: trees when latency dominates, ring or
halving when bandwidth does.

How the engine consumes it: :mod:`dask_rpm.engine.layout` names each
exchange's algorithm and holders (chosen by :func:`dask_rpm.comm.engine_algorithm`,
not :func:`choose`), and the block loop (:mod:`dask_rpm.engine.block`) builds
:func:`worker_steps` of its worker and runs them round by round - send the
slices of ``step.sends`` (tagged with the exchange and the round), await
``step.receives``, then :func:`apply_received` (sum in position order, or
copy). Running every worker's steps through mailboxes gives exactly
:func:`execute`'s bits (tested). :func:`vertical_schedule` and
:func:`horizontal_schedules` build the schedules of a whole plan at once,
for inspection and the tests.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from .collectives import best_collective, schedule_seconds
from .network import Interconnect, LinkClass, network_from_config
from .schedules import ALGORITHMS, Schedule, Transfer, build

if TYPE_CHECKING:  # pragma: no cover
    from ..plan.partition import Plan

__all__ = [
    "ALGORITHMS",
    "Transfer",
    "Schedule",
    "BandExchange",
    "build",
    "choose",
    "execute",
    "schedule_seconds",
    "vertical_schedule",
    "horizontal_schedules",
    "WorkerStep",
    "worker_steps",
    "apply_received",
]


def _fold(
    own_position: int, own: np.ndarray, parts: Sequence[tuple[int, np.ndarray]]
) -> np.ndarray:
    """Own slice and received ones added left to right in the order of the holders' positions."""
    terms = sorted([(own_position, own.copy()), *parts], key=lambda x: x[0])
    acc = terms[0][1]
    for _, v in terms[1:]:
        acc = acc + v
    return acc


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
        buffers[dst][lo:hi] = _fold(position[dst], buffers[dst][lo:hi], parts)


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


class WorkerStep(NamedTuple):
    """One worker's part of one round: what it sends, then what it must receive and apply.

    ``receives`` are in the order :func:`apply_received` applies them (the
    senders' positions); a worker may run its sends of round ``r`` as soon
    as it has applied everything of round ``r - 1``.
    """

    round: int
    sends: tuple[Transfer, ...]
    receives: tuple[Transfer, ...]


def worker_steps(schedule: Schedule, worker: int) -> list[WorkerStep]:
    """The rounds in which ``worker`` sends or receives: what an engine layout keeps for one worker."""
    position = {w: i for i, w in enumerate(schedule.holders)}
    if worker not in position:
        raise ValueError(
            f"worker {worker} is not a holder of this schedule ({list(schedule.holders)})"
        )
    out = []
    for r, transfers in enumerate(schedule.rounds):
        sends = tuple(t for t in transfers if t.src == worker)
        recv = tuple(
            sorted((t for t in transfers if t.dst == worker), key=lambda t: (t.lo, position[t.src]))
        )
        if sends or recv:
            out.append(WorkerStep(r, sends, recv))
    return out


def apply_received(
    buffer: np.ndarray,
    worker: int,
    step: WorkerStep,
    payloads: Mapping[Transfer, np.ndarray],
    holders: Sequence[int],
) -> None:
    """Apply one step's received payloads to ``worker``'s buffer in place (same rule as :func:`apply_round`).

    ``payloads`` maps each of ``step.receives`` to the slice its sender sent
    (taken before the sender applied anything of that round).
    """
    position = {w: i for i, w in enumerate(holders)}
    sums: dict[tuple[int, int], list[tuple[int, np.ndarray]]] = {}
    for t in step.receives:
        if t.op == "copy":
            buffer[t.lo : t.hi] = payloads[t]
        else:
            sums.setdefault((t.lo, t.hi), []).append((position[t.src], payloads[t]))
    for (lo, hi), parts in sums.items():
        buffer[lo:hi] = _fold(position[worker], buffer[lo:hi], parts)


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
