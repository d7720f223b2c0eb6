"""Buddy copies, the decisions: who keeps whose copy, how often, and where a recovery's rows come from.

Every ``R`` iterations each planned worker copies its rows of every parameter and their
optimizer state at an iteration boundary (every worker at the same iteration ``k``: the block
loop takes the copy before iteration ``k``'s forward pass) and sends it, without waiting, to
its *buddy*, a worker on another host where there is one. The buddy keeps the latest complete
copy of each sender; the sender keeps its own copies from the driver's ``keep_from`` on. When
a worker is lost, its rows of iteration ``k`` are at its buddy, every survivor's rows of ``k``
are in its own copy, so training goes back to ``k`` and goes on without a restart
(:func:`restore_point`). The worker's side is :mod:`dask_rpm.engine.copies`; the driver's
plumbing is in :mod:`dask_rpm.engine.buddy_fields` and :mod:`dask_rpm.engine.recovery`.

Everything here is pure (no ``distributed``): the decisions are tested without a cluster.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ..nn.data import DataError

__all__ = [
    "ResilienceSettings",
    "choose_buddies",
    "auto_every",
    "Holding",
    "Segment",
    "Restore",
    "restore_point",
    "pieces_for",
    "rows_source",
    "keep_from",
    "BuddyBook",
]

#: Preference among the holders of the same rows of the same iteration: the live shard, a
#: worker's own copy, a copy kept for a buddy (all hold the same bits; the live shard and the
#: own copy are already where they were computed).
KINDS = ("current", "own", "buddy")


@dataclass(frozen=True)
class ResilienceSettings:
    """The ``rpm.resilience`` section, read once when a run starts.

    ``every`` is ``R`` (iterations between copies), or None for ``auto``: from the measured
    copy time and iteration time, so that copies cost at most ``target_overhead`` of the
    run, and at most ``max_every`` iterations apart.
    """

    buddies: bool = True
    every: int | None = None
    target_overhead: float = 0.03
    max_every: int = 50

    @classmethod
    def of(cls, section: Mapping[str, Any]) -> ResilienceSettings:
        """From ``rpm.resilience`` (:func:`dask_rpm.config.section`); bad values raise
        :class:`~dask_rpm.nn.data.DataError` naming the key."""
        every = section["every"]
        if every != "auto" and (isinstance(every, bool) or not isinstance(every, int) or every < 1):
            raise DataError(
                f"rpm.resilience.every={every!r}; give the iterations between buddy copies (an "
                f"integer >= 1) or 'auto'"
            )
        target = section["target_overhead"]
        if isinstance(target, bool) or not isinstance(target, (int, float)) or not 0 < target < 1:
            raise DataError(
                f"rpm.resilience.target-overhead={target!r}; give a fraction of the run's time "
                f"between 0 and 1 (e.g. 0.03)"
            )
        most = section["max_every"]
        if isinstance(most, bool) or not isinstance(most, int) or most < 1:
            raise DataError(f"rpm.resilience.max-every={most!r}; it must be an integer >= 1")
        return cls(
            buddies=bool(section["buddies"]),
            every=None if every == "auto" else int(every),
            target_overhead=float(target),
            max_every=int(most),
        )


def choose_buddies(
    workers: Sequence[str], hosts: Mapping[str, str], spare: Sequence[str] = ()
) -> dict[str, str]:
    """Each worker's buddy: the next worker of a ring that alternates hosts, on another host where
    there is one.

    ``hosts`` maps an address to its host (an address without one is a host of its own).
    ``spare`` are live workers the plan leaves idle: they train nothing, so they keep copies
    too. A worker whose ring has no other host takes a spare on another host; a plan of one
    worker takes a spare (on another host where there is one), so that a lone worker's loss
    costs a few iterations as well. No other worker at all: no buddy (an empty dict). The
    ring takes the hosts' workers in turn (``a1 b1 a2 b2 a3``), so the copies spread over the
    hosts instead of piling on one; the spares are taken in turn as well.
    """
    spare = [s for s in spare if s not in set(workers)]
    by_host: dict[str, list[str]] = {}
    for w in workers:
        by_host.setdefault(hosts.get(w, w), []).append(w)
    queues = list(by_host.values())
    ring: list[str] = []
    while any(queues):
        for q in queues:
            if q:
                ring.append(q.pop(0))
    n, out, turn = len(ring), {}, 0
    for i, w in enumerate(ring):
        host = hosts.get(w, w)
        after = [ring[(i + j) % n] for j in range(1, n)]
        spares = spare[turn:] + spare[:turn]  # each worker starts at the next spare
        elsewhere = [v for v in (*after, *spares) if hosts.get(v, v) != host]
        anywhere = elsewhere or after or spares
        if not anywhere:
            continue
        pick = anywhere[0]
        if pick in spare:
            turn = (spare.index(pick) + 1) % len(spare)
        out[w] = pick
    return out


def auto_every(
    iteration_seconds: float | None, copy_seconds: float | None, settings: ResilienceSettings
) -> int:
    """``R``: the iterations between copies.

    ``rpm.resilience.every`` when set; else the smallest ``R`` whose copies cost at most
    ``target_overhead`` of the iterations between them, at most ``max_every``; ``max_every``
    while nothing is measured yet. ``copy_seconds`` is what one copy costs: the snapshot on the
    training path plus the send's wall time (serialised, sent and kept by the buddy; the send
    runs beside training, but on a host whose cores are all busy training it takes their time,
    so all of it is charged).
    """
    if settings.every is not None:
        return settings.every
    if not iteration_seconds or not copy_seconds or not math.isfinite(iteration_seconds):
        return settings.max_every
    need = math.ceil(copy_seconds / (settings.target_overhead * iteration_seconds) - 1e-9)
    return int(min(settings.max_every, max(1, need)))


class Holding(NamedTuple):
    """Rows some live worker holds of one iteration: its live shard (``current``), a copy it
    took of its own rows (``own``) or one it keeps for its buddy (``buddy``)."""

    iteration: int
    rows: tuple[int, int]
    holder: str
    kind: str


class Segment(NamedTuple):
    """Rows ``[a, b)`` of a restore point and the holdings that have them, preferred first."""

    a: int
    b: int
    holders: tuple[Holding, ...]


class Restore(NamedTuple):
    """Where training can go back to: iteration ``iteration``, every row held by some live worker."""

    iteration: int
    segments: tuple[Segment, ...]

    @property
    def kinds(self) -> set[str]:
        return {s.holders[0].kind for s in self.segments}


def _rank(h: Holding) -> tuple[int, str]:
    return (KINDS.index(h.kind), h.holder)


def _cover(held: Sequence[Holding], m: int) -> tuple[Segment, ...] | None:
    """The rows ``[0, m)`` cut where any holding starts or ends, each with its holders; None when
    some rows have none."""
    cuts = sorted({0, m, *(c for h in held for c in h.rows if 0 < c < m)})
    out = []
    for a, b in zip(cuts, cuts[1:]):
        holders = tuple(sorted((h for h in held if h.rows[0] <= a and b <= h.rows[1]), key=_rank))
        if not holders:
            return None
        out.append(Segment(a, b, holders))
    return tuple(out)


def restore_point(
    holdings: Iterable[Holding], m: int, floor: int = 0, ceiling: int | None = None
) -> Restore | None:
    """The latest iteration in ``[floor, ceiling]`` of which the live workers hold every one of
    the ``m`` rows.

    ``floor`` is the earliest iteration training may go back to (a learning rate changed by an
    end-of-epoch rule after it: :attr:`dask_rpm.engine.driver.Driver.floor`); ``ceiling`` the
    latest it may go forward to (the iterations before it are recorded: their errors are in the
    history). None when no iteration is complete (a worker and its buddy lost together): the
    caller falls back to a checkpoint.
    """
    top = math.inf if ceiling is None else ceiling
    by_iteration: dict[int, list[Holding]] = {}
    for h in holdings:
        if floor <= h.iteration <= top and h.rows[0] < h.rows[1]:
            by_iteration.setdefault(int(h.iteration), []).append(h)
    for k in sorted(by_iteration, reverse=True):
        segments = _cover(by_iteration[k], m)
        if segments is not None:
            return Restore(k, segments)
    return None


def pieces_for(
    point: Restore, rows: tuple[int, int], target: str
) -> list[tuple[int, int, str, str]]:
    """``(a, b, holder, kind)`` covering ``rows`` of ``point`` in order, for the worker at address
    ``target``: rows it holds itself come from itself (no message), others from the preferred
    holder; adjacent rows of one holding are one piece."""
    out: list[tuple[int, int, str, str]] = []
    for seg in point.segments:
        a, b = max(seg.a, rows[0]), min(seg.b, rows[1])
        if a >= b:
            continue
        h = next((h for h in seg.holders if h.holder == target), seg.holders[0])
        last = out[-1] if out else None
        if last is not None and last[1] == a and last[2:] == (h.holder, h.kind):
            out[-1] = (last[0], b, h.holder, h.kind)
        else:
            out.append((a, b, h.holder, h.kind))
    return out


def rows_source(point: Restore, rows: tuple[int, int]) -> str:
    """Where a lost worker's ``rows`` come from in ``point``: ``"buddy"`` when a copy kept for it
    supplies any of them, else ``"other column"`` (another worker's live shard or own copy)."""
    kinds = {s.holders[0].kind for s in point.segments if s.a < rows[1] and rows[0] < s.b}
    return "buddy" if "buddy" in kinds else "other column"


def keep_from(acked: Mapping[str, int], workers: Iterable[str]) -> int:
    """The oldest own copy a worker must keep: the oldest latest copy one of ``workers``' buddies
    holds (a recovery may go back to it, and then needs every survivor's own copy of it)."""
    got = [acked.get(w, -1) for w in workers]
    return max(min(got), 0) if got else 0


@dataclass
class BuddyBook:
    """The driver's record of buddy copies between blocks: who keeps whose copy, ``R``, what the
    workers reported (measured copy times, memory, counts) and what they may drop.

    Pure: the driver feeds it the plan's workers, their hosts and the block results' reports
    (:class:`~dask_rpm.engine.records.CopyReport`).
    """

    settings: ResilienceSettings
    every: int = 0
    version: int = -1  # the plan version ``buddies`` were chosen for
    buddies: dict[str, str] = field(default_factory=dict)
    acked: dict[str, int] = field(default_factory=dict)
    copy_seconds: dict[str, float] = field(default_factory=dict)
    memory: dict[str, int] = field(default_factory=dict)  # the most copy bytes each held
    counts: dict[str, tuple[int, int, int]] = field(default_factory=dict)  # taken, sent, skipped
    chosen: list[int] = field(default_factory=list)  # every R used, in order

    def assign(
        self,
        workers: Sequence[str],
        hosts: Mapping[str, str],
        version: int,
        spare: Sequence[str] = (),
    ) -> None:
        """Buddies for the plan ``version`` of ``workers`` (planned, in plan order); ``spare``: the
        live workers it leaves idle (:func:`choose_buddies`)."""
        self.buddies = choose_buddies(list(workers), hosts, spare)
        self.version = version
        # workers that left the plan report no more: their copies no longer bound keep_from
        self.acked = {w: k for w, k in self.acked.items() if w in self.buddies}

    def block(
        self, workers: Sequence[str], iteration_seconds: float | None
    ) -> tuple[int, tuple[str | None, ...], int]:
        """``(R, buddy of each worker, keep_from)`` for the next block; ``workers`` is the driver's
        address list (its indices are the workers'). ``R`` is 0 without buddies."""
        planned = [w for w in workers if w in self.buddies]
        if not planned:
            return 0, (), 0
        measured = max((self.copy_seconds.get(w, 0.0) for w in planned), default=0.0)
        self.every = auto_every(iteration_seconds, measured or None, self.settings)
        if not self.chosen or self.chosen[-1] != self.every:
            self.chosen.append(self.every)
        buddies = tuple(self.buddies.get(w) for w in workers)
        return self.every, buddies, keep_from(self.acked, planned)

    def observe(self, address: str, report: Any) -> None:
        """A worker's :class:`~dask_rpm.engine.records.CopyReport` at the end of a block."""
        if report is None:
            return
        if report.acked >= 0:
            self.acked[address] = max(self.acked.get(address, -1), report.acked)
        if report.copy_seconds > 0 and report.send_seconds > 0:
            self.copy_seconds[address] = report.copy_seconds + report.send_seconds
        self.memory[address] = max(self.memory.get(address, 0), report.nbytes)
        self.counts[address] = (report.taken, report.sent, report.skipped)

    def held(self, peaks: Mapping[str, int]) -> None:
        """The most copy bytes each worker held at any time (idle buddies included: they report
        at the end of the run, not with a block's results)."""
        for address, nbytes in peaks.items():
            self.memory[address] = max(self.memory.get(address, 0), int(nbytes))

    def rolled_back(self, iteration: int) -> None:
        """Training went back to ``iteration``: the workers dropped their later copies."""
        self.acked = {w: min(k, iteration) for w, k in self.acked.items()}

    def stats(self) -> dict[str, Any]:
        """``FitResult.stats["buddies"]``."""
        taken, sent, skipped = (sum(c[i] for c in self.counts.values()) for i in range(3))
        return {
            "on": True,
            "every": self.every,
            "every_chosen": list(self.chosen),
            "buddies": dict(self.buddies),
            "memory": dict(self.memory),
            "copies_taken": taken,
            "copies_sent": sent,
            "sends_skipped": skipped,
            "copy_seconds": dict(self.copy_seconds),
        }
