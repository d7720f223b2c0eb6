"""Allreduce schedules as data: who sends which slice of a buffer to whom, round by round.

Pure (no numpy needed). :mod:`dask_rpm.comm.exchange` runs and chooses them and
documents the algorithms; the cost model (:mod:`dask_rpm.cost.predict`)
prices them round by round when workers share hosts. Here because both
need them and the exchange module sits above the cost model.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

__all__ = ["ALGORITHMS", "Transfer", "Schedule", "build"]

ALGORITHMS = ("allgather", "gather", "direct", "ring", "tree", "halving")


class Transfer(NamedTuple):
    """``src`` sends ``buffer[lo:hi]`` to ``dst``; ``op`` is ``"sum"`` (add) or ``"copy"`` (overwrite)."""

    src: int
    dst: int
    lo: int
    hi: int
    op: str


class Schedule(NamedTuple):
    """An allreduce among ``holders`` (worker ids, in column order) of ``size`` elements.

    ``rounds`` run one after another; the transfers of a round are concurrent
    and carry the sender's buffer as it was at the start of the round.
    """

    algorithm: str
    holders: tuple[int, ...]
    size: int
    rounds: tuple[tuple[Transfer, ...], ...]

    def messages(self) -> int:
        return sum(len(r) for r in self.rounds)


def _chunks(size: int, parts: int) -> list[tuple[int, int]]:
    edges = [size * j // parts for j in range(parts + 1)]
    return [(edges[j], edges[j + 1]) for j in range(parts)]


def _allgather(h: Sequence[int], size: int) -> list[list[Transfer]]:
    return [[Transfer(a, b, 0, size, "sum") for a in h for b in h if a != b]]


def _gather(h: Sequence[int], size: int, leader: int) -> list[list[Transfer]]:
    root = h[leader]
    return [
        [Transfer(a, root, 0, size, "sum") for a in h if a != root],
        [Transfer(root, b, 0, size, "copy") for b in h if b != root],
    ]


def _direct(h: Sequence[int], size: int) -> list[list[Transfer]]:
    ch = _chunks(size, len(h))
    first = [
        Transfer(a, h[j], lo, hi, "sum")
        for j, (lo, hi) in enumerate(ch)
        if hi > lo
        for a in h
        if a != h[j]
    ]
    second = [
        Transfer(h[j], b, lo, hi, "copy")
        for j, (lo, hi) in enumerate(ch)
        if hi > lo
        for b in h
        if b != h[j]
    ]
    return [first, second]


def _ring(h: Sequence[int], size: int) -> list[list[Transfer]]:
    q = len(h)
    ch = _chunks(size, q)
    rounds = []
    for t in range(q - 1):  # reduce-scatter: holder i ends owning chunk (i + 1) mod q
        rounds.append(
            [
                Transfer(h[i], h[(i + 1) % q], *ch[(i - t) % q], "sum")
                for i in range(q)
                if ch[(i - t) % q][1] > ch[(i - t) % q][0]
            ]
        )
    for t in range(q - 1):  # all-gather
        rounds.append(
            [
                Transfer(h[i], h[(i + 1) % q], *ch[(i + 1 - t) % q], "copy")
                for i in range(q)
                if ch[(i + 1 - t) % q][1] > ch[(i + 1 - t) % q][0]
            ]
        )
    return rounds


def _tree(h: Sequence[int], size: int) -> list[list[Transfer]]:
    q = len(h)
    up, span = [], 1
    while span < q:  # binomial reduce to position 0
        up.append([Transfer(h[p], h[p - span], 0, size, "sum") for p in range(span, q, 2 * span)])
        span *= 2
    down = [[Transfer(t.dst, t.src, 0, size, "copy") for t in r] for r in reversed(up)]
    return up + down


def _halving(h: Sequence[int], size: int) -> list[list[Transfer]]:
    q = len(h)
    p = 1 << (q.bit_length() - 1)
    rounds: list[list[Transfer]] = []
    extra = list(range(p, q))
    if extra:  # fold the q - p extra holders into the first ones
        rounds.append([Transfer(h[e], h[e - p], 0, size, "sum") for e in extra])
    seg = {i: (0, size) for i in range(p)}
    masks = []
    mask = p >> 1
    while mask:  # recursive halving: reduce-scatter
        masks.append(mask)
        r = []
        new = {}
        for i in range(p):
            lo, hi = seg[i]
            mid = lo + (hi - lo) // 2
            keep, give = ((lo, mid), (mid, hi)) if not i & mask else ((mid, hi), (lo, mid))
            new[i] = keep
            if give[1] > give[0]:
                r.append(Transfer(h[i], h[i ^ mask], give[0], give[1], "sum"))
        seg = new
        rounds.append(r)
        mask >>= 1
    for mask in reversed(masks):  # recursive doubling: all-gather
        r = []
        new = {}
        for i in range(p):
            lo, hi = seg[i]
            j = i ^ mask
            if hi > lo:
                r.append(Transfer(h[i], h[j], lo, hi, "copy"))
            olo, ohi = seg[j]
            new[i] = (min(lo, olo), max(hi, ohi))
        seg = new
        rounds.append(r)
    if extra:
        rounds.append([Transfer(h[e - p], h[e], 0, size, "copy") for e in extra])
    return rounds


def build(algorithm: str, holders: Sequence[int], size: int, *, leader: int = 0) -> Schedule:
    """The schedule of ``algorithm`` among ``holders`` (column order) for a buffer of ``size`` elements.

    ``leader`` is the position (in ``holders``) of the ``gather`` root.
    """
    h = tuple(int(w) for w in holders)
    if len(set(h)) != len(h) or not h:
        raise ValueError(f"holders {list(h)} must be distinct worker ids, at least one")
    if size < 0:
        raise ValueError(f"size={size} must be a non-negative number of elements")
    if algorithm not in ALGORITHMS:
        raise ValueError(
            f"unknown exchange algorithm {algorithm!r}; valid: {', '.join(ALGORITHMS)}"
        )
    if len(h) == 1 or size == 0:
        return Schedule(algorithm, h, size, ())
    if algorithm == "allgather":
        rounds = _allgather(h, size)
    elif algorithm == "gather":
        if not 0 <= leader < len(h):
            raise ValueError(f"leader={leader} is not a position in 0..{len(h) - 1}")
        rounds = _gather(h, size, leader)
    elif algorithm == "direct":
        rounds = _direct(h, size)
    elif algorithm == "ring":
        rounds = _ring(h, size)
    elif algorithm == "tree":
        rounds = _tree(h, size)
    else:
        rounds = _halving(h, size)
    return Schedule(algorithm, h, size, tuple(tuple(r) for r in rounds if r))
