"""``rpm.planner.*`` as one frozen record, read once per call (:class:`PlannerSettings`).

:func:`~dask_rpm.planners.make_plan` reads it when called and passes it to what it runs
(:func:`~dask_rpm.planners.srpm_time.srpm_time` among them), so ``dask.config.set`` around
the call takes effect and one call sees one configuration.

Pure module.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from .. import config

__all__ = ["PlannerSettings", "RATE_UNIT_WORK"]

#: Flop equivalents of the work unit ``rpm.planner.rate`` counts: one hidden unit x sample of the
#: n-l = 203-26 MLP it was measured on (``dask_rpm.nn.kernels.block_work``, forward and backward;
#: docs/benchmarks.md: ~25 GFLOP/s of one core). A CNN's work unit is far heavier
#: (:meth:`PlannerSettings.for_network`).
RATE_UNIT_WORK = 991.0


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

    def for_network(self, unit_work: float) -> PlannerSettings:
        """These settings for a network whose work unit costs ``unit_work`` flop equivalents (a
        CNN's :meth:`~dask_rpm.nn.cnn.ConvLayers.unit_work`): ``rate`` scaled so that an average
        worker still does ``rpm.planner.rate`` x :data:`RATE_UNIT_WORK` flop equivalents per
        second. Without it ``srpm-time`` would take a CNN's row x sample for an MLP's and, its
        compute underestimated by orders of magnitude, leave all but one worker idle."""
        return replace(self, rate=self.rate * RATE_UNIT_WORK / float(unit_work))
