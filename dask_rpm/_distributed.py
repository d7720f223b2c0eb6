"""The semi-private parts of ``distributed`` that dask_rpm uses, gathered in one place.

``distributed``'s public API (``Client``, ``get_worker``, ``SchedulerPlugin``,
``WorkerPlugin``, ``SpecCluster``...) does not cover everything the engine, the
dashboard page and the clusters need; what it does not cover is imported here,
and only here, each with what it is and why the public API does not do. These
names may change in any Dask release (CalVer has no major versions), so
``tests/test_distributed_api.py`` exercises each one for real: a release that
breaks one fails a test named after it, and ``.ci/run`` runs those tests on the
newest releases the registry serves. The range of Dask releases dask_rpm accepts
is in ``pyproject.toml``.

Two more semi-private parts are used as attributes, not imported, so they are
listed here and tested there too:

* the scheduler's ``identity`` RPC with ``n_workers=-1`` (distributed >= 2025.4.0):
  every worker of the cluster in one call from the event loop.
  ``Client.scheduler_info`` is the public face of the same RPC, but it blocks a
  synchronous client and returns only the first 5 workers before 2026.7.
* ``SpecCluster._correct_state``: starts and stops workers (SLURM jobs) until the
  cluster matches its ``worker_spec``. ``SpecCluster.scale`` is the public way,
  but it schedules the change in the background, so ``sbatch`` and ``scancel``
  errors would reach only the log (``dask_rpm.slurm.cluster``).

The dashboard's names (:data:`BokehApplication`, :data:`template_variables`,
:data:`BOKEH_THEME`, :data:`env`) import bokeh, about half a second that only the
``/rpm`` page needs: they are imported on first use (``__getattr__``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# The coroutine behind distributed.wait(futures, timeout, return_when). The public wait runs
# it through client.sync, which blocks; the engine's driver is a coroutine on the client's
# event loop and must await it instead.
from distributed.client import FIRST_COMPLETED
from distributed.client import _wait as wait_async

# The enum of server, cluster, worker and job states (running, closing_gracefully, failed...).
# Exported as distributed.Status but undocumented; the SLURM cluster sets its jobs' status as
# SpecCluster expects, and the emulation's pacing plugin reads a closing worker's.
from distributed.core import Status

# to_serialize(obj): marks a value in an RPC reply for Dask's serialization (numpy arrays sent as
# frames, not pickled into the message). The worker's rpm_rows handler replies with parameter
# rows this way; it is how distributed's own handlers send data, and documented only there.
from distributed.protocol import to_serialize

# NoOpAwaitable: an awaitable that does nothing, what SpecCluster.scale returns on an
# asynchronous cluster so that `await cluster.scale(...)` works; the SLURM cluster's scale keeps
# that contract, and the public API has no such object.
# sync(loop, coroutine_function, *args): run a coroutine on an event loop from another thread
# and wait for its result, with distributed's thread state, timeout and a clear error when
# called on the loop's own thread. Exported as distributed.sync but undocumented; the block
# and probe tasks run in a worker's executor thread and call coroutines of the worker's loop.
from distributed.utils import NoOpAwaitable, sync

# The memory limit LocalCluster gives each worker for memory_limit="auto" (the machine's memory
# split among the workers). The emulated cluster is a SpecCluster, not a LocalCluster, and
# gives its workers the same share; no public function computes it.
from distributed.worker_memory import parse_memory_limit

if TYPE_CHECKING:  # the types of the dashboard's names, imported on first use below
    from distributed.dashboard.components.scheduler import BOKEH_THEME, env
    from distributed.dashboard.core import BokehApplication
    from distributed.dashboard.scheduler import template_variables

__all__ = [
    "BOKEH_THEME",
    "FIRST_COMPLETED",
    "BokehApplication",
    "NoOpAwaitable",
    "Status",
    "env",
    "parse_memory_limit",
    "sync",
    "template_variables",
    "to_serialize",
    "wait_async",
]

#: The dashboard's names -> their module, imported on first use (they load bokeh).
_DASHBOARD = {
    # Builds the Bokeh server application the Dask dashboard itself is (a function despite its
    # name), so the /rpm page shares the scheduler's HTTP server: its port, static files and
    # websocket settings. Dask has no public way to add a page to its dashboard.
    "BokehApplication": "distributed.dashboard.core",
    # template_variables(scheduler): the dict the dashboard's pages are rendered with; its
    # "pages" list is the navigation bar, where /rpm adds its link. No public API.
    "template_variables": "distributed.dashboard.scheduler",
    # The dashboard's Bokeh theme and its Jinja environment (the "simple.html" template with the
    # navigation bar), so the /rpm page looks like Dask's own pages. No public API.
    "BOKEH_THEME": "distributed.dashboard.components.scheduler",
    "env": "distributed.dashboard.components.scheduler",
}


def __getattr__(name: str) -> Any:
    """Import one of the dashboard's names on first use (PEP 562)."""
    try:
        module = _DASHBOARD[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    return getattr(importlib.import_module(module), name)
