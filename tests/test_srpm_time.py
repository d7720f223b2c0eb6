"""srpm-time: SRPM's columns, cuts and snapping chosen by predicted seconds."""

from __future__ import annotations

import itertools

import dask.config
import numpy as np
import pytest
from problems import regression_problem

from dask_rpm.comm import EngineRule, Interconnect, LinkClass
from dask_rpm.cost import predict_iteration_seconds
from dask_rpm.plan.partition import PlanError
from dask_rpm.planners import PLANNERS, fastest_grid, make_plan
from dask_rpm.planners.srpm_time import _RangeMax, _RunCost, time_table, vertical_seconds

SHAPE = (203, 1024, 26)
A = [0.25, 0.3125, 0.5, 1.0, 1.0, 0.4167, 0.6667, 0.5]


def _net() -> Interconnect:
    return Interconnect(latency=9e-4, bandwidth=1.3e9, overhead=1e-5)


def test_registered_and_srpm_keeps_the_paper_example():
    assert "srpm-time" in PLANNERS and "srpm" in PLANNERS
    paper = make_plan([0.05, 0.10, 0.20, 0.30, 0.35], "203-80-26", 1024, "srpm")
    assert paper.columns == ((0, 1, 2), (3, 4)) and paper.t_comm == pytest.approx(73913.6)
    timed = make_plan([0.05, 0.10, 0.20, 0.30, 0.35], "203-80-26", 1024, "srpm-time")
    assert timed.method == "srpm-time"
    assert "predicted" in timed.notes[0]


@pytest.mark.parametrize("mode", [("engine", "engine"), ("best", "best")])
@pytest.mark.parametrize("n", [8, 16, 64])
def test_never_predicted_slower_than_srpm_split_1d_or_any_uniform_grid(mode, n):
    vertical, horizontal = mode
    speeds = np.resize(A, n)
    rates = list(speeds * 1.25e7)
    s = 4096 * n
    net = _net()
    kw = dict(network=net, vertical=vertical, horizontal=horizontal)
    with dask.config.set({"rpm.cost.vertical": vertical, "rpm.cost.horizontal": horizontal}):
        timed = make_plan(speeds, SHAPE, s, "srpm-time", rates=rates, network=net)
    t = predict_iteration_seconds(timed, rates, **kw)
    assert t == pytest.approx(
        timed.notes and float(timed.notes[0].split("predicted ")[1].split(" ")[0]), rel=1e-5
    )
    others = [
        predict_iteration_seconds(make_plan(speeds, SHAPE, s, m), rates, **kw)
        for m in ("srpm", "split-1d")
    ]
    for dp in [d for d in range(1, n + 1) if n % d == 0]:
        others.append(
            predict_iteration_seconds(
                make_plan(np.ones(n), SHAPE, s, "uniform", dp=dp), rates, **kw
            )
        )
    assert t <= min(others) * (1 + 1e-9)


def test_time_dp_matches_brute_force_over_sorted_runs():
    rng = np.random.default_rng(3)
    for trial in range(6):
        n = int(rng.integers(2, 8))
        p = np.sort(rng.uniform(0.1, 1.0, n))
        p = p / p.sum()
        r = p * rng.uniform(0.5, 2.0, n) * 1e6  # rates not proportional: the range-max path
        net = Interconnect(latency=1e-3, bandwidth=1e7, overhead=1e-4)
        mode = ["best", "engine", "tree"][trial % 3]
        w = _RunCost(p, r, None, (20, 64, 4), 2000, net, mode, 64, EngineRule.from_config())
        tv, _ = time_table(w, n, n)
        for c in range(1, n + 1):
            best = np.inf
            for cuts in itertools.combinations(range(1, n), c - 1):
                edges = [0, *cuts, n]
                best = min(
                    best,
                    max(
                        float(w(np.array([a]), np.array([b]))[0])
                        for a, b in zip(edges[:-1], edges[1:])
                    ),
                )
            assert tv[c - 1] == pytest.approx(best, rel=1e-12)


def test_range_max():
    v = np.random.default_rng(0).normal(size=37)
    rm = _RangeMax(v)
    i, j = np.array([0, 3, 5, 36, 0]), np.array([1, 9, 37, 37, 37])
    assert np.array_equal(rm(i, j), np.array([v[a:b].max() for a, b in zip(i, j)]))


def test_vertical_seconds_is_monotone_in_members_and_bytes():
    k = np.arange(1, 40)
    for mode in ("best", "tree", "halving", "ring", "direct", "auto:4"):
        t = vertical_seconds(
            mode, k, np.full(len(k), 1e6), np.full(len(k), 1e-4), np.full(len(k), 1e9), 1e-5
        )
        assert t[0] == 0 and np.all(np.diff(t) >= -1e-15), mode


def test_link_aware_columns_stay_inside_fast_links():
    # 8 equal workers on 2 groups of 4, listed interleaved; crossing groups is slow
    n = 8
    groups = tuple("ab"[i % 2] for i in range(n))
    classes = {
        "host": LinkClass(1e-5, 1e10),
        "group": LinkClass(1e-5, 1e10),
        "across": LinkClass(5e-3, 1e8),
    }
    aware = Interconnect(
        latency=1e-5, bandwidth=1e10, overhead=1e-6, classes=classes, groups=groups
    )
    blind = aware._replace(classes=None)
    rates = [2e7] * n
    shape, s = (203, 64, 26), 65536  # big partials: the in-column exchange runs over the links
    with dask.config.set({"rpm.cost.vertical": "best", "rpm.cost.horizontal": "best"}):
        p_aware = make_plan([1.0] * n, shape, s, "srpm-time", rates=rates, network=aware)
        p_blind = make_plan([1.0] * n, shape, s, "srpm-time", rates=rates, network=blind)
        t_aware = predict_iteration_seconds(p_aware, rates, network=aware)
        t_blind = predict_iteration_seconds(
            p_blind, rates, network=aware
        )  # the blind plan on the real links
    assert t_aware < t_blind
    for col in p_aware.columns:  # every multi-worker column is inside one group
        assert len({groups[w] for w in col}) == 1


def test_forced_columns_and_bad_rates():
    plan = make_plan(A, SHAPE, 4096 * 8, "srpm-time", dp=3, rates=list(np.array(A) * 1e7))
    assert plan.n_columns == 3
    with pytest.raises(PlanError, match="3 rates given for 8 abilities"):
        make_plan(A, SHAPE, 4096, "srpm-time", rates=[1.0, 2.0, 3.0])
    with pytest.raises(PlanError, match="rates must be 8 positive finite"):
        make_plan(A, SHAPE, 4096, "srpm-time", rates=[1.0] * 7 + [-1.0])
    with pytest.raises(PlanError, match="dp=9 columns"):
        make_plan(A, SHAPE, 4096, "srpm-time", dp=9)


def test_without_rates_uses_the_configured_average_rate():
    with dask.config.set({"rpm.planner.rate": 1e12}):  # compute is free: no messages wins
        fast = make_plan(A, SHAPE, 4096, "srpm-time")
    with dask.config.set({"rpm.planner.rate": 1e3}):  # compute dominates: balance wins
        slow = make_plan(A, SHAPE, 4096, "srpm-time")
    # the fastest worker alone (the first of the two with ability 1.0), every other one idle
    assert fast.planned_workers == (3,) and len(fast.excluded) == len(A) - 1
    assert len(slow.planned_workers) == len(A) and slow.imbalance() < 1.01


def test_fastest_grid_still_works_with_the_engine_model():
    plan, t = fastest_grid([1.0] * 6, (20, 12, 3), 60, "uniform", [1e3] * 6)
    assert plan.n_columns in (1, 2, 3, 6) and t > 0


def test_link_aware_plan_trains_exactly_like_serial():
    """The engine runs a link-aware srpm-time plan and still equals fit_serial (float64, 1e-10)."""
    from distributed import Client, LocalCluster

    from dask_rpm.engine import fit
    from dask_rpm.nn.serial import fit_serial

    rng = np.random.default_rng(5)
    s, n, m, l = 60, 40, 24, 2
    x = rng.normal(size=(s, n))
    x[:, -1] = 1.0
    d = rng.uniform(0.1, 0.9, size=(s, l))
    groups = ("a", "b", "a", "b", "a", "b")
    classes = {
        "host": LinkClass(1e-5, 1e10),
        "group": LinkClass(1e-5, 1e10),
        "across": LinkClass(5e-3, 1e7),
    }
    net = Interconnect(latency=1e-5, bandwidth=1e10, overhead=1e-6, classes=classes, groups=groups)
    rates = [1e3, 1e3, 1e3, 1e3, 2e3, 2e3]  # compute-bound: every worker is worth its messages
    with dask.config.set({"rpm.cost.vertical": "best", "rpm.cost.horizontal": "best"}):
        plan = make_plan([1, 1, 1, 1, 2, 2], (n, m, l), s, "srpm-time", rates=rates, network=net)
        blind = make_plan(
            [1, 1, 1, 1, 2, 2],
            (n, m, l),
            s,
            "srpm-time",
            rates=rates,
            network=net._replace(classes=None),
        )
        assert predict_iteration_seconds(plan, rates, network=net) <= predict_iteration_seconds(
            blind, rates, network=net
        )
    assert (
        plan.n_columns > 1 and max(len(c) for c in plan.columns) > 1
    )  # both exchanges are exercised
    with (
        LocalCluster(
            n_workers=6, threads_per_worker=1, processes=False, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        r = fit(
            x, d, hidden=m, iterations=30, learning_rate=0.03, mapping=plan, client=client, seed=0
        )
    ref = fit_serial(x, d, hidden=m, iterations=30, learning_rate=0.03, seed=0)
    (W, V), err = ref.params, ref.errors
    np.testing.assert_allclose(r.params[0], W, rtol=1e-10, atol=0)
    np.testing.assert_allclose(r.params[-1], V, rtol=1e-10, atol=0)
    np.testing.assert_allclose(r.history["error"].values, err, rtol=1e-10, atol=0)


def test_srpm_time_chooses_its_columns_for_one_mini_batch():
    """make_plan(batch=B) with srpm-time: the columns of a B-sample problem, cut on the set."""
    ab = [1.0, 1.2, 0.8, 2.0, 1.5, 0.9, 1.1, 1.3]
    shape, samples, B = (64, 64, 8), 16384, 256
    net = Interconnect(latency=5e-4, bandwidth=2e8)
    rates = [2e7 * a for a in ab]
    full = make_plan(ab, shape, samples, "srpm-time", rates=rates, network=net)
    one_batch = make_plan(ab, shape, B, "srpm-time", rates=rates, network=net)
    batched = make_plan(ab, shape, samples, "srpm-time", rates=rates, network=net, batch=B)
    assert batched.samples == samples
    assert batched.n_columns == one_batch.n_columns
    assert full.n_columns != one_batch.n_columns  # the case is one where the batch matters


# ------------------------------------------------------------------ fewer workers when faster
# Measured on real, unpaced cores (docs/benchmarks.md, REAL): at the paper's size an iteration on
# 8 or 16 one-core workers took longer than on one core alone; srpm-time must see that and plan
# on the fastest few, leaving the rest idle.
def _real_net() -> Interconnect:
    return Interconnect(latency=2e-4, bandwidth=1e9, overhead=1e-4)


@pytest.mark.parametrize("n", [8, 16])
def test_a_latency_bound_job_runs_on_fewer_workers(n):
    rates = [2e7] * n
    plan = make_plan([1.0] * n, "203-80-26", 1024, "srpm-time", rates=rates, network=_real_net())
    kept = plan.planned_workers
    assert 1 <= len(kept) < n
    assert sorted(plan.excluded) == sorted(set(range(n)) - set(kept))
    note = next(x for x in plan.notes if "idle" in x)
    assert "predicted faster" in note
    every = make_plan(
        [1.0] * n, "203-80-26", 1024, "srpm-time", rates=rates, network=_real_net(), dp=None
    )
    assert every.planned_workers == kept  # deterministic
    # the chosen plan is predicted faster than the best plan on every worker
    t_kept = predict_iteration_seconds(plan, rates, network=_real_net())
    assert t_kept < float(note.split("against ")[1].split(" s")[0])


def test_the_fastest_workers_are_the_ones_kept():
    abilities = [0.2, 1.0, 0.3, 0.9, 0.25, 0.2]
    rates = [a * 2e7 for a in abilities]
    plan = make_plan(abilities, "203-80-26", 1024, "srpm-time", rates=rates, network=_real_net())
    kept = set(plan.planned_workers)
    assert kept and len(kept) < len(abilities)
    slowest_kept = min(abilities[w] for w in kept)
    assert all(abilities[w] <= slowest_kept for w in plan.excluded)


def test_a_compute_bound_job_keeps_every_worker():
    plan = make_plan([1.0] * 8, SHAPE, 32768, "srpm-time", rates=[2e7] * 8, network=_real_net())
    assert len(plan.planned_workers) == 8 and not plan.excluded
    assert not any("idle" in x for x in plan.notes)


def test_forced_columns_never_drop_workers():
    plan = make_plan(
        [1.0] * 4, "203-80-26", 1024, "srpm-time", rates=[2e7] * 4, network=_real_net(), dp=2
    )
    assert len(plan.planned_workers) == 4


def test_a_plan_with_idle_workers_trains_exactly_like_serial():
    """Workers left idle hold no rows; the others train, equal to fit_serial (float64, 1e-10)."""
    from distributed import Client, LocalCluster

    from dask_rpm.engine import fit, ordered_workers
    from dask_rpm.nn.serial import fit_serial

    s, n, m, l = 50, 8, 10, 3
    x, d = regression_problem(s=s, n=n, l=l, seed=7)
    with (
        LocalCluster(
            n_workers=4, threads_per_worker=1, processes=False, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        workers = ordered_workers(client.scheduler_info())
        plan = make_plan(
            [1.0, 0.5, 0.9, 0.4],
            (n, m, l),
            s,
            "srpm-time",
            rates=[2e5, 1e5, 1.8e5, 0.8e5],
            network=_real_net(),
            workers=workers,
        )
        assert 1 <= len(plan.planned_workers) < 4 and plan.excluded
        r = fit(x, d, hidden=m, iterations=20, learning_rate=0.01, mapping=plan, client=client)
    assert set(r.stats["threads"]) == {workers[w] for w in plan.planned_workers}
    ref = fit_serial(x, d, hidden=m, iterations=20, learning_rate=0.01)
    (W, V), err = ref.params, ref.errors
    np.testing.assert_allclose(r.params[0], W, rtol=1e-10, atol=0)
    np.testing.assert_allclose(r.params[-1], V, rtol=1e-10, atol=0)
    np.testing.assert_allclose(r.history["error"].values, err, rtol=1e-10, atol=0)
