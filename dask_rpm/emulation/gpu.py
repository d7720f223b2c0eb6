"""GPU workers of a local cluster: which workers get a GPU, which GPU, and what they run as.

``local_cluster(speeds, gpus=N)`` gives its first N workers (indices
``0 .. N-1``) one GPU of this machine each: the Dask resource ``GPU=1`` and
``CUDA_VISIBLE_DEVICES=<that GPU>`` in the worker process's environment, set
by its nanny before the process starts, so the worker sees exactly that GPU,
as device 0. Every other worker gets ``CUDA_VISIBLE_DEVICES=""`` and sees no
GPU. ``fit(backend="auto")`` then trains on the GPU workers' GPUs and on the
others' CPUs.

**A GPU worker is not emulated: it runs REAL.** It carries no
``"rpm-emulation"`` plugin, so its kernels are not paced and its entry in
``speeds`` is not used: its speed is what its GPU does, measured by the probe
and DRPM like any real worker's. The other workers are paced as always, at a
scale that leaves the GPU workers' threads their cores (they drive their GPU
from the CPU). Link emulation (``nodes=``) applies to every worker alike.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from ..runtime.gpus import CUDA_ENV, NO_GPU, WORKER_GPU_ENV, local_gpus, machine_gpu_count
from .settings import EmulationSettings

__all__ = ["gpu_label", "local_gpu_workers", "worker_gpu_env"]


def _checked_count(gpus: Any, workers: int, processes: bool) -> int:
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 0:
        raise ValueError(
            f"local_cluster(gpus={gpus!r}): expected an integer >= 0, the number of workers "
            f"(the first ones) that get a GPU of this machine each; e.g. gpus=1"
        )
    if gpus and not processes:
        raise ValueError(
            f"local_cluster(gpus={gpus}, processes=False): in-process workers share this process "
            f"and the GPUs it sees, so none can have a GPU of its own; use processes=True (the default)"
        )
    if gpus > workers:
        raise ValueError(
            f"local_cluster(gpus={gpus}) with {workers} worker(s): the first {gpus} workers get "
            f"a GPU each, so give at least {gpus} speeds (a GPU worker's speed is not used: it "
            f"runs REAL, unpaced)"
        )
    return gpus


def local_gpu_workers(
    gpus: Any,
    workers: int,
    *,
    processes: bool,
    schedule: Mapping[int, Any],
    env: Mapping[str, Any] | None,
) -> dict[int, str]:
    """The GPU of each GPU worker of a local cluster, ``{worker index: CUDA_VISIBLE_DEVICES}``.

    Parameters
    ----------
    gpus : int or None
        Workers that get a GPU (the first ones); None: ``rpm.emulation.gpus``.
    workers : int
        Workers of the cluster.
    processes : bool
        Whether each worker has a process of its own (a GPU worker must).
    schedule : mapping
        EMULATED speed changes by worker index (none may name a GPU worker).
    env : mapping or None
        Environment the caller gives every worker (may not set ``CUDA_VISIBLE_DEVICES``
        when there are GPU workers: the cluster sets it per worker).

    Returns
    -------
    dict
        Worker ``k < gpus`` -> the ``k``-th GPU of this machine (those
        ``CUDA_VISIBLE_DEVICES`` names, where this process has it set, else
        ``0 .. count-1``: :func:`dask_rpm.runtime.gpus.local_gpus`); empty for ``gpus=0``.

    Raises
    ------
    ValueError
        ``gpus`` is not an integer >= 0 or exceeds the workers, the workers
        share this process, a schedule or ``env`` would undo a GPU worker, or
        this machine has fewer GPUs than asked for.
    """
    if gpus is None:
        gpus = EmulationSettings.from_config().gpus
    n = _checked_count(gpus, workers, processes)
    if not n:
        return {}
    paced = sorted(i for i in schedule if i < n)
    if paced:
        raise ValueError(
            f"schedule for worker(s) {paced}: the first {n} worker(s) have a GPU and run REAL, "
            f"unpaced, so a speed schedule would do nothing there; schedule workers {n} and up"
        )
    if env and CUDA_ENV in env:
        raise ValueError(
            f"env sets {CUDA_ENV}={env[CUDA_ENV]!r}, but local_cluster(gpus={n}) sets it for "
            f"each worker (its GPU, or none); remove it from env"
        )
    available = local_gpus(os.environ, machine_gpu_count)
    if n > len(available):
        where = (
            f"{CUDA_ENV}={os.environ[CUDA_ENV]!r} in this process shows {len(available)}"
            if CUDA_ENV in os.environ
            else f"this machine has {len(available)} (nvidia-smi -L, else torch.cuda.device_count())"
        )
        fewer = f"gpus={len(available)} or fewer" if available else "gpus=0 (CPU workers only)"
        raise ValueError(
            f"local_cluster(gpus={n}) asks for {n} GPU(s), one per GPU worker, but {where}; "
            f"use {fewer}, or run on a machine with more GPUs"
        )
    return {k: available[k] for k in range(n)}


def worker_gpu_env(device: str | None) -> dict[str, str]:
    """The environment that shows a worker process its GPU (``device``), or no GPU (None)."""
    if device is None:
        return {CUDA_ENV: NO_GPU}
    return {CUDA_ENV: device, WORKER_GPU_ENV: device}


def gpu_label(devices: Mapping[int, str]) -> str:
    """Which workers are on which GPUs, for a cluster's label: ``workers 0, 1 on GPUs 0, 1``."""
    many = len(devices) > 1
    return (
        f"worker{'s' if many else ''} {', '.join(str(i) for i in devices)} on "
        f"GPU{'s' if many else ''} {', '.join(devices.values())}"
    )
