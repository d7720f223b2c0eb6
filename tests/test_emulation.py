"""Tests of EMULATED heterogeneity (dask_rpm.emulation) on real local clusters.

The machine may be shared: timing assertions use scales well below one core,
allow a few retries, and leave out blocks that overran (other load, counted
as such by the emulation) before comparing medians.
"""

from __future__ import annotations

import math
import os
import statistics
import subprocess
import sys
import time

import dask
import numpy as np
import pytest
from dask.system import CPU_COUNT
from distributed import Client, LocalCluster

from dask_rpm import emulation as emu
from dask_rpm.emulation import (
    EmulationPlugin,
    auto_scale,
    current_speed,
    emulation_label,
    emulation_report,
    local_cluster,
    pace,
    pacing,
    set_speed,
)

pytestmark = pytest.mark.timeout(120)

# the paper's condition A profile (8 workers)
PROFILE_A = (0.25, 0.31, 0.63, 1.0, 1.0, 0.42, 0.67, 0.63)


def _gemm_block(
    iteration: int | None = None, reps: int = 12, stated: bool = False
) -> tuple[float, float]:
    """A fixed numpy workload inside pace(); returns (wall, cpu) of the block.

    ``stated``: the block tells pace() its work (2 n^3 flops per product), as
    the BP kernels do, so it is paced on work / rate instead of its own,
    noisy, CPU time.
    """
    rng = np.random.default_rng(0)
    a = rng.random((256, 256))
    a @ a  # warm caches outside the timed block
    wall0, cpu0 = time.perf_counter(), time.thread_time()
    with pace(iteration, work=reps * 2.0 * 256**3 if stated else None):
        for _ in range(reps):
            a @ a
    return time.perf_counter() - wall0, time.thread_time() - cpu0


def _paced_block(iteration: int | None = None) -> tuple[float, float, float]:
    """Run :func:`_gemm_block` and return pace's own (cpu, wall, target)."""
    _gemm_block(iteration)
    return emu.worker_plugin().last_block


def _timed_paced_block() -> tuple[float, tuple[float, float, float]]:
    """Outer wall time of a work-stating :func:`_gemm_block` and pace's own (cpu, wall, target)."""
    wall, _ = _gemm_block(stated=True)
    return wall, emu.worker_plugin().last_block


def _check_paced(
    client, worker: str, rate: float, iteration: int | None = None, tries: int = 6
) -> float:
    """Run paced blocks on ``worker`` until one lasts cpu / rate (within 10%).

    A paced block never ends early; it can end late when the machine is busy
    (an overrun), so a few tries are allowed. Returns the best wall / target.
    """
    best = math.inf
    for _ in range(tries):
        cpu, wall, target = client.submit(
            _paced_block, iteration, workers=[worker], pure=False
        ).result()
        assert target == pytest.approx(cpu / rate)
        assert wall >= target, "a paced block ended early"
        best = min(best, wall / target)
        if best <= 1.1:
            break
    assert best <= 1.1, f"every paced block overran: best wall/target {best:.2f}"
    return best


def _blas_threads() -> list[int]:
    from threadpoolctl import threadpool_info

    return [d["num_threads"] for d in threadpool_info() if d.get("user_api") == "blas"]


# ---------------------------------------------------------------- no worker


def test_pace_is_noop_outside_workers():
    assert current_speed() is None
    assert current_speed(5) is None
    assert isinstance(pace(1), pacing._NoPace)
    cpu0 = time.thread_time()
    for i in range(20_000):
        with pace(i):
            pass
    # cheap: CPU time (immune to other load) well under 10 us per block
    assert (time.thread_time() - cpu0) / 20_000 < 1e-5


def test_pace_is_noop_on_plain_worker():
    with (
        LocalCluster(
            n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None
        ) as cluster,
        Client(cluster) as client,
    ):
        assert client.submit(current_speed, 3).result() is None
        assert emulation_label(client) is None
        assert emulation_report(client) == []


def _hooks(dask_worker):
    from dask_rpm.runtime.hooks import worker_hooks

    h = worker_hooks(dask_worker)
    return h.paced, h.before_send is not None, h.pace.__module__


@pytest.mark.slow
def test_the_engine_calls_no_emulation_code_on_a_real_cluster():
    """The engine reaches pacing and link delays only through the worker's hooks: a plain
    worker's are the no-ops of dask_rpm.runtime.hooks; EMULATED ones get the emulation's, and lose
    them when the plugin leaves."""
    from dask_rpm import fit

    x = np.random.default_rng(0).normal(size=(40, 3))
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0") as cluster,
        Client(cluster) as client,
    ):
        fit(x, x[:, :2], hidden=4, iterations=3, learning_rate=0.01, progress="none")
        assert set(client.run(_hooks).values()) == {(False, False, "dask_rpm.runtime.hooks")}
    with (
        local_cluster(speeds=[1.0, 0.5], nodes=["a", "b"], dashboard_address=":0") as cluster,
        Client(cluster) as client,
    ):
        assert set(client.run(_hooks).values()) == {(True, True, "dask_rpm.emulation.pacing")}
        client.run(lambda dask_worker: dask_worker.plugins[emu.PLUGIN_NAME].teardown(dask_worker))
        assert {v[0] for v in client.run(_hooks).values()} == {False}


# ---------------------------------------------------------------- scale


def test_auto_scale_leaves_headroom_for_eight_workers_on_two_cores():
    scale = auto_scale(PROFILE_A, cores=2)
    assert scale * sum(PROFILE_A) <= 0.8 * 2 + 1e-12
    assert scale == pytest.approx(0.8 * 2 / sum(PROFILE_A))
    # threads count: two threads per worker halve the scale
    assert auto_scale(PROFILE_A, 2, cores=2) == pytest.approx(scale / 2)
    # few slow workers: never more than one core per unit speed, nor per thread
    assert auto_scale([0.5], cores=8) == 1.0
    assert auto_scale([4.0, 1.0], cores=64) == pytest.approx(0.25)
    with dask.config.set({"rpm.emulation.headroom": 0.5}):
        assert auto_scale(PROFILE_A, cores=2) == pytest.approx(0.5 * 2 / sum(PROFILE_A))
    with pytest.raises(ValueError):
        auto_scale([1.0, 0.0])


def test_cluster_of_eight_reports_scale_and_label():
    with local_cluster(PROFILE_A, processes=False, dashboard_address=None) as cluster:
        cores = CPU_COUNT
        assert cluster.speeds == PROFILE_A
        assert cluster.scale_factor * sum(PROFILE_A) <= 0.8 * cores + 1e-9
        assert cluster.scale_factor <= 1.0
        label = cluster.emulation_label
        assert label.startswith("EMULATED heterogeneity on one machine: speeds 0.25, 0.31,")
        assert f"x scale {cluster.scale_factor:.3g} of a core" in label
        assert "\n" not in label
        assert cluster.emulation_metadata["emulated"] is True
        with Client(cluster) as client:
            addrs = cluster.worker_names()
            assert addrs == emu.worker_addresses(client)
            speeds = [client.submit(current_speed, workers=[a], pure=False).result() for a in addrs]
            assert speeds == list(PROFILE_A)
            assert emulation_label(client) == label
            with pytest.raises(ValueError):
                cluster.scale(9)


def test_defaults_and_validation():
    assert tuple(dask.config.get("rpm.emulation.speeds")) == emu.DEFAULT_SPEEDS == (1.0, 0.5, 0.25)
    with pytest.raises(ValueError):
        local_cluster((1.0, -1.0), processes=False)
    with pytest.raises(ValueError):
        local_cluster((1.0, 0.5), processes=False, schedule={2: [(1, 0.5)]})
    with pytest.raises(ValueError):
        local_cluster((1.0, 0.5), processes=False, schedule={0: [("x", 1, 0.5)]})


# ---------------------------------------------------------------- speeds


@pytest.mark.slow
def test_wall_time_ratios_follow_speeds_on_nanny_workers():
    speeds, scale = (1.0, 0.5, 0.25), 0.15
    # scale well below a core: robust to other load on a shared machine
    with (
        local_cluster(speeds, scale=scale, dashboard_address=None) as cluster,
        Client(cluster) as client,
    ):
        addrs = cluster.worker_names()
        assert len(addrs) == 3 and all(a.startswith("tcp://127.0.0.1:") for a in addrs)
        # BLAS pinned to the worker's one thread, so thread_time sees all the work
        for threads in client.run(_blas_threads).values():
            assert threads and all(t == 1 for t in threads)
        for i, a in enumerate(addrs):  # each block lasts cpu / (speed * scale)
            _check_paced(client, a, speeds[i] * scale)
        walls: list[list[float]] = [[], [], []]
        for rnd in range(15):  # interleaved and sequential: no contention between them
            for i, a in enumerate(addrs):
                wall, (_, inner, target) = client.submit(
                    _timed_paced_block, pure=False, workers=[a]
                ).result()
                # a block that overran measures other load, not the profile (and is counted)
                if inner <= 1.05 * target:
                    walls[i].append(wall)
            if rnd < 4 or min(len(w) for w in walls) < 3:
                continue
            med = [statistics.median(w) for w in walls]
            ratios = [m / med[0] for m in med]
            if all(abs(ratios[i] * speeds[i] - 1) < 0.1 for i in (1, 2)):
                break
        assert min(len(w) for w in walls) >= 3, f"machine too busy: most blocks overran {walls}"
        med = [statistics.median(w) for w in walls]
        ratios = [m / med[0] for m in med]
        print(
            f"EMULATED wall-time ratios after {rnd + 1} rounds: "
            f"{ratios[1]:.3f} (expect 2), {ratios[2]:.3f} (expect 4)"
        )
        # fixed work: the wall-time ratios follow the speed ratios
        assert ratios[1] == pytest.approx(2.0, rel=0.15)
        assert ratios[2] == pytest.approx(4.0, rel=0.15)
        rows = emulation_report(client)
        assert [r["index"] for r in rows] == [0, 1, 2]
        assert all(r["blocks"] >= rnd + 2 for r in rows)
        assert "EMULATED" in emu.format_report(rows, cluster.emulation_label)


def test_schedule_by_iteration_and_time():
    schedule = {1: [(3, 0.125)], 0: [("t", 1.0, 0.25)]}
    with (
        local_cluster(
            (1.0, 0.5), scale=0.5, processes=False, schedule=schedule, dashboard_address=None
        ) as cluster,
        Client(cluster) as client,
    ):
        assert "w1->0.125 from iteration 3" in cluster.emulation_label
        assert "w0->0.25 after 1 s" in cluster.emulation_label
        w0, w1 = cluster.worker_names()

        def by_iteration() -> list[float | None]:
            return [current_speed(i) for i in range(6)] + [current_speed(), current_speed(0)]

        got = client.submit(by_iteration, workers=[w1], pure=False).result()
        # from iteration 3 on; a new run (iteration 0) starts over
        assert got == [0.5, 0.5, 0.5, 0.125, 0.125, 0.125, 0.125, 0.5]
        # the slowdown is applied by pace, too
        _check_paced(client, w1, 0.125 * 0.5, iteration=5)
        _check_paced(client, w1, 0.5 * 0.5, iteration=0)

        # time entries count from the worker's first paced block
        def first_block() -> tuple[float | None, float | None]:
            before = current_speed()
            _gemm_block()
            return before, current_speed()

        assert client.submit(first_block, workers=[w0], pure=False).result() == (1.0, 1.0)
        time.sleep(1.1)
        assert client.submit(current_speed, workers=[w0], pure=False).result() == 0.25
        emu.reset_clock(client)
        assert client.submit(current_speed, workers=[w0], pure=False).result() == 1.0


def test_set_speed_at_run_time():
    with (
        local_cluster((1.0, 0.5), scale=0.5, processes=False, dashboard_address=None) as cluster,
        Client(cluster) as client,
    ):
        w0, w1 = cluster.worker_names()
        set_speed(client, 0, 0.2)
        assert client.submit(current_speed, workers=[w0], pure=False).result() == 0.2
        _check_paced(client, w0, 0.2 * 0.5)
        set_speed(client, w1, 1.0)  # by address
        info = emu.emulation_info(client)
        assert [info[w0]["current_speed"], info[w1]["current_speed"]] == [0.2, 1.0]
        set_speed(client, 0, None)  # back to the base speed
        assert client.submit(current_speed, workers=[w0], pure=False).result() == 1.0
        with pytest.raises(ValueError):
            set_speed(client, 0, 0.0)
        with pytest.raises(KeyError):
            set_speed(client, 7, 0.5)


def test_overruns_nesting_and_errors_are_accounted():
    def blocks() -> None:
        with pace(0):
            time.sleep(0.02)  # wall time without cpu time: an overrun
        with pace(1):
            with pace(1):  # nested: paced once, by the outer block
                a = np.ones((200, 200))
                for _ in range(10):
                    a @ a
        with pytest.raises(RuntimeError), pace(2):
            raise RuntimeError("not paced")

    with (
        local_cluster((0.5,), scale=0.5, processes=False, dashboard_address=None) as cluster,
        Client(cluster) as client,
    ):
        client.submit(blocks, pure=False).result()
        (row,) = emulation_report(client)
        assert row["blocks"] == 2
        # the sleeping block overran; the GEMM block may too if the machine is busy
        assert 1 <= row["overruns"] <= 2 and row["overrun_s"] >= 0.015
        # the nested GEMM block was slowed to cpu / 0.25, not twice that
        assert row["wall_s"] >= 0.02 + 0.98 * row["cpu_s"] * 4
        if row["overruns"] == 1:
            assert row["wall_s"] == pytest.approx(0.02 + row["cpu_s"] * 4, rel=0.2, abs=0.01)
        assert row["last_iteration"] == 2


def test_helpers_work_with_an_asynchronous_client():
    import asyncio

    async def main() -> tuple[str | None, list[str], float | None]:
        async with local_cluster(
            (1.0, 0.5), processes=False, dashboard_address=None, asynchronous=True
        ) as cluster:
            async with Client(cluster, asynchronous=True) as client:
                await set_speed(client, 1, 0.125)
                addrs = await emu.worker_addresses(client)
                speed = await client.submit(current_speed, workers=[addrs[1]], pure=False)
                return await emulation_label(client), addrs, speed

    label, addrs, speed = asyncio.run(main())
    assert label.startswith("EMULATED heterogeneity on one machine: speeds 1.0, 0.5 x scale")
    assert len(addrs) == 2 and speed == 0.125


# ---------------------------------------------------------------- preload


def test_plugin_from_env():
    assert emu.plugin_from_env({}) is None
    p = emu.plugin_from_env(
        {
            emu.ENV_SPEED: "0.5",
            emu.ENV_SCALE: "0.25",
            emu.ENV_SCHEDULE: '[[10, 0.2], ["t", 5, 1.0]]',
            emu.ENV_INDEX: "3",
        }
    )
    assert isinstance(p, EmulationPlugin)
    assert (p.speed, p.scale, p.index) == (0.5, 0.25, 3)
    assert p.speed_at(9) == 0.5 and p.speed_at(10) == 0.2
    # survives pickling (Nanny) with runtime state rebuilt
    import pickle

    q = pickle.loads(pickle.dumps(p))
    assert q.speed_at(12) == 0.2 and q.blocks == 0


def test_env_var_preload_on_a_worker_started_elsewhere():
    with (
        LocalCluster(n_workers=0, processes=True, dashboard_address=None) as cluster,
        Client(cluster) as client,
    ):
        # like a batch job on a shared file system: the job sees the same code
        path = os.pathsep.join([os.path.dirname(__file__), os.environ.get("PYTHONPATH", "")])
        env = dict(
            os.environ,
            **{
                emu.ENV_SPEED: "0.5",
                emu.ENV_SCALE: "0.25",
                "OPENBLAS_NUM_THREADS": "2",
                "PYTHONPATH": path,
            },
        )
        cmd = [
            sys.executable,
            "-m",
            "distributed.cli.dask_worker",
            cluster.scheduler_address,
            "--nthreads",
            "1",
            "--no-nanny",
            "--no-dashboard",
            "--name",
            "slurm-job-0",
            "--preload",
            "dask_rpm.emulation",
        ]
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            client.wait_for_workers(1, timeout=60)
            assert proc.poll() is None
            (row,) = emulation_report(client)
            assert (row["speed"], row["scale"], row["name"]) == (0.5, 0.25, "slurm-job-0")
            assert client.submit(current_speed, pure=False).result() == 0.5
            # BLAS pinned to the worker's thread count despite the environment
            assert all(t == 1 for t in client.run(_blas_threads)[row["address"]])
            _check_paced(client, row["address"], 0.5 * 0.25)
            label = emulation_label(client)
            assert (
                label == "EMULATED heterogeneity on one machine: speeds 0.5 x scale 0.25 of a core"
            )
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def test_heartbeat_failure_of_a_closing_worker_is_not_logged():
    import logging

    from dask_rpm.emulation.pacing import _HeartbeatAtClose

    def record(msg):
        return logging.LogRecord("distributed.worker", logging.ERROR, __file__, 1, msg, None, None)

    beat = "Failed to communicate with scheduler during heartbeat."
    cluster = local_cluster([1.0], processes=False, dashboard_address=":0")
    worker = cluster.workers[0]
    quiet = _HeartbeatAtClose(worker)
    try:
        assert quiet.filter(record(beat))  # a running worker's failed heartbeat is news: logged
        assert quiet.filter(record("something else"))
    finally:
        cluster.close()
    assert not quiet.filter(
        record(beat)
    )  # once closing: the in-flight heartbeat's traceback is dropped
    assert quiet.filter(record("something else"))  # everything else still passes
    # the emulation plugin installs the filter on every emulated worker
    assert any(
        isinstance(f, _HeartbeatAtClose) for f in logging.getLogger("distributed.worker").filters
    )


def test_closing_noise_drops_only_the_close_notice_and_only_while_closing():
    """The "Batched Comm Closed" INFO record (a traceback at cluster close, nothing wrong) is
    dropped once the owning cluster is closing; while it runs, and for any other record, kept."""
    import logging
    import types

    from distributed.core import Status

    from dask_rpm.runtime.closing import ClosingNoise

    cluster = types.SimpleNamespace(status=Status.running)
    noise = ClosingNoise(cluster)

    def record(msg):
        return logging.LogRecord("distributed.batched", logging.INFO, "x", 1, msg, (), None)

    assert noise.filter(record("Batched Comm Closed %r"))
    for status in (Status.closing, Status.closed):
        cluster.status = status
        assert not noise.filter(record("Batched Comm Closed %r"))
        assert noise.filter(record("something else"))


def test_the_plugin_carries_the_settings_it_was_built_with_to_the_worker():
    import pickle

    plugin = EmulationPlugin(1.0, overrun_tolerance=0.1, rate_fraction=0.25)
    there = pickle.loads(pickle.dumps(plugin))  # what a Nanny's worker gets
    assert (there.overrun_tolerance, there.rate_fraction) == (0.1, 0.25)
    with dask.config.set({"rpm.emulation.rate-fraction": 0.4}):
        assert EmulationPlugin(1.0).rate_fraction == 0.4  # built here: read here
