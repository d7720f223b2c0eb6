"""The probe's public face: :func:`probe` (synchronous or awaitable) and :func:`probe_network`."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import xarray as xr
from distributed import get_client

from ..comm import LINK_CLASSES, Interconnect, LinkClass, network_from_config
from .driver import ProbeSettings, check_args, probe_async
from .links import host

__all__ = ["probe", "probe_network"]


def probe(
    client: Any = None,
    *,
    shape: Sequence[int],
    samples: int,
    dtype: str | None = None,
    workers: Sequence[str] | None = None,
    repeats: int | None = None,
    max_seconds: float | None = None,
    groups: Sequence[Any] | None = None,
    layers: Any = None,
    batch: int | None = None,
) -> Any:
    """Measure every worker's BP throughput and the worker-to-worker links.

    Runs the real kernels on a block shaped like the job's rectangles on all
    workers at once, then times a few transfers between workers (see the
    module docstring for how, and why that way).

    Parameters
    ----------
    client : distributed.Client, optional
        Default :func:`distributed.get_client`. With an asynchronous client
        the result is an awaitable.
    shape : (int, int, int)
        The job's network ``(n, m, l)``: inputs, hidden units, outputs.
    samples : int
        The job's number of training samples ``s``.
    dtype : str, optional
        Kernel dtype; default ``rpm.train.dtype``.
    workers : sequence of str, optional
        Addresses to probe, in plan order; default all workers in
        :func:`dask_rpm.ordered_workers` order.
    repeats : int, optional
        Timed repetitions after one warm-up; default ``rpm.probe.repeats``.
    max_seconds : float, optional
        Kernel-probe budget per worker; default ``rpm.probe.max-seconds``.
    groups : sequence, optional
        A group label per worker (a SLURM group/partition, or an emulated
        node): links are then also measured per class - same host, same
        group, across groups - on up to ``rpm.probe.link-pairs`` pairs each
        (:func:`link_class_pairs`), into attributes ``latency_<class>`` and
        ``bandwidth_<class>``; :func:`probe_network` turns them into a
        :class:`dask_rpm.comm.Interconnect` for the model and ``srpm-time``.
    layers : ConvLayers, optional
        A CNN's geometry (:func:`dask_rpm.nn.cnn_records.conv_layers`; ``shape`` is then its
        ``plan_shape``): every worker is timed on that network's kernels, on the share of every
        stage's channels and the samples an average worker will train
        (:func:`dask_rpm.probe.driver.conv_share`); throughput stays in work units (plan rows x
        samples) per second.
    batch : int, optional
        The run's mini-batch (with ``layers``): the samples of one iteration.

    Returns
    -------
    xarray.Dataset
        Indexed by ``worker`` (0..N-1, with coordinate ``address``):
        ``throughput`` (work units/s; index-aligned abilities), ``ability``
        (normalised), ``seconds`` and ``cpu_seconds`` (repeat, worker),
        ``warmup_seconds``, ``loops``, ``work``, ``overruns`` (EMULATED
        blocks that other load made late) and ``overran`` (repeat, worker:
        which; left out of the throughput while at least half of a worker's
        repetitions are on time). Attributes: the probe block (``block_hidden``,
        ``block_samples``, ...), ``probe_seconds`` (total wall time of the
        probe), ``latency`` (s) and ``bandwidth`` (bytes/s) with the ``links``
        measured (NaN and a ``link_note`` with one worker), and ``emulation``
        when the cluster emulates speeds.

    Raises
    ------
    ValueError
        Malformed ``shape``, ``samples`` < 1, bad ``repeats`` /
        ``max_seconds``, or unknown workers.

    Examples
    --------
    >>> from distributed import Client
    >>> import dask_rpm
    >>> client = Client(dask_rpm.local_cluster([1.0, 0.5, 0.25]))  # doctest: +SKIP
    >>> ds = probe(client, shape=(203, 80, 26), samples=1024)  # doctest: +SKIP
    >>> ds["throughput"] / ds["throughput"].max()  # doctest: +SKIP
    """
    # validate before looking for a client: bad input fails fast and clearly
    settings = ProbeSettings.from_config(repeats=repeats, max_seconds=max_seconds)
    check_args(shape, samples, settings.repeats, settings.max_seconds, settings.target_seconds)
    if client is None:
        client = get_client()
    if groups is not None and workers is not None and len(groups) != len(workers):
        raise ValueError(
            f"{len(groups)} group labels given for {len(workers)} workers; give one per worker"
        )
    return client.sync(
        probe_async,
        client,
        shape=shape,
        samples=samples,
        dtype=dtype,
        workers=workers,
        repeats=repeats,
        max_seconds=max_seconds,
        groups=groups,
        layers=layers,
        batch=batch,
    )


def probe_network(ds: xr.Dataset, *, overhead: float | None = None) -> Interconnect:
    """A :class:`dask_rpm.comm.Interconnect` from a probe result: latency, bandwidth and link classes.

    Hosts come from the worker addresses, groups from the probe's ``groups``
    (when it measured link classes). Classes the probe did not measure fall
    back to the overall latency and bandwidth. ``overhead`` (seconds per
    message end) defaults to ``rpm.cost.overhead``.
    """
    a = ds.attrs
    base = network_from_config()
    # the engine's messages go worker to worker (rpm_put), not as task dependencies: their
    # latency is the small-message one, where the probe measured it
    lat = float(a.get("message_latency", a.get("latency", math.nan)))
    bw = float(a.get("bandwidth", math.nan))
    classes = {}
    for cls in LINK_CLASSES:
        lc, bc = (
            float(a.get(f"latency_{cls}", math.nan)),
            float(a.get(f"bandwidth_{cls}", math.nan)),
        )
        if math.isfinite(lc) and math.isfinite(bc) and bc > 0:
            classes[cls] = LinkClass(lc, bc)
    addresses = [str(v) for v in ds["address"].values]
    groups = tuple(str(a["groups"]).split(",")) if a.get("groups") else None
    return base._replace(
        latency=lat if math.isfinite(lat) else base.latency,
        bandwidth=bw if math.isfinite(bw) and bw > 0 else base.bandwidth,
        overhead=base.overhead if overhead is None else float(overhead),
        classes=classes or None,
        hosts=tuple(host(x) for x in addresses) if classes else None,
        groups=groups,
    )
