"""The rpm dashboard: ``/rpm``, ``/rpm/state.json`` and the rpm gauges on ``/metrics``.

One emulated cluster (module fixture) trains a short DRPM run; the HTTP tests
then read the scheduler's own dashboard port. The browser test drives headless
Chromium through chromedriver's W3C WebDriver HTTP API (no Python package
needed: Debian's ``chromium`` and ``chromium-driver``), and set
``DASK_RPM_SAVE_SCREENSHOT=1`` to also write ``docs/img/dashboard.png``.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import dask_rpm
from dask_rpm import dashboard
from dask_rpm.dashboard.page import RPMPage
from dask_rpm.dashboard.state import Installed
from dask_rpm.drpm.estimator import AbilityEstimateError
from dask_rpm.engine.records import TimingRecord
from dask_rpm.plugin import RPMSchedulerPlugin

SPEEDS = [1.0, 0.5, 0.25]
ITERATIONS = 45  # two DRPM checks at the default interval (20): at least one remap
REPO = Path(__file__).resolve().parents[1]


def _get(url: str, timeout: float = 30) -> tuple[int, str, str]:
    with urllib.request.urlopen(url, timeout=timeout) as f:
        return f.status, f.headers.get("Content-Type", ""), f.read().decode()


@pytest.fixture(scope="module")
def trained():
    """An emulated 3-worker cluster after a short DRPM run; yields (client, cluster, result, base URL)."""
    from distributed import Client

    # Tasks of tens of ms rather than a few: the engine's t1 (worker clocks
    # corrected to the scheduler's) is then far from the jitter of that correction.
    rng = np.random.default_rng(7)
    x = rng.random((1500, 20))
    d = (x[:, :3] > 0.5).astype(float)
    with dask_rpm.local_cluster(SPEEDS, dashboard_address="127.0.0.1:0") as cluster:
        with Client(cluster) as client:
            for attempt in range(3):
                try:
                    result = dask_rpm.fit(
                        x,
                        d,
                        hidden=48,
                        iterations=ITERATIONS,
                        learning_rate=0.005,
                        mapping="drpm",
                        seed=0,
                        client=client,
                    )
                    break
                except AbilityEstimateError as e:
                    # The engine occasionally measures t1 < 0 (a driver bug, reported
                    # with #7); it is not what these tests are about, so train again.
                    if attempt == 2:
                        raise
                    warnings.warn(f"dask_rpm.fit failed, retrying: {e}", stacklevel=1)
            # dashboard_link names the host of the scheduler's address; the server listens on loopback.
            base = f"http://127.0.0.1:{client.scheduler_info()['services']['dashboard']}"
            yield client, cluster, result, base


# --------------------------------------------------------------------------- HTTP routes


def test_page_serves_bokeh_document(trained):
    _, _, _, base = trained
    status, ctype, body = _get(base + "/rpm")
    assert status == 200 and "text/html" in ctype
    assert "static/js/bokeh" in body  # the Bokeh runtime
    assert "Bokeh.embed" in body or "embed_items" in body  # ...and a server document to embed
    # Served next to the Dask pages, with a link from their navigation bar.
    assert 'href="rpm"' in _get(base + "/status")[2]


def test_state_json(trained):
    _, cluster, result, base = trained
    status, ctype, body = _get(base + "/rpm/state.json")
    assert status == 200 and "application/json" in ctype
    state = json.loads(body)
    planned = result.plan.planned_workers
    assert len(state["rectangles"]) == len(planned) == len(state["plan"]["rectangles"])
    assert {r["worker"] for r in state["rectangles"]} == set(planned)
    for r in state["rectangles"]:
        assert r["address"] and r["address"].startswith("tcp://")
        assert 0 < r["ability"] <= 1
        assert r["samples"][1] > r["samples"][0] and r["hidden"][1] > r["hidden"][0]
    # The rectangles tile the whole samples x hidden square.
    area = sum(
        (r["samples"][1] - r["samples"][0]) * (r["hidden"][1] - r["hidden"][0])
        for r in state["rectangles"]
    )
    assert area == state["plan"]["samples"] * state["plan"]["shape"][1]
    # Everything plugin.state() has, accumulated over all blocks.
    assert state["emulation"] == cluster.emulation_label and "EMULATED" in state["emulation"]
    assert [row["iteration"] for row in state["iterations"]] == list(range(ITERATIONS))
    assert state["iterations_total"] == ITERATIONS
    assert len(state["abilities"]) == 2 and len(state["remaps"]) == len(result.remaps) >= 1
    assert state["summary"]["iterations_done"] == ITERATIONS
    assert state["run"] in state["runs"]

    tail = json.loads(_get(base + "/rpm/state.json?tail=5")[2])
    assert [row["iteration"] for row in tail["iterations"]] == list(
        range(ITERATIONS - 5, ITERATIONS)
    )
    since = json.loads(_get(base + "/rpm/state.json?since=40")[2])
    assert [row["iteration"] for row in since["iterations"]] == list(range(41, ITERATIONS))
    with pytest.raises(urllib.error.HTTPError) as e:
        _get(base + "/rpm/state.json?tail=many")
    assert e.value.code == 400


def test_metrics(trained):
    pytest.importorskip("prometheus_client")
    _, _, result, base = trained
    status, _, body = _get(base + "/metrics")
    assert status == 200
    for name in dashboard.METRIC_NAMES:
        assert f"# TYPE dask_{name} gauge" in body
    lines = [
        ln
        for ln in body.splitlines()
        if ln.startswith("dask_rpm_worker_ability{") and 'source="plan"' in ln
    ]
    assert len(lines) == len(result.plan.planned_workers)
    assert f"dask_rpm_iteration {float(ITERATIONS)}" in body
    remaps = sum(
        float(ln.rsplit(" ", 1)[1]) for ln in body.splitlines() if ln.startswith("dask_rpm_remaps{")
    )
    assert remaps == len(result.remaps)


def test_install_is_idempotent(trained):
    client, _, _, base = trained

    def reinstall(dask_scheduler: Any) -> tuple[int, int, int]:
        import prometheus_client

        from dask_rpm import dashboard as dash
        from dask_rpm.dashboard.metrics import RPMCollector

        def count() -> tuple[int, int, int]:
            app = dask_scheduler.http_application
            state_routes = sum(
                1
                for rule in app.default_router.rules
                for sub in getattr(rule.target, "rules", [])
                if getattr(sub.matcher, "regex", None) is not None
                and "state.json" in sub.matcher.regex.pattern
            )
            pages = sum(1 for a in app.applications if "/rpm" in getattr(a, "app_paths", ()))
            collectors = sum(
                1
                for c in prometheus_client.REGISTRY._collector_to_names
                if isinstance(c, RPMCollector)
            )
            return state_routes, pages, collectors

        before = count()
        dash.install(dask_scheduler, dask_scheduler.plugins["rpm"])
        dash.install(dask_scheduler, dask_scheduler.plugins["rpm"])
        assert count() == before
        return before

    assert client.run_on_scheduler(reinstall) == (1, 1, 1)
    assert _get(base + "/rpm")[0] == 200
    assert json.loads(_get(base + "/rpm/state.json")[2])["rectangles"]


def test_preload_and_empty_state():
    """``--preload dask_rpm.plugin``: the routes exist before any run, with an empty state."""
    from distributed import Scheduler

    async def main() -> tuple[dict, str]:
        async with Scheduler(dashboard_address="127.0.0.1:0", preload=["dask_rpm.plugin"]) as s:
            assert isinstance(s.plugins.get("rpm"), RPMSchedulerPlugin)
            base = f"http://127.0.0.1:{s.http_server.port}"
            loop = asyncio.get_running_loop()  # urllib blocks: keep the scheduler's loop free
            state = json.loads(
                (await loop.run_in_executor(None, _get, base + "/rpm/state.json"))[2]
            )
            page = (await loop.run_in_executor(None, _get, base + "/rpm"))[2]
            return state, page

    state, page = asyncio.run(main())
    assert state["run"] is None and state["rectangles"] == [] and state["iterations"] == []
    assert "static/js/bokeh" in page


def test_install_without_http_server_is_harmless(caplog):
    class Bare:  # a "scheduler" with no dashboard server
        pass

    with caplog.at_level("INFO", logger="dask_rpm.dashboard"):
        dashboard.install(Bare(), RPMSchedulerPlugin())
    assert "no HTTP server" in caplog.text


# --------------------------------------------------------------------------- snapshot (no cluster)


class _FakePlugin:
    """Just enough of RPMSchedulerPlugin for :func:`dashboard.snapshot`."""

    def __init__(self, state: dict[str, Any]) -> None:
        self._state = state
        self.runs = {state.get("run"): None} if state.get("run") else {}

    def state(self, run: str | None = None) -> dict[str, Any]:
        return dict(self._state)


def _plan(workers: list[str] | None) -> dict[str, Any]:
    return {
        "method": "srpm",
        "abilities": (0.5, 0.3, 0.2),
        "shape": (4, 10, 2),
        "samples": 100,
        "workers": workers,
        "rectangles": (
            {"worker": 2, "column": 0, "samples": (0, 50), "hidden": (0, 4)},
            {"worker": 1, "column": 0, "samples": (0, 50), "hidden": (4, 10)},
            {"worker": 0, "column": 1, "samples": (50, 100), "hidden": (0, 10)},
        ),
    }


def test_snapshot_enriches_and_cleans():
    workers = ["tcp://a:1", "tcp://b:2", "tcp://c:3"]
    plugin = _FakePlugin(
        {
            "run": "r1",
            "plan": _plan(workers),
            "groups": {"tcp://a:1": "fast", "tcp://b:2": "slow", "tcp://c:3": "slow"},
            "iterations": [
                {"iteration": i, "error": float("nan") if i == 1 else 1.0 / (i + 1), "time": 0.1}
                for i in range(4)
            ],
            "abilities": [
                {"check": 0, "iteration": 2, "abilities": [0.6, None, float("inf")]},
                {"check": 1, "iteration": 3, "abilities": [0.55, 0.25, None]},
            ],
        }
    )
    cache: dict[str, list] = {}
    state = dashboard.snapshot(plugin, known_workers=cache)
    json.dumps(state, allow_nan=False)  # strictly JSON
    by_worker = {r["worker"]: r for r in state["rectangles"]}
    assert by_worker[0]["address"] == "tcp://a:1" and by_worker[0]["group"] == "fast"
    assert by_worker[2]["group"] == "slow" and by_worker[2]["ability"] == 0.2
    # Latest finite estimate per worker; none for a worker never estimated.
    assert (
        by_worker[0]["estimate"] == 0.55
        and by_worker[1]["estimate"] == 0.25
        and by_worker[2]["estimate"] is None
    )
    assert state["iterations"][1]["error"] is None
    assert state["summary"]["iterations_done"] == 4 and state["summary"]["remaps"] == {
        "column": 0,
        "whole": 0,
    }
    assert cache == {"r1": workers} and state["workers_source"] == "plan"

    # A later plan of the same run without addresses reuses the ones seen before.
    later = dashboard.snapshot(_FakePlugin({"run": "r1", "plan": _plan(None)}), known_workers=cache)
    assert [r["address"] for r in later["rectangles"]] == ["tcp://c:3", "tcp://b:2", "tcp://a:1"]
    assert later["workers_source"] == "earlier plan"


def test_snapshot_tolerates_missing_keys():
    assert dashboard.snapshot(_FakePlugin({"run": None}))["rectangles"] == []
    early = dashboard.snapshot(_FakePlugin({"run": "r", "started": 1.0, "updated": 1.0}))
    assert early["rectangles"] == [] and early["summary"]["iterations_done"] == 0


def test_page_model_with_groups_and_remaps():
    """The Bokeh page's data sources, filled from a recorded state (no server, no browser)."""
    plugin = RPMSchedulerPlugin()
    plugin.update(
        "r1",
        {
            "plan": _plan(["tcp://a:1", "tcp://b:2", "tcp://c:3"]),
            "iterations_total": 10,
            "groups": {"tcp://a:1": "fast", "tcp://b:2": "slow", "tcp://c:3": "slow"},
            "emulation": "EMULATED heterogeneity on one machine: test",
        },
    )
    # What the workers stream: timing records 0.1 s apart (worker clocks) and the errors.
    records = [
        TimingRecord(
            i,
            0,
            0.1 * i,
            0.1 * i + 0.03,
            0.1 * i + 0.04,
            0.1 * i + 0.07,
            0.1 * i + 0.08,
            0.1 * (i + 1),
        )
        for i in range(5)
    ]
    plugin.log_event(
        "rpm",
        {
            "kind": "iterations",
            "run": "r1",
            "records": [tuple(r) for r in records],
            "errors": [(i, 10.0 - i) for i in range(5)],
        },
    )
    plugin.update(
        "r1",
        {
            "abilities": [{"check": 0, "iteration": 5, "abilities": [0.6, 0.3, None]}],
            "remaps": [
                {
                    "iteration": 5,
                    "kind": "column",
                    "bytes": 64,
                    "sample_bytes": 4096,
                    "seconds": 0.01,
                }
            ],
        },
    )
    page = RPMPage(Installed(type("S", (), {})(), plugin, ""))
    page.refresh()
    rects = page.rectangles.source.data
    assert rects["worker"] == ["2", "1", "0"]
    assert rects["group"] == ["slow", "slow", "fast"] and len(set(rects["hatch"])) == 2
    assert (
        rects["label"][2].startswith("w0 :1")
        and "p\u0302 0.60" in rects["label"][2]
        and "fast" in rects["label"][2]
    )
    assert (page.rectangles.x_range.end, page.rectangles.y_range.start) == (100, 10)
    assert page.iterations.data["iteration"] == [0, 1, 2, 3, 4] and page.remaps.data["kind"] == [
        "column remap"
    ]
    # the remap's hover names both what moved between workers and what was re-read from storage
    assert page.remaps.data["bytes"] == [64] and page.remaps.data["sample_bytes"] == [4096]
    np.testing.assert_allclose(page.iterations.data["time"], [0.1] * 5)
    assert len(page.abilities.estimates.data["xs"]) == 2
    assert len(page.abilities.planned.data["xs"]) == 3
    assert "EMULATED" in page.header.root.text

    plugin.log_event(
        "rpm", {"kind": "iterations", "run": "r1", "records": [], "errors": [(5, 4.0)]}
    )
    page.refresh()  # streams only the new row (no timing record yet: no time)
    assert page.iterations.data["iteration"] == [0, 1, 2, 3, 4, 5]
    assert np.isnan(page.iterations.data["time"][-1])


# --------------------------------------------------------------------------- browser


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _webdriver(base: str, method: str, path: str, body: dict | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        base + path, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=60) as f:
        return json.loads(f.read())["value"]


def _screenshot(url: str, size: tuple[int, int] = (1400, 1000)) -> tuple[bytes, int]:
    """PNG of ``url`` once its Bokeh document has the rectangles, and how many it has (headless Chromium)."""
    port = _free_port()
    driver = subprocess.Popen(
        [shutil.which("chromedriver"), f"--port={port}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wd = f"http://127.0.0.1:{port}"
    profile = tempfile.mkdtemp(prefix="rpm-chromium-")
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                _webdriver(wd, "GET", "/status")
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        args = [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            # Without these Chromium phones home, and the closed network refuses it.
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-dev-shm-usage",
            f"--user-data-dir={profile}",
            f"--window-size={size[0]},{size[1]}",
        ]
        caps = {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": shutil.which("chromium"), "args": args},
        }
        sid = _webdriver(wd, "POST", "/session", {"capabilities": {"alwaysMatch": caps}})[
            "sessionId"
        ]
        try:
            _webdriver(wd, "POST", f"/session/{sid}/url", {"url": url})
            # The page is a live Bokeh server document: wait until its websocket
            # session has delivered the rectangles, then give it a paint or two.
            script = (
                "const d = window.Bokeh && Bokeh.documents && Bokeh.documents[0];"
                "const s = d && d.get_model_by_name('rpm-rectangles');"
                "return s ? s.data.left.length : -1;"
            )
            deadline = time.monotonic() + 60
            while (
                n := _webdriver(
                    wd, "POST", f"/session/{sid}/execute/sync", {"script": script, "args": []}
                )
            ) <= 0:
                assert time.monotonic() < deadline, (
                    "the /rpm Bokeh document never showed its rectangles"
                )
                time.sleep(0.2)
            time.sleep(1.5)
            return base64.b64decode(_webdriver(wd, "GET", f"/session/{sid}/screenshot")), n
        finally:
            _webdriver(wd, "DELETE", f"/session/{sid}")
    finally:
        driver.terminate()
        driver.wait(10)
        shutil.rmtree(profile, ignore_errors=True)


@pytest.mark.browser
def test_screenshot(trained, tmp_path):
    missing = [exe for exe in ("chromium", "chromedriver") if shutil.which(exe) is None]
    if missing:
        reason = f"{' and '.join(missing)} not found (Debian packages: chromium chromium-driver)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"browser test must run in CI: {reason}")
        pytest.skip(reason)
    from PIL import Image

    _, _, result, base = trained
    png, shown = _screenshot(base + "/rpm")
    assert shown == len(
        result.plan.planned_workers
    )  # the browser got one rectangle per planned worker
    (tmp_path / "dashboard.png").write_bytes(png)
    if os.environ.get("DASK_RPM_SAVE_SCREENSHOT"):
        (REPO / "docs" / "img").mkdir(parents=True, exist_ok=True)
        (REPO / "docs" / "img" / "dashboard.png").write_bytes(png)

    img = Image.open(io.BytesIO(png)).convert("RGB")
    assert img.size[0] >= 1000 and img.size[1] >= 600
    # Below the navigation bar: a blank (unrendered) document is one flat colour.
    body = np.asarray(img)[img.size[1] // 6 :]
    colours = np.unique(body.reshape(-1, 3), axis=0)
    assert len(colours) > 200, f"only {len(colours)} distinct colours: is the page blank?"
    background = np.all(body == body[-1, -1], axis=-1).mean()
    assert background < 0.8, f"{background:.0%} of the page is background"
