"""The scheduler side of dask_rpm, at the path job scripts and preloads name: ``dask_rpm.plugin``.

The recorder, :class:`RPMSchedulerPlugin`, lives in
:mod:`dask_rpm.engine.scheduler_plugin`; the ``/rpm`` dashboard that reads it
in :mod:`dask_rpm.dashboard`. This module keeps the public import path and is
the preload entry point (``dask scheduler --preload dask_rpm.plugin``, or
dask-jobqueue's ``scheduler_options={"preload": ["dask_rpm.plugin"]}``),
which adds the recorder (it installs the dashboard).
"""

from __future__ import annotations

from typing import Any

from .engine.scheduler_plugin import PLUGIN_NAME, TOPIC, RPMSchedulerPlugin

__all__ = ["RPMSchedulerPlugin", "PLUGIN_NAME", "TOPIC", "dask_setup"]


def dask_setup(scheduler: Any) -> None:
    """Scheduler preload entry point: add the recorder, which installs the dashboard that shows
    it and the engine's worker plugin when it starts with the scheduler (after the preloads
    ran), so ``/rpm`` exists before the first training run.
    """
    scheduler.add_plugin(RPMSchedulerPlugin(), idempotent=True)
