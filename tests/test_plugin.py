"""The scheduler plugin (dask_rpm.plugin): it records, and registering it again changes nothing."""

from __future__ import annotations

from typing import Any

from distributed import Client

import dask_rpm
from dask_rpm.dashboard import DASHBOARD_PLUGIN_NAME, RPMDashboardPlugin
from dask_rpm.engine.records import TimingRecord
from dask_rpm.plugin import PLUGIN_NAME, TOPIC, RPMSchedulerPlugin


def _recorded(dask_scheduler: Any) -> tuple[int, list[str], list[int], int]:
    plugin = dask_scheduler.plugins[PLUGIN_NAME]
    rows = plugin.state("r1").get("iterations") or []
    return (
        id(plugin),
        list(plugin.runs),
        [r["iteration"] for r in rows],
        len(dask_scheduler.plugins),
    )


def _stream(dask_scheduler: Any) -> None:
    """What a worker's ``rpm`` event delivers: one timing record and one error."""
    record = tuple(TimingRecord(0, 0, 0.0, 0.01, 0.02, 0.03, 0.04, 0.05))
    dask_scheduler.log_event(
        TOPIC, {"kind": "iterations", "run": "r1", "records": [record], "errors": [(0, 1.5)]}
    )


def test_registering_twice_keeps_one_plugin_and_its_records():
    assert RPMSchedulerPlugin.idempotent is True and RPMDashboardPlugin.idempotent is True
    with dask_rpm.local_cluster([1.0], processes=False) as cluster, Client(cluster) as client:
        client.register_plugin(RPMSchedulerPlugin())
        client.run_on_scheduler(_stream)
        first = client.run_on_scheduler(_recorded)
        assert first[1] == ["r1"] and first[2] == [0]

        client.register_plugin(RPMSchedulerPlugin())  # a second fit, another client
        client.register_plugin(RPMDashboardPlugin(PLUGIN_NAME))
        client.register_plugin(RPMDashboardPlugin(PLUGIN_NAME))
        again = client.run_on_scheduler(_recorded)
        # the same instance, the same records, and one more plugin (the dashboard) only
        assert again[:3] == first[:3] and again[3] == first[3] + 1
        names = client.run_on_scheduler(lambda dask_scheduler: list(dask_scheduler.plugins))
        assert names.count(PLUGIN_NAME) == 1 and names.count(DASHBOARD_PLUGIN_NAME) == 1


def _report_status(dask_scheduler: Any, worker: str, status: str) -> None:
    """What a worker reports when it pauses or starts to retire (the scheduler's own handler)."""
    dask_scheduler.handle_worker_status_change(status, worker, stimulus_id="test-status")


def test_leaving_names_retiring_and_gone_workers_not_paused_ones() -> None:
    """The driver asks rpm_leaving who left: a worker retiring gracefully counts at once (the
    scheduler lists it until it has gone, tens of seconds), a paused one does not."""
    with dask_rpm.local_cluster([1.0, 1.0, 1.0, 1.0], processes=False) as cluster:
        with Client(cluster) as client:
            client.register_plugin(RPMSchedulerPlugin())
            a, b, c, d = sorted(client.scheduler_info()["workers"])
            client.run_on_scheduler(_report_status, worker=b, status="paused")
            client.run_on_scheduler(_report_status, worker=c, status="closing_gracefully")
            leaving = client.sync(
                client.scheduler.rpm_leaving, workers=[a, b, c, d, "tcp://10.0.0.1:1"]
            )
            assert sorted(leaving) == sorted([c, "tcp://10.0.0.1:1"])
            client.run_on_scheduler(_report_status, worker=b, status="running")
            client.run_on_scheduler(_report_status, worker=c, status="running")
            assert client.sync(client.scheduler.rpm_leaving, workers=[a, b, c, d]) == []
