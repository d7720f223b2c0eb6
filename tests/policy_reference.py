"""The remap check interval ``R`` as an object, which only the tests call: the engine keeps this
state itself (:mod:`dask_rpm.engine.drpm`); docs/drpm.md describes the rule.
"""

from __future__ import annotations

from typing import Any

from dask_rpm.drpm.policy import auto_interval, first_interval

__all__ = ["CheckSchedule"]


class CheckSchedule:
    """Decides at which iterations to run the remap check.

    Parameters
    ----------
    interval
        ``R`` as an int, ``"auto"`` (:func:`dask_rpm.drpm.policy.auto_interval`), or
        ``None`` to read ``rpm.drpm.interval``.
    **auto_kw
        Passed to :func:`~dask_rpm.drpm.policy.auto_interval`.

    Examples
    --------
    >>> sched = CheckSchedule(3)
    >>> [it for it in range(1, 10) if sched.due(it) and sched.mark(it) is None]
    [3, 6, 9]
    """

    def __init__(self, interval: int | str | None = None, **auto_kw: Any) -> None:
        self.interval, self.auto = first_interval(
            interval, min_interval=auto_kw.get("min_interval")
        )
        self._auto_kw = auto_kw
        self.last = 0
        self.checks = 0

    @property
    def first_check(self) -> bool:
        """No check has been marked yet."""
        return self.checks == 0

    def update(self, iteration_seconds: float) -> int:
        """Re-derive ``R`` from a measured iteration time (``"auto"`` only); return ``R``."""
        if self.auto:
            self.interval = auto_interval(iteration_seconds, **self._auto_kw)
        return self.interval

    def due(self, iteration: int) -> bool:
        """``True`` when ``interval`` iterations have completed since the last check."""
        return iteration - self.last >= self.interval

    def mark(self, iteration: int) -> None:
        """Record that the check ran after ``iteration``."""
        self.last = iteration
        self.checks += 1

    def __repr__(self) -> str:
        mode = "auto" if self.auto else "fixed"
        return f"<CheckSchedule {mode} R={self.interval} last={self.last} checks={self.checks}>"
