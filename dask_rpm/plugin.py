"""Scheduler plugin: records the timings of ``rpm-*`` tasks and the errors of each iteration.

The plugin only *records* (cheap ``transition``, bounded buffers); estimating
abilities and deciding remaps live in pure modules (:mod:`dask_rpm.estimator`,
:mod:`dask_rpm.policy`) that the driver calls between iterations, and the
dashboard only displays what is recorded here.

Task keys are tuples ``("rpm-<phase>-<run>", iteration, index)``, so Dask's
task stream groups them by phase (``rpm-forward``, ``rpm-vertical``, ...).

Use it from a client session (:func:`dask_rpm.fit` registers it for you)::

    client.register_plugin(RPMSchedulerPlugin())

or as a scheduler preload, e.g. in dask-jobqueue's
``scheduler_options={"preload": ["dask_rpm.plugin"]}`` or
``dask scheduler --preload dask_rpm.plugin``.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin

__all__ = ["RPMSchedulerPlugin", "PLUGIN_NAME", "TOPIC", "parse_key", "dask_setup"]

PLUGIN_NAME = "rpm"
TOPIC = "rpm"


# Key prefix -> phase name (see dask_rpm.engine on why "backwards").
_PHASE_ALIASES = {"backwards": "backward"}


def parse_key(key: Any) -> tuple[str, str, int, Any] | None:
    """``(phase, run, iteration, index)`` of an rpm task key, or ``None`` for other keys."""
    if type(key) is not tuple or len(key) != 3:
        return None
    name = key[0]
    if not isinstance(name, str) or not name.startswith("rpm-"):
        return None
    parts = name.split("-", 2)
    if len(parts) != 3:
        return None
    phase = _PHASE_ALIASES.get(parts[1], parts[1])
    return phase, parts[2], key[1], key[2]


class _Run:
    """What is recorded for one training run (bounded)."""

    __slots__ = ("timings", "errors", "info", "seq", "started", "updated")

    def __init__(self, maxlen: int) -> None:
        self.timings: deque[tuple] = deque(maxlen=maxlen)
        self.errors: deque[tuple] = deque(maxlen=maxlen)
        self.info: dict[str, Any] = {}
        self.seq = 0
        self.started = time.time()
        self.updated = self.started


class RPMSchedulerPlugin(SchedulerPlugin):
    """Record per-task compute and transfer times of ``rpm-*`` tasks.

    Parameters
    ----------
    max_records : int
        Bound on timing and error records kept per run (oldest dropped first).
    max_runs : int
        Number of runs remembered (oldest forgotten first).
    """

    name = PLUGIN_NAME

    def __init__(self, max_records: int = 200_000, max_runs: int = 8) -> None:
        self.max_records = int(max_records)
        self.max_runs = int(max_runs)
        self.runs: OrderedDict[str, _Run] = OrderedDict()
        self.scheduler: Any = None

    # ------------------------------------------------------------- lifecycle
    async def start(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        scheduler.handlers.update(
            {
                "rpm_pull": self.pull,
                "rpm_update": self.update,
                "rpm_state": self.state,
            }
        )
        # Dashboard page and metrics, if the dashboard module is present.
        try:
            from . import dashboard

            dashboard.install(scheduler, self)
        except ImportError:  # pragma: no cover - dashboard is optional
            pass

    def _run(self, run: str) -> _Run:
        rec = self.runs.get(run)
        if rec is None:
            rec = self.runs[run] = _Run(self.max_records)
            while len(self.runs) > self.max_runs:
                self.runs.popitem(last=False)
        return rec

    # -------------------------------------------------------------- recording
    def transition(self, key: Any, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
        if finish != "memory":
            return
        parsed = parse_key(key)
        if parsed is None:
            return
        phase, run, iteration, index = parsed
        compute_start = compute_stop = float("nan")
        transfer = 0.0
        for ss in kwargs.get("startstops", ()):
            action = ss.get("action")
            if action == "compute":
                compute_start, compute_stop = ss["start"], ss["stop"]
            elif action == "transfer":
                transfer += ss["stop"] - ss["start"]
        rec = self._run(run)
        rec.seq += 1
        rec.updated = time.time()
        rec.timings.append(
            (rec.seq, phase, iteration, index, kwargs.get("worker"), compute_start, compute_stop, transfer)
        )

    def log_event(self, topic: str, msg: Any) -> None:
        if topic != TOPIC or not isinstance(msg, dict):
            return
        kind = msg.get("kind")
        if kind == "error":
            rec = self._run(msg["run"])
            rec.seq += 1
            rec.errors.append((rec.seq, msg["iteration"], msg["column"], msg["error"]))
        elif kind == "nonfinite":  # an update produced non-finite weights
            rec = self._run(msg["run"])
            rec.seq += 1
            rec.errors.append((rec.seq, msg["iteration"], None, float("nan")))

    # ----------------------------------------------------------- handlers
    def pull(self, run: str, since: int = 0) -> dict[str, Any]:
        """Records of ``run`` newer than sequence number ``since``."""
        rec = self.runs.get(run)
        if rec is None:
            return {"seq": since, "timings": [], "errors": []}
        return {
            "seq": rec.seq,
            "timings": [t for t in rec.timings if t[0] > since],
            "errors": [e for e in rec.errors if e[0] > since],
        }

    def update(self, run: str, info: dict[str, Any]) -> None:
        """Driver pushes what only it knows (plan, abilities, remaps, iteration times)."""
        rec = self._run(run)
        for k, v in info.items():
            # RPC decodes lists as tuples: append those too, and keep a list to extend.
            if isinstance(v, (list, tuple)) and k in ("abilities", "remaps", "iterations"):
                rec.info.setdefault(k, []).extend(v)
                # bounded like the timing buffers
                del rec.info[k][: max(0, len(rec.info[k]) - self.max_records)]
            else:
                rec.info[k] = v
        rec.updated = time.time()

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
        return out


def dask_setup(scheduler: Any) -> None:
    """Scheduler preload entry point: ``--preload dask_rpm.plugin``."""
    scheduler.add_plugin(RPMSchedulerPlugin())
