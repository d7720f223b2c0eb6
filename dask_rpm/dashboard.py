"""Live view of rpm training on the scheduler's own dashboard (HTTP) server.

:func:`install` (called by :class:`~dask_rpm.plugin.RPMSchedulerPlugin` when it
starts, whether registered at runtime or loaded as a preload) adds, on the
dashboard port:

``/rpm``
    A Bokeh page, served by the same kind of Bokeh application the Dask
    dashboard uses, refreshed every 500 ms: the current rectangles drawn to
    scale, ability estimates over time, iteration time and error, remap
    events, and the emulation label of emulated clusters.
``/rpm/state.json``
    :meth:`RPMSchedulerPlugin.state` as JSON plus a top-level ``rectangles``
    list (with worker address, group, planned ability and latest estimate),
    ``runs`` and ``summary``. ``?run=<id>`` picks a run, ``?tail=<n>`` keeps
    only the last ``n`` iteration rows, ``?since=<i>`` the rows after
    iteration ``i``.
``/metrics``
    Prometheus gauges ``<ns>_rpm_*`` (``<ns>`` is
    ``distributed.dashboard.prometheus.namespace``, ``dask`` by default) from a
    custom collector, when ``prometheus_client`` is installed.

The dashboard only displays what the plugin recorded; it decides nothing.
Any failure here is logged and never stops the scheduler.
"""

from __future__ import annotations

import json
import logging
import math
import weakref
from collections.abc import Iterator, Mapping
from typing import Any

logger = logging.getLogger(__name__)

__all__ = ["install", "snapshot", "ROUTE", "STATE_ROUTE", "METRIC_NAMES", "REFRESH_MS"]

ROUTE = "/rpm"
STATE_ROUTE = "/rpm/state.json"
REFRESH_MS = 500
#: Names (after the namespace prefix) of the Prometheus gauges.
METRIC_NAMES = (
    "rpm_iteration_seconds",
    "rpm_iteration",
    "rpm_error",
    "rpm_worker_ability",
    "rpm_remaps",
)

_REMAP_COLORS = {"whole": "#d62728", "column": "#ff7f0e"}
_HATCHES = ("/", "\\", "x", ".", "+", "o", "-", "|")


# --------------------------------------------------------------------------- state


class _Installed:
    """What :func:`install` set up on one scheduler (the handlers read ``plugin`` late)."""

    def __init__(self, scheduler: Any, plugin: Any, prefix: str) -> None:
        self.scheduler_ref = weakref.ref(scheduler)
        self.plugin = plugin
        self.prefix = prefix
        self.page = False
        self.json = False
        # run -> last worker addresses seen in a plan of that run: a later plan
        # may come without them (it still indexes the same workers).
        self.workers: dict[str, list[Any]] = {}

    def snapshot(self, run: str | None = None, **kw: Any) -> dict[str, Any]:
        return snapshot(
            self.plugin, run=run, known_workers=self.workers, scheduler=self.scheduler_ref(), **kw
        )


# install() leaves its _Installed on the scheduler's HTTP application under
# this name, so a second call (a re-registered plugin) finds it and adds no
# routes twice. (Not a WeakKeyDictionary keyed by the scheduler: the value
# refers back to it through the plugin, which would keep it alive forever.)
_MARK = "_dask_rpm_dashboard"


def _clean(obj: Any) -> Any:
    """JSON-safe copy: tuples become lists, non-finite floats ``None``, numpy scalars Python."""
    if isinstance(obj, Mapping):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, bool) or obj is None or isinstance(obj, (int, str)):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    try:  # numpy scalars and the like
        value = obj.item()
    except (AttributeError, ValueError):
        return str(obj)
    return _clean(value)


def _finite(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _latest_estimates(abilities: Any, n: int) -> list[float | None]:
    """Most recent non-null estimate per worker index from the ``abilities`` checks."""
    out: list[float | None] = [None] * n
    for check in reversed(list(abilities or ())):
        values = check.get("abilities") if isinstance(check, Mapping) else None
        for i, v in enumerate(values or ()):
            if i < n and out[i] is None:
                out[i] = _finite(v)
        if all(v is not None for v in out):
            break
    return out


def _scheduler_order(scheduler: Any) -> list[str]:
    """Worker addresses ordered as :func:`dask_rpm.engine.ordered_workers` orders them."""
    try:
        from .engine import ordered_workers

        workers = {a: {"name": ws.name} for a, ws in scheduler.workers.items()}
        return ordered_workers({"workers": workers})
    except Exception:
        logger.debug("rpm dashboard: could not order the scheduler's workers", exc_info=True)
        return []


def snapshot(
    plugin: Any,
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
    plugin : RPMSchedulerPlugin
        Its :meth:`state` is the base; missing keys are tolerated.
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
        :func:`dask_rpm.engine.ordered_workers` order (the order ``fit``
        indexes workers by), used only when their number matches the plan.

    Returns
    -------
    dict
        ``plugin.state(run)`` plus ``rectangles`` (one per planned worker:
        ``worker``, ``address``, ``group``, ``column``, ``samples``,
        ``hidden``, ``ability`` (planned, normalised), ``estimate`` (latest
        estimate or ``None``)), ``workers``, ``runs`` and ``summary``; all
        JSON-safe (non-finite numbers are ``null``).
    """
    state = dict(plugin.state(run) or {})
    run_id = state.get("run")
    plan = state.get("plan") or {}
    abilities = list(plan.get("abilities") or ())
    workers = list(plan.get("workers") or ())
    source = "plan" if workers else None
    if known_workers is not None and run_id is not None:
        if workers:
            known_workers[run_id] = workers
        elif len(known_workers.get(run_id, ())) == len(abilities):
            workers, source = known_workers[run_id], "earlier plan"
    if not workers and scheduler is not None and abilities:
        ordered = _scheduler_order(scheduler)
        if len(ordered) == len(abilities):
            workers, source = ordered, "scheduler order"
    groups = state.get("groups") or {}
    estimates = _latest_estimates(state.get("abilities"), len(abilities))
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
    iterations = list(state.get("iterations") or ())
    remaps = list(state.get("remaps") or ())
    last = iterations[-1] if iterations else {}
    times = [t for t in (_finite(row.get("time")) for row in iterations[-20:]) if t is not None]
    summary = {
        "iterations_done": (int(last["iteration"]) + 1)
        if isinstance(last.get("iteration"), int)
        else 0,
        "iterations_total": state.get("iterations_total"),
        "last_error": _finite(last.get("error")),
        "last_time": _finite(last.get("time")),
        "median_time": sorted(times)[len(times) // 2] if times else None,
        "remaps": {k: sum(1 for r in remaps if r.get("kind") == k) for k in ("column", "whole")},
        "method": plan.get("method"),
        "emulation": state.get("emulation"),
        "validation": list(state["validation"][-1]) if state.get("validation") else None,
    }
    if since is not None:
        # Rows are in iteration order: scan back from the end (cheap on long runs).
        def after(row: Any) -> bool:
            it = _finite(row.get("iteration")) if isinstance(row, Mapping) else None
            return it is not None and it > since

        first = len(iterations)
        while first > 0 and after(iterations[first - 1]):
            first -= 1
        iterations = iterations[first:]
    if tail is not None and tail >= 0:
        iterations = iterations[len(iterations) - min(tail, len(iterations)) :]
    state["iterations"] = iterations
    state["rectangles"] = rects
    state["workers"] = workers
    state["workers_source"] = source  # where the addresses came from (labels only)
    state["runs"] = list(getattr(plugin, "runs", {}) or ())
    state["summary"] = summary
    return _clean(state)


# --------------------------------------------------------------------------- HTTP


def _state_handler() -> type:
    from tornado import web

    class RPMStateHandler(web.RequestHandler):
        """``GET /rpm/state.json[?run=<id>][&tail=<n>][&since=<iteration>]``."""

        def initialize(self, installed: _Installed) -> None:
            self.installed = installed

        def get(self) -> None:
            run = self.get_argument("run", None) or None
            ints: dict[str, int | None] = {}
            for name in ("tail", "since"):
                arg = self.get_argument(name, None)
                try:
                    ints[name] = int(arg) if arg not in (None, "") else None
                except ValueError:
                    raise web.HTTPError(400, f"{name} must be an integer, not {arg!r}") from None
            body = json.dumps(self.installed.snapshot(run, **ints), allow_nan=False)
            self.set_header("Content-Type", "application/json")
            self.set_header("Cache-Control", "no-store")
            self.write(body)

    return RPMStateHandler


def _find_prefix(http_app: Any) -> str:
    """The dashboard's URL prefix ('' or '/name'), read from its Bokeh application."""
    for app in getattr(http_app, "applications", ()):
        prefix = getattr(app, "prefix", None)
        if isinstance(prefix, str) and hasattr(app, "app_paths"):
            return "/" + prefix.strip("/") if prefix.strip("/") else ""
    return ""


def _add_nav_link(scheduler: Any) -> None:
    """Add "rpm" to the navigation bar of the Dask dashboard pages (best effort)."""
    try:
        from distributed.dashboard.scheduler import template_variables

        pages = template_variables(scheduler)["pages"]
        if "rpm" not in pages:
            pages.append("rpm")
    except Exception:  # pragma: no cover - internals of distributed changed
        logger.debug("rpm dashboard: could not add a navbar link", exc_info=True)


def _install_page(scheduler: Any, installed: _Installed) -> None:
    """Serve the Bokeh app at ``/rpm`` from the scheduler's HTTP server.

    The Dask dashboard is itself a Bokeh server application added to the
    scheduler's routing application; we add one more next to it, built the
    same way, so it shares the port, the static files and the websocket
    settings.
    """
    from distributed.dashboard.core import BokehApplication
    from distributed.dashboard.scheduler import template_variables
    from tornado.ioloop import IOLoop

    def make(scheduler_: Any, extra: dict[str, Any], doc: Any) -> None:
        _make_document(installed, extra, doc)

    bokeh_app = BokehApplication(
        {ROUTE: make},
        scheduler,
        prefix=installed.prefix,
        template_variables=template_variables(scheduler),
    )
    scheduler.http_application.add_application(bokeh_app)
    bokeh_app.initialize(getattr(scheduler, "loop", None) or IOLoop.current())
    bokeh_app.start()
    _add_nav_link(scheduler)


def install(scheduler: Any, plugin: Any) -> None:
    """Add ``/rpm``, ``/rpm/state.json`` and the rpm gauges to ``scheduler``'s dashboard server.

    Idempotent: a second call (e.g. the plugin registered again) only points
    the existing routes at ``plugin``. Never raises: failures are logged.

    Parameters
    ----------
    scheduler : distributed.Scheduler
    plugin : RPMSchedulerPlugin
    """
    try:
        http_app = getattr(scheduler, "http_application", None)
        if http_app is None:
            logger.info("rpm dashboard: the scheduler has no HTTP server; /rpm not added")
            return
        installed = getattr(http_app, _MARK, None)
        if installed is not None:
            installed.plugin = plugin
            _register_collector(installed)
            return
        installed = _Installed(scheduler, plugin, _find_prefix(http_app))
        setattr(http_app, _MARK, installed)
    except Exception:
        logger.exception("rpm dashboard: install failed; the scheduler continues without it")
        return
    try:
        http_app.add_handlers(
            r".*$", [(installed.prefix + STATE_ROUTE, _state_handler(), {"installed": installed})]
        )
        installed.json = True
    except Exception:
        logger.exception("rpm dashboard: could not add %s", STATE_ROUTE)
    try:
        _install_page(scheduler, installed)
        installed.page = True
    except ImportError as e:
        logger.info(
            "rpm dashboard: %s page unavailable (%s); %s still works", ROUTE, e, STATE_ROUTE
        )
    except Exception:
        logger.exception("rpm dashboard: could not add the %s page", ROUTE)
    try:
        _register_collector(installed)
    except Exception:
        logger.exception("rpm dashboard: could not register the Prometheus collector")
    logger.info("rpm dashboard at %s%s", installed.prefix, ROUTE)


# --------------------------------------------------------------------------- Prometheus


class _RPMCollector:
    """Prometheus collector for the rpm gauges of the most recently installed scheduler.

    ``prometheus_client`` has one process-wide registry (the scheduler's
    ``/metrics`` serves it), so the collector is registered once per process
    and, like Dask's own collectors, follows the latest scheduler.
    """

    def __init__(self) -> None:
        self.installed: weakref.ref[_Installed] | None = None

    def collect(self) -> Iterator[Any]:
        import dask.config
        from prometheus_client.core import GaugeMetricFamily

        namespace = dask.config.get("distributed.dashboard.prometheus.namespace", "dask")

        def name(suffix: str) -> str:
            return f"{namespace}_{suffix}" if namespace else suffix

        installed = self.installed() if self.installed is not None else None
        try:
            state = installed.snapshot(tail=1) if installed is not None else {}
        except Exception:  # a scrape must not fail because of us
            logger.exception("rpm dashboard: reading the plugin state for /metrics failed")
            state = {}
        summary = state.get("summary") or {}

        seconds = GaugeMetricFamily(
            name("rpm_iteration_seconds"), "Wall time of the last rpm training iteration (s)"
        )
        iteration = GaugeMetricFamily(
            name("rpm_iteration"), "rpm training iterations completed in the current run"
        )
        error = GaugeMetricFamily(name("rpm_error"), "Training error after the last rpm iteration")
        ability = GaugeMetricFamily(
            name("rpm_worker_ability"),
            "Normalised ability per worker: planned (rectangle area) and latest estimate",
            labels=["worker", "source"],
        )
        remaps = GaugeMetricFamily(
            name("rpm_remaps"), "Remaps in the current rpm run, by kind", labels=["kind"]
        )
        if state.get("run") is not None:
            if summary.get("last_time") is not None:
                seconds.add_metric([], summary["last_time"])
            iteration.add_metric([], summary.get("iterations_done") or 0)
            if summary.get("last_error") is not None:
                error.add_metric([], summary["last_error"])
            for r in state.get("rectangles") or ():
                worker = str(r["address"] if r.get("address") is not None else r.get("worker"))
                for source in ("ability", "estimate"):
                    if r.get(source) is not None:
                        ability.add_metric(
                            [worker, "plan" if source == "ability" else "estimate"], r[source]
                        )
            for kind, count in (summary.get("remaps") or {}).items():
                remaps.add_metric([kind], count)
        yield from (seconds, iteration, error, ability, remaps)


_COLLECTOR: _RPMCollector | None = None


def _register_collector(installed: _Installed) -> None:
    """Register the collector once per process and point it at ``installed``."""
    global _COLLECTOR
    try:
        import prometheus_client
    except ImportError:
        logger.info(
            "rpm dashboard: prometheus_client is not installed; rpm gauges on /metrics skipped"
        )
        return
    if _COLLECTOR is None:
        collector = _RPMCollector()
        prometheus_client.REGISTRY.register(collector)
        _COLLECTOR = collector
    _COLLECTOR.installed = weakref.ref(installed)


# --------------------------------------------------------------------------- Bokeh page


def _palette(n: int) -> list[str]:
    from bokeh.palettes import Category10_10, Category20_20

    base = list(Category10_10 if n <= 10 else Category20_20)
    return [base[i % len(base)] for i in range(max(n, 1))]


def _short(address: Any) -> str:
    """``tcp://10.0.0.5:40123`` -> ``10.0.0.5:40123`` (legends must stay short)."""
    s = str(address)
    return s.split("://", 1)[-1]


def _tail(address: Any) -> str:
    """What tells workers apart inside a rectangle: ``:40123`` for TCP, else the last path part."""
    s = _short(address)
    if ":" in s:
        return ":" + s.rsplit(":", 1)[-1]
    return s.rsplit("/", 1)[-1]


class _RPMPage:
    """The ``/rpm`` document's figures and their periodic update (one per browser session)."""

    def __init__(self, installed: _Installed) -> None:
        from bokeh.layouts import column, row
        from bokeh.models import ColumnDataSource, Div, HoverTool, Range1d
        from bokeh.plotting import figure

        self.installed = installed
        self.seen: tuple[Any, Any] | None = None  # (run, updated) last drawn
        self.last_iteration = -1

        self.header = Div(text=self._empty_text(), sizing_mode="stretch_width")
        self.rects = ColumnDataSource(
            name="rpm-rectangles",  # tests find it in the browser by this name
            data=dict(
                left=[],
                right=[],
                bottom=[],
                top=[],
                x=[],
                y=[],
                color=[],
                hatch=[],
                label=[],
                worker=[],
                address=[],
                group=[],
                column=[],
                samples=[],
                hidden=[],
                ability=[],
                estimate=[],
            ),
        )
        self.it = ColumnDataSource(dict(iteration=[], error=[], time=[]))
        self.remap = ColumnDataSource(
            dict(iteration=[], kind=[], color=[], bytes=[], sample_bytes=[], seconds=[], reason=[])
        )
        self.est = ColumnDataSource(dict(xs=[], ys=[], color=[], label=[]))
        self.est_pts = ColumnDataSource(dict(iteration=[], ability=[], color=[], label=[]))
        self.planned = ColumnDataSource(dict(xs=[], ys=[], color=[], label=[]))

        # Rectangles: samples on x, hidden units on y (unit 0 at the top, as
        # columns list their workers top to bottom).
        self.x_range = Range1d(0, 1)
        self.y_range = Range1d(1, 0)
        p = figure(
            title="Rectangles of the current plan (area = work)",
            x_range=self.x_range,
            y_range=self.y_range,
            height=330,
            sizing_mode="stretch_width",
            tools="pan,wheel_zoom,box_zoom,reset,save",
            x_axis_label="samples",
            y_axis_label="hidden units",
        )
        quads = p.quad(
            left="left",
            right="right",
            bottom="bottom",
            top="top",
            source=self.rects,
            fill_color="color",
            fill_alpha=0.75,
            line_color="white",
            line_width=2,
            hatch_pattern="hatch",
            hatch_color="white",
            hatch_alpha=0.35,
        )
        p.text(
            x="x",
            y="y",
            text="label",
            source=self.rects,
            text_align="center",
            text_baseline="middle",
            text_font_size="12px",
            text_color="black",
        )
        p.add_tools(
            HoverTool(
                renderers=[quads],
                tooltips=[
                    ("worker", "@worker @address"),
                    ("group", "@group"),
                    ("column", "@column"),
                    ("samples", "@samples"),
                    ("hidden units", "@hidden"),
                    ("planned ability", "@ability{0.000}"),
                    ("estimated ability", "@estimate{0.000}"),
                ],
            )
        )
        p.xgrid.visible = p.ygrid.visible = False
        self.rect_fig = p

        # Abilities over time: estimates (solid) and the current plan (dashed).
        a = figure(
            title="Ability per worker: estimates (solid) and current plan (dashed)",
            height=330,
            sizing_mode="stretch_width",
            x_axis_label="iteration",
            y_axis_label="normalised ability",
            tools="pan,wheel_zoom,box_zoom,reset,save",
        )
        a.multi_line(xs="xs", ys="ys", line_color="color", line_width=2, source=self.est)
        a.scatter(x="iteration", y="ability", color="color", size=7, source=self.est_pts)
        # The legend hangs on the plan lines: every planned worker has one, estimated or not.
        a.multi_line(
            xs="xs",
            ys="ys",
            line_color="color",
            line_dash="dashed",
            line_width=1.5,
            source=self.planned,
            legend_field="label",
        )
        self.abil_fig = a

        t = figure(
            title="Iteration time",
            height=260,
            sizing_mode="stretch_width",
            x_axis_label="iteration",
            y_axis_label="seconds",
            tools="pan,wheel_zoom,box_zoom,reset,save",
        )
        t.line(x="iteration", y="time", source=self.it, line_width=1.5)
        t.scatter(x="iteration", y="time", source=self.it, size=3)
        self.time_fig = t

        e = figure(
            title="Training error",
            height=260,
            sizing_mode="stretch_width",
            x_axis_label="iteration",
            y_axis_label="error (0.5 sum ||h - d||^2)",
            x_range=t.x_range,
            y_axis_type="log",
            tools="pan,wheel_zoom,box_zoom,reset,save",
        )
        e.line(x="iteration", y="error", source=self.it, line_width=2, color="#2ca02c")
        self.err_fig = e
        a.x_range = t.x_range

        # Remap events: one vertical line per remap on every time axis (legend once).
        for fig in (a, t, e):
            spans = fig.vspan(
                x="iteration",
                source=self.remap,
                line_color="color",
                line_width=2,
                line_dash="dotted",
                **({"legend_field": "kind"} if fig is t else {}),
            )
            fig.add_tools(
                HoverTool(
                    renderers=[spans],
                    tooltips=[
                        ("remap", "@kind at iteration @iteration"),
                        (
                            "moved",
                            "@bytes weight bytes, @sample_bytes sample bytes re-read, @seconds{0.000} s",
                        ),
                        ("why", "@reason"),
                    ],
                )
            )
        for fig in (a, t):
            fig.legend.location = "top_right"
            fig.legend.click_policy = "hide"
            fig.legend.background_fill_alpha = 0.6
        a.add_layout(a.legend[0], "right")

        self.root = column(
            self.header,
            row(self.rect_fig, self.abil_fig, sizing_mode="stretch_width"),
            row(self.time_fig, self.err_fig, sizing_mode="stretch_width"),
            sizing_mode="stretch_width",
        )

    @staticmethod
    def _empty_text() -> str:
        return (
            "<h2>dask_rpm</h2><p>No rpm training run yet. Train with "
            "<code>dask_rpm.fit(x, d, ..., client=client)</code>; this page refreshes by itself.</p>"
        )

    def update(self) -> None:
        try:
            self._update()
        except Exception:  # a broken update must not kill the session
            logger.exception("rpm dashboard: page update failed")

    def _update(self) -> None:
        plugin = self.installed.plugin
        runs = getattr(plugin, "runs", None)
        if not runs:
            return
        run = max(runs, key=lambda r: runs[r].updated)
        key = (run, runs[run].updated)
        if key == self.seen:
            return  # nothing new: keep the 500 ms tick cheap
        if self.seen is None or self.seen[0] != run:
            self.last_iteration = -1
            self.it.data = dict(iteration=[], error=[], time=[])
        state = self.installed.snapshot(run, since=self.last_iteration)
        self.seen = key
        self._draw_header(state)
        self._draw_rectangles(state)
        self._draw_iterations(state)
        self._draw_abilities(state)
        rm = state.get("remaps") or []
        self.remap.data = dict(
            iteration=[r.get("iteration") for r in rm],
            kind=[str(r.get("kind")) + " remap" for r in rm],
            color=[_REMAP_COLORS.get(r.get("kind"), "#7f7f7f") for r in rm],
            bytes=[r.get("bytes") for r in rm],
            sample_bytes=[r.get("sample_bytes", 0) for r in rm],
            seconds=[r.get("seconds") for r in rm],
            reason=[str(r.get("reason") or "") for r in rm],
        )

    def _draw_header(self, state: dict[str, Any]) -> None:
        from html import escape

        s = state.get("summary") or {}
        plan = state.get("plan") or {}
        total = s.get("iterations_total")
        parts = [
            f"<b>run</b> {escape(str(state.get('run')))}",
            f"<b>method</b> {escape(str(s.get('method')))}",
            f"<b>workers</b> {len(state.get('rectangles') or [])} planned"
            + (f", {len(plan.get('excluded') or [])} excluded" if plan.get("excluded") else ""),
            f"<b>iteration</b> {s.get('iterations_done', 0)}" + (f" / {total}" if total else ""),
        ]
        if s.get("last_error") is not None:
            parts.append(f"<b>error</b> {s['last_error']:.4g}")
        if s.get("median_time") is not None:
            parts.append(
                f"<b>iteration time</b> {s['median_time'] * 1e3:.1f} ms (median of last 20)"
            )
        if s.get("validation"):
            v_it, v_loss, v_acc = s["validation"]
            acc = f", accuracy {100 * v_acc:.1f}%" if v_acc == v_acc else ""  # NaN: a regression
            parts.append(f"<b>validation</b> loss {v_loss:.4g}{acc} (after {int(v_it)} iterations)")
        rm = s.get("remaps") or {}
        parts.append(f"<b>remaps</b> {rm.get('column', 0)} column, {rm.get('whole', 0)} whole")
        if plan.get("imbalance") is not None:
            parts.append(f"<b>imbalance</b> {plan['imbalance']:.3f}")
        html = (
            "<h2 style='margin:4px 0'>dask_rpm training</h2><div>"
            + " &nbsp;|&nbsp; ".join(parts)
            + "</div>"
        )
        if state.get("emulation"):
            html += (
                "<div style='margin:6px 0;padding:6px 10px;background:#fff3cd;border:1px solid #e0a800;"
                "border-radius:4px;font-weight:bold'>" + escape(str(state["emulation"])) + "</div>"
            )
        notes = plan.get("notes") or []
        if notes:
            html += (
                "<div style='color:#555;font-size:90%'>"
                + escape("; ".join(map(str, notes)))
                + "</div>"
            )
        self.header.text = html

    def _draw_rectangles(self, state: dict[str, Any]) -> None:
        plan = state.get("plan") or {}
        rects = state.get("rectangles") or []
        n = len(plan.get("abilities") or ()) or len(rects)
        colors = _palette(n)
        groups = sorted({str(r["group"]) for r in rects if r.get("group") is not None})
        hatch = {
            g: (_HATCHES[i % len(_HATCHES)] if len(groups) > 1 else " ")
            for i, g in enumerate(groups)
        }
        cols: dict[str, list[Any]] = {k: [] for k in self.rects.data}
        for r in rects:
            (s0, s1), (m0, m1) = r["samples"], r["hidden"]
            w = r.get("worker")
            i = w if isinstance(w, int) else 0
            est, abil = r.get("estimate"), r.get("ability")
            # The estimate may differ from the planned area until the next remap: show both.
            ability_text = " \u00b7 ".join(
                t
                for t in (
                    f"p\u0302 {est:.2f}" if est is not None else "",
                    f"area {abil:.2f}" if abil is not None else "",
                )
                if t
            )
            name = f"w{w}" + (f" {_tail(r['address'])}" if r.get("address") else "")
            group = r.get("group")
            label = "\n".join(
                x for x in (name, ability_text, str(group) if group is not None else "") if x
            )
            for k, v in dict(
                left=s0,
                right=s1,
                bottom=m0,
                top=m1,
                x=(s0 + s1) / 2,
                y=(m0 + m1) / 2,
                color=colors[i % len(colors)],
                hatch=hatch.get(str(group), " ") if group is not None else " ",
                label=label,
                worker=str(w),
                address=str(r.get("address") or ""),
                group=str(group or ""),
                column=r.get("column"),
                samples=f"{s0}-{s1} ({s1 - s0})",
                hidden=f"{m0}-{m1} ({m1 - m0})",
                ability=abil if abil is not None else float("nan"),
                estimate=est if est is not None else float("nan"),
            ).items():
                cols[k].append(v)
        self.rects.data = cols
        s = plan.get("samples") or max((r["samples"][1] for r in rects), default=1)
        shape = plan.get("shape") or []
        m = shape[1] if len(shape) > 1 else max((r["hidden"][1] for r in rects), default=1)
        self.x_range.start, self.x_range.end = 0, s
        self.y_range.start, self.y_range.end = m, 0
        self.rect_fig.title.text = (
            f"Rectangles of the current plan: {s} samples x {m} hidden units (area = work)"
        )

    def _draw_iterations(self, state: dict[str, Any]) -> None:
        rows = state.get("iterations") or []
        new = [
            r
            for r in rows
            if isinstance(r.get("iteration"), int) and r["iteration"] > self.last_iteration
        ]
        if not new:
            return
        nan = float("nan")
        self.it.stream(
            dict(
                iteration=[r["iteration"] for r in new],
                error=[r.get("error") if r.get("error") is not None else nan for r in new],
                time=[r.get("time") if r.get("time") is not None else nan for r in new],
            ),
            rollover=50_000,  # keep the browser responsive on very long runs
        )
        self.last_iteration = new[-1]["iteration"]

    def _draw_abilities(self, state: dict[str, Any]) -> None:
        plan = state.get("plan") or {}
        planned = plan.get("abilities") or []
        n = len(planned)
        colors = _palette(n)
        checks = state.get("abilities") or []
        xs: list[list[Any]] = [[] for _ in range(n)]
        ys: list[list[Any]] = [[] for _ in range(n)]
        for c in checks:
            for i, v in enumerate((c.get("abilities") or [])[:n]):
                if v is not None:
                    xs[i].append(c.get("iteration"))
                    ys[i].append(v)
        workers = state.get("workers") or []
        labels = [
            f"w{i}" + (f" {_short(workers[i])}" if i < len(workers) else "") for i in range(n)
        ]
        keep = [i for i in range(n) if xs[i]]
        self.est.data = dict(
            xs=[xs[i] for i in keep],
            ys=[ys[i] for i in keep],
            color=[colors[i] for i in keep],
            label=[labels[i] for i in keep],
        )
        self.est_pts.data = dict(
            iteration=[x for i in keep for x in xs[i]],
            ability=[y for i in keep for y in ys[i]],
            color=[colors[i] for i in keep for _ in xs[i]],
            label=[labels[i] for i in keep for _ in xs[i]],
        )
        # The current plan holds from the last remap (or the start) to now.
        rm = state.get("remaps") or []
        x0 = rm[-1].get("iteration", 0) if rm else 0
        x1 = max(self.last_iteration + 1, x0 + 1)
        self.planned.data = dict(
            xs=[[x0, x1] for _ in range(n)],
            ys=[[v, v] for v in planned],
            color=colors[:n],
            label=labels,
        )


def _make_document(installed: _Installed, extra: dict[str, Any], doc: Any) -> None:
    """Build one ``/rpm`` session document (Bokeh FunctionHandler callback)."""
    page = _RPMPage(installed)
    page.update()
    doc.title = "Dask: rpm training"
    doc.add_root(page.root)
    # A weak reference from the callback, as Dask's own pages do, so closed
    # sessions are collected; the document keeps the page alive meanwhile.
    ref = weakref.ref(page)
    doc.rpm_page = page

    def tick() -> None:
        p = ref()
        if p is not None:
            p.update()

    doc.add_periodic_callback(tick, REFRESH_MS)
    try:  # the Dask dashboard's look (navigation bar, theme)
        from distributed.dashboard.components.scheduler import BOKEH_THEME, env

        doc.template = env.get_template("simple.html")
        doc.template_variables.update(extra)
        doc.theme = BOKEH_THEME
    except Exception:  # pragma: no cover - internals of distributed changed
        logger.debug("rpm dashboard: Dask page template unavailable", exc_info=True)
