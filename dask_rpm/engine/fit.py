"""The public entry point :func:`fit`: options, data, plan, and the block loop.

The sync :func:`fit` wraps the async core with ``client.sync`` (as
xgboost.dask does); the loop does the plumbing (blocks, remaps, recovery,
callbacks) and leaves every decision to pure functions (planners, DRPM
policy, estimator).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import config
from ..dashboard import RPMDashboardPlugin
from ..data import DataError
from ..emulation import emulation_label_async
from ..partition import Plan, PlanError
from ..planners import make_plan
from ..prepare import Prepared, prepare
from ..progress import Progress
from ..records import Checkpoint, RemapRecord
from ..results import describe_history
from . import callbacks as cb
from . import retirement
from .driver import Driver, ordered_workers
from .drpm import DRPMState
from .errors import TrainingError, WorkerLostError
from .history import add_validation, build_history
from .recovery import rebalance, recover, whole_plan
from .result import FitResult
from .scheduler_plugin import PLUGIN_NAME, RPMSchedulerPlugin
from .tasks import run_deadline
from .worker import PLUGIN_NAME as WORKER_PLUGIN_NAME
from .worker import RPMEnginePlugin

__all__ = ["fit"]

logger = logging.getLogger("dask_rpm")


@dataclass
class _Options:
    """``fit``'s keywords after defaults (``rpm.*`` config) and validation."""

    iterations: int
    learning_rate: float
    dtype: str
    mapping: Any
    interval: int
    auto_interval: bool
    on_worker_loss: str
    min_workers: int
    elastic: bool
    checkpoint_every: int
    target_error: float | None
    extra: dict[str, Any] = field(default_factory=dict)


def _options(kw: dict[str, Any], job: Prepared) -> _Options:
    mapping = config.get("train.mapping", kw["mapping"])
    interval = config.get("drpm.interval", kw["interval"])
    auto = interval == "auto"
    # With R="auto" the first check comes after one estimation window.
    interval = max(int(config.get("drpm.window")), 2) if auto else int(interval)
    if interval < 1:
        raise DataError(
            f"interval={interval}; it must be a positive number of iterations or 'auto'"
        )
    on_loss = config.get("train.on-worker-loss", kw["on_worker_loss"])
    if on_loss not in ("recover", "raise"):
        raise DataError(
            f"on_worker_loss={on_loss!r}; use 'recover' (go on without the worker) or 'raise'"
        )
    min_workers = config.get("train.min-workers", kw["min_workers"])
    if (
        isinstance(min_workers, bool)
        or not isinstance(min_workers, (int, np.integer))
        or min_workers < 1
    ):
        raise DataError(f"min_workers={min_workers!r}; it must be a positive integer")
    every = config.get("checkpoint.every", kw["checkpoint_every"])
    if isinstance(every, bool) or not isinstance(every, (int, np.integer)) or every < 0:
        raise DataError(
            f"checkpoint_every={every!r}; it must be an integer >= 0 (0: no checkpoints)"
        )
    return _Options(
        iterations=job.recipe.iterations,
        learning_rate=job.recipe.learning_rate,
        dtype=job.dtype,
        mapping=mapping,
        interval=interval,
        auto_interval=auto,
        on_worker_loss=on_loss,
        min_workers=int(min_workers),
        elastic=bool(config.get("train.elastic", kw["elastic"])) and not isinstance(mapping, Plan),
        checkpoint_every=int(every),
        target_error=job.target_error,
    )


def _resolve_plan(
    mapping: Any,
    abilities: Any,
    *,
    addresses: list[str],
    shape: tuple[int, int, int],
    samples: int,
    batch: int | None = None,
) -> Plan:
    """Turn ``mapping`` (a method name or a Plan) into a plan bound to worker addresses."""
    if not isinstance(mapping, Plan):
        abilities = [1.0] * len(addresses) if abilities is None else list(abilities)
        if len(abilities) != len(addresses):
            raise PlanError(
                f"{len(abilities)} abilities given for {len(addresses)} workers; give one per worker "
                f"(in the order of dask_rpm.ordered_workers)"
            )
        method = "grid-hrev" if str(mapping) == "grid" else str(mapping)
        return make_plan(abilities, shape, samples, method=method, workers=addresses, batch=batch)
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
    if plan.shape != shape or plan.samples != samples:
        raise PlanError(
            f"the plan is for n-m-l {'-'.join(map(str, plan.shape))} and {plan.samples} samples; "
            f"the data and network are {'-'.join(map(str, shape))} with {samples} samples"
        )
    return plan.validate()


async def _wait_for_workers(client: Any, min_workers: int) -> dict[str, Any]:
    """Scheduler identity once ``min_workers`` workers are connected (``rpm.train.wait-workers`` s at most)."""
    timeout = float(config.get("train.wait-workers"))
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


async def ensure_plugins(client: Any) -> None:
    """Register the scheduler plugins (records, ``/rpm`` dashboard) and the worker plugin (data plane)."""
    # all idempotent: a scheduler that has them keeps them (and what they recorded)
    await client.register_plugin(RPMSchedulerPlugin())
    await client.register_plugin(RPMDashboardPlugin(PLUGIN_NAME))
    # idempotent: the scheduler skips it when registered before, and installs it on workers that join later
    await client.register_plugin(RPMEnginePlugin(), name=WORKER_PLUGIN_NAME)


def fit(
    x: Any,
    d: Any = None,
    *,
    hidden: int | None = None,
    iterations: int | None = None,
    learning_rate: float | None = None,
    mapping: Any = None,
    abilities: Any = None,
    init: tuple[np.ndarray, np.ndarray] | None = None,
    seed: int | None = None,
    dtype: str | None = None,
    client: Any = None,
    interval: int | None = None,
    progress: Any = None,
    on_worker_loss: str | None = None,
    min_workers: int | None = None,
    elastic: bool | None = None,
    target_error: float | None = None,
    checkpoint_every: int | None = None,
    on_checkpoint: Any = None,
    should_stop: Any = None,
    callback: Any = None,
    callbacks: Any = None,
    epochs: int | None = None,
    batch_size: int | None = None,
    shuffle: bool | None = None,
    activation: str | None = None,
    loss: str | None = None,
    output: str | None = None,
    bias: bool | None = None,
    optimizer: Any = None,
    validation: Any = None,
    validate_every: int | None = None,
    early_stopping: int | None = None,
    tol: float | None = None,
    resume: dict[str, Any] | None = None,
) -> FitResult:
    """Train a 3-layer perceptron by back-propagation on the workers of a Dask cluster.

    Parameters
    ----------
    x : numpy.ndarray, xarray.Dataset or path
        Inputs ``(s, n)``; or a Dataset with ``x(sample, input)`` and
        ``d(sample, output)``; or the path of such a dataset as a netCDF file
        the workers can read (each worker then reads only its samples).
    d : numpy.ndarray, optional
        Teacher signals ``(s, l)`` when ``x`` is an array.
    hidden : int
        Hidden units ``m`` (taken from ``init`` when given).
    iterations : int, default ``rpm.train.iterations``
    learning_rate : float, default ``rpm.train.learning-rate``
    mapping : str or Plan
        How work is mapped to workers: ``"drpm"`` or the name of a registered
        planner (``dask_rpm.planners.mapping_names()``: srpm, srpm-time,
        uniform, split-1d, grid, grid-h, grid-hrev), or a Plan; default
        ``rpm.train.mapping``.
    abilities : sequence of float, "probe" or None
        Relative worker abilities in :func:`ordered_workers` order. ``None``
        means equal abilities for static mappings.
    init : (W0, V0), optional
        Initial weights; default a seeded uniform init (:func:`dask_rpm.kernels.init_weights`).
    seed : int, default ``rpm.train.seed``
    dtype : {"float64", "float32"}, default ``rpm.train.dtype``
    client : distributed.Client, optional
        Defaults to the current client (:func:`distributed.get_client`).
    interval : int, optional
        Iterations per block (one Dask task per worker; DRPM checks between
        blocks); default ``rpm.drpm.interval``.
    progress : {"auto", "bar", "log", "none"} or bool, default ``rpm.train.progress``
        A progress bar on stderr in an interactive session, plain lines in
        logs (``"auto"``); ``"none"`` / ``False`` is silent (:mod:`dask_rpm.progress`).
    on_worker_loss : {"recover", "raise"}, default ``rpm.train.on-worker-loss``
        ``"recover"``: when a worker holding a weight shard leaves, go on with
        a whole remap onto the workers left; its rows come from another column
        holding them, or (single column) from the last checkpoint with the
        iterations since computed again. Final weights are those of an
        uninterrupted run. ``"raise"``: raise :class:`WorkerLostError`.
    min_workers : int, default ``rpm.train.min-workers``
        Start once this many workers are connected (waiting at most
        ``rpm.train.wait-workers`` seconds).
    elastic : bool, default ``rpm.train.elastic``
        Take in workers that connect during training with a whole remap at the
        next block boundary. Ignored when ``mapping`` is a Plan.
    target_error : float, optional
        Stop right after the first iteration whose error is at most this (the
        workers check it every iteration); ``iterations`` is then the maximum.
    checkpoint_every : int, default ``rpm.checkpoint.every``
        Gather the weights to the client every this many iterations (0: never).
        They are the recovery point when no column holds a lost worker's rows.
    on_checkpoint : callable, optional
        ``on_checkpoint(state)`` with a dict ``iteration``, ``W``, ``V``,
        ``optimizer_state``, ``errors`` (per iteration so far), ``plan`` (and
        ``drpm``, DRPM's state, with ``mapping="drpm"``); called
        in a thread at each checkpoint (e.g. to write it to disk; ``resume=``
        takes it back).
    should_stop : callable, optional
        ``should_stop() -> bool`` polled after every block (e.g. a walltime
        signal); when true training stops there and ``FitResult.stopped`` says so.
    callback : callable, optional
        ``callback(info)`` after every block with a dict: ``iteration``,
        ``iterations``, ``error``, ``seconds_per_iteration``, ``workers``
        (addresses planned), ``plan`` and ``remaps`` (remaps at this boundary).
    callbacks : sequence of TrainingCallback, optional
        Hook objects (:mod:`dask_rpm.engine.callbacks`), called after the
        built-in ones.
    epochs : int, optional
        Train this many epochs instead of ``iterations`` (``epochs *
        ceil(samples / batch_size)`` iterations); default ``rpm.train.epochs``.
    batch_size : int, optional
        Samples per iteration: None (default ``rpm.train.batch-size``) is
        full-batch BP, the paper's; an integer trains on mini-batches drawn
        from a seeded per-epoch order that does not depend on the plan, each
        column taking its share of every batch (docs/training.md).
    shuffle : bool, default ``rpm.train.shuffle``
        Mini-batches: a new seeded sample order every epoch.
    activation : {"sigmoid", "tanh", "relu"}, default ``rpm.train.activation``
    loss : {"squared", "cross-entropy"}, default ``rpm.train.loss``
        With ``"cross-entropy"`` the outputs are a softmax and ``d`` may be
        1-D class labels (one-hot encoded; ``FitResult.classes`` keeps them).
    output : {"auto", "sigmoid", "linear", "softmax"}, default ``rpm.train.output``
        Output layer; ``auto`` follows the loss (sigmoid for squared error).
    bias : bool, default ``rpm.train.bias``
        Bias terms for both layers (:mod:`dask_rpm.network`: ``W`` and ``V``
        then have one more column, ``W`` one more row).
    optimizer : {"sgd", "momentum", "adam"} or dict, default ``rpm.train.optimizer``
        ``{"name": "adam", "beta1": 0.9, ...}`` sets parameters
        (:mod:`dask_rpm.optim`). Its state lives with the weight rows on the
        workers: it moves with them in remaps and recovery.
    validation : float or (x_val, d_val), optional
        A fraction of the samples to hold out (seeded), or a validation set;
        its loss and accuracy go into ``FitResult.history`` every
        ``validate_every`` iterations.
    validate_every : int, default ``rpm.train.validate-every``
        ``auto``: every epoch with mini-batches, every 10 full-batch iterations.
    early_stopping : int, optional
        Stop after this many validations in a row without improving the best
        validation loss by more than ``tol`` (relative); needs ``validation``.
    tol : float, default ``rpm.train.tol``
    resume : dict, optional
        A checkpoint as ``on_checkpoint`` receives it (``iteration``, ``W``,
        ``V``, ``optimizer_state``): training continues at that iteration, with
        the same mini-batches and optimizer state, up to ``iterations`` in all,
        and ends with the weights of an uninterrupted run. With
        ``mapping="drpm"`` and the checkpoint's ``"drpm"`` state (plan, checks,
        estimator windows) on a cluster of as many workers, DRPM continues on
        the plan it had reached instead of starting uniform again.

    Returns
    -------
    FitResult
    """
    from distributed import get_client

    if client is None:
        try:
            client = get_client()
        except ValueError as exc:
            raise TrainingError(
                "fit() found no Dask client: start one first, e.g. "
                "`client = distributed.Client(dask_rpm.local_cluster())`, or pass client=..."
            ) from exc
    kw = dict(
        hidden=hidden,
        iterations=iterations,
        learning_rate=learning_rate,
        mapping=mapping,
        abilities=abilities,
        init=init,
        seed=seed,
        dtype=dtype,
        interval=interval,
        progress=progress,
        on_worker_loss=on_worker_loss,
        min_workers=min_workers,
        elastic=elastic,
        target_error=target_error,
        checkpoint_every=checkpoint_every,
        on_checkpoint=on_checkpoint,
        should_stop=should_stop,
        callback=callback,
        callbacks=callbacks,
        epochs=epochs,
        batch_size=batch_size,
        shuffle=shuffle,
        activation=activation,
        loss=loss,
        output=output,
        bias=bias,
        optimizer=optimizer,
        validation=validation,
        validate_every=validate_every,
        early_stopping=early_stopping,
        tol=tol,
        resume=resume,
    )
    return client.sync(_fit_async, client, x, d, kw)


#: fit()'s keywords that decide what is computed (shared with fit_serial through dask_rpm.prepare).
_TRAINING_KEYWORDS = (
    "hidden",
    "iterations",
    "learning_rate",
    "init",
    "seed",
    "dtype",
    "epochs",
    "batch_size",
    "shuffle",
    "activation",
    "loss",
    "output",
    "bias",
    "optimizer",
    "validation",
    "validate_every",
    "early_stopping",
    "tol",
    "target_error",
)


def _resumed_plan(saved: dict[str, Any], addresses: list[str], data: Prepared) -> Plan | None:
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


async def _plan(
    client: Any, opts: _Options, data: Prepared, abilities: Any, saved: dict[str, Any] | None = None
) -> tuple[Plan, dict[str, Any], Any, bool, bool]:
    """The first plan (probing first when asked); returns it, the scheduler identity, the probe,
    whether abilities were given, and whether the plan is a resumed DRPM run's (``saved``)."""
    info = await _wait_for_workers(client, opts.min_workers)
    addresses = ordered_workers(info)
    if not addresses:
        raise TrainingError(
            "the cluster has no workers; start some (e.g. dask_rpm.local_cluster()) and retry"
        )
    if saved is not None and opts.mapping == "drpm":
        resumed = _resumed_plan(saved, addresses, data)
        if resumed is not None:  # back at the pre-stop plan at once, not from a uniform start
            return resumed, info, None, True, True
    probe_result = None
    if isinstance(abilities, str):
        if abilities != "probe":
            raise PlanError(
                f"abilities={abilities!r}; give a sequence of numbers, None, or 'probe'"
            )
        from ..probe import _probe_async

        probe_result = await _probe_async(
            client, shape=data.shape, samples=data.samples, dtype=opts.dtype, workers=addresses
        )
        abilities = [float(v) for v in probe_result["throughput"].values]
    given = abilities is not None
    # Without initial abilities DRPM starts from a uniform mapping (docs/drpm.md).
    first = ("srpm" if given else "uniform") if opts.mapping == "drpm" else opts.mapping
    plan = _resolve_plan(
        first,
        abilities,
        addresses=addresses,
        shape=data.shape,
        samples=data.samples,
        batch=data.recipe.schedule.batch,
    )
    return plan, info, probe_result, given, False


def _callbacks(
    kw: dict[str, Any],
    opts: _Options,
    data: Prepared,
    reporter: Progress,
    remaps: list[RemapRecord],
    emulation: str | None,
    start: Checkpoint,
) -> tuple[list[cb.TrainingCallback], cb.CheckpointCallback]:
    ckpt = cb.CheckpointCallback(opts.checkpoint_every, kw["on_checkpoint"], start)
    validator = data.validator()
    # validation first: the progress line and the /rpm page then show this boundary's evaluation
    out: list[cb.TrainingCallback] = (
        [cb.ValidationCallback(validator)] if validator is not None else []
    )
    out += [
        cb.DashboardCallback(emulation, validator),
        ckpt,
        cb.ProgressCallback(reporter, remaps, validator),
    ]
    if opts.target_error is not None:
        out.append(cb.TargetError(opts.target_error))
    if kw["callback"] is not None:
        out.append(cb.FunctionCallback(kw["callback"]))
    if kw["should_stop"] is not None:
        out.append(cb.ShouldStop(kw["should_stop"]))
    out.extend(kw["callbacks"] or ())
    return out, ckpt


def _start(resume: Any, data: Prepared) -> Checkpoint:
    """Where training starts: iteration 0 with the initial weights, or a checkpoint to resume from."""
    if resume is None:
        return Checkpoint(0, data.W0, data.V0)
    if not isinstance(resume, dict) or not {"iteration", "W", "V"} <= set(resume):
        raise DataError(
            "resume must be a checkpoint dict with 'iteration', 'W', 'V' (and 'optimizer_state'), "
            "as fit's on_checkpoint receives it"
        )
    k = resume["iteration"]
    W, V = np.asarray(resume["W"], dtype=data.dtype), np.asarray(resume["V"], dtype=data.dtype)
    if W.shape != data.W0.shape or V.shape != data.V0.shape:
        raise DataError(
            f"resume: the checkpoint's weights are W{W.shape}, V{V.shape}; this network needs "
            f"W{data.W0.shape}, V{data.V0.shape} (same data, hidden units and bias)"
        )
    if (
        isinstance(k, bool)
        or not isinstance(k, (int, np.integer))
        or not 0 <= k < data.recipe.iterations
    ):
        raise DataError(
            f"resume: the checkpoint is at iteration {k!r}; it must be below iterations="
            f"{data.recipe.iterations} (the total to reach)"
        )
    state = resume.get("optimizer_state") or None
    slots = set(data.recipe.optimizer.slots)
    if (state is None and slots) or (state is not None and set(state) != slots):
        raise DataError(
            f"resume: the checkpoint has optimizer state {sorted(state or {})}; optimizer "
            f"{data.recipe.optimizer.name!r} needs {sorted(slots)} (resume with the optimizer it was "
            f"written with)"
        )
    return Checkpoint(
        int(k),
        W,
        V,
        {k2: [np.asarray(a, dtype=data.dtype) for a in v] for k2, v in state.items()}
        if state
        else None,
    )


async def _fit_async(client: Any, x: Any, d: Any, kw: dict[str, Any]) -> FitResult:
    reporter = Progress(kw["progress"])  # validates progress= before any work
    data = prepare(x, d, **{k: kw[k] for k in _TRAINING_KEYWORDS})
    opts = _options(kw, data)
    start = _start(kw["resume"], data)  # a bad checkpoint is refused before waiting for workers
    saved = kw["resume"].get("drpm") if isinstance(kw["resume"], dict) else None
    plan, info, probe_result, given, resumed = await _plan(
        client, opts, data, kw["abilities"], saved
    )
    await ensure_plugins(client)
    driver = Driver(
        client,
        run=uuid.uuid4().hex[:10],
        plan=plan,
        source=data.source,
        arrays=data.arrays,
        recipe=data.recipe,
        dtype=data.dtype,
        rows=data.rows,
    )
    drpm = (
        DRPMState(initial_abilities=given, auto=opts.auto_interval)
        if opts.mapping == "drpm"
        else None
    )
    if drpm is not None and resumed and saved is not None:
        drpm.restore(saved, len(plan.abilities))
        logger.info(
            f"resume: DRPM continues on the checkpoint's plan with {len(drpm.checks)} check(s) and the "
            f"estimator windows of {len(drpm.estimator.workers)} worker(s)"
        )
    remaps: list[RemapRecord] = drpm.remaps if drpm is not None else []
    emulation = await emulation_label_async(client)
    hooks, ckpt = _callbacks(kw, opts, data, reporter, remaps, emulation, start)
    if (
        drpm is not None
    ):  # checkpoints carry the DRPM state, so --resume continues at the plan reached
        ckpt.extra = lambda d: {"drpm": {**drpm.to_dict(), "plan": d.plan.to_dict()}}
    loop = _Loop(driver, opts, hooks, ckpt, drpm, remaps)
    names = {
        a: w.get("name", a) for a, w in info["workers"].items()
    }  # worker names (SLURM: <group>-<n>)
    plans = [plan]
    stopped = None
    try:
        await loop.install(start)
        for h in hooks:
            await cb.call(h.before_training(driver, opts.iterations))
        driver.on_progress = loop.progress
        await loop.refresh_deadlines()
        stopped = await loop.run(plans, names)
        W, V, opt_state = await loop.final_weights(stopped)
    finally:
        for h in hooks:
            await cb.call(h.after_training(driver, stopped))
        await driver.close()
    history = build_history(driver.log, driver.plan, driver.addresses, driver.run)
    if drpm is not None:
        drpm.add_to_history(history)

    describe_history(history, driver.plan)
    history.coords["name"] = (
        "worker",
        np.array([str(names.get(a, a)) for a in history["address"].values], dtype=object),
        {"description": "Dask worker name (on SLURM <group>-<n>)"},
    )
    if emulation:
        history.attrs["emulation"] = emulation
    validation: list[Any] = next(
        (h.validator.rows for h in hooks if isinstance(h, cb.ValidationCallback)), []
    )
    add_validation(history, validation)
    return FitResult(
        W=W,
        V=V,
        history=history,
        plan=driver.plan,
        plans=plans,
        stopped=stopped,
        emulation=emulation,
        remaps=remaps,
        probe=probe_result,
        stats={"tasks": driver.tasks_submitted, "blocks": driver.epoch},
        recipe=data.recipe,
        classes=data.classes,
        validation=validation,
        optimizer_state=opt_state,
        drpm_state={**drpm.to_dict(), "plan": driver.plan.to_dict()} if drpm is not None else None,
    )


class _Loop:
    """The block loop: run a block, then membership changes or a DRPM check, then the callbacks."""

    def __init__(
        self,
        driver: Driver,
        opts: _Options,
        hooks: list[cb.TrainingCallback],
        ckpt: cb.CheckpointCallback,
        drpm: DRPMState | None,
        remaps: list[RemapRecord],
    ) -> None:
        self.driver, self.opts, self.hooks, self.ckpt, self.drpm, self.remaps = (
            driver,
            opts,
            hooks,
            ckpt,
            drpm,
            remaps,
        )
        self.interval = opts.interval
        self.target = next((h.target_error for h in hooks if h.target_error is not None), None)
        self.jobs_suspect = False  # a worker was lost: look for ended jobs at the next boundary
        self._jobs_checked = time.monotonic()
        self.deadlines: dict[str, float] = {}
        self._deadlines_for = -1
        self.margin = float(config.get("train.retire-margin"))

    def progress(self, driver: Driver) -> None:
        for h in self.hooks:
            h.on_progress(driver)

    def _block_size(self, done: int) -> int:
        sizes = [self.interval, self.opts.iterations - done]
        sizes += [b for h in self.hooks if (b := h.boundary(done))]
        d = self.driver
        before = retirement.iterations_before(
            self.deadlines,
            d._planned_addresses(),
            time.time(),
            self.margin,
            d.log.median_iteration_time(max(done - 20, 0), done),
        )
        if before is not None:  # a boundary before a worker's lifetime ends (it retires there)
            sizes.append(before)
        return max(min(sizes), 1)

    async def refresh_deadlines(self) -> None:
        """When each worker's Dask lifetime ends (asked again whenever workers joined)."""
        d = self.driver
        if len(d.addresses) != self._deadlines_for:
            got = await d.client.run(run_deadline, on_error="return")
            self.deadlines = {a: t for a, t in got.items() if isinstance(t, (int, float))}
            self._deadlines_for = len(d.addresses)

    async def install(self, start: Checkpoint) -> None:
        """Place the first shards; a worker lost while they are placed is left out (a new plan)."""
        d = self.driver
        for _ in range(len(d.addresses)):
            try:
                await d.install(d.plan, start.W, start.V, start.iteration, start.state)
                return
            except WorkerLostError as exc:
                if self.opts.on_worker_loss == "raise":
                    raise
                t0 = time.perf_counter()
                reason = f"worker(s) {', '.join(exc.workers)} lost before the first iteration"
                d.gone |= {d.addresses.index(a) for a in exc.workers if a in d.addresses}
                d.plan = whole_plan(d, note=reason)
                logger.warning(f"{reason}; planning again without them")
                self.remaps.append(
                    {
                        "iteration": start.iteration,
                        "kind": "whole",
                        "bytes": 0,
                        "transfers": 0,
                        "samples_reloaded": 0,
                        "sample_bytes": 0,
                        "seconds": time.perf_counter() - t0,
                        "reason": reason,
                        "lost": list(exc.workers),
                        "joined": [],
                        "recovered_from": "initial weights",
                        "replayed": 0,
                    }
                )
        raise TrainingError(
            "could not place the first shards: workers kept leaving"
        )  # pragma: no cover

    async def _retire_due(self) -> bool:
        """Retire the planned workers whose lifetime ends before the next block is over."""
        d = self.driver
        await self.refresh_deadlines()
        planned = d._planned_addresses()
        block = self.interval * d.log.median_iteration_time(max(d.iteration - 20, 0), d.iteration)
        going = retirement.due(self.deadlines, planned, time.time(), self.margin, block)
        if not going:
            return False
        if len(going) == len([a for i, a in enumerate(d.addresses) if i not in d.gone]):
            logger.warning(
                f"iteration {d.iteration}: every worker's lifetime ends within {self.margin:g} s "
                f"(rpm.train.retire-margin) and none is there to take over; training goes on until "
                f"they leave, then recovers from the last checkpoint"
            )
            self.margin = -math.inf  # do not ask again
            return False
        left = {a: self.deadlines[a] - time.time() for a in going}
        reason = "worker(s) {} retiring (Dask lifetime ends in {})".format(
            ", ".join(going), ", ".join(f"{t:.0f} s" for t in left.values())
        )
        rec = await retirement.retire(d, going, reason)
        self.remaps.append(rec)
        logger.info(
            f"iteration {d.iteration}: {reason} -> whole remap, {rec['bytes']} weight bytes in "
            f"{rec['seconds']:.3f} s, no iteration recomputed"
        )
        return True

    async def run(self, plans: list[Plan], names: dict[str, Any]) -> str | None:
        """Train to the end; returns why training stopped early, or None."""
        driver, total = self.driver, self.opts.iterations
        while driver.iteration < total:
            first, n_remaps = driver.iteration, len(self.remaps)
            try:
                outcome = await driver.run_block(self._block_size(first), self.target)
                status = outcome.status
                if status == "diverged":
                    return self._diverged(outcome.keep)
                if status == "ok" and driver.iteration < total:
                    await self._between_blocks(first, names)
            except WorkerLostError as exc:
                await self._recover(exc)
                status = "recovered"
            if driver.plan is not plans[-1]:
                plans.append(driver.plan)
            info = cb.BlockInfo(
                driver, first, driver.iteration, total, status, self.remaps[n_remaps:]
            )
            for h in self.hooks:
                try:
                    reason = await cb.call(h.after_block(info))
                except WorkerLostError as exc:  # e.g. a gather or a remap a callback asked for
                    await self._recover(exc)
                    continue
                if reason:
                    logger.info(reason)
                    return str(reason)
        return None

    async def _recover(self, exc: WorkerLostError) -> None:
        """Go on without the lost workers (``on_worker_loss="recover"``), or raise; their jobs may have ended."""
        if self.opts.on_worker_loss == "raise":
            raise exc
        self.remaps.append(await recover(self.driver, exc, self.ckpt.latest))
        self.jobs_suspect = True  # look for ended batch jobs at the next boundary

    async def _replace_lost_jobs(self) -> None:
        """On a batch-system cluster that can (``replace_lost``, e.g. SLURM groups), resubmit ended jobs;
        their workers join later and are absorbed like any new worker."""
        cluster = getattr(self.driver.client, "cluster", None)
        if not hasattr(cluster, "replace_lost") or not config.get("slurm.replace-lost"):
            return
        now = time.monotonic()
        if not self.jobs_suspect and now - self._jobs_checked < float(
            config.get("slurm.replace-check")
        ):
            return
        self._jobs_checked, self.jobs_suspect = now, False
        assert cluster is not None  # hasattr(cluster, "replace_lost") above
        try:
            replaced = await cluster.replace_lost()
        except Exception as exc:  # sbatch failing must not stop training
            logger.warning(f"could not resubmit ended jobs: {exc}")
            return
        for old, new in replaced.items():
            logger.warning(
                f"iteration {self.driver.iteration}: job {old} ended; submitted {new} to replace it"
            )

    async def _between_blocks(self, first: int, names: dict[str, Any]) -> None:
        """Retire workers whose lifetime ends, resubmit ended jobs, take in workers that joined (elastic),
        else let DRPM check."""
        driver = self.driver
        if await self._retire_due():
            return
        await self._replace_lost_jobs()
        if self.opts.elastic:
            ident = await driver.client.scheduler.identity(n_workers=-1)
            names.update({a: w.get("name", a) for a, w in ident["workers"].items()})
            alive = ordered_workers(ident)
            joined = [a for a in alive if a not in driver.addresses]
            if joined:
                rec = await rebalance(
                    driver, alive, self.ckpt.latest, f"{len(joined)} worker(s) joined"
                )
                self.remaps.append(rec)
                logger.info(
                    f"iteration {driver.iteration}: worker(s) {', '.join(joined)} joined -> whole remap, "
                    f"{rec['bytes']} weight bytes in {rec['seconds']:.3f} s"
                )
                return
        if self.drpm is not None:
            self.interval = await self.drpm.check(
                driver,
                first,
                driver.iteration,
                self.opts.iterations - driver.iteration,
                self.interval,
            )

    def _diverged(self, keep: int | None) -> str:
        msg = (
            f"training diverged: iteration {keep} produced a non-finite error or non-finite weights "
            f"(learning_rate={self.opts.learning_rate} is probably too large); returning the last finite "
            f"weights, after {keep} iteration(s)"
        )
        logger.warning(msg)
        return msg

    async def final_weights(
        self, stopped: str | None
    ) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
        """Gather the final weights; a worker lost now is recovered from like one lost mid-run."""
        driver = self.driver
        target = driver.iteration
        for _ in range(len(driver.addresses) + 1):
            try:
                while (
                    driver.iteration < target
                ):  # recovered from a checkpoint: compute up to where we were
                    await driver.run_block(target - driver.iteration)
                return await driver.gather(with_state=True)
            except WorkerLostError as exc:
                if stopped and "diverged" in stopped:
                    raise
                await self._recover(exc)
        raise TrainingError(
            "could not gather the final weights: workers kept leaving"
        )  # pragma: no cover
