"""Prometheus gauges ``<ns>_rpm_*`` on the scheduler's ``/metrics``, from the dashboard state.

``<ns>`` is ``distributed.dashboard.prometheus.namespace`` (``dask`` by
default). ``prometheus_client`` is optional: without it the gauges are
skipped and said so in the log.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Iterator
from typing import Any

import dask.config

from .state import Installed

logger = logging.getLogger("dask_rpm.dashboard")

__all__ = ["METRIC_NAMES", "RPMCollector", "register_collector"]

#: Names (after the namespace prefix) of the Prometheus gauges.
METRIC_NAMES = (
    "rpm_iteration_seconds",
    "rpm_iteration",
    "rpm_error",
    "rpm_worker_ability",
    "rpm_remaps",
)


class RPMCollector:
    """Prometheus collector for the rpm gauges of the most recently installed scheduler.

    ``prometheus_client`` has one process-wide registry (the scheduler's
    ``/metrics`` serves it), so the collector is registered once per process
    and, like Dask's own collectors, follows the latest scheduler.
    """

    def __init__(self) -> None:
        self.installed: weakref.ref[Installed] | None = None

    def _state(self) -> dict[str, Any]:
        installed = self.installed() if self.installed is not None else None
        try:
            return installed.snapshot(tail=1) if installed is not None else {}
        except Exception:  # a scrape must not fail because of us
            logger.exception("rpm dashboard: reading the plugin state for /metrics failed")
            return {}

    def collect(self) -> Iterator[Any]:
        """The five gauges of :data:`METRIC_NAMES` (empty ones before the first run)."""
        # prometheus_client is optional: only a registered collector is ever asked
        from prometheus_client.core import GaugeMetricFamily

        namespace = dask.config.get("distributed.dashboard.prometheus.namespace", "dask")

        def name(suffix: str) -> str:
            return f"{namespace}_{suffix}" if namespace else suffix

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
        state = self._state()
        summary = state.get("summary") or {}
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


_COLLECTOR: RPMCollector | None = None


def register_collector(installed: Installed) -> None:
    """Register the collector once per process and point it at ``installed``."""
    global _COLLECTOR
    try:
        # optional dependency: without it the scheduler simply has no rpm gauges
        import prometheus_client
    except ImportError:
        logger.info(
            "rpm dashboard: prometheus_client is not installed; rpm gauges on /metrics skipped"
        )
        return
    if _COLLECTOR is None:
        collector = RPMCollector()
        prometheus_client.REGISTRY.register(collector)
        _COLLECTOR = collector
    _COLLECTOR.installed = weakref.ref(installed)
