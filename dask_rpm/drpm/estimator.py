"""Ability estimation from measured iteration times (DRPM, docs/method.md §6).

Every iteration each worker reports the work it did (hidden units x samples of
its rectangle in that iteration) and two times:

* ``t1`` - forward compute + vertical exchange + backward compute. It includes
  waiting, so it reflects the task as it actually ran; DRPM uses it for column
  remaps and for the imbalance check.
* ``t2`` - backward compute only (pure compute); used for whole remaps, whose
  new communication pattern the old waiting times would not describe.
* ``tc`` - forward compute + backward compute, without the wait between them
  (beyond the paper; see below).

A worker's ability is the slope ``p`` of ``work = p * time`` fitted by least
squares through the origin over its last ``L`` observations::

    p = sum(w_j * t_j) / sum(t_j ** 2)

Abilities come out in work units per second (unnormalised throughput), so
``area / p`` predicts a worker's seconds for a rectangle of ``area`` units.

Outliers (beyond the paper)
---------------------------
Least squares through the origin weights each point by ``t^2``, so one
iteration that a worker lost to something else (a garbage collection, a
daemon, another job's burst, a late message) pulls its estimate down by far
more than its share: one time 70 % too long among six lowers the slope by
about 15 %. With ``outlier = r`` (``rpm.drpm.outlier``, 0.25 by default) the
fit drops the points whose rate ``w_j / t_j`` is off the window's median rate
by more than a factor ``1 + r`` - but never more than half the window, so a
load change that a majority of the window already shows is followed, not
discarded. ``outlier = 0`` is the paper's plain fit.

Column speeds without the wait (beyond the paper)
-------------------------------------------------
``t1`` of a worker includes waiting at the vertical exchange for the slowest
worker of its column. A fast worker that shares a column with a slow one
therefore looks slow by about the slow one's forward time, and a column remap
planned on ``t1`` speeds moves only part of the way to balance. With the
paper's thresholds the remaps then stop once ``t_min / t_max`` passes
``T_line`` - 15-35 % above the balanced optimum after a 3x step change in
our runs. ``tc`` measures the same two compute phases without
the wait, so one column remap lands on balance. ``rpm.drpm.column-times``
chooses which times the column remap uses (``tc`` by default, ``t1`` for the
paper's reading); the imbalance check always compares ``t1``.

Observations across a remap
---------------------------
Each observation carries the work of the rectangle the worker held *in that
iteration*, so an observation stays a valid (work, time) point after the
worker's rectangle changes. We therefore keep observations across remaps: with
more than one work size in the window the fit is better conditioned (the
paper's Fig. 9 fits a line through several work sizes). With the defaults
``L = 6 <= R = 20`` the window holds only post-remap points by the next check
anyway. :meth:`AbilityEstimator.reset` is for the cases where old points are
genuinely wrong: the machine behind a worker key changed (restart, replacement
at the same address), the worker left the cluster, or a load change is known
out of band.

Pure module: numpy only.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from typing import Any, Literal, get_args

import numpy as np

from .settings import DRPMSettings

__all__ = ["AbilityEstimator", "AbilityEstimateError", "Observation", "fit_slope", "inliers"]

Kind = Literal["t1", "t2", "tc"]
KINDS: tuple[str, ...] = get_args(Kind)


class AbilityEstimateError(ValueError):
    """An observation or an estimate is invalid; the message says which worker and why."""


@dataclass(frozen=True)
class Observation:
    """One iteration of one worker: work units done and the measured times (seconds).

    ``t2`` and ``tc`` are NaN when they were not measured.
    """

    work: float
    t1: float
    t2: float
    tc: float = math.nan


def fit_slope(work: Iterable[float], times: Iterable[float]) -> float:
    """Least-squares slope of ``work = p * time`` through the origin.

    Parameters
    ----------
    work, times
        Paired observations of equal length.

    Returns
    -------
    float
        ``sum(w * t) / sum(t * t)``.

    Raises
    ------
    AbilityEstimateError
        If there are no observations or every time is zero (the slope is undefined).
    """
    w = np.asarray(list(work), dtype=float)
    t = np.asarray(list(times), dtype=float)
    if w.shape != t.shape:
        raise AbilityEstimateError(
            f"need one time per work value; got {w.size} work and {t.size} times"
        )
    if w.size == 0:
        raise AbilityEstimateError("no observations to fit")
    den = float(np.dot(t, t))
    if den == 0.0:
        raise AbilityEstimateError(
            "every recorded time is zero: the speed is undefined (check the timer)"
        )
    return float(np.dot(w, t)) / den


def inliers(work: Iterable[float], times: Iterable[float], outlier: float) -> np.ndarray:
    """Mask of the points whose rate ``work / time`` is within a factor ``1 + outlier`` of the median.

    All points are kept when ``outlier <= 0``, when fewer than three points
    are given, or when fewer than half of them would remain.
    """
    w = np.asarray(list(work), dtype=float)
    t = np.asarray(list(times), dtype=float)
    keep = np.ones(w.shape, dtype=bool)
    if outlier <= 0 or w.size < 3:
        return keep
    with np.errstate(divide="ignore", invalid="ignore"):
        rate = np.where(t > 0, w / t, np.nan)
    if not np.isfinite(rate).all() or (rate <= 0).any():
        return keep  # zero work or zero time: leave it to the plain fit and its errors
    mid = float(np.median(rate))
    f = 1.0 + float(outlier)
    mask = (rate <= mid * f) & (rate >= mid / f)
    return mask if 2 * int(mask.sum()) >= w.size else keep


def _check_time(name: str, value: float, worker: Hashable, *, optional: bool) -> float:
    if value is None:
        if optional:
            return math.nan
        raise AbilityEstimateError(f"worker {worker!r}: {name} is missing")
    v = float(value)
    if optional and math.isnan(v):
        return v
    if not math.isfinite(v) or v < 0:
        raise AbilityEstimateError(
            f"worker {worker!r}: {name}={value!r} must be a finite time >= 0 seconds"
        )
    return v


class AbilityEstimator:
    """Per-worker least-squares ability estimates over a sliding window.

    Parameters
    ----------
    window
        ``L``, the number of most recent observations kept per worker.
        ``None`` reads ``rpm.drpm.window`` (6, as in the paper).
    outlier
        Drop points whose rate is off the window's median by more than a
        factor ``1 + outlier`` before fitting (see the module notes); ``0``
        fits every point, as the paper does. ``None`` reads
        ``rpm.drpm.outlier``.

    Examples
    --------
    >>> est = AbilityEstimator(window=3)
    >>> est.observe("w0", work=100.0, t1=2.0, t2=1.0)
    >>> est.estimate("t1")
    {'w0': 50.0}
    """

    def __init__(self, window: int | None = None, outlier: float | None = None) -> None:
        if window is None or outlier is None:  # rpm.drpm.* read now (the engine passes both)
            s = DRPMSettings.from_config(window=window, outlier=outlier)
            window, outlier = s.window, s.outlier
        window = int(window)
        if window < 1:
            raise AbilityEstimateError(f"window must be at least 1 observation, got {window}")
        outlier = float(outlier or 0.0)
        if not (math.isfinite(outlier) and outlier >= 0):
            raise AbilityEstimateError(
                f"outlier must be a finite factor >= 0 (0 = plain least squares), got {outlier}"
            )
        self._window = window
        self._outlier = outlier
        self._obs: dict[Hashable, deque[Observation]] = {}

    # ---------------------------------------------------------------- state
    @property
    def window(self) -> int:
        """``L``: observations kept per worker."""
        return self._window

    @property
    def workers(self) -> tuple[Hashable, ...]:
        """Workers with at least one observation, in first-seen order."""
        return tuple(w for w, d in self._obs.items() if d)

    def observations(self, worker: Hashable) -> tuple[Observation, ...]:
        """The observations currently in ``worker``'s window, oldest first."""
        return tuple(self._obs.get(worker, ()))

    def __len__(self) -> int:
        return len(self.workers)

    def __repr__(self) -> str:
        counts = ", ".join(f"{w!r}: {len(d)}" for w, d in self._obs.items())
        return f"<AbilityEstimator L={self._window} observations={{{counts}}}>"

    # -------------------------------------------------------------- updates
    def observe(
        self,
        worker: Hashable,
        work: float,
        t1: float,
        t2: float | None = None,
        tc: float | None = None,
    ) -> None:
        """Record one iteration of ``worker``.

        Parameters
        ----------
        worker
            Any hashable key (worker index or address).
        work
            Hidden units x samples of the worker's rectangle in this iteration (>= 0).
        t1
            Forward + vertical exchange + backward seconds (>= 0).
        t2
            Backward compute seconds (>= 0), or ``None``/NaN if not measured.
        tc
            Forward + backward compute seconds without the wait between them
            (>= 0), or ``None``/NaN if not measured.

        Raises
        ------
        AbilityEstimateError
            On a negative, infinite or NaN work or ``t1``, or a negative/infinite ``t2`` or ``tc``.
        """
        w = float(work)
        if not math.isfinite(w) or w < 0:
            raise AbilityEstimateError(
                f"worker {worker!r}: work={work!r} must be a finite count >= 0"
            )
        obs = Observation(
            w,
            _check_time("t1", t1, worker, optional=False),
            _check_time("t2", t2, worker, optional=True),  # type: ignore[arg-type]
            _check_time("tc", tc, worker, optional=True),  # type: ignore[arg-type]
        )
        self._obs.setdefault(worker, deque(maxlen=self._window)).append(obs)

    def reset(self, worker: Hashable | None = None) -> None:
        """Forget the observations of ``worker`` (all workers when ``None``).

        Not needed after a remap (see the module notes); use it when the machine
        behind a key changed or the worker left.
        """
        if worker is None:
            self._obs.clear()
        else:
            self._obs.pop(worker, None)

    # ------------------------------------------------------------ estimates
    def _select(self, workers: Iterable[Hashable] | None) -> list[Hashable]:
        if workers is None:
            return list(self.workers)
        ws = list(workers)
        missing = [w for w in ws if not self._obs.get(w)]
        if missing:
            raise AbilityEstimateError(
                f"no observations for worker(s) {missing!r}; each worker must report at least "
                f"one iteration before it can be estimated"
            )
        return ws

    def _points(self, worker: Hashable, kind: Kind) -> tuple[list[float], list[float]]:
        if kind not in KINDS:
            raise AbilityEstimateError(
                f"kind must be one of {', '.join(map(repr, KINDS))}, got {kind!r}"
            )
        pts = [(o.work, getattr(o, kind)) for o in self._obs[worker]]
        pts = [(w, t) for w, t in pts if not math.isnan(t)]
        if not pts:
            raise AbilityEstimateError(
                f"worker {worker!r} has no {kind} measurements in its window"
            )
        return [p[0] for p in pts], [p[1] for p in pts]

    def estimate(
        self, kind: Kind = "t1", workers: Iterable[Hashable] | None = None
    ) -> dict[Any, float]:
        """Estimated ability (work units per second) per worker.

        Parameters
        ----------
        kind
            ``"t1"`` (checks; column remaps in the paper), ``"t2"`` (whole
            remaps) or ``"tc"`` (column remaps by default).
        workers
            Workers to estimate; ``None`` means every worker with observations.

        Raises
        ------
        AbilityEstimateError
            A requested worker has no (``kind``) observations, all its times are
            zero, or its fitted ability is not positive (all recorded work zero).
        """
        out: dict[Hashable, float] = {}
        for w in self._select(workers):
            work, times = self._points(w, kind)
            keep = inliers(work, times, self._outlier)
            try:
                p = fit_slope(np.asarray(work)[keep], np.asarray(times)[keep])
            except AbilityEstimateError as e:
                raise AbilityEstimateError(f"worker {w!r} ({kind}): {e}") from None
            if not p > 0:
                raise AbilityEstimateError(
                    f"worker {w!r} ({kind}): estimated ability {p} is not positive "
                    f"(all recorded work is zero?)"
                )
            out[w] = p
        return out

    def normalised(
        self, kind: Kind = "t1", workers: Iterable[Hashable] | None = None
    ) -> dict[Any, float]:
        """:meth:`estimate` scaled to sum 1 (the paper's ability ratios)."""
        est = self.estimate(kind, workers)
        total = sum(est.values())
        return {w: p / total for w, p in est.items()}

    def recent_times(
        self, kind: Kind = "t1", workers: Iterable[Hashable] | None = None, last: int | None = None
    ) -> dict[Any, float]:
        """Mean ``kind`` time per worker over its last ``last`` observations (default: the window).

        This is what the remap check compares (``t_min / t_max``); a mean over a
        few iterations is less sensitive to one noisy iteration than the latest
        time alone. Pass ``last`` = iterations since the last remap to exclude
        times measured under the previous mapping when ``L > R``.
        """
        if last is not None and last < 1:
            raise AbilityEstimateError(f"last must be at least 1, got {last}")
        out: dict[Hashable, float] = {}
        for w in self._select(workers):
            _, times = self._points(w, kind)
            sel = times[-last:] if last is not None else times
            out[w] = float(np.mean(sel))
        return out
