"""The public entry point :func:`fit`: a run from its options to its :class:`FitResult`.

The sync :func:`fit` wraps the async core with ``client.sync`` (as
xgboost.dask does); the loop does the plumbing (blocks, remaps, recovery,
callbacks) and leaves every decision to pure functions (planners, DRPM
policy, estimator).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
import uuid
from collections.abc import Sequence
from typing import Any

from ..nn.chunked import is_chunked
from ..nn.cnn_kernels import check_backend
from ..nn.options import TrainingOptions
from ..nn.prepare import Prepared, prepare
from ..progress import Progress
from ..records import RemapRecord
from ..runtime.labels import run_label
from . import callbacks as cb
from .buddies import BuddyBook
from .checkpoint import StoredCheckpoint, check_readable, check_shared
from .dask_data import ChunkedRows, on_cluster
from .driver import Driver
from .drpm import DRPMState
from .errors import TrainingError
from .loop import TrainingLoop
from .options import RunOptions, resume_state, start_checkpoint
from .planning import first_plan
from .records import Checkpoint, RunSpec
from .result import FitResult
from .scheduler_plugin import RPMSchedulerPlugin
from .store import prepare_directory
from .summary import run_history, run_stats

__all__ = ["fit"]

logger = logging.getLogger("dask_rpm")


async def ensure_plugins(client: Any) -> None:
    """Register the scheduler plugin, once per scheduler: when it starts it installs the
    ``/rpm`` dashboard and the worker plugin (the data plane) itself."""
    # idempotent: a scheduler that has it keeps it (and what it recorded), and a second fit
    # costs one round trip
    await client.register_plugin(RPMSchedulerPlugin())


def fit(
    x: Any,
    d: Any = None,
    *,
    hidden: int | Sequence[int] | None = None,
    iterations: int | None = None,
    learning_rate: float | None = None,
    mapping: Any = None,
    abilities: Any = None,
    init: Sequence[Any] | None = None,
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
    checkpoint_dir: str | os.PathLike[str] | None = None,
    on_checkpoint: Any = None,
    should_stop: Any = None,
    callback: Any = None,
    callbacks: Any = None,
    epochs: int | None = None,
    batch_size: int | None = None,
    shuffle: bool | str | None = None,
    activation: str | None = None,
    loss: str | None = None,
    output: str | None = None,
    bias: bool | None = None,
    optimizer: Any = None,
    validation: Any = None,
    validate_every: int | None = None,
    early_stopping: int | None = None,
    tol: float | None = None,
    alpha: float | None = None,
    reduction: str | None = None,
    resume: dict[str, Any] | str | os.PathLike[str] | None = None,
    options: TrainingOptions | None = None,
    backend: str | None = None,
    device: str | None = None,
    network: Any = None,
    sample_weight: Any = None,
) -> FitResult:
    """Train a 3-layer perceptron by back-propagation on the workers of a Dask cluster.

    Parameters
    ----------
    x : numpy.ndarray, dask.array.Array, xarray.Dataset or path
        Inputs ``(s, n)``; or a Dataset with ``x(sample, input)`` and
        ``d(sample, output)``; or the path of such a dataset as a netCDF file
        the workers can read (each worker then reads only its samples). Dask's data (a dask
        array chunked along samples, xarray backed by dask, a zarr store path) stay on the
        cluster: each worker gets its rows from the chunks, worker to worker
        (:mod:`dask_rpm.engine.dask_data`; moved bytes in ``FitResult.stats["dask"]``).
    d : numpy.ndarray or dask.array.Array, optional
        Teacher signals ``(s, l)`` when ``x`` is an array (1-D class labels with
        ``loss="cross-entropy"``, one-hot encoded on the workers for dask labels).
    hidden : int or sequence of int
        Hidden units ``m``, or of each hidden layer (``(512, 256)``: two hidden layers,
        every one cut by the same rectangles: :mod:`dask_rpm.nn.layers`); taken from
        ``init`` when given.
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
    init : (W0, V0) or (W_1, ..., W_L, V), optional
        Initial weights (biases: ``(W0, V0, b0, c0)`` or ``(weights, biases)``); default a
        seeded uniform init (:func:`dask_rpm.nn.kernels.init_params`).
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
        Take a checkpoint every this many iterations (0: never): the recovery
        point when no column holds a lost worker's rows. Without
        ``checkpoint_dir`` the weights are gathered to the client.
    checkpoint_dir : str or path, default ``rpm.checkpoint.dir``
        A directory every worker can reach (on SLURM a shared file system):
        the workers write their rows of each checkpoint there in parallel and
        the driver makes it valid with a manifest written last
        (:mod:`dask_rpm.engine.store`); the weights never pass through the
        driver. An interrupted checkpoint leaves the previous one valid;
        ``resume=`` takes the directory back. A directory holding another
        run's checkpoint is refused (resume it, or choose a new one).
    on_checkpoint : callable, optional
        ``on_checkpoint(state)`` with a dict ``iteration``, ``params`` (``W_1 .. W_L, V``),
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
    shuffle : bool, "chunks" or "stream", default ``rpm.train.shuffle``
        Mini-batches: a new seeded sample order every epoch. ``"chunks"`` (Dask data): the
        chunk-local shuffle, rows permuted within their chunks and every batch drawn from
        every chunk in proportion, a different sampling under which a column on whole chunks
        its workers hold moves no rows. ``"stream"`` (Dask data): the chunk stream, chunks
        visited one after another, for data larger than the workers' memory. ``fit_serial``
        on the same data trains on the same batches (docs/training.md).
    activation : {"sigmoid", "tanh", "relu", "identity"}, default ``rpm.train.activation``
    loss : {"squared", "cross-entropy", "poisson"}, default ``rpm.train.loss``
        With ``"cross-entropy"`` the outputs are a softmax and ``d`` may be
        1-D class labels (one-hot encoded; ``FitResult.classes`` keeps them);
        ``"poisson"`` is the half Poisson deviance of exponential outputs (targets >= 0).
    output : {"auto", "sigmoid", "linear", "softmax", "exp"}, default ``rpm.train.output``
        Output layer; ``auto`` follows the loss (sigmoid for squared error, exp for Poisson).
    bias : bool, default ``rpm.train.bias``
        Bias terms for both layers (:mod:`dask_rpm.nn.network`: ``W`` and ``V``
        then have one more column, ``W`` one more row).
    optimizer : {"sgd", "momentum", "adam"} or dict, default ``rpm.train.optimizer``
        ``{"name": "adam", "beta1": 0.9, ...}`` sets parameters
        (:mod:`dask_rpm.nn.optim`). Its state lives with the weight rows on the
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
    alpha : float, default ``rpm.train.alpha``
        L2 penalty ``0.5 alpha sum W^2`` on the weights (not the biases): its
        gradient joins the weights' and it is part of every iteration's error.
    reduction : {"sum", "mean"}, default ``rpm.train.reduction``
        The optimizer steps on the summed gradient (the paper's), or on it
        divided by the iteration's batch size (scikit-learn's).
    resume : dict, str or path, optional
        A checkpoint store directory (``checkpoint_dir`` of an earlier run: its
        valid checkpoint, each row file checked against the manifest's
        checksum), or a checkpoint as ``on_checkpoint`` receives it
        (``iteration``, ``params``, ``optimizer_state``): training continues at that iteration, with
        the same mini-batches and optimizer state, up to ``iterations`` in all,
        and ends with the weights of an uninterrupted run. With
        ``mapping="drpm"`` and the checkpoint's ``"drpm"`` state (plan, checks,
        estimator windows) on a cluster of as many workers, DRPM continues on
        the plan it had reached instead of starting uniform again.

    options : TrainingOptions, optional
        The training options as one record (:class:`dask_rpm.nn.options.TrainingOptions`:
        ``hidden`` to ``target_error`` above); the keywords set its fields, each given once.
    backend : {"numpy", "torch", "cupy", "auto"}, default ``rpm.engine.backend``
        The array library each worker's kernels, weights and optimizer state use
        (:mod:`dask_rpm.nn.backend`); ``auto``: torch on a worker with a GPU, numpy on one
        without. Every backend trains the same network: the result equals
        :func:`fit_serial`'s to rounding.
    device : {"auto", "cpu", "cuda"} or "cuda:<index>", default ``rpm.engine.device``
        Where: ``auto`` is a worker's GPU where it sees one (``local_cluster(gpus=...)``,
        SLURM groups with ``gpus:``) and the backend runs there, its CPU otherwise; so one
        run can mix GPU and CPU workers.
    network : torch.nn.Sequential or list of layer records, optional
        A convolutional network (:mod:`dask_rpm.nn.cnn`): ``Conv2d``, ``MaxPool2d`` /
        ``AvgPool2d``, ``Flatten``, ``Linear`` and ReLU / tanh / sigmoid, ending with the output
        ``Linear``. ``x`` then holds images ``(samples, channels, height, width)``, or is the
        path of a netCDF file whose ``x`` has those dimensions (read whole where ``fit`` runs);
        the architecture and the initial weights are the module's (records: seeded with ``seed``).
        Every stage's output channels are cut by the plan's hidden rows, as an MLP's hidden
        units are (docs/training.md, "Convolutional networks"). ``hidden``, ``init``,
        ``activation`` and ``bias`` do not apply.
    sample_weight : array_like, optional
        One weight ``>= 0`` per sample (``x`` as numpy arrays or a scipy CSR / CSC matrix, whose
        rows stay sparse on numpy workers: :mod:`dask_rpm.nn.sparse`): each sample's loss and
        gradient count that many times. With ``reduction="mean"`` the gradient and the loss of
        a batch are divided by its weight sum, as scikit-learn's (docs/training.md); a fraction
        held out for ``validation`` takes its samples' weights along.

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
    # the keywords map one to one onto the two records: what is computed, and how the run goes
    training = TrainingOptions.of(
        options,
        hidden=hidden,
        iterations=iterations,
        epochs=epochs,
        learning_rate=learning_rate,
        init=init,
        seed=seed,
        dtype=dtype,
        batch_size=batch_size,
        shuffle=shuffle,
        activation=activation,
        loss=loss,
        output=output,
        bias=bias,
        optimizer=optimizer,
        alpha=alpha,
        reduction=reduction,
        validation=validation,
        validate_every=validate_every,
        early_stopping=early_stopping,
        tol=tol,
        target_error=target_error,
        network=network,
        sample_weight=sample_weight,
    )
    run = RunOptions(
        mapping=mapping,
        abilities=abilities,
        interval=interval,
        progress=progress,
        on_worker_loss=on_worker_loss,
        min_workers=min_workers,
        elastic=elastic,
        checkpoint_every=checkpoint_every,
        checkpoint_dir=checkpoint_dir,
        on_checkpoint=on_checkpoint,
        should_stop=should_stop,
        callback=callback,
        callbacks=callbacks,
        resume=resume,
        backend=backend,
        device=device,
    )
    if is_chunked(x, d):  # Dask's data: persisted and checked where the chunks live
        x, training = on_cluster(client, x, d, training)
        d = None
    return client.sync(_fit_async, client, x, d, training, run)


def _callbacks(
    opts: RunOptions,
    data: Prepared,
    reporter: Progress,
    remaps: list[RemapRecord],
    emulation: str | None,
    start: Checkpoint | StoredCheckpoint,
    errors_before: Any = None,
) -> tuple[list[cb.TrainingCallback], cb.CheckpointCallback]:
    ckpt = cb.CheckpointCallback(
        opts.checkpoint_every,
        opts.on_checkpoint,
        start,
        directory=opts.checkpoint_dir,
        errors_before=errors_before,
    )
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
    if data.target_error is not None:
        out.append(cb.StopAtTarget(data.target_error))
    if opts.callback is not None:
        out.append(cb.FunctionCallback(opts.callback))
    if opts.should_stop is not None:
        out.append(cb.ShouldStop(opts.should_stop))
    for hook in opts.callbacks or ():
        if isinstance(hook, cb.TrainingCallback):
            out.append(hook)
        elif hasattr(hook, "end_epoch"):  # an epoch rule, as fit_serial takes it
            out.append(cb.EpochRuleCallback(hook, data.recipe.schedule.per_epoch))
        else:
            raise TrainingError(
                f"callbacks: {type(hook).__name__} is neither a TrainingCallback "
                f"(dask_rpm.engine.callbacks) nor an epoch rule with end_epoch "
                f"(dask_rpm.nn.convergence.ConvergenceRule)"
            )
    return out, ckpt


class _Clock:
    """Seconds each part of one ``fit`` call took (``FitResult.stats["call"]``): where a call's
    fixed costs go, beside the iterations' own time (the history's)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._t0 = self._last = time.perf_counter()

    def lap(self, part: str) -> None:
        """End ``part`` now: the seconds since the previous lap are its own (added up)."""
        now = time.perf_counter()
        self.seconds[part] = self.seconds.get(part, 0.0) + now - self._last
        self._last = now

    def stats(self) -> dict[str, float]:
        """Each part's seconds and ``total``, the call's up to now."""
        return {**self.seconds, "total": time.perf_counter() - self._t0}


async def _fit_async(
    client: Any, x: Any, d: Any, training: TrainingOptions, given: RunOptions
) -> FitResult:
    clock = _Clock()
    reporter = Progress(given.progress)  # validates progress= before any work
    data = prepare(x, d, training)
    opts = given.resolved()
    if data.recipe.layers is not None:  # a CNN: torch's or numpy's kernels only
        check_backend(opts.placement.backend)
    # a bad checkpoint is refused before waiting for workers
    resume = resume_state(opts.resume, data)
    start = start_checkpoint(resume, data, stored=isinstance(opts.resume, (str, os.PathLike)))
    if opts.checkpoint_dir is not None:  # created (nothing else written) once the input is valid
        opts = dataclasses.replace(
            opts, checkpoint_dir=prepare_directory(opts.checkpoint_dir, opts.resume)
        )
    saved = resume.get("drpm") if isinstance(resume, dict) else None
    errors_before = resume.get("errors") if isinstance(resume, dict) else None
    clock.lap("prepare")
    plan, info, probe_result, abilities_given, resumed = await first_plan(client, opts, data, saved)
    clock.lap("plan")
    await ensure_plugins(client)
    driver = _driver(client, opts, data, plan)
    drpm = _drpm_state(opts, abilities_given, saved if resumed else None, len(plan.abilities))
    remaps: list[RemapRecord] = drpm.remaps if drpm is not None else []
    emulation = await run_label(client)
    hooks, ckpt = _callbacks(opts, data, reporter, remaps, emulation, start, errors_before)
    if drpm is not None:  # checkpoints carry the DRPM state: resume continues at the plan reached
        ckpt.extra = lambda d: {"drpm": {**drpm.to_dict(), "plan": d.plan.to_dict()}}
    loop = TrainingLoop(driver, opts, hooks, ckpt, drpm, remaps)
    if drpm is not None:  # the probe's rates and links, for DRPM's idle choices (drpm/idle.py)
        drpm.probed(probe_result, driver.addresses)
    # worker names (SLURM: <group>-<n>)
    names = {a: w.get("name", a) for a, w in info["workers"].items()}
    plans = [plan]
    stopped = None
    try:
        # before the shards are placed: a store the workers do not share with the driver is refused
        # with that reason, not as a damaged or unwritable one
        if opts.checkpoint_dir is not None:
            await check_shared(driver, opts.checkpoint_dir)
        if isinstance(start, StoredCheckpoint) and start.directory != opts.checkpoint_dir:
            await check_readable(driver, start.directory)
        clock.lap("setup")
        await loop.install(start)
        clock.lap("place")
        for h in hooks:
            await cb.call(h.before_training(driver, data.recipe.iterations))
        driver.on_progress = loop.progress
        await loop.refresh_deadlines()
        clock.lap("setup")
        stopped = await loop.run(plans, names)
        clock.lap("blocks")
        params, opt_state = await loop.final_weights(stopped)
        if isinstance(driver.source, ChunkedRows):  # fetched rows counted, chunks let go
            await driver.source.collect(driver)
        clock.lap("gather")
    finally:
        for h in hooks:
            await cb.call(h.after_training(driver, stopped))
        await driver.close()
    clock.lap("close")
    validation: list[Any] = next(
        (h.validator.rows for h in hooks if isinstance(h, cb.ValidationCallback)), []
    )
    history = run_history(driver, drpm, names, emulation, validation)
    clock.lap("history")
    return FitResult(
        params=params,
        history=history,
        plan=driver.plan,
        plans=plans,
        stopped=stopped,
        emulation=emulation,
        remaps=remaps,
        probe=probe_result,
        stats={**run_stats(driver, ckpt, start, loop), "call": clock.stats()},
        recipe=data.recipe,
        classes=data.classes,
        validation=validation,
        optimizer_state=opt_state,
        drpm_state={**drpm.to_dict(), "plan": driver.plan.to_dict()} if drpm is not None else None,
    )


def _driver(client: Any, opts: RunOptions, data: Prepared, plan: Any) -> Driver:
    """The run's driver, with the spec every worker is told at setup."""
    engine = opts.engine
    spec = RunSpec(
        run=uuid.uuid4().hex[:10],
        recipe=data.recipe,
        dtype=data.dtype,
        placement=opts.placement,
        inline_work=(engine.inline_work, engine.inline_work_gpu, engine.inline_work_emulated),
    )
    driver = Driver(
        client,
        spec=spec,
        plan=plan,
        source=data.source if data.lazy is None else data.lazy.holder,
        arrays=data.arrays,
        rows=data.rows,
        threads=opts.threads,
        layers=data.layers,
        engine=engine,
    )
    if opts.resilience.buddies:
        driver.book = BuddyBook(opts.resilience)
    return driver


def _drpm_state(
    opts: RunOptions, given: bool, saved: dict[str, Any] | None, n_workers: int
) -> DRPMState | None:
    """DRPM's state for ``mapping="drpm"`` (else None); ``saved``: a resumed run's, restored."""
    if opts.mapping != "drpm":
        return None
    drpm = DRPMState(initial_abilities=given, auto=opts.auto_interval, settings=opts.drpm)
    if saved is not None:
        drpm.restore(saved, n_workers)
        logger.info(
            f"resume: DRPM continues on the checkpoint's plan with {len(drpm.checks)} check(s) "
            f"and the estimator windows of {len(drpm.estimator.workers)} worker(s)"
        )
    return drpm
