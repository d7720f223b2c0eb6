"""The block loop of one run: blocks, membership changes, DRPM checks, retirement, callbacks.

The loop does the plumbing; every decision is a pure function's (planners, DRPM policy,
estimator, retirement rule).
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

import numpy as np

from ..plan.partition import Plan
from ..records import RemapRecord, remap_record
from . import callbacks as cb
from . import retirement
from .checkpoint import StoredCheckpoint
from .driver import Driver, Placed, ordered_workers
from .drpm import DRPMState
from .errors import TrainingError, WorkerLostError
from .options import RunOptions
from .records import Checkpoint
from .recovery import rebalance, recover, whole_plan
from .tasks import run_deadline

logger = logging.getLogger("dask_rpm")

#: Seconds between checks for ended batch jobs after a worker was lost (until its job is found).
SUSPECT_CHECK = 1.0


__all__ = ["TrainingLoop"]


class TrainingLoop:
    """The block loop: run a block, then membership changes or a DRPM check, then the callbacks."""

    def __init__(
        self,
        driver: Driver,
        opts: RunOptions,
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
        # when a worker was lost (None: none since the last ended job was found): look for ended
        # jobs at every boundary (at most every SUSPECT_CHECK s) until its job shows as ended
        self.suspect_since: float | None = None
        self._jobs_checked = time.monotonic()
        self.deadlines: dict[str, float] = {}
        self._deadlines_for = -1
        self.margin = opts.engine.retire_margin
        self.placed: Placed | None = None  # what placing the first shards moved (install)

    def progress(self, driver: Driver) -> None:
        for h in self.hooks:
            h.on_progress(driver)

    def _block_size(self, done: int) -> int:
        sizes = [self.interval, self.driver.recipe.iterations - done]
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

    async def install(self, start: Checkpoint | StoredCheckpoint) -> None:
        """Place the first shards; a worker lost while they are placed is left out (a new plan)."""
        d = self.driver
        for _ in range(len(d.addresses)):
            try:
                self.placed = await d.install(d.plan, start)
                self._no_buddy(start)
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
                    remap_record(
                        start.iteration,
                        "whole",
                        seconds=time.perf_counter() - t0,
                        reason=reason,
                        lost=list(exc.workers),
                        joined=[],
                        # the start's weights: the initial ones, or a resumed checkpoint's
                        recovered_from="checkpoint" if start.iteration else "initial weights",
                        replayed=0,
                    )
                )
        raise TrainingError(
            "could not place the first shards: workers kept leaving"
        )  # pragma: no cover

    def _no_buddy(self, start: Checkpoint | StoredCheckpoint) -> None:
        """Say it when a run with buddy copies on has no worker to keep them (one worker)."""
        d = self.driver
        if d.book is None or len(d.plan.planned_workers) != 1:
            return
        where = (
            f"the checkpoint store {self.opts.checkpoint_dir} (every {self.opts.checkpoint_every} "
            f"iterations)"
            if self.opts.checkpoint_dir
            else "the last checkpoint"
            if self.opts.checkpoint_every
            else f"iteration {start.iteration} (no checkpoint configured)"
        )
        logger.info(
            f"one worker trains: no buddy to keep copies of its rows (rpm.resilience); if it is "
            f"lost, training starts again from {where}"
        )

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
        driver, total = self.driver, self.driver.recipe.iterations
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
            eps = driver.eps
            for h in self.hooks:
                try:
                    reason = await cb.call(h.after_block(info))
                except WorkerLostError as exc:  # e.g. a gather or a remap a callback asked for
                    await self._recover(exc)
                    continue
                if reason:
                    logger.info(reason)
                    return str(reason)
            if driver.eps != eps:  # the iterations before ran at another rate: never go back there
                driver.floor = driver.iteration
        return None

    async def _recover(self, exc: WorkerLostError) -> None:
        """Go on without the lost workers (``on_worker_loss="recover"``), or raise; their jobs may have ended."""
        if self.opts.on_worker_loss == "raise":
            raise exc
        self.remaps.append(await recover(self.driver, exc, self.ckpt.latest))
        if self.suspect_since is None:  # look for ended batch jobs from the next boundary on
            self.suspect_since = time.monotonic()

    async def _replace_lost_jobs(self) -> None:
        """On a batch-system cluster that can (``replace_lost``, e.g. SLURM groups), resubmit ended jobs;
        their workers join later and are absorbed like any new worker."""
        cluster = getattr(self.driver.client, "cluster", None)
        engine = self.opts.engine
        if not hasattr(cluster, "replace_lost") or not engine.replace_lost:
            return
        now = time.monotonic()
        since = self.suspect_since
        wait = SUSPECT_CHECK if since is not None else engine.replace_check
        if now - self._jobs_checked < wait:
            return
        self._jobs_checked = now
        assert cluster is not None  # hasattr(cluster, "replace_lost") above
        try:
            replaced = await cluster.replace_lost()
        except Exception as exc:  # sbatch failing must not stop training
            logger.warning(f"could not resubmit ended jobs: {exc}")
            return
        # a cancelled job shows as ended a little after its worker is gone (and a recovery from a
        # buddy's copy may be done before): keep looking for up to replace-check seconds
        if replaced or (since is not None and now - since >= engine.replace_check):
            self.suspect_since = None
        for old, new in replaced.items():
            logger.warning(
                f"iteration {self.driver.iteration}: job {old} ended; submitted {new} to replace it"
            )

    async def _between_blocks(self, first: int, names: dict[str, Any]) -> None:
        """Retire workers whose lifetime ends, resubmit ended jobs, take in workers that joined (elastic),
        else let DRPM check."""
        driver = self.driver
        handed = await retirement.hand_over(driver)  # workers asked to retire (retire_workers)
        if handed is not None:
            self.remaps.append(handed)
            return
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
                driver.recipe.iterations - driver.iteration,
                self.interval,
            )

    def _diverged(self, keep: int | None) -> str:
        msg = (
            f"training diverged: iteration {keep} produced a non-finite error or non-finite weights "
            f"(learning_rate={self.driver.recipe.learning_rate} is probably too large); returning the last finite "
            f"weights, after {keep} iteration(s)"
        )
        logger.warning(msg)
        return msg

    async def final_weights(self, stopped: str | None) -> tuple[list[np.ndarray], dict[str, Any]]:
        """Gather the final parameters and optimizer state; a worker lost now is recovered from like
        one lost mid-run."""
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
