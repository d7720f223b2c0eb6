"""The scheduler plugin, at the path job scripts and preloads name: ``dask_rpm.plugin``.

It lives in :mod:`dask_rpm.engine.scheduler_plugin`; this module keeps the
public import path and the preload entry point
(``dask scheduler --preload dask_rpm.plugin``).
"""

from __future__ import annotations

from .engine.scheduler_plugin import PLUGIN_NAME, TOPIC, RPMSchedulerPlugin, dask_setup

__all__ = ["RPMSchedulerPlugin", "PLUGIN_NAME", "TOPIC", "dask_setup"]
