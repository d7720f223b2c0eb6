"""Live view of rpm training on the scheduler's own dashboard (HTTP) server.

:class:`RPMDashboardPlugin` (registered by :func:`dask_rpm.fit` next to the
recording :class:`~dask_rpm.plugin.RPMSchedulerPlugin`, and added by the
``dask_rpm.plugin`` scheduler preload) calls :func:`install` when it starts,
which adds, on the dashboard port:

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

The dashboard only displays what the plugin recorded; it decides nothing, and
the plugin does not know it exists. Any failure here is logged and never
stops the scheduler.

Modules: :mod:`~dask_rpm.dashboard.state` (the JSON snapshot, pure),
:mod:`~dask_rpm.dashboard.components` (one Bokeh component per figure),
:mod:`~dask_rpm.dashboard.page` (the document), :mod:`~dask_rpm.dashboard.routes`
(HTTP), :mod:`~dask_rpm.dashboard.metrics` (Prometheus),
:mod:`~dask_rpm.dashboard.scheduler` (installing it on a scheduler).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_attributes
from .metrics import METRIC_NAMES
from .routes import REFRESH_MS, ROUTE, STATE_ROUTE
from .scheduler import DASHBOARD_PLUGIN_NAME, RPMDashboardPlugin, install
from .state import snapshot

if not TYPE_CHECKING:  # type checkers resolve submodules themselves; a catch-all hides typos
    __getattr__, __dir__ = lazy_attributes(__name__, __path__)  # submodules on first use

__all__ = [
    "install",
    "snapshot",
    "RPMDashboardPlugin",
    "DASHBOARD_PLUGIN_NAME",
    "ROUTE",
    "STATE_ROUTE",
    "METRIC_NAMES",
    "REFRESH_MS",
]
