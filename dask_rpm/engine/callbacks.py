"""Per-block hooks of the training loop, as objects with one small protocol.

Like xgboost's ``TrainingCallback``: the loop calls every callback's
:meth:`~TrainingCallback.after_block` when a block of iterations ends, and
stops training when one returns a reason (a string). :func:`dask_rpm.fit`
builds the built-in ones from its keywords (``progress``, ``checkpoint_every``
and ``on_checkpoint``, ``target_error``, ``should_stop``, ``callback``); pass
your own with ``fit(..., callbacks=[...])``.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..nn.convergence import epoch_error
from ..plan.partition import Plan
from ..records import RemapRecord
from .checkpoint import StoredCheckpoint, write_store
from .driver import Driver
from .drpm import jsonable
from .errors import WorkerLostError
from .records import Checkpoint

logger = logging.getLogger("dask_rpm")

__all__ = [
    "BlockInfo",
    "TrainingCallback",
    "ProgressCallback",
    "CheckpointCallback",
    "StopAtTarget",
    "ShouldStop",
    "FunctionCallback",
    "DashboardCallback",
    "EpochRuleCallback",
    "call",
]


@dataclass
class BlockInfo:
    """What the loop tells callbacks after a block.

    ``first``/``iteration`` bound the iterations of the block just run
    (``iteration`` is the number done so far); ``remaps`` are the remaps made
    at this boundary; ``status`` is the block's (``ok``, ``target``,
    ``diverged``) or ``recovered`` after a worker loss.
    """

    driver: Driver
    first: int
    iteration: int
    iterations: int
    status: str
    remaps: list[RemapRecord] = field(default_factory=list)

    @property
    def plan(self) -> Plan:
        return self.driver.plan

    @property
    def error(self) -> float:
        return self.driver.log.error(self.iteration - 1) if self.iteration > 0 else float("nan")

    @property
    def seconds_per_iteration(self) -> float:
        return self.driver.log.median_iteration_time(self.first, self.iteration)

    def as_dict(self) -> dict[str, Any]:
        """The dict :func:`dask_rpm.fit`'s ``callback`` receives."""
        d = self.driver
        return {
            "iteration": self.iteration,
            "iterations": self.iterations,
            "error": self.error,
            "seconds_per_iteration": self.seconds_per_iteration,
            "workers": [d.addresses[w] for w in d.plan.planned_workers],
            "plan": d.plan,
            "remaps": list(self.remaps),
        }


class TrainingCallback:
    """Base class: override what you need. Methods may be ``async``."""

    #: Stop inside a block as soon as the error is at most this (checked by the workers).
    target_error: float | None = None

    def before_training(self, driver: Driver, total: int) -> Any:
        return None

    def boundary(self, done: int) -> int | None:
        """Iterations from ``done`` until this callback needs a block to end (None: no need)."""
        return None

    def on_progress(self, driver: Driver) -> None:
        """Called while a block runs, whenever new iterations were streamed (keep it cheap)."""

    def after_block(self, info: BlockInfo) -> Any:
        """Return a reason (str) to stop training after this block, else None."""
        return None

    def after_training(self, driver: Driver, stopped: str | None) -> Any:
        return None


async def call(result: Any) -> Any:
    """Await ``result`` if a callback method was ``async``."""
    if inspect.isawaitable(result):
        return await result
    return result


class ProgressCallback(TrainingCallback):
    """The progress bar / log lines (:class:`dask_rpm.progress.Progress`), updated as iterations stream in."""

    def __init__(self, reporter: Any, remaps: list[RemapRecord], validator: Any = None) -> None:
        self.reporter = reporter
        self.remaps = remaps
        self.validator = validator
        self._shown: tuple[int, int, int] | None = None

    def before_training(self, driver: Driver, total: int) -> None:
        self.reporter.total = int(total)

    def on_progress(self, driver: Driver) -> None:
        last = driver.log.last_iteration()
        rows = self.validator.rows if self.validator is not None else []
        if last is None or self._shown == (last, len(self.remaps), len(rows)):
            return
        self._shown = (last, len(self.remaps), len(rows))
        self.reporter.update(
            last + 1,
            error=driver.log.error(last),
            iteration_time=driver.log.median_iteration_time(
                max(last - 9, 0), last + 1, skip_first=False
            ),
            remaps=self.remaps,
            validation=rows[-1] if rows else None,
        )

    def after_block(self, info: BlockInfo) -> None:
        self.on_progress(info.driver)

    def after_training(self, driver: Driver, stopped: str | None) -> None:
        self.on_progress(
            driver
        )  # what a callback that stopped training saw last (e.g. a validation)
        self.reporter.close(stopped)


class CheckpointCallback(TrainingCallback):
    """Every ``every`` iterations a checkpoint, the recovery point when no column holds a lost worker's rows.

    With ``directory`` (``fit(checkpoint_dir=...)``) the workers write their
    rows into that store in parallel and the driver writes the manifest
    (:mod:`dask_rpm.engine.checkpoint`): no weights reach the driver. With
    ``on_checkpoint`` the driver gathers the weights and hands them to
    ``on_checkpoint(state)`` in a thread (both may be given). Without either,
    the gathered weights are kept on the client as the recovery point.
    ``times`` lists ``(iteration, seconds)`` of every checkpoint taken.
    """

    def __init__(
        self,
        every: int,
        on_checkpoint: Callable[[dict[str, Any]], None] | None,
        initial: Any,
        directory: str | None = None,
        errors_before: Any = None,
    ) -> None:
        self.every = int(every)
        self.on_checkpoint = on_checkpoint
        self.directory = directory
        self.latest: Checkpoint | StoredCheckpoint = initial
        #: the errors of the iterations before a resume (a store's checkpoints carry them on)
        self.errors_before = np.asarray(errors_before if errors_before is not None else [], float)
        #: ``extra(driver) -> dict`` merged into each checkpoint's state (fit sets it: the DRPM state)
        self.extra: Callable[[Driver], dict[str, Any]] | None = None
        self.times: list[tuple[int, float]] = []

    def boundary(self, done: int) -> int | None:
        return self.every - done % self.every if self.every else None

    def _errors(self, driver: Driver, done: int) -> np.ndarray:
        errors = np.array([driver.log.error(it) for it in range(done)])
        k = min(self.errors_before.size, done)
        before = errors[:k]
        errors[:k] = np.where(np.isnan(before), self.errors_before[:k], before)
        return errors

    async def after_block(self, info: BlockInfo) -> None:
        done = info.iteration
        if (
            not self.every
            or done % self.every
            or info.status not in ("ok", "target")
            or done == self.latest.iteration
        ):
            return None
        t0 = time.perf_counter()
        extra = self.extra(info.driver) if self.extra is not None else {}
        if self.directory is not None:
            await self._to_store(info, done, extra)
        if self.on_checkpoint is not None or self.directory is None:
            await self._gathered(info, done, extra)
        self.times.append((done, time.perf_counter() - t0))
        return None

    async def _to_store(self, info: BlockInfo, done: int, extra: dict[str, Any]) -> None:
        """The workers write their rows; the driver, the manifest (never the weights)."""
        assert self.directory is not None
        meta = {
            **extra,
            "plan": info.driver.plan.to_dict(),
            "errors": self._errors(info.driver, done),
        }
        try:
            await write_store(info.driver, self.directory, meta)
        except (
            Exception
        ) as exc:  # a writer failed or left: the previous checkpoint stays the valid one
            logger.warning(
                f"iteration {done}: no checkpoint in {self.directory} ({exc}); the one at iteration "
                f"{self.latest.iteration} stays valid"
            )
            return
        self.latest = StoredCheckpoint(done, self.directory)

    async def _gathered(self, info: BlockInfo, done: int, extra: dict[str, Any]) -> None:
        """The driver path: gather the weights to the client, keep them, hand them to ``on_checkpoint``."""
        try:
            params, opt_state = await info.driver.gather(with_state=True)
        except (
            WorkerLostError
        ) as exc:  # the next block notices the loss and recovers; the old checkpoint stays
            logger.warning(f"iteration {done}: no checkpoint: {exc}")
            return
        self.latest = Checkpoint(done, tuple(params), opt_state)
        if self.on_checkpoint is not None:
            state = {
                "iteration": done,
                "params": params,
                "optimizer_state": opt_state,
                "plan": info.driver.plan,
                "errors": self._errors(info.driver, done),
                **extra,
            }
            await asyncio.get_running_loop().run_in_executor(None, self.on_checkpoint, state)


class ValidationCallback(TrainingCallback):
    """Evaluate the validation set at the recipe's points (blocks end there) and stop early when the
    :class:`~dask_rpm.nn.recipe.Validator` says so. The weights are gathered to the client for it."""

    def __init__(self, validator: Any) -> None:
        self.validator = validator

    def boundary(self, done: int) -> int | None:
        return self.validator.next_point(done)

    async def after_block(self, info: BlockInfo) -> str | None:
        done = info.iteration
        v = self.validator
        if (
            info.status not in ("ok", "target")
            or not v.due(done)
            or (v.rows and v.rows[-1][0] >= done)
        ):
            return None
        return v.evaluate(done, await info.driver.gather())


class EpochRuleCallback(TrainingCallback):
    """An end-of-epoch rule (:class:`dask_rpm.nn.convergence.ConvergenceRule`, or any object with its
    ``end_epoch`` and ``needs_weights``) run by the engine: blocks end on epoch ends, the rule gets
    the epoch's summed error (the weights gathered when it scores them), its learning rate
    becomes the next blocks' and its reason to stop stops training."""

    def __init__(self, rule: Any, per_epoch: int) -> None:
        self.rule = rule
        self.per_epoch = int(per_epoch)
        self.last = 0

    def boundary(self, done: int) -> int | None:
        return self.per_epoch - done % self.per_epoch

    async def after_block(self, info: BlockInfo) -> str | None:
        done = info.iteration
        if info.status not in ("ok", "target") or done % self.per_epoch or done <= self.last:
            return None
        self.last = done
        # (each iteration's error times the recipe's scale: 1, or a weighted batch's size / weight sum)
        scale, error = info.driver.recipe.error_scale, info.driver.log.error
        total = epoch_error(error(it) * scale(it) for it in range(done - self.per_epoch, done))
        if self.rule.needs_weights:
            decision = self.rule.end_epoch(total, await info.driver.gather())
        else:
            decision = self.rule.end_epoch(total)
        info.driver.eps = float(decision.learning_rate)
        return decision.stop


class StopAtTarget(TrainingCallback):
    """Stop at the first iteration whose error is at most ``target`` (the workers check it in-block)."""

    def __init__(self, target: float) -> None:
        self.target_error = float(target)

    def after_block(self, info: BlockInfo) -> str | None:
        if info.status != "target":
            return None
        return f"target error {self.target_error:g} reached at iteration {info.iteration - 1}"


class ShouldStop(TrainingCallback):
    """Stop when ``should_stop()`` is true after a block (e.g. a walltime signal)."""

    def __init__(self, should_stop: Callable[[], bool]) -> None:
        self.should_stop = should_stop

    def after_block(self, info: BlockInfo) -> str | None:
        if info.iteration < info.iterations and self.should_stop():
            return f"stop requested after iteration {info.iteration}"
        return None


class FunctionCallback(TrainingCallback):
    """Call ``fn(info_dict)`` after every block (``fit(callback=...)``)."""

    def __init__(self, fn: Callable[[dict[str, Any]], Any]) -> None:
        self.fn = fn

    def after_block(self, info: BlockInfo) -> None:
        self.fn(info.as_dict())


class DashboardCallback(TrainingCallback):
    """Tell the scheduler plugin (``/rpm`` page) the plan and the remaps; iterations it gets from the workers."""

    def __init__(self, emulation: str | None, validator: Any = None) -> None:
        self.emulation = emulation
        self.validator = validator
        self._validations = 0
        self.plan: Plan | None = None

    async def before_training(self, driver: Driver, total: int) -> None:
        self.plan = driver.plan
        await driver.client.scheduler.rpm_update(
            run=driver.run,
            info={
                "plan": driver.plan.to_dict(),
                "iterations_total": total,
                "emulation": self.emulation,
            },
        )

    async def after_block(self, info: BlockInfo) -> None:
        await self._push(info.driver, info.remaps)

    async def after_training(self, driver: Driver, stopped: str | None) -> None:
        await self._push(
            driver, []
        )  # what a callback that stopped training saw last (e.g. a validation)

    async def _push(self, driver: Driver, remaps: list[RemapRecord]) -> None:
        update: dict[str, Any] = {}
        if driver.plan is not self.plan:
            self.plan = driver.plan
            update["plan"] = self.plan.to_dict()
        if remaps:
            update["remaps"] = [jsonable(r) for r in remaps]
        if self.validator is not None and len(self.validator.rows) != self._validations:
            self._validations = len(self.validator.rows)
            update["validation"] = [list(map(float, r)) for r in self.validator.rows[-200:]]
        if update:
            await driver.client.scheduler.rpm_update(run=driver.run, info=update)
