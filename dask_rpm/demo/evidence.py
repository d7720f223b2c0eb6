"""Does a run on EMULATED workers show the method working? Numbers a person can check.

On an emulated cluster the true relative speeds are known (they were chosen),
so a run can be held against them: DRPM's last ability estimates should be
close to the speeds, and the final plan's rectangle areas proportional to
them. :func:`speed_check` computes both from a finished run and counts the
paced kernel blocks that ran late (*overruns*: the machine was too busy to
give a worker its emulated share of a core, so timings measure contention,
not the chosen speeds). The demo (``dask-rpm train``) and the tutorials print
:meth:`SpeedCheck.lines`.

Pure module: it reads a ``FitResult`` and plain dicts, never a cluster
(``dask_rpm.emulation.emulation_info`` gives the counters).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

__all__ = [
    "SpeedCheck",
    "speed_check",
    "overrun_counts",
    "plan_speeds",
    "TOLERANCE",
    "BUSY_FRACTION",
]

#: Largest relative difference between estimate (or area share) and the speed share called "close".
TOLERANCE = 0.10
#: Above this fraction of overrun blocks the timings measure contention (as ``emulation.format_report`` warns).
BUSY_FRACTION = 0.05


class SpeedCheck(NamedTuple):
    """Estimates and plan areas of one run held against the EMULATED speeds (worker index order)."""

    speeds: tuple[float, ...]
    """The EMULATED speed of each worker."""
    truth: tuple[float, ...]
    """Speed shares: each speed over their sum."""
    estimates: tuple[float, ...] | None
    """DRPM's last ability estimates, normalised to sum 1 (None: no check ran)."""
    estimate_iteration: int | None
    """Iterations done at that check."""
    areas: tuple[float, ...]
    """The final plan's rectangle area of each worker over the whole iteration's area."""
    blocks: int
    """Paced kernel blocks the workers ran (all of the cluster's runs so far)."""
    overruns: int
    """Of those, blocks later than their target (contention)."""

    @property
    def estimate_error(self) -> float | None:
        """Largest relative difference of an estimate from its speed share."""
        if self.estimates is None:
            return None
        return _largest_relative(self.estimates, self.truth)

    @property
    def area_error(self) -> float:
        """Largest relative difference of an area share from its speed share."""
        return _largest_relative(self.areas, self.truth)

    @property
    def busy(self) -> bool:
        """More than :data:`BUSY_FRACTION` of the blocks overran: the timings measure contention."""
        return self.blocks > 0 and self.overruns > BUSY_FRACTION * self.blocks

    @property
    def shows_method(self) -> bool:
        """Estimates (when there are any) and areas within :data:`TOLERANCE` of the speed shares."""
        est = self.estimate_error
        return (est is None or est <= TOLERANCE) and self.area_error <= TOLERANCE

    def lines(self) -> list[str]:
        """What to print: the three rows side by side and a verdict that says why when it is not shown."""
        fmt = lambda vs: ", ".join(f"{v:.3f}" for v in vs)  # noqa: E731
        out = [f"EMULATED speed shares:          {fmt(self.truth)}"]
        if self.estimates is not None:
            out.append(
                f"DRPM estimates (iteration {self.estimate_iteration}): {fmt(self.estimates)}"
                f"   (largest difference {self.estimate_error:.1%})"
            )
        out.append(
            f"final plan's area shares:       {fmt(self.areas)}   (largest difference {self.area_error:.1%})"
        )
        if self.shows_method:
            out.append(
                f"the method works here: estimates and areas within {TOLERANCE:.0%} of the EMULATED speeds"
            )
        elif self.busy:
            out.append(
                f"not within {TOLERANCE:.0%}: the machine was busy - {self.overruns} of {self.blocks} "
                f"paced kernel blocks ran late, so the timings measured contention, not the EMULATED "
                f"speeds; run it again when the machine is quieter"
            )
        elif self.blocks == 0:
            out.append(
                f"not within {TOLERANCE:.0%}: at this size an iteration's kernels take a few milliseconds, "
                f"so per-call costs and the machine's load weigh as much as the EMULATED speeds "
                f"(late blocks were not counted)"
            )
        else:
            out.append(
                f"not within {TOLERANCE:.0%} although only {self.overruns} of {self.blocks} blocks ran late: "
                f"at this size an iteration's kernels are too short for the timings to show the speeds"
            )
        return out


def _largest_relative(values: Sequence[float], truth: Sequence[float]) -> float:
    v, t = np.asarray(values, dtype=float), np.asarray(truth, dtype=float)
    return float(np.max(np.abs(v - t) / t))


def overrun_counts(info: Mapping[str, Mapping[str, Any] | None]) -> tuple[int, int]:
    """``(blocks, overruns)`` summed over ``dask_rpm.emulation.emulation_info(client)``."""
    rows = [r for r in info.values() if r]
    return sum(int(r.get("blocks", 0)) for r in rows), sum(int(r.get("overruns", 0)) for r in rows)


def plan_speeds(plan: Any, info: Mapping[str, Mapping[str, Any] | None]) -> list[float]:
    """The EMULATED speed of each worker of ``plan`` (bound to addresses), from ``emulation_info(client)``.

    Raises ``ValueError`` naming a worker that is not emulated.
    """
    out = []
    for address in plan.workers or ():
        row = info.get(address)
        if not row:
            raise ValueError(
                f"worker {address} is not EMULATED: there is no chosen speed to compare with"
            )
        out.append(float(row["speed"]))
    return out


def speed_check(
    result: Any, speeds: Sequence[float], *, blocks: int = 0, overruns: int = 0
) -> SpeedCheck:
    """Hold a finished run against the EMULATED ``speeds`` (one per worker, in the plan's worker order).

    Parameters
    ----------
    result : FitResult
        ``result.history["ability"]`` (DRPM checks) gives the estimates;
        ``result.plan`` the areas.
    speeds : sequence of float
        The speed of worker ``i`` of the plan (``result.plan.workers[i]``).
    blocks, overruns : int
        From :func:`overrun_counts`.

    Returns
    -------
    SpeedCheck
    """
    speeds = tuple(float(s) for s in speeds)
    plan = result.plan
    if len(speeds) != len(plan.abilities):
        raise ValueError(
            f"{len(speeds)} speeds for a plan of {len(plan.abilities)} workers; give one per worker"
        )
    total = sum(speeds)
    truth = tuple(s / total for s in speeds)
    area = np.zeros(len(speeds))
    for w in plan.planned_workers:
        area[w] = plan.rectangle(w).area
    areas = tuple(float(a) for a in area / area.sum())
    estimates, at = None, None
    h = result.history
    if "ability" in h and h.sizes.get("check", 0):
        last = np.asarray(h["ability"].values[-1], dtype=float)
        if np.all(np.isfinite(last)) and last.size == len(speeds):
            estimates = tuple(float(v) for v in last / last.sum())
            at = int(h["check_iteration"].values[-1]) if "check_iteration" in h.coords else None
    return SpeedCheck(speeds, truth, estimates, at, areas, int(blocks), int(overruns))
