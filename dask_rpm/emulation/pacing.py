"""Pacing on the worker: the ``"rpm-emulation"`` plugin and :func:`pace`.

.. warning::
   EMULATION, not hardware measurement: a slow worker is made slow by
   sleeping after each paced block (see :mod:`dask_rpm.emulation`).

:class:`EmulationPlugin` holds one worker's speed, scale, schedule and
overrun counters; :func:`pace` is the context manager the kernels wrap their
compute in, and :func:`current_speed` reads the speed. Both are no-ops
outside a worker carrying the plugin.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
import weakref
from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from distributed import Worker, get_worker
from distributed.diagnostics.plugin import WorkerPlugin

from .._distributed import Status
from ..runtime.hooks import worker_hooks
from ..runtime.threads import limit_blas
from .profile import PLUGIN_NAME, check_speed, parse_schedule
from .rate import calibrate_rate
from .settings import EmulationSettings

__all__ = [
    "BLAS_VARS",
    "EmulationPlugin",
    "current_speed",
    "pace",
    "pin_blas",
    "worker_plugin",
]

logger = logging.getLogger(__name__)

#: Environment variables that size the BLAS/OpenMP thread pools of a process.
BLAS_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
#: Block keys whose reference CPU time a worker remembers (least recently used dropped).
_MAX_KEYS = 512


def _last_at_or_before(
    entries: Sequence[tuple[float, float]], x: float
) -> tuple[float, float] | None:
    found = None
    for key, speed in entries:
        if key <= x:
            found = (key, speed)
        else:
            break
    return found


# --------------------------------------------------------------------------
# the worker plugin
# --------------------------------------------------------------------------


class EmulationPlugin(WorkerPlugin):
    """Per-worker emulation state: speed, scale, schedule and overrun counters.

    Registered on a worker under :data:`PLUGIN_NAME` (``"rpm-emulation"``);
    :func:`pace` and :func:`current_speed` look it up there.

    Parameters
    ----------
    speed : float
        Relative speed from the start (1.0 = one ``scale`` of a core).
    scale : float
        Fraction of a core that speed 1.0 stands for.
    schedule : iterable of tuple, optional
        Speed changes: ``(iteration, speed)`` takes effect from that iteration
        on; ``("t", seconds, speed)`` takes effect that many seconds after the
        clock origin (the worker's first paced block, or :func:`reset_clock`).
    index : int, optional
        Position of the worker in the emulated profile (``speeds[index]``).
    pin_blas : bool
        Limit BLAS threads of this process to the worker's thread count at
        setup. Only for workers that own their process.
    overrun_tolerance : float, optional
        A block counts as an overrun when its wall time exceeds the target by
        more than this fraction (``rpm.emulation.overrun-tolerance``).
    rate : float or dict, optional
        Flop equivalents per second of one warm core on the BP kernels
        (:func:`calibrate_rate`), per dtype name (a float means float64);
        blocks that state their ``work`` last ``work / (rate * speed * scale)``.
        A dtype without a rate is measured on the worker when first used.
    rate_fraction : float, optional
        Speed 1.0 x scale 1.0 as a fraction of one warm core's throughput, for the rates
        measured on the worker (``rpm.emulation.rate-fraction``).

    Notes
    -----
    When speed sources disagree, the most recent event wins: the base speed,
    the current iteration entry (activated when first seen), the current time
    entry (activated at its time) and a :func:`set_speed` override (activated
    when set).
    """

    name = PLUGIN_NAME

    def __init__(
        self,
        speed: float,
        scale: float = 1.0,
        schedule: Iterable[Sequence[Any]] = (),
        *,
        index: int | None = None,
        pin_blas: bool = False,
        overrun_tolerance: float | None = None,
        rate: float | Mapping[str, float] | None = None,
        rate_fraction: float | None = None,
    ) -> None:
        self.speed = check_speed(speed)
        rates = {} if rate is None else rate if isinstance(rate, Mapping) else {"float64": rate}
        self.rates = {str(k): check_speed(v, "rate") for k, v in rates.items()}
        self.scale = check_speed(scale, "scale")
        self.schedule = tuple(tuple(e) for e in schedule)
        self._by_iter, self._by_time = parse_schedule(self.schedule)
        self.index = index
        self.pin_blas = pin_blas
        if overrun_tolerance is None or rate_fraction is None:  # read where it is built
            settings = EmulationSettings.from_config(
                overrun_tolerance=overrun_tolerance, rate_fraction=rate_fraction
            )
            overrun_tolerance, rate_fraction = settings.overrun_tolerance, settings.rate_fraction
        self.overrun_tolerance = float(overrun_tolerance)
        self.rate_fraction = float(rate_fraction)
        self._init_runtime()

    # -- runtime state (not pickled: the plugin travels to Nanny subprocesses)
    def _init_runtime(self) -> None:
        self._lock = threading.Lock()
        self._local = threading.local()
        self._limiter: Any = None
        self.worker_name: Any = None
        self.address: str | None = None
        self.nthreads: int | None = None
        self.t0: float | None = None  # clock origin for ("t", ...) entries
        self.last_iteration: int | None = None
        self._iter_entry: tuple[float, float] | None = None
        self._iter_since = -math.inf
        self._override: float | None = None
        self._override_since = -math.inf
        # smallest CPU time seen per block key (bounded: keys are kernel shapes,
        # a handful per plan; the oldest are dropped past _MAX_KEYS)
        self.reference_cpu: dict[Any, float] = {}
        self.blocks = 0
        self.cpu_s = 0.0
        self.wall_s = 0.0
        self.sleep_s = 0.0
        self.overruns = 0
        self.overrun_s = 0.0

    def __getstate__(self) -> dict[str, Any]:
        keep = (
            "speed",
            "scale",
            "schedule",
            "_by_iter",
            "_by_time",
            "index",
            "pin_blas",
            "overrun_tolerance",
            "rates",
            "rate_fraction",
        )
        return {k: self.__dict__[k] for k in keep}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_runtime()

    # -- WorkerPlugin hooks
    def setup(self, worker: Worker) -> None:
        self.worker_name = worker.name
        self.address = worker.address
        self.nthreads = worker.state.nthreads
        if self.index is None and isinstance(worker.name, int):
            self.index = worker.name
        if self.pin_blas:
            self._limiter = pin_blas(self.nthreads)
        logger.info(
            "EMULATED speed %g x scale %.3g on worker %s", self.speed, self.scale, worker.name
        )
        self._quiet_close = _HeartbeatAtClose(worker)
        logging.getLogger("distributed.worker").addFilter(self._quiet_close)
        hooks = worker_hooks(worker)  # the engine's kernels now run at this worker's speed
        hooks.pace, hooks.paced = pace, True
        hooks.describe = self.info  # what a run's EMULATED label says of this worker

    def teardown(self, worker: Worker) -> None:
        hooks = worker_hooks(worker)
        hooks.reset_pace()
        hooks.describe = None
        if self._limiter is not None:
            self._limiter.restore_original_limits()
            self._limiter = None

    # -- speed
    def speed_at(self, iteration: int | None = None, now: float | None = None) -> float:
        """Effective relative speed for ``iteration`` at wall time ``now``.

        Also records the iteration, so that later calls without one (and
        iteration entries) know where the run is.
        """
        now = time.time() if now is None else now
        with self._lock:
            if iteration is not None:
                self.last_iteration = iteration
                entry = _last_at_or_before(self._by_iter, iteration)
                if entry != self._iter_entry:
                    # the iteration track changed value now (or went back
                    # before its first entry: a new run starts over)
                    self._iter_entry = entry
                    self._iter_since = now if entry is not None else -math.inf
            best_since, best = -math.inf, self.speed
            if self._by_time and self.t0 is not None:
                entry_t = _last_at_or_before(self._by_time, now - self.t0)
                if entry_t is not None:
                    best_since, best = self.t0 + entry_t[0], entry_t[1]
            if self._iter_entry is not None and self._iter_since >= best_since:
                best_since, best = self._iter_since, self._iter_entry[1]
            if self._override is not None and self._override_since >= best_since:
                best = self._override
            return best

    def set_speed(self, speed: float | None) -> None:
        """Override the speed from now on; ``None`` removes the override."""
        with self._lock:
            self._override = None if speed is None else check_speed(speed)
            self._override_since = time.time()

    def reset_clock(self, t0: float | None = None) -> None:
        """Set the origin of time-based schedule entries (default: now)."""
        with self._lock:
            self.t0 = time.time() if t0 is None else float(t0)

    @property
    def last_block(self) -> tuple[float, float, float] | None:
        """``(cpu_s, wall_s, target_s)`` of the calling thread's last paced block."""
        return getattr(self._local, "last", None)

    # -- accounting
    def _reference(
        self, key: Hashable, cpu: float, work: float | None = None, dtype: str = "float64"
    ) -> float:
        """CPU time to pace a block on.

        The smallest CPU time seen for ``key`` (``cpu`` itself without a key);
        with ``work``, at least ``work / rate``, which decides for all but
        tiny blocks (there per-call overhead, not flops, sets the time).
        """
        ref = cpu
        if key is not None:
            with self._lock:
                ref = min(cpu, self.reference_cpu.pop(key, cpu))
                self.reference_cpu[key] = ref  # re-inserted: most recently used last
                while len(self.reference_cpu) > _MAX_KEYS:
                    del self.reference_cpu[next(iter(self.reference_cpu))]
        if work is not None:
            rate = self.rates.get(dtype)
            if rate is None:  # a dtype the cluster did not calibrate: measure it here, once
                rate = self.rate_fraction * calibrate_rate(dtype=dtype)
                rate = self.rates.setdefault(dtype, rate)
            ref = max(ref, work / rate)
        return ref

    def _record(self, cpu: float, wall: float, slept: float, late: float) -> None:
        with self._lock:
            self.blocks += 1
            self.cpu_s += cpu
            self.wall_s += wall + slept
            self.sleep_s += slept
            if late > 0:
                self.overruns += 1
                self.overrun_s += late

    def info(self) -> dict[str, Any]:
        """Plain-data snapshot of this worker's emulation state and counters."""
        current = self.speed_at(None)
        with self._lock:
            return {
                "index": self.index,
                "name": self.worker_name,
                "address": self.address,
                "speed": self.speed,
                "current_speed": current,
                "scale": self.scale,
                "nthreads": self.nthreads,
                "schedule": [list(e) for e in self.schedule],
                "override": self._override,
                "last_iteration": self.last_iteration,
                "blocks": self.blocks,
                "cpu_s": self.cpu_s,
                "wall_s": self.wall_s,
                "sleep_s": self.sleep_s,
                "overruns": self.overruns,
                "overrun_s": self.overrun_s,
                "host": _host_of(self.address),
            }


#: Worker states in which a failed heartbeat is part of shutting down.
_CLOSING = (Status.closing, Status.closed, Status.closing_gracefully, Status.failed)


class _HeartbeatAtClose(logging.Filter):
    """Drop the heartbeat traceback of a worker that is closing (nothing is wrong).

    When a cluster shuts down, a worker can be closing its connections while
    a heartbeat to the scheduler is in flight; distributed then logs "Failed
    to communicate with scheduler during heartbeat" with a CommClosedError
    traceback on the worker's stderr - the terminal of whoever closed the
    cluster. Only that record, and only once the worker is closing, is
    dropped; a heartbeat failure of a running worker is still logged.
    """

    def __init__(self, worker: Worker) -> None:
        super().__init__()
        self._worker = weakref.ref(worker)

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith("Failed to communicate with scheduler during heartbeat"):
            return True
        worker = self._worker()
        return worker is None or worker.status not in _CLOSING


def _host_of(address: str | None) -> str | None:
    if not address:
        return None
    rest = address.split("://", 1)[-1]
    return rest.rsplit(":", 1)[0] if rest.count(":") else rest.split("/", 1)[0]


def pin_blas(nthreads: int) -> Any:
    """Pin BLAS/OpenMP thread pools of *this process* to ``nthreads``.

    Environment variables cover libraries loaded later (and child processes);
    threadpoolctl covers ones already loaded. Returns the limiter.
    """
    for var in BLAS_VARS:
        os.environ[var] = str(nthreads)
    return limit_blas(nthreads)


# --------------------------------------------------------------------------
# pace / current_speed: the contract used by the kernels
# --------------------------------------------------------------------------


def worker_plugin() -> EmulationPlugin | None:
    """The :class:`EmulationPlugin` of the worker running this code, or ``None``.

    ``None`` outside a worker (client, serial fit) and on a worker without
    emulation.
    """
    try:
        worker = get_worker()
    except ValueError:  # not inside a worker
        return None
    p = worker.plugins.get(PLUGIN_NAME)
    return p if isinstance(p, EmulationPlugin) else None


class _NoPace:
    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


_NO_PACE = _NoPace()


class _Pace:
    """One paced block; state lives here so concurrent threads don't share it."""

    __slots__ = ("plugin", "iteration", "key", "work", "dtype", "speed", "cpu0", "wall0", "outer")

    def __init__(
        self,
        plugin: EmulationPlugin,
        iteration: int | None,
        key: Hashable = None,
        work: float | None = None,
        dtype: str = "float64",
    ) -> None:
        self.plugin = plugin
        self.iteration = iteration
        self.key = key
        self.work = work
        self.dtype = dtype

    def __enter__(self) -> None:
        p = self.plugin
        local = p._local
        depth = getattr(local, "depth", 0)
        local.depth = depth + 1
        # nested blocks: only the outermost paces, or the inner time is slowed twice
        self.outer = depth == 0
        if self.outer:
            if p.t0 is None:
                p.reset_clock()
            self.speed = p.speed_at(self.iteration)
            self.wall0 = time.perf_counter()
            self.cpu0 = time.thread_time()

    def __exit__(self, exc_type: object, *exc: object) -> None:
        p = self.plugin
        p._local.depth -= 1
        if not self.outer or exc_type is not None:
            return None
        cpu = time.thread_time() - self.cpu0
        wall = time.perf_counter() - self.wall0
        target = p._reference(self.key, cpu, self.work, self.dtype) / (self.speed * p.scale)
        if wall < target:
            time.sleep(target - wall)
            slept = time.perf_counter() - self.wall0 - wall
            p._record(cpu, wall, slept, 0.0)
        else:
            slept = 0.0
            late = wall - target
            p._record(cpu, wall, 0.0, late if late > p.overrun_tolerance * target else 0.0)
        p._local.last = (cpu, wall + slept, target)
        return None


def pace(
    iteration: int | None = None,
    key: Hashable = None,
    work: float | None = None,
    dtype: Any = "float64",
) -> _Pace | _NoPace:
    """Context manager that runs the enclosed compute at the worker's EMULATED speed.

    Measures the calling thread's CPU time in the block and sleeps so that the
    block's wall time is ``cpu_time / (speed * scale)``, where ``cpu_time`` is
    ``work / rate`` when the block states its work, else the smallest CPU time
    this worker has seen for ``key`` (the block's own when no key is given; see
    the module notes). If the block already took
    longer (contention) it does not sleep and counts an overrun. A cheap no-op
    outside a worker carrying the ``"rpm-emulation"`` plugin. Nested blocks are
    paced once, by the outermost. A block that raises is not paced.

    Parameters
    ----------
    iteration : int, optional
        Training iteration the block belongs to; selects the speed from an
        iteration schedule.
    key : hashable, optional
        What the block computes, e.g. ``("backward", x.shape, W.shape)``:
        blocks with equal keys must do the same work.
    work : float, optional
        The block's work in flop equivalents
        (:func:`dask_rpm.nn.kernels.block_work`).
    dtype : str or numpy dtype
        Floating-point type of the work (float32 runs about twice as fast).

    Examples
    --------
    >>> with pace(3):  # doctest: +SKIP
    ...     f = 1 / (1 + np.exp(-(W @ x)))
    """
    p = worker_plugin()
    if p is None:
        return _NO_PACE
    return _Pace(p, iteration, key, work, str(np.dtype(dtype)) if work is not None else "float64")


def current_speed(iteration: int | None = None) -> float | None:
    """EMULATED relative speed of the running worker, or ``None`` without emulation.

    Parameters
    ----------
    iteration : int, optional
        Evaluate an iteration schedule at this iteration (default: the last
        one seen by :func:`pace`).

    Returns
    -------
    float or None
        The relative speed (not multiplied by the scale).
    """
    p = worker_plugin()
    return None if p is None else p.speed_at(iteration)
