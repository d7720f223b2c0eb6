"""The EMULATED local cluster: one scheduler and one paced worker per speed.

.. warning::
   EMULATION, not hardware: every worker shares this machine's cores (see
   :mod:`dask_rpm.emulation`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from dask.system import CPU_COUNT
from distributed import Nanny, Scheduler, SpecCluster, Worker

from .._distributed import parse_memory_limit
from ..comm import Interconnect
from ..runtime.closing import quiet_when_closing
from ..runtime.gpus import GPU_RESOURCE
from ..runtime.labels import format_label
from ..runtime.threads import limit_blas
from .gpu import gpu_label, local_gpu_workers, worker_gpu_env
from .links import EmulatedLinks, LinkEmulationPlugin, emulated_links
from .pacing import BLAS_VARS, EmulationPlugin
from .profile import DEFAULT_SPEEDS, auto_scale, check_speed, parse_schedule
from .rate import process_rate
from .settings import EmulationSettings

__all__ = ["EmulatedCluster", "local_cluster"]

logger = logging.getLogger(__name__)


class EmulatedCluster(SpecCluster):
    """A local Dask cluster whose workers run paced kernels at EMULATED speeds.

    Built like :class:`distributed.LocalCluster`: one scheduler and one worker
    (a :class:`~distributed.Nanny` process, or an in-process
    :class:`~distributed.Worker` when ``processes=False``) per speed, named
    ``0 .. N-1`` in the order of ``speeds``, on 127.0.0.1. Use
    :func:`local_cluster` to create one; the parameters are the same.

    Attributes
    ----------
    speeds : tuple of float
        Relative speed of worker ``i`` (at start; see ``schedule``).
    scale_factor : float
        Fraction of a core that speed 1.0 stands for.
    schedule : dict
        Speed changes per worker index.
    threads_per_worker : int
    emulation_label : str
        One line to print with every result obtained on this cluster.
    gpu_devices : dict
        ``{worker index: GPU}`` of the workers that train on a GPU of this
        machine (``gpus=`` of :func:`local_cluster`: the first ones); they
        run REAL, unpaced, and their ``speeds`` entries are not used.
    links : EmulatedLinks or None
        The EMULATED placement on nodes and the delay added per link class
        (``nodes=`` of :func:`local_cluster`); None: one node, nothing delayed.
    nodes, groups : tuple or None
        Node and group label per worker (``links.nodes``, ``links.groups``).

    Notes
    -----
    The set of workers is fixed; ``scale()`` can shrink it but not add
    workers (there would be no speed to give them).
    """

    def __init__(
        self,
        speeds: Sequence[float] | None = None,
        *,
        scale: float | None = None,
        threads_per_worker: int | None = None,
        processes: bool = True,
        schedule: Mapping[int, Sequence[Sequence[Any]]] | None = None,
        dashboard_address: str | None = ":0",
        nodes: Sequence[Any] | None = None,
        groups: Sequence[Any] | None = None,
        links: Mapping[str, Any] | None = None,
        headroom: float | None = None,
        scheduler_kwargs: dict[str, Any] | None = None,
        asynchronous: bool = False,
        loop: Any = None,
        silence_logs: int | bool = logging.WARN,
        name: str | None = None,
        gpus: int | None = None,
        **worker_kwargs: Any,
    ) -> None:
        self.processes = processes
        # rpm.emulation.*, read once here on the client; what the cluster builds gets them
        settings = EmulationSettings.from_config(headroom=headroom, gpus=gpus)
        self._set_profile(speeds, scale, threads_per_worker, settings, schedule, worker_kwargs)
        self.links: EmulatedLinks | None = emulated_links(
            len(self.speeds), nodes, groups, links, settings=settings
        )
        self.emulation_label = self._label()
        if self.links is not None:
            self.emulation_label += "; " + self.links.describe()
        workers = self._worker_specs(silence_logs, worker_kwargs, settings)
        # In-process workers share this process's BLAS: pin it here while the
        # cluster lives (limitation: the client's own numpy is pinned too).
        self._limiter = None if processes else limit_blas(self.threads_per_worker)
        super().__init__(
            scheduler=_scheduler_spec(processes, dashboard_address, scheduler_kwargs),
            workers=workers,
            worker=workers[0],
            asynchronous=asynchronous,
            loop=loop,
            silence_logs=silence_logs,
            name=name,
        )
        quiet_when_closing(
            self
        )  # the scheduler's notices while it closes (dask_rpm.runtime.closing)

    def _set_profile(
        self,
        speeds: Sequence[float] | None,
        scale: float | None,
        threads_per_worker: int | None,
        settings: EmulationSettings,
        schedule: Mapping[int, Sequence[Sequence[Any]]] | None,
        worker_kwargs: Mapping[str, Any],
    ) -> None:
        """Validate speeds, threads, schedule and GPU workers; choose the scale; warn when too small.

        The GPU workers are not paced: each of their threads takes a whole core,
        and the paced workers' scale fits the cores left.
        """
        if speeds is None:
            speeds = settings.speeds or DEFAULT_SPEEDS
        self.speeds: tuple[float, ...] = tuple(check_speed(s) for s in speeds)
        if not self.speeds:
            raise ValueError("need at least one speed")
        t = 1 if threads_per_worker is None else int(threads_per_worker)
        if t < 1:
            raise ValueError("threads_per_worker must be >= 1")
        self.threads_per_worker = t
        self.schedule = self._checked_schedule(schedule)
        self.gpu_devices = local_gpu_workers(
            settings.gpus,
            len(self.speeds),
            processes=self.processes,
            schedule=self.schedule,
            env=worker_kwargs.get("env"),
        )
        paced = [s for i, s in enumerate(self.speeds) if i not in self.gpu_devices]
        self.cores = CPU_COUNT
        self.headroom = settings.headroom
        free = max(1, self.cores - t * len(self.gpu_devices))
        self.scale_factor = (
            auto_scale(paced or [1.0], t, cores=free, headroom=self.headroom)
            if scale is None
            else check_speed(scale, "scale")
        )
        demand = self.scale_factor * t * sum(paced)
        if demand > self.headroom * free + 1e-9:
            logger.warning(
                "EMULATED speeds x scale need %.2f cores, more than headroom %.2f x %d cores%s: "
                "timings will measure contention, not the speed profile",
                demand,
                self.headroom,
                free,
                " (those the GPU workers leave)" if self.gpu_devices else "",
            )

    def _checked_schedule(
        self, schedule: Mapping[int, Sequence[Sequence[Any]]] | None
    ) -> dict[int, list[tuple[Any, ...]]]:
        """The schedule keyed by worker index, validated here in the client, not on a worker."""
        n = len(self.speeds)
        given = dict(schedule or {})
        for i, entries in given.items():
            if not (isinstance(i, int) and 0 <= i < n):
                raise ValueError(f"schedule key {i!r} is not a worker index in 0..{n - 1}")
            parse_schedule(entries)
        return {i: [tuple(e) for e in given[i]] for i in sorted(given)}

    def _label(self) -> str:
        """The one-line label: the EMULATED speeds of the paced workers, the GPU workers REAL."""
        if not self.gpu_devices:
            return format_label(self.speeds, self.scale_factor, "on one machine", self.schedule)
        paced = [s for i, s in enumerate(self.speeds) if i not in self.gpu_devices]
        gpus = gpu_label(self.gpu_devices)
        if not paced:
            return f"REAL, unpaced, no EMULATED worker: {gpus}"
        text = format_label(paced, self.scale_factor, "on one machine", self.schedule)
        first, last = len(self.gpu_devices), len(self.speeds) - 1
        who = f"worker {first}'s" if first == last else f"workers {first}-{last}'s"
        return f"{text}; {gpus}: REAL, unpaced (the speeds are {who})"

    def _worker_specs(
        self, silence_logs: int | bool, worker_kwargs: dict[str, Any], settings: EmulationSettings
    ) -> dict[int, dict[str, Any]]:
        """One SpecCluster worker spec per speed, each with its :class:`EmulationPlugin`."""
        n, t, processes = len(self.speeds), self.threads_per_worker, self.processes
        if "memory_limit" not in worker_kwargs:
            worker_kwargs["memory_limit"] = parse_memory_limit("auto", 1, n, logger=logger)
        extra_env = dict(worker_kwargs.pop("env", None) or {})
        base = dict(
            host="127.0.0.1" if processes else None,
            nthreads=t,
            protocol="tcp://" if processes else "inproc://",
            dashboard=False,
            silence_logs=silence_logs,
            **worker_kwargs,
        )
        # one kernel throughput for all workers: their speeds then differ by exactly their ratios
        fraction = settings.rate_fraction
        self.rates = {dt: fraction * process_rate(dt) for dt in ("float64", "float32")}
        workers: dict[int, dict[str, Any]] = {}
        for i, speed in enumerate(self.speeds):
            device = self.gpu_devices.get(i)
            plugins: tuple[Any, ...] = ()
            if device is None:  # a GPU worker runs REAL: no pacing (.gpu)
                plugins += (
                    EmulationPlugin(
                        speed,
                        self.scale_factor,
                        self.schedule.get(i, ()),
                        index=i,
                        pin_blas=processes,
                        overrun_tolerance=settings.overrun_tolerance,
                        rate=self.rates,
                        rate_fraction=settings.rate_fraction,
                    ),
                )
            if self.links is not None:
                plugins += (LinkEmulationPlugin(self.links),)
            opts = dict(base, plugins=plugins)
            if device is not None:
                opts["resources"] = {**(base.get("resources") or {}), GPU_RESOURCE: 1}
            if processes:
                # set before the worker starts importing numpy (and CUDA reads its GPUs) in the child
                opts["env"] = {**{v: str(t) for v in BLAS_VARS}, **worker_gpu_env(None)}
                opts["env"].update(extra_env)
                if device is not None:
                    opts["env"].update(worker_gpu_env(device))
            workers[i] = {"cls": Nanny if processes else Worker, "options": opts}
        return workers

    def new_worker_spec(self) -> dict[Any, dict[str, Any]]:
        raise ValueError(
            "EmulatedCluster has a fixed set of emulated workers (one per speed); "
            "create a new cluster with more speeds instead of scaling up"
        )

    async def _close(self) -> None:
        try:
            await super()._close()
        finally:
            if self._limiter is not None:
                self._limiter.restore_original_limits()
                self._limiter = None

    def worker_names(self) -> list[str | None]:
        """Worker *addresses* in index order: element ``i`` runs at ``speeds[i]``.

        Returns
        -------
        list of str
            Addresses usable in ``client.submit(..., workers=[addr])``.
            A worker not (yet) running has ``None`` in its place.
        """
        out = []
        for i in range(len(self.speeds)):
            w = self.workers.get(i)
            addr = None
            if w is not None:
                addr = getattr(w, "worker_address", None) if isinstance(w, Nanny) else w.address
            out.append(addr)
        return out

    worker_addresses = worker_names

    @property
    def nodes(self) -> tuple[Any, ...] | None:
        """EMULATED node label of each worker (by index), or None without link emulation."""
        return None if self.links is None else self.links.nodes

    @property
    def groups(self) -> tuple[Any, ...] | None:
        """EMULATED group label of each worker (by index), or None without link emulation."""
        return None if self.links is None else self.links.groups

    def link_network(self, base: Interconnect | None = None) -> Interconnect:
        """The cost model's network for this cluster's EMULATED links (for ``make_plan(network=...)``).

        Parameters
        ----------
        base : Interconnect, optional
            What the loopback itself costs (``rpm.cost.*`` when None); each
            class adds its EMULATED delay to it (:meth:`EmulatedLinks.network`).

        Raises
        ------
        ValueError
            The cluster has no link emulation (no ``nodes=``).
        """
        if self.links is None:
            raise ValueError(
                "this cluster has no EMULATED links; start it with local_cluster(..., nodes=[...])"
            )
        return self.links.network(base)

    @property
    def emulation_metadata(self) -> dict[str, Any]:
        """Plain-data description of the emulation, for results and files."""
        return {
            "emulated": True,
            "label": self.emulation_label,
            "speeds": list(self.speeds),
            "scale": self.scale_factor,
            "threads_per_worker": self.threads_per_worker,
            "schedule": {str(k): [list(e) for e in v] for k, v in self.schedule.items()},
            "headroom": self.headroom,
            "cores": self.cores,
            "processes": self.processes,
            "links": None if self.links is None else self.links.to_dict(),
            "gpus": {str(k): v for k, v in self.gpu_devices.items()},
        }

    def __repr__(self) -> str:
        return f"EmulatedCluster({self.emulation_label!r}, scheduler={self.scheduler_address!r})"


def local_cluster(
    speeds: Sequence[float] | None = None,
    *,
    scale: float | None = None,
    threads_per_worker: int | None = None,
    processes: bool = True,
    schedule: Mapping[int, Sequence[Sequence[Any]]] | None = None,
    dashboard_address: str | None = ":0",
    nodes: Sequence[Any] | None = None,
    groups: Sequence[Any] | None = None,
    links: Mapping[str, Any] | None = None,
    gpus: int | None = None,
    **kwargs: Any,
) -> EmulatedCluster:
    """Start a local cluster with EMULATED heterogeneous worker speeds.

    Not a hardware measurement: all workers share this machine's cores and
    slow workers sleep after each :func:`pace` block.

    Parameters
    ----------
    speeds : sequence of float, optional
        Relative speed of each worker; 0.25 is four times slower than 1.0.
        Worker ``i`` is named ``i``. Default ``rpm.emulation.speeds``,
        (1.0, 0.5, 0.25).
    scale : float, optional
        Fraction of a core that speed 1.0 stands for. Default
        :func:`auto_scale`: as large as possible while
        ``scale * threads_per_worker * sum(speeds) <= headroom * cores`` and
        ``scale <= 1``.
    threads_per_worker : int, optional
        Threads per worker (default 1). BLAS threads are pinned to it.
    processes : bool
        One Nanny process per worker (default) or in-process Workers. In-process
        workers pin this process's BLAS (threadpoolctl) until the cluster closes.
    schedule : dict, optional
        ``{worker_index: [entry, ...]}`` speed changes, to emulate other jobs
        starting on a node. ``(iteration, speed)`` applies from that iteration
        on (as passed to :func:`pace`); ``("t", seconds, speed)`` applies that
        many seconds after the worker's first paced block (or after
        :func:`reset_clock`). The most recent change wins.
    dashboard_address : str or None
        Scheduler dashboard address; ``None`` disables it.
    nodes : sequence, optional
        EMULATED placement: the node label of each worker, e.g. ``[0, 0, 1, 1]``
        (default ``rpm.emulation.nodes``: null, all on one node). Messages
        between workers on different nodes are held back by the delay of
        their link class (:mod:`dask_rpm.emulation.links`); within a node
        nothing is added.
    groups : sequence, optional
        Group label of each worker (needs ``nodes``; the workers of a node
        share one group). Default: every node a group of its own.
    links : mapping, optional
        Added delay per link class: ``{"host" | "group" | "across":
        (latency_s, bandwidth_bytes_per_s)}`` (or a
        :class:`~dask_rpm.comm.LinkClass`, a dict with ``latency`` and
        ``bandwidth``, or None for nothing added); classes not given keep
        ``rpm.emulation.links``. Without ``groups``, messages between nodes
        are ``"across"``.
    gpus : int, optional
        The first ``gpus`` workers (indices ``0 .. gpus-1``) train on a GPU of
        this machine each (default ``rpm.emulation.gpus``: 0, none): the Dask
        resource ``GPU=1`` and ``CUDA_VISIBLE_DEVICES=<its GPU>``, so each sees
        exactly one GPU, as device 0; every other worker sees none
        (``CUDA_VISIBLE_DEVICES=""``). A GPU worker runs REAL, unpaced: its
        ``speeds`` entry is not used (:mod:`dask_rpm.emulation.gpu`). The
        GPUs are those ``CUDA_VISIBLE_DEVICES`` names in this process, else
        all of the machine's (``nvidia-smi -L``, else
        ``torch.cuda.device_count()``); asking for more is a ``ValueError``.
        ``fit(backend="auto")`` trains on the GPUs and on the others' CPUs.
    **kwargs
        ``headroom``, ``scheduler_kwargs``, ``asynchronous``, ``loop``,
        ``silence_logs``, ``name``; anything else goes to every worker
        (e.g. ``memory_limit``, ``env``).

    Returns
    -------
    EmulatedCluster

    Examples
    --------
    >>> from distributed import Client
    >>> cluster = local_cluster((1.0, 0.5, 0.25))  # doctest: +SKIP
    >>> print(cluster.emulation_label)  # doctest: +SKIP
    EMULATED heterogeneity on one machine: speeds 1.0, 0.5, 0.25 x scale 0.914 of a core
    >>> client = Client(cluster)  # doctest: +SKIP

    Two EMULATED nodes of two workers, 5 ms and 20 MB/s added between them:

    >>> cluster = local_cluster([1, 1, 0.5, 0.5], nodes=[0, 0, 1, 1],
    ...                         links={"across": (0.005, 2e7)})  # doctest: +SKIP

    Worker 0 on the machine's first GPU (REAL), workers 1 and 2 EMULATED on its CPUs:

    >>> cluster = local_cluster([1.0, 1.0, 0.5], gpus=1)  # doctest: +SKIP
    """
    return EmulatedCluster(
        speeds,
        scale=scale,
        threads_per_worker=threads_per_worker,
        processes=processes,
        schedule=schedule,
        dashboard_address=dashboard_address,
        nodes=nodes,
        groups=groups,
        links=links,
        gpus=gpus,
        **kwargs,
    )


def _scheduler_spec(
    processes: bool, dashboard_address: str | None, scheduler_kwargs: dict[str, Any] | None
) -> dict[str, Any]:
    """The SpecCluster scheduler spec: on 127.0.0.1 over TCP, or in-process."""
    return {
        "cls": Scheduler,
        "options": dict(
            host="127.0.0.1" if processes else None,
            protocol="tcp://" if processes else "inproc://",
            dashboard=dashboard_address is not None,
            dashboard_address=dashboard_address,
            **(scheduler_kwargs or {}),
        ),
    }
