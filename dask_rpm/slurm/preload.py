"""Worker preload: report the job's group (and EMULATED speed) to the scheduler.

Jobs of :class:`~dask_rpm.slurm.HeterogeneousSLURMCluster` start their
workers with ``--preload dask_rpm.slurm`` (the package re-exports
:func:`dask_setup`, so that path keeps working).
"""

from __future__ import annotations

import logging
import os
from typing import Any

from ..emulation.profile import ENV_SPEED

__all__ = [
    "EMULATION_PRELOAD",
    "GROUP_ENV",
    "GROUP_KEY",
    "SPEED_ENV",
    "SPEED_KEY",
    "WORKER_PRELOAD",
    "dask_setup",
]

logger = logging.getLogger(__name__)

#: Environment variable holding the worker's group name inside its job.
GROUP_ENV = "DASK_RPM_GROUP"
#: Environment variable holding the emulated relative speed (emulation only; the
#: variable :mod:`dask_rpm.emulation`'s preload reads).
SPEED_ENV = ENV_SPEED
#: Key of the group name in the scheduler's worker info (``WorkerState.extra``).
GROUP_KEY = "rpm_group"
#: Key of the emulated speed in the scheduler's worker info, when set.
SPEED_KEY = "rpm_emulated_speed"

#: Module the workers preload so they report their group to the scheduler
#: (the package, whose ``dask_setup`` is this module's; job scripts write this path).
WORKER_PRELOAD = "dask_rpm.slurm"
#: Module that turns DASK_RPM_EMULATED_SPEED into paced kernels (emulation only).
EMULATION_PRELOAD = "dask_rpm.emulation"


def dask_setup(worker: Any) -> None:
    """Worker preload hook: copy the job's group (and emulated speed) into its registration.

    Jobs of :class:`~dask_rpm.slurm.HeterogeneousSLURMCluster` start their workers with
    ``--preload dask_rpm.slurm``; the values then show up on the scheduler as
    ``scheduler_info()["workers"][addr]["rpm_group"]`` and in
    ``WorkerState.extra``. A worker started by hand without the environment
    variables is left untouched.
    """
    group = os.environ.get(GROUP_ENV)
    if group:
        worker.startup_information[GROUP_KEY] = lambda _w, g=group: g
    speed = os.environ.get(SPEED_ENV)
    if speed:
        try:
            value = float(speed)
        except ValueError:
            logger.warning("ignoring %s=%r: not a number", SPEED_ENV, speed)
        else:
            worker.startup_information[SPEED_KEY] = lambda _w, v=value: v
