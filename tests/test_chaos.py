"""The chaos soak (benchmarks/chaos.py), short: real worker processes SIGKILLed and retired while training.

The injector's kinds depend on the seed only (seed 1: kill, then retire, then add); when each fault lands —
between blocks, inside one, during a remap or a checkpoint — is left to timing, and the engine must survive
any of them with the final weights equal to serial BP.
"""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import numpy as np
import pytest
from distributed import Client, LocalCluster
from distributed.diagnostics.plugin import WorkerPlugin

from dask_rpm.engine import fit, ordered_workers
from dask_rpm.partition import Plan
from dask_rpm.serial import fit_serial

from test_failure_points import _KillOnTask

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "chaos.py"


@pytest.fixture(scope="module")
def chaos():
    spec = importlib.util.spec_from_file_location("dask_rpm_bench_chaos", _PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_kinds_depend_on_the_seed_only(chaos):
    assert chaos.planned_kinds(1, 3) == ["kill", "retire", "add"]
    # never below min_workers or above max_workers, whatever the seed
    for seed in range(50):
        n = 3
        for kind in chaos.planned_kinds(seed, 20):
            n += {"kill": 0, "retire": -1, "add": 1}[kind]
            assert 2 <= n <= 5


def test_a_short_soak_survives_every_fault_and_equals_serial(chaos):
    rep = chaos.soak(seconds=30, seed=1)
    assert rep["error"] is None, rep["error"]
    assert rep["injector_errors"] == []
    kinds = [f["kind"] for f in rep["faults"]]
    assert kinds[:2] == ["kill", "retire"], kinds  # at least two faults: one every 3-8 s for 30 s
    assert rep["completed"] and rep["well_conditioned"], rep["conditioning_1e15_W0"]
    assert "UNACCOUNTED" not in rep["outcomes"], list(zip(rep["faults"], rep["outcomes"]))
    assert rep["faults_survived"] == rep["faults_injected"] == len(kinds)
    assert rep["equal_to_serial"] and rep["bytes_lost"] == 0, rep["relative_difference_vs_serial"]
    assert rep["relative_difference_vs_serial"] <= 1e-10
    # the killed worker held rows (every worker does at the start): a recovery remap names it
    assert rep["outcomes"][0].startswith("recovered from the"), rep["outcomes"]


class _SlowOnTask(WorkerPlugin):
    """Hold this worker's event loop ``seconds`` when a task whose key starts with ``prefix`` starts executing."""

    name = "slow-on-task"

    def __init__(self, spared, prefix: str, seconds: float) -> None:
        self.spared, self.prefix, self.seconds = set(spared), prefix, seconds

    def setup(self, worker):
        self.armed = worker.address not in self.spared

    def transition(self, key, start, finish, **kwargs):
        name = key[0] if isinstance(key, tuple) else key
        if self.armed and finish == "executing" and str(name).startswith(self.prefix):
            time.sleep(self.seconds)


@pytest.mark.parametrize("path", ["columns", "checkpoint"])
def test_a_recovery_slower_than_half_a_second_is_not_taken_for_a_second_loss(path):
    """Found by the soak: the driver polls for lost workers every 0.5 s while a remap or install runs, and
    took the worker the recovery was replacing (still in the old plan) for a new loss, again on every
    retry, until recovery gave up (WorkerLostError naming the same worker 9 times). Here the survivors'
    recovery tasks take 1.5 s, so the poll runs during them."""
    rng = np.random.default_rng(5)
    x, d = rng.normal(size=(60, 6)), rng.uniform(0.1, 0.9, size=(60, 3))
    kw = dict(hidden=10, iterations=30, learning_rate=0.02, seed=0)
    if path == "columns":
        plan = Plan.from_columns([[0, 1], [2, 3]], [25, 35], [[5, 5], [4, 6]], shape=(6, 10, 3))
        prefix, every = "rpm-remap", 0
    else:
        plan = Plan.from_columns([[0, 1, 2, 3]], [60], [[2, 3, 2, 3]], shape=(6, 10, 3))
        prefix, every = "rpm-setup", 10
    with LocalCluster(n_workers=4, threads_per_worker=1, processes=True, dashboard_address=":0") as cluster, \
            Client(cluster) as client:
        victim = ordered_workers(client.scheduler_info())[1]
        client.register_plugin(_KillOnTask([victim], "rpm-block", from_index=3))  # the block of iterations 15..19
        client.register_plugin(_SlowOnTask([victim], prefix, 1.5))
        r = fit(x, d, client=client, mapping=plan, interval=5, checkpoint_every=every, progress="none", **kw)
    (rec,) = [rec for rec in r.remaps if rec.get("lost")]
    assert rec["lost"] == [victim] and rec["recovered_from"] == path
    W, V, err = fit_serial(x, d, **kw)
    np.testing.assert_allclose(r.W, W, rtol=1e-10)
    np.testing.assert_allclose(r.history["error"].values, err, rtol=1e-10)
