"""EMULATED link classes: added delay on messages between emulated "nodes".

.. warning::
   EMULATION, not hardware: all workers talk over this machine's loopback.
   A message between workers placed on different emulated nodes is held back
   by ``latency + bytes / bandwidth`` of its link class before it is written;
   the delay is *added* to whatever the loopback itself costs.

:func:`local_cluster(..., nodes=..., groups=..., links=...) <dask_rpm.local_cluster>`
places worker ``i`` on node ``nodes[i]`` (and group ``groups[i]``) and gives
every worker a :class:`LinkEmulationPlugin`. The class of a link follows
:meth:`dask_rpm.comm.Interconnect.link_class`: ``"host"`` (same node), ``"group"``
(same group, other node), ``"across"`` (other group). Without ``groups``
every node is a group of its own, so messages between nodes are
``"across"`` - the class :func:`dask_rpm.probe` reports for
``groups=cluster.nodes``.

What is delayed (on the sending worker, without blocking its event loop):

* the engine's worker-to-worker messages (``rpm_put``: the plugin sets the
  worker's ``before_send`` hook, :mod:`dask_rpm.runtime.hooks`, which
  :meth:`dask_rpm.engine.worker.RunState.send` awaits), first in first out per
  peer: a later message to the same peer never overtakes an earlier one;
* Dask's worker-to-worker data transfers (the ``get_data`` handler that serves
  a task's dependency to another worker), which is what the link probe
  (:mod:`dask_rpm.probe.links`) times.

Messages from or to the scheduler and the client are not delayed. A peer is
identified by its worker *name* (the index of ``local_cluster``'s speeds),
looked up from its address through the scheduler once and cached, so a
restarted worker (new address, same name) keeps its node. An address whose
worker name is not in the placement (a worker added by other means) counts
as a node of its own in a group of its own: ``"across"``, the slowest class.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from distributed.diagnostics.plugin import WorkerPlugin

from ..comm import LINK_CLASSES, Interconnect, LinkClass, link_class, network_from_config
from ..runtime.hooks import worker_hooks
from .settings import EmulationSettings

__all__ = [
    "LINKS_PLUGIN_NAME",
    "EmulatedLinks",
    "LinkEmulationPlugin",
    "emulated_links",
]

logger = logging.getLogger(__name__)

#: Name of the worker plugin that delays messages between emulated nodes.
LINKS_PLUGIN_NAME = "rpm-links"


class EmulatedLinks(NamedTuple):
    """Where the EMULATED workers are and what a message between them costs extra.

    Attributes
    ----------
    nodes : tuple
        Node label of worker ``i`` (by the index of ``local_cluster``'s speeds).
    groups : tuple
        Group label of worker ``i`` (every node a group of its own when not given).
    classes : mapping of str to LinkClass
        Delay *added* to one message of each class (``"host"``, ``"group"``,
        ``"across"``): ``latency`` seconds plus ``bytes / bandwidth``.
    """

    nodes: tuple[Any, ...]
    groups: tuple[Any, ...]
    classes: Mapping[str, LinkClass]

    def link_class(self, i: int | None, j: int | None) -> str:
        """The class of the link between workers ``i`` and ``j`` (``None``: not placed -> ``"across"``)."""
        if i is None or j is None or not (0 <= i < len(self.nodes) and 0 <= j < len(self.nodes)):
            return "across"
        return link_class(self.nodes, self.groups, i, j)

    def seconds(self, cls: str, nbytes: int) -> float:
        """Added delay of one message of ``nbytes`` bytes over a link of class ``cls``."""
        link = self.classes[cls]
        return link.latency + (nbytes / link.bandwidth if math.isfinite(link.bandwidth) else 0.0)

    def network(self, base: Interconnect | None = None) -> Interconnect:
        """The cost model's :class:`~dask_rpm.comm.Interconnect` for this placement.

        Each class costs the ``base`` link (``rpm.cost.*`` when ``None``: what
        the loopback itself costs) plus the emulated delay: latencies add,
        bandwidths combine like resistors in series. ``hosts`` are the nodes
        and ``groups`` the groups, by worker index (= plan index of
        :func:`dask_rpm.ordered_workers` on the cluster).
        """
        net = network_from_config(base)
        classes = {}
        for name, added in self.classes.items():
            bw = net.bandwidth
            if math.isfinite(added.bandwidth):
                bw = 1.0 / (1.0 / net.bandwidth + 1.0 / added.bandwidth)
            classes[name] = LinkClass(net.latency + added.latency, bw)
        return net._replace(classes=classes, hosts=self.nodes, groups=self.groups)

    def describe(self) -> str:
        """One line for the EMULATED label: placement and the added delay per class."""
        parts = []
        for name in LINK_CLASSES:
            c = self.classes[name]
            if c.latency == 0 and math.isinf(c.bandwidth):
                parts.append(f"{name} +0")
            else:
                bw = "" if math.isinf(c.bandwidth) else f" + bytes / {c.bandwidth / 1e6:.4g} MB/s"
                parts.append(f"{name} +{c.latency * 1e3:.4g} ms{bw}")
        where = f"nodes {','.join(map(str, self.nodes))}"
        if self.groups != self.nodes:
            where += f", groups {','.join(map(str, self.groups))}"
        return f"EMULATED links ({where}): added per message {'; '.join(parts)}"

    def to_dict(self) -> dict[str, Any]:
        """Plain data for result files."""
        return {
            "nodes": list(self.nodes),
            "groups": list(self.groups),
            "classes": {
                k: {"latency": v.latency, "bandwidth": v.bandwidth} for k, v in self.classes.items()
            },
        }


def _link_class(name: str, value: Any) -> LinkClass:
    """One class's added delay from a LinkClass, a ``(latency, bandwidth)`` pair, a dict or None."""
    if value is None:
        return LinkClass(0.0, math.inf)
    try:
        if isinstance(value, Mapping):
            unknown = set(value) - {"latency", "bandwidth"}
            if unknown:
                raise ValueError(f"unknown keys {sorted(unknown)}")
            lat, bw = float(value.get("latency", 0.0)), float(value.get("bandwidth", math.inf))
        else:
            lat, bw = (float(v) for v in value)
    except (TypeError, ValueError) as exc:
        raise ValueError(
            f"link class {name!r}: got {value!r} ({exc}); give (latency seconds, bandwidth "
            f"bytes/s), {{'latency': ..., 'bandwidth': ...}} or None for no added delay"
        ) from None
    if not (math.isfinite(lat) and lat >= 0):
        raise ValueError(
            f"link class {name!r}: latency must be a finite number of seconds >= 0, got {lat!r}"
        )
    if not (bw > 0):
        raise ValueError(
            f"link class {name!r}: bandwidth must be > 0 bytes/s (inf: no bandwidth term), got {bw!r}"
        )
    return LinkClass(lat, bw)


def _labels(what: str, labels: Sequence[Any], n: int, example: str) -> tuple[Any, ...]:
    if isinstance(labels, (str, bytes)) or not isinstance(labels, Sequence):
        raise ValueError(
            f"{what} must be a list with one label per worker, e.g. {example}; got {labels!r}"
        )
    out = tuple(labels)
    if len(out) != n:
        raise ValueError(
            f"{what} has {len(out)} labels for {n} workers ({what}={list(out)}); give one label "
            f"per worker, in the order of the speeds, e.g. {example}"
        )
    return out


def emulated_links(
    n_workers: int,
    nodes: Sequence[Any] | None = None,
    groups: Sequence[Any] | None = None,
    links: Mapping[str, Any] | None = None,
    *,
    settings: EmulationSettings | None = None,
) -> EmulatedLinks | None:
    """Validated placement and link classes for ``n_workers`` EMULATED workers; None without nodes.

    Parameters
    ----------
    n_workers : int
        Number of workers (``len(speeds)``).
    nodes : sequence, optional
        Node label per worker; ``None`` reads ``rpm.emulation.nodes`` (null:
        all workers on one node, nothing delayed).
    groups : sequence, optional
        Group label per worker (workers of one node in one group); ``None``:
        every node is a group of its own.
    links : mapping, optional
        Added delay per class name (``"host"``, ``"group"``, ``"across"``):
        a :class:`~dask_rpm.comm.LinkClass`, ``(latency, bandwidth)``,
        ``{"latency": s, "bandwidth": bytes_per_s}`` or None (no delay).
        Classes not given keep ``rpm.emulation.links``.
    settings : EmulationSettings, optional
        ``rpm.emulation.*`` as the caller read them; ``None`` reads them now.

    Raises
    ------
    ValueError
        Wrong number of labels, a node in two groups, an unknown class name,
        a negative latency or a bandwidth that is not positive.
    """
    if settings is None:
        settings = EmulationSettings.from_config()
    if nodes is None:
        nodes = settings.nodes
    if nodes is None:
        if groups is not None or links:
            raise ValueError(
                "groups= and links= need nodes=: without nodes every EMULATED worker is on one "
                "node and no message is delayed; give nodes=[...] with one node label per worker"
            )
        return None
    nodes_t = _labels("nodes", nodes, n_workers, "nodes=[0, 0, 1, 1]")
    groups_t = (
        nodes_t
        if groups is None
        else _labels("groups", groups, n_workers, "groups=['a', 'a', 'b', 'b']")
    )
    seen: dict[Any, Any] = {}
    for node, group in zip(nodes_t, groups_t):
        if seen.setdefault(node, group) != group:
            raise ValueError(
                f"node {node!r} is in groups {seen[node]!r} and {group!r}; every worker of a node "
                f"must be in the node's one group"
            )
    given = dict(links or {})
    unknown = [k for k in given if k not in LINK_CLASSES]
    if unknown:
        raise ValueError(
            f"unknown link class(es) {unknown}; the classes are {', '.join(LINK_CLASSES)} "
            f"(same node, same group on another node, across groups)"
        )
    defaults = dict(settings.links)
    classes = {
        name: _link_class(name, given[name] if name in given else defaults.get(name))
        for name in LINK_CLASSES
    }
    return EmulatedLinks(nodes_t, groups_t, classes)


class LinkEmulationPlugin(WorkerPlugin):
    """Holds back messages to workers on other EMULATED nodes (``"rpm-links"``).

    Parameters
    ----------
    links : EmulatedLinks
        The placement of every worker and the added delay per class.

    Attributes
    ----------
    index : int or None
        This worker's place in the placement (its name), None when not placed.
    sent : dict
        Messages delayed per class (``{"host": n, ...}``, host messages are
        counted though not delayed) and ``seconds``: the delay added in total.
    """

    name = LINKS_PLUGIN_NAME

    def __init__(self, links: EmulatedLinks) -> None:
        self.links = links
        self._init_runtime()

    def _init_runtime(self) -> None:
        self.worker: Any = None
        self.index: int | None = None
        self.sent: dict[str, float] = {name: 0 for name in LINK_CLASSES}
        self.sent["seconds"] = 0.0
        self._peers: dict[str, int | None] = {}  # address -> worker index (None: not placed)
        self._lookup: asyncio.Future | None = None
        self._tail: dict[str, asyncio.Future] = {}  # the last message to each peer still held
        self._nic_free = 0.0  # loop time when this worker's outgoing link to other nodes is free
        self._get_data: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {"links": self.links}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_runtime()

    def setup(self, worker: Any) -> None:
        self.worker = worker
        self.index = _index(worker.name, len(self.links.nodes))
        self._get_data = worker.handlers.get("get_data")
        if self._get_data is not None:
            worker.handlers["get_data"] = self._delayed_get_data(self._get_data)
        worker_hooks(worker).before_send = self.delay  # the engine's messages wait their link
        logger.info(
            "EMULATED links on worker %s: node %r",
            worker.name,
            None if self.index is None else self.links.nodes[self.index],
        )

    def teardown(self, worker: Any) -> None:
        worker_hooks(worker).before_send = None
        if self._get_data is not None:
            worker.handlers["get_data"] = self._get_data
            self._get_data = None

    def _delayed_get_data(self, original: Any) -> Any:
        """``get_data`` that first waits the link delay to the requesting worker (``who``)."""

        async def get_data(
            comm: Any, keys: Any, who: str | None = None, serializers: Any = None
        ) -> Any:
            tasks = self.worker.state.tasks
            nbytes = sum(int(tasks[k].nbytes or 0) for k in keys if k in tasks)
            await self.delay(who, nbytes)
            return await original(comm, keys=keys, who=who, serializers=serializers)

        return get_data

    async def delay(self, peer: str | None, nbytes: int) -> float:
        """Wait the EMULATED delay of a message of ``nbytes`` bytes to ``peer``; the seconds added.

        ``peer`` None (the scheduler or a client asking) is not delayed.
        Messages to one peer leave in the order :meth:`delay` was called.
        The bandwidth term is serialised per sending worker, as over one
        network card: a message to another node starts its ``bytes /
        bandwidth`` when the previous one to another node has finished, then
        arrives ``latency`` later (latencies overlap). So a worker sending to
        many peers on other nodes pays for all its bytes, as the cost model
        charges it (``bytes out / bandwidth`` per worker and round).
        """
        if peer is None:
            return 0.0
        loop = asyncio.get_running_loop()
        start = loop.time()
        known = peer in self._peers
        if known:  # the common case: no await at all for a message that is not delayed
            cls = self.links.link_class(self.index, self._peers[peer])
            if self.links.seconds(cls, nbytes) == 0.0 and peer not in self._tail:
                self.sent[cls] += 1
                return 0.0
        # take the peer's place in line before any await, so the order is the call order
        before = self._tail.get(peer)
        mine = loop.create_future()
        self._tail[peer] = mine
        try:
            if not known:
                await self._resolve(peer)
            cls = self.links.link_class(self.index, self._peers.get(peer))
            seconds = self.links.seconds(cls, nbytes)
            self.sent[cls] += 1
            self.sent["seconds"] += seconds
            wait = 0.0
            if seconds > 0:
                link = self.links.classes[cls]
                # one outgoing link: this message's bytes go after those already queued
                self._nic_free = max(start, self._nic_free) + (seconds - link.latency)
                wait = self._nic_free + link.latency - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            if before is not None and not before.done():
                await asyncio.wait([before])  # (not `await before`: a cancel would cancel it too)
            return seconds
        finally:
            if not mine.done():
                mine.set_result(None)
            if self._tail.get(peer) is mine:
                del self._tail[peer]

    async def _resolve(self, peer: str) -> None:
        """Learn ``peer``'s worker index from the scheduler (one request serves every waiter)."""
        if self._lookup is None or self._lookup.done():
            self._lookup = asyncio.ensure_future(self._ask_scheduler())
        await asyncio.wait([self._lookup])
        if peer not in self._peers:
            self._peers[peer] = None  # not a worker the placement knows: "across"
            logger.info(
                "EMULATED links: %s is not a placed worker; its links count as across", peer
            )

    async def _ask_scheduler(self) -> None:
        try:
            info = await self.worker.scheduler.identity(n_workers=-1)
        except Exception as exc:  # the scheduler is gone: the peers stay unplaced ("across")
            logger.warning("EMULATED links: could not ask the scheduler for worker names: %s", exc)
            return
        n = len(self.links.nodes)
        for address, ws in info.get("workers", {}).items():
            self._peers[address] = _index(ws.get("name"), n)


def _index(name: Any, n: int) -> int | None:
    """A worker name as an index into the placement (``0``, ``"3"``), or None."""
    try:
        i = int(name)
    except (TypeError, ValueError):
        return None
    return i if 0 <= i < n and str(i) == str(name) else None
