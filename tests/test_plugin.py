"""The scheduler plugin (dask_rpm.plugin): it records, and registering it again changes nothing."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import numpy as np
from distributed import Client, LocalCluster

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


def _installed(dask_scheduler: Any) -> tuple[list[str], list[str], bool]:
    from dask_rpm.engine.worker import PLUGIN_NAME as WORKER_PLUGIN_NAME

    http = getattr(dask_scheduler, "http_application", None)
    routes = (
        [str(getattr(r.matcher, "regex", r)) for r in http.wildcard_router.rules] if http else []
    )
    return (
        [n for n in dask_scheduler.plugins if n == PLUGIN_NAME],
        [n for n in dask_scheduler.worker_plugins if n == WORKER_PLUGIN_NAME],
        any("/rpm" in r for r in routes),
    )


def _worker_has_engine(dask_worker: Any) -> bool:
    from dask_rpm.engine.worker import PLUGIN_NAME as WORKER_PLUGIN_NAME

    return WORKER_PLUGIN_NAME in dask_worker.plugins


def test_one_registration_installs_the_dashboard_and_the_worker_plugin_once():
    """fit registers the recorder only; when it starts on the scheduler it installs /rpm and the
    engine's worker plugin, which reaches workers that join later too. A second fit adds nothing."""
    with (
        LocalCluster(
            n_workers=1, threads_per_worker=1, processes=False, dashboard_address="127.0.0.1:0"
        ) as cluster,
        Client(cluster) as client,
    ):
        x, d = np.random.default_rng(0).uniform(size=(16, 3)), np.full((16, 2), 0.5)
        dask_rpm.fit(x, d, hidden=4, iterations=2, mapping="srpm", progress="none")
        first = client.run_on_scheduler(_installed)
        assert first[0] == [PLUGIN_NAME] and len(first[1]) == 1
        port = client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.http_server.port)
        page = f"http://127.0.0.1:{port}/rpm/state.json"
        with urllib.request.urlopen(page, timeout=30) as reply:  # the route is served
            assert reply.status == 200 and json.loads(reply.read())
        dask_rpm.fit(x, d, hidden=4, iterations=2, mapping="srpm", progress="none")
        assert client.run_on_scheduler(_installed) == first
        cluster.scale(2)
        client.wait_for_workers(2, timeout=60)
        assert set(client.run(_worker_has_engine).values()) == {True}
