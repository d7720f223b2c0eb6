"""Exchange schedules: simulated in-process, every holder gets identical bits equal to the column-order sum."""

from __future__ import annotations

import numpy as np
import pytest
from schedules_reference import choose, execute, horizontal_schedules, vertical_schedule

from dask_rpm.comm import Interconnect, LinkClass, collective_seconds, schedule_seconds
from dask_rpm.comm.exchange import ALGORITHMS, build
from dask_rpm.plan.partition import Plan
from dask_rpm.planners import make_plan

EXACT = ("allgather", "gather", "direct")  # sum strictly in column order


def _column_order_sum(contrib: dict[int, np.ndarray], holders: list[int]) -> np.ndarray:
    acc = contrib[holders[0]].copy()
    for w in holders[1:]:
        acc = acc + contrib[w]
    return acc


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("q", [1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 16, 17])
@pytest.mark.parametrize("size", [0, 1, 3, 40, 1001])
def test_every_holder_gets_identical_bits_equal_to_the_column_order_sum(algorithm, q, size):
    rng = np.random.default_rng(q * 1000 + size)
    holders = [int(w) for w in rng.permutation(100)[:q]]  # worker ids, not positions
    # values of very different magnitude: a different summation order shows in the last bits
    contrib = {w: rng.normal(size=size) * 10.0 ** rng.integers(-6, 6, size=size) for w in holders}
    before = {w: c.copy() for w, c in contrib.items()}
    out = execute(build(algorithm, holders, size), contrib)
    ref = _column_order_sum(contrib, holders)
    first = out[holders[0]]
    for w in holders:
        assert out[w].tobytes() == first.tobytes(), f"{algorithm}: holder {w} differs"
    if algorithm in EXACT:
        assert first.tobytes() == ref.tobytes()
    else:
        np.testing.assert_allclose(
            first, ref, rtol=1e-12, atol=1e-12 * np.abs(ref).max(initial=1.0)
        )
    for w in holders:  # inputs untouched
        assert np.array_equal(contrib[w], before[w])


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_gather_leader_position_and_round_structure(algorithm):
    s = build(algorithm, [4, 7, 1, 9], 64)
    assert all(t.src != t.dst and 0 <= t.lo < t.hi <= 64 for r in s.rounds for t in r)
    rounds = {"allgather": 1, "gather": 2, "direct": 2, "ring": 6, "tree": 4, "halving": 4}
    assert len(s.rounds) == rounds[algorithm]
    g = build("gather", [4, 7, 1, 9], 64, leader=2)
    assert {t.dst for t in g.rounds[0]} == {1} and {t.src for t in g.rounds[1]} == {1}


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("q", [2, 3, 4, 5, 8, 12, 16])
def test_closed_form_matches_the_schedule_rounds(algorithm, q):
    net = Interconnect(latency=1e-3, bandwidth=1e6, overhead=1e-4)
    size = q * 64 * 3  # divisible by every chunking used
    s = build(algorithm, list(range(q)), size)
    closed = collective_seconds(
        "leader" if algorithm == "gather" else algorithm, q, size * 8, LinkClass(1e-3, 1e6), 1e-4
    )
    assert schedule_seconds(s, net) == pytest.approx(closed, rel=1e-12)


def test_choose_latency_bound_tree_bandwidth_bound_ring_or_halving():
    slow_msgs = LinkClass(latency=1e-3, bandwidth=1e12)
    assert choose(64, 1e3, slow_msgs, overhead=1e-4) == "tree"
    fat = LinkClass(latency=1e-6, bandwidth=1e6)
    assert choose(6, 1e9, fat, overhead=1e-5) in ("ring", "direct")
    assert choose(64, 1e9, fat, overhead=1e-5) in ("ring", "halving")
    # the choice is the cheapest of the scalable ones
    for q, b in [(3, 1e4), (16, 1e7), (100, 1e5)]:
        link = LinkClass(1e-4, 1e9)
        best = min(
            ("tree", "halving", "ring", "direct"), key=lambda a: collective_seconds(a, q, b, link)
        )
        assert collective_seconds(choose(q, b, link), q, b, link) == collective_seconds(
            best, q, b, link
        )


def test_bad_arguments():
    with pytest.raises(ValueError, match="unknown exchange algorithm 'bcast'"):
        build("bcast", [0, 1], 4)
    with pytest.raises(ValueError, match="must be distinct"):
        build("ring", [0, 0], 4)
    with pytest.raises(ValueError, match="leader=5"):
        build("gather", [0, 1], 4, leader=5)
    with pytest.raises(ValueError, match="contributes 3 elements"):
        execute(build("ring", [0, 1], 4), {0: np.zeros(4), 1: np.zeros(3)})


def test_plan_schedules_cover_every_row_once_and_reduce_exactly():
    plan = make_plan([0.05, 0.10, 0.20, 0.30, 0.35], (203, 80, 26), 1024, small_group=0)
    n, m, l = plan.shape
    net = Interconnect(latency=1e-4, bandwidth=1e9)
    bands = horizontal_schedules(plan, net)
    covered = sorted(r for b in bands for r in b.rows)
    assert covered[0][0] == 0 and covered[-1][1] == m
    assert all(a[1] == b[0] for a, b in zip(covered[:-1], covered[1:]))
    rng = np.random.default_rng(0)
    dW = {
        w: rng.normal(size=(m, n)) for w in plan.planned_workers
    }  # full-size stand-ins for each worker's update
    dV = {w: rng.normal(size=(l, m)) for w in plan.planned_workers}
    for b in bands:
        assert len(b.holders) == plan.n_columns
        for w, (a, z) in zip(b.holders, b.rows[:1]):
            r = plan.rectangle(w).hidden
            assert r[0] <= a and z <= r[1]
        pack = {
            w: np.concatenate(
                [
                    np.concatenate([dW[w][a:z].ravel() for a, z in b.rows]),
                    np.concatenate([dV[w][:, a:z].ravel() for a, z in b.rows]),
                ]
            )
            for w in b.holders
        }
        out = execute(b.schedule, pack)
        ref = _column_order_sum(pack, list(b.holders))
        assert all(out[w].tobytes() == out[b.holders[0]].tobytes() for w in b.holders)
        np.testing.assert_allclose(out[b.holders[0]], ref, rtol=1e-12)
    for c in range(plan.n_columns):
        v = vertical_schedule(plan, c, net)
        s0, s1 = plan.column_samples(c)
        assert v.size == l * (s1 - s0)
        assert set(v.holders) == set(plan.columns[c])


def test_bands_with_the_same_holders_are_merged():
    # column 0 cuts at 4, column 1 at 4 as well: two bands with distinct holders;
    # column 0 has workers 0 (rows 0-4) and 1 (4-10); column 1 has 2 (0-4) and 3 (4-10)
    plan = Plan.from_columns([[0, 1], [2, 3]], [5, 5], [[4, 6], [4, 6]], shape=(3, 10, 2))
    bands = horizontal_schedules(plan, Interconnect(), algorithm="ring")
    assert [(b.holders, b.rows) for b in bands] == [((0, 2), ((0, 4),)), ((1, 3), ((4, 10),))]
    assert bands[0].schedule.size == (3 + 2) * 4


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("q", [2, 5, 8, 11])
def test_per_worker_steps_with_mailboxes_match_the_reference(algorithm, q):
    """What an engine does: each worker runs only its own steps, exchanging payloads through mailboxes."""
    from dask_rpm.comm.exchange import apply_received, worker_steps

    rng = np.random.default_rng(q)
    holders = [3 * i + 1 for i in range(q)]
    size = 97
    contrib = {w: rng.normal(size=size) * 10.0 ** rng.integers(-5, 5, size=size) for w in holders}
    s = build(algorithm, holders, size)
    ref = execute(s, contrib)
    bufs = {w: contrib[w].copy() for w in holders}
    steps = {w: {st.round: st for st in worker_steps(s, w)} for w in holders}
    for r in range(len(s.rounds)):
        mail = {}
        for w in holders:  # every sender posts its slices before anyone applies this round
            if r in steps[w]:
                for t in steps[w][r].sends:
                    mail[t] = bufs[w][t.lo : t.hi].copy()
        for w in holders:
            if r in steps[w]:
                apply_received(bufs[w], w, steps[w][r], mail, holders)
    for w in holders:
        assert bufs[w].tobytes() == ref[w].tobytes()
    with pytest.raises(ValueError, match="worker 0 is not a holder"):
        worker_steps(s, 0)
