"""``rpm.drpm.*`` as one frozen record, read once per call (:class:`DRPMSettings`).

The decision functions of :mod:`~dask_rpm.drpm.policy`, :mod:`~dask_rpm.drpm.idle` and
:class:`~dask_rpm.drpm.estimator.AbilityEstimator` take it as ``settings=``; the engine
reads it once per run (:class:`dask_rpm.engine.drpm.DRPMState`) and passes it down. A public
function given ``settings=None`` reads it when called, so ``dask.config.set`` around the call
takes effect.

Pure module.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from .. import config

__all__ = ["DRPMSettings"]


@dataclass(frozen=True)
class DRPMSettings:
    """``rpm.drpm.*`` (the ``auto`` keys flattened); see docs/configuration.md.

    Attributes
    ----------
    window : int
        ``L``: observations per least-squares estimate.
    outlier : float
        Outlier factor of the estimator (0: the paper's plain fit).
    interval : int or str
        ``R`` as configured (an integer or ``"auto"``; checked by
        :func:`~dask_rpm.drpm.policy.first_interval`).
    t_whole, t_line : float
        The paper rule's thresholds.
    column_times : str
        ``"tc"`` or ``"t1"``: the times column remaps plan on.
    policy : str
        ``"paper"`` or ``"cost"``.
    min_gain : float
        Smallest relative gain of a new plan.
    idle : bool
        Leave idle the workers whose messages cost more than their share saves.
    check_seconds, target_overhead, react_seconds : float
        ``rpm.drpm.auto.*`` of :func:`~dask_rpm.drpm.policy.auto_interval`.
    min_interval : int or None
        ``rpm.drpm.auto.min-interval`` (``None``: the window, :attr:`interval_floor`).
    max_interval : int
        ``rpm.drpm.auto.max-interval``.
    """

    window: int
    outlier: float
    interval: int | str
    t_whole: float
    t_line: float
    column_times: str
    policy: str
    min_gain: float
    idle: bool
    check_seconds: float
    target_overhead: float
    react_seconds: float
    min_interval: int | None
    max_interval: int

    @classmethod
    def from_config(cls, **overrides: Any) -> DRPMSettings:
        """``rpm.drpm.*`` read now, the ``overrides`` (field names) that are not ``None`` winning."""
        c = config.section("drpm")
        auto = c.pop("auto")
        return cls._typed({**c, **auto}, overrides)

    @classmethod
    def resolve(cls, settings: DRPMSettings | None, **overrides: Any) -> DRPMSettings:
        """``settings`` (``None``: :meth:`from_config`) with the ``overrides`` that are not ``None``:
        what a public function works with, given its record and its keywords."""
        if settings is None:
            return cls.from_config(**overrides)
        if all(v is None for v in overrides.values()):
            return settings
        return cls._typed(dataclasses.asdict(settings), overrides)

    @classmethod
    def _typed(cls, values: dict[str, Any], overrides: dict[str, Any]) -> DRPMSettings:
        unknown = sorted(set(overrides) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise TypeError(f"DRPMSettings has no field(s) {unknown}")
        v = {**values, **{k: x for k, x in overrides.items() if x is not None}}
        lo = v["min_interval"]
        return cls(
            window=int(v["window"]),
            outlier=float(v["outlier"] or 0.0),
            interval=v["interval"],
            t_whole=float(v["t_whole"]),
            t_line=float(v["t_line"]),
            column_times=str(v["column_times"]),
            policy=str(v["policy"]),
            min_gain=float(v["min_gain"]),
            idle=bool(v["idle"]),
            check_seconds=float(v["check_seconds"]),
            target_overhead=float(v["target_overhead"]),
            react_seconds=float(v["react_seconds"]),
            min_interval=None if lo is None else int(lo),
            max_interval=int(v["max_interval"]),
        )

    @property
    def interval_floor(self) -> int:
        """The estimation bound of ``R = "auto"``: ``min_interval``, else the window ``L``."""
        return self.window if self.min_interval is None else self.min_interval
