"""SLURM time limits and the Dask worker lifetime derived from them.

A group's workers get ``--lifetime`` a little before the job's walltime ends,
so training retires them (moving their rows to the others) before SLURM
kills the job (see :mod:`dask_rpm.engine.retirement`).
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["WALLTIME_RE", "lifetime_args", "walltime_seconds"]

#: SLURM time formats: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S.
WALLTIME_RE = re.compile(r"^(\d+-\d+(:\d+){0,2}|\d+(:\d+){0,2})$")


def walltime_seconds(walltime: Any) -> float | None:
    """Seconds of a SLURM time (``M``, ``M:S``, ``H:M:S``, ``D-H[:M[:S]]``); None if unlimited/unknown."""
    if not isinstance(walltime, str) or not WALLTIME_RE.match(walltime):
        return None
    days, _, rest = walltime.rpartition("-")
    parts = [int(p) for p in rest.split(":")]
    if days:  # D-H, D-H:M, D-H:M:S
        parts += [0] * (3 - len(parts))
        h, m, sec = parts
        return ((int(days) * 24 + h) * 60 + m) * 60.0 + sec
    if len(parts) == 1:  # minutes
        return parts[0] * 60.0
    if len(parts) == 2:  # M:S
        return parts[0] * 60.0 + parts[1]
    h, m, sec = parts
    return (h * 60 + m) * 60.0 + sec


def lifetime_args(lifetime: str | bool | None, walltime: Any) -> list[str]:
    """``dask worker`` options for a group's ``lifetime`` (a :class:`~dask_rpm.slurm.WorkerGroup` field).

    Parameters
    ----------
    lifetime : str, False or None
        A duration (used as given), ``False`` (no lifetime) or ``None``:
        10 % (at most 5 min) before ``walltime`` ends.
    walltime : str or None
        The job's SLURM time limit; without one (or unlimited) ``None`` gives
        no lifetime.

    Returns
    -------
    list of str
        ``["--lifetime", "<duration>"]`` or ``[]``.
    """
    if lifetime is False:
        return []
    if lifetime is not None:
        return ["--lifetime", str(lifetime)]
    seconds = walltime_seconds(walltime)
    if seconds is None:
        return []
    return ["--lifetime", f"{int(seconds - min(0.1 * seconds, 300.0))}s"]
