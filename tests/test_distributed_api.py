"""The semi-private parts of ``distributed`` that dask_rpm uses, one test each.

:mod:`dask_rpm._distributed` gathers them; each test here uses one the way the
package does, on a real cluster (scheduler and workers in this process, talking
TCP so that messages are serialized). A Dask release that changes one of them
fails the test named after it, here and in ``.ci/run``'s run on the newest
releases, instead of somewhere inside a training run.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import urllib.request
from typing import Any

import numpy as np
import psutil
import pytest
from bokeh.document import Document
from bokeh.models.widgets import Div
from bokeh.plotting import figure
from bokeh.themes import Theme
from distributed import Client, LocalCluster, Scheduler, SpecCluster, Worker, get_worker

from dask_rpm._distributed import (
    BOKEH_THEME,
    FIRST_COMPLETED,
    BokehApplication,
    NoOpAwaitable,
    Status,
    env,
    parse_memory_limit,
    sync,
    template_variables,
    to_serialize,
    wait_async,
)

WORKERS = 6  # more than the 5 workers Client.scheduler_info returned by default before 2026.7


@pytest.fixture(scope="module")
def cluster():
    with LocalCluster(
        n_workers=WORKERS,
        threads_per_worker=1,
        processes=False,
        protocol="tcp://",
        host="127.0.0.1",
        dashboard_address="127.0.0.1:0",
    ) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def client(cluster):
    with Client(cluster) as client:
        yield client


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as f:
        assert f.status == 200, f"GET {url}: HTTP {f.status}"
        return f.read().decode()


def _dashboard(client: Client) -> str:
    return f"http://127.0.0.1:{client.scheduler_info()['services']['dashboard']}"


def _on_scheduler(cluster: LocalCluster, fn: Any) -> Any:
    """``fn(scheduler)`` on the scheduler's event loop, as a scheduler plugin runs."""

    async def call() -> Any:
        return fn(cluster.scheduler)

    return cluster.sync(call)


def _serve(cluster: LocalCluster, client: Client, route: str, styled: bool) -> str:
    """Serve a one-Div Bokeh document at ``route`` the way ``dashboard.page.add_page`` does.

    ``styled``: with the Dask dashboard's Jinja template and Bokeh theme, as
    ``dashboard.page.make_document`` sets them. Returns the page's HTML.
    """

    def add(dask_scheduler: Any) -> None:
        def make(scheduler: Any, extra: dict[str, Any], doc: Any) -> None:
            doc.add_root(Div(text=route))
            if styled:
                doc.template = env.get_template("simple.html")
                doc.template_variables.update(extra)
                doc.theme = BOKEH_THEME

        app = BokehApplication(
            {route: make},
            dask_scheduler,
            prefix="",
            template_variables=template_variables(dask_scheduler),
        )
        dask_scheduler.http_application.add_application(app)
        app.initialize(dask_scheduler.loop)
        app.start()

    _on_scheduler(cluster, add)
    return _get(_dashboard(client) + route)


def test_wait_async_awaits_futures_on_the_clients_loop(client):
    # the engine's driver: a coroutine on a synchronous client's loop (client.sync)
    slow = client.submit(time.sleep, 1.5, pure=False)
    fast = client.submit(sum, [1, 2])

    async def first() -> Any:
        return await wait_async([slow, fast], timeout=30, return_when=FIRST_COMPLETED)

    async def briefly() -> Any:
        return await wait_async([slow], timeout=0.05)

    async def every() -> Any:
        return await wait_async([slow, fast], timeout=30)

    done, not_done = client.sync(first)
    assert done == {fast} and not_done == {slow}
    with pytest.raises(TimeoutError):
        client.sync(briefly)
    done, not_done = client.sync(every)
    assert done == {slow, fast} and not not_done
    assert fast.result() == 3


def test_sync_runs_a_worker_loop_coroutine_from_a_task_thread(client):
    # the block and probe tasks: a task thread calling coroutines of its worker's event loop
    def task() -> tuple[int, bool, str]:
        worker = get_worker()

        async def on_loop(x: int) -> tuple[int, int]:
            return x + 1, threading.get_ident()

        async def fails() -> None:
            raise ValueError("raised on the loop")

        value, loop_thread = sync(worker.loop, on_loop, 41)
        try:
            sync(worker.loop, fails)
        except ValueError as e:
            error = str(e)
        return value, loop_thread != threading.get_ident(), error

    assert client.submit(task, pure=False).result() == (42, True, "raised on the loop")


def test_status_has_the_states_dask_rpm_reads_and_sets(cluster, client):
    used = {"created", "running", "closing", "closing_gracefully", "closed", "failed"}
    assert used <= {s.name for s in Status}, f"missing: {used - {s.name for s in Status}}"
    statuses = client.run(lambda dask_worker: dask_worker.status)
    assert list(statuses.values()) == [Status.running] * WORKERS
    assert cluster.status == Status.running


def test_to_serialize_sends_arrays_in_an_rpc_reply(client):
    # the engine's rpm_rows handler replies with parameter rows this way
    def install(dask_worker: Any) -> None:
        def rows(a: int, b: int) -> dict[str, Any]:
            return {"params": [to_serialize(np.arange(a, b, dtype=np.float64))]}

        dask_worker.handlers["rpm_api_test_rows"] = rows

    address = sorted(client.scheduler_info(n_workers=-1)["workers"])[0]
    client.run(install, workers=[address])

    async def ask() -> Any:
        return await client.rpc(address).rpm_api_test_rows(a=2, b=7)

    reply = client.sync(ask)
    (got,) = reply["params"]
    assert isinstance(got, np.ndarray) and got.dtype == np.float64
    np.testing.assert_array_equal(got, np.arange(2.0, 7.0))


def test_parse_memory_limit_splits_the_machine_among_workers():
    # the emulated cluster's memory_limit="auto": LocalCluster's share per worker
    logger = logging.getLogger(__name__)
    whole = parse_memory_limit("auto", 1, 1, logger=logger)
    quarter = parse_memory_limit("auto", 1, 4, logger=logger)
    assert whole is not None and 0 < whole <= psutil.virtual_memory().total
    assert quarter is not None and abs(4 * quarter - whole) <= 4
    assert parse_memory_limit("1GB", 1, 4, logger=logger) == 10**9


def test_scheduler_identity_rpc_lists_every_worker(client):
    # the engine, the probe and the link emulation ask for every worker at once
    async def identity(n: int) -> dict[str, Any]:
        return await client.scheduler.identity(n_workers=n)

    everyone = client.sync(identity, -1)
    assert everyone["n_workers"] == WORKERS and len(everyone["workers"]) == WORKERS
    assert len(client.sync(identity, 2)["workers"]) == 2


def _spec_cluster() -> SpecCluster:
    return SpecCluster(
        workers={},
        scheduler={
            "cls": Scheduler,
            "options": {"host": "127.0.0.1", "dashboard_address": "127.0.0.1:0"},
        },
        asynchronous=True,
    )


def test_no_op_awaitable_is_what_asynchronous_scale_returns():
    # HeterogeneousSLURMCluster.scale keeps SpecCluster's contract: awaitable when asynchronous
    async def main() -> None:
        async with _spec_cluster() as cluster:
            returned = cluster.scale(0)
            assert isinstance(returned, NoOpAwaitable)
            assert await returned is None
            assert await NoOpAwaitable() is None

    asyncio.run(main())


def test_spec_cluster_correct_state_starts_and_stops_the_specs_workers():
    # HeterogeneousSLURMCluster edits worker_spec, then awaits _correct_state to submit/cancel jobs
    async def main() -> None:
        async with _spec_cluster() as cluster:
            cluster.worker_spec["w0"] = {"cls": Worker, "options": {"nthreads": 1}}
            await cluster._correct_state()
            assert set(cluster.workers) == {"w0"}
            assert [w.name for w in cluster.scheduler.workers.values()] == ["w0"]
            del cluster.worker_spec["w0"]
            await cluster._correct_state()
            assert not cluster.workers
            deadline = time.monotonic() + 30
            while cluster.scheduler.workers and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert not cluster.scheduler.workers
        assert cluster.status == Status.closed

    asyncio.run(main())


def test_bokeh_application_serves_a_page_from_the_scheduler(cluster, client):
    page = _serve(cluster, client, "/rpm-api-test-plain", styled=False)
    assert "static/js/bokeh" in page


def test_template_variables_hold_the_navigation_bar(cluster, client):
    # the /rpm page adds its link to the list every Dask page renders its navigation bar from
    def add_link(dask_scheduler: Any) -> list[str]:
        pages = template_variables(dask_scheduler)["pages"]
        assert template_variables(dask_scheduler)["pages"] is pages  # one list per scheduler
        pages.append("rpm-api-test-link")
        return list(pages)

    pages = _on_scheduler(cluster, add_link)
    assert "status" in pages and "rpm-api-test-link" in pages
    assert 'href="rpm-api-test-link"' in _get(_dashboard(client) + "/status")


def test_env_template_draws_the_dask_page_around_a_document(cluster, client):
    plain = _serve(cluster, client, "/rpm-api-test-bare", styled=False)
    styled = _serve(cluster, client, "/rpm-api-test-styled", styled=True)
    assert 'href="status"' in styled and 'href="status"' not in plain
    assert "static/js/bokeh" in styled


def test_bokeh_theme_is_a_theme_that_styles_figures():
    assert isinstance(BOKEH_THEME, Theme)
    doc = Document()
    p = figure()
    doc.add_root(p)
    before = p.properties_with_values() | p.toolbar.properties_with_values()
    doc.theme = BOKEH_THEME
    after = p.properties_with_values() | p.toolbar.properties_with_values()
    assert before != after, "the Dask dashboard's theme changed nothing on a figure"
