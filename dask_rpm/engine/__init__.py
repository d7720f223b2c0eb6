"""The training engine: batch BP by rectangles on a Dask cluster, with a direct worker-to-worker data plane.

* :mod:`~dask_rpm.engine.fit` - :func:`fit`: a run from its options to its result;
  :mod:`~dask_rpm.engine.options` (keywords after ``rpm.*`` defaults, the start),
  :mod:`~dask_rpm.engine.planning` (workers, probe, the first plan),
  :mod:`~dask_rpm.engine.loop` (the block loop);
* :mod:`~dask_rpm.engine.driver` - the driver: shards, blocks, remaps (client side);
* :mod:`~dask_rpm.engine.worker`, :mod:`~dask_rpm.engine.block`,
  :mod:`~dask_rpm.engine.tasks` - the worker side: run state, messages, the iteration loop;
* :mod:`~dask_rpm.engine.callbacks` - per-block hooks;
* :mod:`~dask_rpm.engine.checkpoint`, :mod:`~dask_rpm.engine.store` - checkpoints the workers
  write (``fit(checkpoint_dir=...)``): row files and a manifest written last;
* :mod:`~dask_rpm.engine.timing` - the one timing log;
* :mod:`~dask_rpm.engine.scheduler_plugin` - what the scheduler records (``/rpm`` page);
* :mod:`~dask_rpm.engine.layout` - pure plan views (record types: :mod:`dask_rpm.records`).

See docs/architecture.md for the path of one iteration's data.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_attributes
from ..records import PHASES
from .callbacks import BlockInfo, TrainingCallback
from .driver import Driver, ordered_workers
from .errors import TrainingError, WorkerLostError
from .fit import ensure_plugins, fit
from .result import FitResult

if not TYPE_CHECKING:  # type checkers resolve submodules themselves; a catch-all hides typos
    __getattr__, __dir__ = lazy_attributes(__name__, __path__)  # submodules on first use

__all__ = [
    "fit",
    "FitResult",
    "TrainingError",
    "WorkerLostError",
    "ordered_workers",
    "Driver",
    "TrainingCallback",
    "BlockInfo",
    "ensure_plugins",
    "PHASES",
]
