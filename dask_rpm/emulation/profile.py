"""The EMULATED speed profile as data: speeds, schedules, the scale and the label text.

Pure: no Dask worker or client here, so the pacing on the worker, the cluster
class and the client helpers all read one definition of what a valid speed,
a schedule entry and the EMULATED label are.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from dask.system import CPU_COUNT

from .settings import EmulationSettings

__all__ = [
    "DEFAULT_SPEEDS",
    "ENV_INDEX",
    "ENV_SCALE",
    "ENV_SCHEDULE",
    "ENV_SPEED",
    "PLUGIN_NAME",
    "IterationEntries",
    "TimeEntries",
    "auto_scale",
    "check_speed",
    "parse_schedule",
]

#: Name the worker plugin is registered under on every emulated worker.
PLUGIN_NAME = "rpm-emulation"
#: Speeds used when none are given (also ``rpm.emulation.speeds``): one fast,
#: one half-speed and one quarter-speed worker.
DEFAULT_SPEEDS: tuple[float, ...] = (1.0, 0.5, 0.25)

#: Environment variables read by the worker preload (:func:`dask_rpm.emulation.dask_setup`).
ENV_SPEED = "DASK_RPM_EMULATED_SPEED"
ENV_SCALE = "DASK_RPM_EMULATED_SCALE"
ENV_SCHEDULE = "DASK_RPM_EMULATED_SCHEDULE"
ENV_INDEX = "DASK_RPM_EMULATED_INDEX"

#: One worker's ``(iteration, speed)`` entries, sorted by iteration.
IterationEntries = tuple[tuple[int, float], ...]
#: One worker's ``(seconds, speed)`` entries, sorted by time.
TimeEntries = tuple[tuple[float, float], ...]


def check_speed(speed: Any, what: str = "speed") -> float:
    """``speed`` as a float, or ``ValueError`` naming ``what`` unless it is finite and > 0."""
    s = float(speed)
    if not (math.isfinite(s) and s > 0):
        raise ValueError(f"{what} must be a finite number > 0, got {speed!r}")
    return s


def parse_schedule(entries: Iterable[Sequence[Any]]) -> tuple[IterationEntries, TimeEntries]:
    """Split one worker's schedule into sorted iteration and time entries.

    Parameters
    ----------
    entries : iterable of tuple
        ``(iteration, speed)`` or ``("t", seconds, speed)`` items.

    Returns
    -------
    tuple
        ``(by_iteration, by_time)``; of two entries at the same point the one
        listed later wins (stable sort).

    Raises
    ------
    ValueError
        An entry of neither form, a negative iteration or time, a bad speed.
    """
    by_iter: list[tuple[int, float]] = []
    by_time: list[tuple[float, float]] = []
    for e in entries:
        e = tuple(e)
        if len(e) == 3 and e[0] == "t":
            sec = float(e[1])
            if not (math.isfinite(sec) and sec >= 0):
                raise ValueError(f"schedule time must be >= 0 seconds, got {e!r}")
            by_time.append((sec, check_speed(e[2])))
        elif len(e) == 2 and not isinstance(e[0], str):
            it = int(e[0])
            if it != e[0] or it < 0:
                raise ValueError(f"schedule iteration must be an int >= 0, got {e!r}")
            by_iter.append((it, check_speed(e[1])))
        else:
            raise ValueError(
                f"schedule entry {e!r} is neither (iteration, speed) nor ('t', seconds, speed)"
            )
    # stable sort: of two entries at the same point the later one listed wins
    by_iter.sort(key=lambda p: p[0])
    by_time.sort(key=lambda p: p[0])
    return tuple(by_iter), tuple(by_time)


def auto_scale(
    speeds: Sequence[float],
    threads_per_worker: int = 1,
    *,
    cores: int | None = None,
    headroom: float | None = None,
) -> float:
    """Largest scale at which every emulated worker can run at once.

    With all workers busy, worker *i* keeps ``threads_per_worker`` threads
    each ``speeds[i] * scale`` of a core busy, so the total demand is
    ``scale * threads_per_worker * sum(speeds)``; it must stay within
    ``headroom * cores``. No thread can exceed one core
    (``scale <= 1 / max(speeds)``), and ``scale <= 1`` keeps "speed 1.0 =
    at most one full core".

    Parameters
    ----------
    speeds : sequence of float
        Relative speeds, one per worker.
    threads_per_worker : int
        Threads of every worker.
    cores : int, optional
        Cores of the machine (default: ``dask.system.CPU_COUNT``).
    headroom : float, optional
        Fraction of the cores the workers may use (``rpm.emulation.headroom``).

    Returns
    -------
    float
    """
    if not speeds:
        raise ValueError("need at least one speed")
    sp = [check_speed(s) for s in speeds]
    cores = CPU_COUNT if cores is None else int(cores)
    if headroom is None:
        headroom = EmulationSettings.from_config().headroom
    headroom = float(headroom)
    if not 0 < headroom:
        raise ValueError(f"headroom must be > 0, got {headroom}")
    return min(1.0, 1.0 / max(sp), headroom * cores / (threads_per_worker * sum(sp)))
