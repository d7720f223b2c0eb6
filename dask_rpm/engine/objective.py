"""The full-batch objective and its gradient, evaluated on a cluster by rectangles.

What scipy's L-BFGS-B drives from the client for the estimators' ``solver="lbfgs"``
(:mod:`dask_rpm.estimators.lbfgs`; dask-glm's lbfgs is the precedent: scipy on the client,
the gradient computed where the data is). A :class:`ClusterObjective` is set up once, as a
training run is (:func:`dask_rpm.fit`'s first plan, the engine's worker plugin,
:meth:`Driver.install <dask_rpm.engine.driver.Driver.install>`): every planned worker gets
its column's samples and keeps them, with its kernel buffers. Each evaluation then sends
each worker only its rows of the weights, and runs one iteration of the block loop with the
step skipped (:class:`~dask_rpm.engine.records.BlockSpec` ``step=False``): forward, the
vertical exchange, backward, the horizontal sum, as training does. The first column's
members return their rows of the summed gradient (one whole gradient in all) and every
worker the iteration's error; the client joins the rows and takes the mean
(:func:`dask_rpm.nn.objective.mean_objective`). The numbers are those of
:class:`dask_rpm.nn.objective.SerialObjective` to rounding, on every plan.

The weights live on the client between evaluations (scipy owns them), so a lost worker costs
a whole remap onto the workers left (:func:`dask_rpm.engine.recovery.recover`) and the
evaluation runs again: the same value, to rounding.
"""

from __future__ import annotations

import dataclasses
import math
import uuid
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from ..nn import backend as xb
from ..nn.chunked import is_chunked
from ..nn.kernels import all_finite
from ..nn.objective import mean_objective
from ..nn.options import TrainingOptions
from ..nn.prepare import prepare
from ..runtime.hooks import worker_hooks
from ..runtime.threads import kernel_threads
from .block import run_block
from .dask_data import on_cluster
from .driver import Driver
from .errors import TrainingError, WorkerLostError
from .fit import ensure_plugins
from .options import RunOptions
from .planning import first_plan
from .records import BlockResult, BlockSpec, Checkpoint, RunSpec
from .recovery import recover
from .worker import get_state

__all__ = ["ClusterObjective", "Evaluation", "t_evaluate"]


class Evaluation(NamedTuple):
    """What a worker's evaluation task returns: its block's result, and its rows of the summed
    gradient of every parameter (host copies; None but in the first column)."""

    block: BlockResult
    gradient: list[np.ndarray] | None

    # the driver watches an evaluation as it watches a block (Driver._watch_block reads these)
    @property
    def status(self) -> str:
        return self.block.status

    @property
    def message(self) -> str:
        return self.block.message


async def t_evaluate(run: str, spec: BlockSpec, params: list[np.ndarray], keep: bool) -> Evaluation:
    """One evaluation on this worker: its rows ``params`` of the weights, one iteration of
    :func:`~dask_rpm.engine.block.run_block` without the step (``spec.step`` False); with
    ``keep`` its rows of the summed gradient come back."""
    from distributed import get_worker  # only on a worker: the client's side needs none

    worker = get_worker()
    state = get_state(run, worker)
    # t_block's choice: a paced (EMULATED) kernel sleeps and must not sleep on the event loop
    on_cpu, on_gpu, emulated = state.spec.inline_work
    if worker_hooks(worker).paced:
        inline_work = emulated
    else:
        inline_work = on_gpu if state.shard.backend.device != "cpu" else on_cpu
    async with state.busy:
        shard = state.shard
        for p, q in zip(shard.params, params):
            xb.copyto(p, q)
        shard.finite = all(all_finite(p) for p in shard.params)
        shard.squares = math.nan  # new weights: the penalty's sum of squares is taken afresh
        state.iteration = spec.first
        with kernel_threads(spec.threads or worker.state.nthreads) as threads:
            res = await run_block(state, spec, inline_work=inline_work)
        grads = None
        if keep and res.status == "ok" and state.gradient is not None:
            grads = [xb.host_copy(g) for g in state.gradient]
        state.gradient = None
        return Evaluation(res._replace(threads=threads, backend=shard.backend.label), grads)


class _EvaluationDriver(Driver):
    """A :class:`~dask_rpm.engine.driver.Driver` whose blocks are evaluations: one iteration,
    no step, the weights sent each time."""

    async def evaluate(self, params: Sequence[np.ndarray]) -> tuple[float, list[np.ndarray]]:
        """The error (summed loss plus the penalty) and the summed gradient at ``params``."""
        while True:
            try:
                return await self._evaluate_once(params)
            except WorkerLostError as exc:  # the weights are here: re-place them, evaluate again
                await recover(self, exc, Checkpoint(self.iteration, tuple(params)))

    async def _evaluate_once(self, params: Sequence[np.ndarray]) -> tuple[float, list[np.ndarray]]:
        spec = BlockSpec(
            epoch=self.epoch,
            first=self.iteration,
            count=1,
            learning_rate=0.0,
            target_error=None,
            receive_timeout=self._receive_timeout(),
            report_seconds=self.engine.report_seconds,
            threads=self.threads,
            step=False,
        )
        self.epoch += 1
        first = set(self.plan.columns[0])
        futures = {
            w: self._submit(
                t_evaluate,
                self.run,
                spec,
                self.layers.take(params, self.plan.rectangle(w).hidden),
                w in first,
                key=self._key("evaluate", spec.epoch, w),
                worker=w,
            )
            for w in self.plan.planned_workers
        }
        results: dict[int, Evaluation] = await self._watch_block(futures, spec)  # type: ignore[assignment]
        for r in results.values():
            self.log.add(r.block.records)
            self.kernel_threads[self.addresses[r.block.worker]] = r.block.threads
            self.kernel_backends[self.addresses[r.block.worker]] = r.block.backend
        self.iteration += 1
        statuses = {r.status for r in results.values()}
        if statuses != {"ok"}:  # "diverged": a non-finite error or weights; scipy backs off
            if statuses != {"diverged"}:
                raise TrainingError(
                    f"internal error: workers ended evaluation {spec.epoch} differently: "
                    f"{sorted(statuses)}"
                )
            return float("nan"), [np.full_like(p, np.nan) for p in params]
        (error,) = {r.block.errors[spec.first] for r in results.values()}
        col = sorted(first, key=lambda w: self.plan.rectangle(w).hidden[0])
        rows = [results[w].gradient for w in col]
        assert all(r is not None for r in rows)  # the first column's keep theirs (t_evaluate)
        return float(error), self.layers.join(rows)  # type: ignore[arg-type]


class ClusterObjective:
    """The objective of :mod:`dask_rpm.nn.objective` (scikit-learn's lbfgs loss and gradient)
    on ``client``'s workers, by rectangles.

    Parameters
    ----------
    client : distributed.Client
    x, d : numpy.ndarray
        The training set as :func:`dask_rpm.fit` takes it: inputs ``(s, n)`` (no bias column)
        and targets ``(s, l)``.
    options : TrainingOptions
        The network, its initial weights (``init``: they size the shards), ``alpha`` and
        ``reduction`` (``"mean"``: scikit-learn's squared loss, a mean over the outputs); the
        batch is always every sample.
    mapping, abilities, backend, device
        As :func:`dask_rpm.fit`'s: the plan, and where each worker's kernels run.

    Use it as a context manager: entering sets the run up on the workers, leaving forgets it
    there. Calling it with the augmented parameters ``W_1 .. W_L, V`` returns the mean loss with
    the penalty and its gradient of each parameter.
    """

    def __init__(
        self,
        client: Any,
        x: np.ndarray,
        d: np.ndarray,
        options: TrainingOptions,
        *,
        mapping: Any = None,
        abilities: Any = None,
        backend: str | None = None,
        device: str | None = None,
    ) -> None:
        self.client = client
        # one iteration over every sample, never stepped: a training run's batches and count do
        # not apply
        self.options = dataclasses.replace(
            options, batch_size=int(x.shape[0]), iterations=1, epochs=None
        )
        self.x: Any = x  # numpy, or Dask's data until __enter__ puts them on the cluster
        self.d: Any = d
        self.run_options = RunOptions(
            mapping=mapping, abilities=abilities, progress=False, backend=backend, device=device
        )
        self.driver: _EvaluationDriver | None = None
        self.evaluations = 0

    async def _setup(self) -> None:
        data = prepare(self.x, self.d, self.options)
        opts = self.run_options.resolved()
        plan, *_ = await first_plan(self.client, opts, data)
        await ensure_plugins(self.client)
        engine = opts.engine
        spec = RunSpec(
            run=uuid.uuid4().hex[:10],
            recipe=data.recipe,
            dtype=data.dtype,
            placement=opts.placement,
            inline_work=(engine.inline_work, engine.inline_work_gpu, engine.inline_work_emulated),
        )
        self.driver = _EvaluationDriver(
            self.client,
            spec=spec,
            plan=plan,
            # Dask's data: the chunks on the cluster give each worker its rows (engine.dask_data)
            source=data.source if data.lazy is None else data.lazy.holder,
            arrays=data.arrays,
            rows=data.rows,
            threads=opts.threads,
            layers=data.layers,
            engine=engine,
        )
        self.alpha, self.net = data.recipe.alpha, data.recipe.net
        self.divisor = float(data.recipe.divisor(0))  # the full batch's: the samples
        await self.driver.install(plan, Checkpoint(0, data.params0))

    def __enter__(self) -> ClusterObjective:
        if is_chunked(self.x, self.d):  # Dask's data: persisted and checked where the chunks live
            self.x, self.options = on_cluster(self.client, self.x, self.d, self.options)
            self.d = None
        self.client.sync(self._setup)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Forget the run on the workers (their samples and buffers)."""
        if self.driver is not None:
            self.client.sync(self.driver.close)
            self.driver = None

    @property
    def plan(self) -> Any:
        """The plan the evaluations run on (None before entering)."""
        return None if self.driver is None else self.driver.plan

    def sums(self, params: Sequence[np.ndarray]) -> tuple[float, list[np.ndarray]]:
        """One full-batch iteration without its step on the cluster: the error (summed loss plus
        the penalty) and the summed gradient of every parameter."""
        if self.driver is None:
            raise RuntimeError("enter the ClusterObjective first (with ClusterObjective(...) as f)")
        self.evaluations += 1
        params = [np.ascontiguousarray(p, dtype=self.driver.dtype) for p in params]
        return self.client.sync(self.driver.evaluate, params)

    def __call__(self, params: Sequence[np.ndarray]) -> tuple[float, list[np.ndarray]]:
        """The mean loss with the penalty at ``params`` and its gradient (:func:`mean_objective`)."""
        error, sums = self.sums(params)
        return mean_objective(params, error, sums, self.divisor, self.alpha, self.net)
