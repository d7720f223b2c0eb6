"""Cost models for plans: the paper's element count and a seconds prediction.

Pure module (numpy only).

Two models live here:

* :func:`t_comm` (and :func:`t_comm_model`, :func:`t_comm_partition`) - the
  paper's communication cost in *elements*, which SRPM minimises (SPEC
  section 3). It ignores computation and message latency.
* :func:`predict_iteration_seconds` / :func:`predict_breakdown` - a
  latency-bandwidth (alpha-beta) model in *seconds* for one BP iteration of an
  integer plan on workers of known speeds. See :func:`predict_breakdown` for
  the model and its assumptions.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from . import config
from .partition import Plan, RealPartition, t_comm_model

__all__ = [
    "t_comm",
    "t_comm_model",
    "t_comm_partition",
    "predict_iteration_seconds",
    "predict_breakdown",
    "LinkClass",
    "LINK_CLASSES",
    "Network",
    "Message",
    "network_from_config",
    "round_seconds",
    "collective_seconds",
    "best_collective",
    "fit_network",
    "expected_max_normal",
    "VERTICAL_MODES",
    "HORIZONTAL_MODES",
    "SCALABLE",
]


def t_comm_partition(part: RealPartition, shape: tuple[int, int, int], samples: int) -> float:
    """The element-count model of a real-valued partition (row cuts do not matter)."""
    return t_comm_model(part.widths, [len(c) for c in part.columns], shape, samples)


def t_comm(plan: Plan) -> float:
    """The paper's communication cost of an integer plan, in elements (SPEC section 3).

    ``2 l s max_c(s_c* (k(c) - 1)) + 2 (l + n) m (C - 1)`` where ``s_c*`` is the
    column's sample fraction and ``k(c)`` its number of workers.
    """
    s = plan.samples
    widths = [plan.column_samples(c)[1] - plan.column_samples(c)[0] for c in range(plan.n_columns)]
    return t_comm_model(widths, [len(col) for col in plan.columns], plan.shape, s)


def _speed_of(speeds: Sequence[float] | Mapping[Any, float], plan: Plan, w: int) -> float:
    if isinstance(speeds, Mapping):
        key: Any = w
        if w not in speeds and plan.workers is not None and plan.workers[w] in speeds:
            key = plan.workers[w]
        if key not in speeds:
            raise ValueError(f"no speed given for planned worker P{w + 1} (index {w})")
        v = speeds[key]
    else:
        if len(speeds) != len(plan.abilities):
            raise ValueError(
                f"{len(speeds)} speeds given for a plan of {len(plan.abilities)} workers; "
                f"give one per worker (excluded ones included) or a mapping"
            )
        v = speeds[w]
    v = float(v)
    if not (math.isfinite(v) and v > 0):
        raise ValueError(
            f"speed of P{w + 1} is {v}; speeds must be positive finite work units/second"
        )
    return v


# ------------------------------------------------------------------ network
class LinkClass(NamedTuple):
    """Latency and bandwidth of one class of links.

    Attributes
    ----------
    latency : float
        Seconds from send to receipt of a small message.
    bandwidth : float
        Bytes per second one worker can push over such a link (each direction).
    """

    latency: float
    bandwidth: float


#: Link classes, fastest first: same host, same SLURM group/partition, across groups.
LINK_CLASSES = ("host", "group", "across")


class Network(NamedTuple):
    """Parameters of the alpha-beta model of :func:`predict_breakdown`.

    Attributes
    ----------
    latency, bandwidth : float
        Seconds per message on the critical path and bytes per second per
        worker link (each direction), for every link when ``classes`` is None.
    overhead : float
        Seconds a worker is busy per message it sends or receives
        (serialisation, the comm stack); charged to the worker and, divided by
        ``host_cores``, to its host.
    fixed : float
        Seconds per iteration that do not depend on the plan (the engine's
        bookkeeping, the weight update of small shards).
    host_bandwidth : float
        Bytes per second all messages touching one host share (loopback
        copies, one NIC); ``inf``: no host limit.
    host_cores : float
        Cores that share the per-message overhead of one host's workers.
    itemsize : int
        Bytes per element.
    classes : mapping of str to LinkClass, optional
        ``{"host": ..., "group": ..., "across": ...}``: a message between two
        workers is charged by the class of their link (:meth:`link_class`);
        missing classes fall back to ``latency``/``bandwidth``.
    hosts, groups : tuple, optional
        Host and group label of every worker (by plan index). Workers without
        labels are on hosts of their own, in one group. With ``hosts`` given
        the host terms apply.
    duplex : bool
        A worker sends and receives at once (a NIC: ``max(out, in)``); False
        when one thread does both (Dask's comm on the event loop on a
        CPU-bound host: ``out + in``).
    reduce : float
        Seconds per element a receiver spends adding what it received (and,
        in the vertical exchange, computing the output deltas of the summed
        partials).
    worker_cpu : float
        Seconds of CPU per worker and iteration outside kernels and messages
        (the block loop's bookkeeping); with ``hosts`` the workers of one host
        share ``host_cores`` for it, so it adds ``workers on the host x
        worker_cpu / host_cores`` per iteration.
    """

    latency: float = 50e-6
    bandwidth: float = 1e9
    overhead: float = 0.0
    fixed: float = 0.0
    host_bandwidth: float = math.inf
    host_cores: float = 1.0
    itemsize: int = 8
    classes: Mapping[str, LinkClass] | None = None
    hosts: tuple[Any, ...] | None = None
    groups: tuple[Any, ...] | None = None
    duplex: bool = True
    reduce: float = 0.0
    worker_cpu: float = 0.0

    def link_class(self, i: int, j: int) -> str:
        """``"host"``, ``"group"`` or ``"across"`` for the link between workers ``i`` and ``j``."""
        same_group = self.groups is None or self.groups[i] == self.groups[j]
        if self.hosts is not None and self.hosts[i] == self.hosts[j] and same_group:
            return "host"
        if self.groups is None or self.groups[i] == self.groups[j]:
            return "group"
        return "across"

    def link(self, i: int, j: int) -> LinkClass:
        """Latency and bandwidth of the link between workers ``i`` and ``j``."""
        if self.classes:
            cls = self.classes.get(self.link_class(i, j))
            if cls is not None:
                return cls
        return LinkClass(self.latency, self.bandwidth)

    def worst_link(self, workers: Sequence[int]) -> LinkClass:
        """The slowest class among the links of a set of workers (what a tree or ring over them waits for)."""
        if not self.classes or len(workers) < 2:
            return LinkClass(self.latency, self.bandwidth)
        names = set()
        hs = {self.hosts[w] for w in workers} if self.hosts is not None else None
        gs = {self.groups[w] for w in workers} if self.groups is not None else None
        if gs is not None and len(gs) > 1:
            names.add("across")
        elif hs is None or len(hs) > 1:
            names.add("group")
        else:
            names.add("host")
        name = next(n for n in reversed(LINK_CLASSES) if n in names)
        return self.classes.get(name, LinkClass(self.latency, self.bandwidth))


def network_from_config(
    network: Network | None = None,
    *,
    latency: float | None = None,
    bandwidth: float | None = None,
    itemsize: int | None = None,
) -> Network:
    """``network`` with explicit keywords applied, else one from ``rpm.cost.*``; validated."""
    if network is None:
        network = Network(
            latency=float(config.get("cost.latency", latency)),
            bandwidth=float(config.get("cost.bandwidth", bandwidth)),
            itemsize=int(config.get("cost.itemsize", itemsize)),
            overhead=float(config.get("cost.overhead")),
            fixed=float(config.get("cost.fixed")),
        )
    else:
        repl = {
            k: v
            for k, v in (("latency", latency), ("bandwidth", bandwidth), ("itemsize", itemsize))
            if v is not None
        }
        network = network._replace(**repl)
    lat, bw, isz = float(network.latency), float(network.bandwidth), int(network.itemsize)
    if not (math.isfinite(lat) and lat >= 0):
        raise ValueError(f"latency={lat} must be a non-negative number of seconds")
    if not (bw > 0):
        raise ValueError(f"bandwidth={bw} must be positive (bytes per second)")
    if isz < 1:
        raise ValueError(f"itemsize={isz} must be a positive number of bytes")
    for name in ("overhead", "fixed"):
        v = float(getattr(network, name))
        if not (math.isfinite(v) and v >= 0):
            raise ValueError(f"{name}={v} must be a non-negative number of seconds")
    if not (network.host_bandwidth > 0 and network.host_cores > 0):
        raise ValueError(
            f"host_bandwidth={network.host_bandwidth} and host_cores={network.host_cores} "
            f"must be positive"
        )
    for name, cls in (network.classes or {}).items():
        if name not in LINK_CLASSES:
            raise ValueError(f"link class {name!r} is not one of {', '.join(LINK_CLASSES)}")
        if not (cls.latency >= 0 and cls.bandwidth > 0):
            raise ValueError(
                f"link class {name!r}: latency must be >= 0 and bandwidth > 0, got {cls}"
            )
    return network


# ------------------------------------------------------------------ rounds
class Message(NamedTuple):
    """One point-to-point message of a round: ``nbytes`` bytes from ``src`` to ``dst``.

    ``reduce``: the receiver adds the payload into its buffer (charged ``Network.reduce`` per element).
    """

    src: int
    dst: int
    nbytes: float
    reduce: bool = False


def round_seconds(messages: Sequence[Message], network: Network) -> tuple[float, dict[int, float]]:
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


# ----------------------------------------------------------- exchange costs
#: In-column algorithms the model knows: the engine's today, and the scalable ones of dask_rpm.exchange.
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
#: The scalable collectives "best" chooses from (dask_rpm.exchange builds their schedules).
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
    :mod:`dask_rpm.exchange` on uniform links (tested):

    * ``tree``: binomial reduce then binomial broadcast, ``2 ceil(log2 q)`` rounds of the whole buffer;
    * ``halving``: recursive halving reduce-scatter + doubling all-gather (Rabenseifner);
      ``2 log2 p`` rounds for the largest power of two ``p <= q`` plus 2 rounds folding the rest in and out;
    * ``ring``: ring reduce-scatter + all-gather, ``2 (q - 1)`` rounds of ``1/q`` of the buffer;
    * ``direct``: every holder sends each other holder the share it owns (2 rounds, ``q - 1`` messages each);
    * ``allgather``: everyone sends everything to everyone (the engine's small-column vertical);
    * ``leader`` / ``gather``: one holder gathers and sends the sum back (the engine's large-column vertical).

    ``reduce`` is the seconds to add the whole buffer once at a receiver
    (``elements x Network.reduce``); each algorithm's critical path adds
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


def _engine_vertical(k: int, mode: str) -> str:
    if mode != "engine":
        return mode
    v = str(config.get("engine.vertical"))
    if v == "auto":
        return "allgather" if k <= int(config.get("engine.allgather-max")) else "leader"
    return v


def _column_rows(plan: Plan) -> list[tuple[np.ndarray, np.ndarray, list[int]]]:
    """Per column: row starts and ends (top to bottom) and the workers in that order."""
    out = []
    for col in plan.columns:
        ws = sorted(col, key=lambda w: plan.rectangle(w).hidden[0])
        starts = np.array([plan.rectangle(w).hidden[0] for w in ws])
        ends = np.array([plan.rectangle(w).hidden[1] for w in ws])
        out.append((starts, ends, ws))
    return out


def _pairwise_messages(
    plan: Plan, rows: list[tuple[np.ndarray, np.ndarray, list[int]]], per_row: float
) -> list[Message]:
    """The engine's horizontal messages: to every worker of another column whose rows overlap mine."""
    msgs = []
    for c, (s1, e1, w1) in enumerate(rows):
        for c2, (s2, e2, w2) in enumerate(rows):
            if c2 == c:
                continue
            # merge the two sorted cut lists: each overlapping pair once
            i = j = 0
            while i < len(w1) and j < len(w2):
                lo, hi = max(s1[i], s2[j]), min(e1[i], e2[j])
                if lo < hi:
                    msgs.append(Message(w1[i], w2[j], (hi - lo) * per_row, True))
                if e1[i] <= e2[j]:
                    i += 1
                else:
                    j += 1
    return msgs


def _pairwise_uniform(
    plan: Plan,
    rows: list[tuple[np.ndarray, np.ndarray, list[int]]],
    per_row: float,
    network: Network,
) -> float:
    """:func:`round_seconds` of the pairwise messages on uniform links, vectorised (large N)."""
    C = len(rows)
    starts = np.concatenate([s for s, _, _ in rows])
    ends = np.concatenate([e for _, e, _ in rows])
    workers = [w for _, _, ws in rows for w in ws]
    count = np.zeros(len(workers))
    for (
        s2,
        _,
        _,
    ) in rows:  # partners in column c2 of every worker: cuts of c2 inside its rows, plus one
        count += (
            np.searchsorted(s2, ends - 1, side="right")
            - np.searchsorted(s2, starts, side="right")
            + 1
        )
    count -= 1  # its own column counted itself once
    heights = (ends - starts).astype(float)
    o, bw = network.overhead, network.bandwidth
    volume = (C - 1) * heights * per_row / bw * (1 if network.duplex else 2)  # as much in as out
    adds = (C - 1) * heights * per_row / network.itemsize * network.reduce
    own = float(np.max(network.latency + 2 * count * o + volume + adds))
    if network.hosts is not None:
        hosts: dict[Any, float] = {}
        for w, k, h in zip(workers, count.tolist(), heights.tolist()):
            # every message has two ends; on one host its bytes are counted once; the sums need its cores
            hosts[network.hosts[w]] = (
                hosts.get(network.hosts[w], 0.0)
                + 2 * k * o / network.host_cores
                + (C - 1) * h * per_row / network.host_bandwidth
                + (C - 1) * h * per_row / network.itemsize * network.reduce / network.host_cores
            )
        own = max(own, network.latency + max(hosts.values()))
    return own


def _band_groups(
    plan: Plan, rows: list[tuple[np.ndarray, np.ndarray, list[int]]]
) -> list[tuple[tuple[int, ...], int]]:
    """Bands with the same holders merged: ``(holders in column order, hidden rows)``."""
    cuts = np.array(sorted({int(v) for s, _, _ in rows for v in s} | {plan.m}))
    lo, widths = cuts[:-1], np.diff(cuts)
    holders = np.empty((len(lo), len(rows)), dtype=np.int64)
    for c, (s, _, ws) in enumerate(rows):
        holders[:, c] = np.asarray(ws)[np.searchsorted(s, lo, side="right") - 1]
    groups: dict[tuple[int, ...], int] = {}
    for h, r in zip(map(tuple, holders.tolist()), widths.tolist()):
        groups[h] = groups.get(h, 0) + int(r)
    return list(groups.items())


def predict_breakdown(
    plan: Plan,
    speeds: Sequence[float] | Mapping[Any, float],
    *,
    latency: float | None = None,
    bandwidth: float | None = None,
    itemsize: int | None = None,
    network: Network | None = None,
    vertical: str | None = None,
    horizontal: str | None = None,
    spread: Sequence[float] | Mapping[Any, float] | None = None,
) -> dict[str, Any]:
    """Predicted seconds of one BP iteration of ``plan``, part by part.

    Model (alpha-beta per message, everything in seconds):

    * compute of worker ``i``: ``area_i / speed_i``, ``area_i`` = hidden units x
      samples of its rectangle (the work unit of SPEC section 1);
    * vertical exchange of column ``c`` (``k`` workers): an allreduce of the
      ``l x s_c`` partial products. ``vertical="engine"`` (default
      ``rpm.cost.vertical``) charges what the engine does
      (:mod:`dask_rpm.engine.layout`, ``rpm.engine.vertical``): ``allgather``
      (one round, everyone sends to everyone) or ``leader`` (gather, sum,
      send back: two rounds); ``gather`` is the paper's one-message-at-a-time
      ``2 (k - 1)`` messages; ``tree``, ``halving``, ``ring``, ``direct`` the
      scalable schedules of :mod:`dask_rpm.exchange`; ``best`` the cheapest
      of those per column;
    * horizontal exchange: ``horizontal="engine"``/``"pairwise"`` charges the
      engine's messages (every worker sends the rows it shares with each
      worker of another column to that worker, all at once, one round);
      ``"bands"`` the paper-style model (each band's ``2 (C - 1)`` messages,
      bands one after another); a collective name or ``"best"`` runs one
      allreduce per group of bands with the same holders, concurrently: a
      worker's link carries the bandwidth and overhead part of every band it
      holds one after another, their latency chains overlap;
    * one round of messages (engine modes) lasts until the slowest worker is
      done (``latency + overhead x messages + max(bytes out, bytes in) /
      bandwidth``) and every host is (``overhead x message ends / host_cores
      + bytes / host_bandwidth``), see :func:`round_seconds`;
    * iteration = ``fixed + max_c(slowest compute in c + vertical_c) + horizontal``
      (+ ``straggler``: with ``spread`` given, the expected delay of the
      slowest of ``N`` workers whose compute varies from iteration to
      iteration: ``mean(spread) x E[max of N standard normals]``).

    Assumptions: columns run independently until the horizontal exchange
    (which waits for every column); compute and communication do not
    overlap (the engine computes, then exchanges); a message between two
    workers is charged by their link class when ``network.classes`` is set.

    Parameters
    ----------
    plan
        An integer plan.
    speeds
        Work units (hidden units x samples) per second, one per worker of
        ``plan.abilities`` (excluded workers included, their value unused), or
        a mapping from worker index or worker name to speed.
    latency, bandwidth, itemsize
        Override those of ``network``; with no ``network``, ``None`` reads
        ``rpm.cost.latency``, ``rpm.cost.bandwidth``, ``rpm.cost.itemsize``.
    network
        All parameters (:class:`Network`): overhead, fixed cost, host limits, link classes.
    vertical, horizontal
        Exchange algorithms (see above); ``None`` reads ``rpm.cost.vertical``
        and ``rpm.cost.horizontal``.
    spread
        Standard deviation of each worker's compute seconds per iteration
        (same indexing as ``speeds``); ``None``: no straggler term.

    Returns
    -------
    dict
        ``compute`` (per worker index), ``column_compute``, ``vertical``,
        ``vertical_algorithm`` and ``column_total`` (per column), ``bands``
        (list of ``(m0, m1)``), ``horizontal_by_band`` (``"bands"`` mode),
        ``horizontal_groups`` (``(holders, rows, algorithm, seconds)`` in
        collective modes), ``horizontal``, ``fixed``, ``straggler``,
        ``bottleneck_column`` and ``total`` (seconds).
    """
    net = network_from_config(network, latency=latency, bandwidth=bandwidth, itemsize=itemsize)
    vmode = str(config.get("cost.vertical", vertical))
    hmode = str(config.get("cost.horizontal", horizontal))
    if vmode not in VERTICAL_MODES:
        raise ValueError(f"vertical={vmode!r}; valid: {', '.join(VERTICAL_MODES)}")
    if hmode not in HORIZONTAL_MODES:
        raise ValueError(f"horizontal={hmode!r}; valid: {', '.join(HORIZONTAL_MODES)}")
    n, _, l = plan.shape
    isz = net.itemsize
    compute: dict[int, float] = {}
    column_compute, vertical_t, vertical_alg, column_total = [], [], [], []
    engine_rounds: list[list[Message]] = [[], []]
    col_rounds: list[tuple[str, list[int]]] = []
    for c, col in enumerate(plan.columns):
        times = []
        for w in col:
            t = plan.rectangle(w).area / _speed_of(speeds, plan, w)
            compute[w] = t
            times.append(t)
        s0, s1 = plan.column_samples(c)
        k = len(col)
        nbytes = l * (s1 - s0) * isz
        alg = _engine_vertical(k, vmode)
        column_compute.append(max(times))
        delta = l * (s1 - s0) * net.reduce  # output deltas of the summed partials, on every member
        if k == 1:
            vertical_alg.append("none")
            vertical_t.append(delta)
            col_rounds.append(("none", []))
            continue
        if alg in ("allgather", "leader") and vmode in ("engine", "allgather", "leader"):
            # explicit rounds, so that columns sharing a host contend
            order = sorted(col, key=lambda w: plan.rectangle(w).hidden[0])
            if alg == "allgather":
                engine_rounds[0] += [
                    Message(a, b, nbytes, True) for a in order for b in order if a != b
                ]
            else:
                lead = max(col, key=lambda w: (plan.abilities[w], -w))
                engine_rounds[0] += [Message(a, lead, nbytes, True) for a in order if a != lead]
                engine_rounds[1] += [Message(lead, b, nbytes) for b in order if b != lead]
            col_rounds.append((alg, order))
            vertical_alg.append(alg)
            vertical_t.append(delta)
            continue
        link = net.worst_link(col)
        red = l * (s1 - s0) * net.reduce
        if alg == "gather":
            v = (
                2 * (k - 1) * (link.latency + net.overhead + nbytes / link.bandwidth)
                + (k - 1) * red
            )
        elif alg == "best":
            alg, v = best_collective(k, nbytes, link, net.overhead, red)
        else:
            v = collective_seconds(alg, k, nbytes, link, net.overhead, red)
        vertical_alg.append(alg)
        vertical_t.append(v + delta)
        col_rounds.append((alg, []))
    if any(engine_rounds):
        timed = [round_seconds(r, net) if r else (0.0, {}) for r in engine_rounds]
        for c, (alg, order) in enumerate(col_rounds):
            if alg in ("allgather", "leader") and order:
                vertical_t[c] += sum(
                    max(
                        worst if net.hosts is not None else 0.0,
                        max((own.get(w, 0.0) for w in order), default=0.0),
                    )
                    for worst, own in timed
                    if own and any(w in own for w in order)
                )
    if net.hosts is not None and net.reduce > 0:
        # every member of an allgather column (the leader of a leader column) computes the output
        # deltas at the same time as the other columns: on a shared host they share its cores
        load: dict[Any, float] = {}
        for c, col in enumerate(plan.columns):
            s0, s1 = plan.column_samples(c)
            alg = vertical_alg[c]
            members = (
                [max(col, key=lambda w: (plan.abilities[w], -w))] if alg == "leader" else list(col)
            )
            for w in members:
                load[net.hosts[w]] = (
                    load.get(net.hosts[w], 0.0) + l * (s1 - s0) * net.reduce / net.host_cores
                )
        for c, col in enumerate(plan.columns):
            vertical_t[c] = max(vertical_t[c], max(load.get(net.hosts[w], 0.0) for w in col))
    for c in range(plan.n_columns):
        column_total.append(column_compute[c] + vertical_t[c])

    C = plan.n_columns
    per_row = (n + l) * isz
    bands = plan.bands()
    horizontal_by_band: list[float] = []
    groups_out: list[tuple[tuple[int, ...], int, str, float]] = []
    if C == 1:
        horizontal = 0.0
    elif hmode in ("engine", "pairwise"):
        rows = _column_rows(plan)
        if net.classes or (net.hosts is not None and len(set(net.hosts)) > 1):
            horizontal = round_seconds(_pairwise_messages(plan, rows, per_row), net)[0]
        else:
            horizontal = _pairwise_uniform(plan, rows, per_row, net)
    elif hmode == "bands":
        horizontal_by_band = [
            2 * (C - 1) * (net.latency + net.overhead + (b1 - b0) * per_row / net.bandwidth)
            + (C - 1) * (b1 - b0) * (n + l) * net.reduce
            for b0, b1 in bands
        ]
        horizontal = float(sum(horizontal_by_band))
    else:
        rows = _column_rows(plan)
        load: dict[int, float] = {}
        chain: dict[int, float] = {}
        for holders, r in _band_groups(plan, rows):
            link = net.worst_link(holders)
            nbytes = r * per_row
            red = r * (n + l) * net.reduce
            if hmode == "best":
                alg, t = best_collective(C, nbytes, link, net.overhead, red)
            else:
                alg, t = hmode, collective_seconds(hmode, C, nbytes, link, net.overhead, red)
            lat = collective_seconds(alg, C, 0.0, LinkClass(link.latency, link.bandwidth), 0.0)
            groups_out.append((holders, r, alg, t))
            for w in holders:  # bandwidth parts add up on the worker's link; latency chains overlap
                load[w] = load.get(w, 0.0) + (t - lat)
                chain[w] = max(chain.get(w, 0.0), lat)
        horizontal = max(load[w] + chain[w] for w in load)
    bottleneck = max(range(C), key=lambda c: column_total[c])
    fixed = float(net.fixed)
    if net.hosts is not None and net.worker_cpu > 0:
        per_host: dict[Any, int] = {}
        for w in plan.planned_workers:
            per_host[net.hosts[w]] = per_host.get(net.hosts[w], 0) + 1
        fixed += max(per_host.values()) * net.worker_cpu / net.host_cores
    straggler = 0.0
    if spread is not None:
        planned = plan.planned_workers
        sig = [
            float(
                spread[w]
                if not isinstance(spread, Mapping)
                else spread.get(w, spread.get(plan.workers[w] if plan.workers else w, 0.0))
            )
            for w in planned
        ]
        if any(not (math.isfinite(v) and v >= 0) for v in sig):
            raise ValueError(f"spread must be non-negative finite seconds, got {sig}")
        straggler = float(np.mean(sig)) * expected_max_normal(len(planned))
    return {
        "compute": compute,
        "column_compute": column_compute,
        "vertical": vertical_t,
        "vertical_algorithm": vertical_alg,
        "column_total": column_total,
        "bands": bands,
        "horizontal_by_band": horizontal_by_band,
        "horizontal_groups": groups_out,
        "horizontal": float(horizontal),
        "fixed": fixed,
        "straggler": straggler,
        "bottleneck_column": bottleneck,
        "total": float(fixed + column_total[bottleneck] + horizontal + straggler),
    }


def expected_max_normal(n: int) -> float:
    """``E[max of n independent standard normal variables]`` (0 for n = 1), by numerical integration."""
    if n <= 1:
        return 0.0
    # E[max] = int_0^inf (1 - F(x)) dx - int_-inf^0 F(x) dx with F = Phi^n (trapezoids on each side)
    x = np.linspace(0.0, 9.0, 9001)
    phi = np.array([0.5 * (1.0 + math.erf(v / math.sqrt(2.0))) for v in x])
    upper = 1.0 - phi**n  # on x >= 0
    lower = (1.0 - phi) ** n  # F(-x) = (1 - Phi(x))^n on x >= 0
    dx = x[1] - x[0]
    trap = lambda y: float(dx * (y.sum() - 0.5 * (y[0] + y[-1])))  # noqa: E731
    return trap(upper) - trap(lower)


def predict_iteration_seconds(
    plan: Plan,
    speeds: Sequence[float] | Mapping[Any, float],
    *,
    latency: float | None = None,
    bandwidth: float | None = None,
    itemsize: int | None = None,
    network: Network | None = None,
    vertical: str | None = None,
    horizontal: str | None = None,
    spread: Sequence[float] | Mapping[Any, float] | None = None,
) -> float:
    """Predicted seconds of one BP iteration; the ``total`` of :func:`predict_breakdown`."""
    return predict_breakdown(
        plan,
        speeds,
        latency=latency,
        bandwidth=bandwidth,
        itemsize=itemsize,
        network=network,
        vertical=vertical,
        horizontal=horizontal,
        spread=spread,
    )["total"]


# ------------------------------------------------------------------ fitting
def fit_network(
    runs: Sequence[tuple[Any, ...]],
    *,
    host_cores: float = 1.0,
    hosts: str | None = "one",
    duplex: bool = True,
    rounds: int = 400,
) -> Network:
    """Network parameters that best predict measured runs of the engine.

    Fits ``latency``, ``overhead``, ``bandwidth``, ``host_bandwidth``,
    ``fixed``, ``reduce`` and ``worker_cpu`` by minimising the sum of absolute log errors of
    :func:`predict_iteration_seconds` (engine exchanges) over ``runs``, by a
    coordinate search on the logarithms (a handful of parameters and runs; no
    SciPy needed).

    Parameters
    ----------
    runs
        ``(plan, speeds in work units/s, measured seconds per iteration, vertical algorithm)``,
        optionally with a fifth item, each worker's compute spread (see :func:`predict_breakdown`).
    host_cores
        Cores the workers of one host share.
    hosts
        ``"one"``: every worker on one host (a local cluster); ``None``: a host each.
    rounds
        Passes of the coordinate search.
    """
    if not runs:
        raise ValueError("fit_network needs at least one measured run")
    names = ("latency", "overhead", "bandwidth", "host_bandwidth", "fixed", "reduce", "worker_cpu")
    x = np.log(np.array([1e-4, 1e-4, 1e9, 1e9, 1e-4, 1e-9, 1e-4]))

    def net_of(v: np.ndarray, n_workers: int) -> Network:
        p = dict(zip(names, np.exp(v)))
        return Network(
            latency=p["latency"],
            overhead=p["overhead"],
            bandwidth=p["bandwidth"],
            host_bandwidth=p["host_bandwidth"],
            fixed=p["fixed"],
            reduce=p["reduce"],
            worker_cpu=p["worker_cpu"],
            host_cores=host_cores,
            duplex=duplex,
            hosts=("localhost",) * n_workers if hosts == "one" else None,
        )

    def loss(v: np.ndarray) -> float:
        err = 0.0
        for run in runs:
            plan, speeds, measured, vert = run[:4]
            t = predict_iteration_seconds(
                plan,
                speeds,
                network=net_of(v, len(plan.abilities)),
                vertical=vert if vert != "auto" else "engine",
                horizontal="engine",
                spread=run[4] if len(run) > 4 else None,
            )
            err += abs(math.log(t / measured))  # L1: one noisy run does not drag the rest
        return err

    # Coordinate search first (robust from a poor start), then Nelder-Mead restarts polish it
    # (the loss is piecewise smooth: max() terms switch between workers and hosts).
    best = loss(x)
    step = 2.0
    for _ in range(rounds):
        improved = False
        for i in range(len(x)):
            for d in (step, -step):
                y = x.copy()
                y[i] += d
                f = loss(y)
                if f < best:
                    x, best, improved = y, f, True
        if not improved:
            step /= 2
            if step < 0.05:
                break
    for size in (1.0, 0.3, 0.1):
        x, best = _nelder_mead(loss, x, best, size, iterations=40 * len(x))
    return net_of(x, 0)._replace(hosts=None)


def _nelder_mead(
    f: Any, x0: np.ndarray, f0: float, size: float, iterations: int
) -> tuple[np.ndarray, float]:
    """Minimise ``f`` from ``x0`` by the Nelder-Mead simplex (initial edge ``size``); returns (x, f(x))."""
    n = len(x0)
    pts = [x0] + [x0 + size * np.eye(n)[i] for i in range(n)]
    vals = [f0] + [f(p) for p in pts[1:]]
    for _ in range(iterations):
        order = np.argsort(vals)
        pts, vals = [pts[i] for i in order], [vals[i] for i in order]
        centroid = np.mean(pts[:-1], axis=0)
        refl = centroid + (centroid - pts[-1])
        fr = f(refl)
        if fr < vals[0]:
            exp = centroid + 2 * (centroid - pts[-1])
            fe = f(exp)
            pts[-1], vals[-1] = (exp, fe) if fe < fr else (refl, fr)
        elif fr < vals[-2]:
            pts[-1], vals[-1] = refl, fr
        else:
            con = centroid + 0.5 * (pts[-1] - centroid)
            fc = f(con)
            if fc < vals[-1]:
                pts[-1], vals[-1] = con, fc
            else:  # shrink towards the best point
                pts = [pts[0]] + [pts[0] + 0.5 * (p - pts[0]) for p in pts[1:]]
                vals = [vals[0]] + [f(p) for p in pts[1:]]
    i = int(np.argmin(vals))
    return pts[i], vals[i]
