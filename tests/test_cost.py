"""Cost models: the paper's element count and the seconds prediction."""

from __future__ import annotations

import dask.config
import pytest

from dask_rpm.cost import (
    predict_breakdown,
    predict_iteration_seconds,
    t_comm,
    t_comm_model,
    t_comm_partition,
)
from dask_rpm.partition import Plan, RealPartition
from dask_rpm.planners import make_plan

SHAPE = (203, 80, 26)


def test_t_comm_model_worked_example_values():
    # C=2 with k=(3, 2), widths 0.35 / 0.65 (SPEC section 4)
    assert t_comm_model([0.35, 0.65], [3, 2], SHAPE, 1024) == pytest.approx(73913.6)
    assert t_comm_model([1.0], [5], SHAPE, 1024) == pytest.approx(212992.0)
    assert t_comm_model([0.05, 0.10, 0.20, 0.30, 0.35], [1] * 5, SHAPE, 1024) == pytest.approx(146560.0)
    # widths are normalised
    assert t_comm_model([35, 65], [3, 2], SHAPE, 1024) == pytest.approx(73913.6)


def test_t_comm_partition_ignores_row_cuts():
    a = RealPartition(((0, 1), (2,)), (0.5, 0.5), ((0.5, 0.5), (1.0,)))
    b = RealPartition(((0, 1), (2,)), (0.5, 0.5), ((0.1, 0.9), (1.0,)))
    assert t_comm_partition(a, SHAPE, 100) == t_comm_partition(b, SHAPE, 100)
    assert t_comm_partition(a, SHAPE, 100) == 2 * 26 * 100 * 0.5 + 2 * 229 * 80


def test_t_comm_of_integer_plan():
    plan = Plan.from_columns([[0, 1, 2], [3, 4]], [358, 666], [[11, 23, 46], [37, 43]], shape=SHAPE)
    expected = 2 * 26 * 1024 * (358 / 1024 * 2) + 2 * 229 * 80
    assert t_comm(plan) == pytest.approx(expected)
    assert plan.t_comm == pytest.approx(expected)  # filled in by from_columns


# --------------------------------------------------------------- seconds
def _two_columns() -> Plan:
    # column 0: samples [0, 60), workers 0 (hidden [0, 4)) and 1 ([4, 10));
    # column 1: samples [60, 100), worker 2 (all 10 hidden units).
    return Plan.from_columns([[0, 1], [2]], [60, 40], [[4, 6], [10]], shape=(5, 10, 3))


def test_single_worker_is_pure_compute():
    plan = Plan.from_columns([[0]], [100], [[10]], shape=(5, 10, 3))
    assert predict_iteration_seconds(plan, [500.0], latency=1e-3, bandwidth=1e6, itemsize=8) == pytest.approx(2.0)


def test_breakdown_by_hand():
    plan = _two_columns()
    lat, bw, isz = 0.01, 1000.0, 4
    out = predict_breakdown(plan, [10.0, 20.0, 50.0], latency=lat, bandwidth=bw, itemsize=isz)
    # compute: areas 240, 360, 400
    assert out["compute"] == pytest.approx({0: 24.0, 1: 18.0, 2: 8.0})
    assert out["column_compute"] == pytest.approx([24.0, 8.0])
    # vertical: column 0 has k=2 -> 2 messages of l*s_c = 3*60 elements
    v0 = 2 * 1 * (lat + 3 * 60 * isz / bw)
    assert out["vertical"] == pytest.approx([v0, 0.0])
    # bands (0,4) and (4,10), each reduced+broadcast between C=2 holders
    assert out["bands"] == [(0, 4), (4, 10)]
    h = [2 * 1 * (lat + (5 + 3) * r * isz / bw) for r in (4, 6)]
    assert out["horizontal_by_band"] == pytest.approx(h)
    assert out["bottleneck_column"] == 0
    assert out["total"] == pytest.approx(24.0 + v0 + sum(h))
    assert predict_iteration_seconds(plan, [10.0, 20.0, 50.0], latency=lat, bandwidth=bw, itemsize=isz) == out["total"]


def test_more_bands_cost_more_latency():
    # Same columns and widths; row cuts aligned (2 bands) or not (4 bands).
    ab = (0.05, 0.10, 0.20, 0.30, 0.35)
    snapped = make_plan(ab, SHAPE, 1024, small_group=0.06)
    plain = make_plan(ab, SHAPE, 1024, small_group=0)
    speeds = [a * 1e6 for a in ab]
    kw = dict(bandwidth=1e12, itemsize=8)
    gap_hi = predict_breakdown(plain, speeds, latency=1.0, **kw)["horizontal"] - predict_breakdown(
        snapped, speeds, latency=1.0, **kw
    )["horizontal"]
    # one band fewer, 2 (C - 1) = 2 messages of 1 s each saved
    assert gap_hi == pytest.approx(2.0, rel=1e-6)


def test_balanced_plan_beats_uniform_on_heterogeneous_workers():
    ab = [1, 1, 4, 4]
    speeds = [a * 1e5 for a in ab]
    srpm = make_plan(ab, SHAPE, 1024, "srpm", small_group=0)
    flat = make_plan(ab, SHAPE, 1024, "uniform", dp=srpm.n_columns)
    assert predict_iteration_seconds(srpm, speeds) < predict_iteration_seconds(flat, speeds)


def test_defaults_come_from_config():
    plan = _two_columns()
    speeds = [10.0, 20.0, 50.0]
    with dask.config.set({"rpm.cost.latency": 0.0, "rpm.cost.bandwidth": 1e30}):
        assert predict_iteration_seconds(plan, speeds) == pytest.approx(24.0)
    with dask.config.set({"rpm.cost.latency": 1.0, "rpm.cost.bandwidth": 1e30}):
        # vertical 2 messages in column 0, horizontal 2 bands x 2 messages
        assert predict_iteration_seconds(plan, speeds) == pytest.approx(24.0 + 2 + 4)


def test_speeds_by_mapping_and_names():
    plan = _two_columns().with_workers(["a", "b", "c"])
    by_index = predict_iteration_seconds(plan, [10.0, 20.0, 50.0])
    assert predict_iteration_seconds(plan, {0: 10.0, 1: 20.0, 2: 50.0}) == by_index
    assert predict_iteration_seconds(plan, {"a": 10.0, "b": 20.0, "c": 50.0}) == by_index


def test_excluded_workers_need_no_speed_value():
    plan = make_plan([1.0, 1.0, 0.001, 1.0], (10, 20, 2), 1000)
    assert plan.excluded == (2,)
    t = predict_iteration_seconds(plan, [1e4, 1e4, float("nan"), 1e4])
    assert t > 0


@pytest.mark.parametrize(
    "speeds,kw,match",
    [
        ([1.0, 2.0], {}, "2 speeds given for a plan of 3 workers"),
        ([1.0, 0.0, 1.0], {}, "speed of P2 is 0.0"),
        ([1.0, -1.0, 1.0], {}, "speed of P2 is -1.0"),
        ({0: 1.0, 1: 1.0}, {}, "no speed given for planned worker P3"),
        ([1.0, 1.0, 1.0], {"latency": -1.0}, "latency=-1.0"),
        ([1.0, 1.0, 1.0], {"bandwidth": 0.0}, "bandwidth=0.0"),
        ([1.0, 1.0, 1.0], {"itemsize": 0}, "itemsize=0"),
    ],
)
def test_bad_inputs(speeds, kw, match):
    with pytest.raises(ValueError, match=match):
        predict_iteration_seconds(_two_columns(), speeds, **kw)
