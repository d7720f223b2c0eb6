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
:func:`dask_rpm.kernels.block_work`), and the block lasts
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
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
import weakref
from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from dask.system import CPU_COUNT
from distributed import Nanny, Scheduler, SpecCluster, Worker
from distributed.core import Status
from distributed.diagnostics.plugin import WorkerPlugin
from distributed.worker import get_worker

from . import config

__all__ = [
    "PLUGIN_NAME",
    "DEFAULT_SPEEDS",
    "ENV_SPEED",
    "ENV_SCALE",
    "ENV_SCHEDULE",
    "ENV_INDEX",
    "EmulatedCluster",
    "EmulationPlugin",
    "auto_scale",
    "calibrate_rate",
    "current_speed",
    "dask_setup",
    "emulation_info",
    "emulation_label",
    "emulation_report",
    "format_report",
    "local_cluster",
    "pace",
    "plugin_from_env",
    "reset_clock",
    "set_speed",
    "worker_addresses",
]

logger = logging.getLogger(__name__)

PLUGIN_NAME = "rpm-emulation"
#: Speeds used when none are given (also ``rpm.emulation.speeds``): one fast,
#: one half-speed and one quarter-speed worker.
DEFAULT_SPEEDS: tuple[float, ...] = (1.0, 0.5, 0.25)

ENV_SPEED = "DASK_RPM_EMULATED_SPEED"
ENV_SCALE = "DASK_RPM_EMULATED_SCALE"
ENV_SCHEDULE = "DASK_RPM_EMULATED_SCHEDULE"
ENV_INDEX = "DASK_RPM_EMULATED_INDEX"
_BLAS_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
#: Block keys whose reference CPU time a worker remembers (least recently used dropped).
_MAX_KEYS = 512

# --------------------------------------------------------------------------
# schedule parsing
# --------------------------------------------------------------------------


def _check_speed(speed: Any, what: str = "speed") -> float:
    s = float(speed)
    if not (math.isfinite(s) and s > 0):
        raise ValueError(f"{what} must be a finite number > 0, got {speed!r}")
    return s


def _parse_entries(
    entries: Iterable[Sequence[Any]],
) -> tuple[tuple[tuple[int, float], ...], tuple[tuple[float, float], ...]]:
    """Split one worker's schedule into sorted iteration and time entries."""
    by_iter: list[tuple[int, float]] = []
    by_time: list[tuple[float, float]] = []
    for e in entries:
        e = tuple(e)
        if len(e) == 3 and e[0] == "t":
            sec = float(e[1])
            if not (math.isfinite(sec) and sec >= 0):
                raise ValueError(f"schedule time must be >= 0 seconds, got {e!r}")
            by_time.append((sec, _check_speed(e[2])))
        elif len(e) == 2 and not isinstance(e[0], str):
            it = int(e[0])
            if it != e[0] or it < 0:
                raise ValueError(f"schedule iteration must be an int >= 0, got {e!r}")
            by_iter.append((it, _check_speed(e[1])))
        else:
            raise ValueError(
                f"schedule entry {e!r} is neither (iteration, speed) nor ('t', seconds, speed)"
            )
    # stable sort: of two entries at the same point the later one listed wins
    by_iter.sort(key=lambda p: p[0])
    by_time.sort(key=lambda p: p[0])
    return tuple(by_iter), tuple(by_time)


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
        rate: float | None = None,
    ) -> None:
        self.speed = _check_speed(speed)
        rates = {} if rate is None else rate if isinstance(rate, Mapping) else {"float64": rate}
        self.rates = {str(k): _check_speed(v, "rate") for k, v in rates.items()}
        self.scale = _check_speed(scale, "scale")
        self.schedule = tuple(tuple(e) for e in schedule)
        self._by_iter, self._by_time = _parse_entries(self.schedule)
        self.index = index
        self.pin_blas = pin_blas
        self.overrun_tolerance = float(config.get("emulation.overrun-tolerance", overrun_tolerance))
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
        self._iter_entry: tuple[int, float] | None = None
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
            self._limiter = _pin_blas(self.nthreads)
        logger.info(
            "EMULATED speed %g x scale %.3g on worker %s", self.speed, self.scale, worker.name
        )
        self._quiet_close = _HeartbeatAtClose(worker)
        logging.getLogger("distributed.worker").addFilter(self._quiet_close)

    def teardown(self, worker: Worker) -> None:
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
            self._override = None if speed is None else _check_speed(speed)
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
                rate = float(config.get("emulation.rate-fraction")) * calibrate_rate(dtype=dtype)
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


def _pin_blas(nthreads: int) -> Any:
    """Pin BLAS/OpenMP thread pools of *this process* to ``nthreads``.

    Environment variables cover libraries loaded later (and child processes);
    threadpoolctl covers ones already loaded. Returns the limiter (or None).
    """
    for var in _BLAS_VARS:
        os.environ[var] = str(nthreads)
    try:
        import numpy  # noqa: F401  (load BLAS now so the limit below reaches it)
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - threadpoolctl is optional
        logger.warning("threadpoolctl not installed: BLAS threads pinned only by environment")
        return None
    return threadpool_limits(limits=nthreads)


# --------------------------------------------------------------------------
# pace / current_speed: the contract used by the kernels
# --------------------------------------------------------------------------


def _plugin() -> EmulationPlugin | None:
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


def calibrate_rate(
    repeats: int = 7,
    shape: tuple[int, int, int, int] = (256, 256, 16, 1024),
    dtype: Any = "float64",
) -> float:
    """Throughput of one warm core on the BP kernels, in flop equivalents per second.

    Runs :func:`~dask_rpm.kernels.forward_partial` and
    :func:`~dask_rpm.kernels.backward_partial` on a ``(n, m, l, s)`` block a
    few times after a warm-up and divides their work
    (:func:`~dask_rpm.kernels.block_work`) by the median process CPU time
    with BLAS limited to one thread (process time, so that a BLAS that could
    not be limited is counted whole). About 0.1-0.3 s. EMULATED workers of one cluster share the result, so their
    speeds differ by exactly their ratios.
    """
    from .kernels import backward_partial, block_work, forward_partial

    n, m, l, s = shape
    rng = np.random.default_rng(0)
    x, W, V, delta2 = (
        a.astype(dtype)
        for a in (
            rng.normal(size=(s, n)),
            rng.normal(size=(m, n)) * 0.1,
            rng.normal(size=(l, m)) * 0.1,
            rng.normal(size=(s, l)),
        )
    )
    work = block_work("forward", s, m, n, l) + block_work("backward", s, m, n, l)
    try:  # one BLAS thread, as on the workers
        from threadpoolctl import threadpool_limits

        limiter: Any = threadpool_limits(limits=1)
    except ImportError:  # pragma: no cover - then process time counts every BLAS thread
        limiter = None
    cpu = []
    try:
        for i in range(repeats + 1):
            c0 = time.process_time()
            f, _ = forward_partial(x, W, V)
            backward_partial(x, f, V, delta2)
            if i:  # the first pass warms caches and BLAS up
                cpu.append(time.process_time() - c0)
    finally:
        if limiter is not None:
            limiter.restore_original_limits()
    cpu.sort()
    return work / max(cpu[len(cpu) // 2], 1e-9)


_RATES: dict[str, float] = {}


def _process_rate(dtype: str) -> float:
    """:func:`calibrate_rate` once per process and dtype: every emulated cluster a
    session starts then runs at the same absolute speeds, so their timings
    compare (a benchmark's arms, a test's reference run)."""
    if dtype not in _RATES:
        _RATES[dtype] = calibrate_rate(dtype=dtype)
    return _RATES[dtype]


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
        (:func:`dask_rpm.kernels.block_work`).
    dtype : str or numpy dtype
        Floating-point type of the work (float32 runs about twice as fast).

    Examples
    --------
    >>> with pace(3):  # doctest: +SKIP
    ...     f = 1 / (1 + np.exp(-(W @ x)))
    """
    p = _plugin()
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
    p = _plugin()
    return None if p is None else p.speed_at(iteration)


# --------------------------------------------------------------------------
# scale
# --------------------------------------------------------------------------


def auto_scale(
    speeds: Sequence[float],
    threads_per_worker: int = 1,
    *,
    cores: int | None = None,
    headroom: float | None = None,
) -> float:
    """Largest scale at which every emulated worker can run at once.

    With all workers busy, worker *i* keeps ``threads_per_worker`` threads
    each ``speeds[i] * scale`` of a core busy, so the total demand is
    ``scale * threads_per_worker * sum(speeds)``; it must stay within
    ``headroom * cores``. No thread can exceed one core
    (``scale <= 1 / max(speeds)``), and ``scale <= 1`` keeps "speed 1.0 =
    at most one full core".

    Parameters
    ----------
    speeds : sequence of float
        Relative speeds, one per worker.
    threads_per_worker : int
        Threads of every worker.
    cores : int, optional
        Cores of the machine (default: ``dask.system.CPU_COUNT``).
    headroom : float, optional
        Fraction of the cores the workers may use (``rpm.emulation.headroom``).

    Returns
    -------
    float
    """
    if not speeds:
        raise ValueError("need at least one speed")
    sp = [_check_speed(s) for s in speeds]
    cores = CPU_COUNT if cores is None else int(cores)
    headroom = float(config.get("emulation.headroom", headroom))
    if not 0 < headroom:
        raise ValueError(f"headroom must be > 0, got {headroom}")
    return min(1.0, 1.0 / max(sp), headroom * cores / (threads_per_worker * sum(sp)))


# --------------------------------------------------------------------------
# the cluster
# --------------------------------------------------------------------------


def _fmt_schedule(schedule: Mapping[int, Sequence[Sequence[Any]]]) -> str:
    parts = []
    for i in sorted(schedule):
        for e in schedule[i]:
            if len(e) == 3:
                parts.append(f"w{i}->{_num(float(e[2]))} after {float(e[1]):g} s")
            else:
                parts.append(f"w{i}->{_num(float(e[1]))} from iteration {int(e[0])}")
    return ", ".join(parts)


def _num(x: float) -> str:
    """Short number that still reads as a real (1.0, 0.5, 0.125)."""
    text = f"{x:.4g}"
    return text if any(c in text for c in ".en") else text + ".0"


def _label(
    speeds: Sequence[float],
    scale: Sequence[float] | float,
    where: str,
    schedule: Mapping[int, Sequence[Sequence[Any]]] | None = None,
) -> str:
    scales = sorted(
        {float(scale)} if isinstance(scale, (int, float)) else {float(s) for s in scale}
    )
    sc = ", ".join(f"{s:.3g}" for s in scales)
    text = (
        f"EMULATED heterogeneity {where}: speeds {', '.join(_num(s) for s in speeds)}"
        f" x scale {sc} of a core"
    )
    if schedule:
        text += f"; schedule: {_fmt_schedule(schedule)}"
    return text


class EmulatedCluster(SpecCluster):
    """A local Dask cluster whose workers run paced kernels at EMULATED speeds.

    Built like :class:`distributed.LocalCluster`: one scheduler and one worker
    (a :class:`~distributed.Nanny` process, or an in-process
    :class:`~distributed.Worker` when ``processes=False``) per speed, named
    ``0 .. N-1`` in the order of ``speeds``, on 127.0.0.1. Use
    :func:`local_cluster` to create one; the parameters are the same.

    Attributes
    ----------
    speeds : tuple of float
        Relative speed of worker ``i`` (at start; see ``schedule``).
    scale_factor : float
        Fraction of a core that speed 1.0 stands for.
    schedule : dict
        Speed changes per worker index.
    threads_per_worker : int
    emulation_label : str
        One line to print with every result obtained on this cluster.

    Notes
    -----
    The set of workers is fixed; ``scale()`` can shrink it but not add
    workers (there would be no speed to give them).
    """

    def __init__(
        self,
        speeds: Sequence[float] | None = None,
        *,
        scale: float | None = None,
        threads_per_worker: int | None = None,
        processes: bool = True,
        schedule: Mapping[int, Sequence[Sequence[Any]]] | None = None,
        dashboard_address: str | None = ":0",
        headroom: float | None = None,
        scheduler_kwargs: dict[str, Any] | None = None,
        asynchronous: bool = False,
        loop: Any = None,
        silence_logs: int | bool = logging.WARN,
        name: str | None = None,
        **worker_kwargs: Any,
    ) -> None:
        if speeds is None:
            speeds = config.get("emulation.speeds", None) or DEFAULT_SPEEDS
        self.speeds: tuple[float, ...] = tuple(_check_speed(s) for s in speeds)
        if not self.speeds:
            raise ValueError("need at least one speed")
        n = len(self.speeds)
        t = 1 if threads_per_worker is None else int(threads_per_worker)
        if t < 1:
            raise ValueError("threads_per_worker must be >= 1")
        self.threads_per_worker = t
        self.cores = CPU_COUNT
        self.headroom = float(config.get("emulation.headroom", headroom))
        self.scale_factor = (
            auto_scale(self.speeds, t, cores=self.cores, headroom=self.headroom)
            if scale is None
            else _check_speed(scale, "scale")
        )
        demand = self.scale_factor * t * sum(self.speeds)
        if demand > self.headroom * self.cores + 1e-9:
            logger.warning(
                "EMULATED speeds x scale need %.2f cores, more than headroom %.2f x %d cores: "
                "timings will measure contention, not the speed profile",
                demand,
                self.headroom,
                self.cores,
            )
        schedule = dict(schedule or {})
        for i, entries in schedule.items():
            if not (isinstance(i, int) and 0 <= i < n):
                raise ValueError(f"schedule key {i!r} is not a worker index in 0..{n - 1}")
            _parse_entries(entries)  # validate early, in the client
        self.schedule = {i: [tuple(e) for e in schedule[i]] for i in sorted(schedule)}
        self.processes = processes
        self.emulation_label = _label(
            self.speeds, self.scale_factor, "on one machine", self.schedule
        )

        protocol = "tcp://" if processes else "inproc://"
        host = "127.0.0.1" if processes else None
        if "memory_limit" not in worker_kwargs:
            from distributed.worker_memory import parse_memory_limit

            worker_kwargs["memory_limit"] = parse_memory_limit("auto", 1, n, logger=logger)
        extra_env = dict(worker_kwargs.pop("env", None) or {})
        base = dict(
            host=host,
            nthreads=t,
            protocol=protocol,
            dashboard=False,
            silence_logs=silence_logs,
            **worker_kwargs,
        )
        workers: dict[int, dict[str, Any]] = {}
        # one kernel throughput for all workers: their speeds then differ by exactly their ratios
        fraction = float(config.get("emulation.rate-fraction"))
        self.rates = {dt: fraction * _process_rate(dt) for dt in ("float64", "float32")}
        for i, speed in enumerate(self.speeds):
            plugin = EmulationPlugin(
                speed,
                self.scale_factor,
                self.schedule.get(i, ()),
                index=i,
                pin_blas=processes,
                rate=self.rates,
            )
            opts = dict(base, plugins=(plugin,))
            if processes:
                # set before the worker starts importing numpy in the child
                opts["env"] = {**{v: str(t) for v in _BLAS_VARS}, **extra_env}
            workers[i] = {"cls": Nanny if processes else Worker, "options": opts}

        # In-process workers share this process's BLAS: pin it here while the
        # cluster lives (limitation: the client's own numpy is pinned too).
        self._limiter = None
        if not processes:
            try:
                import numpy  # noqa: F401
                from threadpoolctl import threadpool_limits

                self._limiter = threadpool_limits(limits=t)
            except ImportError:  # pragma: no cover
                logger.warning(
                    "threadpoolctl not installed: BLAS threads not pinned "
                    "for processes=False; pace() may under-count CPU time"
                )

        scheduler = {
            "cls": Scheduler,
            "options": dict(
                host=host,
                protocol=protocol,
                dashboard=dashboard_address is not None,
                dashboard_address=dashboard_address,
                **(scheduler_kwargs or {}),
            ),
        }
        super().__init__(
            scheduler=scheduler,
            workers=workers,
            worker=workers[0],
            asynchronous=asynchronous,
            loop=loop,
            silence_logs=silence_logs,
            name=name,
        )

    def new_worker_spec(self) -> dict[Any, dict[str, Any]]:
        raise ValueError(
            "EmulatedCluster has a fixed set of emulated workers (one per speed); "
            "create a new cluster with more speeds instead of scaling up"
        )

    async def _close(self) -> None:
        try:
            await super()._close()
        finally:
            if self._limiter is not None:
                self._limiter.restore_original_limits()
                self._limiter = None

    def worker_names(self) -> list[str | None]:
        """Worker *addresses* in index order: element ``i`` runs at ``speeds[i]``.

        Returns
        -------
        list of str
            Addresses usable in ``client.submit(..., workers=[addr])``.
            A worker not (yet) running has ``None`` in its place.
        """
        out = []
        for i in range(len(self.speeds)):
            w = self.workers.get(i)
            addr = None
            if w is not None:
                addr = getattr(w, "worker_address", None) if isinstance(w, Nanny) else w.address
            out.append(addr)
        return out

    worker_addresses = worker_names

    @property
    def emulation_metadata(self) -> dict[str, Any]:
        """Plain-data description of the emulation, for results and files."""
        return {
            "emulated": True,
            "label": self.emulation_label,
            "speeds": list(self.speeds),
            "scale": self.scale_factor,
            "threads_per_worker": self.threads_per_worker,
            "schedule": {str(k): [list(e) for e in v] for k, v in self.schedule.items()},
            "headroom": self.headroom,
            "cores": self.cores,
            "processes": self.processes,
        }

    def __repr__(self) -> str:
        return f"EmulatedCluster({self.emulation_label!r}, scheduler={self.scheduler_address!r})"


def local_cluster(
    speeds: Sequence[float] | None = None,
    *,
    scale: float | None = None,
    threads_per_worker: int | None = None,
    processes: bool = True,
    schedule: Mapping[int, Sequence[Sequence[Any]]] | None = None,
    dashboard_address: str | None = ":0",
    **kwargs: Any,
) -> EmulatedCluster:
    """Start a local cluster with EMULATED heterogeneous worker speeds.

    Not a hardware measurement: all workers share this machine's cores and
    slow workers sleep after each :func:`pace` block.

    Parameters
    ----------
    speeds : sequence of float, optional
        Relative speed of each worker; 0.25 is four times slower than 1.0.
        Worker ``i`` is named ``i``. Default ``rpm.emulation.speeds``,
        (1.0, 0.5, 0.25).
    scale : float, optional
        Fraction of a core that speed 1.0 stands for. Default
        :func:`auto_scale`: as large as possible while
        ``scale * threads_per_worker * sum(speeds) <= headroom * cores`` and
        ``scale <= 1``.
    threads_per_worker : int, optional
        Threads per worker (default 1). BLAS threads are pinned to it.
    processes : bool
        One Nanny process per worker (default) or in-process Workers. In-process
        workers pin this process's BLAS (threadpoolctl) until the cluster closes.
    schedule : dict, optional
        ``{worker_index: [entry, ...]}`` speed changes, to emulate other jobs
        starting on a node. ``(iteration, speed)`` applies from that iteration
        on (as passed to :func:`pace`); ``("t", seconds, speed)`` applies that
        many seconds after the worker's first paced block (or after
        :func:`reset_clock`). The most recent change wins.
    dashboard_address : str or None
        Scheduler dashboard address; ``None`` disables it.
    **kwargs
        ``headroom``, ``scheduler_kwargs``, ``asynchronous``, ``loop``,
        ``silence_logs``, ``name``; anything else goes to every worker
        (e.g. ``memory_limit``, ``env``).

    Returns
    -------
    EmulatedCluster

    Examples
    --------
    >>> from distributed import Client
    >>> cluster = local_cluster((1.0, 0.5, 0.25))  # doctest: +SKIP
    >>> print(cluster.emulation_label)  # doctest: +SKIP
    EMULATED heterogeneity on one machine: speeds 1.0, 0.5, 0.25 x scale 0.914 of a core
    >>> client = Client(cluster)  # doctest: +SKIP
    """
    return EmulatedCluster(
        speeds,
        scale=scale,
        threads_per_worker=threads_per_worker,
        processes=processes,
        schedule=schedule,
        dashboard_address=dashboard_address,
        **kwargs,
    )


# --------------------------------------------------------------------------
# client-side helpers (work with any cluster)
# --------------------------------------------------------------------------


def _info_on_worker(dask_worker: Worker) -> tuple[Any, dict[str, Any] | None]:
    p = dask_worker.plugins.get(PLUGIN_NAME)
    if not isinstance(p, EmulationPlugin):
        return dask_worker.name, None
    d = p.info()
    d["address"] = dask_worker.address
    d["name"] = dask_worker.name
    return dask_worker.name, d


def _set_speed_on_worker(speed: float | None, dask_worker: Worker) -> bool:
    p = dask_worker.plugins.get(PLUGIN_NAME)
    if not isinstance(p, EmulationPlugin):
        return False
    p.set_speed(speed)
    return True


def _reset_clock_on_worker(t0: float, dask_worker: Worker) -> bool:
    p = dask_worker.plugins.get(PLUGIN_NAME)
    if not isinstance(p, EmulationPlugin):
        return False
    p.reset_clock(t0)
    return True


def _sort_key(item: tuple[str, dict[str, Any] | None, Any]) -> tuple:
    addr, info, name = item
    idx = info.get("index") if info else None
    if idx is None and isinstance(name, int):
        idx = name
    return (idx is None, idx if idx is not None else 0, str(name), addr)


def _call(client: Any, afunc: Any, *args: Any) -> Any:
    """Run ``afunc(client, *args)`` for a sync client, or return its awaitable
    for an asynchronous one (so the helpers work in both kinds of code)."""
    return client.sync(afunc, client, *args)


async def _a_info(client: Any) -> dict[str, dict[str, Any] | None]:
    raw = await client.run(_info_on_worker)
    items = sorted(((a, info, name) for a, (name, info) in raw.items()), key=_sort_key)
    return {a: info for a, info, _ in items}


async def _a_addresses(client: Any) -> list[str]:
    return list(await _a_info(client))


async def _a_resolve(client: Any, worker: int | str) -> str:
    if isinstance(worker, str) and "://" in worker:
        return worker
    info = await _a_info(client)
    if isinstance(worker, int) and not isinstance(worker, bool):
        for addr, d in info.items():
            if d is not None and d.get("index") == worker:
                return addr
    for addr, d in info.items():
        if d is not None and str(d.get("name")) == str(worker):
            return addr
    raise KeyError(f"no emulated worker {worker!r}")


async def _a_set_speed(client: Any, worker: int | str, speed: float | None) -> None:
    addr = await _a_resolve(client, worker)
    done = await client.run(_set_speed_on_worker, speed, workers=[addr])
    if not done.get(addr):
        raise KeyError(f"worker {addr} has no emulation plugin")


async def _a_reset_clock(client: Any, t0: float) -> None:
    await client.run(_reset_clock_on_worker, t0)


async def _a_label(client: Any) -> str | None:
    info = await _a_info(client)
    emu = [d for d in info.values() if d is not None]
    if not emu:
        return None
    hosts = {d.get("host") for d in emu}
    where = "on one machine" if len(hosts) <= 1 else f"on {len(hosts)} hosts"
    sched = {
        d["index"] if d["index"] is not None else k: d["schedule"]
        for k, d in enumerate(emu)
        if d["schedule"]
    }
    text = _label([d["speed"] for d in emu], [d["scale"] for d in emu], where, sched)
    if len(emu) < len(info):
        text += f" ({len(info) - len(emu)} of {len(info)} workers not emulated)"
    return text


async def _a_report(client: Any) -> list[dict[str, Any]]:
    return [d for d in (await _a_info(client)).values() if d is not None]


def emulation_info(client: Any) -> dict[str, dict[str, Any] | None]:
    """Emulation state of every worker, ``{address: info or None}``, in index order.

    ``info`` holds index, name, speed, current_speed, scale, schedule and the
    counters (blocks, cpu_s, wall_s, sleep_s, overruns, overrun_s); ``None``
    marks a worker without emulation. Like all helpers below it works with
    any cluster, and returns an awaitable for an asynchronous client.
    """
    return _call(client, _a_info)


def worker_addresses(client: Any) -> list[str]:
    """Worker addresses of any cluster in emulation-index order.

    Workers are ordered by their emulation index (``speeds[i]`` of
    :func:`local_cluster`, or ``DASK_RPM_EMULATED_INDEX``), then integer
    name, then name.
    """
    return _call(client, _a_addresses)


def set_speed(client: Any, worker: int | str, speed: float | None) -> None:
    """Change an emulated worker's speed now (e.g. another job just started there).

    Parameters
    ----------
    client : distributed.Client
    worker : int or str
        Emulation index, worker name or address.
    speed : float or None
        New relative speed; ``None`` removes the override and returns to the
        base speed / schedule. A later schedule entry overrides it again.
    """
    if speed is not None:
        _check_speed(speed)
    return _call(client, _a_set_speed, worker, speed)


def reset_clock(client: Any, t0: float | None = None) -> None:
    """Set the origin of ``("t", seconds, speed)`` entries on all workers.

    Parameters
    ----------
    client : distributed.Client
    t0 : float, optional
        Epoch seconds (``time.time()``); default now. Call it at the start of
        a run to time schedule entries from there.
    """
    t0 = time.time() if t0 is None else float(t0)
    return _call(client, _a_reset_clock, t0)


def emulation_label(client: Any) -> str | None:
    """One-line EMULATED label for results obtained through ``client``.

    Works for any cluster, including workers emulated through
    ``DASK_RPM_EMULATED_SPEED``. Returns ``None`` when no worker is emulated.
    """
    return _call(client, _a_label)


def emulation_report(client: Any) -> list[dict[str, Any]]:
    """Per-worker emulation counters, in index order (see :func:`emulation_info`)."""
    return _call(client, _a_report)


def format_report(rows: Sequence[Mapping[str, Any]], label: str | None = None) -> str:
    """Human-readable table of :func:`emulation_report` rows, headed by the label."""
    lines = [
        label or "EMULATED heterogeneity (not a hardware measurement)",
        f"{'idx':>3} {'speed':>6} {'now':>6} {'blocks':>7} {'cpu s':>8} {'wall s':>8} "
        f"{'slept s':>8} {'overruns':>8} {'late s':>7}",
    ]
    for r in rows:
        idx = "-" if r.get("index") is None else r["index"]
        lines.append(
            f"{idx:>3} {r['speed']:>6.3g} {r['current_speed']:>6.3g} {r['blocks']:>7d} "
            f"{r['cpu_s']:>8.3f} {r['wall_s']:>8.3f} {r['sleep_s']:>8.3f} "
            f"{r['overruns']:>8d} {r['overrun_s']:>7.3f}"
        )
    blocks = sum(r["blocks"] for r in rows)
    over = sum(r["overruns"] for r in rows)
    if blocks and over > 0.05 * blocks:
        lines.append(
            f"WARNING: {over} of {blocks} paced blocks overran their target: the "
            "timings include contention (lower the scale or the machine's load)"
        )
    return "\n".join(lines)


# --------------------------------------------------------------------------
# preload for workers started elsewhere (dask-jobqueue, `dask worker`)
# --------------------------------------------------------------------------


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
