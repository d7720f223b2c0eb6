"""Messages, rounds and collective exchanges in seconds (the alpha-beta model of one exchange)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

from .. import config
from .network import Interconnect, LinkClass, network_from_config
from .schedules import Schedule

__all__ = [
    "HORIZONTAL_MODES",
    "SCALABLE",
    "VERTICAL_MODES",
    "Message",
    "ENGINE_HORIZONTAL",
    "ENGINE_VERTICAL",
    "EngineRule",
    "best_collective",
    "collective_seconds",
    "engine_algorithm",
    "engine_horizontal",
    "round_seconds",
    "schedule_seconds",
]


class Message(NamedTuple):
    """One point-to-point message of a round: ``nbytes`` bytes from ``src`` to ``dst``.

    ``reduce``: the receiver adds the payload into its buffer (charged ``Interconnect.reduce`` per element).
    """

    src: int
    dst: int
    nbytes: float
    reduce: bool = False


def round_seconds(
    messages: Sequence[Message], network: Interconnect
) -> tuple[float, dict[int, float]]:
    """Seconds of one round of concurrent messages, and each worker's own part.

    A worker's part is ``latency + overhead x (sent + received) + max(bytes out / bw, bytes in / bw)``
    (links are full duplex; latency of its slowest link); the round lasts until
    the slowest worker and every host are done, a host needing
    ``overhead x message ends on it / host_cores + bytes touching it / host_bandwidth``.
    """
    per: dict[int, list[float]] = {}
    host_load: dict[Any, float] = {}
    o = network.overhead
    for msg in messages:
        link = network.link(msg.src, msg.dst)
        t = msg.nbytes / link.bandwidth
        for w, slot in ((msg.src, 1), (msg.dst, 2)):
            p = per.setdefault(w, [0.0, 0.0, 0.0, 0.0])  # latency, cpu, out, in
            p[0] = max(p[0], link.latency)
            p[1] += o
            p[slot + 1] += t
        if msg.reduce:
            add = msg.nbytes / network.itemsize * network.reduce
            per[msg.dst][1] += add
            if network.hosts is not None:  # the additions also need the host's cores
                h = network.hosts[msg.dst]
                host_load[h] = host_load.get(h, 0.0) + add / network.host_cores
        if network.hosts is not None:
            hs, hd = network.hosts[msg.src], network.hosts[msg.dst]
            for h in {hs, hd}:
                ends = (hs == h) + (hd == h)
                host_load[h] = (
                    host_load.get(h, 0.0)
                    + ends * o / network.host_cores
                    + msg.nbytes / network.host_bandwidth
                )
    own = {
        w: p[0] + p[1] + (max(p[2], p[3]) if network.duplex else p[2] + p[3])
        for w, p in per.items()
    }
    worst = max(own.values(), default=0.0)
    if host_load:
        worst = max(worst, network.latency + max(host_load.values()))
    return worst, own


def schedule_seconds(schedule: Schedule, network: Interconnect) -> float:
    """Predicted seconds of a schedule: :func:`round_seconds` summed over its rounds.

    With ``network.hosts`` every round also waits for each host's cores and
    bandwidth, so the many small messages of a ring or direct exchange among
    workers sharing a host cost its CPU; on links of their own it equals
    :func:`collective_seconds` (tested).
    """
    isz = network.itemsize
    return float(
        sum(
            round_seconds(
                [Message(t.src, t.dst, (t.hi - t.lo) * isz, t.op == "sum") for t in r], network
            )[0]
            for r in schedule.rounds
        )
    )


# ----------------------------------------------------------- exchange costs
#: In-column algorithms the model knows: the engine's today, and the scalable ones of dask_rpm.comm.exchange.
VERTICAL_MODES = (
    "engine",
    "allgather",
    "leader",
    "gather",
    "tree",
    "halving",
    "ring",
    "direct",
    "best",
)
#: Across-column algorithms: the engine's pairwise messages, the paper's serialised bands, per-band schedules.
HORIZONTAL_MODES = ("engine", "pairwise", "bands", "tree", "halving", "ring", "direct", "best")
#: The scalable collectives "best" chooses from (dask_rpm.comm.exchange builds their schedules).
SCALABLE = ("tree", "halving", "ring", "direct")


def collective_seconds(
    algorithm: str,
    q: int,
    nbytes: float,
    link: LinkClass,
    overhead: float = 0.0,
    reduce: float = 0.0,
) -> float:
    """Seconds of a sum-and-share (allreduce) of ``nbytes`` among ``q`` holders, closed form.

    Matches :func:`round_seconds` summed over the rounds of the schedules of
    :mod:`dask_rpm.comm.exchange` on uniform links (tested):

    * ``tree``: binomial reduce then binomial broadcast, ``2 ceil(log2 q)`` rounds of the whole buffer;
    * ``halving``: recursive halving reduce-scatter + doubling all-gather (Rabenseifner);
      ``2 log2 p`` rounds for the largest power of two ``p <= q`` plus 2 rounds folding the rest in and out;
    * ``ring``: ring reduce-scatter + all-gather, ``2 (q - 1)`` rounds of ``1/q`` of the buffer;
    * ``direct``: every holder sends each other holder the share it owns (2 rounds, ``q - 1`` messages each);
    * ``allgather``: everyone sends everything to everyone (the engine's small-column vertical);
    * ``leader`` / ``gather``: one holder gathers and sends the sum back (the engine's large-column vertical).

    ``reduce`` is the seconds to add the whole buffer once at a receiver
    (``elements x Interconnect.reduce``); each algorithm's critical path adds
    ``(1 - 1/q)`` (ring, halving, direct), ``ceil(log2 q)`` (tree) or ``q - 1``
    (allgather, leader) buffers.
    """
    if q <= 1:
        return 0.0
    a, b, o, r = link.latency, nbytes / link.bandwidth, overhead, reduce
    if algorithm == "tree":
        return 2 * math.ceil(math.log2(q)) * (a + o + b) + math.ceil(math.log2(q)) * r
    if algorithm == "halving":
        p = 1 << (q.bit_length() - 1)
        lg = p.bit_length() - 1
        t = 2 * lg * (a + 2 * o) + 2 * (1 - 1 / p) * b + (1 - 1 / p) * r
        if q > p:  # the q - p extra holders hand their buffer in first and get the result last
            t += 2 * (a + o + b) + r
        return t
    if algorithm == "ring":
        return 2 * (q - 1) * (a + 2 * o + b / q) + (q - 1) * r / q
    if algorithm == "direct":
        return 2 * (a + 2 * (q - 1) * o + (q - 1) * b / q) + (q - 1) * r / q
    if algorithm == "allgather":
        return a + 2 * (q - 1) * o + (q - 1) * b + (q - 1) * r
    if algorithm in ("leader", "gather"):
        return 2 * (a + (q - 1) * (o + b)) + (q - 1) * r
    raise ValueError(
        f"unknown exchange algorithm {algorithm!r}; valid: tree, halving, ring, direct, "
        f"allgather, leader"
    )


def best_collective(
    q: int, nbytes: float, link: LinkClass, overhead: float = 0.0, reduce: float = 0.0
) -> tuple[str, float]:
    """The scalable algorithm with the least :func:`collective_seconds` (ties: the order of ``SCALABLE``)."""
    return min(
        ((alg, collective_seconds(alg, q, nbytes, link, overhead, reduce)) for alg in SCALABLE),
        key=lambda x: x[1],
    )


#: What ``rpm.engine.vertical`` accepts: ``auto``, the one-hop ``allgather``, ``leader`` and the scalable ones.
ENGINE_VERTICAL = ("auto", "allgather", "leader", *SCALABLE)
#: What ``rpm.engine.horizontal`` accepts: ``auto``, the one-hop ``pairwise`` messages and the scalable ones.
ENGINE_HORIZONTAL = ("auto", "pairwise", *SCALABLE)


def engine_algorithm(
    kind: str,
    setting: str,
    q: int,
    nbytes: float,
    link: LinkClass,
    overhead: float,
    one_hop_max: int,
) -> str:
    """The exchange the engine runs among ``q`` holders of ``nbytes``: one rule for engine and model.

    ``kind`` is ``"vertical"`` (in a column) or ``"horizontal"`` (a group of
    bands across columns); ``setting`` is ``rpm.engine.vertical`` or
    ``rpm.engine.horizontal``. A name is taken as it is. ``auto`` keeps the
    one-hop exchange (``allgather`` / ``pairwise``: every holder sends to every
    other, one round) up to ``one_hop_max`` holders - the fewest rounds, and
    what small groups on a high-latency network do best - and above that
    takes the algorithm with the least :func:`collective_seconds` among the
    one-hop one, ``leader`` (vertical) and ``SCALABLE`` (ties: that order),
    so that at a thousand workers a column reduces by a tree and a group of
    bands by a ring when the bytes dominate. Deterministic: the driver
    computes it once per plan and every holder runs it.
    """
    names = ENGINE_VERTICAL if kind == "vertical" else ENGINE_HORIZONTAL
    if setting not in names:
        raise ValueError(f"rpm.engine.{kind}={setting!r}; valid: {', '.join(names)}")
    if setting != "auto":
        return setting
    if q <= one_hop_max:
        return names[1]
    candidates = (names[1], "leader") if kind == "vertical" else (names[1],)

    def seconds(a: str) -> float:
        # the one-hop horizontal exchange costs what an allgather of the group's rows does
        return collective_seconds("allgather" if a == "pairwise" else a, q, nbytes, link, overhead)

    return min(candidates + SCALABLE, key=seconds)


def engine_horizontal(
    setting: str,
    q: int,
    group_bytes: Sequence[float],
    link: LinkClass,
    overhead: float,
    one_hop_max: int,
) -> list[str] | None:
    """The engine's horizontal exchange: ``None`` for ``pairwise``, else one algorithm per group.

    ``group_bytes``: the bytes of each group of bands (``q`` holders each). The
    one-hop ``pairwise`` messages serve every group at once (a worker sends
    each partner all the rows they share in one message), so it is all or
    nothing: taken when the group with the most bytes would take it under
    :func:`engine_algorithm`; otherwise every group takes its own cheapest
    schedule (``SCALABLE``).
    """
    if not group_bytes:
        engine_algorithm("horizontal", setting, 1, 0.0, link, overhead, one_hop_max)  # checks it
        return None
    biggest = max(group_bytes)
    if (
        engine_algorithm("horizontal", setting, q, biggest, link, overhead, one_hop_max)
        == "pairwise"
    ):
        return None
    if setting != "auto":
        return [setting] * len(group_bytes)
    return [
        min(SCALABLE, key=lambda a: collective_seconds(a, q, b, link, overhead))
        for b in group_bytes
    ]


class EngineRule(NamedTuple):
    """How the engine picks its exchanges: the settings and the network it prices them on.

    Read once per plan (:meth:`from_config`) by the engine's layout and by the
    cost model's ``"engine"`` modes, so that both apply one rule with one set
    of prices - ``rpm.engine.vertical``, ``rpm.engine.horizontal``,
    ``rpm.engine.allgather-max`` and ``rpm.cost.*`` (the engine knows no other
    network; the model then charges the choice at the prices it is given).
    """

    vertical: str
    horizontal: str
    one_hop_max: int
    network: Interconnect

    @classmethod
    def from_config(
        cls,
        vertical: str | None = None,
        horizontal: str | None = None,
        network: Interconnect | None = None,
    ) -> EngineRule:
        """``rpm.engine.vertical`` / ``horizontal`` / ``allgather-max`` read now (``vertical`` and
        ``horizontal`` win when not ``None``), priced on ``network`` (``None``: ``rpm.cost.*``)."""
        c = config.section("engine", vertical=vertical, horizontal=horizontal)
        return cls(
            str(c["vertical"]),
            str(c["horizontal"]),
            int(c["allgather_max"]),
            network_from_config(network),
        )

    def vertical_for(self, members: Sequence[int], elements: float) -> str:
        """The in-column algorithm for ``members`` summing ``elements`` (:func:`engine_algorithm`)."""
        net = self.network
        return engine_algorithm(
            "vertical",
            self.vertical,
            len(members),
            elements * net.itemsize,
            net.worst_link(members),
            net.overhead,
            self.one_hop_max,
        )

    def horizontal_for(
        self, C: int, groups: Sequence[tuple[Sequence[int], float]]
    ) -> list[str] | None:
        """``None`` (pairwise) or one algorithm per ``(holders, elements)`` group (:func:`engine_horizontal`)."""
        net = self.network
        return engine_horizontal(
            self.horizontal,
            C,
            [e * net.itemsize for _, e in groups],
            net.worst_link(sorted({w for h, _ in groups for w in h})),
            net.overhead,
            self.one_hop_max,
        )
