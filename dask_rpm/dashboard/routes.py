"""The HTTP routes: their paths, and the ``/rpm/state.json`` handler.

The JSON route and the ``/rpm`` page (:func:`dask_rpm.dashboard.page.add_page`) are added to the scheduler's own dashboard server (its tornado
application), next to Dask's pages, so they share the port, the URL prefix,
the static files and the websocket settings.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from tornado import web

from .state import Installed

logger = logging.getLogger("dask_rpm.dashboard")

__all__ = [
    "ROUTE",
    "REFRESH_MS",
    "STATE_ROUTE",
    "StateHandler",
    "find_prefix",
    "add_state_route",
]

ROUTE = "/rpm"
#: Refresh period of the ``/rpm`` page (milliseconds).
REFRESH_MS = 500
STATE_ROUTE = "/rpm/state.json"


class StateHandler(web.RequestHandler):
    """``GET /rpm/state.json[?run=<id>][&tail=<n>][&since=<iteration>]``."""

    def initialize(self, installed: Installed) -> None:
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


def find_prefix(http_app: Any) -> str:
    """The dashboard's URL prefix ('' or '/name'), read from its Bokeh application."""
    for app in getattr(http_app, "applications", ()):
        prefix = getattr(app, "prefix", None)
        if isinstance(prefix, str) and hasattr(app, "app_paths"):
            return "/" + prefix.strip("/") if prefix.strip("/") else ""
    return ""


def add_state_route(http_app: Any, installed: Installed) -> None:
    """Serve :class:`StateHandler` at ``<prefix>/rpm/state.json``."""
    http_app.add_handlers(
        r".*$", [(installed.prefix + STATE_ROUTE, StateHandler, {"installed": installed})]
    )
