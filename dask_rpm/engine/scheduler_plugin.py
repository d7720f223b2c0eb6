"""Scheduler plugin: records what the workers stream about each training run.

The workers time every iteration on their own clocks and stream the records
and the errors as ``rpm`` events (batched, at most every
``rpm.engine.report-seconds`` per worker); the plugin only *records* them
(O(1) per record, bounded buffers, one :class:`~dask_rpm.engine.timing.TimingLog`
per run) and serves them to the driver (``rpm_pull``) and to the ``/rpm``
dashboard page (``rpm_state``). Estimating abilities and deciding remaps live
in pure modules (:mod:`dask_rpm.drpm.estimator`, :mod:`dask_rpm.drpm.policy`) that the
driver calls between blocks.

The plugin knows nothing of the dashboard: :mod:`dask_rpm.dashboard` reads
it (as distributed's dashboard reads its task-stream plugin), installed by
its own :class:`~dask_rpm.dashboard.RPMDashboardPlugin`.

Use it from a client session (:func:`dask_rpm.fit` registers it for you)::

    client.register_plugin(RPMSchedulerPlugin())

or through the scheduler preload ``dask_rpm.plugin`` (recorder and
dashboard), e.g. in dask-jobqueue's
``scheduler_options={"preload": ["dask_rpm.plugin"]}`` or
``dask scheduler --preload dask_rpm.plugin``.
"""

from __future__ import annotations

import asyncio
import logging
import pickle
import time
from collections import OrderedDict, deque
from collections.abc import Sequence
from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin

from .timing import TimingLog
from .worker import PLUGIN_NAME as WORKER_PLUGIN_NAME
from .worker import RPMEnginePlugin

__all__ = ["RPMSchedulerPlugin", "PLUGIN_NAME", "TOPIC"]

logger = logging.getLogger("dask_rpm")

PLUGIN_NAME = "rpm"
TOPIC = "rpm"
#: worker statuses the driver counts as lost (distributed.core.Status names)
_LEAVING = frozenset({"closing_gracefully", "closing", "closed", "stopping", "stopped", "failed"})


class _Run:
    """What is recorded for one training run (bounded)."""

    __slots__ = ("log", "pulls", "info", "seq", "started", "updated", "holders", "hold")

    def __init__(self, maxlen: int) -> None:
        self.log = TimingLog(max_records=maxlen)
        # workers holding the run's rows, and how long a retirement of one may wait for them to
        # move (the driver's rpm_hold; empty once the run ends)
        self.holders: frozenset[str] = frozenset()
        self.hold = 0.0
        # (seq, records, errors) batches for the driver's incremental pulls
        self.pulls: deque[tuple[int, list, list]] = deque(maxlen=max(maxlen // 16, 64))
        self.info: dict[str, Any] = {}
        self.seq = 0
        self.started = time.time()
        self.updated = self.started


class RPMSchedulerPlugin(SchedulerPlugin):
    """Record the timing records and errors that training workers stream.

    Parameters
    ----------
    max_records : int
        Bound on timing and error records kept per run (oldest dropped first).
    max_runs : int
        Number of runs remembered (oldest forgotten first).
    """

    name = PLUGIN_NAME
    #: Registering it again (a second ``fit``, another client) keeps the
    #: running instance and what it recorded (distributed skips the new one).
    idempotent = True

    def __init__(self, max_records: int = 200_000, max_runs: int = 8) -> None:
        self.max_records = int(max_records)
        self.max_runs = int(max_runs)
        self.runs: OrderedDict[str, _Run] = OrderedDict()
        self.scheduler: Any = None
        self.asked: dict[
            str, float
        ] = {}  # workers asked to retire while they hold rows: since when
        self._retire: Any = None  # the scheduler's own retire_workers handler

    # ------------------------------------------------------------- lifecycle
    async def start(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        scheduler.handlers.update(
            {
                "rpm_pull": self.pull,
                "rpm_update": self.update,
                "rpm_state": self.state,
                "rpm_leaving": self.leaving,
                "rpm_hold": self.hold,
                "rpm_retiring": self.retiring,
            }
        )
        # A graceful retirement (client.retire_workers, an adaptive scale-down) of a worker that
        # holds a run's rows waits until the run has moved them, as at the end of a worker's
        # lifetime (engine.retirement): no rows are lost, nothing is computed again.
        if self._retire is None:
            self._retire = scheduler.handlers["retire_workers"]
            scheduler.handlers["retire_workers"] = self.retire_workers
        # What every run needs, installed once with this recorder (a later fit registers the
        # recorder again, idempotent, and finds all of it here): the /rpm dashboard that shows
        # what it records, and the worker plugin that holds each run's state on every worker,
        # those that join later included.
        from ..dashboard.scheduler import install  # bokeh: loaded where a scheduler runs only

        install(scheduler, PLUGIN_NAME)
        await scheduler.register_worker_plugin(
            None, pickle.dumps(RPMEnginePlugin()), name=WORKER_PLUGIN_NAME, idempotent=True
        )

    def _run(self, run: str) -> _Run:
        rec = self.runs.get(run)
        if rec is None:
            rec = self.runs[run] = _Run(self.max_records)
            while len(self.runs) > self.max_runs:
                self.runs.popitem(last=False)
        return rec

    # -------------------------------------------------------------- recording
    def log_event(self, topic: str, msg: Any) -> None:
        if topic != TOPIC or not isinstance(msg, dict) or msg.get("kind") != "iterations":
            return
        rec = self._run(msg["run"])
        records, errors = list(msg.get("records") or ()), list(msg.get("errors") or ())
        rec.log.add(records)
        rec.log.add_errors(errors)
        rec.seq += 1
        rec.pulls.append((rec.seq, records, errors))
        rec.updated = time.time()

    # ----------------------------------------------------------- handlers
    def pull(self, run: str, since: int = 0) -> dict[str, Any]:
        """Timing records and errors of ``run`` streamed after batch number ``since``."""
        rec = self.runs.get(run)
        if rec is None:
            return {"seq": since, "records": [], "errors": []}
        records: list = []
        errors: list = []
        for seq, r, e in rec.pulls:
            if seq > since:
                records.extend(r)
                errors.extend(e)
        return {"seq": rec.seq, "records": records, "errors": errors}

    def update(self, run: str, info: dict[str, Any]) -> None:
        """Driver pushes what only it knows (plan, abilities, remaps, iteration times)."""
        rec = self._run(run)
        if "forget_from" in info:  # recovery went back to an earlier iteration
            rec.log.forget_from(int(info.pop("forget_from")))
        for k, v in info.items():
            # RPC decodes lists as tuples: append those too, and keep a list to extend.
            if isinstance(v, (list, tuple)) and k in ("abilities", "remaps"):
                rec.info.setdefault(k, []).extend(v)
                # bounded like the timing buffers
                del rec.info[k][: max(0, len(rec.info[k]) - self.max_records)]
            else:
                rec.info[k] = v
        rec.updated = time.time()

    def leaving(self, workers: Sequence[str] = ()) -> list[str]:
        """Of ``workers``, those gone or on their way out: retiring gracefully
        (``client.retire_workers``, an adaptive scale-down), closing or closed.

        The scheduler lists a retiring worker until it has left, which can take tens of seconds;
        the driver treats it as lost at once. A *paused* worker (memory pressure) is still a
        member: it resumes, and its shard is still there.
        """
        out = []
        for addr in workers:
            ws = self.scheduler.workers.get(addr)
            if ws is None or ws.status.name in _LEAVING:
                out.append(addr)
        return out

    def hold(self, run: str, workers: Sequence[str] = (), seconds: float = 0.0) -> None:
        """The driver of ``run``: ``workers`` hold its rows now; a retirement of one waits up to
        ``seconds`` for the run to move them (none and 0 when the run ends)."""
        rec = self._run(run)
        rec.holders, rec.hold = frozenset(workers), float(seconds)

    def retiring(self, workers: Sequence[str] = ()) -> list[str]:
        """Of ``workers``, those asked to retire that wait for their rows to move (the driver
        moves them at its next block boundary)."""
        return sorted(a for a in workers if a in self.asked)

    def _holding(self, address: str) -> float:
        """How long a retirement of ``address`` may wait for its rows to move: the longest of
        the runs whose rows it holds (0: none)."""
        return max((r.hold for r in self.runs.values() if address in r.holders), default=0.0)

    async def retire_workers(
        self, workers: Sequence[str] | None = None, *, names: Sequence[Any] | None = None, **kw: Any
    ) -> Any:
        """The scheduler's ``retire_workers``, once the training runs holding rows on those workers
        have moved them to others (at most the longest ``hold`` seconds a run gave); workers of
        no run leave at once, as Dask retires them."""
        sched = self.scheduler
        if names is not None:
            wanted = {str(n) for n in names}
            targets = [a for a, ws in sched.workers.items() if str(ws.name) in wanted]
        elif workers is not None:
            targets = [a for a in workers if a in sched.workers]
        else:  # Dask chooses (an adaptive scale-down): hand over from the workers it chooses
            opts = {
                k: v for k, v in kw.items() if k not in ("close_workers", "remove", "stimulus_id")
            }
            targets = list(sched.workers_to_close(**opts))
            kw = {k: v for k, v in kw.items() if k not in opts}
            workers = targets
        wait = max((self._holding(a) for a in targets), default=0.0)
        if wait > 0:
            held = [a for a in targets if self._holding(a) > 0]
            logger.info(f"retire_workers: {', '.join(held)} hold training rows; moving them first")
            now = time.time()
            self.asked.update({a: now for a in held})
            deadline = time.monotonic() + wait
            try:
                while any(self._holding(a) > 0 for a in held) and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
            finally:
                for a in held:
                    self.asked.pop(a, None)
        return await self._retire(workers=workers, names=names, **kw)

    def state(self, run: str | None = None) -> dict[str, Any]:
        """JSON-able state of one run (default: the most recently updated)."""
        if not self.runs:
            return {"run": None}
        if run is None:
            run = max(self.runs, key=lambda r: self.runs[r].updated)
        rec = self.runs.get(run)
        if rec is None:
            return {"run": None}
        out = {"run": run, "started": rec.started, "updated": rec.updated}
        out.update(rec.info)
        out["iterations"] = rec.log.rows()
        return out
