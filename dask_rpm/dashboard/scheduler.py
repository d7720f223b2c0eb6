"""Putting the dashboard on a scheduler: :func:`install` and :class:`RPMDashboardPlugin`.

The dependency is one way, as with distributed's task stream: the scheduler
plugin (:class:`dask_rpm.plugin.RPMSchedulerPlugin`) only records and knows
nothing of this package; the dashboard reads the recorder it finds among the
scheduler's plugins. :class:`RPMDashboardPlugin` is the scheduler plugin that
installs the routes when it starts; ``dask_rpm.fit`` registers it next to the
recorder, and the ``dask_rpm.plugin`` preload adds both.
"""

from __future__ import annotations

import logging
from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin

from .metrics import register_collector
from .routes import ROUTE, STATE_ROUTE, add_state_route, find_prefix
from .state import Installed, Recorder

logger = logging.getLogger("dask_rpm.dashboard")

__all__ = ["install", "RPMDashboardPlugin", "DASHBOARD_PLUGIN_NAME"]

#: Name of :class:`RPMDashboardPlugin` among the scheduler's plugins.
DASHBOARD_PLUGIN_NAME = "rpm-dashboard"

# install() leaves its Installed on the scheduler's HTTP application under
# this name, so a second call (a re-registered plugin) finds it and adds no
# routes twice. (Not a WeakKeyDictionary keyed by the scheduler: the value
# refers back to it through the plugin, which would keep it alive forever.)
_MARK = "_dask_rpm_dashboard"


def _add_routes(scheduler: Any, http_app: Any, installed: Installed) -> None:
    """The JSON route, the page and the gauges, each on its own (one failing leaves the rest)."""
    try:
        add_state_route(http_app, installed)
        installed.json = True
    except Exception:
        logger.exception("rpm dashboard: could not add %s", STATE_ROUTE)
    try:
        # Bokeh is heavy: the page and its components load only when a scheduler serves them
        from .page import add_page

        add_page(scheduler, installed)
        installed.page = True
    except ImportError as e:
        logger.info(
            "rpm dashboard: %s page unavailable (%s); %s still works", ROUTE, e, STATE_ROUTE
        )
    except Exception:
        logger.exception("rpm dashboard: could not add the %s page", ROUTE)
    try:
        register_collector(installed)
    except Exception:
        logger.exception("rpm dashboard: could not register the Prometheus collector")


def install(scheduler: Any, plugin: Recorder | str) -> None:
    """Add ``/rpm``, ``/rpm/state.json`` and the rpm gauges to ``scheduler``'s dashboard server.

    Idempotent: a second call only points the existing routes at ``plugin``.
    Never raises: failures are logged.

    Parameters
    ----------
    scheduler : distributed.Scheduler
    plugin : RPMSchedulerPlugin or str
        The recorder to show, or its name among the scheduler's plugins
        (looked up on every read, so one registered later or again is found).
    """
    recorder, name = (None, plugin) if isinstance(plugin, str) else (plugin, None)
    try:
        http_app = getattr(scheduler, "http_application", None)
        if http_app is None:
            logger.info("rpm dashboard: the scheduler has no HTTP server; /rpm not added")
            return
        installed = getattr(http_app, _MARK, None)
        if installed is not None:
            installed.plugin, installed.plugin_name = recorder, name
            register_collector(installed)
            return
        installed = Installed(scheduler, recorder, find_prefix(http_app), name)
        setattr(http_app, _MARK, installed)
    except Exception:
        logger.exception("rpm dashboard: install failed; the scheduler continues without it")
        return
    _add_routes(scheduler, http_app, installed)
    logger.info("rpm dashboard at %s%s", installed.prefix, ROUTE)


class RPMDashboardPlugin(SchedulerPlugin):
    """Scheduler plugin that installs the rpm dashboard when it starts.

    Parameters
    ----------
    recorder : str
        Name of the recording plugin among the scheduler's plugins
        (:data:`dask_rpm.plugin.PLUGIN_NAME`); the dashboard shows what it
        recorded, looked up on every read.
    """

    name = DASHBOARD_PLUGIN_NAME
    #: registering it again on a scheduler that has it changes nothing
    idempotent = True

    def __init__(self, recorder: str) -> None:
        self.recorder = recorder

    async def start(self, scheduler: Any) -> None:
        install(scheduler, self.recorder)
