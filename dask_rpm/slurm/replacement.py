"""Lost-job replacement: which SLURM jobs have ended, and whether to resubmit them.

Training keeps every group at its job count by resubmitting jobs that ended
(walltime, ``scancel``, node failure) through
:meth:`~dask_rpm.slurm.HeterogeneousSLURMCluster.replace_lost`; a group whose
jobs keep ending is given up on, so a broken node type does not turn into a
stream of doomed submissions.
"""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Mapping

__all__ = ["ReplacementBudget", "ended_jobs"]

logger = logging.getLogger(__name__)


def ended_jobs(job_ids: Mapping[str, str]) -> list[str]:
    """Names of the jobs ``{name: SLURM job id}`` that ``squeue`` no longer lists.

    Returns ``[]`` when ``squeue`` itself fails (logged): a job is never
    declared lost on a failed query.
    """
    if not job_ids:
        return []
    out = subprocess.run(
        ["squeue", "-h", "-o", "%i", "-j", ",".join(job_ids.values())],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if out.returncode not in (0, 1):  # 1: every id given has ended ("Invalid job id")
        logger.warning("squeue failed (%s): %s", out.returncode, out.stderr.strip())
        return []
    alive = set(out.stdout.split())
    return [name for name, i in job_ids.items() if i not in alive]


class ReplacementBudget:
    """How many ended jobs of each group may be resubmitted.

    A group may be resubmitted ``limit`` times within any ``window`` seconds;
    a further ended job within the window is not resubmitted (its jobs keep
    failing), and the first such refusal is logged.

    Attributes
    ----------
    given_up : set of str
        Groups refused at least once (logged once each).
    """

    def __init__(self) -> None:
        self._times: dict[str, list[float]] = {}  # group -> when its ended jobs were resubmitted
        self.given_up: set[str] = set()

    def allow(self, group: str, now: float, limit: int, window: float) -> bool:
        """Whether one more ended job of ``group`` is resubmitted at (monotonic) time ``now``."""
        history = self._times.setdefault(group, [])
        history[:] = [t for t in history if now - t < window]
        if len(history) >= limit:
            if group not in self.given_up:
                self.given_up.add(group)
                logger.warning(
                    f"group {group!r}: {len(history) + 1} jobs ended within {window:g} s "
                    f"(rpm.slurm.replace-window); not resubmitting it any more"
                )
            return False
        history.append(now)
        return True
