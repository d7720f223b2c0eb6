"""Running an exchange schedule: one worker's steps of each round and how it applies them.

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
copied, so every holder gets identical bits (:func:`fold`).

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
terms, equal to it to rounding (and identical on every holder). One rule picks the
algorithm, :func:`dask_rpm.comm.engine_algorithm`: the least predicted seconds for the
buffer and link (trees when latency dominates, ring or halving when bandwidth does), or
the one-hop exchange for few holders.

How the engine consumes it: :mod:`dask_rpm.engine.layout` names each
exchange's algorithm and holders, and the collectives (:mod:`dask_rpm.comm.collectives`)
build :func:`worker_steps` of their worker and run them round by round - send the
slices of ``step.sends`` (tagged with the exchange and the round), await
``step.receives``, then :func:`apply_received` (sum in position order, or
copy). Running every worker's steps through mailboxes gives exactly the bits of an
in-process run of the whole schedule (tested).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np

from .schedules import ALGORITHMS, Schedule, Transfer, build

__all__ = [
    "ALGORITHMS",
    "Transfer",
    "Schedule",
    "build",
    "fold",
    "WorkerStep",
    "worker_steps",
    "apply_received",
]


def fold(own_position: int, own: np.ndarray, parts: Sequence[tuple[int, np.ndarray]]) -> np.ndarray:
    """Own slice and received ones added left to right in the order of the holders' positions:
    the one summing rule of every schedule (each holder adds in the same order, so every holder
    gets the same bits)."""
    terms = sorted([(own_position, own.copy()), *parts], key=lambda x: x[0])
    acc = terms[0][1]
    for _, v in terms[1:]:
        acc = acc + v
    return acc


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
        buffer[lo:hi] = fold(position[worker], buffer[lo:hi], parts)
