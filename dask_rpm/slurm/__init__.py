"""Heterogeneous worker provisioning on SLURM: one Dask scheduler, several job types.

dask-jobqueue's :class:`~dask_jobqueue.SLURMCluster` submits one kind of job.
A heterogeneous run wants several kinds at once - for example two partitions
with different node types - all feeding the *same* scheduler, so the planner
sees every worker and can give each a rectangle sized to its ability.

:class:`WorkerGroup` describes one kind of job (partition, cores, memory, ...).
:class:`HeterogeneousSLURMCluster` is a :class:`~dask_jobqueue.SLURMCluster`
whose ``worker_spec`` holds jobs of several groups. dask-jobqueue has no public
API for this; the semi-private parts of ``SpecCluster`` and
``JobQueueCluster`` (``worker_spec``, ``workers``, ``_correct_state``,
``_job_kwargs``) are touched only inside that class, and its tests pin the
behaviour (dask-jobqueue is pinned to 0.9.0).

Modules
-------
* :mod:`~dask_rpm.slurm.groups` - :class:`WorkerGroup`, :func:`load_groups`, :func:`group_from_name`;
* :mod:`~dask_rpm.slurm.validation` - the checks on a group's fields, :class:`SlurmConfigError`;
* :mod:`~dask_rpm.slurm.walltime` - SLURM times and the worker ``--lifetime`` from them;
* :mod:`~dask_rpm.slurm.cluster` - :class:`HeterogeneousSLURMCluster`;
* :mod:`~dask_rpm.slurm.replacement` - ended jobs and how many are resubmitted;
* :mod:`~dask_rpm.slurm.gpu` - GPU groups: ``--gres=gpu:N``, the ``GPU`` resource, each worker's GPU;
* :mod:`~dask_rpm.slurm.preload` - :func:`dask_setup` (``--preload dask_rpm.slurm``, and
  ``--preload-nanny`` for GPU groups);
* :mod:`~dask_rpm.slurm.site` - :func:`slurm_unavailable`.

How a worker carries its group
------------------------------
Three views of the same fact, each for a different reader:

* the **worker name** is ``<group>-<n>`` (``<group>-<n>-<k>`` when a job runs
  ``k`` processes), so the dashboard, logs, plans and histories show the
  group without any lookup;
* the job script exports ``DASK_RPM_GROUP=<group>`` (:data:`GROUP_ENV`), so
  code running *on* the worker knows its group without parsing names;
* a worker preload (this module's :func:`dask_setup`) copies it into the
  worker's registration, so it appears on the scheduler as
  ``scheduler_info()["workers"][address]["rpm_group"]`` (:data:`GROUP_KEY`)
  and ``WorkerState.extra["rpm_group"]`` for scheduler plugins.

Worker *resources* (``--resources group_fast=1``) were rejected: resources
change task placement semantics, and plans pin tasks to worker addresses
anyway.

Scaling is the trainer's job
----------------------------
The trainer decides how many workers of each group exist (a plan is made for
a fixed set of workers), so :meth:`HeterogeneousSLURMCluster.adapt` raises and
plain ``scale(n)`` is refused (which group would ``n`` mean?). Use
:meth:`~HeterogeneousSLURMCluster.scale_group`.

GPU groups
----------
A group with ``gpus: N`` asks for ``--gres=gpu:N`` per job and runs one
worker process per GPU, each with the Dask resource ``GPU=1`` and its own GPU
of the job as its only visible device (``CUDA_VISIBLE_DEVICES``, set by the
worker's nanny before the worker process starts; :mod:`~dask_rpm.slurm.gpu`).
Workers of the other groups see no GPU (``CUDA_VISIBLE_DEVICES=""``), so
``fit(backend="auto")`` trains on GPUs and CPUs as the groups say.

Emulated speed
--------------
``WorkerGroup.speed`` exists **only to emulate heterogeneity on one machine**
(tests, demos, the local SLURM of ``slurm/local-cluster.sh``). It is exported
to the job as ``DASK_RPM_EMULATED_SPEED=<speed>`` (:data:`SPEED_ENV`) and the
job's workers also preload :mod:`dask_rpm.emulation`, which reads the variable
and paces the kernels to that relative speed. On real hardware leave it
``None``: abilities are then measured (probe, DRPM), never assumed.
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_attributes
from .cluster import HeterogeneousSLURMCluster
from .groups import WorkerGroup, group_from_name, load_groups
from .preload import GPU_KEY, GROUP_ENV, GROUP_KEY, SPEED_ENV, SPEED_KEY, dask_setup
from .site import slurm_unavailable
from .validation import SlurmConfigError

if not TYPE_CHECKING:  # type checkers resolve submodules themselves; a catch-all hides typos
    __getattr__, __dir__ = lazy_attributes(__name__, __path__)  # submodules on first use

__all__ = [
    "GPU_KEY",
    "GROUP_ENV",
    "GROUP_KEY",
    "SPEED_ENV",
    "SPEED_KEY",
    "HeterogeneousSLURMCluster",
    "SlurmConfigError",
    "WorkerGroup",
    "dask_setup",
    "group_from_name",
    "load_groups",
    "slurm_unavailable",
]
