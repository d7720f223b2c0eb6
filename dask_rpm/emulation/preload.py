"""Worker preload for workers started elsewhere (dask-jobqueue, SLURM groups, ``dask worker``).

``--preload dask_rpm.emulation`` runs :func:`dask_setup` (re-exported by the
package, whose path job scripts write), which adds an :class:`EmulationPlugin`
built from the ``DASK_RPM_EMULATED_*`` environment variables.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from typing import Any

from distributed import Worker

from .pacing import EmulationPlugin
from .profile import ENV_INDEX, ENV_SCALE, ENV_SCHEDULE, ENV_SPEED, PLUGIN_NAME

__all__ = ["dask_setup", "plugin_from_env"]

logger = logging.getLogger(__name__)


def plugin_from_env(environ: Mapping[str, str] | None = None) -> EmulationPlugin | None:
    """Build an :class:`EmulationPlugin` from ``DASK_RPM_EMULATED_*`` variables.

    ``DASK_RPM_EMULATED_SPEED`` (required) is the relative speed;
    ``DASK_RPM_EMULATED_SCALE`` (default 1: each job has its own cores) the
    fraction of a core per unit speed; ``DASK_RPM_EMULATED_SCHEDULE`` a JSON
    list of ``[iteration, speed]`` / ``["t", seconds, speed]`` entries;
    ``DASK_RPM_EMULATED_INDEX`` the worker's place in the profile. Returns
    ``None`` when the speed variable is unset or empty.
    """
    env = os.environ if environ is None else environ
    raw = env.get(ENV_SPEED, "").strip()
    if not raw:
        return None
    scale = float(env.get(ENV_SCALE, "").strip() or 1.0)
    schedule = json.loads(env.get(ENV_SCHEDULE, "").strip() or "[]")
    idx_raw = env.get(ENV_INDEX, "").strip()
    return EmulationPlugin(
        float(raw), scale, schedule, index=int(idx_raw) if idx_raw else None, pin_blas=True
    )


def dask_setup(worker: Any) -> Any:
    """Worker preload: add EMULATED speed from ``DASK_RPM_EMULATED_SPEED``.

    Start the worker with ``--preload dask_rpm.emulation`` (dask-jobqueue:
    ``worker_extra_args=["--preload", "dask_rpm.emulation"]`` and
    ``job_script_prologue=["export DASK_RPM_EMULATED_SPEED=0.5"]``). Does
    nothing when the variable is unset, or on a scheduler/nanny.
    """
    if not isinstance(worker, Worker):
        logger.info("dask_rpm.emulation preload ignored on %s", type(worker).__name__)
        return None
    plugin = plugin_from_env()
    if plugin is None:
        return None
    # awaited by the preload machinery before the worker registers
    return worker.plugin_add(plugin=plugin, name=PLUGIN_NAME, catch_errors=False)
