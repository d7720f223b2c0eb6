"""Worker and nanny preload: the job's group (and EMULATED speed) to the scheduler; a GPU each.

Jobs of :class:`~dask_rpm.slurm.HeterogeneousSLURMCluster` start their
workers with ``--preload dask_rpm.slurm`` (the package re-exports
:func:`dask_setup`, so that path keeps working); jobs of a GPU group also
preload it into the workers' nannies (``--preload-nanny``), which give each
worker its own GPU before starting it (:mod:`dask_rpm.slurm.gpu`).
"""

from __future__ import annotations

import logging
import os
from typing import Any

from distributed import Nanny

from ..emulation.profile import ENV_SPEED
from ..runtime.gpus import CUDA_ENV, WORKER_GPU_ENV
from .gpu import worker_gpu

__all__ = [
    "EMULATION_PRELOAD",
    "GPU_KEY",
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
#: Key of the worker's GPU (its ``CUDA_VISIBLE_DEVICES``) in the scheduler's worker info.
GPU_KEY = "rpm_gpu"
#: Key of the emulated speed in the scheduler's worker info, when set.
SPEED_KEY = "rpm_emulated_speed"

#: Module the workers preload so they report their group to the scheduler
#: (the package, whose ``dask_setup`` is this module's; job scripts write this path).
WORKER_PRELOAD = "dask_rpm.slurm"
#: Module that turns DASK_RPM_EMULATED_SPEED into paced kernels (emulation only).
EMULATION_PRELOAD = "dask_rpm.emulation"


def dask_setup(worker: Any) -> None:
    """Preload hook: a nanny gives its worker a GPU; a worker registers its group (and speed).

    Jobs of :class:`~dask_rpm.slurm.HeterogeneousSLURMCluster` start their workers with
    ``--preload dask_rpm.slurm``; the values then show up on the scheduler as
    ``scheduler_info()["workers"][addr]["rpm_group"]`` (``"rpm_gpu"``: the
    worker's GPU) and in ``WorkerState.extra``. A worker started by hand
    without the environment variables is left untouched.

    Jobs of a GPU group also preload it into the nannies (``--preload-nanny``):
    a nanny sets ``CUDA_VISIBLE_DEVICES`` to its worker's own GPU of the job in
    the environment it starts the worker process with (before CUDA can start
    there). A worker without a nanny (``--no-nanny``) sets it in its own
    process here, before it runs any task.

    Parameters
    ----------
    worker : distributed.Worker or distributed.Nanny
        What preloads the module.
    """
    if isinstance(worker, Nanny):
        gpu = worker_gpu(worker.name, os.environ)
        if gpu is not None:
            worker.env.update({CUDA_ENV: gpu, WORKER_GPU_ENV: gpu})
            logger.info("worker %s: GPU %s (%s=%s)", worker.name, gpu, CUDA_ENV, gpu)
        return
    if WORKER_GPU_ENV not in os.environ:  # no nanny chose: choose here, before any task
        gpu = worker_gpu(getattr(worker, "name", None), os.environ)
        if gpu is not None:
            os.environ.update({CUDA_ENV: gpu, WORKER_GPU_ENV: gpu})
    gpu = os.environ.get(WORKER_GPU_ENV)
    if gpu:
        worker.startup_information[GPU_KEY] = lambda _w, v=gpu: v
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
