"""Which GPU a worker process sees: ``CUDA_VISIBLE_DEVICES`` for each worker of a job.

A GPU worker trains on the one GPU it sees (device 0 of its process) and a
CPU worker sees none, so the array backend's ``device="auto"``
(:mod:`dask_rpm.nn.backend`) needs nothing but the right
``CUDA_VISIBLE_DEVICES`` in each worker process, set before CUDA starts there.
Two places set it:

* SLURM groups with ``gpus: N`` (:mod:`dask_rpm.slurm`): the job asks for
  ``--gres=gpu:N`` and runs N worker processes, named ``<job>-0`` ..
  ``<job>-<N-1>`` by dask-jobqueue; each process's nanny gives its worker entry
  ``k`` of the job's GPUs (:func:`job_gpus`, :func:`worker_position`,
  :func:`assign_gpu`);
* ``dask_rpm.local_cluster(gpus=N)`` (:mod:`dask_rpm.emulation.cluster`):
  worker ``k < N`` gets entry ``k`` of this machine's GPUs (:func:`local_gpus`).

Everything here but :func:`machine_gpu_count` is pure: it reads the mapping it is
given, never the process's environment.

A leaf: it imports nothing of dask_rpm, so the SLURM and the local cluster share it.
"""

from __future__ import annotations

import importlib
import re
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence

__all__ = [
    "CUDA_ENV",
    "GPUS_ENV",
    "GPU_RESOURCE",
    "NO_GPU",
    "WORKER_GPU_ENV",
    "GPUAssignmentError",
    "assign_gpu",
    "job_gpus",
    "local_gpus",
    "machine_gpu_count",
    "visible_entries",
    "worker_position",
]

#: The variable CUDA reads when it starts in a process: the GPUs it may use, in order.
CUDA_ENV = "CUDA_VISIBLE_DEVICES"
#: Its value on a worker that must see no GPU.
NO_GPU = ""
#: GPUs of the worker's SLURM job (a group's ``gpus``), exported by its job script.
GPUS_ENV = "DASK_RPM_GPUS"
#: The ``CUDA_VISIBLE_DEVICES`` entry a worker process was given (set with it: says it is done).
WORKER_GPU_ENV = "DASK_RPM_WORKER_GPU"
#: The Dask worker resource a GPU worker holds one of (``client.submit(..., resources={"GPU": 1})``).
GPU_RESOURCE = "GPU"

# an entry CUDA accepts: an index, or a GPU / MIG UUID (it stops reading at the first other one)
_ENTRY = re.compile(r"^(\d+|GPU-[0-9A-Za-z-]+|MIG-[0-9A-Za-z/-]+)$")
# what SLURM sets for a job's GPUs when CUDA_VISIBLE_DEVICES is not (global indices)
_SLURM_GPU_VARS = ("SLURM_JOB_GPUS", "SLURM_STEP_GPUS")


class GPUAssignmentError(RuntimeError):
    """A worker cannot be given a GPU of its own (the message says what was seen and what to do)."""


def visible_entries(value: str) -> tuple[str, ...]:
    """The GPUs a ``CUDA_VISIBLE_DEVICES`` value names, read as CUDA reads it.

    Comma-separated indices or ``GPU-``/``MIG-`` UUIDs, up to the first entry
    that is neither (``-1``, ``NoDevFiles``, an empty one): CUDA ignores
    everything from there on, so ``""`` and ``"-1"`` name no GPU.

    Parameters
    ----------
    value : str
        The variable's value.

    Returns
    -------
    tuple of str
        The entries, in order.
    """
    out: list[str] = []
    for entry in value.split(","):
        entry = entry.strip()
        if not _ENTRY.match(entry):
            break
        out.append(entry)
    return tuple(out)


def job_gpus(environ: Mapping[str, str]) -> tuple[str, ...] | None:
    """The GPUs a SLURM job was given, as ``CUDA_VISIBLE_DEVICES`` entries.

    ``CUDA_VISIBLE_DEVICES`` first: slurmd sets it for a job with
    ``--gres=gpu:N`` in the numbering the job's processes see (``0,1`` where
    cgroups confine the job to its GPUs); else ``SLURM_JOB_GPUS`` or
    ``SLURM_STEP_GPUS`` (the node's indices).

    Parameters
    ----------
    environ : mapping
        The job's environment.

    Returns
    -------
    tuple of str or None
        The entries, or None where none of the variables is set (then a job's
        GPUs are taken to be ``0 .. N-1``: :func:`assign_gpu`).
    """
    if CUDA_ENV in environ:
        return visible_entries(environ[CUDA_ENV])
    for var in _SLURM_GPU_VARS:
        if environ.get(var, "").strip():
            return visible_entries(environ[var])
    return None


def worker_position(name: object, processes: int) -> int:
    """Position ``k`` of a worker among the processes of its job, from its name.

    dask-jobqueue names a job's workers ``<job>`` (one process) or
    ``<job>-0`` .. ``<job>-<processes-1>`` (``dask worker --nworkers``).

    Parameters
    ----------
    name : object
        The worker's (or its nanny's) name.
    processes : int
        Worker processes of the job.

    Returns
    -------
    int

    Raises
    ------
    GPUAssignmentError
        A name without the ``-<k>`` suffix of a multi-process job, or ``k`` out of range.
    """
    if processes <= 1:
        return 0
    tail = str(name).rpartition("-")[2]
    if not tail.isdigit() or int(tail) >= processes:
        raise GPUAssignmentError(
            f"worker {name!r}: a job of {processes} worker processes names them <job>-0 .. "
            f"<job>-{processes - 1}, so its GPU cannot be chosen from this name; start the job's "
            f"workers with dask-jobqueue (dask worker --name <job> --nworkers {processes})"
        )
    return int(tail)


def assign_gpu(position: int, gpus: int, available: Sequence[str] | None) -> str:
    """The ``CUDA_VISIBLE_DEVICES`` value of the worker at ``position`` of a job with ``gpus`` GPUs.

    Parameters
    ----------
    position : int
        The worker's place among its job's processes (:func:`worker_position`).
    gpus : int
        GPUs of the job, one per worker process.
    available : sequence of str or None
        The job's GPUs (:func:`job_gpus`); None: ``0 .. gpus-1``.

    Returns
    -------
    str
        One entry: worker ``k`` gets the ``k``-th GPU, so no two share one.

    Raises
    ------
    GPUAssignmentError
        The job sees fewer GPUs than it has GPU workers.
    """
    entries = [str(i) for i in range(gpus)] if available is None else list(available)
    if not 0 <= position < min(gpus, len(entries)):
        raise GPUAssignmentError(
            f"GPU worker {position} of a job with gpus={gpus}: the job sees {len(entries)} GPU(s) "
            f"({CUDA_ENV}={','.join(entries)!r}), so it would have no GPU of its own; check that "
            f"the job got --gres=gpu:{gpus} (scontrol show job) and that nothing in the prologue "
            f"changes {CUDA_ENV}"
        )
    return entries[position]


def local_gpus(environ: Mapping[str, str], count: Callable[[], int]) -> tuple[str, ...]:
    """The GPUs a local cluster may hand out, as ``CUDA_VISIBLE_DEVICES`` entries.

    Parameters
    ----------
    environ : mapping
        The environment the cluster is started from: where it sets
        ``CUDA_VISIBLE_DEVICES`` (a SLURM allocation, a user's choice) those
        GPUs, in order.
    count : callable
        Counts the machine's GPUs (:func:`machine_gpu_count`); called only where
        the environment does not say: then ``0 .. count()-1``.

    Returns
    -------
    tuple of str
    """
    if CUDA_ENV in environ:
        return visible_entries(environ[CUDA_ENV])
    return tuple(str(i) for i in range(count()))


def machine_gpu_count() -> int:
    """The GPUs of this machine: ``nvidia-smi -L``, else ``torch.cuda.device_count()``, else 0.

    ``nvidia-smi`` starts no CUDA in this process; torch is asked only where
    it is installed and ``nvidia-smi`` is not on the ``PATH``.

    Returns
    -------
    int
    """
    smi = shutil.which("nvidia-smi")
    if smi is not None:
        try:
            run = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            run = None
        if run is not None and run.returncode == 0:
            return sum(1 for line in run.stdout.splitlines() if line.startswith("GPU "))
    try:
        torch = importlib.import_module("torch")
    except ImportError:
        return 0
    try:
        return int(torch.cuda.device_count())
    except Exception:  # a CUDA build without a driver raises rather than counting 0
        return 0
