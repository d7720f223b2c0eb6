"""A worker's call to a peer gives up once the scheduler says the peer left (dask_rpm.engine.peers).

A killed peer refuses connections, and Dask's ``connect`` retries a refused one until its
connect timeout (30 s by default); a worker fetching rows for a remap or a recovery waited that
long in its only thread, and the retried recovery queued behind it (a 31 s stall in the chaos
soak). Real worker processes, a real SIGKILL.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
from distributed import Client, LocalCluster

from dask_rpm.engine import ordered_workers
from dask_rpm.engine.fit import ensure_plugins
from dask_rpm.engine.peers import PeerLeftError, call_peer


async def _call_dead(address, dask_worker=None):
    t0 = time.monotonic()
    try:
        await call_peer(dask_worker, address, "rpm_rows", run="none", a=0, b=1)
    except PeerLeftError as exc:
        return "left", str(exc), time.monotonic() - t0
    except Exception as exc:  # noqa: BLE001 - reported to the test
        return type(exc).__name__, str(exc), time.monotonic() - t0
    return "answered", "", time.monotonic() - t0


async def _call_live(address, dask_worker=None):
    try:
        await call_peer(dask_worker, address, "rpm_rows", run="none", a=0, b=1)
    except Exception as exc:  # noqa: BLE001 - the peer's own error comes back
        return type(exc).__name__, str(exc)
    return "answered", ""


@pytest.mark.slow
def test_a_call_to_a_killed_peer_gives_up_when_the_scheduler_sees_it_gone():
    with (
        LocalCluster(
            n_workers=3, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        client.sync(ensure_plugins, client)
        a, b, c = ordered_workers(client.scheduler_info())
        # a live peer answers (here with its own error: it has no such run), as a plain rpc does
        kind, text = client.run(_call_live, c, workers=[a])[a]
        assert kind == "KeyError" and "none" in text
        # (its nanny restarts it at a new address: the old one stays gone); a has no pooled
        # connection to b, so it connects afresh and is refused
        os.kill(client.run(os.getpid, workers=[b])[b], signal.SIGKILL)
        while b in client.scheduler_info(n_workers=-1)["workers"]:
            time.sleep(0.05)
        time.sleep(1.0)  # the workers have dropped their pooled connections to b by now
        kind, text, seconds = client.run(_call_dead, b, workers=[a])[a]
    assert kind == "left" and b in text and "rpm_rows" in text
    assert seconds < 15  # Dask's own connect would retry for 30 s
