"""The rectangle model: round_cuts, snap_small_groups, to_integer, Plan validation."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dask_rpm.plan.partition import (
    Plan,
    PlanError,
    RealPartition,
    Rectangle,
    round_cuts,
    snap_small_groups,
    to_integer,
)
from dask_rpm.planners import make_plan

P_EX = (0.05, 0.10, 0.20, 0.30, 0.35)


def _example_partition() -> RealPartition:
    return RealPartition(
        ((0, 1, 2), (3, 4)), (0.35, 0.65), ((1 / 7, 2 / 7, 4 / 7), (0.3 / 0.65, 0.35 / 0.65))
    )


# ------------------------------------------------------------------ round_cuts
@settings(max_examples=200, deadline=None)
@given(
    fr=st.lists(st.floats(0.0, 1e6, allow_subnormal=False), min_size=1, max_size=30),
    extra=st.integers(0, 5000),
)
def test_round_cuts_sum_positive_and_close(fr, extra):
    if sum(fr) <= 0:
        fr = [1.0] * len(fr)
    total = len(fr) + extra
    sizes = round_cuts(fr, total)
    assert sum(sizes) == total
    assert all(sz >= 1 for sz in sizes)
    real = np.asarray(fr) / sum(fr) * total
    if np.all(real >= 1):  # the no-zero push cannot apply
        assert np.all(np.abs(np.asarray(sizes) - real) <= 1 + 1e-9)
        # cuts within 1/2 of the real cuts
        assert np.all(np.abs(np.cumsum(sizes) - np.cumsum(real)) <= 0.5 + 1e-6)


def test_round_cuts_pushes_zero_parts_to_one():
    assert round_cuts([0.001, 0.001, 0.998], 10) == [1, 1, 8]
    assert round_cuts([0.998, 0.001, 0.001], 10) == [8, 1, 1]
    assert round_cuts([1, 0, 1], 3) == [1, 1, 1]


def test_round_cuts_half_up():
    assert round_cuts([1, 1], 3) == [2, 1]  # cut at 1.5 -> 2
    assert round_cuts([1, 3], 2) == [1, 1]  # cut at 0.5 -> 1


def test_round_cuts_coincident_cuts_agree():
    # 0.1 + 0.2 != 0.3 in floats; both columns must still cut at the same unit.
    a = round_cuts([0.1, 0.2, 0.7], 5)
    b = round_cuts([0.3, 0.7], 5)
    assert a[0] + a[1] == b[0]  # 1.5 rounds up in both
    a = round_cuts([0.1, 0.2, 0.7], 25)
    b = round_cuts([0.3, 0.7], 25)
    assert a[0] + a[1] == b[0]  # 7.5 rounds up in both


def test_round_cuts_errors():
    with pytest.raises(PlanError, match="zero parts"):
        round_cuts([], 4)
    with pytest.raises(PlanError, match="3 parts at least one unit each out of 2"):
        round_cuts([1, 1, 1], 2)
    with pytest.raises(PlanError, match="non-negative"):
        round_cuts([1, -1], 4)
    with pytest.raises(PlanError, match="finite"):
        round_cuts([1, float("nan")], 4)
    with pytest.raises(PlanError, match="sum to more than 0"):
        round_cuts([0, 0], 4)


# ---------------------------------------------------------------- snapping
def _cuts(part: RealPartition) -> list[list[float]]:
    return [[float(v) for v in cs] for cs in part.row_cuts()]


def test_snap_worked_example_moves_the_cheaper_cut():
    part = _example_partition()
    out = snap_small_groups(part, 0.06)
    c = _cuts(out)
    # Moving column 2's cut down to 3/7 overloads P5 by 6 %; moving column 1's
    # cut up would overload P2 by 12 %. The first is chosen.
    assert c[0] == pytest.approx([1 / 7, 3 / 7])
    assert c[1] == pytest.approx([3 / 7])
    assert out.widths == part.widths and out.columns == part.columns
    assert all(abs(sum(h) - 1) < 1e-12 for h in out.heights)


def test_snap_threshold_is_inclusive_and_zero_disables():
    part = RealPartition(((0, 1), (2, 3)), (0.5, 0.5), ((0.5, 0.5), (0.56, 0.44)))
    c = _cuts(snap_small_groups(part, 0.06))
    # Moving column 1 up overloads P1 by 12 %, moving column 2 down P4 by 13.6 %.
    assert c == [[0.56], [0.56]]
    assert _cuts(snap_small_groups(part, 0.059)) == _cuts(part)
    assert snap_small_groups(part, 0.0) is part
    assert snap_small_groups(part, -1.0) is part


def test_snap_leaves_a_band_that_is_a_whole_rectangle():
    # Column 1 cuts at 0.50 and 0.52 (its middle worker is thin); column 2 at 0.51.
    # One of the bands 0.50-0.51 / 0.51-0.52 goes; what remains between 0.50
    # and 0.52 is P2's own rectangle, which cannot go without emptying it.
    part = RealPartition(((0, 1, 2), (3, 4)), (0.5, 0.5), ((0.5, 0.02, 0.48), (0.51, 0.49)))
    out = snap_small_groups(part, 0.06)
    c = _cuts(out)
    assert len({round(v, 12) for cs in c for v in cs}) == 2
    assert all(h > 0 for hs in out.heights for h in hs)
    assert c[0][1] - c[0][0] <= 0.02 + 1e-12  # the thin rectangle is still there


def test_snap_is_all_or_nothing():
    # Position 0.52 is a cut of columns 2 and 3; column 3 also cuts at 0.50,
    # so 0.52 cannot move down there. Moving only column 2 would keep the band,
    # so nothing may move down; moving 0.50 (columns 1 and 3) up is blocked the
    # same way. Before the fix column 2 alone was moved for nothing.
    part = RealPartition(
        ((0, 1), (2, 3), (4, 5, 6)),
        (0.3, 0.3, 0.4),
        ((0.5, 0.5), (0.52, 0.48), (0.5, 0.02, 0.48)),
    )
    out = snap_small_groups(part, 0.06)
    assert out.heights == part.heights


def test_snap_thinnest_band_first_and_bounded_displacement():
    # Cuts at 0.40 (col 1), 0.45 (col 2), 0.47 (col 3): the 0.02 band goes first.
    part = RealPartition(
        ((0, 1), (2, 3), (4, 5)),
        (0.3, 0.3, 0.4),
        ((0.40, 0.60), (0.45, 0.55), (0.47, 0.53)),
    )
    out = snap_small_groups(part, 0.06)
    c = [cs[0] for cs in _cuts(out)]
    assert len({round(v, 9) for v in c}) == 1 or c[1] == pytest.approx(c[2])
    for a, b in zip(c, [0.40, 0.45, 0.47]):
        assert abs(a - b) <= 0.06 + 1e-12


@st.composite
def partitions(draw):
    n_cols = draw(st.integers(2, 6))
    cols, widths, heights, w = [], [], [], 0
    for _ in range(n_cols):
        k = draw(st.integers(1, 6))
        hs = draw(st.lists(st.floats(0.01, 1.0), min_size=k, max_size=k))
        tot = sum(hs)
        cols.append(tuple(range(w, w + k)))
        w += k
        heights.append(tuple(h / tot for h in hs))
        widths.append(draw(st.floats(0.05, 1.0)))
    tw = sum(widths)
    return RealPartition(tuple(cols), tuple(x / tw for x in widths), tuple(heights))


@settings(max_examples=150, deadline=None)
@given(part=partitions(), a=st.sampled_from([0.02, 0.06, 0.1]))
def test_snap_properties(part, a):
    out = snap_small_groups(part, a)
    assert out.columns == part.columns and out.widths == part.widths
    before, after = _cuts(part), _cuts(out)
    for cb, ca in zip(before, after):
        assert len(cb) == len(ca)
        for x, y in zip(cb, ca):
            assert abs(x - y) <= a + 1e-9  # no cut moves further than the threshold
        assert all(h > 0 for h in np.diff([0.0, *ca, 1.0]))  # no empty rectangle
    # never more bands than before
    distinct = lambda cs: len({round(v, 12) for c in cs for v in c})  # noqa: E731
    assert distinct(after) <= distinct(before)
    # Every band left that is thin is un-removable: some column cuts at both
    # edges, or moving either edge would displace a cut by more than a.
    pos = sorted({round(v, 12) for c in after for v in c})
    for lo, hi in zip(pos[:-1], pos[1:]):
        if hi - lo <= a - 1e-9:
            cols_lo = {i for i, c in enumerate(after) if any(abs(v - lo) < 1e-9 for v in c)}
            cols_hi = {i for i, c in enumerate(after) if any(abs(v - hi) < 1e-9 for v in c)}
            if cols_lo & cols_hi:
                continue
            orig = {
                (i, j): before[i][j]
                for i, c in enumerate(after)
                for j, v in enumerate(c)
                if abs(v - lo) < 1e-9
            }
            orig_hi = {
                (i, j): before[i][j]
                for i, c in enumerate(after)
                for j, v in enumerate(c)
                if abs(v - hi) < 1e-9
            }
            down_blocked = any(abs(lo - o) > a + 1e-12 for o in orig_hi.values())
            up_blocked = any(abs(hi - o) > a + 1e-12 for o in orig.values())
            assert down_blocked and up_blocked, (lo, hi)


def test_snapped_cuts_stay_aligned_after_rounding():
    part = snap_small_groups(_example_partition(), 0.06)
    plan = to_integer(part, abilities=P_EX, shape=(203, 80, 26), samples=1024, method="srpm")
    assert plan.rectangle(2).hidden[0] == plan.rectangle(4).hidden[0] == 34
    assert len(plan.bands()) == 3
    assert plan.holders((34, 80)) == [2, 4]


# --------------------------------------------------------------- to_integer
def test_to_integer_worked_example():
    plan = to_integer(
        _example_partition(), abilities=P_EX, shape=(203, 80, 26), samples=1024, method="x"
    )
    assert [plan.column_samples(c) for c in range(2)] == [(0, 358), (358, 1024)]
    assert [plan.rectangle(w).hidden for w in (0, 1, 2)] == [(0, 11), (11, 34), (34, 80)]
    assert [plan.rectangle(w).hidden for w in (3, 4)] == [(0, 37), (37, 80)]
    assert plan.imbalance() == pytest.approx(
        max(plan.rectangle(w).area / (1024 * 80) / P_EX[w] for w in range(5))
    )


def test_to_integer_errors():
    part = _example_partition()
    with pytest.raises(PlanError, match="samples=1 is fewer than the 2 columns"):
        to_integer(part, abilities=P_EX, shape=(3, 80, 2), samples=1, method="x")
    with pytest.raises(PlanError, match="column 0 has 3 workers but the network has only hidden=2"):
        to_integer(part, abilities=P_EX, shape=(3, 2, 2), samples=100, method="x")


def test_real_partition_checks_lengths():
    with pytest.raises(PlanError, match="one entry per column"):
        RealPartition(((0,), (1,)), (1.0,), ((1.0,), (1.0,)))
    with pytest.raises(PlanError, match="has 1 heights; expected 2"):
        RealPartition(((0, 1),), (1.0,), ((1.0,),))


# ----------------------------------------------------------- Plan.validate
def _plan(rects, columns=((0, 1), (2,)), s=10, m=4):
    return Plan("t", (1 / 3,) * 3, (2, m, 1), s, columns, tuple(rects))


def test_validate_accepts_exact_tiling():
    p = _plan(
        [
            Rectangle(0, 0, (0, 5), (0, 2)),
            Rectangle(1, 0, (0, 5), (2, 4)),
            Rectangle(2, 1, (5, 10), (0, 4)),
        ]
    )
    assert p.validate() is p
    assert p.bands() == [(0, 2), (2, 4)]
    assert p.holders((2, 4)) == [1, 2]


@pytest.mark.parametrize(
    "rects,match",
    [
        (
            [
                Rectangle(0, 0, (0, 5), (0, 2)),
                Rectangle(1, 0, (0, 5), (3, 4)),
                Rectangle(2, 1, (5, 10), (0, 4)),
            ],
            "starts at hidden unit 3; expected 2",
        ),
        (
            [
                Rectangle(0, 0, (0, 5), (0, 2)),
                Rectangle(1, 0, (0, 6), (2, 4)),
                Rectangle(2, 1, (5, 10), (0, 4)),
            ],
            "column-fixed",
        ),
        (
            [
                Rectangle(0, 0, (0, 5), (0, 2)),
                Rectangle(1, 0, (0, 5), (2, 4)),
                Rectangle(2, 1, (6, 10), (0, 4)),
            ],
            "starts at sample 6; expected 5",
        ),
        (
            [
                Rectangle(0, 0, (0, 5), (0, 2)),
                Rectangle(1, 0, (0, 5), (2, 3)),
                Rectangle(2, 1, (5, 10), (0, 4)),
            ],
            r"covers hidden units \[0, 3\)",
        ),
        (
            [
                Rectangle(0, 0, (0, 5), (0, 2)),
                Rectangle(1, 0, (0, 5), (2, 4)),
                Rectangle(2, 1, (5, 9), (0, 4)),
            ],
            r"cover samples \[0, 9\)",
        ),
        (
            [
                Rectangle(0, 0, (0, 5), (0, 0)),
                Rectangle(1, 0, (0, 5), (0, 4)),
                Rectangle(2, 1, (5, 10), (0, 4)),
            ],
            "must be non-empty",
        ),
        (
            [
                Rectangle(0, 0, (0, 5), (0, 2)),
                Rectangle(0, 0, (0, 5), (2, 4)),
                Rectangle(2, 1, (5, 10), (0, 4)),
            ],
            "more than one rectangle",
        ),
    ],
)
def test_validate_rejects(rects, match):
    with pytest.raises(PlanError, match=match):
        _plan(rects).validate()


def test_from_dict_round_trip_and_with_workers():
    plan = to_integer(
        _example_partition(), abilities=P_EX, shape=(203, 80, 26), samples=1024, method="x"
    )
    assert Plan.from_dict(plan.to_dict()) == plan
    bound = plan.with_workers([f"w{i}" for i in range(5)])
    assert bound.workers == ("w0", "w1", "w2", "w3", "w4")
    with pytest.raises(PlanError, match="5 workers but 2 addresses"):
        plan.with_workers(["a", "b"])


def test_band_groups_merge_the_bands_of_the_same_holders_in_band_order():
    for method, n in [("srpm", 7), ("split-1d", 5), ("grid-h", 6), ("srpm-time", 9)]:
        plan = make_plan(np.linspace(0.2, 1.0, n), (10, 40, 3), 300, method)
        expect: dict[tuple[int, ...], list[tuple[int, int]]] = {}
        for band in plan.bands():
            expect.setdefault(tuple(plan.holders(band)), []).append(band)
        assert plan.band_groups() == list(expect.items()), method
        covered = sorted(b for _, bands in plan.band_groups() for b in bands)
        assert covered == plan.bands()
