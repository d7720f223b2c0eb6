"""The one timing log (dask_rpm.engine.timing) and the block loop's clock readings."""

from __future__ import annotations

import asyncio
import math
import time
import types

import numpy as np
import pytest

from dask_rpm.engine import block as block_mod
from dask_rpm.engine.layout import layouts
from dask_rpm.engine.records import BlockSpec, TimingRecord
from dask_rpm.engine.timing import TimingLog
from dask_rpm.nn.kernels import Workspace, init_weights
from dask_rpm.nn.serial import fit_serial
from dask_rpm.plan.partition import Plan


def _rec(it, w, start, f=0.01, v=0.002, b=0.02, h=0.003, mod=0.001):
    t = [start]
    for dt in (f, v, b, h, mod):
        t.append(t[-1] + dt)
    return TimingRecord(it, w, *t)


def test_phases_and_iteration_time_from_worker_clocks():
    log = TimingLog()
    # worker 1's clock is 1000 s off worker 0's: only differences on one clock are used
    log.add([_rec(0, 0, 0.0), _rec(0, 1, 1000.0, b=0.05)])
    log.add([_rec(1, 0, 0.036), tuple(_rec(1, 1, 1000.066, b=0.05))])  # a msgpack'd row works too
    log.add_errors({0: 5.0, "1": 4.0})
    assert log.iterations() == [0, 1] and log.error(1) == 4.0
    ph = log.phase_table([0, 1], 2)
    np.testing.assert_allclose(ph["backward"][:, 1], [0.05, 0.05])
    np.testing.assert_allclose(ph["vertical_wait"][:, 0], [0.002, 0.002])
    # iteration 0: from each worker's forward start; then from its previous update's end
    assert log.iteration_time(0) == pytest.approx(0.066)  # the slower worker
    assert log.iteration_time(1) == pytest.approx(0.066)
    obs = log.observations(0, 2, [0, 1], lambda w: 100 * (w + 1))
    assert [o.work for o in obs] == [100, 200, 100, 200]
    assert obs[1].t1 == pytest.approx(0.01 + 0.002 + 0.05) and obs[1].tc == pytest.approx(0.06)
    assert log.rows()[1] == {"iteration": 1, "error": 4.0, "time": pytest.approx(0.066)}


def test_bounded_log_and_forget():
    log = TimingLog(max_records=4)
    for it in range(5):
        log.add([_rec(it, 0, it * 1.0), _rec(it, 1, it * 1.0)])
        log.add_errors({it: float(it)})
    assert len(log) == 4 and log.get(2, 0) is None and log.iterations() == [3, 4]
    log.forget_from(4)
    assert log.iterations() == [3] and log.get(4, 1) is None and len(log) == 2
    assert math.isnan(log.iteration_time(4))


class _OneWorkerState:
    """The parts of RunState the block loop uses, for one worker without peers (a real mailbox
    that must send nothing)."""

    def __init__(self, x, d, W, V, plan):
        from dask_rpm.engine.layout import layout_layers
        from dask_rpm.engine.worker import Shard

        (self.layout,) = layouts(plan, ["local"], run="t", version=1).values()
        self.run = "t"
        self.worker = types.SimpleNamespace()  # a worker without hooks: nothing paced
        from dask_rpm.engine.samples import ColumnData, SampleSource
        from dask_rpm.nn.options import TrainingOptions
        from dask_rpm.nn.recipe import recipe

        self.shard = Shard(layout_layers(self.layout), 0, [W, V])
        self.recipe = recipe(x.shape[0], TrainingOptions(iterations=4, learning_rate=0.05))
        self.data = ColumnData(
            SampleSource("slice", x, d),
            (0, x.shape[0]),
            self.recipe.schedule,
            self.recipe.net,
            "float64",
        )
        self.iteration = 0
        self.copies = None  # no buddy copies: one worker has no buddy
        self.ws = Workspace(x.shape[0], W.shape[0], x.shape[1], d.shape[1])
        from dask_rpm.comm.mailbox import Mailbox

        async def no_peers(address, msg):
            raise AssertionError(f"a worker without peers sent {msg['phase']} to {address}")

        self.mailbox = Mailbox("t", self.layout.worker, "local", no_peers)

    def kernels(self):
        return self.ws

    async def compute(self, inline, fn, *args):
        return fn(*args)


def test_block_loop_times_known_sleeps(monkeypatch):
    """Each forward and backward takes a known sleep longer: the records and the log show it."""
    rng = np.random.default_rng(0)
    x, d = rng.normal(size=(20, 4)), rng.uniform(0.1, 0.9, size=(20, 2))
    W0, V0 = init_weights(4, 5, 2)
    plan = Plan.from_columns([[0]], [20], [[5]], shape=(4, 5, 2))
    state = _OneWorkerState(x, d, W0, V0, plan)
    sleep_f, sleep_b = 0.2, 0.3
    slack = 0.1  # a sleep ends at or after its time; on a loaded 2-core host a little later
    forward, backward = Workspace.forward, Workspace.backward

    def slow_forward(self, *a):
        time.sleep(sleep_f)
        return forward(self, *a)

    def slow_backward(self, *a):
        time.sleep(sleep_b)
        return backward(self, *a)

    monkeypatch.setattr(Workspace, "forward", slow_forward)
    monkeypatch.setattr(Workspace, "backward", slow_backward)
    spec = BlockSpec(
        epoch=0,
        first=0,
        count=4,
        learning_rate=0.05,
        target_error=None,
        receive_timeout=5.0,
        report_seconds=60.0,
    )
    streamed = []
    res = asyncio.run(block_mod.run_block(state, spec, log=streamed.append))
    assert res.status == "ok" and res.stop == 4 and len(res.records) == 4
    log = TimingLog()
    log.add(res.records)
    log.add_errors(res.errors)
    ph = log.phase_table(range(4), 1)
    # a sleep lasts at least as long as asked, and not much longer on an idle worker
    assert np.all(ph["forward"] >= sleep_f) and np.all(ph["forward"] < sleep_f + slack)
    assert np.all(ph["backward"] >= sleep_b) and np.all(ph["backward"] < sleep_b + slack)
    assert np.all(ph["vertical_wait"] < slack) and np.all(
        ph["horizontal"] < slack
    )  # no peers: nothing to wait for
    its = log.iteration_times(range(4))
    assert np.all(its >= sleep_f + sleep_b) and np.all(its < sleep_f + sleep_b + slack)
    # the records were streamed once, at the end of the block (report_seconds is long)
    assert len(streamed) == 1 and len(streamed[0]["records"]) == 4
    # and the arithmetic is serial BP's
    ref = fit_serial(x, d, iterations=4, learning_rate=0.05, init=(W0, V0))
    W, err = ref.params[0], ref.errors
    np.testing.assert_allclose(state.shard.params[0], W, rtol=1e-12)
    np.testing.assert_allclose([log.error(i) for i in range(4)], err, rtol=1e-12)
