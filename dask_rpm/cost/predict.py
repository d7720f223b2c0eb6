"""Seconds of one BP iteration of an integer plan (:func:`predict_breakdown`), and the element count."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from ..comm.cost import (
    HORIZONTAL_MODES,
    VERTICAL_MODES,
    EngineRule,
    Message,
    best_collective,
    collective_seconds,
    round_seconds,
    schedule_seconds,
)
from ..comm.network import CostSettings, Interconnect, LinkClass, network_from_config
from ..comm.schedules import build
from ..plan.partition import Plan, RealPartition, t_comm_model

__all__ = [
    "CostModel",
    "expected_max_normal",
    "predict_breakdown",
    "predict_iteration_seconds",
    "t_comm",
    "t_comm_partition",
]


def t_comm_partition(part: RealPartition, shape: tuple[int, int, int], samples: int) -> float:
    """The element-count model of a real-valued partition (row cuts do not matter)."""
    return t_comm_model(part.widths, [len(c) for c in part.columns], shape, samples)


def t_comm(plan: Plan) -> float:
    """The paper's communication cost of an integer plan, in elements (docs/method.md §4).

    ``2 l s max_c(s_c* (k(c) - 1)) + 2 (l + n) m (C - 1)`` where ``s_c*`` is the
    column's sample fraction and ``k(c)`` its number of workers.
    """
    s = plan.samples
    widths = [plan.column_samples(c)[1] - plan.column_samples(c)[0] for c in range(plan.n_columns)]
    return t_comm_model(
        widths, [len(col) for col in plan.columns], plan.cost_shape or plan.shape, s
    )


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
    network: Interconnect,
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


def _band_groups(plan: Plan) -> list[tuple[tuple[int, ...], int]]:
    """Bands with the same holders merged: ``(holders in column order, hidden rows)``."""
    return [(h, sum(b - a for a, b in bands)) for h, bands in plan.band_groups()]


class CostModel(NamedTuple):
    """What :func:`predict_breakdown` charges, read once (:meth:`from_config`) and passed to
    every prediction of a call that makes many (a planner's candidates, DRPM's checks).

    Attributes
    ----------
    network : Interconnect
        The network, checked (:func:`~dask_rpm.comm.network_from_config`).
    vertical, horizontal : str
        The exchange algorithms charged (see :func:`predict_breakdown`).
    rule : EngineRule or None
        What the ``"engine"`` modes charge (:class:`~dask_rpm.comm.EngineRule`, priced on
        ``rpm.cost.*`` as the engine is); ``None`` when neither mode is ``"engine"``.
    """

    network: Interconnect
    vertical: str
    horizontal: str
    rule: EngineRule | None = None

    @classmethod
    def from_config(
        cls,
        network: Interconnect | None = None,
        *,
        latency: float | None = None,
        bandwidth: float | None = None,
        itemsize: int | None = None,
        vertical: str | None = None,
        horizontal: str | None = None,
    ) -> CostModel:
        """``network`` (``None``: ``rpm.cost.*``) with the keywords that are not ``None``
        applied, the modes (``None``: ``rpm.cost.vertical`` / ``horizontal``) and, for an
        ``"engine"`` mode, the engine's rule (``rpm.engine.*``): read now, checked."""
        cost = CostSettings.from_config()
        net = network_from_config(
            network if network is not None else cost.interconnect(),
            latency=latency,
            bandwidth=bandwidth,
            itemsize=itemsize,
        )
        vmode = cost.vertical if vertical is None else str(vertical)
        hmode = cost.horizontal if horizontal is None else str(horizontal)
        _check_modes(vmode, hmode)
        rule = None
        if "engine" in (vmode, hmode):  # the engine prices its choice on rpm.cost.*
            rule = EngineRule.from_config(network=network_from_config(cost.interconnect()))
        return cls(net, vmode, hmode, rule)


def _check_modes(vmode: str, hmode: str) -> None:
    if vmode not in VERTICAL_MODES:
        raise ValueError(f"vertical={vmode!r}; valid: {', '.join(VERTICAL_MODES)}")
    if hmode not in HORIZONTAL_MODES:
        raise ValueError(f"horizontal={hmode!r}; valid: {', '.join(HORIZONTAL_MODES)}")


def predict_breakdown(
    plan: Plan,
    speeds: Sequence[float] | Mapping[Any, float],
    *,
    latency: float | None = None,
    bandwidth: float | None = None,
    itemsize: int | None = None,
    network: Interconnect | None = None,
    vertical: str | None = None,
    horizontal: str | None = None,
    spread: Sequence[float] | Mapping[Any, float] | None = None,
    model: CostModel | None = None,
) -> dict[str, Any]:
    """Predicted seconds of one BP iteration of ``plan``, part by part.

    Model (alpha-beta per message, everything in seconds):

    * compute of worker ``i``: ``area_i / speed_i``, ``area_i`` = hidden units x
      samples of its rectangle (the work unit of docs/method.md §1);
    * vertical exchange of column ``c`` (``k`` workers): an allreduce of the
      ``l x s_c`` partial products. ``vertical="engine"`` (default
      ``rpm.cost.vertical``) charges what the engine does
      (:mod:`dask_rpm.engine.layout`, ``rpm.engine.vertical``): ``allgather``
      (one round, everyone sends to everyone) or ``leader`` (gather, sum,
      send back: two rounds); ``gather`` is the paper's one-message-at-a-time
      ``2 (k - 1)`` messages; ``tree``, ``halving``, ``ring``, ``direct`` the
      scalable schedules of :mod:`dask_rpm.comm.exchange`; ``best`` the cheapest
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
        All parameters (:class:`Interconnect`): overhead, fixed cost, host limits, link classes.
    vertical, horizontal
        Exchange algorithms (see above); ``None`` reads ``rpm.cost.vertical``
        and ``rpm.cost.horizontal``.
    spread
        Standard deviation of each worker's compute seconds per iteration
        (same indexing as ``speeds``); ``None``: no straggler term.
    model
        All of the above but ``spread``, read once (:meth:`CostModel.from_config`), for
        callers that predict many plans; not together with those keywords.

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
    given = (latency, bandwidth, itemsize, network, vertical, horizontal)
    if model is None:
        model = CostModel.from_config(
            network,
            latency=latency,
            bandwidth=bandwidth,
            itemsize=itemsize,
            vertical=vertical,
            horizontal=horizontal,
        )
    elif any(v is not None for v in given):
        raise TypeError(
            "give model= or latency/bandwidth/itemsize/network/vertical/horizontal, not both "
            "(a CostModel already holds them)"
        )
    else:
        _check_modes(model.vertical, model.horizontal)
    net = model.network
    vert = _vertical(plan, speeds, net, model.vertical, model.rule)
    column_total = [vert.compute_max[c] + vert.seconds[c] for c in range(plan.n_columns)]
    h_seconds, by_band, groups = _horizontal(plan, net, model.horizontal, model.rule)
    bottleneck = max(range(plan.n_columns), key=lambda c: column_total[c])
    fixed = _fixed_seconds(plan, net)
    straggler = 0.0 if spread is None else _straggler_seconds(plan, spread)
    return {
        "compute": vert.compute,
        "column_compute": vert.compute_max,
        "vertical": vert.seconds,
        "vertical_algorithm": vert.algorithm,
        "column_total": column_total,
        "bands": plan.bands(),
        "horizontal_by_band": by_band,
        "horizontal_groups": groups,
        "horizontal": float(h_seconds),
        "fixed": fixed,
        "straggler": straggler,
        "bottleneck_column": bottleneck,
        "total": float(fixed + column_total[bottleneck] + h_seconds + straggler),
    }


class _Vertical(NamedTuple):
    """Per-column results of the compute and vertical-exchange part of the model."""

    compute: dict[int, float]  # per worker index
    compute_max: list[float]  # per column: its slowest worker
    seconds: list[float]  # per column: vertical exchange (with the output deltas)
    algorithm: list[str]  # per column


def _vertical(
    plan: Plan,
    speeds: Sequence[float] | Mapping[Any, float],
    net: Interconnect,
    vmode: str,
    rule: EngineRule | None,
) -> _Vertical:
    """Compute seconds per worker and the vertical exchange of every column."""
    _, _, l = plan.cost_shape or plan.shape  # a deep network: its layers too
    isz = net.itemsize
    out = _Vertical({}, [], [], [])
    engine_rounds: list[list[Message]] = [[], []]
    col_rounds: list[tuple[str, list[int]]] = []
    engine_rule = rule if vmode == "engine" else None
    if vmode == "engine" and rule is None:
        raise ValueError('vertical="engine" needs the engine\'s rule (CostModel.from_config)')
    for c, col in enumerate(plan.columns):
        times = []
        for w in col:
            t = plan.rectangle(w).area / _speed_of(speeds, plan, w)
            out.compute[w] = t
            times.append(t)
        s0, s1 = plan.column_samples(c)
        k = len(col)
        nbytes = l * (s1 - s0) * isz
        alg = engine_rule.vertical_for(col, l * (s1 - s0)) if engine_rule is not None else vmode
        out.compute_max.append(max(times))
        delta = l * (s1 - s0) * net.reduce  # output deltas of the summed partials, on every member
        if k == 1:
            out.algorithm.append("none")
            out.seconds.append(delta)
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
                lead = _leader(plan, col)
                engine_rounds[0] += [Message(a, lead, nbytes, True) for a in order if a != lead]
                engine_rounds[1] += [Message(lead, b, nbytes) for b in order if b != lead]
            col_rounds.append((alg, order))
            out.algorithm.append(alg)
            out.seconds.append(delta)
            continue
        if net.hosts is not None and alg not in ("gather", "best"):
            order = sorted(col, key=lambda w: plan.rectangle(w).hidden[0])
            v = scheduled_seconds(alg, order, l * (s1 - s0), net)
        else:
            alg, v = _collective_column(alg, k, nbytes, net.worst_link(col), net, delta)
        out.algorithm.append(alg)
        out.seconds.append(v + delta)
        col_rounds.append((alg, []))
    if any(engine_rounds):
        _add_engine_rounds(out.seconds, engine_rounds, col_rounds, net)
    if net.hosts is not None and net.reduce > 0:
        _share_host_cores(plan, net, out)
    return out


def _leader(plan: Plan, col: Sequence[int]) -> int:
    """The fastest worker of a column (the lowest index among equals): the ``leader`` mode's."""
    return max(col, key=lambda w: (plan.abilities[w], -w))


def _collective_column(
    alg: str, k: int, nbytes: float, link: LinkClass, net: Interconnect, red: float
) -> tuple[str, float]:
    """A column's allreduce as a collective (or the paper's ``gather``): algorithm, seconds."""
    if alg == "gather":
        v = 2 * (k - 1) * (link.latency + net.overhead + nbytes / link.bandwidth) + (k - 1) * red
        return alg, v
    if alg == "best":
        return best_collective(k, nbytes, link, net.overhead, red)
    return alg, collective_seconds(alg, k, nbytes, link, net.overhead, red)


def scheduled_seconds(alg: str, holders: Sequence[int], elements: int, net: Interconnect) -> float:
    """Seconds of the engine's schedule ``alg`` among ``holders``, priced round by round.

    What the closed form :func:`collective_seconds` gives on links of their
    own; with ``net.hosts`` every round also lasts until each host has
    handled its message ends on its cores and its bytes
    (:func:`round_seconds`): the many small messages of a ring or direct
    exchange among workers sharing a host cost its CPU, which the closed form
    does not see. Used for the engine's exchanges when hosts are known.
    """
    return schedule_seconds(build("gather" if alg == "leader" else alg, holders, elements), net)


def _add_engine_rounds(
    vertical_t: list[float],
    engine_rounds: list[list[Message]],
    col_rounds: list[tuple[str, list[int]]],
    net: Interconnect,
) -> None:
    """Charge the engine's explicit vertical rounds (all columns at once) to each column."""
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


def _share_host_cores(plan: Plan, net: Interconnect, out: _Vertical) -> None:
    """Columns on one host compute their output deltas at the same time: they share its cores.

    Every member of an allgather column (the leader of a leader column) computes them.
    """
    assert net.hosts is not None
    _, _, l = plan.cost_shape or plan.shape
    load: dict[Any, float] = {}
    for c, col in enumerate(plan.columns):
        s0, s1 = plan.column_samples(c)
        members = [_leader(plan, col)] if out.algorithm[c] == "leader" else list(col)
        for w in members:
            load[net.hosts[w]] = (
                load.get(net.hosts[w], 0.0) + l * (s1 - s0) * net.reduce / net.host_cores
            )
    for c, col in enumerate(plan.columns):
        out.seconds[c] = max(out.seconds[c], max(load.get(net.hosts[w], 0.0) for w in col))


def _horizontal(
    plan: Plan, net: Interconnect, hmode: str, rule: EngineRule | None
) -> tuple[float, list[float], list[tuple[tuple[int, ...], int, str, float]]]:
    """The horizontal exchange: seconds, per band (``bands`` mode), per group (collectives)."""
    n, _, l = plan.cost_shape or plan.shape
    C = plan.n_columns
    per_row = (n + l) * net.itemsize
    if C == 1:
        return 0.0, [], []
    groups_rows = _band_groups(plan) if hmode not in ("pairwise", "bands") else []
    engine: list[str] | None = None
    if hmode == "engine":
        if rule is None:
            raise ValueError('horizontal="engine" needs the engine\'s rule (CostModel.from_config)')
        engine = rule.horizontal_for(C, [(h, r * (n + l)) for h, r in groups_rows])
        hmode = "pairwise" if engine is None else hmode
    if hmode == "pairwise":
        rows = _column_rows(plan)
        if net.classes or (net.hosts is not None and len(set(net.hosts)) > 1):
            return round_seconds(_pairwise_messages(plan, rows, per_row), net)[0], [], []
        return _pairwise_uniform(plan, rows, per_row, net), [], []
    if hmode == "bands":
        by_band = [
            2 * (C - 1) * (net.latency + net.overhead + (b1 - b0) * per_row / net.bandwidth)
            + (C - 1) * (b1 - b0) * (n + l) * net.reduce
            for b0, b1 in plan.bands()
        ]
        return float(sum(by_band)), by_band, []
    load: dict[int, float] = {}
    chain: dict[int, float] = {}
    groups: list[tuple[tuple[int, ...], int, str, float]] = []
    for g, (holders, r) in enumerate(groups_rows):
        link = net.worst_link(holders)
        nbytes = r * per_row
        red = r * (n + l) * net.reduce
        if hmode == "best":
            alg, t = best_collective(C, nbytes, link, net.overhead, red)
        elif engine is not None:  # the engine's choice for this group
            alg = engine[g]
            if net.hosts is not None:
                t = scheduled_seconds(alg, holders, r * (n + l), net)
            else:
                t = collective_seconds(alg, C, nbytes, link, net.overhead, red)
        else:
            alg, t = hmode, collective_seconds(hmode, C, nbytes, link, net.overhead, red)
        lat = collective_seconds(alg, C, 0.0, LinkClass(link.latency, link.bandwidth), 0.0)
        groups.append((holders, r, alg, t))
        for w in holders:  # bandwidth parts add up on the worker's link; latency chains overlap
            load[w] = load.get(w, 0.0) + (t - lat)
            chain[w] = max(chain.get(w, 0.0), lat)
    return max(load[w] + chain[w] for w in load), [], groups


def _fixed_seconds(plan: Plan, net: Interconnect) -> float:
    """Per-iteration fixed cost, plus the workers' own CPU on their most crowded host."""
    fixed = float(net.fixed)
    if net.hosts is not None and net.worker_cpu > 0:
        per_host: dict[Any, int] = {}
        for w in plan.planned_workers:
            per_host[net.hosts[w]] = per_host.get(net.hosts[w], 0) + 1
        fixed += max(per_host.values()) * net.worker_cpu / net.host_cores
    return fixed


def _straggler_seconds(plan: Plan, spread: Sequence[float] | Mapping[Any, float]) -> float:
    """``mean(spread) x E[max of N standard normals]`` over the planned workers."""
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
    return float(np.mean(sig)) * expected_max_normal(len(planned))


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
    network: Interconnect | None = None,
    vertical: str | None = None,
    horizontal: str | None = None,
    spread: Sequence[float] | Mapping[Any, float] | None = None,
    model: CostModel | None = None,
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
        model=model,
    )["total"]
