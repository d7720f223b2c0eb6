"""Mini-batch schedule: plan-independent batches, column shares that tile every batch."""

from __future__ import annotations

import numpy as np
import pytest

from dask_rpm.nn.batches import BatchError, BatchSchedule, schedule


def test_full_batch_is_one_batch_in_sample_order():
    sch = BatchSchedule(10)
    assert sch.full_batch and sch.per_epoch == 1 and sch.batch == 10
    assert list(sch.indices(5)) == list(range(10))
    assert sch.share(3, (4, 7)) == (4, 7)  # a column's share is its sample range


def test_epochs_shuffle_with_the_seed_and_cover_every_sample_once():
    sch = BatchSchedule(103, 10, True, seed=4)
    assert sch.per_epoch == 11
    for e in range(3):
        seen = np.concatenate([sch.indices(e * 11 + k) for k in range(11)])
        assert sorted(seen) == list(range(103))
    assert not np.array_equal(sch.order(0), sch.order(1))
    assert np.array_equal(sch.order(1), BatchSchedule(103, 10, True, seed=4).order(1))
    assert not np.array_equal(sch.order(1), BatchSchedule(103, 10, True, seed=5).order(1))
    assert sch.positions(10) == (100, 103)  # the last batch of an epoch is smaller


@pytest.mark.parametrize(
    "cuts", [[0, 103], [0, 50, 103], [0, 1, 2, 60, 103], [0, 17, 34, 51, 68, 85, 103]]
)
def test_column_shares_tile_every_batch(cuts):
    sch = BatchSchedule(103, 10, True, seed=1)
    for it in range(25):
        parts = [sch.indices(it, (a, b)) for a, b in zip(cuts[:-1], cuts[1:])]
        assert np.array_equal(np.concatenate(parts), sch.indices(it))


def test_epoch_plan_serves_each_iteration_from_a_contiguous_slice():
    sch = BatchSchedule(64, 9, True, seed=2)
    cut = (20, 45)
    idx, off = sch.epoch_plan(1, cut, start=sch.per_epoch + 2)
    for j, it in enumerate(range(sch.per_epoch + 2, 2 * sch.per_epoch)):
        assert np.array_equal(idx[off[j] : off[j + 1]], sch.indices(it, cut))


@pytest.mark.parametrize("bad", [0, -3, 2.5, "64", True])
def test_bad_batch_sizes_are_refused_naming_the_value(bad):
    with pytest.raises(BatchError, match=f"batch_size={bad!r}"):
        schedule(100, bad)


def test_batch_plan_holds_each_columns_share_of_a_batch():
    """batch_plan: the rectangles of one mini-batch iteration, the shares the engine takes."""
    from dask_rpm.nn.batches import batch_plan, schedule
    from dask_rpm.planners import make_plan

    plan = make_plan([1, 2, 3, 5, 8], (6, 40, 3), 1000, "srpm", dp=3)
    for B in (7, 64, 999):
        view = batch_plan(plan, B)
        sched = schedule(1000, batch_size=B, seed=0)
        assert view.samples == B and view.columns == plan.columns
        for c in range(plan.n_columns):
            lo, hi = sched.share(0, plan.column_samples(c))  # the engine's positions
            a, b = view.column_samples(c)
            assert b - a == hi - lo
        for w in plan.planned_workers:
            assert view.rectangle(w).hidden == plan.rectangle(w).hidden
    assert batch_plan(plan, 1000) is plan and batch_plan(plan, 5000) is plan
    with pytest.raises(ValueError, match="leaves a column of the plan with no sample"):
        batch_plan(plan, 2)
