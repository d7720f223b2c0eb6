"""A worker killed at each point of a run — placing the first shards, a remap, a checkpoint — never stops
training, and the final weights still equal serial BP.

The kill is real and lands exactly where it should: a worker plugin on the victim SIGKILLs its own process
the moment a task of the given kind starts executing there.
"""

from __future__ import annotations

import contextlib
import os
import signal

import dask.config
import numpy as np
import pytest
from distributed import Client, LocalCluster
from distributed.diagnostics.plugin import WorkerPlugin

from dask_rpm.drpm.remap import column_remap
from dask_rpm.engine import fit, ordered_workers
from dask_rpm.engine.callbacks import TrainingCallback
from dask_rpm.nn.serial import fit_serial
from dask_rpm.plan.partition import Plan


class _KillOnTask(WorkerPlugin):
    """SIGKILL this worker's process when a task whose key starts with ``prefix`` starts executing."""

    name = "kill-on-task"

    def __init__(self, victims, prefix: str, from_index: int = 0) -> None:
        self.victims, self.prefix, self.from_index = set(victims), prefix, from_index

    def setup(self, worker):
        self.armed = worker.address in self.victims

    def transition(self, key, start, finish, **kwargs):
        name, index = (key[0], key[1]) if isinstance(key, tuple) else (key, 0)
        if (
            self.armed
            and finish == "executing"
            and str(name).startswith(self.prefix)
            and index >= self.from_index
        ):
            os.kill(os.getpid(), signal.SIGKILL)


class _ColumnRemapAt(TrainingCallback):
    def __init__(self, at: int) -> None:
        self.at, self.done = at, False

    def boundary(self, done):
        return self.at - done if done < self.at else None

    async def after_block(self, info):
        if info.iteration >= self.at and not self.done:
            self.done = True
            d = info.driver
            await d.remap(column_remap(d.plan, [0.2, 0.4, 0.3, 0.1]), "column")


def _problem(seed):
    rng = np.random.default_rng(seed)
    x, d = rng.normal(size=(60, 6)), rng.uniform(0.1, 0.9, size=(60, 3))
    return x, d, dict(hidden=10, iterations=40, learning_rate=0.02, seed=0)


@contextlib.contextmanager
def _cluster4():
    with (
        LocalCluster(
            n_workers=4, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        yield client


@pytest.mark.parametrize("point", ["rpm-setup", "rpm-remap", "rpm-gather"])
@pytest.mark.slow
def test_a_worker_killed_at_each_point_is_survived(point):
    x, d, kw = _problem(3)
    plan = Plan.from_columns([[0, 1], [2, 3]], [25, 35], [[5, 5], [4, 6]], shape=(6, 10, 3))
    with _cluster4() as client:
        victim = ordered_workers(client.scheduler_info())[
            1
        ]  # column 0: the one gathered for checkpoints
        client.register_plugin(_KillOnTask([victim], point))
        extra = (
            dict(mapping=plan)
            if point != "rpm-setup"
            else dict(mapping="srpm", abilities=[1, 1, 1, 1])
        )
        r = fit(
            x,
            d,
            client=client,
            interval=5,
            checkpoint_every=10 if point == "rpm-gather" else 0,
            callbacks=[_ColumnRemapAt(10)] if point == "rpm-remap" else None,
            progress="none",
            **extra,
            **kw,
        )
    lost = [rec for rec in r.remaps if rec.get("lost")]
    assert lost and lost[0]["lost"] == [victim], r.remaps
    if point == "rpm-setup":
        assert lost[0]["iteration"] == 0 and lost[0]["recovered_from"] == "initial weights"
    assert victim not in [r.plan.workers[w] for w in r.plan.planned_workers]
    assert r.history.sizes["iteration"] == 40
    ref = fit_serial(x, d, **kw)
    W, err = ref.params[0], ref.errors
    np.testing.assert_allclose(r.params[0], W, rtol=1e-10)
    np.testing.assert_allclose(r.history["error"].values, err, rtol=1e-10)


@pytest.mark.slow
def test_two_workers_lost_at_once_holding_the_same_rows_recover_from_the_checkpoint():
    """Workers 0 and 2 hold hidden rows 0..4 in both columns: with both gone those rows exist nowhere else."""
    x, d, kw = _problem(4)
    plan = Plan.from_columns([[0, 1], [2, 3]], [25, 35], [[5, 5], [5, 5]], shape=(6, 10, 3))
    with _cluster4() as client:
        addrs = ordered_workers(client.scheduler_info())
        victims = [addrs[0], addrs[2]]
        client.register_plugin(
            _KillOnTask(victims, "rpm-block", from_index=3)
        )  # the block of iterations 15..19
        # buddy copies off: they would hold the rows (tests/test_buddies.py); this is the checkpoint's path
        with dask.config.set({"rpm.resilience.buddies": False}):
            r = fit(
                x,
                d,
                client=client,
                mapping=plan,
                interval=5,
                checkpoint_every=10,
                progress="none",
                **kw,
            )
    (rec,) = [rec for rec in r.remaps if rec.get("lost")]
    assert sorted(rec["lost"]) == sorted(victims) and rec["recovered_from"] == "checkpoint"
    assert (
        rec["iteration"] == 10 and rec["replayed"] >= 5
    )  # back to the checkpoint, iterations 10..14 again
    ref = fit_serial(x, d, **kw)
    W, err = ref.params[0], ref.errors
    np.testing.assert_allclose(r.params[0], W, rtol=1e-10)
    np.testing.assert_allclose(r.history["error"].values, err, rtol=1e-10)


@pytest.mark.slow
def test_a_worker_killed_while_the_final_weights_are_gathered_is_survived():
    """The final gather loses a worker of column 0; the one gathered again after the recovery is the new plan's.

    Found by the SLURM chaos soak: the second gather, at the same iteration, used the first one's task keys,
    so Dask handed back the survivor's shard of the old plan (half of W's rows; ``fit`` returned a W of the
    wrong shape). Gather keys now carry the plan version.
    """
    x, d, kw = _problem(5)
    plan = Plan.from_columns([[0, 1], [2, 3]], [25, 35], [[5, 5], [4, 6]], shape=(6, 10, 3))
    with _cluster4() as client:
        victim = ordered_workers(client.scheduler_info())[1]  # column 0, rows 5..9
        client.register_plugin(_KillOnTask([victim], "rpm-gather"))
        r = fit(x, d, client=client, mapping=plan, interval=5, progress="none", **kw)
    lost = [rec for rec in r.remaps if rec.get("lost")]
    assert lost and lost[0]["lost"] == [victim] and lost[0]["iteration"] == 40, r.remaps
    ref = fit_serial(x, d, **kw)
    (W, V), err = ref.params, ref.errors
    assert r.params[0].shape == W.shape and r.params[-1].shape == V.shape
    np.testing.assert_allclose(r.params[0], W, rtol=1e-10)
    np.testing.assert_allclose(r.params[-1], V, rtol=1e-10)
    np.testing.assert_allclose(r.history["error"].values, err, rtol=1e-10)
