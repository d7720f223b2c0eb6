"""Workers whose Dask lifetime ends are retired at a block boundary: rows first, nothing recomputed."""

from __future__ import annotations

import time

import dask
import numpy as np
from distributed import Client, LocalCluster, Worker

from dask_rpm.engine import fit
from dask_rpm.engine.retirement import due, iterations_before
from dask_rpm.nn.serial import fit_serial


def test_due_and_boundary_decisions():
    deadlines = {"a": 100.0, "b": None, "c": 130.0}
    assert due(deadlines, ["a", "b", "c"], now=80.0, margin=15.0, block_seconds=10.0) == ["a"]
    assert due(deadlines, ["b", "c"], now=80.0, margin=15.0, block_seconds=10.0) == []
    assert (
        due(deadlines, ["a"], now=80.0, margin=15.0, block_seconds=float("nan")) == []
    )  # no timing yet: margin only
    assert due(deadlines, ["a"], now=86.0, margin=15.0, block_seconds=float("nan")) == ["a"]
    assert (
        iterations_before(deadlines, ["a", "c"], now=80.0, margin=10.0, seconds_per_iteration=0.5)
        == 20
    )
    assert (
        iterations_before(deadlines, ["a"], now=95.0, margin=10.0, seconds_per_iteration=0.5) == 1
    )
    assert (
        iterations_before(deadlines, ["b"], now=80.0, margin=10.0, seconds_per_iteration=0.5)
        is None
    )
    assert (
        iterations_before(
            deadlines, ["a"], now=80.0, margin=10.0, seconds_per_iteration=float("nan")
        )
        is None
    )


def test_a_worker_at_the_end_of_its_lifetime_hands_over_its_rows_first():
    rng = np.random.default_rng(0)
    s, n, m, l = 1500, 16, 48, 4
    x, d = rng.normal(size=(s, n)), rng.uniform(0.1, 0.9, size=(s, l))
    kw = dict(hidden=m, iterations=5000, learning_rate=1e-5, seed=0)
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
        dask.config.set({"rpm.train.retire-margin": 1.5}),
    ):

        async def mortal() -> Worker:
            return await Worker(cluster.scheduler_address, nthreads=1, lifetime="4s", name="mortal")

        w = client.sync(mortal)
        t0 = time.monotonic()
        try:
            r = fit(
                x,
                d,
                mapping="srpm",
                abilities=[1.0, 1.0, 1.0],
                interval=50,
                client=client,
                progress="none",
                **kw,
            )
        finally:
            client.sync(w.close)
    assert time.monotonic() - t0 > 4.0, "the run must outlast the lifetime to test the retirement"
    (rec,) = [rec for rec in r.remaps if rec.get("retired")]
    assert rec["retired"] == [w.address] and rec["replayed"] == 0 and rec["recovered_from"] is None
    assert "retiring (Dask lifetime ends in" in rec["reason"]
    assert not [rec for rec in r.remaps if rec.get("lost")]  # nothing was lost, nothing recomputed
    assert w.address not in [r.plan.workers[i] for i in r.plan.planned_workers]
    assert r.history.sizes["iteration"] == 5000  # every iteration once
    ref = fit_serial(x, d, **kw)
    W, err = ref.params[0], ref.errors
    assert (
        np.abs(r.params[0] - W).max() <= 1e-10 * np.abs(W).max()
    )  # 5000 iterations: on the scale of the weights
    np.testing.assert_allclose(r.history["error"].values, err, rtol=1e-10)
