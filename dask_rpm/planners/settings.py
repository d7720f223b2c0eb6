"""``rpm.planner.*`` as one frozen record, read once per call (:class:`PlannerSettings`).

:func:`~dask_rpm.planners.make_plan` reads it when called and passes it to what it runs
(:func:`~dask_rpm.planners.srpm_time.srpm_time` among them), so ``dask.config.set`` around
the call takes effect and one call sees one configuration.

Pure module.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .. import config

__all__ = ["PlannerSettings"]


@dataclass(frozen=True)
class PlannerSettings:
    """``rpm.planner.*``; see docs/configuration.md.

    Attributes
    ----------
    method : str
        ``rpm.planner.method``: the planner's name.
    rate : float
        ``rpm.planner.rate``: work units per second of an average worker (``srpm-time``
        without measured rates).
    small_group : float
        ``rpm.planner.small-group`` as configured (checked where it is used:
        :func:`~dask_rpm.planners.inputs.check_fraction`).
    min_units : float
        ``rpm.planner.min-units``.
    """

    method: str
    rate: float
    small_group: float
    min_units: float

    @classmethod
    def from_config(cls, **overrides: Any) -> PlannerSettings:
        """``rpm.planner.*`` read now, the ``overrides`` (field names) that are not ``None`` winning."""
        c = config.section("planner", **overrides)
        return cls(
            method=c["method"],
            rate=float(c["rate"]),
            small_group=c["small_group"],
            min_units=float(c["min_units"]),
        )
