"""The first plan of a run: wait for workers, probe when asked, bind a mapping to addresses."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from ..drpm.settings import DRPMSettings
from ..nn.cnn import ConvLayers, is_conv
from ..nn.prepare import Prepared
from ..plan.partition import Plan, PlanError
from ..planners import make_plan
from ..probe import probe_async, probe_network
from .driver import ordered_workers
from .errors import TrainingError
from .options import RunOptions

logger = logging.getLogger("dask_rpm")


__all__ = ["first_plan", "resolve_plan", "resumed_plan", "wait_for_workers"]


def resolve_plan(
    mapping: Any,
    abilities: Any,
    *,
    addresses: list[str],
    shape: tuple[int, int, int] | ConvLayers,
    samples: int,
    batch: int | None = None,
    rates: list[float] | None = None,
    network: Any = None,
    cost_shape: tuple[int, int, int] | None = None,
    idle: bool | None = None,
    min_gain: float | None = None,
) -> Plan:
    """Turn ``mapping`` (a method name or a Plan) into a plan bound to worker addresses.

    ``rates`` (work units per second) and ``network``: measured by the probe, for the planners
    that minimise predicted seconds (``srpm-time``), and for any planner with ``idle=True``
    (DRPM's first plan: workers whose messages cost more than their share saves stay idle);
    the others ignore them; ``min_gain`` is the idle choice's (None: ``rpm.drpm.min-gain``).
    ``shape``: ``(n, m, l)``, or a CNN's :class:`~dask_rpm.nn.cnn.ConvLayers` (planned on its
    ``plan_shape``, priced with its ``cost_shape`` and its flop: :func:`make_plan`)."""
    if not isinstance(mapping, Plan):
        abilities = [1.0] * len(addresses) if abilities is None else list(abilities)
        if len(abilities) != len(addresses):
            raise PlanError(
                f"{len(abilities)} abilities given for {len(addresses)} workers; give one per worker "
                f"(in the order of dask_rpm.ordered_workers)"
            )
        method = "grid-hrev" if str(mapping) == "grid" else str(mapping)
        return make_plan(
            abilities,
            shape,
            samples,
            method=method,
            workers=addresses,
            batch=batch,
            rates=rates,
            network=network,
            cost_shape=cost_shape,
            idle=idle,
            min_gain=_min_gain(min_gain) if idle else None,
        )
    plan = mapping
    if plan.workers is not None:
        missing = [a for a in plan.workers if a not in addresses]
        if missing:
            raise PlanError(
                f"the plan names worker(s) {missing} that the cluster does not have; "
                f"cluster workers are {addresses}"
            )
    elif len(plan.abilities) > len(addresses):
        raise PlanError(
            f"the plan needs {len(plan.abilities)} workers but the cluster has {len(addresses)}; "
            f"start more workers or plan for fewer"
        )
    else:
        plan = plan.with_workers(addresses[: len(plan.abilities)])
    if is_conv(shape):
        shape = shape.plan_shape
    if plan.shape != shape or plan.samples != samples:
        raise PlanError(
            f"the plan is for n-m-l {'-'.join(map(str, plan.shape))} and {plan.samples} samples; "
            f"the data and network are {'-'.join(map(str, shape))} with {samples} samples"
        )
    return plan.validate()


def _min_gain(given: float | None) -> float:
    """The gain an idle choice must bring: ``given``, else ``rpm.drpm.min-gain``."""
    return DRPMSettings.from_config().min_gain if given is None else given


async def wait_for_workers(client: Any, min_workers: int, timeout: float) -> dict[str, Any]:
    """Scheduler identity once ``min_workers`` workers are connected (``timeout`` seconds at most:
    ``rpm.train.wait-workers``)."""
    t0 = time.monotonic()
    deadline, said, last = t0 + timeout, None, -1
    while True:
        info = await client.scheduler.identity(n_workers=-1)
        have = len(info.get("workers", {}))
        if have >= min_workers:
            if said is not None:
                logger.warning(
                    f"fit: {have} workers connected after {time.monotonic() - t0:.0f} s; starting"
                )
            return info
        now = time.monotonic()
        if now > deadline:
            raise TrainingError(
                f"only {have} of min_workers={min_workers} workers connected within {timeout:g} s "
                f"(rpm.train.wait-workers); start more workers, lower min_workers, or wait longer"
            )
        # Say what it waits for at once, then whenever the count changes or every 30 s: a silent
        # wait of up to rpm.train.wait-workers seconds looks like a hang.
        if said is None or have != last or now - said >= 30.0:
            logger.warning(
                f"fit: waiting for min_workers={min_workers} workers: {have} connected; giving up in "
                f"{deadline - now:.0f} s (rpm.train.wait-workers={timeout:g} s)"
            )
            said, last = now, have
        await asyncio.sleep(0.25)


def resumed_plan(saved: dict[str, Any], addresses: list[str], data: Prepared) -> Plan | None:
    """The plan a stopped DRPM run had (``resume["drpm"]["plan"]``), bound to this cluster's workers;
    None when it does not fit (another worker count, network or sample count)."""
    try:
        plan = Plan.from_dict(saved["plan"])
    except (KeyError, TypeError, ValueError, PlanError) as exc:
        logger.warning(
            f"resume: the checkpoint's DRPM plan cannot be read ({exc}); DRPM starts afresh"
        )
        return None
    if (
        len(plan.abilities) != len(addresses)
        or plan.shape != data.shape
        or plan.samples != data.samples
    ):
        logger.warning(
            f"resume: the checkpoint's DRPM plan is for {len(plan.abilities)} workers, the cluster has "
            f"{len(addresses)}; DRPM starts afresh"
        )
        return None
    return plan.with_workers(addresses).validate()


async def first_plan(
    client: Any, opts: RunOptions, data: Prepared, saved: dict[str, Any] | None = None
) -> tuple[Plan, dict[str, Any], Any, bool, bool]:
    """The first plan (probing first when asked); returns it, the scheduler identity, the probe,
    whether abilities were given, and whether the plan is a resumed DRPM run's (``saved``)."""
    info = await wait_for_workers(client, opts.min_workers, opts.engine.wait_workers)
    abilities = opts.abilities
    addresses = ordered_workers(info)
    if not addresses:
        raise TrainingError(
            "the cluster has no workers; start some (e.g. dask_rpm.local_cluster()) and retry"
        )
    if saved is not None and opts.mapping == "drpm":
        resumed = resumed_plan(saved, addresses, data)
        if resumed is not None:  # back at the pre-stop plan at once, not from a uniform start
            return resumed, info, None, True, True
    probe_result, rates, network = None, None, None
    if isinstance(abilities, str):
        if abilities != "probe":
            raise PlanError(
                f"abilities={abilities!r}; give a sequence of numbers, None, or 'probe'"
            )
        probe_result = await probe_async(
            client,
            shape=data.shape,
            samples=data.samples,
            dtype=data.dtype,
            workers=addresses,
            placement=opts.placement,
            layers=data.layers if is_conv(data.layers) else None,
            batch=data.recipe.schedule.batch,
        )
        abilities = [float(v) for v in probe_result["throughput"].values]
        # absolute speeds (work units per second) and the measured links: what lets srpm-time
        # see that a job this small runs faster on fewer workers
        rates = list(abilities)
        network = probe_network(probe_result)
    given = abilities is not None
    # Without initial abilities DRPM starts from a uniform mapping (docs/drpm.md).
    first = ("srpm" if given else "uniform") if opts.mapping == "drpm" else opts.mapping
    plan = resolve_plan(
        first,
        abilities,
        addresses=addresses,
        # a CNN goes as its geometry, even with one conv stage: its exchanges (activations
        # gathered, every parameter summed: its cost_shape) and its rows' flop are never an
        # MLP's of its plan shape; an MLP's cost_shape differs only with several hidden layers
        shape=data.layers if is_conv(data.layers) else data.shape,
        samples=data.samples,
        batch=data.recipe.schedule.batch,
        rates=rates,
        network=network,
        cost_shape=(
            data.layers.cost_shape if not is_conv(data.layers) and data.layers.depth > 1 else None
        ),
        idle=opts.mapping == "drpm" and opts.drpm is not None and opts.drpm.idle,
        min_gain=None if opts.drpm is None else opts.drpm.min_gain,
    )
    if data.lazy is not None and not isinstance(first, Plan):  # Dask's data: on whole chunks
        plan = data.lazy.holder.snapped(plan, data.recipe.schedule)
    return plan, info, probe_result, given, False
