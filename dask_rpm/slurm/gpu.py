"""GPU groups: what a group's ``gpus`` adds to its job, and which GPU each of its workers gets.

A group with ``gpus: N`` (:class:`~dask_rpm.slurm.WorkerGroup`) submits jobs
that

* ask SLURM for the GPUs: ``#SBATCH --gres=gpu:N`` (:func:`gres_directives`);
* run N worker processes (``dask worker --nworkers N``, named ``<job>-0`` ..
  ``<job>-<N-1>``), each holding the Dask resource ``GPU=1``
  (:func:`with_gpu_resource`);
* export ``DASK_RPM_GPUS=N`` and preload :mod:`dask_rpm.slurm` into the
  workers' nannies (``--preload-nanny``): before a nanny starts its worker
  process it puts that worker's own GPU into the process's environment,
  ``CUDA_VISIBLE_DEVICES=<entry k of the job's GPUs>`` (:func:`worker_gpu`),
  so CUDA, which reads the variable when it starts, shows the worker exactly
  one GPU, as device 0.

Jobs of a group without GPUs export ``CUDA_VISIBLE_DEVICES=""``: their workers
see no GPU even on a node that has some. ``fit(backend="auto")`` then trains
on each GPU worker's GPU and on the CPUs of the others.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence

from ..runtime.gpus import (
    CUDA_ENV,
    GPU_RESOURCE,
    GPUS_ENV,
    NO_GPU,
    assign_gpu,
    job_gpus,
    worker_position,
)
from .validation import SlurmConfigError, split_option

__all__ = [
    "gpu_exports",
    "gres_directives",
    "with_gpu_resource",
    "worker_gpu",
]


def gres_directives(gpus: int, directives: Sequence[str]) -> list[str]:
    """A job's ``#SBATCH`` options with its GPUs asked for.

    Parameters
    ----------
    gpus : int
        GPUs per job; 0 changes nothing.
    directives : sequence of str
        The job's other options (site-wide and the group's), without ``#SBATCH``.

    Returns
    -------
    list of str
        ``--gres=gpu:<gpus>`` first; where the directives already ask for other
        generic resources (``--gres=nvme:1``), the GPUs join the last such
        option (``--gres=gpu:2,nvme:1``): sbatch keeps only the last ``--gres``.
    """
    out = list(directives)
    if not gpus:
        return out
    for i in reversed(range(len(out))):
        name, value = split_option(out[i])
        if name == "--gres" and value:
            out[i] = f"--gres=gpu:{gpus},{value.strip()}"
            return out
    return [f"--gres=gpu:{gpus}", *out]


def with_gpu_resource(args: Sequence[str]) -> list[str]:
    """``dask worker`` options with the resource ``GPU=1`` added to any ``--resources`` given.

    Parameters
    ----------
    args : sequence of str
        The worker options (``--resources`` as ``--resources=a=1``,
        ``["--resources", "a=1"]`` or ``"--resources a=1"``).

    Returns
    -------
    list of str
        The options; ``dask worker`` reads only one ``--resources``, so ``GPU=1``
        joins the last one given (``a=1,GPU=1``) or is added.
    """
    out = list(args)
    extra = f"{GPU_RESOURCE}=1"
    for i in reversed(range(len(out))):
        name, value = split_option(out[i])
        if name != "--resources":
            continue
        if value is not None:  # one item: keep its spelling ("=" or a space)
            out[i] = f"{out[i].rstrip()},{extra}"
        elif i + 1 < len(out):
            out[i + 1] = f"{out[i + 1]},{extra}"
        else:
            out.append(extra)
        return out
    return [*out, "--resources", extra]


def gpu_exports(gpus: int) -> list[str]:
    """The job script lines that tell a group's workers about their GPUs.

    Parameters
    ----------
    gpus : int
        GPUs per job of the group.

    Returns
    -------
    list of str
        ``export DASK_RPM_GPUS=<gpus>`` for a GPU group (its nannies give
        each worker one GPU), ``export CUDA_VISIBLE_DEVICES=""`` for the others
        (no GPU seen, even on a node that has some).
    """
    if gpus:
        return [f"export {GPUS_ENV}={gpus}"]
    return [f"export {CUDA_ENV}={shlex.quote(NO_GPU)}"]


def worker_gpu(name: object, environ: Mapping[str, str]) -> str | None:
    """The ``CUDA_VISIBLE_DEVICES`` a worker of a GPU group's job gets, or None outside one.

    Parameters
    ----------
    name : object
        The worker's (or its nanny's) name: ``<job>`` or ``<job>-<k>``.
    environ : mapping
        The job's environment: ``DASK_RPM_GPUS`` (the group's ``gpus``) and
        what SLURM says about the job's GPUs (:func:`dask_rpm.runtime.gpus.job_gpus`).

    Returns
    -------
    str or None
        Entry ``k`` of the job's GPUs; None where ``DASK_RPM_GPUS`` is unset or 0.

    Raises
    ------
    SlurmConfigError
        ``DASK_RPM_GPUS`` is not a whole number.
    dask_rpm.runtime.gpus.GPUAssignmentError
        The name has no place in the job, or the job sees too few GPUs.
    """
    raw = environ.get(GPUS_ENV, "").strip()
    if not raw:
        return None
    if not raw.isdigit():
        raise SlurmConfigError(
            f"{GPUS_ENV}={raw!r} in the job's environment; it must be the group's gpus, a whole "
            f"number (the job script sets it: leave it alone in job_script_prologue)"
        )
    gpus = int(raw)
    if not gpus:
        return None
    return assign_gpu(worker_position(name, gpus), gpus, job_gpus(environ))
