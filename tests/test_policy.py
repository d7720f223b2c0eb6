"""Remap decisions: the paper's threshold rule, the cost rule and the check interval."""

from __future__ import annotations

import math

import dask.config
import numpy as np
import pytest
from policy_reference import CheckSchedule

from dask_rpm.drpm.policy import (
    Decision,
    auto_interval,
    cost_decision,
    decide,
    first_interval,
    imbalance_ratio,
    paper_decision,
    predict_step_seconds,
    predict_worker_seconds,
)
from dask_rpm.drpm.remap import migration, migration_seconds, rows_gained
from dask_rpm.plan.partition import Plan

SHAPE = (7, 40, 3)
ROW = (7 + 3) * 8


# ------------------------------------------------------------------ paper rule
def test_imbalance_ratio():
    assert imbalance_ratio({"a": 2.0, "b": 4.0, "c": 3.0}) == 0.5
    assert imbalance_ratio([1.0]) == 1.0
    with pytest.raises(ValueError, match="no worker times"):
        imbalance_ratio({})
    with pytest.raises(ValueError, match="finite"):
        imbalance_ratio([1.0, float("nan")])
    with pytest.raises(ValueError, match="zero"):
        imbalance_ratio([0.0, 0.0])


@pytest.mark.parametrize(
    "times, kind",
    [
        ([1.0, 3.0], "whole"),  # 0.333 < 0.4
        ([1.0, 2.5], "column"),  # 0.4 exactly: not below T_whole
        ([1.0, 2.0], "column"),  # 0.5
        ([1.0, 1.25], None),  # 0.8 exactly: not below T_line
        ([1.0, 1.1], None),
    ],
)
def test_paper_rule_branches(times, kind):
    d = paper_decision(times)
    assert d.kind == kind
    assert d.ratio == pytest.approx(times[0] / times[1])
    assert bool(d) is (kind is not None)
    assert f"{d.ratio:.3f}" in d.reason


def test_paper_rule_first_check_without_initial_abilities():
    balanced = {"a": 1.0, "b": 1.0}
    d = paper_decision(balanced, first_check=True, initial_abilities=False)
    assert d.kind == "whole" and "first check" in d.reason
    # With initial abilities, or on a later check, balance means keep.
    assert paper_decision(balanced, first_check=True, initial_abilities=True).kind is None
    assert paper_decision(balanced, first_check=False, initial_abilities=False).kind is None


def test_paper_thresholds_from_arguments_and_config():
    assert paper_decision([1.0, 2.0], t_whole=0.6).kind == "whole"
    assert paper_decision([1.0, 1.1], t_line=0.95).kind == "column"
    with dask.config.set({"rpm.drpm.t-whole": 0.55, "rpm.drpm.t-line": 0.9}):
        assert paper_decision([1.0, 2.0]).kind == "whole"
        assert paper_decision([1.0, 1.2]).kind == "column"
    with pytest.raises(ValueError, match="t_whole <= t_line"):
        paper_decision([1.0, 1.0], t_whole=0.9, t_line=0.5)


def test_decide_dispatch():
    assert decide([1.0, 2.0]) == paper_decision([1.0, 2.0])  # config default: paper
    assert decide([1.0, 1.0], first_check=True, initial_abilities=False).kind == "whole"
    with pytest.raises(ValueError, match="unknown remap policy"):
        decide([1.0], policy="magic")
    with pytest.raises(TypeError, match="paper policy"):
        decide([1.0], policy="paper", remaining=3)


# ------------------------------------------------------------------- cost rule
@pytest.fixture
def skewed():
    """Four equal rectangles of 50 x 20 = 1000 units; worker 3 runs at a quarter speed."""
    plan = Plan.from_columns([[0, 1], [2, 3]], [50, 50], [[20, 20], [20, 20]], shape=SHAPE)
    speeds = {0: 1000.0, 1: 1000.0, 2: 1000.0, 3: 250.0}
    return plan, speeds


def test_predictor(skewed):
    plan, speeds = skewed
    assert predict_worker_seconds(plan, speeds) == {0: 1.0, 1: 1.0, 2: 1.0, 3: 4.0}
    assert predict_step_seconds(plan, speeds) == 4.0
    assert predict_step_seconds(plan, speeds, 0.5) == 4.5
    assert predict_step_seconds(plan, speeds, lambda p: 0.25 * p.n_columns) == 4.5


def test_predictor_with_modelled_horizontal_exchange(skewed):
    from dask_rpm.cost import predict_breakdown

    plan, speeds = skewed
    h = predict_breakdown(plan, speeds, latency=1e-3, bandwidth=1e6)["horizontal"]
    assert h > 0
    comm = lambda p: predict_breakdown(p, speeds, latency=1e-3, bandwidth=1e6)["horizontal"]  # noqa: E731
    assert predict_step_seconds(plan, speeds, comm) == pytest.approx(4.0 + h)


def test_cost_rule_remaps_when_saving_beats_migration(skewed):
    plan, speeds = skewed
    d = cost_decision(plan, speeds, remaining=10, kinds=("column",), latency=0.01, bandwidth=1000.0)
    assert d.kind == "column" and d.plan is not None
    # Column remap: widths 2000 : 1250 -> 62 / 38 samples; column 1 heights 32 / 8.
    assert d.plan.columns == plan.columns
    assert predict_step_seconds(d.plan, speeds) == pytest.approx(1.24)
    assert d.saving == pytest.approx((4.0 - 1.24) * 10)
    # Rows 20..32 move from worker 3 to worker 2: 12 rows in one message.
    assert migration(plan, d.plan) == [migration(plan, d.plan)[0]]
    assert d.cost == pytest.approx(12 * ROW / 1000.0 + 0.01)
    assert d.ratio == 0.25  # predicted, no times given
    assert "column" in d.reason


def test_cost_rule_counts_the_sample_rows_a_remap_moves(skewed):
    """Column 0 widens from 50 to 62 samples: its two workers each gain 12 rows, column 1's
    narrower range gains none; with ``row_bytes`` those 24 rows are priced at the bandwidth."""
    plan, speeds = skewed
    net = dict(kinds=("column",), latency=0.01, bandwidth=1000.0)
    weights_only = cost_decision(plan, speeds, remaining=10, **net)
    assert rows_gained(plan, weights_only.plan) == 24
    rows = cost_decision(plan, speeds, remaining=10, row_bytes=40, **net)
    assert rows.cost == pytest.approx(weights_only.cost + 24 * 40 / 1000.0)
    assert "24 sample rows" in rows.reason and "sample rows" not in weights_only.reason
    assert rows_gained(plan, plan) == 0
    # rows dear enough to outweigh the saving: kept
    assert cost_decision(plan, speeds, remaining=10, row_bytes=2000, **net).kind is None


def test_cost_rule_keeps_when_migration_dearer(skewed):
    plan, speeds = skewed
    slow_net = dict(kinds=("column",), latency=0.01, bandwidth=10.0)  # 96 s to move 12 rows
    keep = cost_decision(plan, speeds, remaining=10, **slow_net)
    assert keep.kind is None and keep.plan is None
    assert keep.saving == pytest.approx(27.6) and keep.cost == pytest.approx(96.01)
    assert keep.reason.startswith("keep")
    # The same network, a longer run: now worth it.
    assert cost_decision(plan, speeds, remaining=100, **slow_net).kind == "column"
    # Nothing left to run: never worth it.
    assert (
        cost_decision(plan, speeds, remaining=0, kinds=("column",), latency=0, bandwidth=1e12).kind
        is None
    )
    with pytest.raises(ValueError, match="remaining"):
        cost_decision(plan, speeds, remaining=-1, kinds=("column",))


def test_cost_rule_min_gain_ignores_noise():
    # Fine enough (s = 1000, m = 400) that a 1.5 % speed difference moves cuts.
    plan = Plan.from_columns(
        [[0, 1], [2, 3]], [500, 500], [[200, 200], [200, 200]], shape=(7, 400, 3)
    )
    near = {0: 1000.0, 1: 1000.0, 2: 1000.0, 3: 985.0}  # predicted gain 0.9 %: within noise
    free = dict(kinds=("column",), latency=0.0, bandwidth=1e15, remaining=10**6)
    assert cost_decision(plan, near, **free).kind is None
    assert cost_decision(plan, near, min_gain=0.0, **free).kind == "column"
    with dask.config.set({"rpm.drpm.min-gain": 0.0}):
        assert cost_decision(plan, near, **free).kind == "column"


def test_cost_rule_uses_times_and_comm(skewed):
    plan, speeds = skewed
    d = cost_decision(
        plan,
        speeds,
        remaining=10,
        kinds=("column",),
        latency=0.0,
        bandwidth=1e9,
        times={0: 1.0, 1: 2.0, 2: 1.0, 3: 4.0},
        comm_seconds=lambda p: 0.5,
    )
    assert d.ratio == 0.25
    assert d.saving == pytest.approx((4.5 - 1.74) * 10)  # comm adds to both sides


def test_decide_cost_policy(skewed):
    plan, speeds = skewed
    kw = dict(
        plan=plan, speeds=speeds, remaining=10, kinds=("column",), latency=0.01, bandwidth=1000.0
    )
    d = decide([1.0, 4.0], policy="cost", **kw)
    assert d.kind == "column" and d.ratio == 0.25
    with dask.config.set({"rpm.drpm.policy": "cost"}):
        assert decide([1.0, 4.0], **kw).kind == "column"
    with pytest.raises(TypeError, match="needs remaining="):
        decide([1.0, 4.0], policy="cost", plan=plan, speeds=speeds)


def test_cost_rule_with_whole_candidate(skewed):
    pytest.importorskip("dask_rpm.planners", exc_type=ImportError)
    plan, speeds = skewed
    net = dict(latency=1e-4, bandwidth=1e9)
    both = cost_decision(plan, speeds, remaining=50, **net)
    col = cost_decision(plan, speeds, remaining=50, kinds=("column",), **net)
    assert both.kind in ("whole", "column")
    assert both.saving - both.cost >= col.saving - col.cost - 1e-12
    if both.kind == "whole":
        assert both.plan.method == "srpm"
        assert both.cost == pytest.approx(migration_seconds(migration(plan, both.plan), **net))


def test_decision_is_falsy_when_keeping():
    assert not Decision(None, 1.0, "keep")
    assert Decision("column", 0.5, "x")
    assert math.isnan(Decision(None, 1.0, "keep").saving)


# ------------------------------------------------------------- check interval
def test_auto_interval_paper_point_and_bounds():
    assert auto_interval(0.15) == 20  # 30 ms / (1 % of 0.15 s): the paper's R
    assert auto_interval(1e-6) == 1000  # capped by max-interval
    assert auto_interval(100.0) == 6  # never below the window L
    # Reaction bound: 0.03 / (0.001 * 0.1) = 300 wanted, but 10 s / 0.1 s = 100 allowed.
    assert auto_interval(0.1, target_overhead=0.001, react_seconds=10.0) == 100
    # The window wins over the reaction bound.
    assert auto_interval(5.0, react_seconds=10.0) == 6
    assert auto_interval(1.0, target_overhead=0.001, react_seconds=10.0, min_interval=1) == 10


def test_auto_interval_monotone_and_bounded():
    ts = np.logspace(-6, 3, 400)
    for kw in (
        {},
        {"target_overhead": 0.001, "react_seconds": 5.0},
        {"min_interval": 1, "max_interval": 50},
    ):
        rs = [auto_interval(t, **kw) for t in ts]
        assert all(a >= b for a, b in zip(rs, rs[1:])), kw
        lo = kw.get("min_interval", 6)
        hi = kw.get("max_interval", 1000)
        assert all(lo <= r <= hi for r in rs)
        # Overhead stays within target whenever no bound is active.
        target = kw.get("target_overhead", 0.01)
        for t, r in zip(ts, rs):
            if lo < r < hi and r != math.floor(kw.get("react_seconds", 60.0) / t):
                assert 0.03 / (r * t) <= target + 1e-12


def test_auto_interval_config():
    with dask.config.set({"rpm.drpm.window": 9}):
        assert auto_interval(100.0) == 9
    with dask.config.set({"rpm.drpm.auto.min-interval": 12, "rpm.drpm.auto.check-seconds": 0.3}):
        assert auto_interval(100.0) == 12
        assert auto_interval(0.15) == 200
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="positive finite"):
            auto_interval(bad)
    with pytest.raises(ValueError, match="bad auto-interval"):
        auto_interval(1.0, target_overhead=0.0)
    with pytest.raises(ValueError, match="bad auto-interval"):
        auto_interval(1.0, min_interval=10, max_interval=5)


def test_check_schedule_fixed():
    s = CheckSchedule()
    assert s.interval == 20 and not s.auto and s.first_check
    s = CheckSchedule(3)
    due = []
    for it in range(1, 10):
        if s.due(it):
            due.append(it)
            s.mark(it)
    assert due == [3, 6, 9] and s.checks == 3 and not s.first_check
    assert s.update(0.15) == 3  # fixed: measured time ignored
    with pytest.raises(
        ValueError, match=r"interval=0; it must be a positive number of iterations \(>= 1\)"
    ):
        CheckSchedule(0)


def test_check_schedule_auto():
    with dask.config.set({"rpm.drpm.interval": "auto"}):
        s = CheckSchedule()
    assert s.auto and s.interval == 6  # before any measurement: the window
    assert not s.due(5) and s.due(6)
    s.mark(6)
    assert s.update(0.15) == 20
    assert not s.due(25) and s.due(26)
    assert CheckSchedule("auto", min_interval=3).interval == 3


def test_first_interval_is_the_one_source_for_the_schedule_and_fit():
    """fit() and CheckSchedule take R before any measurement from policy.first_interval."""
    from dask_rpm.engine.options import RunOptions

    def fit_interval(interval):
        opts = RunOptions(mapping="srpm", interval=interval).resolved()
        return opts.interval, opts.auto_interval

    assert first_interval(7) == (7, False) == fit_interval(7)
    with dask.config.set({"rpm.drpm.window": 9}):
        assert first_interval("auto") == (9, True) == fit_interval("auto")
        assert CheckSchedule("auto").interval == 9
    with dask.config.set({"rpm.drpm.window": 1}):
        assert first_interval("auto") == (2, True)  # a block of one iteration sees no window
    with dask.config.set({"rpm.drpm.auto.min-interval": 4}):
        assert first_interval("auto") == (4, True) == fit_interval("auto")
        assert CheckSchedule("auto").interval == 4
    for bad in (0, -3, 2.5, True, "often"):
        with pytest.raises(ValueError, match="positive number of iterations"):
            first_interval(bad)
        with pytest.raises(ValueError, match="positive number of iterations"):
            fit_interval(bad)


# ------------------------------------------------------------ settings record
def test_settings_are_read_once_and_the_record_decides():
    from dask_rpm.drpm.settings import DRPMSettings

    with dask.config.set({"rpm.drpm.t-whole": 0.6, "rpm.drpm.auto.min-interval": 9}):
        s = DRPMSettings.from_config()
    assert (s.t_whole, s.min_interval, s.interval_floor) == (0.6, 9, 9)
    # the record read inside the block decides outside it; the defaults otherwise
    assert paper_decision([1.0, 2.0], settings=s).kind == "whole"  # 0.5 < 0.6
    assert paper_decision([1.0, 2.0]).kind == "column"  # 0.4 <= 0.5 < 0.8
    assert auto_interval(100.0, settings=s) == 9
    assert first_interval("auto", settings=s) == (9, True)
    assert decide([1.0, 2.0], settings=s).kind == "whole"
    # keywords win over the record; the record itself is unchanged
    assert paper_decision([1.0, 2.0], t_whole=0.1, settings=s).kind == "column"
    assert DRPMSettings.resolve(s, t_whole=0.1).t_whole == 0.1 and s.t_whole == 0.6
    assert DRPMSettings.resolve(s) is s
    with pytest.raises(TypeError, match="no field"):
        DRPMSettings.resolve(s, t_wholes=0.1)


def test_config_section_spells_keys_as_python_names_and_overrides():
    from dask_rpm import config

    c = config.section("drpm", window=3, policy=None)
    assert c["window"] == 3 and c["policy"] == "paper"  # None does not override
    assert c["auto"]["check_seconds"] == 0.03 and "min-gain" not in c and "min_gain" in c
    c["auto"]["check_seconds"] = 1.0  # a copy: the configuration is untouched
    assert dask.config.get("rpm.drpm.auto.check-seconds") == 0.03
