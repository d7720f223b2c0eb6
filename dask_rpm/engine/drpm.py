"""DRPM between blocks: estimate abilities from the timing log, decide, remap (docs/drpm.md)."""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Mapping
from typing import Any

import numpy as np

from .._files import json_default
from ..drpm.estimator import AbilityEstimateError, AbilityEstimator
from ..drpm.idle import (
    comm_excess,
    comm_scale,
    idle_decision,
    idle_remap,
    iteration_rates,
    scaled_network,
    worker_rates,
)
from ..drpm.policy import auto_interval, decide
from ..drpm.remap import column_remap, whole_remap
from ..drpm.settings import DRPMSettings
from ..plan.partition import PlanError
from ..probe import probe_network
from ..records import RemapRecord
from .driver import Driver
from .recovery import whole_plan

__all__ = ["DRPMState", "jsonable"]

logger = logging.getLogger("dask_rpm")


def _num(v: float) -> float | None:
    return float(v) if np.isfinite(v) else None


def jsonable(rec: Mapping[str, Any]) -> dict[str, Any]:
    """A remap record with numpy scalars as plain values (:func:`dask_rpm._files.json_default`),
    for the scheduler's messages and checkpoints."""
    return {k: (json_default(v) if isinstance(v, np.generic) else v) for k, v in rec.items()}


def _modify_seconds(driver: Driver, first: int, stop: int) -> float:
    """The median over iterations ``[first, stop)`` (the first left out: it carries the boundary)
    of the slowest worker's optimizer step (``modify``); 0 when none was recorded."""
    its = list(range(first + 1 if stop - first > 1 else first, stop))
    table = driver.log.phase_table(its, len(driver.addresses))["modify"]
    with np.errstate(all="ignore"):
        worst = np.nanmax(np.where(np.isfinite(table), table, -np.inf), axis=1, initial=-np.inf)
    worst = worst[np.isfinite(worst)]
    return float(np.median(worst)) if worst.size else 0.0


class DRPMState:
    """Estimator, checks and remaps of one DRPM run.

    ``settings``: ``rpm.drpm.*`` (:class:`~dask_rpm.drpm.settings.DRPMSettings`), read once
    here when ``None``; every check of the run decides with them.
    """

    def __init__(
        self, *, initial_abilities: bool, auto: bool, settings: DRPMSettings | None = None
    ) -> None:
        self.settings = DRPMSettings.resolve(settings)
        s = self.settings
        self.estimator = AbilityEstimator(window=s.window, outlier=s.outlier)
        # Validated here, before any iteration runs, not at the first check.
        self.column_times = s.column_times
        if self.column_times not in ("tc", "t1"):
            raise ValueError(
                f"rpm.drpm.column-times must be 'tc' (compute without the wait) or 't1' (the paper's), "
                f"got {self.column_times!r}"
            )
        self.initial_abilities = initial_abilities
        self.auto = auto
        self.checks: list[tuple[int, np.ndarray]] = []
        self.remaps: list[RemapRecord] = []
        # leave workers idle whose messages cost more than their share saves (drpm/idle.py)
        self.idle = s.idle
        self.remembered: dict[int, float] = {}  # rates measured by the probe, by worker index
        self.network: Any = None  # the probe's links (None: rpm.cost.*)
        # (predicted, measured) communication of the plans checked (drpm.idle.comm_excess)
        self.comm_points: deque[tuple[float, float]] = deque(maxlen=self.estimator.window)

    def probed(self, probe: Any, addresses: list[str]) -> None:
        """Keep the probe's rates (for workers DRPM never measured, e.g. idle from the start)
        and its links (the cost model of the idle choices)."""
        if probe is None:
            return
        at = {str(a): float(v) for a, v in zip(probe["address"].values, probe["throughput"].values)}
        self.remembered = {i: at[a] for i, a in enumerate(addresses) if a in at}
        self.network = probe_network(probe)

    def _rates(
        self, driver: Driver, t2: dict, first: int, stop: int
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """Abilities and rates of every worker of the plan for the idle choices (None: off, or
        after a worker loss, when the plan's indices no longer match the cluster's); measures
        :attr:`comm_scale` on the iterations ``[first, stop)`` of the current plan."""
        if not self.idle or driver.gone or len(driver.plan.abilities) != len(driver.addresses):
            return None
        tc: dict[int, float] = {}
        ab: dict[int, float] = dict(t2)
        for w in self.estimator.workers:  # planned now, or planned before and idle since
            try:
                tc.update(self.estimator.estimate("tc", workers=[w]))
                if w not in ab:
                    ab.update(self.estimator.estimate("t2", workers=[w]))
            except AbilityEstimateError:
                continue
        # the estimator's work is the plan area; one mini-batch iteration computes a part of it
        tc = iteration_rates(tc, driver.plan.samples, driver.recipe.schedule.batch)
        try:
            rates = worker_rates(driver.plan, tc, ab, self.remembered)
        except PlanError as exc:
            logger.info(f"idle check skipped: {exc}")
            return None
        # what its messages cost: the iteration less the optimizer step, which the cost model
        # does not price (it would count as communication and make every message look dearer)
        seconds = driver.log.median_iteration_time(first, stop) - _modify_seconds(
            driver, first, stop
        )
        batch = driver.recipe.schedule.batch
        point = comm_excess(driver.plan, rates[1], seconds, network=self.network, batch=batch)
        if point is not None:
            self.comm_points.append(point)
        return rates

    @property
    def comm_scale(self) -> float:
        """Measured communication over the model's (:func:`~dask_rpm.drpm.idle.comm_scale`)."""
        return comm_scale(self.comm_points)

    def _idle_check(
        self, driver: Driver, decision: Any, rates: Any, remaining: int, stop: int
    ) -> Any:
        """``decision``, or the idle check's whole remap when other workers pay
        (:func:`~dask_rpm.drpm.idle.idle_decision`)."""
        idle = idle_decision(
            driver.plan,
            *rates,
            remaining=remaining,
            ratio=decision.ratio,
            network=self.network,
            comm_scale=self.comm_scale,
            batch=driver.recipe.schedule.batch,
            settings=self.settings,
        )
        if idle.kind is None and not np.isnan(idle.saving):  # another set, rejected: say why
            logger.info(f"check at iteration {stop}: {idle.reason}")
        return idle if idle.kind else decision

    def to_dict(self) -> dict[str, Any]:
        """The state a resumed run needs (JSON-able): checks so far, estimator windows, initial abilities.

        Workers are plan indices (the order of :func:`~dask_rpm.engine.ordered_workers`).
        """
        return {
            "initial_abilities": bool(self.initial_abilities),
            "comm_points": [[float(p), float(m)] for p, m in self.comm_points],
            "checks": [
                [int(it), [None if not np.isfinite(v) else float(v) for v in vec]]
                for it, vec in self.checks
            ],
            "windows": {
                str(w): [
                    [o.work, o.t1, _num(o.t2), _num(o.tc)] for o in self.estimator.observations(w)
                ]
                for w in self.estimator.workers
            },
        }

    def restore(self, state: dict[str, Any], n_workers: int) -> None:
        """Continue from :meth:`to_dict` of a stopped run with ``n_workers`` workers (indices beyond are dropped).

        With the checks restored the next check is not a first check, so a run
        that was resumed on its saved plan is not sent back through a
        uniform start; with the windows restored its estimates need no new
        window of iterations first.
        """
        self.initial_abilities = bool(state.get("initial_abilities", True))
        self.comm_points.extend((float(p), float(m)) for p, m in state.get("comm_points", []))
        self.checks = [
            (int(it), np.array([np.nan if v is None else v for v in vec], dtype=float)[:n_workers])
            for it, vec in state.get("checks", [])
        ]
        for w, rows in state.get("windows", {}).items():
            if int(w) < n_workers:
                for work, t1, t2, tc in rows:
                    self.estimator.observe(int(w), work, t1, t2, tc)

    def _observe(self, driver: Driver, first: int, stop: int) -> None:
        plan = driver.plan
        for ob in driver.log.observations(
            first, stop, plan.planned_workers, lambda w: plan.rectangle(w).area
        ):
            self.estimator.observe(ob.worker, ob.work, ob.t1, ob.t2, ob.tc)

    def _new_plan(
        self, driver: Driver, decision: Any, speeds_col: dict, speeds_t2: dict, rates: Any
    ) -> Any:
        new = getattr(decision, "plan", None)
        if driver.gone and new is not None and set(new.planned_workers) & driver.gone:
            new = None  # planned from abilities that still count lost workers: plan again below
        batch = driver.recipe.schedule.batch
        if decision.kind == "whole" and new is None:
            # After a worker loss, plan only the workers still there.
            if driver.gone:
                new = whole_plan(driver, speeds_t2)
            elif rates is not None:  # workers whose messages cost more than they save: idle
                new = idle_remap(
                    driver.plan,
                    *rates,
                    network=self.network,
                    comm_scale=self.comm_scale,
                    batch=batch,
                    settings=self.settings,
                )
            else:
                new = whole_remap(driver.plan, speeds_t2, batch=batch)
        elif decision.kind == "column" and new is None:
            new = column_remap(driver.plan, speeds_col)
        return new

    async def check(
        self, driver: Driver, first: int, stop: int, remaining: int, interval: int
    ) -> int:
        """One DRPM check after iterations ``[first, stop)``; returns the interval to the next one."""
        self._observe(driver, first, stop)
        planned = driver.plan.planned_workers
        try:
            times = self.estimator.recent_times("t1", workers=planned)
            speeds_col = self.estimator.estimate(self.column_times, workers=planned)  # type: ignore[arg-type]
            speeds_t2 = self.estimator.estimate("t2", workers=planned)
        except AbilityEstimateError as exc:  # e.g. a worker that just joined has no times yet
            logger.info(f"check at iteration {stop}: skipped ({exc})")
            return interval
        policy = self.settings.policy
        kw: dict[str, Any] = {}
        if policy == "cost":
            kw = {
                "plan": driver.plan,
                "speeds": speeds_col,
                "whole_speeds": speeds_t2,
                "remaining": remaining,
                "row_bytes": driver.sender.row_bytes(driver),
            }
        rates = self._rates(driver, speeds_t2, first, stop)
        if policy == "cost" and rates is not None:  # its whole candidate leaves idle workers too
            kw["whole_speeds"] = list(rates[0])
            kw["whole_kwargs"] = self._idle_kwargs(driver, rates)
        decision = decide(
            times,
            policy=policy,
            first_check=not self.checks,
            initial_abilities=self.initial_abilities,
            settings=self.settings,
            **kw,
        )
        if decision.kind != "whole" and rates is not None:
            decision = self._idle_check(driver, decision, rates, remaining, stop)
        vec = np.full(len(driver.plan.abilities), np.nan)
        for w, v in speeds_t2.items():
            vec[w] = v
        self.checks.append((stop, vec))
        new = self._new_plan(driver, decision, speeds_col, speeds_t2, rates)
        line = f"check at iteration {stop}: t_min/t_max = {decision.ratio:.2f}; {decision.reason}"
        if new is not None:  # Dask's data: the cuts on chunk boundaries (driver.remap's too)
            new = driver.sender.snapped(driver, new)
            if set(new.rectangles) == set(driver.plan.rectangles):
                new = None
                line += "; on the data's chunk boundaries that is the current plan: kept"
        if new is not None and decision.kind:
            rec = await driver.remap(new, decision.kind)
            rec["reason"] = decision.reason
            self.remaps.append(rec)
            line += (
                f" -> {decision.kind} remap, {rec['bytes']} weight bytes in {rec['seconds']:.3f} s"
            )
        logger.info(line)
        total = float(np.nansum(vec))
        await driver.client.scheduler.rpm_update(
            run=driver.run,
            info={
                "abilities": [
                    {
                        "check": len(self.checks) - 1,
                        "iteration": stop,
                        "abilities": [
                            None if not np.isfinite(v) else float(v / total) for v in vec
                        ],
                    }
                ]
            },
        )
        if self.auto:
            secs = driver.log.median_iteration_time(first, stop)
            if np.isfinite(secs) and secs > 0:
                interval = auto_interval(secs, settings=self.settings)
        return interval

    def _idle_kwargs(self, driver: Driver, rates: tuple[np.ndarray, np.ndarray]) -> dict:
        """``whole_remap`` keywords of the idle choice (the cost policy's whole candidate)."""
        return {
            "rates": list(rates[1]),
            "network": scaled_network(self.network, self.comm_scale),
            "idle": True,
            "batch": driver.recipe.schedule.batch,
        }

    def add_to_history(self, history: Any) -> None:
        if not self.checks:
            return
        # Workers that joined during the run make later vectors longer: pad with NaN.
        width = max(max(v.size for _, v in self.checks), int(history.sizes.get("worker", 0)))
        ab = np.array(
            [np.pad(v, (0, width - v.size), constant_values=np.nan) for _, v in self.checks]
        )
        with np.errstate(invalid="ignore"):
            ab = ab / np.nansum(ab, axis=1, keepdims=True)
        history["ability"] = (
            ("check", "worker"),
            ab,
            {
                "units": "1",
                "description": "estimated ability (t2 least squares), normalised to sum 1 at each check",
            },
        )
        history.coords["check_iteration"] = ("check", np.array([it for it, _ in self.checks]))
