"""EMULATED heterogeneity: Dask workers of different speeds on one machine.

.. warning::
   Everything here is *emulation*, not hardware measurement. Workers run the
   same kernels on the same cores; a slow worker is made slow by sleeping after
   each paced block. Every output produced with it must carry the label from
   :attr:`EmulatedCluster.emulation_label` (or :func:`emulation_label`).

How it works
------------
Each emulated worker carries a :class:`EmulationPlugin` registered under the
name ``"rpm-emulation"``. Kernels wrap their numpy compute in :func:`pace`::

    with pace(iteration):
        f = sigmoid(W @ x)

:func:`pace` measures the CPU time the calling thread spent in the block
(``time.thread_time``; BLAS is pinned to the worker's thread count, 1 by
default, so BLAS work runs on the calling thread) and sleeps until the block's
wall time is ``cpu_time / (speed * scale)``. A block that already took longer
(contention) is not slowed further and is counted as an *overrun*. Outside an
emulated worker (client, serial fit, plain clusters) :func:`pace` is a no-op.

The CPU time of identical work is itself noisy on a shared machine: measured
on a 2-core VM, the same GEMM block varied by 35 % between its 10th and 90th
percentile, and its median differed by 12 % between four processes (SMT
siblings, cache and memory-bandwidth contention, CPU time charged while
another thread of the core runs). Pacing on it would add that noise to the
emulated speeds; worse, a worker that sleeps most of the time runs its next
block on cold caches and spends 10-30 % more CPU on it, so slow workers looked
slower than their speed. The BP kernels therefore tell :func:`pace` how much
work a block is (``work``, flop equivalents from
:func:`dask_rpm.nn.kernels.block_work`), and the block lasts
``work / (rate * speed * scale)``, where ``rate`` is one warm core's
throughput on these kernels, measured once per cluster
(:func:`calibrate_rate`, once per process, times
``rpm.emulation.rate-fraction``, 0.5: a
block run on cold caches next to other workers takes up to twice its warm
time, and must still finish within its target) and shared by all its
workers. Blocks also pass a *key* naming their work (kernel and shapes): the
worker paces on the smallest CPU time it has seen for that key when that is
longer (tiny blocks, where per-call overhead rather than flops sets the
time), and blocks that state no work pace on it alone; blocks with neither
pace on their own CPU time.

``scale`` converts relative speeds into fractions of a core. It is chosen so
that all workers running at once still fit in the machine::

    scale = min(1, 1 / max(speeds),
                headroom * cores / (threads_per_worker * sum(speeds)))

``headroom`` is ``rpm.emulation.headroom`` (0.8 by default): the rest of the
cores is left for the scheduler, the client and communication. Without this
the timings would measure contention instead of the speed profile.

Speed changes while running (another job starting on a node) come from a
*schedule* (see :func:`local_cluster`) or from :func:`set_speed`. Workers
started elsewhere (e.g. SLURM jobs from dask-jobqueue) get emulation from the
``DASK_RPM_EMULATED_SPEED`` environment variable with
``--preload dask_rpm.emulation`` (see :func:`dask_setup`).

Modules
-------
* :mod:`~dask_rpm.emulation.profile` - speeds, schedules, the scale, the label text (pure);
* :mod:`~dask_rpm.emulation.rate` - one warm core's throughput on the BP kernels;
* :mod:`~dask_rpm.emulation.pacing` - on the worker: :class:`EmulationPlugin`, :func:`pace`;
* :mod:`~dask_rpm.emulation.cluster` - :class:`EmulatedCluster`, :func:`local_cluster`;
* :mod:`~dask_rpm.emulation.links` - EMULATED link classes: delay between emulated nodes;
* :mod:`~dask_rpm.emulation.control` - from the client: labels, reports, :func:`set_speed`;
* :mod:`~dask_rpm.emulation.preload` - :func:`dask_setup` for workers started elsewhere.
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_attributes
from .cluster import EmulatedCluster, local_cluster
from .control import (
    emulation_info,
    emulation_label,
    emulation_report,
    format_report,
    reset_clock,
    set_speed,
    worker_addresses,
)
from .links import (
    LINKS_PLUGIN_NAME,
    EmulatedLinks,
    LinkEmulationPlugin,
    emulated_links,
)
from .pacing import EmulationPlugin, current_speed, pace, worker_plugin
from .preload import dask_setup, plugin_from_env
from .profile import (
    DEFAULT_SPEEDS,
    ENV_INDEX,
    ENV_SCALE,
    ENV_SCHEDULE,
    ENV_SPEED,
    PLUGIN_NAME,
    auto_scale,
)
from .rate import calibrate_rate, process_rate

if not TYPE_CHECKING:  # type checkers resolve submodules themselves; a catch-all hides typos
    __getattr__, __dir__ = lazy_attributes(__name__, __path__)  # submodules on first use

__all__ = [
    "PLUGIN_NAME",
    "DEFAULT_SPEEDS",
    "ENV_SPEED",
    "ENV_SCALE",
    "ENV_SCHEDULE",
    "ENV_INDEX",
    "EmulatedCluster",
    "EmulatedLinks",
    "EmulationPlugin",
    "LINKS_PLUGIN_NAME",
    "LinkEmulationPlugin",
    "auto_scale",
    "calibrate_rate",
    "current_speed",
    "dask_setup",
    "emulation_info",
    "emulation_label",
    "emulated_links",
    "emulation_report",
    "format_report",
    "local_cluster",
    "pace",
    "plugin_from_env",
    "process_rate",
    "reset_clock",
    "set_speed",
    "worker_addresses",
    "worker_plugin",
]
