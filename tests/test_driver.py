"""The driver's calls to chosen workers (dask_rpm.engine.driver.Driver.run_each) and the checks that a
checkpoint store is shared (dask_rpm.engine.checkpoint.check_shared / check_readable).

Real LocalClusters of worker processes. A call to a worker that has just left used to wait out Dask's
connect timeout (30 s) and fail with ``OSError``: the 30 s stalls of the chaos soak. ``run_each``
answers ``WorkerLostError`` for it instead, which the test asserts (the kind of the answer, not a time).
"""

from __future__ import annotations

import asyncio
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from distributed import Client, LocalCluster

from dask_rpm.engine import fit, store
from dask_rpm.engine.checkpoint import check_readable, check_shared
from dask_rpm.engine.driver import Driver
from dask_rpm.engine.errors import WorkerLostError
from dask_rpm.engine.fit import ensure_plugins
from dask_rpm.engine.records import RunSpec
from dask_rpm.nn.backend import Placement
from dask_rpm.nn.options import TrainingOptions
from dask_rpm.nn.prepare import prepare
from dask_rpm.ordering import ordered_workers
from dask_rpm.plan.partition import Plan


def _pid() -> int:
    return os.getpid()


def _boom() -> None:
    raise ValueError("boom")


async def _driver(client: Client) -> Driver:
    await ensure_plugins(client)
    addrs = ordered_workers(await client.scheduler.identity())
    plan = Plan.from_columns([[0, 1]], [8], [[2, 2]], shape=(3, 4, 2)).with_workers(addrs)
    x, d = np.ones((8, 3)), np.full((8, 2), 0.5)
    data = prepare(
        x, d, TrainingOptions(hidden=4, iterations=1, learning_rate=0.1, seed=0, dtype="float64")
    )
    spec = RunSpec("t", data.recipe, "float64", Placement("numpy", "cpu"))
    return Driver(client, spec=spec, plan=plan, source=None, arrays=None)


async def _closed(address: str) -> None:
    """Wait until nothing listens at ``address`` any more (at most 30 s)."""
    host, port = address.removeprefix("tcp://").rsplit(":", 1)
    for _ in range(300):
        try:
            _, writer = await asyncio.open_connection(host, int(port))
        except OSError:
            return
        writer.close()
        await asyncio.sleep(0.1)
    raise AssertionError(f"{address} still listens 30 s after it was retired")


def _run(test) -> None:
    async def main() -> None:
        async with (
            LocalCluster(
                n_workers=2,
                threads_per_worker=1,
                processes=True,
                dashboard_address=":0",
                asynchronous=True,
            ) as cluster,
            Client(cluster, asynchronous=True) as client,
        ):
            await test(client, await _driver(client))

    asyncio.run(main())


def test_a_worker_that_left_answers_worker_lost_not_a_connect_timeout():
    async def test(client, driver):
        a, b = driver.addresses
        got = await driver.run_on(_pid, workers=[a, b])
        assert all(isinstance(v, int) for v in got.values())
        await client.retire_workers([a], close_workers=True)
        await _closed(a)  # its process has stopped listening: a connect would retry for 30 s
        got = await driver.run_each({a: (_pid, ()), b: (_boom, ())})
        assert isinstance(got[a], WorkerLostError) and got[a].workers == [a]
        assert isinstance(got[b], ValueError) and str(got[b]) == "boom"  # a failure is returned

    _run(test)


def test_a_shared_store_passes_both_checks_and_keeps_nothing(tmp_path):
    async def test(client, driver):
        ck = tmp_path / "ck"
        ck.mkdir()
        await check_shared(driver, str(ck))
        assert os.listdir(ck) == []  # the check's files are gone
        store.write_whole(str(ck), 3, [np.zeros((4, 3)), np.zeros((2, 4))], None)
        before = sorted(os.listdir(ck))
        await check_readable(driver, str(ck))
        assert sorted(os.listdir(ck)) == before  # nothing written

    _run(test)


def _unshared_worker(scheduler: str, hidden: Path) -> subprocess.Popen:
    """A worker process in its own mount namespace, with an empty tmpfs over ``hidden``: it sees
    ``hidden/ck`` on "its node's disk", not the driver's directory of that name (a real stand-in
    for a worker on another node without the shared file system)."""
    script = (
        f"mount -t tmpfs none {shlex.quote(str(hidden))} && mkdir {shlex.quote(str(hidden / 'ck'))} "
        f"&& exec {shlex.quote(sys.executable)} -m distributed.cli.dask_worker {scheduler} "
        f"--nthreads 1 --no-nanny --no-dashboard"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    return subprocess.Popen(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", script],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _can_unshare() -> bool:
    probe = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "mount", "-t", "tmpfs", "none", "/mnt"],
        capture_output=True,
    )
    return probe.returncode == 0


@pytest.mark.skipif(
    shutil.which("unshare") is None or not _can_unshare(),
    reason="needs unshare -m and mount (root in a Linux container)",
)
def test_a_store_a_worker_does_not_share_is_refused_before_training(tmp_path):
    x = np.random.default_rng(0).normal(size=(16, 3))
    d = np.random.default_rng(1).uniform(0.1, 0.9, size=(16, 2))
    hidden = tmp_path / "hidden"
    (hidden / "ck").mkdir(parents=True)
    with (
        LocalCluster(
            n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        proc = _unshared_worker(cluster.scheduler_address, hidden)
        try:
            client.wait_for_workers(2, timeout=60)
            fit_kw = dict(
                hidden=4, iterations=4, learning_rate=0.01, client=client, progress="none"
            )
            # writing checkpoints there: the driver does not see the other worker's check file
            with pytest.raises(store.StoreError, match="is not shared: the driver does not see"):
                fit(x, d, checkpoint_every=2, checkpoint_dir=hidden / "ck", **fit_kw)
            assert os.listdir(hidden / "ck") == []  # nothing left: no check file, no row file
            # resuming from a store there: the other worker does not see its manifest
            store.write_whole(str(hidden / "ck"), 2, [np.zeros((4, 3)), np.zeros((2, 4))], None)
            with pytest.raises(store.StoreError, match="do not see the checkpoint this process"):
                fit(x, d, resume=hidden / "ck", **fit_kw)
            # the same store handed out from here works: the driver reads it, the workers get shards
            r = fit(x, d, resume=store.load(hidden / "ck"), **fit_kw)
            assert r.stats["start"]["from"] == "checkpoint" and r.history.sizes["iteration"] == 2
        finally:
            proc.kill()
            proc.wait()
