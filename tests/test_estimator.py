"""Least-squares ability estimation over a sliding window (DRPM)."""

from __future__ import annotations

import math

import dask.config
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dask_rpm.drpm.estimator import (
    AbilityEstimateError,
    AbilityEstimator,
    Observation,
    fit_slope,
    inliers,
)


def test_fit_slope_exact():
    # (10, 1) and (20, 3): (10*1 + 20*3) / (1 + 9) = 7.
    assert fit_slope([10, 20], [1, 3]) == 7.0
    assert fit_slope([6, 9, 12], [2, 3, 4]) == 3.0
    with pytest.raises(AbilityEstimateError, match="no observations"):
        fit_slope([], [])
    with pytest.raises(AbilityEstimateError, match="zero"):
        fit_slope([1, 2], [0, 0])
    with pytest.raises(AbilityEstimateError, match="one time per work"):
        fit_slope([1, 2], [1])


def test_estimate_t1_and_t2_separately():
    est = AbilityEstimator(window=6)
    est.observe(0, work=100, t1=2.0, t2=0.5)
    est.observe(0, work=300, t1=4.0, t2=1.5)
    est.observe("tcp://b", work=50, t1=1.0, t2=0.25)
    # t1: (200 + 1200) / (4 + 16) = 70; t2: (50 + 450) / (0.25 + 2.25) = 200.
    assert est.estimate("t1") == {0: 70.0, "tcp://b": 50.0}
    assert est.estimate("t2") == {0: 200.0, "tcp://b": 200.0}
    assert est.estimate("t2", workers=["tcp://b"]) == {"tcp://b": 200.0}
    assert est.workers == (0, "tcp://b") and len(est) == 2


def test_tc_is_a_third_optional_kind():
    est = AbilityEstimator(window=6)
    est.observe("a", work=100, t1=3.0, t2=0.5, tc=1.0)
    est.observe("a", work=200, t1=5.0, t2=1.0)  # tc not measured: left out of the tc fit only
    assert est.estimate("tc") == {"a": 100.0}
    assert est.estimate("t1")["a"] == pytest.approx((300 + 1000) / (9 + 25))
    assert est.observations("a")[1].tc != est.observations("a")[1].tc  # NaN
    with pytest.raises(AbilityEstimateError, match="tc=-1"):
        est.observe("a", 1, 1.0, 1.0, -1.0)


def test_window_bounds_observations():
    est = AbilityEstimator(window=3)
    for k in range(1, 11):
        est.observe("w", work=10 * k, t1=float(k) if k <= 7 else 2.0 * k, t2=None)
    obs = est.observations("w")
    assert len(obs) == 3
    assert (obs[0].work, obs[0].t1) == (80.0, 16.0) and math.isnan(obs[0].t2)
    assert isinstance(obs[0], Observation)
    # Only k = 8, 9, 10 remain, all with work = 5 * t1: the older slope-10 points are gone.
    assert est.estimate()["w"] == pytest.approx(5.0, rel=1e-15)


def test_default_window_from_config():
    assert AbilityEstimator().window == 6
    with dask.config.set({"rpm.drpm.window": 4}):
        assert AbilityEstimator().window == 4
    assert AbilityEstimator(window=2).window == 2
    with pytest.raises(AbilityEstimateError, match="at least 1"):
        AbilityEstimator(window=0)


def test_normalised_sums_to_one():
    est = AbilityEstimator()
    for w, speed in enumerate([1.0, 2.0, 5.0]):
        for work in (10.0, 20.0):
            est.observe(w, work, work / speed, work / (2 * speed))
    np.testing.assert_allclose(list(est.normalised().values()), [0.125, 0.25, 0.625])
    np.testing.assert_allclose(list(est.normalised("t2").values()), [0.125, 0.25, 0.625])


def test_recent_times():
    est = AbilityEstimator(window=4)
    for t in (1.0, 2.0, 3.0, 4.0, 5.0):
        est.observe("a", 1.0, t, t / 2)
    assert est.recent_times() == {"a": 3.5}  # mean of the window: 2..5
    assert est.recent_times("t1", last=2) == {"a": 4.5}
    assert est.recent_times("t2", last=1) == {"a": 2.5}
    with pytest.raises(AbilityEstimateError, match="at least 1"):
        est.recent_times(last=0)


def test_missing_t2_and_workers():
    est = AbilityEstimator()
    est.observe("a", 10, 1.0)  # t2 not measured
    est.observe("a", 10, 1.0, float("nan"))
    assert est.estimate("t1") == {"a": 10.0}
    with pytest.raises(AbilityEstimateError, match="no t2 measurements"):
        est.estimate("t2")
    est.observe("a", 30, 2.0, 1.0)  # t2 points without NaN are used
    assert est.estimate("t2") == {"a": 30.0}
    with pytest.raises(AbilityEstimateError, match="no observations for worker"):
        est.estimate(workers=["a", "b"])
    with pytest.raises(AbilityEstimateError, match="kind"):
        est.estimate("t3")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "work, t1, t2, match",
    [
        (-1, 1.0, 1.0, "work"),
        (float("nan"), 1.0, 1.0, "work"),
        (1, -1.0, 1.0, "t1"),
        (1, float("nan"), 1.0, "t1"),
        (1, float("inf"), 1.0, "t1"),
        (1, None, 1.0, "t1 is missing"),
        (1, 1.0, -0.5, "t2"),
        (1, 1.0, float("inf"), "t2"),
    ],
)
def test_bad_observations_rejected(work, t1, t2, match):
    est = AbilityEstimator()
    with pytest.raises(AbilityEstimateError, match=match):
        est.observe("w", work, t1, t2)
    assert est.workers == ()  # nothing recorded


def test_zero_times_and_zero_work():
    est = AbilityEstimator()
    est.observe("z", 10, 0.0, 0.0)
    with pytest.raises(AbilityEstimateError, match="'z'.*zero"):
        est.estimate()
    est.observe("z", 10, 1.0, 1.0)  # one usable point: the zero-time point adds nothing
    assert est.estimate() == {"z": 10.0}
    idle = AbilityEstimator()
    idle.observe("i", 0, 1.0, 1.0)
    with pytest.raises(AbilityEstimateError, match="not positive"):
        idle.estimate()


def test_reset():
    est = AbilityEstimator()
    est.observe("a", 1, 1, 1)
    est.observe("b", 1, 1, 1)
    est.reset("a")
    assert est.workers == ("b",)
    est.reset("never-seen")  # no error
    est.reset()
    assert est.workers == () and est.estimate() == {}


def test_observations_survive_a_remap():
    # A worker's rectangle grows from 100 to 300 units after a remap; its old
    # points are still valid (work, time) pairs on the same line.
    est = AbilityEstimator(window=6)
    for _ in range(3):
        est.observe("w", 100, 1.0, 0.5)
    for _ in range(3):
        est.observe("w", 300, 3.0, 1.5)
    assert est.estimate()["w"] == pytest.approx(100.0)


@settings(max_examples=100, deadline=None)
@given(
    speed=st.floats(1e-3, 1e6),
    works=st.lists(st.floats(1.0, 1e5), min_size=1, max_size=12),
    window=st.integers(1, 8),
)
def test_noise_free_data_recovers_speed(speed, works, window):
    est = AbilityEstimator(window=window)
    for w in works:
        est.observe("w", w, w / speed, w / speed)
    assert len(est.observations("w")) == min(window, len(works))
    assert est.estimate()["w"] == pytest.approx(speed, rel=1e-9)


@settings(max_examples=100, deadline=None)
@given(
    pts=st.lists(st.tuples(st.floats(0.0, 1e4), st.floats(1e-3, 1e3)), min_size=1, max_size=8),
    scale=st.floats(0.01, 100.0),
)
def test_slope_matches_numpy_lstsq_and_scales(pts, scale):
    work = np.array([p[0] for p in pts])
    t = np.array([p[1] for p in pts])
    if work.sum() == 0:
        return
    ref = np.linalg.lstsq(t[:, None], work, rcond=None)[0][0]
    assert fit_slope(work, t) == pytest.approx(ref, rel=1e-9)
    assert fit_slope(work * scale, t) == pytest.approx(ref * scale, rel=1e-9)


# ---------------------------------------------------------------- outliers


def test_plain_fit_when_outlier_is_zero_matches_fit_slope():
    work, times = [100.0] * 6, [1.0, 1.0, 1.0, 1.0, 1.0, 1.7]
    est = AbilityEstimator(window=6, outlier=0)
    for t in times:
        est.observe("w", 100.0, t1=t, t2=t)
    assert est.estimate("t2")["w"] == pytest.approx(fit_slope(work, times))
    # the paper's fit is pulled about 12 % low by one stalled iteration
    assert est.estimate("t2")["w"] == pytest.approx(100.0 * 6.7 / 7.89)


def test_default_fit_drops_one_stalled_iteration():
    est = AbilityEstimator(window=6)  # rpm.drpm.outlier = 0.25
    for t in [1.0, 1.02, 0.98, 1.0, 1.7, 1.0]:
        est.observe("w", 100.0, t1=t, t2=t)
    assert est.estimate("t2")["w"] == pytest.approx(100.0, rel=0.01)


def test_outlier_filter_follows_a_load_change_the_majority_shows():
    est = AbilityEstimator(window=6, outlier=0.25)
    for t in [1.0, 1.0, 3.0, 3.0, 3.0, 3.0]:  # 3x slower for the last four iterations
        est.observe("w", 90.0, t1=t, t2=t)
    assert est.estimate("t1")["w"] == pytest.approx(30.0)


def test_inliers_never_drops_half_or_more():
    # three and three: no majority, every point is kept (the plain fit)
    assert inliers([1.0] * 6, [1.0, 1.0, 1.0, 3.0, 3.0, 3.0], 0.25).all()
    assert inliers([1.0] * 2, [1.0, 5.0], 0.25).all()
    assert inliers([1.0, 1.0, 1.0], [1.0, 1.0, 5.0], 0.25).tolist() == [True, True, False]
    assert inliers([1.0] * 4, [1.0, 1.0, 1.0, 5.0], 0).all()


def test_negative_outlier_is_rejected_with_the_fix():
    with pytest.raises(AbilityEstimateError, match="outlier must be a finite factor >= 0"):
        AbilityEstimator(window=6, outlier=-1)
