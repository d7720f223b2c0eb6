"""The ``/rpm`` Bokeh document: the components laid out, refreshed every :data:`REFRESH_MS`."""

from __future__ import annotations

import logging
import weakref
from typing import Any

from bokeh.layouts import column, row
from bokeh.models import ColumnDataSource
from tornado.ioloop import IOLoop

from .._distributed import BokehApplication, template_variables
from .components import (
    REMAP_COLORS,
    Abilities,
    Header,
    IterationTime,
    Rectangles,
    TrainingError,
)
from .routes import REFRESH_MS, ROUTE
from .state import Installed

logger = logging.getLogger("dask_rpm.dashboard")

__all__ = ["RPMPage", "make_document", "add_page"]


def _empty_iterations() -> dict[str, list[Any]]:
    return dict(iteration=[], error=[], time=[])


class RPMPage:
    """The ``/rpm`` document's components and their periodic update (one per browser session).

    Parameters
    ----------
    installed : Installed
        Where the page reads the recorded state.
    """

    def __init__(self, installed: Installed) -> None:
        self.installed = installed
        self.seen: tuple[Any, Any] | None = None  # (run, updated) last drawn
        self.last_iteration = -1
        # shared by several figures: the iteration rows and the remap events
        self.iterations = ColumnDataSource(_empty_iterations())
        self.remaps = ColumnDataSource(
            dict(iteration=[], kind=[], color=[], bytes=[], sample_bytes=[], seconds=[], reason=[])
        )
        self.header = Header()
        self.rectangles = Rectangles()
        self.abilities = Abilities(self.remaps)
        self.time = IterationTime(self.iterations, self.remaps)
        self.error = TrainingError(self.iterations, self.remaps, self.time.root.x_range)
        self.abilities.root.x_range = self.time.root.x_range
        self.root = column(
            self.header.root,
            row(self.rectangles.root, self.abilities.root, sizing_mode="stretch_width"),
            row(self.time.root, self.error.root, sizing_mode="stretch_width"),
            sizing_mode="stretch_width",
        )

    def update(self) -> None:
        """:meth:`refresh`, logging rather than raising (the periodic callback's entry)."""
        try:
            self.refresh()
        except Exception:  # a broken update must not kill the session
            logger.exception("rpm dashboard: page update failed")

    def refresh(self) -> None:
        """Redraw from the recorder's most recently updated run, if it has news."""
        recorder = self.installed.recorder()
        runs = getattr(recorder, "runs", None)
        if not runs:
            return
        run = max(runs, key=lambda r: runs[r].updated)
        key = (run, runs[run].updated)
        if key == self.seen:
            return  # nothing new: keep the 500 ms tick cheap
        if self.seen is None or self.seen[0] != run:
            self.last_iteration = -1
            self.iterations.data = _empty_iterations()
        state = self.installed.snapshot(run, since=self.last_iteration)
        self.seen = key
        self.header.update(state)
        self.rectangles.update(state)
        self._stream_iterations(state)
        self.abilities.update(state, self.last_iteration)
        rm = state.get("remaps") or []
        self.remaps.data = dict(
            iteration=[r.get("iteration") for r in rm],
            kind=[str(r.get("kind")) + " remap" for r in rm],
            color=[REMAP_COLORS.get(r.get("kind"), "#7f7f7f") for r in rm],
            bytes=[r.get("bytes") for r in rm],
            sample_bytes=[r.get("sample_bytes", 0) for r in rm],
            seconds=[r.get("seconds") for r in rm],
            reason=[str(r.get("reason") or "") for r in rm],
        )

    def _stream_iterations(self, state: dict[str, Any]) -> None:
        """Append the iteration rows not drawn yet."""
        rows = state.get("iterations") or []
        new = [
            r
            for r in rows
            if isinstance(r.get("iteration"), int) and r["iteration"] > self.last_iteration
        ]
        if not new:
            return
        nan = float("nan")
        self.iterations.stream(
            dict(
                iteration=[r["iteration"] for r in new],
                error=[r.get("error") if r.get("error") is not None else nan for r in new],
                time=[r.get("time") if r.get("time") is not None else nan for r in new],
            ),
            rollover=50_000,  # keep the browser responsive on very long runs
        )
        self.last_iteration = new[-1]["iteration"]


def make_document(installed: Installed, extra: dict[str, Any], doc: Any) -> None:
    """Build one ``/rpm`` session document (Bokeh FunctionHandler callback)."""
    page = RPMPage(installed)
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
    try:  # the Dask dashboard's look (navigation bar, theme): internals of distributed, optional
        from .._distributed import BOKEH_THEME, env  # inside the try: the page works without them

        doc.template = env.get_template("simple.html")
        doc.template_variables.update(extra)
        doc.theme = BOKEH_THEME
    except Exception:  # pragma: no cover - internals of distributed changed
        logger.debug("rpm dashboard: Dask page template unavailable", exc_info=True)


def _add_nav_link(scheduler: Any) -> None:
    """Add "rpm" to the navigation bar of the Dask dashboard pages (best effort)."""
    try:
        pages = template_variables(scheduler)["pages"]
        if "rpm" not in pages:
            pages.append("rpm")
    except Exception:  # pragma: no cover - internals of distributed changed
        logger.debug("rpm dashboard: could not add a navbar link", exc_info=True)


def add_page(scheduler: Any, installed: Installed) -> None:
    """Serve the Bokeh app at ``/rpm`` from the scheduler's HTTP server.

    The Dask dashboard is itself a Bokeh server application added to the
    scheduler's routing application; we add one more next to it, built the
    same way, so it shares the port, the static files and the websocket
    settings.
    """

    def make(scheduler_: Any, extra: dict[str, Any], doc: Any) -> None:
        make_document(installed, extra, doc)

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
