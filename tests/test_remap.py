"""Column and whole remaps, weight-row migration and sample changes (DRPM)."""

from __future__ import annotations

import dask.config
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dask_rpm.drpm.remap import (
    MigrationError,
    SampleChange,
    Transfer,
    ability_vector,
    column_remap,
    migration,
    migration_bytes,
    migration_seconds,
    sample_changes,
    whole_remap,
)
from dask_rpm.plan.partition import Plan, PlanError
from dask_rpm.planners import make_plan

SHAPE = (7, 40, 3)  # n, m, l
ROW = (7 + 3) * 8  # bytes of one hidden unit's W row + V column in float64


def _plan(columns, samples, hidden, *, abilities=None, shape=SHAPE, workers=None, **kw):
    plan = Plan.from_columns(
        columns, samples, hidden, abilities=abilities, shape=shape, method="test", **kw
    )
    return plan.with_workers(workers) if workers is not None else plan


def _compositions(draw, total, k):
    cuts = sorted(
        draw(st.lists(st.integers(1, total - 1), min_size=k - 1, max_size=k - 1, unique=True))
    )
    return list(np.diff([0, *cuts, total]))


@st.composite
def plans(draw, workers=None, m=SHAPE[1], s=50):
    """A random column-fixed plan; ``workers`` = indices to use (default 0..N-1)."""
    if workers is None:
        workers = list(range(draw(st.integers(1, 6))))
    order = draw(st.permutations(workers))
    n = len(order)
    n_cols = draw(st.integers(1, n))
    sizes = _compositions(draw, n, n_cols) if n_cols > 1 else [n]
    edges = np.cumsum([0, *sizes])
    columns = [list(order[a:b]) for a, b in zip(edges[:-1], edges[1:])]
    samples = _compositions(draw, s, n_cols) if n_cols > 1 else [s]
    hidden = [_compositions(draw, m, len(c)) if len(c) > 1 else [m] for c in columns]
    n_all = max(workers) + 1
    return _plan(columns, samples, hidden, abilities=[1.0] * n_all)


def _held(plan, ids):
    """identity -> set of hidden rows held in ``plan``."""
    return {ids[r.worker]: set(range(*r.hidden)) for r in plan.rectangles}


def check_migration(old, new, transfers, lost=(), itemsize=8):
    """Brute force: every needed row arrives exactly once, from a live holder, with the minimum bytes."""
    by_addr = old.workers is not None and new.workers is not None
    oid = list(old.workers) if by_addr else list(range(len(old.abilities)))
    nid = list(new.workers) if by_addr else list(range(len(new.abilities)))
    gone = set(lost) | (set(oid) - set(nid))
    held = _held(old, oid)
    row_bytes = (new.n + new.l) * itemsize
    minimum = 0
    got: dict = {}
    for t in transfers:
        assert t.rows[0] < t.rows[1]
        assert t.nbytes == (t.rows[1] - t.rows[0]) * row_bytes
        assert t.src != t.dst
        assert t.src not in gone, f"lost worker {t.src} used as a source"
        rows = set(range(*t.rows))
        assert rows <= held[t.src], f"{t.src} sends rows it never held"
        assert not (rows & got.setdefault(t.dst, set())), "a row arrives twice"
        got[t.dst] |= rows
    for r in new.rectangles:
        dst = nid[r.worker]
        need = set(range(*r.hidden))
        local = held.get(dst, set()) & need if dst not in gone else set()
        arrived = got.get(dst, set())
        assert not (arrived & local), "a locally held row was sent"
        assert arrived | local == need, f"{dst} misses rows {sorted(need - arrived - local)}"
        minimum += len(need - local) * row_bytes
    assert set(got) <= {nid[w] for w in new.planned_workers}
    assert migration_bytes(transfers) == minimum


# ------------------------------------------------------------------- abilities
def test_ability_vector_forms():
    plan = _plan(
        [[0, 1], [2]], [20, 30], [[10, 30], [40]], abilities=[1, 1, 2], workers=["a", "b", "c"]
    )
    np.testing.assert_array_equal(ability_vector(plan, [3, 4, 5]), [3, 4, 5])
    np.testing.assert_array_equal(ability_vector(plan, {0: 3, 1: 4, 2: 5}), [3, 4, 5])
    np.testing.assert_array_equal(ability_vector(plan, {"a": 3, "b": 4, "c": 5}), [3, 4, 5])
    with pytest.raises(PlanError, match="need 3 abilities"):
        ability_vector(plan, [1, 2])
    with pytest.raises(PlanError, match="no ability for planned"):
        ability_vector(plan, {"a": 1, "b": 1})
    with pytest.raises(PlanError, match="unknown worker"):
        ability_vector(plan, {"a": 1, "b": 1, "c": 1, "zz": 1})
    with pytest.raises(PlanError, match="positive finite"):
        ability_vector(plan, [1, 0, 1])


def test_ability_vector_fills_excluded_worker():
    # Worker 3 is excluded (too slow for one unit); an estimator never sees it.
    plan = _plan([[0, 1], [2]], [20, 30], [[10, 30], [40]], abilities=[1, 1, 2, 0.4], excluded=(3,))
    vec = ability_vector(plan, {0: 10.0, 1: 10.0, 2: 20.0})
    # It keeps its old size relative to the planned workers: 0.4 : 4 = x : 40.
    assert vec[3] == pytest.approx(4.0)


# --------------------------------------------------------------- column remap
def test_column_remap_keeps_structure_and_follows_abilities():
    plan = _plan([[0, 1], [2, 3, 4]], [40, 60], [[20, 20], [10, 10, 20]], workers=list("abcde"))
    new = column_remap(plan, [1, 3, 1, 1, 2], small_group=0)
    assert new.columns == plan.columns
    assert new.workers == plan.workers
    assert new.method == plan.method and new.notes[-1] == "column remap"
    # Column widths 4:4 of 100 samples; heights 1:3 and 1:1:2 of 40 units.
    assert [new.column_samples(c) for c in range(2)] == [(0, 50), (50, 100)]
    assert [new.rectangle(w).hidden for w in (0, 1)] == [(0, 10), (10, 40)]
    assert [new.rectangle(w).hidden for w in (2, 3, 4)] == [(0, 10), (10, 20), (20, 40)]
    assert new.imbalance() == pytest.approx(1.0)


def test_column_remap_uses_configured_small_group():
    plan = _plan([[0, 1], [2, 3]], [50, 50], [[20, 20], [20, 20]])
    ab = [1.0, 1.0, 0.9, 1.1]  # cuts at 20 and 18: a 2-unit band (0.05 of m)
    assert len(column_remap(plan, ab, small_group=0).bands()) == 3
    snapped = column_remap(plan, ab)  # default rpm.planner.small-group = 0.06
    assert len(snapped.bands()) == 2
    with dask.config.set({"rpm.planner.small-group": 0.0}):
        assert len(column_remap(plan, ab).bands()) == 3


def test_column_remap_keeps_excluded():
    plan = _plan(
        [[0, 1], [2]], [20, 30], [[10, 30], [40]], abilities=[1, 1, 2, 0.01], excluded=(3,)
    )
    new = column_remap(plan, {0: 1.0, 1: 2.0, 2: 3.0})
    assert new.excluded == (3,) and new.columns == plan.columns


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_column_remap_property(data):
    plan = data.draw(plans())
    ab = data.draw(
        st.lists(st.floats(0.2, 1.0), min_size=len(plan.abilities), max_size=len(plan.abilities))
    )
    new = column_remap(plan, ab, small_group=0).validate()
    assert new.columns == plan.columns and new.samples == plan.samples and new.shape == plan.shape
    p = np.asarray(ab) / sum(ab)
    for c, col in enumerate(new.columns):
        width = sum(p[w] for w in col)
        s0, s1 = new.column_samples(c)
        assert abs((s1 - s0) - width * new.samples) <= 1
        for w in col:
            assert abs(new.rectangle(w).n_hidden - p[w] / width * new.m) <= 1
    check_migration(plan, new, migration(plan, new))


# ------------------------------------------------------------------ migration
def test_column_remap_moves_rows_between_vertical_neighbours_only():
    plan = _plan([[0, 1, 2], [3, 4]], [30, 20], [[10, 15, 15], [20, 20]])
    new = column_remap(plan, [1.2, 1.0, 0.8, 1.0, 1.3], small_group=0)
    moves = migration(plan, new)
    assert moves  # the cuts did move
    pos = {w: (c, i) for c, col in enumerate(plan.columns) for i, w in enumerate(col)}
    for t in moves:
        (cs, i), (cd, j) = pos[t.src], pos[t.dst]
        assert cs == cd and abs(i - j) == 1, t
    check_migration(plan, new, moves)


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_column_remap_migration_stays_in_column(data):
    plan = data.draw(plans())
    ab = data.draw(
        st.lists(st.floats(0.2, 1.0), min_size=len(plan.abilities), max_size=len(plan.abilities))
    )
    new = column_remap(plan, ab, small_group=0)
    moves = migration(plan, new)
    check_migration(plan, new, moves)
    pos = {w: (c, i) for c, col in enumerate(plan.columns) for i, w in enumerate(col)}
    for t in moves:
        (cs, i), (cd, j) = pos[t.src], pos[t.dst]
        assert cs == cd  # always inside the column
        # Adjacent whenever no new range reaches past a neighbour's whole old rectangle.
        col = plan.columns[cd]
        near = set()
        for k in (j - 1, j, j + 1):
            if 0 <= k < len(col):
                near |= set(range(*plan.rectangle(col[k]).hidden))
        if set(range(*new.rectangle(t.dst).hidden)) <= near:
            assert abs(i - j) == 1


def test_column_remap_far_move_still_inside_column():
    # Heights 4:4:32 -> 32:4:4: worker 0 now needs rows that worker 2 held.
    plan = _plan([[0, 1, 2]], [10], [[4, 4, 32]])
    new = column_remap(plan, [8, 1, 1], small_group=0)
    moves = migration(plan, new)
    assert Transfer(2, 0, (8, 32), 24 * ROW) in moves
    check_migration(plan, new, moves)


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_migration_minimum_bytes_random_plans(data):
    n = data.draw(st.integers(1, 6))
    old = data.draw(plans(workers=list(range(n))))
    new = data.draw(plans(workers=list(range(n))))
    itemsize = data.draw(st.sampled_from([4, 8]))
    moves = migration(old, new, itemsize)
    check_migration(old, new, moves, itemsize=itemsize)
    # Deterministic.
    assert migration(old, new, itemsize) == moves


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_migration_lost_and_new_workers_random(data):
    n_old = data.draw(st.integers(1, 5))
    old_names = [f"tcp://old{i}" for i in range(n_old)]
    old = data.draw(plans(workers=list(range(n_old)))).with_workers(old_names)
    keep = data.draw(st.lists(st.sampled_from(old_names), unique=True, max_size=n_old))
    fresh = [f"tcp://new{i}" for i in range(data.draw(st.integers(0 if keep else 1, 3)))]
    names = [*keep, *fresh]
    new = data.draw(plans(workers=list(range(len(names))))).with_workers(names)
    lost = set(old_names) - set(keep)
    # Rows whose every old holder is gone cannot be rebuilt.
    orphan = any(
        all(
            old.workers[r.worker] in lost
            for r in old.rectangles
            if r.hidden[0] <= row < r.hidden[1]
        )
        for row in range(old.m)
    )
    if orphan:
        with pytest.raises(MigrationError, match="checkpoint"):
            migration(old, new)
    else:
        moves = migration(old, new)
        check_migration(old, new, moves, lost=lost)
        for name in fresh:  # a newcomer receives its whole range
            r = new.rectangle(names.index(name))
            assert sum(t.n_rows for t in moves if t.dst == name) == r.n_hidden


def test_migration_identity_is_empty():
    plan = _plan([[0, 1], [2]], [20, 30], [[10, 30], [40]])
    assert migration(plan, plan) == []
    assert sample_changes(plan, plan) == []


def test_migration_prefers_destination_old_column():
    # Worker 1 moves from 30 rows to 20 in column 0; worker 0 grows and must
    # take rows 10..20 - held by worker 1 (its column) and worker 2 (column 1).
    old = _plan([[0, 1], [2]], [20, 30], [[10, 30], [40]])
    new = _plan([[0, 1], [2]], [20, 30], [[20, 20], [40]])
    assert migration(old, new) == [Transfer(1, 0, (10, 20), 10 * ROW)]


def test_new_worker_gets_everything_with_fewest_messages_and_spread_load():
    a, b, c, d = "tcp://a", "tcp://b", "tcp://c", "tcp://d"
    old = _plan([[0], [1]], [25, 25], [[40], [40]], workers=[a, b])
    new = _plan(
        [[0], [1], [2], [3]], [10, 10, 15, 15], [[40], [40], [40], [40]], workers=[a, b, c, d]
    )
    moves = migration(old, new)
    # Each newcomer needs the whole model; both old columns hold it whole, so
    # one message each, and the second newcomer is served by the idle source.
    assert moves == [Transfer(a, c, (0, 40), 40 * ROW), Transfer(b, d, (0, 40), 40 * ROW)]
    check_migration(old, new, moves)
    assert sample_changes(old, new) == [
        SampleChange(a, (0, 25), (0, 10)),
        SampleChange(b, (25, 50), (10, 20)),
        SampleChange(c, None, (20, 35)),
        SampleChange(d, None, (35, 50)),
    ]


def _min_cover(holder_ranges, a, b):
    """Brute force: fewest intervals (from the given ones) covering [a, b) when sliced to it."""
    best = {a: 0}
    for x in range(a, b):
        if x not in best:
            continue
        for s0, s1 in holder_ranges:
            if s0 <= x < s1:
                y = min(s1, b)
                best[y] = min(best.get(y, 10**9), best[x] + 1)
    return best[b]


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_newcomer_message_count_is_minimal(data):
    n = data.draw(st.integers(1, 5))
    old = data.draw(plans(workers=list(range(n))))
    # One newcomer (index n) alone in the last column of the new plan.
    new = _plan(
        [[*range(n)], [n]],
        [30, 20],
        [[*_compositions(data.draw, SHAPE[1], n)] if n > 1 else [40], [40]],
        abilities=[1.0] * (n + 1),
    )
    moves = [t for t in migration(old, new) if t.dst == n]
    ranges = [r.hidden for r in old.rectangles]
    assert len(moves) == _min_cover(ranges, 0, SHAPE[1])
    check_migration(old, new, migration(old, new))


def test_lost_worker_is_not_a_source():
    a, b, c, d = "tcp://a", "tcp://b", "tcp://c", "tcp://d"
    old = _plan([[0, 1], [2, 3]], [25, 25], [[20, 20], [10, 30]], workers=[a, b, c, d])
    # b is gone; the survivors re-plan into a single row of columns.
    new = _plan([[0], [1], [2]], [20, 15, 15], [[40], [40], [40]], workers=[a, c, d])
    moves = migration(old, new)
    assert all(t.src != b for t in moves)
    check_migration(old, new, moves, lost=[b])
    # a needs rows 20..40 (b's): its own column lost them, so column 1 supplies
    # them - c holds 10..20 (not needed) and d holds 10..40.
    assert [t for t in moves if t.dst == a] == [Transfer(d, a, (20, 40), 20 * ROW)]


def test_lost_by_index_and_back_in_plan():
    old = _plan([[0, 1], [2]], [20, 30], [[10, 30], [40]])
    new = _plan([[0, 2], [1]], [20, 30], [[20, 20], [40]])
    with pytest.raises(PlanError, match="cannot be planned"):
        migration(old, new, lost=[1])
    new2 = _plan([[0], [2]], [20, 30], [[40], [40]], abilities=[1, 1, 1], excluded=(1,))
    moves = migration(old, new2, lost=[1])
    check_migration(old, new2, moves, lost=[1])
    assert {t.src for t in moves} == {2}


def test_single_column_lost_worker_needs_checkpoint():
    a, b, c = "tcp://a", "tcp://b", "tcp://c"
    old = _plan([[0, 1, 2]], [50], [[10, 10, 20]], workers=[a, b, c])
    new = _plan([[0, 1]], [50], [[20, 20]], workers=[a, c])
    with pytest.raises(MigrationError, match="checkpoint"):
        migration(old, new)


def test_migration_rejects_shape_change():
    old = _plan([[0]], [10], [[40]])
    new = _plan([[0]], [10], [[40]], shape=(8, 40, 3))
    with pytest.raises(PlanError, match="shapes"):
        migration(old, new)


# ---------------------------------------------------------------- cost helpers
def test_migration_bytes_and_seconds():
    moves = [
        Transfer(0, 1, (0, 10), 800),
        Transfer(0, 2, (10, 20), 800),
        Transfer(3, 1, (20, 25), 400),
    ]
    assert migration_bytes(moves) == 2000
    assert migration_seconds(moves, latency=0.01, bandwidth=1000.0) == pytest.approx(2.0 + 0.03)
    # Concurrent: worker 0 sends 1600 bytes in 2 messages; worker 1 receives 1200 in 2.
    assert migration_seconds(
        moves, latency=0.01, bandwidth=1000.0, concurrent=True
    ) == pytest.approx(1.62)
    assert migration_seconds([], latency=1, bandwidth=1) == 0.0
    with dask.config.set({"rpm.cost.latency": 0.5, "rpm.cost.bandwidth": 100.0}):
        assert migration_seconds(moves) == pytest.approx(20 + 1.5)
    with pytest.raises(ValueError):
        migration_seconds(moves, bandwidth=0)


def test_migration_itemsize_from_config():
    old = _plan([[0, 1]], [10], [[20, 20]])
    new = _plan([[0, 1]], [10], [[10, 30]])
    with dask.config.set({"rpm.cost.itemsize": 4}):
        assert migration(old, new) == [Transfer(0, 1, (10, 20), 10 * (7 + 3) * 4)]


def test_sample_changes_column_remap():
    plan = _plan([[0, 1], [2]], [20, 30], [[10, 30], [40]])
    new = column_remap(plan, [1, 1, 1], small_group=0)  # widths 2:1 of 50 -> 33 / 17
    ch = sample_changes(plan, new)
    assert ch == [
        SampleChange(0, (0, 20), (0, 33)),
        SampleChange(1, (0, 20), (0, 33)),
        SampleChange(2, (20, 50), (33, 50)),
    ]


# ---------------------------------------------------------------- whole remap
def _planners():
    return pytest.importorskip("dask_rpm.planners", exc_type=ImportError)


def test_whole_remap_replans_with_srpm():
    _planners()
    ws = [f"tcp://w{i}" for i in range(5)]
    plan = _plan([[0, 1, 2, 3, 4]], [1024], [[16] * 5], shape=(203, 80, 26), workers=ws)
    ab = [0.05, 0.10, 0.20, 0.30, 0.35]
    new = whole_remap(plan, ab).validate()
    assert new.method == "srpm" and new.notes[-1] == "whole remap"
    assert new.workers == tuple(ws)
    # The paper's worked example (docs/method.md §5): C = 2, k = (3, 2).
    assert [len(c) for c in new.columns] == [3, 2]
    check_migration(plan, new, migration(plan, new))
    # Same answer from an address-keyed mapping.
    again = whole_remap(plan, dict(zip(ws, ab)))
    assert again.columns == new.columns and again.workers == new.workers


def test_whole_remap_index_keyed_mapping_in_any_order_keeps_each_workers_ability():
    """The estimator returns {worker index: ability} in column order, not index order."""
    _planners()
    ws = [f"tcp://w{i}" for i in range(4)]
    plan = _plan([[2, 3], [0, 1]], [40, 60], [[20, 20], [20, 20]], workers=ws)
    measured = {2: 0.216, 3: 0.216, 0: 0.43, 1: 0.143}  # insertion order = plan.planned_workers
    new = whole_remap(plan, measured).validate()
    assert new.workers == tuple(ws)
    np.testing.assert_allclose(
        np.asarray(new.abilities) / sum(new.abilities),
        [measured[w] / sum(measured.values()) for w in range(4)],
    )
    # every worker's area follows its own ability
    areas = [new.rectangle(w).n_samples * new.rectangle(w).n_hidden for w in range(4)]
    assert areas.index(max(areas)) == 0 and areas.index(min(areas)) == 1


def test_whole_remap_after_losing_a_worker():
    _planners()
    ws = [f"tcp://w{i}" for i in range(4)]
    plan = _plan([[0, 1], [2, 3]], [50, 50], [[20, 20], [20, 20]], workers=ws)
    survivors = {ws[0]: 1.0, ws[2]: 2.0, ws[3]: 3.0}
    new = whole_remap(plan, survivors).validate()
    assert new.workers == (ws[0], ws[2], ws[3])
    check_migration(plan, new, migration(plan, new), lost=[ws[1]])


def _column_t1(plan, true):
    """Modelled t1 per worker: wait for the column's slowest forward, then own backward.

    Forward and backward are half the work each (as for n >> l); the model has no
    communication, so the wait is the only difference between t1 and tc.
    """
    out = {}
    for col in plan.columns:
        slowest = max(plan.rectangle(w).area / true[w] / 2 for w in col)
        for w in col:
            out[w] = slowest + plan.rectangle(w).area / true[w] / 2
    return out


def test_column_remap_on_t1_stops_short_of_balance_and_tc_reaches_it():
    """Why rpm.drpm.column-times defaults to tc: t1 feeds the column's wait back into the speeds.

    A 3x step of one worker in a two-column plan: column remaps planned on t1
    speeds approach balance only geometrically, and the paper's T_line = 0.8
    stops them while the plan is still more than 10 % slower than balanced; one
    remap on the wait-free compute speeds (tc) is balanced at once.
    """
    from dask_rpm.drpm.policy import imbalance_ratio, predict_step_seconds

    plan = make_plan([1.0, 1.0, 0.5, 0.5], (257, 384, 16), 4096, "srpm")
    assert len(plan.columns) == 2
    true = [1.0, 1.0 / 3.0, 0.5, 0.5]
    best = predict_step_seconds(column_remap(plan, true), true)
    p = plan
    for _ in range(10):  # the paper's rule with t1 speeds
        t1 = _column_t1(p, true)
        if imbalance_ratio(t1) >= 0.8:
            break
        p = column_remap(p, {w: p.rectangle(w).area / t for w, t in t1.items()})
    assert predict_step_seconds(p, true) > 1.10 * best
    tc = {w: plan.rectangle(w).area / true[w] for w in plan.planned_workers}
    one = column_remap(plan, {w: plan.rectangle(w).area / t for w, t in tc.items()})
    assert predict_step_seconds(one, true) == pytest.approx(best, rel=1e-3)
    assert imbalance_ratio(_column_t1(one, true)) > 0.95
