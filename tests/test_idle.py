"""Idle workers (issue 25, extreme ratios): a worker whose messages cost more than its share of the
work saves holds no rows; DRPM takes it back when a remap says it pays.

Planner and DRPM tests are pure and fast (predicted seconds only); one engine test trains on an
EMULATED 1 : 100 mix and checks exactness through a remap that brings an idle worker back
(with ``rpm.drpm.idle`` on: the suite runs with it off, tests/conftest.py).
"""

from __future__ import annotations

import dask.config
import numpy as np
import pytest

from dask_rpm.comm import Interconnect
from dask_rpm.cost import predict_iteration_seconds
from dask_rpm.drpm.idle import (
    batch_plan,
    comm_excess,
    comm_scale,
    idle_decision,
    idle_remap,
    scaled_network,
    worker_rates,
)
from dask_rpm.plan.partition import PlanError, RealPartition
from dask_rpm.planners import PlannerResult, make_plan
from dask_rpm.planners.idle import SUBSET_SIZES, fastest_subset

RATE = 2.6e7  # work units per second of the fast worker (rpm.planner.rate's order)
SMALL = ((33, 64, 4), 512)  # messages cost more than 3 % of the work
LARGE = ((33, 256, 8), 262144)  # compute dominates


def _rates(speeds):
    return [RATE * v for v in speeds]


def _alone(speeds, shape, samples, network=None):
    """Predicted seconds of the fastest worker alone."""
    fast = int(np.argmax(speeds))
    plan = make_plan([1.0], shape, samples, "srpm")
    return predict_iteration_seconds(plan, [_rates(speeds)[fast]], network=network)


# ------------------------------------------------------------------------------ planners
@pytest.mark.parametrize("method", ["srpm", "srpm-time"])
def test_a_1_to_100_mix_leaves_the_slow_workers_idle_on_a_small_problem(method):
    speeds = [1.0, 0.01, 0.01, 0.01]
    shape, samples = SMALL
    plan = make_plan(speeds, shape, samples, method, rates=_rates(speeds), idle=True)
    assert plan.planned_workers == (0,) and plan.excluded == (1, 2, 3)
    note = next(n for n in plan.notes if n.startswith("left "))
    assert "left P2, P3, P4 idle" in note and "predicted faster" in note
    t = predict_iteration_seconds(plan, _rates(speeds))
    assert t == pytest.approx(_alone(speeds, shape, samples))


@pytest.mark.parametrize("method", ["srpm", "srpm-time"])
def test_a_1_to_2_mix_keeps_every_worker(method):
    speeds = [1.0, 0.5, 0.5, 0.5]
    shape, samples = SMALL
    plan = make_plan(speeds, shape, samples, method, rates=_rates(speeds), idle=True)
    assert plan.planned_workers and set(plan.planned_workers) == {0, 1, 2, 3}
    assert not plan.excluded and not any("idle" in n for n in plan.notes)


def test_srpm_leaves_nobody_idle_unless_asked_or_without_rates():
    """The paper's SRPM stays area-proportional; DRPM asks (idle=True) and gives measured rates."""
    speeds = [1.0, 0.01, 0.01, 0.01]
    shape, samples = SMALL
    assert len(make_plan(speeds, shape, samples, "srpm", rates=_rates(speeds)).planned_workers) == 4
    assert len(make_plan(speeds, shape, samples, "srpm", idle=True).planned_workers) == 4
    forced = make_plan(speeds, shape, samples, "srpm", rates=_rates(speeds), idle=True, dp=2)
    assert len(forced.planned_workers) == 4  # forced columns never drop workers


def test_they_come_back_where_their_share_pays():
    """A GPU and 15 one-thread CPUs (1 : 100): idle on a small problem, planned on a large one."""
    speeds = [1.0] + [0.01] * 15
    kw = dict(rates=_rates(speeds), idle=True)
    small = make_plan(speeds, *SMALL, "srpm", **kw)
    large = make_plan(speeds, *LARGE, "srpm", **kw)
    assert small.planned_workers == (0,)
    assert len(large.planned_workers) == 16 and not large.excluded
    assert predict_iteration_seconds(large, kw["rates"]) < 0.9 * _alone(speeds, *LARGE)


@pytest.mark.parametrize("seed", range(12))
def test_the_chosen_plan_is_never_predicted_slower_than_the_fastest_alone(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 20))
    speeds = list(10 ** rng.uniform(-2.5, 0, n))
    m = int(rng.choice([16, 64, 256]))
    s = int(rng.choice([256, 4096, 65536]))
    shape = (33, m, 8)
    net = Interconnect(latency=10 ** rng.uniform(-5, -3), bandwidth=1e9, overhead=1e-5)
    for method in ("srpm", "srpm-time"):
        plan = make_plan(speeds, shape, s, method, rates=_rates(speeds), network=net, idle=True)
        t = predict_iteration_seconds(plan, _rates(speeds), network=net)
        assert t <= _alone(speeds, shape, s, net) * (1 + 1e-9), (method, plan.planned_workers)


def test_more_workers_must_pay_by_min_gain():
    """More workers predicted only a little faster stay idle; without the margin they are planned."""
    speeds = [1.0, 0.01, 0.01, 0.01]
    shape, samples = (33, 256, 8), 8192  # every worker predicted about 2 % faster than one
    kw = dict(rates=_rates(speeds), idle=True)
    every = make_plan(speeds, shape, samples, "srpm", min_gain=0.0, **kw)
    margin = make_plan(speeds, shape, samples, "srpm", min_gain=0.05, **kw)
    assert len(every.planned_workers) == 4 and margin.planned_workers == (0,)
    note = next(n for n in margin.notes if n.startswith("left "))
    assert "faster" in note and "less than the 5% more workers must gain" in note
    with pytest.raises(PlanError, match="min_gain"):
        make_plan(speeds, shape, samples, "srpm", min_gain=1.5, **kw)
    assert len(make_plan(speeds, shape, samples, "srpm", **kw).planned_workers) == 4  # default 0
    rates = kw["rates"]
    with dask.config.set({"rpm.drpm.min-gain": 0.05}):  # DRPM's margin
        assert idle_remap(margin, rates, rates).planned_workers == (0,)
    assert len(idle_remap(margin, rates, rates, min_gain=0.0).planned_workers) == 4


def test_a_mini_batch_decides_who_is_idle():
    """An iteration exchanges one batch: workers that pay on the set may not pay on a batch."""
    speeds = [1.0] + [0.01] * 15
    kw = dict(rates=_rates(speeds), idle=True)
    shape, samples = LARGE
    full = make_plan(speeds, shape, samples, "srpm", **kw)
    batched = make_plan(speeds, shape, samples, "srpm", batch=512, **kw)
    assert len(full.planned_workers) == 16
    assert batched.planned_workers == (0,) and batched.samples == samples
    assert any("one mini-batch of 512 samples" in n for n in batched.notes)


def test_fastest_subset_tries_the_fastest_few_and_keeps_the_fewest():
    calls = []

    def plan_on(active):
        calls.append(list(active))
        k = len(active)
        part = RealPartition((tuple(range(k)),), (1.0,), ((1.0 / k,) * k,))
        return PlannerResult(part, 0.0, meta={"predicted_seconds": k**-0.5})

    speed = np.array([0.1, 5.0, 0.2, 3.0, 1.0])
    res = fastest_subset(plan_on, [0, 1, 2, 3, 4], speed, min_gain=0.45)
    assert calls[0] == [0, 1, 2, 3, 4]  # every worker first
    assert calls[1:] == [[1], [1, 3], [1, 3, 4], [1, 2, 3, 4]]  # the fastest k (SUBSET_SIZES)
    assert SUBSET_SIZES[:4] == (1, 2, 3, 4)
    # 1/sqrt(k): 2 workers 29 % faster than 1 (< 45 %), 3: 42 %, 4: 50 % -> kept, 5: 11 % more
    assert {w for col in res.partition.columns for w in col} == {1, 2, 3, 4}
    assert res.meta["predicted_seconds_all"] == pytest.approx(5**-0.5)
    assert res.meta["predicted_seconds"] == pytest.approx(0.5)


def test_drpms_first_plan_from_the_probe_leaves_them_idle():
    """fit(abilities="probe") with mapping drpm: resolve_plan(idle=True) with the probe's rates."""
    from dask_rpm.engine.planning import resolve_plan

    speeds = [1.0, 0.01, 0.01, 0.01]
    addresses = ["tcp://a:1", "tcp://b:1", "tcp://c:1", "tcp://d:1"]
    kw = dict(addresses=addresses, shape=SMALL[0], samples=SMALL[1], rates=_rates(speeds))
    first = resolve_plan("srpm", speeds, idle=True, **kw)
    assert first.planned_workers == (0,) and first.workers == tuple(addresses)
    assert len(resolve_plan("srpm", speeds, **kw).planned_workers) == 4  # mapping="srpm"


# ---------------------------------------------------------------------------------- DRPM
def _idle_plan():
    speeds = [1.0, 0.01, 0.01, 0.01]
    plan = make_plan(speeds, *SMALL, "srpm", rates=_rates(speeds), idle=True)
    return plan.with_workers(["a", "b", "c", "d"])


def test_worker_rates_measured_then_remembered_then_scaled():
    plan = _idle_plan()  # only worker 0 planned
    ab, r = worker_rates(plan, {0: 2e7, 1: 3e5}, {0: 4e7, 1: 6e5}, remembered={1: 9e9, 2: 2e5})
    assert r[0] == 2e7 and r[1] == 3e5  # measured (a window from when it was planned) wins
    assert r[2] == 2e5  # the probe's
    assert r[3] == pytest.approx(plan.abilities[3] / plan.abilities[0] * 2e7)  # plan share
    assert ab[0] == 4e7 and ab[1] == 6e5
    assert ab[2] == pytest.approx(2e5 * 2.0)  # rate x the measured ability per rate
    with pytest.raises(PlanError, match="no measured rate for planned worker"):
        worker_rates(plan, {1: 3e5}, {0: 4e7})


def test_idle_remap_leaves_the_slow_ones_idle_and_keeps_addresses():
    plan = make_plan([1.0] * 4, *SMALL, "srpm").with_workers(["a", "b", "c", "d"])
    rates = _rates([1.0, 0.01, 0.01, 0.01])
    new = idle_remap(plan, rates, rates)
    assert new.planned_workers == (0,) and new.excluded == (1, 2, 3)
    assert new.workers == plan.workers and "whole remap" in new.notes
    assert any(n.startswith("left P2, P3, P4 idle") for n in new.notes)


def test_idle_check_brings_them_back_when_the_fast_one_slows():
    plan = _idle_plan()
    same = _rates([1.0, 0.01, 0.01, 0.01])
    keep = idle_decision(plan, same, same, remaining=100)
    assert keep.kind is None and "stay as they are" in keep.reason
    slowed = _rates([0.005, 0.01, 0.01, 0.01])  # the fast worker now has other load
    back = idle_decision(plan, slowed, slowed, remaining=100)
    assert back.kind == "whole" and back.plan is not None
    assert set(back.plan.planned_workers) == {0, 1, 2, 3}
    assert "P2, P3, P4 back" in back.reason and back.saving > back.cost > 0
    late = idle_decision(plan, slowed, slowed, remaining=0)  # nothing left to save
    assert late.kind is None and "keep (idle check" in late.reason


def test_idle_check_leaves_workers_idle_that_stopped_paying():
    speeds = [1.0, 0.01, 0.01, 0.01]
    plan = make_plan(speeds, *SMALL, "srpm").with_workers(["a", "b", "c", "d"])  # all planned
    d = idle_decision(plan, _rates(speeds), _rates(speeds), remaining=50)
    assert d.kind == "whole" and d.plan.planned_workers == (0,)
    assert "P2, P3, P4 idle" in d.reason
    with dask.config.set({"rpm.drpm.min-gain": 0.9}):  # not enough faster
        assert idle_decision(plan, _rates(speeds), _rates(speeds), remaining=50).kind is None


def test_communication_is_priced_as_the_run_measured_it():
    """comm_excess: (predicted, measured) communication of a plan; comm_scale: their slope."""
    speeds = [1.0, 0.5, 0.5, 0.5]
    rates = _rates(speeds)
    plan = make_plan(speeds, *SMALL, "srpm").with_workers(["a", "b", "c", "d"])
    b_total = predict_iteration_seconds(plan, rates)
    p, m = comm_excess(plan, rates, b_total)
    assert p > 0 and m == pytest.approx(p)  # measured as predicted: scale 1
    assert comm_excess(plan, rates, b_total + 3 * p)[1] == pytest.approx(4 * p)
    alone = make_plan([1.0], *SMALL, "srpm")
    assert comm_excess(alone, rates[:1], 0.01) is None  # one worker: nothing to compare
    assert comm_excess(plan, rates, float("nan")) is None
    assert comm_scale([]) == 1.0 and comm_scale([(1.0, 2.0), (2.0, 4.0)]) == pytest.approx(2.0)
    assert comm_scale([(1.0, 1.0), (1.0, 3.0)]) == pytest.approx(2.0)  # one slope over both
    net = scaled_network(None, 10.0)
    assert comm_excess(plan, rates, b_total, network=net)[0] == pytest.approx(10 * p, rel=0.05)
    assert scaled_network(None, 1.0) is None
    # messages 30x dearer than rpm.cost says: the 1 : 2 mix no longer pays on this small job
    keep = idle_decision(plan, rates, rates, remaining=100)
    dear = idle_decision(plan, rates, rates, remaining=100, comm_scale=30.0)
    assert keep.kind is None and dear.kind == "whole" and dear.plan.planned_workers == (0,)
    assert "communication x30 as measured" in dear.reason


def test_batch_plan_cuts_one_mini_batch():
    plan = make_plan([1.0, 2.0, 1.0], (8, 12, 2), 1000, "srpm")
    one = batch_plan(plan, 100)
    assert one.samples == 100 and one.columns == plan.columns
    for w in plan.planned_workers:
        assert one.rectangle(w).hidden == plan.rectangle(w).hidden
    assert batch_plan(plan, None) is plan and batch_plan(plan, 5000) is plan


# -------------------------------------------------------------------------------- engine
def test_drpm_leaves_the_slow_workers_idle_and_takes_one_back_exactly():
    """EMULATED 1 : 100 mix (no timing asserted): DRPM starts uniform; its first whole remap
    leaves the three slow workers idle (still in the cluster, no rows); the fast one then slows
    1000x (other load), and the idle check hands the rows to a slow one, idle until then. The
    weights equal fit_serial's throughout (float64, 1e-10)."""
    from distributed import Client

    import dask_rpm
    from dask_rpm.demo.train import demo_data
    from dask_rpm.engine import fit
    from dask_rpm.nn.serial import fit_serial

    x, d = demo_data(256, (17, 32, 4))
    kw = dict(hidden=32, iterations=40, learning_rate=1e-3)
    schedule = {0: [(22, 0.001)]}  # worker 0 gets other load from iteration 22 on
    with (
        dask_rpm.local_cluster((1.0, 0.01, 0.01, 0.01), processes=False, schedule=schedule) as c,
        Client(c) as client,
        dask.config.set({"rpm.drpm.idle": True}),  # the default (off in the suite: conftest.py)
    ):
        r = fit(x, d, mapping="drpm", interval=10, client=client, progress="none", **kw)
    assert [p.planned_workers for p in r.plans[:2]] == [(0, 1, 2, 3), (0,)]
    idle = r.plans[1]
    assert idle.excluded == (1, 2, 3) and len(idle.workers) == 4  # in the cluster, no rows
    assert any(n.startswith("left P2, P3, P4 idle: the plan without them") for n in idle.notes)
    back = [rec for rec in r.remaps if "back" in rec.get("reason", "")]
    assert back and back[0]["kind"] == "whole" and back[0]["iteration"] == 30, r.remaps
    assert "P1 idle" in back[0]["reason"]
    now = r.plans[2]
    assert len(now.planned_workers) == 1 and now.planned_workers[0] in idle.excluded
    assert 0 in now.excluded and any("idle" in n for n in now.notes)
    ability = r.history["ability"].sel(check=r.history["check_iteration"] == 20).values[0]
    assert np.isfinite(ability[0]) and np.isnan(ability[1:]).all()  # the idle are not measured
    ref = fit_serial(x, d, **kw)
    (W, V), err = ref.params, ref.errors
    np.testing.assert_allclose(r.params[0], W, rtol=1e-10, atol=0)
    np.testing.assert_allclose(r.params[-1], V, rtol=1e-10, atol=0)
    np.testing.assert_allclose(r.history["error"].values, err, rtol=1e-10, atol=0)
