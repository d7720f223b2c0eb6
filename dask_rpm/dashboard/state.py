"""The dashboard's pure state: the JSON snapshot built from what the scheduler plugin recorded.

No Bokeh, no tornado, no ``distributed``: :func:`snapshot` reads a
:class:`Recorder` (the scheduler plugin, or anything with its ``runs`` and
``state``) and returns a JSON-safe dict that the ``/rpm/state.json`` route,
the Bokeh page and the Prometheus collector all read.
"""

from __future__ import annotations

import logging
import math
import weakref
from collections.abc import Mapping
from typing import Any, Protocol

from ..ordering import ordered_workers

logger = logging.getLogger("dask_rpm.dashboard")

__all__ = ["Recorder", "Installed", "snapshot", "clean", "finite", "latest_estimates"]


class Recorder(Protocol):
    """What the dashboard reads of :class:`dask_rpm.plugin.RPMSchedulerPlugin`.

    ``runs`` maps run ids to their records (each with an ``updated`` time);
    ``state(run)`` is the JSON-able state of one run.
    """

    runs: Mapping[str, Any]

    def state(self, run: str | None = None) -> dict[str, Any]: ...


class Installed:
    """What the dashboard set up on one scheduler: where to read the records, and caches.

    Parameters
    ----------
    scheduler : distributed.Scheduler
        Held weakly (the handlers outlive nothing).
    plugin : Recorder, optional
        The recorder to read. ``None``: look it up by ``plugin_name`` in the
        scheduler's plugins on every read, so a recorder registered later (or
        again) is found.
    prefix : str
        The dashboard's URL prefix (``""`` or ``"/name"``).
    plugin_name : str, optional
        Name of the recorder among the scheduler's plugins (when no ``plugin``).
    """

    def __init__(
        self,
        scheduler: Any,
        plugin: Recorder | None,
        prefix: str,
        plugin_name: str | None = None,
    ) -> None:
        self.scheduler_ref = weakref.ref(scheduler)
        self.plugin = plugin
        self.plugin_name = plugin_name
        self.prefix = prefix
        self.page = False
        self.json = False
        # run -> last worker addresses seen in a plan of that run: a later plan
        # may come without them (it still indexes the same workers).
        self.workers: dict[str, list[Any]] = {}

    def recorder(self) -> Recorder | None:
        """The recorder to read: the one given, else the scheduler's plugin of that name."""
        if self.plugin is not None:
            return self.plugin
        scheduler = self.scheduler_ref()
        plugins = getattr(scheduler, "plugins", None) or {}
        return plugins.get(self.plugin_name) if self.plugin_name is not None else None

    def snapshot(self, run: str | None = None, **kw: Any) -> dict[str, Any]:
        """:func:`snapshot` of this scheduler's recorder (an empty state without one)."""
        return snapshot(
            self.recorder(),
            run=run,
            known_workers=self.workers,
            scheduler=self.scheduler_ref(),
            **kw,
        )


def clean(obj: Any) -> Any:
    """JSON-safe copy: tuples become lists, non-finite floats ``None``, numpy scalars Python."""
    if isinstance(obj, Mapping):
        return {str(k): clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [clean(v) for v in obj]
    if isinstance(obj, bool) or obj is None or isinstance(obj, (int, str)):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    try:  # numpy scalars and the like
        value = obj.item()
    except (AttributeError, ValueError):
        return str(obj)
    return clean(value)


def finite(v: Any) -> float | None:
    """``float(v)`` when that is a finite number, else ``None``."""
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def latest_estimates(abilities: Any, n: int) -> list[float | None]:
    """Most recent non-null estimate per worker index from the ``abilities`` checks."""
    out: list[float | None] = [None] * n
    for check in reversed(list(abilities or ())):
        values = check.get("abilities") if isinstance(check, Mapping) else None
        for i, v in enumerate(values or ()):
            if i < n and out[i] is None:
                out[i] = finite(v)
        if all(v is not None for v in out):
            break
    return out


def _scheduler_order(scheduler: Any) -> list[str]:
    """The scheduler's worker addresses in :func:`dask_rpm.ordering.ordered_workers` order."""
    try:
        workers = {a: {"name": ws.name} for a, ws in scheduler.workers.items()}
        return ordered_workers({"workers": workers})
    except Exception:
        logger.debug("rpm dashboard: could not order the scheduler's workers", exc_info=True)
        return []


def _plan_workers(
    state: Mapping[str, Any],
    n: int,
    known_workers: dict[str, list[Any]] | None,
    scheduler: Any,
) -> tuple[list[Any], str | None]:
    """Worker addresses of the plan, and where they came from (``None``: not known)."""
    run_id = state.get("run")
    workers = list((state.get("plan") or {}).get("workers") or ())
    source = "plan" if workers else None
    if known_workers is not None and run_id is not None:
        if workers:
            known_workers[run_id] = workers
        elif len(known_workers.get(run_id, ())) == n:
            workers, source = known_workers[run_id], "earlier plan"
    if not workers and scheduler is not None and n:
        ordered = _scheduler_order(scheduler)
        if len(ordered) == n:
            workers, source = ordered, "scheduler order"
    return workers, source


def _rectangles(state: Mapping[str, Any], workers: list[Any]) -> list[dict[str, Any]]:
    """One dict per planned rectangle, with its worker's address, group and abilities."""
    plan = state.get("plan") or {}
    abilities = list(plan.get("abilities") or ())
    groups = state.get("groups") or {}
    estimates = latest_estimates(state.get("abilities"), len(abilities))
    rects = []
    for r in plan.get("rectangles") or ():
        w = r.get("worker")
        i = w if isinstance(w, int) else None
        address = (
            workers[i]
            if i is not None and i < len(workers)
            else (w if isinstance(w, str) else None)
        )
        rects.append(
            {
                "worker": w,
                "address": address,
                "group": groups.get(address) if address is not None else None,
                "column": r.get("column"),
                "samples": list(r.get("samples") or (0, 0)),
                "hidden": list(r.get("hidden") or (0, 0)),
                "ability": abilities[i] if i is not None and i < len(abilities) else None,
                "estimate": estimates[i] if i is not None and i < len(estimates) else None,
            }
        )
    return rects


def _summary(state: Mapping[str, Any], iterations: list[Any]) -> dict[str, Any]:
    """The headline numbers of a run (``summary`` of the snapshot)."""
    plan = state.get("plan") or {}
    remaps = list(state.get("remaps") or ())
    last = iterations[-1] if iterations else {}
    times = [t for t in (finite(row.get("time")) for row in iterations[-20:]) if t is not None]
    return {
        "iterations_done": (int(last["iteration"]) + 1)
        if isinstance(last.get("iteration"), int)
        else 0,
        "iterations_total": state.get("iterations_total"),
        "last_error": finite(last.get("error")),
        "last_time": finite(last.get("time")),
        "median_time": sorted(times)[len(times) // 2] if times else None,
        "remaps": {k: sum(1 for r in remaps if r.get("kind") == k) for k in ("column", "whole")},
        "method": plan.get("method"),
        "emulation": state.get("emulation"),
        "validation": list(state["validation"][-1]) if state.get("validation") else None,
    }


def _window(iterations: list[Any], since: int | None, tail: int | None) -> list[Any]:
    """The rows after iteration ``since``, then the last ``tail`` of them."""
    if since is not None:
        # Rows are in iteration order: scan back from the end (cheap on long runs).
        def after(row: Any) -> bool:
            it = finite(row.get("iteration")) if isinstance(row, Mapping) else None
            return it is not None and it > since

        first = len(iterations)
        while first > 0 and after(iterations[first - 1]):
            first -= 1
        iterations = iterations[first:]
    if tail is not None and tail >= 0:
        iterations = iterations[len(iterations) - min(tail, len(iterations)) :]
    return iterations


def snapshot(
    plugin: Recorder | None,
    run: str | None = None,
    *,
    tail: int | None = None,
    since: int | None = None,
    known_workers: dict[str, list[Any]] | None = None,
    scheduler: Any = None,
) -> dict[str, Any]:
    """The JSON served at ``/rpm/state.json``.

    Parameters
    ----------
    plugin : Recorder or None
        Its :meth:`state` is the base; missing keys are tolerated. ``None``
        (no recorder on the scheduler yet): an empty state.
    run : str, optional
        Run id; default the most recently updated run.
    tail : int, optional
        Keep only the last ``tail`` rows of ``iterations``.
    since : int, optional
        Keep only the ``iterations`` rows after iteration ``since`` (pollers
        ask for what they have not seen yet).
    known_workers : dict, optional
        Cache ``run -> worker addresses``, filled from plans that carry them
        and used for plans that do not.
    scheduler : distributed.Scheduler, optional
        Last resort for a plan without addresses: the scheduler's workers in
        :func:`dask_rpm.ordered_workers` order (the order ``fit`` indexes
        workers by), used only when their number matches the plan.

    Returns
    -------
    dict
        ``plugin.state(run)`` plus ``rectangles`` (one per planned worker:
        ``worker``, ``address``, ``group``, ``column``, ``samples``,
        ``hidden``, ``ability`` (planned, normalised), ``estimate`` (latest
        estimate or ``None``)), ``workers``, ``runs`` and ``summary``; all
        JSON-safe (non-finite numbers are ``null``).
    """
    state = dict((plugin.state(run) if plugin is not None else None) or {"run": None})
    n = len((state.get("plan") or {}).get("abilities") or ())
    workers, source = _plan_workers(state, n, known_workers, scheduler)
    iterations = list(state.get("iterations") or ())
    state["summary"] = _summary(state, iterations)
    state["iterations"] = _window(iterations, since, tail)
    state["rectangles"] = _rectangles(state, workers)
    state["workers"] = workers
    state["workers_source"] = source  # where the addresses came from (labels only)
    state["runs"] = list(getattr(plugin, "runs", {}) or ())
    return clean(state)
