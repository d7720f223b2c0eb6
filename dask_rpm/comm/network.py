"""The network the seconds model charges: link classes, latency, bandwidth, host limits."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from .. import config

__all__ = [
    "LINK_CLASSES",
    "CostSettings",
    "LinkClass",
    "Interconnect",
    "link_class",
    "network_from_config",
]


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


def link_class(hosts: Sequence[Any] | None, groups: Sequence[Any] | None, i: int, j: int) -> str:
    """The class of the link between workers ``i`` and ``j`` placed on ``hosts`` in ``groups``.

    ``"host"`` (same host, same group), ``"group"`` (same group, or no groups
    known) or ``"across"``; ``None`` for either placement means "not known".
    The one definition of :data:`LINK_CLASSES` that the cost model and the
    EMULATED links (:mod:`dask_rpm.emulation.links`) share.
    """
    same_group = groups is None or groups[i] == groups[j]
    if hosts is not None and hosts[i] == hosts[j] and same_group:
        return "host"
    return "group" if same_group else "across"


class Interconnect(NamedTuple):
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
        return link_class(self.hosts, self.groups, i, j)

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


class CostSettings(NamedTuple):
    """``rpm.cost.*`` read once (:meth:`from_config`), as configured (unchecked): the network's
    defaults and the exchanges the seconds model charges.

    The one place the package reads ``rpm.cost``; :func:`network_from_config` checks the
    network part (:meth:`interconnect`).

    Attributes
    ----------
    latency, bandwidth, itemsize, overhead, fixed
        ``rpm.cost.latency`` ... ``rpm.cost.fixed`` (see :class:`Interconnect`).
    vertical, horizontal
        ``rpm.cost.vertical`` / ``rpm.cost.horizontal``: the exchange algorithms
        :func:`dask_rpm.cost.predict_breakdown` charges.
    """

    latency: float
    bandwidth: float
    itemsize: int
    overhead: float
    fixed: float
    vertical: str
    horizontal: str

    @classmethod
    def from_config(cls, **overrides: Any) -> CostSettings:
        """``rpm.cost.*`` read now, the ``overrides`` (field names) that are not ``None`` winning."""
        c = config.section("cost", **overrides)
        return cls(
            latency=float(c["latency"]),
            bandwidth=float(c["bandwidth"]),
            itemsize=int(c["itemsize"]),
            overhead=float(c["overhead"]),
            fixed=float(c["fixed"]),
            vertical=str(c["vertical"]),
            horizontal=str(c["horizontal"]),
        )

    def interconnect(self) -> Interconnect:
        """The :class:`Interconnect` of these settings (unchecked: :func:`network_from_config`)."""
        return Interconnect(
            latency=self.latency,
            bandwidth=self.bandwidth,
            itemsize=self.itemsize,
            overhead=self.overhead,
            fixed=self.fixed,
        )


def network_from_config(
    network: Interconnect | None = None,
    *,
    latency: float | None = None,
    bandwidth: float | None = None,
    itemsize: int | None = None,
) -> Interconnect:
    """``network`` with explicit keywords applied, else one from ``rpm.cost.*``
    (:class:`CostSettings`, read now); validated."""
    if network is None:
        network = CostSettings.from_config(
            latency=latency, bandwidth=bandwidth, itemsize=itemsize
        ).interconnect()
    else:
        repl: dict[str, Any] = {
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
