"""The one timing log: per-iteration, per-worker clock readings and errors.

Workers time every iteration on their own monotonic clock
(:class:`~dask_rpm.engine.records.TimingRecord`); the driver, the progress
bar, DRPM and the scheduler plugin behind the ``/rpm`` page all keep a
:class:`TimingLog` of those records and read iteration times, phase times and
estimator observations from it, so "when did an iteration end" is computed
in exactly one place (:meth:`TimingLog.iteration_time`).

Pure: no ``distributed``.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from ..records import PHASES, Observation
from .records import TimingRecord

__all__ = ["TimingLog"]


class TimingLog:
    """Timing records and errors of one run, keyed by ``(iteration, worker)``.

    Parameters
    ----------
    max_records : int, optional
        Keep at most this many timing records (the oldest are dropped first);
        ``None`` keeps all (the driver), a bound keeps a scheduler plugin's
        memory flat however long a run is.
    """

    def __init__(self, max_records: int | None = None) -> None:
        self.max_records = max_records
        self._records: dict[tuple[int, int], TimingRecord] = {}
        self._order: deque[tuple[int, int]] = deque()
        self._by_iteration: dict[int, dict[int, TimingRecord]] = {}
        self.errors: dict[int, float] = {}

    # ------------------------------------------------------------ recording
    def add(self, records: Iterable[Sequence[Any]]) -> None:
        """Add timing records (records or plain sequences, as msgpack delivers them); O(1) each."""
        for row in records:
            rec = row if isinstance(row, TimingRecord) else TimingRecord(*row)
            key = (int(rec.iteration), int(rec.worker))
            if key not in self._records:
                self._order.append(key)
            self._records[key] = rec
            self._by_iteration.setdefault(key[0], {})[key[1]] = rec
        if self.max_records is not None:
            while len(self._order) > self.max_records:
                it, w = self._order.popleft()
                self._records.pop((it, w), None)
                per = self._by_iteration.get(it)
                if per is not None:
                    per.pop(w, None)
                    if not per:
                        del self._by_iteration[it]
                        self.errors.pop(it, None)

    def add_errors(self, errors: dict[Any, float] | Iterable[tuple[Any, float]]) -> None:
        """Total error per iteration (msgpack turns int keys into strings or pairs: both are accepted)."""
        items = errors.items() if isinstance(errors, dict) else errors
        for it, err in items:
            self.errors[int(it)] = float(err)

    def forget_from(self, first: int) -> tuple[list[TimingRecord], dict[int, float]]:
        """Drop everything of iterations ``>= first`` (they will be computed again); returns what
        was dropped, the records and the errors (a recovery from buddy copies may go back to a
        later iteration than ``first``, and keep those before it)."""
        records = []
        for it in [k for k in self._by_iteration if k >= first]:
            for w in self._by_iteration.pop(it):
                records.append(self._records.pop((it, w)))
        self._order = deque(k for k in self._order if k[0] < first)
        errors = {it: self.errors.pop(it) for it in [k for k in self.errors if k >= first]}
        return records, errors

    # -------------------------------------------------------------- reading
    def __len__(self) -> int:
        return len(self._records)

    def get(self, iteration: int, worker: int) -> TimingRecord | None:
        return self._records.get((iteration, worker))

    def iterations(self) -> list[int]:
        """Iterations with an error, in order."""
        return sorted(self.errors)

    def last_iteration(self) -> int | None:
        return max(self.errors) if self.errors else None

    def error(self, iteration: int) -> float:
        return self.errors.get(iteration, math.nan)

    def iteration_time(self, iteration: int) -> float:
        """Wall time of one iteration: the slowest worker's, each on its own clock.

        A worker's iteration runs from the end of its previous update (or,
        when it has none, the start of its forward pass) to the end of this
        update, so the times of consecutive iterations add up to the run's
        wall time, block boundaries and remaps included.
        """
        per = self._by_iteration.get(iteration)
        if not per:
            return math.nan
        prev = self._by_iteration.get(iteration - 1, {})
        worst = math.nan
        for w, rec in per.items():
            before = prev.get(w)
            start = before.modify_end if before is not None else rec.forward_start
            t = rec.modify_end - start
            if not (t <= worst):  # also replaces the initial NaN
                worst = t
        return worst

    def iteration_times(self, iterations: Iterable[int]) -> np.ndarray:
        return np.array([self.iteration_time(it) for it in iterations], dtype=float)

    def median_iteration_time(self, first: int, stop: int, *, skip_first: bool = True) -> float:
        """Median iteration time over ``[first, stop)``.

        ``skip_first`` leaves out iteration ``first`` when the range has more
        than one: it carries the block boundary (and a remap, if any).
        """
        its = range(first + 1 if skip_first and stop - first > 1 else first, stop)
        t = self.iteration_times(its)
        t = t[np.isfinite(t)]
        return float(np.median(t)) if t.size else math.nan

    def observations(
        self, first: int, stop: int, workers: Iterable[int], work: Callable[[int], int]
    ) -> list[Observation]:
        """Estimator observations of ``workers`` over ``[first, stop)``; ``work(w)`` is w's rectangle area."""
        out = []
        workers = list(workers)
        for it in range(first, stop):
            per = self._by_iteration.get(it, {})
            for w in workers:
                rec = per.get(w)
                if rec is None:
                    continue
                forward, _, backward, _, _ = rec.phases
                tc = max(forward, 0.0) + max(backward, 0.0)
                t1 = max(rec.backward_end - rec.forward_start, tc)
                out.append(Observation(w, work(w), t1, max(backward, 0.0), tc))
        return out

    def phase_table(self, iterations: Sequence[int], n_workers: int) -> dict[str, np.ndarray]:
        """Seconds per phase as ``(iteration, worker)`` arrays (NaN where a worker had no rectangle)."""
        out = {p: np.full((len(iterations), n_workers), np.nan) for p in PHASES}
        for i, it in enumerate(iterations):
            for w, rec in self._by_iteration.get(it, {}).items():
                if w < n_workers:
                    for p, v in zip(PHASES, rec.phases):
                        out[p][i, w] = v
        return out

    def rows(self, tail: int | None = None) -> list[dict[str, Any]]:
        """``{"iteration", "error", "time"}`` per iteration (the last ``tail``), for the dashboard."""
        its = self.iterations()
        if tail is not None:
            its = its[-tail:]
        rows = []
        for it in its:
            t = self.iteration_time(it)
            rows.append(
                {"iteration": it, "error": self.errors[it], "time": t if math.isfinite(t) else None}
            )
        return rows
