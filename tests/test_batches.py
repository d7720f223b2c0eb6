"""Mini-batch schedule: plan-independent batches, column shares that tile every batch."""

from __future__ import annotations

import numpy as np
import pytest

from dask_rpm.batches import BatchError, Schedule, schedule


def test_full_batch_is_one_batch_in_sample_order():
    sch = Schedule(10)
    assert sch.full_batch and sch.per_epoch == 1 and sch.batch == 10
    assert list(sch.indices(5)) == list(range(10))
    assert sch.share(3, (4, 7)) == (4, 7)  # a column's share is its sample range


def test_epochs_shuffle_with_the_seed_and_cover_every_sample_once():
    sch = Schedule(103, 10, True, seed=4)
    assert sch.per_epoch == 11
    for e in range(3):
        seen = np.concatenate([sch.indices(e * 11 + k) for k in range(11)])
        assert sorted(seen) == list(range(103))
    assert not np.array_equal(sch.order(0), sch.order(1))
    assert np.array_equal(sch.order(1), Schedule(103, 10, True, seed=4).order(1))
    assert not np.array_equal(sch.order(1), Schedule(103, 10, True, seed=5).order(1))
    assert sch.positions(10) == (100, 103)  # the last batch of an epoch is smaller


@pytest.mark.parametrize(
    "cuts", [[0, 103], [0, 50, 103], [0, 1, 2, 60, 103], [0, 17, 34, 51, 68, 85, 103]]
)
def test_column_shares_tile_every_batch(cuts):
    sch = Schedule(103, 10, True, seed=1)
    for it in range(25):
        parts = [sch.indices(it, (a, b)) for a, b in zip(cuts[:-1], cuts[1:])]
        assert np.array_equal(np.concatenate(parts), sch.indices(it))


def test_epoch_plan_serves_each_iteration_from_a_contiguous_slice():
    sch = Schedule(64, 9, True, seed=2)
    cut = (20, 45)
    idx, off = sch.epoch_plan(1, cut, start=sch.per_epoch + 2)
    for j, it in enumerate(range(sch.per_epoch + 2, 2 * sch.per_epoch)):
        assert np.array_equal(idx[off[j] : off[j + 1]], sch.indices(it, cut))


@pytest.mark.parametrize("bad", [0, -3, 2.5, "64", True])
def test_bad_batch_sizes_are_refused_naming_the_value(bad):
    with pytest.raises(BatchError, match=f"batch_size={bad!r}"):
        schedule(100, bad)
