"""Planners: SRPM (worked example, fast DP == plain DP, brute force), baselines, make_plan."""

from __future__ import annotations

import itertools
import math
import time

import dask.config
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from srpm_reference import srpm_table

from dask_rpm.cost import t_comm_model
from dask_rpm.plan.partition import Plan, PlanError
from dask_rpm.planners import (
    PLANNERS,
    PlannerResult,
    get_planner,
    grid_h,
    grid_hrev,
    make_plan,
    parse_shape,
    register_planner,
    srpm,
    srpm_dp,
    srpm_dp_reference,
    uniform,
)

P_EX = (0.05, 0.10, 0.20, 0.30, 0.35)
SHAPE_EX = (203, 80, 26)


# ------------------------------------------------------------ worked example
def test_worked_example_table_row_c1():
    t = srpm_table(P_EX)
    np.testing.assert_allclose(t[1, 1:], [0.00, 0.15, 0.70, 1.95, 4.00], atol=1e-12)


def test_worked_example_full_table():
    # Rows C=2..5 for q=C..N. The paper's figure prints 0.72 at (C=2, q=5), but
    # its own t_comm(2) = 73913.6 needs t(2, 5) = 0.70 = 0.35 * 2 (k = 3, 2).
    t = srpm_table(P_EX)
    np.testing.assert_allclose(t[2, 2:], [0.00, 0.15, 0.50, 0.70], atol=1e-12)
    np.testing.assert_allclose(t[3, 3:], [0.00, 0.15, 0.50], atol=1e-12)
    np.testing.assert_allclose(t[4, 4:], [0.00, 0.15], atol=1e-12)
    assert t[5, 5] == 0.0
    assert np.all(np.isinf(t[2, :2])) and np.all(np.isinf(t[1:, 0]))
    np.testing.assert_array_equal(t, srpm_table(P_EX, reference=True))


def test_worked_example_plan():
    plan = make_plan(P_EX, SHAPE_EX, 1024, "srpm")
    assert plan.t_comm_by_columns == pytest.approx((212992.0, 73913.6, 99904.0, 117907.2, 146560.0))
    assert plan.t_comm == pytest.approx(73913.6)
    assert plan.columns == ((0, 1, 2), (3, 4))
    assert plan.method == "srpm"
    assert plan.excluded == ()
    plan.validate()


def test_worked_example_columns_are_original_indices_slowest_first():
    perm = [3, 0, 4, 2, 1]  # user order: P_EX[3], P_EX[0], ...
    ab = [P_EX[i] for i in perm]
    plan = make_plan(ab, SHAPE_EX, 1024, "srpm")
    # slowest first: 0.05 (index 1), 0.10 (index 4), 0.20 (index 3) | 0.30 (0), 0.35 (2)
    assert plan.columns == ((1, 4, 3), (0, 2))
    assert plan.t_comm == pytest.approx(73913.6)


def test_worked_example_snaps_the_thin_band():
    # Real cuts: column 1 at 1/7 and 3/7, column 2 at 0.3/0.65 = 0.4615; the band
    # between 3/7 and 0.4615 (0.033 of m) is thinner than 0.06 and is removed.
    snapped = make_plan(P_EX, SHAPE_EX, 1024, small_group=0.06)
    plain = make_plan(P_EX, SHAPE_EX, 1024, small_group=0)
    assert len(plain.bands()) == 4
    assert len(snapped.bands()) == 3
    assert snapped.rectangle(2).hidden[0] == snapped.rectangle(4).hidden[0]
    assert any("snapped 1" in n for n in snapped.notes)
    assert not any("snapped" in n for n in plain.notes)
    # Snapping changes row cuts only; the model value is reported before it.
    assert snapped.t_comm == plain.t_comm
    assert snapped.columns == plain.columns
    assert plain.imbalance() < 1.02 < snapped.imbalance() < 1.1


def test_small_group_from_config():
    with dask.config.set({"rpm.planner.small-group": 0.0}):
        assert len(make_plan(P_EX, SHAPE_EX, 1024).bands()) == 4
    with dask.config.set({"rpm.planner.small-group": 0.06}):
        assert len(make_plan(P_EX, SHAPE_EX, 1024).bands()) == 3


# ----------------------------------------------------- fast DP == plain DP
def _random_abilities(rng: np.random.Generator, n: int) -> np.ndarray:
    kind = rng.integers(4)
    if kind == 0:
        return rng.uniform(0.01, 1.0, n)
    if kind == 1:  # many ties
        return rng.integers(1, 4, n).astype(float)
    if kind == 2:  # strongly heterogeneous
        return np.exp(rng.normal(0, 2, n))
    return rng.choice([0.25, 0.31, 0.63, 1.0, 0.42, 0.67], n)


def test_fast_dp_equals_reference_on_random_inputs():
    rng = np.random.default_rng(12345)
    for trial in range(120):
        n = int(rng.integers(1, 40))
        p = _random_abilities(rng, n)
        m = int(rng.choice([2, 3, 5, 80]))
        shape = (int(rng.integers(1, 300)), m, int(rng.integers(1, 50)))
        samples = int(rng.choice([n, 64, 1024]))
        try:
            ref = srpm_dp_reference(p, shape, samples)
        except PlanError:
            with pytest.raises(PlanError):
                srpm_dp(p, shape, samples)
            continue
        fast = srpm_dp(p, shape, samples)
        assert fast.t_vertical == ref.t_vertical, trial
        assert fast.t_comm_by_columns == ref.t_comm_by_columns, trial
        assert fast.sizes == ref.sizes, trial
        assert fast.order == ref.order
        assert fast.columns() == ref.columns()


def test_fast_table_equals_reference_table_with_argmins():
    rng = np.random.default_rng(7)
    for _ in range(25):
        n = int(rng.integers(1, 30))
        p = _random_abilities(rng, n)
        cap = int(rng.integers(1, n + 1))
        np.testing.assert_array_equal(
            srpm_table(p, max_per_column=cap), srpm_table(p, max_per_column=cap, reference=True)
        )


def test_forced_columns_equal_reference():
    rng = np.random.default_rng(3)
    for _ in range(30):
        n = int(rng.integers(2, 25))
        p = _random_abilities(rng, n)
        c = int(rng.integers(1, n + 1))
        a = srpm_dp(p, (10, 100, 5), 500, columns=c)
        b = srpm_dp_reference(p, (10, 100, 5), 500, columns=c)
        assert a.sizes == b.sizes and len(a.sizes) == c
        assert a.t_comm == b.t_comm


def test_early_stop_gives_the_same_choice():
    rng = np.random.default_rng(11)
    for _ in range(30):
        n = int(rng.integers(1, 60))
        p = _random_abilities(rng, n)
        full = srpm_dp(p, (203, 80, 26), 1024)
        early = srpm_dp(p, (203, 80, 26), 1024, early_stop=True)
        assert early.sizes == full.sizes
        k = len(early.t_comm_by_columns)
        assert early.t_comm_by_columns == full.t_comm_by_columns[:k]
        assert k >= full.n_columns
        # every C not computed is provably no better
        for c in range(k + 1, n + 1):
            assert full.t_comm_by_columns[c - 1] >= full.t_comm


# ------------------------------------------------------- brute-force optimum
def _compositions(n: int):
    for cuts in itertools.product([0, 1], repeat=n - 1):
        sizes, k = [], 1
        for c in cuts:
            if c:
                sizes.append(k)
                k = 1
            else:
                k += 1
        sizes.append(k)
        yield tuple(sizes)


def _t_comm_of_sizes(ps: np.ndarray, sizes, shape, samples) -> float:
    widths, i = [], 0
    for k in sizes:
        widths.append(ps[i : i + k].sum())
        i += k
    return t_comm_model(widths, sizes, shape, samples)


def test_srpm_is_optimal_over_all_compositions():
    rng = np.random.default_rng(2024)
    for trial in range(150):
        n = int(rng.integers(1, 10))
        p = _random_abilities(rng, n)
        shape = (int(rng.integers(1, 400)), int(rng.integers(n, 200)), int(rng.integers(1, 60)))
        samples = int(rng.integers(n, 3000))
        ps = np.sort(p / p.sum())
        best = min(_t_comm_of_sizes(ps, sz, shape, samples) for sz in _compositions(n))
        res = srpm_dp(p, shape, samples)
        assert res.t_comm == pytest.approx(best, rel=1e-12, abs=1e-9), trial
        # the chosen sizes really cost that much
        assert _t_comm_of_sizes(ps, res.sizes, shape, samples) == pytest.approx(
            best, rel=1e-12, abs=1e-9
        )
        # and among optimal compositions SRPM has the fewest columns
        fewest = min(
            len(sz)
            for sz in _compositions(n)
            if _t_comm_of_sizes(ps, sz, shape, samples) <= best * (1 + 1e-12) + 1e-9
        )
        assert res.n_columns == fewest, trial


def test_plan_depends_only_on_the_multiset_of_abilities():
    rng = np.random.default_rng(5)
    for _ in range(40):
        n = int(rng.integers(2, 12))
        p = rng.uniform(0.05, 1, n)  # distinct with probability 1
        perm = rng.permutation(n)
        a = make_plan(p, (50, 60, 10), 500, small_group=0)
        b = make_plan(p[perm], (50, 60, 10), 500, small_group=0)
        # position j of the permuted list is original worker perm[j]
        mapped = tuple(tuple(int(perm[w]) for w in col) for col in b.columns)
        assert mapped == a.columns
        assert b.t_comm == a.t_comm
        for col in a.columns:  # slowest first inside a column, columns ascending
            assert list(p[list(col)]) == sorted(p[list(col)])
        flat = [w for col in a.columns for w in col]
        assert list(p[flat]) == sorted(p)


def test_stable_sort_on_ties_keeps_user_order():
    plan = make_plan([1, 1, 1, 1], (10, 10, 2), 100, small_group=0)
    assert [w for col in plan.columns for w in col] == [0, 1, 2, 3]


def test_sorted_runs_are_a_restriction_of_the_model():
    # Documented limitation (module docstring): with arbitrary subsets the
    # paper's model can be lower than with sorted runs; SRPM optimises runs.
    p = np.array([0.1, 0.2, 0.3, 0.4])
    shape, s = (10, 100, 10), 1000
    runs = min(_t_comm_of_sizes(p, sz, shape, s) for sz in _compositions(4) if len(sz) == 2)
    subsets = t_comm_model([0.1 + 0.4, 0.2 + 0.3], [2, 2], shape, s)
    assert subsets < runs
    t = srpm_table(p)
    assert t[2, 4] == pytest.approx(0.7)


# ------------------------------------------------------------------ speed
def test_srpm_1024_workers_is_fast():
    rng = np.random.default_rng(0)
    p = rng.uniform(0.1, 1.0, 1024)
    t0 = time.perf_counter()
    plan = make_plan(p, (203, 80, 26), 100_000)
    elapsed = time.perf_counter() - t0
    assert plan.validate() is plan
    # ~0.3 s on 2 cores; the O(N^3) DP needs well over a minute here.
    assert elapsed < 5.0


# ------------------------------------------------------------- constraints
def test_columns_never_hold_more_workers_than_hidden_units():
    p = np.ones(12)
    plan = make_plan(p, (5, 3, 2), 100)
    assert max(len(c) for c in plan.columns) <= 3
    res = srpm_dp(p, (5, 3, 2), 100)
    assert all(math.isinf(v) for v in res.t_comm_by_columns[:3])  # C < 4 infeasible


def test_no_more_columns_than_samples():
    # Communication is free-ish and vertical exchange is expensive: many columns
    # would be best, but only 2 samples exist.
    p = np.ones(6)
    plan = make_plan(p, (1, 100, 1000), 2)
    assert plan.n_columns <= 2
    res = srpm_dp(p, (1, 100, 1000), 2)
    assert all(math.isinf(v) for v in res.t_comm_by_columns[2:])


def test_srpm_dp_forces_columns():
    plan = make_plan(P_EX, SHAPE_EX, 1024, "srpm", dp=3)
    assert plan.n_columns == 3
    assert plan.t_comm == pytest.approx(99904.0)
    assert any("forced by dp" in n for n in plan.notes)


# ---------------------------------------------------------------- baselines
PAPER_AB = [1.0, 1.5, 2.0, 2.5, 3.0, 3.5]  # the H / H_rev illustration, docs/method.md §7


def test_spec_example_grid_h_and_hrev():
    p = np.array(PAPER_AB) / sum(PAPER_AB)
    h = grid_h(p, (10, 60, 3), 700, dp=2).partition
    r = grid_hrev(p, (10, 60, 3), 700, dp=2).partition
    for part in (h, r):
        assert part.columns == ((0, 1, 2), (3, 4, 5))
        assert part.widths[1] / part.widths[0] == pytest.approx(2.5)
    assert h.heights[0] == pytest.approx((1 / 3, 1 / 3, 1 / 3))
    hr = np.array(r.heights[0])
    np.testing.assert_allclose(hr / hr[0], [1.0, 1.5, 2.0])
    assert r.heights[0] == r.heights[1]  # regular grid: same rows in every column


def test_paper_figure_10_hrev_with_three_groups():
    # Conference paper Fig. 10: N=6, N_DP=3, abilities 1..3.5 -> widths
    # 0.167 / 0.333 / 0.500, rows 0.40 / 0.60.
    part = grid_hrev(np.array(PAPER_AB) / sum(PAPER_AB), (10, 60, 3), 600, dp=3).partition
    np.testing.assert_allclose(part.widths, [1 / 6, 2 / 6, 3 / 6])
    np.testing.assert_allclose(part.heights, [[0.4, 0.6]] * 3)


def test_grid_integer_plan_keeps_a_regular_grid():
    plan = make_plan(PAPER_AB, (10, 60, 3), 700, "grid-hrev", dp=2)
    rows = [[plan.rectangle(w).hidden for w in col] for col in plan.columns]
    assert rows[0] == rows[1] == [(0, 13), (13, 33), (33, 60)]
    assert plan.column_samples(0) == (0, 200)


def test_grid_alias():
    assert PLANNERS["grid"] is PLANNERS["grid-hrev"]
    plan = make_plan(PAPER_AB, (10, 60, 3), 700, "grid", dp=2)
    assert plan.method == "grid-hrev"


@pytest.mark.parametrize("method", ["uniform", "grid-h", "grid-hrev"])
def test_dp_must_divide_n(method):
    with pytest.raises(PlanError, match=r"dp=4 does not divide the 6 workers.*1, 2, 3, 6"):
        make_plan(PAPER_AB, (10, 60, 3), 700, method, dp=4)


@pytest.mark.parametrize(
    "method,fn", [("uniform", uniform), ("grid-h", grid_h), ("grid-hrev", grid_hrev)]
)
def test_auto_dp_is_best_by_the_model(method, fn):
    rng = np.random.default_rng(1)
    for _ in range(10):
        n = int(rng.choice([4, 6, 8, 12]))
        p = rng.uniform(0.1, 1, n)
        p = p / p.sum()
        shape = (int(rng.integers(1, 300)), 80, int(rng.integers(1, 60)))
        values = {d: fn(p, shape, 1024, dp=d).t_comm for d in (1, 2, 3, 4, 6, 8, 12) if n % d == 0}
        auto = fn(p, shape, 1024)
        best = min(values.values())
        assert auto.t_comm == best
        assert auto.meta["dp"] == min(d for d, v in values.items() if v == best)
        assert make_plan(p, shape, 1024, method).n_columns == auto.meta["dp"]


def test_uniform_is_equal_work_in_given_order():
    plan = make_plan([3, 1, 2, 5], (10, 40, 2), 100, "uniform", dp=2)
    assert plan.columns == ((0, 1), (2, 3))
    assert {r.area for r in plan.rectangles} == {50 * 20}


def test_uniform_t_comm_model():
    r = uniform(np.ones(4) / 4, SHAPE_EX, 1024, dp=2)
    # vertical 2*26*1024*(0.5*1) + horizontal 2*229*80*1
    assert r.t_comm == pytest.approx(2 * 26 * 1024 * 0.5 + 2 * 229 * 80)


# ----------------------------------------------------------- integer plans
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ab=st.lists(st.floats(0.01, 100.0), min_size=1, max_size=14),
    m=st.integers(14, 300),
    s=st.integers(14, 5000),
    method=st.sampled_from(["srpm", "grid-h", "grid-hrev", "uniform"]),
    sg=st.sampled_from([0.0, 0.06]),
)
def test_integer_plans_tile_exactly_and_round_closely(ab, m, s, method, sg):
    shape = (7, m, 3)
    with dask.config.set({"rpm.planner.min-units": 0.0}):
        plan = make_plan(ab, shape, s, method, small_group=sg)
    plan.validate()
    assert (
        sum(plan.column_samples(c)[1] - plan.column_samples(c)[0] for c in range(plan.n_columns))
        == s
    )
    for col in plan.columns:
        assert sum(plan.rectangle(w).n_hidden for w in col) == m
    assert sorted(plan.planned_workers) == list(range(len(ab)))
    # Compare against the planner's real partition (no snapping: sg = 0 only).
    if sg:
        return
    p = np.asarray(ab) / math.fsum(ab)  # the same floats make_plan uses
    real = get_planner(method)(p, shape, s).partition
    assert real.columns == plan.columns
    widths = np.array(real.widths) * s
    got = np.array(
        [plan.column_samples(c)[1] - plan.column_samples(c)[0] for c in range(plan.n_columns)]
    )
    if np.all(widths >= 1):  # no-zero rule cannot push
        assert np.all(np.abs(got - widths) <= 1 + 1e-9)
    for col, hs in zip(real.columns, real.heights):
        h = np.array(hs) * m
        g = np.array([plan.rectangle(w).n_hidden for w in col])
        if np.all(h >= 1):
            assert np.all(np.abs(g - h) <= 1 + 1e-9)


# ------------------------------------------------------------- exclusion
def test_too_slow_worker_is_excluded_and_replanned():
    # Alone in a column, P3 would get 0.33 of a sample (rounded up to 1: 3x overload).
    ab = [1.0, 1.0, 0.001, 1.0]
    plan = make_plan(ab, (10, 20, 2), 1000, "srpm")
    assert plan.excluded == (2,)
    assert sorted(plan.planned_workers) == [0, 1, 3]
    assert any("excluded P3" in n and "min-units" in n for n in plan.notes)
    assert len(plan.abilities) == 4
    assert plan.imbalance() < 1.01
    plan.validate()
    # With the rule off the worker is kept and pushed to one whole sample.
    with dask.config.set({"rpm.planner.min-units": 0.0}):
        kept = make_plan(ab, (10, 20, 2), 1000, "srpm")
    assert kept.excluded == ()
    assert kept.rectangle(2).n_samples == 1 and kept.imbalance() > 2.9


def test_worker_without_a_whole_hidden_unit_is_excluded():
    # One column (inputs make horizontal exchange expensive): P3's height would be 0.007 units.
    ab = [1.0, 1.0, 0.001, 1.0]
    plan = make_plan(ab, (2000, 20, 1), 1000, "srpm")
    assert plan.n_columns == 1 and plan.excluded == (2,)
    assert any("0.00666 hidden units" in n for n in plan.notes)
    with dask.config.set({"rpm.planner.min-units": 0.0}):
        assert make_plan(ab, (2000, 20, 1), 1000, "srpm").rectangle(2).n_hidden == 1


def test_grid_hrev_excludes_only_the_slow_worker():
    # H_rev gives P2 a thin column and P4 a thin row (they share them with P3);
    # only P3 is too slow, and the replan without it is fine for everyone else.
    ab = [1.0, 1.0, 0.0001, 1.0, 1.0, 1.0]
    first = grid_hrev(np.array(ab) / sum(ab), (300, 20, 10), 1000).partition
    assert first.columns[0] == (2, 0)  # N_DP=3: P3 shares its column with P1 ...
    assert 20 * first.heights[1][0] < 0.5  # ... and its row with P2 and P5
    plan = make_plan(ab, (300, 20, 10), 1000, "grid-hrev")
    assert plan.excluded == (2,)
    assert len(plan.planned_workers) == 5
    assert plan.imbalance() == pytest.approx(1.0)
    assert sum("excluded" in n for n in plan.notes) == 1


def test_exclusion_with_forced_dp_reports_context():
    with pytest.raises(PlanError, match=r"after leaving out P3 .*does not divide the 3 workers"):
        make_plan([1.0, 1.0, 0.0001, 1.0], (10, 20, 2), 1000, "grid-hrev", dp=2)


def test_workers_names_are_attached():
    plan = make_plan([1, 2], (4, 6, 2), 10, workers=["tcp://a:1", "tcp://b:2"])
    assert plan.workers == ("tcp://a:1", "tcp://b:2")
    with pytest.raises(PlanError, match="2 worker names given for 3 abilities"):
        make_plan([1, 2, 3], (4, 6, 2), 10, workers=["a", "b"])


# -------------------------------------------------------------- validation
@pytest.mark.parametrize(
    "ab,match",
    [
        ([], "abilities is empty"),
        ([1, -2], r"ability #2 \(P2\) is -2.0: abilities must be positive"),
        ([0, 1], r"ability #1 \(P1\) is 0: .*drop it"),
        ([1, float("nan")], r"ability #2 \(P2\) is nan"),
        ([1, float("inf")], r"ability #2 \(P2\) is inf"),
        ([1, "fast"], r"ability #2 \(P2\) is 'fast', not a number"),
        ("1,2", "sequence of numbers"),
        ([True, 1], "not a number"),
    ],
)
def test_bad_abilities(ab, match):
    with pytest.raises(PlanError, match=match):
        make_plan(ab, (10, 10, 2), 100)


@pytest.mark.parametrize(
    "shape,match",
    [
        ("203-80", r"2 values"),
        ((203, 80, 26, 1), r"4 values"),
        ("a-80-26", r"n='a'"),
        ((203, 0, 26), r"m=0 .* at least 1"),
        ((203, 2.5, 26), r"m=2.5"),
        (7, "three positive integers"),
    ],
)
def test_bad_shape(shape, match):
    with pytest.raises(PlanError, match=match):
        make_plan([1, 2], shape, 100)


def test_parse_shape_accepts_strings_and_sequences():
    assert parse_shape("203-80-26") == (203, 80, 26)
    assert parse_shape([203, 80, 26]) == (203, 80, 26)
    assert parse_shape(np.array([3, 4, 5])) == (3, 4, 5)


def test_bad_samples_dp_small_group_and_method():
    with pytest.raises(PlanError, match="samples=0 must be at least 1"):
        make_plan([1, 2], (3, 4, 5), 0)
    with pytest.raises(PlanError, match="samples=1.5 is not a whole number"):
        make_plan([1, 2], (3, 4, 5), 1.5)
    with pytest.raises(PlanError, match=r"samples=2 is fewer than the dp=3 columns.*dp <= 2"):
        make_plan([1, 2, 3], (3, 4, 5), 2, "srpm", dp=3)
    with pytest.raises(PlanError, match=r"samples=2 is fewer than the dp=3 columns"):
        make_plan([1, 2, 3], (3, 4, 5), 2, "uniform", dp=3)
    with pytest.raises(PlanError, match=r"dp=0 must be at least 1"):
        make_plan([1, 2], (3, 4, 5), 10, dp=0)
    with pytest.raises(PlanError, match=r"small_group=1.5 must be a fraction"):
        make_plan([1, 2], (3, 4, 5), 10, small_group=1.5)
    with pytest.raises(PlanError, match=r"unknown planner method 'fastest'.*grid-h.*srpm"):
        make_plan([1, 2], (3, 4, 5), 10, "fastest")


def test_too_many_workers_in_a_column():
    with pytest.raises(
        PlanError, match=r"dp=1 puts 4 workers in a column but the network has only m=2"
    ):
        make_plan([1, 1, 1, 1], (3, 2, 5), 10, "uniform", dp=1)
    with pytest.raises(PlanError, match=r"dp=1 columns would put more than m=2 workers"):
        make_plan([1, 1, 1, 1], (3, 2, 5), 10, "srpm", dp=1)
    with pytest.raises(PlanError, match=r"5 workers need at least 3 columns .* samples=2"):
        make_plan([1] * 5, (3, 2, 5), 2, "srpm")


# --------------------------------------------------------------- registry
def test_register_custom_planner_and_callable_method():
    def one_column(abilities, shape, samples, *, dp=None):
        part = srpm(abilities, shape, samples, dp=1).partition
        return PlannerResult(part, 0.0, method="one-column")

    try:
        register_planner("One-Column", one_column)
        assert get_planner("one-column") is one_column
        plan = make_plan([1, 2, 3], (3, 10, 2), 30, "one-column")
        assert plan.n_columns == 1 and plan.method == "one-column"
    finally:
        PLANNERS.pop("one-column", None)
    plan = make_plan([1, 2, 3], (3, 10, 2), 30, one_column)
    assert plan.n_columns == 1
    with pytest.raises(PlanError, match="non-empty string"):
        register_planner("", one_column)


def test_register_planner_refuses_a_taken_name_unless_replace():
    def mine(abilities, shape, samples, *, dp=None):
        return srpm(abilities, shape, samples, dp=dp)

    before = dict(PLANNERS)
    with pytest.raises(PlanError, match=r"'srpm' is already registered .*replace=True"):
        register_planner("SRPM", mine)
    assert PLANNERS == before  # nothing changed
    with pytest.raises(PlanError, match="reserved for the dynamic mapping"):
        register_planner("drpm", mine)
    assert register_planner("srpm", PLANNERS["srpm"]) is before["srpm"]  # the same function again
    try:
        register_planner("srpm", mine, replace=True)
        assert get_planner("srpm") is mine
    finally:
        PLANNERS["srpm"] = before["srpm"]
    assert list(PLANNERS) == list(before)


def test_method_default_from_config():
    with dask.config.set({"rpm.planner.method": "uniform"}):
        assert make_plan([1, 2, 3, 6], (3, 10, 2), 30).method == "uniform"
    assert make_plan([1, 2, 3, 6], (3, 10, 2), 30).method == "srpm"


def test_plan_round_trips_through_dict():
    plan = make_plan(P_EX, SHAPE_EX, 1024)
    again = Plan.from_dict(plan.to_dict())
    assert again == plan


# ------------------------------------------------------------------ split-1d
def test_split_1d_one_column_per_worker_samples_by_ability():
    plan = make_plan([0.25, 0.5, 1.0, 0.25], "203-80-26", 2000, method="split-1d")
    assert plan.method == "split-1d"
    assert plan.columns == ((0,), (1,), (2,), (3,))
    for w in range(4):
        r = plan.rectangle(w)
        assert r.hidden == (0, 80)
    widths = [plan.rectangle(w).n_samples for w in range(4)]
    assert widths == [250, 500, 1000, 250]
    # no vertical exchange; horizontal exchange among all N columns
    assert plan.t_comm == pytest.approx(2 * (26 + 203) * 80 * 3)


def test_split_1d_rejects_a_different_dp_and_too_few_samples():
    with pytest.raises(PlanError, match="one column per worker"):
        make_plan([1, 1, 1], "10-8-2", 30, method="split-1d", dp=2)
    with pytest.raises(PlanError, match="fewer than the 3 workers"):
        make_plan([1, 1, 1], "10-8-2", 2, method="split-1d")


def test_fastest_grid_picks_the_n_dp_with_the_least_predicted_seconds():
    from dask_rpm.cost import predict_iteration_seconds
    from dask_rpm.planners import fastest_grid

    speeds = [1.0, 1.0, 0.25, 0.25, 1.0, 0.25]  # work units / s; N = 6: N_DP in 1, 2, 3, 6
    plan, t = fastest_grid(
        [1.0] * 6, (20, 12, 3), 60, "uniform", speeds, latency=1e-3, bandwidth=1e6
    )
    each = {
        dp: predict_iteration_seconds(
            make_plan([1.0] * 6, (20, 12, 3), 60, "uniform", dp=dp),
            speeds,
            latency=1e-3,
            bandwidth=1e6,
        )
        for dp in (1, 2, 3, 6)
    }
    assert t == min(each.values()) and plan.n_columns == min(each, key=each.get)
    with pytest.raises(PlanError, match="no N_DP"):
        fastest_grid(
            [1.0] * 4, (20, 1, 3), 1, "uniform", [1.0] * 4
        )  # 1 hidden unit, 1 sample: nothing fits


def test_minibatch_plans_choose_columns_for_one_batch():
    """An iteration exchanges partial products of one mini-batch: fewer columns pay off for small batches."""
    ab = [1.0, 0.6, 0.4, 0.25]
    full = make_plan(ab, (203, 1024, 26), 16384)
    assert full.n_columns == 2
    small = make_plan(ab, (203, 1024, 26), 16384, batch=256)
    assert small.n_columns == make_plan(ab, (203, 1024, 26), 256).n_columns == 1
    assert small.samples == 16384  # the cuts are on the whole training set
    assert make_plan(ab, (203, 1024, 26), 16384, batch=16384) == full
    assert make_plan(ab, (203, 1024, 26), 16384, batch=256, dp=2).n_columns == 2  # dp given: kept
