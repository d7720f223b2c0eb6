"""Fault-tolerant and elastic training (dask_rpm.engine): real LocalClusters, real killed workers.

A worker process is killed with SIGKILL from fit's ``callback`` (so the loss
lands mid-run at a known iteration); its nanny then starts a fresh worker at
a new address. Final weights must still equal serial BP.
"""

from __future__ import annotations

import threading
import time
from functools import partial

import numpy as np
import pytest
from distributed import Client, LocalCluster
from problems import regression_problem

from dask_rpm.engine import TrainingError, WorkerLostError, fit, ordered_workers
from dask_rpm.nn.serial import fit_serial
from dask_rpm.plan.partition import Plan

RTOL = 1e-10


_problem = partial(regression_problem, seed=1)


def _assert_serial(r, x, d, m, lr, iterations=None):
    iterations = iterations if iterations is not None else r.history.sizes["iteration"]
    ref = fit_serial(x, d, hidden=m, iterations=iterations, learning_rate=lr, seed=0)
    (W, V), err = ref.params, ref.errors
    np.testing.assert_allclose(r.params[0], W, rtol=RTOL, atol=0)
    np.testing.assert_allclose(r.params[-1], V, rtol=RTOL, atol=0)
    np.testing.assert_allclose(r.history["error"].values, err, rtol=RTOL, atol=0)


@pytest.fixture
def no_buddies():
    """Buddy copies off (rpm.resilience.buddies): the tests of the checkpoint path a loss takes
    without them (tests/test_buddies.py has the same losses with them)."""
    import dask.config

    with dask.config.set({"rpm.resilience.buddies": False}):
        yield


@pytest.fixture
def cluster4():
    with LocalCluster(
        n_workers=4, threads_per_worker=1, processes=True, dashboard_address=":0"
    ) as cluster:
        with Client(cluster) as client:
            yield cluster, client


def test_lost_worker_rows_come_from_another_column(cluster4, sigkill_after):
    cluster, client = cluster4
    x, d = _problem()
    addrs = ordered_workers(client.scheduler_info())
    victim = addrs[1]
    plan = Plan.from_columns([[0, 1], [2, 3]], [20, 28], [[4, 5], [6, 3]], shape=(6, 9, 3))
    cb = sigkill_after(client, victim, at=10)
    r = fit(
        x,
        d,
        hidden=9,
        iterations=60,
        learning_rate=0.05,
        mapping=plan,
        client=client,
        interval=5,
        callback=cb,
        progress="none",
    )
    assert cb.fired == [10]
    (rec,) = [rec for rec in r.remaps if rec.get("lost")]
    assert rec["lost"] == [victim] and rec["recovered_from"] == "columns"
    assert rec["bytes"] > 0 and rec["kind"] == "whole"
    # The survivors carry on; the lost worker is never planned again.
    assert victim not in [r.plan.workers[w] for w in r.plan.planned_workers]
    assert len(r.plans) >= 2
    assert r.history.sizes["iteration"] == 60
    _assert_serial(r, x, d, 9, 0.05)


def test_single_column_recovers_from_the_last_checkpoint(cluster4, sigkill_after, no_buddies):
    cluster, client = cluster4
    x, d = _problem()
    addrs = ordered_workers(client.scheduler_info())
    plan = Plan.from_columns([[0, 1, 2]], [48], [[3, 3, 3]], shape=(6, 9, 3))
    seen = []
    killer = sigkill_after(client, addrs[2], at=25)

    def callback(info):
        seen.append(info["iteration"])
        killer(info)

    r = fit(
        x,
        d,
        hidden=9,
        iterations=50,
        learning_rate=0.05,
        mapping=plan,
        client=client,
        interval=5,
        checkpoint_every=20,
        callback=callback,
        progress="none",
    )
    (rec,) = [rec for rec in r.remaps if rec.get("lost")]
    assert rec["recovered_from"] == "checkpoint"
    assert rec["iteration"] == 20  # restarted from the checkpoint at 20 ...
    assert rec["replayed"] >= 5  # ... and computed 20..25+ again
    # Progress went past 25, back to the checkpoint at 20, and on to the end.
    assert seen[:5] == [5, 10, 15, 20, 25] and 20 in seen[5:] and seen[-1] == 50
    _assert_serial(r, x, d, 9, 0.05)


def test_raise_mode_keeps_worker_lost_error(cluster4, sigkill_after):
    cluster, client = cluster4
    x, d = _problem()
    victim = ordered_workers(client.scheduler_info())[0]
    cb = sigkill_after(client, victim, at=5)
    with pytest.raises(WorkerLostError, match=victim.replace(".", r"\.")):
        fit(
            x,
            d,
            hidden=9,
            iterations=10_000,
            learning_rate=0.05,
            mapping="uniform",
            client=client,
            interval=5,
            callback=cb,
            on_worker_loss="raise",
            progress="none",
        )


@pytest.mark.slow
def test_late_worker_is_absorbed_and_min_workers_waits():
    x, d = _problem(s=60)
    with LocalCluster(
        n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0"
    ) as cluster:
        with Client(cluster) as client:
            # min_workers=2: fit waits until a second worker is up.
            threading.Timer(1.0, cluster.scale, args=(2,)).start()
            added = []

            def callback(info):
                if not added and info["iteration"] >= 10:
                    added.append(len(info["workers"]))
                    cluster.scale(3)  # a late arrival, mid-run

            t0 = time.monotonic()
            r = fit(
                x,
                d,
                hidden=8,
                iterations=400,
                learning_rate=0.05,
                mapping="srpm",
                client=client,
                interval=5,
                min_workers=2,
                callback=callback,
                progress="none",
            )
            assert time.monotonic() - t0 > 1.0
    assert added == [2]
    assert len(r.plans[0].planned_workers) == 2
    joins = [rec for rec in r.remaps if rec.get("joined")]
    assert joins and joins[0]["kind"] == "whole" and joins[0]["lost"] == []
    assert len(r.plan.planned_workers) == 3 and len(r.plan.workers) == 3
    assert r.history.sizes == {"iteration": 400, "worker": 3}
    _assert_serial(r, x, d, 8, 0.05)


def test_min_workers_timeout_is_clear():
    import dask.config

    x, d = _problem()
    with LocalCluster(
        n_workers=1, threads_per_worker=1, processes=False, dashboard_address=":0"
    ) as cluster:
        with Client(cluster) as client, dask.config.set({"rpm.train.wait-workers": 0.5}):
            with pytest.raises(TrainingError, match="only 1 of min_workers=3"):
                fit(x, d, hidden=4, iterations=2, min_workers=3, client=client, progress="none")


def test_target_error_and_should_stop():
    x, d = _problem()
    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0"
    ) as cluster:
        with Client(cluster) as client:
            err = fit_serial(x, d, hidden=6, iterations=200, learning_rate=0.05, seed=0).errors
            # between two iterations' errors: distributed and serial errors differ in the last bits
            target = float(0.5 * (err[57] + err[58]))
            r = fit(
                x,
                d,
                hidden=6,
                iterations=200,
                learning_rate=0.05,
                mapping="uniform",
                client=client,
                interval=10,
                target_error=target,
                progress="none",
            )
            first = int(np.argmax(err <= target))
            assert r.stopped.startswith(f"target error {target:g} reached at iteration {first}")
            # the workers stop right after that iteration's update, not at the end of the block
            assert r.history.sizes["iteration"] == first + 1
            _assert_serial(r, x, d, 6, 0.05)
            calls = []

            def stop():
                calls.append(1)
                return len(calls) >= 3

            r = fit(
                x,
                d,
                hidden=6,
                iterations=200,
                learning_rate=0.05,
                mapping="uniform",
                client=client,
                interval=10,
                should_stop=stop,
                progress="none",
            )
            assert r.stopped == "stop requested after iteration 30"
            _assert_serial(r, x, d, 6, 0.05)


@pytest.mark.slow
def test_drpm_goes_on_after_a_loss_without_planning_the_lost_worker(cluster4, sigkill_after):
    cluster, client = cluster4
    x, d = _problem(s=64)
    victim = ordered_workers(client.scheduler_info())[2]
    cb = sigkill_after(client, victim, at=10)
    r = fit(
        x,
        d,
        hidden=9,
        iterations=80,
        learning_rate=0.05,
        mapping="drpm",
        client=client,
        interval=5,
        callback=cb,
        checkpoint_every=20,
        progress="none",
    )
    assert [rec["lost"] for rec in r.remaps if rec.get("lost")] == [[victim]]
    after = r.plans[[i for i, rec in enumerate(r.remaps) if rec.get("lost")][0] + 1 :]
    for plan in after:  # no later plan (DRPM's own remaps included) gives the lost worker work
        assert victim not in [plan.workers[w] for w in plan.planned_workers]
    # The restarted worker (new address) is taken in by a later whole remap.
    assert any(rec.get("joined") for rec in r.remaps)
    _assert_serial(r, x, d, 9, 0.05)


def test_worker_lost_after_the_last_block_is_recovered_too(cluster4, sigkill_after, no_buddies):
    cluster, client = cluster4
    x, d = _problem()
    addrs = ordered_workers(client.scheduler_info())
    plan = Plan.from_columns([[0, 1, 2]], [48], [[3, 3, 3]], shape=(6, 9, 3))
    cb = sigkill_after(
        client, addrs[0], at=45
    )  # fires after the final block, before the weights are gathered
    r = fit(
        x,
        d,
        hidden=9,
        iterations=45,
        learning_rate=0.05,
        mapping=plan,
        client=client,
        interval=5,
        checkpoint_every=20,
        callback=cb,
        progress="none",
    )
    assert cb.fired == [45]
    (rec,) = [rec for rec in r.remaps if rec.get("lost")]
    assert rec["recovered_from"] == "checkpoint" and rec["iteration"] == 40 and rec["replayed"] == 5
    assert r.history.sizes["iteration"] == 45
    _assert_serial(r, x, d, 9, 0.05)
