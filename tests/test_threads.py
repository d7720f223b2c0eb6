"""A worker's kernels use its cores: BLAS threads lifted to its nthreads for a block, restored after.

Real OpenBLAS (threadpoolctl reads the library's own thread count), real
multi-thread Dask workers started by a nanny (which pins BLAS to one thread).
Speed is measured in ``benchmarks/real_cores.py``, not here.
"""

from __future__ import annotations

import dask
import numpy as np
import pytest
from distributed import Client, LocalCluster
from problems import regression_problem

import dask_rpm
from dask_rpm.nn.data import DataError
from dask_rpm.nn.serial import fit_serial
from dask_rpm.plan.partition import Plan
from dask_rpm.runtime.threads import blas_threads, kernel_threads, threads_setting

RTOL = 1e-10
LR = 1e-3


def test_setting_auto_and_counts():
    assert threads_setting() == 0  # rpm.yaml: auto
    assert threads_setting("auto") == 0
    assert threads_setting(4) == 4
    assert threads_setting("3") == 3


@pytest.mark.parametrize("bad", [0, -2, 1.5, "many", True, [2], "inf", float("nan")])
def test_setting_refuses_what_is_not_a_count(bad):
    with pytest.raises(ValueError) as e:
        threads_setting(bad)
    msg = str(e.value)
    assert repr(bad) in msg and "'auto'" in msg and "whole number >= 1" in msg


def test_limits_nest_and_restore_in_this_process():
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1):  # what a nanny-started worker has
        assert blas_threads() == 1
        with kernel_threads(2) as a:
            assert a == blas_threads() == 2
            with kernel_threads(1) as b:  # a second block in the same process: the larger wins
                assert b == 2
            assert blas_threads() == 2
            with kernel_threads(3) as c:
                assert c == blas_threads() == 3
            assert blas_threads() == 2  # back to the largest still running
        assert blas_threads() == 1  # the last one out restores what was there before


def _blas_now() -> int:
    from dask_rpm.runtime.threads import blas_threads

    return blas_threads()


@pytest.fixture(scope="module")
def two_thread_worker():
    with (
        LocalCluster(
            n_workers=1, threads_per_worker=2, processes=True, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        yield client


def _plan(client, s, shape):
    (a,) = dask_rpm.ordered_workers(client.scheduler_info())
    return Plan.from_columns([[0]], [s], [[shape[1]]], shape=shape).with_workers([a])


def _sensitivity(x, d, m, iterations):
    """Relative change of the final W when W0 moves by 1e-15 relative: the problem's conditioning."""
    W0, V0 = dask_rpm.nn.kernels.init_weights(x.shape[1], m, d.shape[1], seed=0)
    W, _ = fit_serial(x, d, init=(W0, V0), iterations=iterations, learning_rate=LR).params
    Wp, _ = fit_serial(
        x, d, init=(W0 * (1 + 1e-15 * np.sign(W0)), V0), iterations=iterations, learning_rate=LR
    ).params
    return float(np.max(np.abs(Wp - W)) / np.max(np.abs(W)))


def test_a_two_thread_worker_trains_on_two_threads_and_equals_serial(two_thread_worker):
    client = two_thread_worker
    (address,) = dask_rpm.ordered_workers(client.scheduler_info())
    # the nanny started the worker with BLAS at one thread
    assert client.run(_blas_now) == {address: 1}
    x, d = regression_problem(s=64, n=7, l=3)
    m, iterations = 12, 15
    assert _sensitivity(x, d, m, iterations) < 1e-12  # well conditioned at this rate
    kw = dict(hidden=m, iterations=iterations, learning_rate=LR)
    res = dask_rpm.fit(
        x, d, mapping=_plan(client, 64, (7, m, 3)), client=client, progress="none", **kw
    )
    assert res.stats["threads"] == {address: 2}
    assert client.run(_blas_now) == {address: 1}  # restored after the block
    ref = fit_serial(x, d, **kw)
    (W, V), err = ref.params, ref.errors
    np.testing.assert_allclose(res.params[0], W, rtol=RTOL, atol=0)
    np.testing.assert_allclose(res.params[-1], V, rtol=RTOL, atol=0)
    np.testing.assert_allclose(res.history["error"].values, err, rtol=RTOL, atol=0)


def test_rpm_engine_threads_overrides_nthreads(two_thread_worker):
    client = two_thread_worker
    (address,) = dask_rpm.ordered_workers(client.scheduler_info())
    x, d = regression_problem(s=40, n=5, l=2)
    with dask.config.set({"rpm.engine.threads": 1}):
        res = dask_rpm.fit(
            x,
            d,
            hidden=6,
            iterations=3,
            learning_rate=LR,
            mapping=_plan(client, 40, (5, 6, 2)),
            client=client,
            progress="none",
        )
    assert res.stats["threads"] == {address: 1}


def test_a_bad_setting_fails_before_training(two_thread_worker):
    x, d = regression_problem(s=40, n=5, l=2)
    with dask.config.set({"rpm.engine.threads": "lots"}), pytest.raises(DataError) as e:
        dask_rpm.fit(x, d, hidden=6, iterations=3, client=two_thread_worker, progress="none")
    assert "rpm.engine.threads='lots'" in str(e.value)


def test_probing_first_keeps_the_threads(two_thread_worker):
    """The probe times the kernels in a task thread; OpenBLAS honours a thread limit only from the
    thread that set one first, so the probe sets it from the worker's event loop, and training
    afterwards still gets both threads (it got one when the probe set it from its own thread)."""
    client = two_thread_worker
    (address,) = dask_rpm.ordered_workers(client.scheduler_info())
    x, d = regression_problem(s=40, n=5, l=2)
    res = dask_rpm.fit(
        x,
        d,
        hidden=6,
        iterations=3,
        learning_rate=LR,
        mapping="srpm",
        abilities="probe",
        client=client,
        progress="none",
    )
    assert res.probe is not None
    assert res.stats["threads"] == {address: 2}
    assert client.run(_blas_now) == {address: 1}
