"""The probe's asynchronous driver: check, pick workers, kernel probe, link probe, dataset.

:func:`probe_async` is what :func:`dask_rpm.probe.probe` runs through
``client.sync`` and what ``fit(..., abilities="probe")`` awaits.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import xarray as xr

from .. import config
from ..nn.backend import Placement
from ..nn.cnn import ConvLayers
from ..ordering import ordered_workers
from ..plan.partition import PlanError
from ..planners import make_plan
from ..runtime.labels import run_label
from .kernel import (
    MAX_LOOPS,
    PASSES_PER_TARGET,
    TRIM,
    calibrate,
    calibrate_conv,
    conv_units,
    robust_mean,
    t_probe,
)
from .links import link_class_pairs, measure_links, t_round_trip

__all__ = [
    "probe_async",
    "check_args",
    "clean_seconds",
    "ProbeArgs",
    "ProbeSettings",
    "KernelTimes",
]


class ProbeSettings(NamedTuple):
    """``rpm.probe.*`` read once (:meth:`from_config`); the kernel probe's three as configured
    (:func:`check_args` checks them), the link probe's as whole numbers."""

    repeats: int  # timed repetitions after one warm-up
    max_seconds: float  # kernel-probe budget per worker
    target_seconds: float  # wall time of one timed repetition
    link_repeats: int  # tiny and large transfers timed per worker pair
    link_bytes: int  # size of the large transfer
    link_pairs: int  # worker pairs whose links are measured (per class)

    @classmethod
    def from_config(cls, **overrides: Any) -> ProbeSettings:
        """``rpm.probe.*`` read now, the ``overrides`` (field names) that are not ``None`` winning."""
        c = config.section("probe", **overrides)
        return cls(
            repeats=c["repeats"],
            max_seconds=c["max_seconds"],
            target_seconds=c["target_seconds"],
            link_repeats=int(c["link_repeats"]),
            link_bytes=int(c["link_bytes"]),
            link_pairs=int(c["link_pairs"]),
        )


class ProbeArgs(NamedTuple):
    """The probe's checked arguments."""

    shape: tuple[int, int, int]  # (n, m, l) of the job's network
    samples: int  # s, the job's samples
    repeats: int  # timed repetitions per worker
    max_seconds: float  # kernel-probe budget per worker
    target: float  # seconds of one repetition (rpm.probe.target-seconds)


class KernelTimes(NamedTuple):
    """What the kernel probe measured (arrays: one column per worker)."""

    token: str  # names the probe's tasks
    block: tuple[int, int, int, int]  # (n, m_p, l, s_p) of the probe block
    target: float  # seconds one repetition aimed at
    t_pass: float  # seconds of one pass in the client's calibration
    warm_loops: int  # passes of the warm-up repetition
    warm_seconds: np.ndarray  # (worker,) wall seconds of the warm-up
    loops: np.ndarray  # (worker,) passes per timed repetition
    seconds: np.ndarray  # (repeat, worker) wall seconds; NaN where skipped
    cpu: np.ndarray  # (repeat, worker) CPU seconds
    overruns: np.ndarray  # (worker,) EMULATED paced blocks that overran
    overran: np.ndarray  # (repeat, worker) the repetition's EMULATED paced block overran
    work: np.ndarray  # (worker,) work units of one timed repetition
    throughput: np.ndarray  # (worker,) work units per second
    compute_seconds: float  # wall time of the kernel probe


def check_args(shape: Any, samples: Any, repeats: Any, max_seconds: Any, target: Any) -> ProbeArgs:
    """The probe's arguments checked (a ValueError saying what to give otherwise)."""

    def whole(v: Any) -> bool:
        return isinstance(v, (int, np.integer)) and not isinstance(v, bool)

    try:
        dims = tuple(shape)
    except TypeError:
        dims = ()
    if len(dims) != 3 or not all(whole(v) and v >= 1 for v in dims):
        raise ValueError(
            f"shape={shape!r}; give (n, m, l): inputs, hidden units and outputs, "
            f"three whole numbers >= 1"
        )
    if not whole(samples) or samples < 1:
        raise ValueError(
            f"samples={samples!r}; give the number of training samples, a whole number >= 1"
        )
    if not whole(repeats) or repeats < 1:
        raise ValueError(f"repeats={repeats!r}; give a whole number of timed repetitions >= 1")
    for name, v in (("max_seconds", max_seconds), ("probe.target-seconds", target)):
        if not (
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0
        ):
            raise ValueError(f"{name}={v!r}; give a number of seconds > 0")
    n, m, l = (int(v) for v in dims)
    return ProbeArgs((n, m, l), int(samples), int(repeats), float(max_seconds), float(target))


async def _addresses(client: Any, workers: Sequence[str] | None) -> list[str]:
    """The workers to probe, in plan order (checked against the cluster's)."""
    info = await client.scheduler.identity(n_workers=-1)
    known = ordered_workers(info)
    addresses = known if workers is None else list(workers)
    if not addresses:
        raise ValueError(
            "no workers to probe; start some (e.g. dask_rpm.local_cluster()) and retry"
        )
    unknown = [a for a in addresses if a not in info["workers"]]
    if unknown:
        raise ValueError(f"worker(s) {unknown} are not in the cluster; its workers are {known}")
    if len(set(addresses)) != len(addresses):
        raise ValueError(f"workers={addresses} lists a worker more than once")
    return addresses


def _block(
    args: ProbeArgs,
    n_workers: int,
    dtype: str,
    layers: ConvLayers | None = None,
    batch: int | None = None,
) -> tuple[tuple[int, int, int, int], float, float]:
    """``(probe block, repetition target seconds, seconds per pass here)``."""
    (n, m, l), s = args.shape, args.samples
    # Each worker's share of the budget: warm-up plus `repeats` repetitions.
    target = min(args.target, args.max_seconds / (args.repeats + 1))
    if layers is not None:
        rows, s_col = conv_share(layers, n_workers, s if batch is None else min(batch, s))
        s_p, t_pass = calibrate_conv(layers, rows, s_col, dtype, target / PASSES_PER_TARGET)
        return (n, rows, l, s_p), target, t_pass
    m_p, s_p, t_pass = calibrate(
        n, -(-m // n_workers), l, -(-s // n_workers), dtype, target / PASSES_PER_TARGET
    )
    return (n, m_p, l, s_p), target, t_pass


def conv_share(layers: ConvLayers, n_workers: int, samples: int) -> tuple[int, int]:
    """``(plan rows, samples)`` of the rectangle a worker of average speed trains of a CNN.

    The plan is not made yet (it needs the probe), so the share is SRPM's plan for equal
    abilities on one iteration's ``samples`` (a mini-batch's): the column count ``C`` it
    chooses for this network (:attr:`~dask_rpm.nn.cnn.ConvLayers.cost_shape`: few samples and
    heavy weights give tall columns, many samples data parallelism) gives an average worker
    ``ceil(m C / N)`` of the narrowest stage's rows - the matching share of every stage's
    channels - and ``ceil(samples / C)`` samples. A GPU slows on thin channel slices (the
    seed's §5.1), so timing it on its share rather than on whole layers keeps a fast device
    from being given more than it computes at that size. A network SRPM cannot plan for
    ``N`` equal workers falls back on a fair share of one column, ``ceil(m / N)`` rows.
    """
    m, active = layers.m, n_workers
    try:
        plan = make_plan([1.0] * n_workers, layers, samples, method="srpm")
        columns, active = plan.n_columns, len(plan.planned_workers)
    except PlanError:
        columns, active = 1, min(n_workers, m)
    rows = min(m, -(-m * columns // active))
    return rows, max(1, -(-samples // columns))


async def _kernel_probe(
    client: Any,
    addresses: list[str],
    args: ProbeArgs,
    dtype: str,
    placement: Placement,
    layers: ConvLayers | None = None,
    batch: int | None = None,
) -> KernelTimes:
    """Warm-up, then timed repetitions of the probe block on every worker at once."""
    n_workers = len(addresses)
    block, target, t_pass = _block(args, n_workers, dtype, layers, batch)
    loops0 = int(min(MAX_LOOPS, max(1, round(target / t_pass))))
    token = uuid.uuid4().hex[:10]
    name = f"rpm-probe-{token}"

    def submit(rep: int, i: int, loops: int) -> Any:
        return client.submit(
            t_probe,
            block,
            loops,
            dtype,
            rep,
            t_pass,
            placement,
            layers,
            key=(name, rep, i),
            workers=[addresses[i]],
            allow_other_workers=False,
            pure=False,
        )

    # Warm-up (repetition 0, discarded): about a quarter of a target at full speed.
    compute_start = time.perf_counter()
    warm_loops = max(1, loops0 // 4)
    warm_futures = [submit(0, i, warm_loops) for i in range(n_workers)]
    warm_seconds = np.asarray([r[0] for r in await client.gather(warm_futures)], dtype=float)

    # Size every worker's repetition to ~target wall seconds: all workers then
    # run their repetitions side by side, over the same wall-time windows, so
    # a change in the machine's load (which moves the CPU cost of a pass by
    # tens of percent on a shared host) hits them alike. (Equal passes per
    # worker instead spread a slow worker's repetitions over a longer window
    # and measured ratios worse here.)
    per_pass = np.maximum(warm_seconds / warm_loops, 1e-9)
    loops = np.clip(np.round(target / per_pass), 1, MAX_LOOPS).astype(int)
    # A worker too slow for even one pass per target gets fewer repetitions (budget).
    rest = np.maximum(args.max_seconds - warm_seconds, 0.0)
    reps = np.clip(np.floor(rest / (loops * per_pass)), 1, args.repeats).astype(int)

    # All at once: each worker queues its repetitions and runs them back to
    # back (the lock in t_probe), with no scheduler round trip between them.
    timed_futures = [
        [submit(r + 1, i, int(loops[i])) for r in range(int(reps[i]))] for i in range(n_workers)
    ]
    timed = await client.gather(timed_futures)
    compute_seconds = time.perf_counter() - compute_start
    del warm_futures, timed_futures
    empty = np.empty(0)
    measured = KernelTimes(
        token,
        block,
        target,
        t_pass,
        warm_loops,
        warm_seconds,
        loops,
        empty,
        empty,
        empty,
        empty,
        empty,
        empty,
        compute_seconds,
    )
    return _kernel_times(timed, args.repeats, measured)


def _kernel_times(timed: list[list[Any]], repeats: int, k: KernelTimes) -> KernelTimes:
    """``k`` with the timed repetitions' seconds, CPU seconds, overruns, work and throughput."""
    n_workers = len(timed)
    seconds = np.full((repeats, n_workers), np.nan)
    cpu = np.full((repeats, n_workers), np.nan)
    overran = np.zeros((repeats, n_workers), dtype=bool)
    for i, col in enumerate(timed):
        seconds[: len(col), i] = [r[0] for r in col]
        cpu[: len(col), i] = [r[2] for r in col]
        overran[: len(col), i] = [r[1] > 0 for r in col]
    work = k.loops.astype(float) * k.block[1] * k.block[3]
    return k._replace(
        seconds=seconds,
        cpu=cpu,
        overruns=overran.sum(axis=0),
        overran=overran,
        work=work,
        throughput=work / robust_mean(clean_seconds(seconds, overran), TRIM),
    )


def clean_seconds(seconds: np.ndarray, overran: np.ndarray) -> np.ndarray:
    """``seconds`` with a worker's overrun repetitions set to NaN, if at least half stay.

    An EMULATED worker's repetition whose paced block overran its target was
    timed by the host's other load, not by the emulated speed: a loaded
    2-core host made the fast worker's blocks overrun and moved the measured
    ratios of a tiny job by 10-40 %. Dropping those repetitions removes that
    bias. A worker with more overruns than clean repetitions keeps them all:
    then the load *is* its speed, and the ``overruns`` count says so. Without
    emulation nothing overruns and nothing is dropped.
    """
    out = seconds.copy()
    for i in range(seconds.shape[1]):
        finite = np.isfinite(seconds[:, i])
        clean = finite & ~overran[:, i]
        if clean.sum() * 2 >= finite.sum():
            out[~clean, i] = np.nan
    return out


async def _link_probe(
    client: Any,
    addresses: list[str],
    token: str,
    groups: Sequence[Any] | None,
    settings: ProbeSettings,
) -> dict[str, Any]:
    """Latency and bandwidth overall and, with ``groups``, per link class."""
    repeats, big_bytes = settings.link_repeats, settings.link_bytes
    per_class = settings.link_pairs
    links = await measure_links(
        client, addresses, token, repeats=repeats, big_bytes=big_bytes, pairs=per_class
    )
    if len(addresses) > 1:  # one way = half a round trip of a small worker-to-worker message
        rtt = await client.run(t_round_trip, addresses[1], 20, workers=[addresses[0]])
        links["message_latency"] = float(rtt[addresses[0]]) / 2
    if groups is None:
        return links
    # latency and bandwidth per link class, a few pairs each
    for cls, pairs in link_class_pairs(addresses, list(groups), per_class).items():
        got = await measure_links(
            client,
            addresses,
            f"{token}-{cls}",
            repeats=repeats,
            big_bytes=big_bytes,
            pairs=len(pairs),
            links=pairs,
        )
        links.update(
            {
                f"latency_{cls}": got["latency"],
                f"bandwidth_{cls}": got["bandwidth"],
                f"links_{cls}": got.get("links", ""),
            }
        )
    links["groups"] = ",".join(map(str, groups))
    return links


def _variables(k: KernelTimes) -> dict[str, Any]:
    """The data variables of the probe's dataset, with their units and meaning."""
    return {
        "throughput": (
            "worker",
            k.throughput,
            {
                "units": "work units/s",
                "long_name": "kernel throughput",
                "description": "work of one repetition / trimmed mean of the repetition seconds "
                "(1/8 cut at each end; EMULATED repetitions that overran left out when at "
                "least half did not); one work unit "
                "is one (hidden unit x sample) pair of forward, output delta and "
                "backward - the unit of rectangle area (a CNN: one plan row x sample, the "
                "row's channels of every stage)",
            },
        ),
        "ability": (
            "worker",
            k.throughput / k.throughput.sum(),
            {"units": "1", "description": "throughput normalised to sum 1"},
        ),
        "seconds": (
            ("repeat", "worker"),
            k.seconds,
            {
                "units": "s",
                "description": "wall time of each timed repetition's paced kernel block, measured "
                "inside the task (NaN: skipped to stay within max_seconds)",
            },
        ),
        "cpu_seconds": (
            ("repeat", "worker"),
            k.cpu,
            {
                "units": "s",
                "description": "CPU time of the task's thread in each timed repetition's kernel "
                "block (with EMULATED speeds, seconds ~ cpu_seconds / speed)",
            },
        ),
        "warmup_seconds": (
            "worker",
            k.warm_seconds,
            {
                "units": "s",
                "description": f"discarded warm-up repetition ({k.warm_loops} passes)",
            },
        ),
        "loops": (
            "worker",
            k.loops,
            {"units": "1", "description": "kernel passes over the probe block per repetition"},
        ),
        "overruns": (
            "worker",
            k.overruns,
            {
                "units": "1",
                "description": "EMULATED clusters only: timed repetitions whose paced block "
                "overran its target, i.e. other load set the time (0 elsewhere)",
            },
        ),
        "overran": (
            ("repeat", "worker"),
            k.overran,
            {
                "units": "1",
                "description": "EMULATED clusters only: this repetition's paced block overran "
                "its target (left out of the throughput when at least half the worker's "
                "repetitions did not)",
            },
        ),
        "work": (
            "worker",
            k.work,
            {
                "units": "work units",
                "description": "loops x block hidden units x block samples",
            },
        ),
    }


def _dataset(
    k: KernelTimes,
    args: ProbeArgs,
    addresses: list[str],
    dtype: str,
    links: dict[str, Any],
    link_seconds: float,
) -> xr.Dataset:
    """The probe result (see :func:`dask_rpm.probe.probe` for what it holds)."""
    return xr.Dataset(
        _variables(k),
        coords={
            "worker": np.arange(len(addresses)),
            "address": ("worker", np.asarray(addresses, dtype=object)),
            "repeat": np.arange(args.repeats),
        },
        attrs={
            "title": "dask_rpm probe: worker throughput and links",
            "token": k.token,
            "shape": "-".join(map(str, args.shape)),
            "samples": args.samples,
            "block_inputs": args.shape[0],
            "block_hidden": k.block[1],
            "block_outputs": args.shape[2],
            "block_samples": k.block[3],
            "dtype": dtype,
            "repeats": args.repeats,
            "target_seconds": k.target,
            "calibration_pass_seconds": k.t_pass,
            "compute_seconds": k.compute_seconds,
            "link_seconds": link_seconds,
            "latency_units": "s",
            "bandwidth_units": "bytes/s",
            **links,
        },
    )


async def probe_async(
    client: Any,
    *,
    shape: Sequence[int],
    samples: int,
    dtype: str | None = None,
    workers: Sequence[str] | None = None,
    repeats: int | None = None,
    max_seconds: float | None = None,
    groups: Sequence[Any] | None = None,
    placement: Placement | None = None,
    layers: ConvLayers | None = None,
    batch: int | None = None,
) -> xr.Dataset:
    """Asynchronous :func:`dask_rpm.probe.probe` (same parameters, an asynchronous client).

    ``fit(..., abilities="probe")`` awaits it, with the run's ``placement`` (backend and device
    names, :class:`dask_rpm.nn.backend.Placement`; None: ``rpm.engine.backend`` / ``device``, as
    ``fit`` would): each worker is measured where it will train. A run training a CNN passes its
    ``layers`` (``shape`` is then their ``plan_shape``) and ``batch`` (its mini-batch, None: all
    samples): each worker runs that network's kernels on the rectangle an average worker will
    train (:func:`conv_share`).
    """
    started = time.perf_counter()
    settings = ProbeSettings.from_config(repeats=repeats, max_seconds=max_seconds)
    args = check_args(
        shape, samples, settings.repeats, settings.max_seconds, settings.target_seconds
    )
    dtype = str(np.dtype(config.get("train.dtype", dtype)))
    addresses = await _addresses(client, workers)
    if groups is not None:  # one label per worker: refused before anything runs
        link_class_pairs(addresses, list(groups), settings.link_pairs)
    if layers is not None and tuple(args.shape) != layers.plan_shape:
        raise ValueError(
            f"shape={tuple(args.shape)} but the network's plan shape is {layers.plan_shape}; "
            f"give shape=layers.plan_shape"
        )
    k = await _kernel_probe(
        client, addresses, args, dtype, placement or Placement.of(), layers, batch
    )
    link_start = time.perf_counter()
    links = await _link_probe(client, addresses, k.token, groups, settings)
    ds = _dataset(k, args, addresses, dtype, links, time.perf_counter() - link_start)
    if layers is not None:  # the channels each worker was timed on, stage by stage
        ds.attrs["network"] = "cnn"
        ds.attrs["block_channels"] = ",".join(map(str, conv_units(layers, k.block[1])))
    emulation = await run_label(client)
    if emulation:
        ds.attrs["emulation"] = emulation
    ds.attrs["probe_seconds"] = time.perf_counter() - started
    return ds
