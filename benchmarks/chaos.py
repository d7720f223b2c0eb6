"""Chaos soak (issue 14): train for minutes while workers are killed, retired and added at random.

Two modes share everything but the cluster and the way a fault is made. A
well-conditioned 3-layer net is trained with ``dask_rpm.fit``
(``checkpoint_every`` set) while a seeded fault injector, every few seconds
(uniform between ``--every MIN MAX``, seeded), does one of kill, retire, add:

**Local** (default): a LocalCluster of worker processes (1 thread each, equal
speeds: no emulated heterogeneity; all processes share this machine's cores),
a fault every 3-8 s:

* **kill**: SIGKILL a random worker process. Its nanny starts a fresh worker
  at a new address, which the run absorbs at a block boundary (elastic join).
* **retire**: retire a random worker gracefully (``client.retire_workers``,
  and the cluster forgets it).
* **add**: one more worker (``cluster.scale(n + 1)``).

**SLURM** (``--slurm``): a ``dask_rpm.slurm.HeterogeneousSLURMCluster`` on the
SLURM that ``SLURM_CONF`` points at (``slurm/local-cluster.sh start``), two
worker groups ``fast`` and ``slow`` with EMULATED speeds 1.0 and 0.5 (one
machine: emulation, not hardware), one worker of 1 core per job, a fault every
6-12 s:

* **kill**: ``scancel`` of a random worker's job. The run recovers from the
  loss, and the trainer resubmits the job (``rpm.slurm.replace-lost``) and
  takes its worker in when it connects. The soak checks for ended jobs every
  2 s (``rpm.slurm.replace-check``) and lets a group be resubmitted 1000 times
  (``rpm.slurm.replace-max``): its cancellations are deliberate, not a group
  whose jobs keep failing.
* **retire**: ``cluster.scale_group(g, jobs - 1)`` of a random group with more
  than one job; the cluster picks the job (one still queued first, else the
  newest), retires its worker gracefully and cancels the job.
* **add**: ``cluster.scale_group(g, jobs + 1)`` of a random group.

  A kill or retire waits (at most 120 s) until at least two workers are up,
  so the run always keeps one (a resubmitted job takes seconds to start).

Both keep at least ``--min-workers`` (2) and at most ``--max-workers`` (5)
workers (jobs on SLURM); the kind of each fault is drawn from the seeded
generator among those the worker count allows (the count the cluster intends
to have, so the sequence of kinds depends on the seed only; victims and the
iteration a fault lands at depend on timing).

Training runs for ``--seconds`` (the run's length is set by time: ``fit``'s
``should_stop`` ends it at the first block boundary after the deadline, and
``iterations`` is only a maximum); no fault is injected in its last 5 s (one
could land after the last block and test nothing). Then the final weights and the error of
every iteration are compared with ``dask_rpm.fit_serial`` for the number of
iterations done (float64, rtol 1e-10), after checking that the problem is
well-conditioned for that length (adding 1e-15 to every element of W0 moves
the serial result by less than 1e-12, normwise relative: max|dW| / max|W|).

Reported: faults injected by kind, faults survived (the run completed equal to
serial; each kill/retire of a worker the run had is matched by the remap that
recovered from it), iterations recomputed (sum of ``replayed``), weight bytes
moved and sample bytes re-read in those remaps, time lost per fault (remap
seconds + recomputed iterations x median s/iteration, over the faults), bytes
lost (weights that differ from serial: must be 0), the final relative
difference and wall time; on SLURM also the jobs the trainer resubmitted.
Buddy copies (issue 36, ``rpm.resilience``) are on, as by default
(``--no-buddies`` turns them off): the report counts the losses by where their
rows came from (buddy, columns, checkpoint, initial weights), the iterations
each loss cost and their mean, and the copies' ``R``. ``--kinds kill`` draws
kills only. Locally two more kinds time a kill to the worst moment
(``--kinds kill,kill-recovery,kill-remap``): ``kill-recovery`` SIGKILLs a worker and arms
another to die the moment its task of the recovery starts (the survivors restoring from the
copies; when the second is the first one's buddy, no copy of the first one's rows is left), and
``kill-remap`` arms a worker to die the moment its next remap or recovery task starts. A worker
plugin on every worker (restarted ones too) springs the trap; one not sprung within 15 s is taken
back and reported as such.

Usage::

    python benchmarks/chaos.py                         # ~3 min, seed 0
    python benchmarks/chaos.py --seconds 60 --seed 7 --json chaos.json
    python benchmarks/chaos.py --kinds kill --every 2 4 --seconds 200   # SIGKILLs only, with buddy copies
    SLURM_CONF=/tmp/dask-rpm-slurm/slurm.conf python benchmarks/chaos.py --slurm --seconds 180
"""

from __future__ import annotations

import argparse
import inspect
import json
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

import numpy as np
from distributed.diagnostics.plugin import WorkerPlugin

KINDS = ("kill", "retire", "add")
#: Local only: SIGKILL a worker, and arm another to SIGKILL itself the moment its next recovery
#: task starts (``kill-recovery``: the survivors restoring from buddy copies; the second victim
#: may be the first one's buddy), or arm a worker to die at its next remap task, a join's or a
#: recovery's (``kill-remap``). A trap not sprung within ``TRAP_SECONDS`` is taken back.
TRAP_KINDS = ("kill-recovery", "kill-remap")
TRAP_PREFIXES = {"kill-recovery": ("rpm-restore",), "kill-remap": ("rpm-remap", "rpm-restore")}
TRAP_SECONDS = 15.0
LOCAL_EVERY = (3.0, 8.0)  # seconds between faults, local mode
SLURM_EVERY = (6.0, 12.0)  # on SLURM: a resubmitted or added job takes seconds to start
SLURM_SPEEDS = {"fast": 1.0, "slow": 0.5}  # EMULATED relative speeds of the two groups
SLURM_CONFIG = {  # the soak's own cancellations are deliberate: check often, never give a group up
    "rpm.slurm.replace-lost": True,
    "rpm.slurm.replace-check": 2,
    "rpm.slurm.replace-max": 1000,
}


class Fault(NamedTuple):
    """One injected fault."""

    seconds: float  # since training started
    kind: str  # kill | retire | add
    worker: (
        str | None
    )  # the victim's address (kill, retire); None for add or a job whose worker never connected
    workers_before: int  # workers (SLURM: jobs) the cluster intended to have before the fault
    iteration: int  # last block boundary the run had reported
    job: str | None = None  # SLURM: the job cancelled or submitted, "slow-3 (1234)"
    trap: bool = False  # the worker was armed to die at its next recovery / remap task


class ChaosTrap(WorkerPlugin):
    """A worker plugin that SIGKILLs its worker's process the moment a task whose key starts with
    an armed prefix starts executing there (armed by :func:`arm_trap`, for ``TRAP_SECONDS``)."""

    name = "rpm-chaos-trap"
    idempotent = True

    def setup(self, worker: Any) -> None:
        self.prefixes: tuple[str, ...] = ()
        self.until = 0.0

    def transition(self, key: Any, start: str, finish: str, **kwargs: Any) -> None:
        if finish != "executing" or not self.prefixes or time.monotonic() > self.until:
            return
        name = key[0] if isinstance(key, tuple) else key
        if str(name).startswith(self.prefixes):
            os.kill(os.getpid(), signal.SIGKILL)


def arm_trap(prefixes: tuple[str, ...], seconds: float, dask_worker: Any = None) -> bool:
    """Arm this worker's :class:`ChaosTrap` (``client.run``)."""
    trap = dask_worker.plugins.get(ChaosTrap.name)
    if trap is None:
        return False
    trap.prefixes, trap.until = tuple(prefixes), time.monotonic() + seconds
    return True


def draw_kind(
    rng: random.Random, n: int, min_workers: int, max_workers: int, kinds: tuple[str, ...] = KINDS
) -> str:
    """The next fault's kind among ``kinds`` that keep ``min_workers <= workers <= max_workers``."""
    allowed = [
        k
        for k in kinds
        if (k == "add" and n < max_workers)
        or (k in TRAP_KINDS and n > min_workers + 1)  # it may take two workers at once
        or (k in ("kill", "retire") and n > min_workers)
    ]
    return rng.choice(allowed)


def planned_kinds(
    seed: int,
    count: int,
    workers: int = 3,
    min_workers: int = 2,
    max_workers: int = 5,
    interval: tuple[float, float] = LOCAL_EVERY,
    kinds: tuple[str, ...] = KINDS,
) -> list[str]:
    """The kinds of the first ``count`` faults the injector draws for ``seed`` (no cluster needed)."""
    rng, n, out = random.Random(seed), workers, []
    for _ in range(count):
        rng.uniform(*interval)  # the wait, drawn first as the injector does
        out.append(draw_kind(rng, n, min_workers, max_workers, kinds))
        n += {"retire": -1, "add": 1}.get(out[-1], 0)  # a killed worker is restarted
    return out


class Injector(threading.Thread):
    """Inject one seeded random fault every ``interval`` seconds until stopped.

    Runs in a thread of the client process while ``fit`` blocks the main
    thread. The draws (kind, wait) and the bookkeeping are here; how a
    cluster is counted, and how a worker is killed, retired or added, are
    the subclasses' (:class:`LocalInjector`, :class:`SlurmInjector`).
    """

    join_timeout = 60.0  # seconds an added worker may take to connect
    # No fault in the last seconds of the run: a job cancelled then (SIGTERM; the worker takes a moment to
    # go) or a worker killed then could leave after the last block and test nothing (seen once on SLURM).
    quiet_end = 5.0

    def __init__(
        self,
        cluster: Any,
        client: Any,
        seed: int,
        *,
        interval: tuple[float, float] = LOCAL_EVERY,
        min_workers: int = 2,
        max_workers: int = 5,
        kinds: tuple[str, ...] = KINDS,
    ) -> None:
        super().__init__(name="chaos-injector", daemon=True)
        self.kinds = kinds
        self.cluster, self.client = cluster, client
        # two generators: the kinds and the waits depend on the seed only; the victims also on which
        # workers are up at the time (drawn from their own generator so they never shift the kinds)
        self.rng = random.Random(seed)
        self.victims = random.Random(seed + 1_000_003)
        self.interval, self.min_workers, self.max_workers = interval, min_workers, max_workers
        self.iteration = (
            0  # the last block boundary the run reported (set by the training callback)
        )
        self.stop = threading.Event()
        self.faults: list[Fault] = []
        self.errors: list[str] = []
        self.t0 = time.monotonic()
        self.until = float(
            "inf"
        )  # monotonic time of the last fault (set when the deadline is known)

    def run(self) -> None:
        while not self.stop.wait(self.rng.uniform(*self.interval)):
            if time.monotonic() > self.until:
                return
            try:
                self.inject()
            except Exception as exc:  # an injector failure is reported, never hidden
                self.errors.append(f"{type(exc).__name__}: {exc}")

    def elapsed(self) -> float:
        return round(time.monotonic() - self.t0, 3)

    def alive(self) -> dict[str, Any]:
        return dict(self.client.scheduler_info(n_workers=-1)["workers"])

    def choose(self, pool: list[str], kind: str) -> str:
        """A seeded random victim among ``pool`` (addresses)."""
        if not pool:
            raise RuntimeError(f"{kind}: no live worker to pick at {self.elapsed():.1f} s")
        return self.victims.choice(sorted(pool))

    def inject(self) -> None:
        # The intended size (not the live count) decides which kinds are allowed: a killed worker is
        # being restarted or resubmitted and still counts, so the kinds drawn depend on the seed only.
        n = self.size()
        kind = draw_kind(self.rng, n, self.min_workers, self.max_workers, self.kinds)
        if kind != "add":
            self.ready()
        alive = self.alive()
        at, iteration = self.elapsed(), self.iteration
        if kind == "add":
            job = self.add(alive)
            self.faults.append(Fault(at, kind, None, n, iteration, job))
            self.wait_for_new(set(alive), at)
            return
        if kind in TRAP_KINDS:
            self.trap(kind, alive, n, at, iteration)
            return
        worker, job = self.kill(alive) if kind == "kill" else self.retire(alive)
        self.faults.append(Fault(at, kind, worker, n, iteration, job))

    def trap(self, kind: str, alive: dict[str, Any], n: int, at: float, iteration: int) -> None:
        """``kill-recovery``: a kill, and another worker armed to die at its recovery task;
        ``kill-remap``: a worker armed to die at its next remap or recovery task."""
        first = None
        if kind == "kill-recovery":
            first, job = self.kill(alive)
            self.faults.append(Fault(at, "kill", first, n, iteration, job))
        pool = [a for a in alive if a != first]
        armed = self.choose(pool, kind)
        self.client.run(arm_trap, TRAP_PREFIXES[kind], TRAP_SECONDS, workers=[armed])
        self.faults.append(Fault(at, kind, armed, n, iteration, None, trap=True))

    def wait_for_new(self, before: set[str], at: float) -> None:
        """Wait until a worker not in ``before`` is up, so "at least min_workers" holds for the next fault too."""
        t_end = time.monotonic() + self.join_timeout
        while not self.stop.is_set() and not set(self.alive()) - before:
            if time.monotonic() > t_end:
                self.errors.append(
                    f"add at {at:.1f} s: no new worker within {self.join_timeout:g} s"
                )
                return
            time.sleep(0.1)

    # -- what a cluster kind provides -------------------------------------------

    def size(self) -> int:
        """Workers (or jobs) the cluster intends to have now."""
        raise NotImplementedError

    def ready(self) -> None:
        """Called before a kill or retire; may wait until the cluster can lose a worker."""

    def kill(self, alive: dict[str, Any]) -> tuple[str | None, str | None]:
        """End a random worker abruptly; returns its address and its job (or None)."""
        raise NotImplementedError

    def retire(self, alive: dict[str, Any]) -> tuple[str | None, str | None]:
        """Take a worker away gracefully; returns its address (None if it never connected) and its job."""
        raise NotImplementedError

    def add(self, alive: dict[str, Any]) -> str | None:
        """Ask for one more worker; returns its job (or None)."""
        raise NotImplementedError


class LocalInjector(Injector):
    """Faults on a ``distributed.LocalCluster``: SIGKILL, ``retire_workers``, ``scale(n + 1)``.

    A SIGKILLed worker's nanny starts a new one, but about one time in twelve here (with no
    training running too) the nanny closes itself instead ("nanny-close" a second after the
    kill), and the cluster would shrink for good until the run had no worker left. Before each
    fault a closed nanny is replaced (``nannies_replaced``), as a batch system resubmits a lost
    job: the soak tests the run's recoveries, not ``distributed``'s nanny.
    """

    nannies_replaced = 0

    def size(self) -> int:
        return len(self.cluster.worker_spec)

    def ready(self) -> None:
        closed = [
            name
            for name, w in list(self.cluster.workers.items())
            if name in self.cluster.worker_spec
            and getattr(getattr(w, "status", None), "name", "") in ("closed", "closing", "failed")
        ]
        for name in closed:
            self.cluster.workers.pop(name, None)
        # (a closed nanny may also be gone from cluster.workers already: the spec's names
        # without a nanny are started again by the same call)
        missing = set(self.cluster.worker_spec) - set(self.cluster.workers)
        if missing:
            self.nannies_replaced += len(missing)
            self.cluster.scale(len(self.cluster.worker_spec))  # starts the spec's missing workers

    def _pool(self, alive: dict[str, Any]) -> list[str]:
        # victims are workers that are up and belong to the cluster's spec (not one already leaving)
        names = {str(k) for k in self.cluster.worker_spec}
        return [a for a, w in alive.items() if str(w.get("name")) in names]

    def kill(self, alive: dict[str, Any]) -> tuple[str | None, str | None]:
        victim = self.choose(self._pool(alive), "kill")
        pid = self.client.run(os.getpid, workers=[victim])[victim]
        os.kill(pid, signal.SIGKILL)
        return victim, None

    def retire(self, alive: dict[str, Any]) -> tuple[str | None, str | None]:
        victim = self.choose(self._pool(alive), "retire")
        name = alive[victim].get("name")
        # the cluster forgets it first (so it is neither restarted nor counted), then the scheduler
        # retires it gracefully; scale() at the same size lets the cluster drop its nanny handle at once
        # (a stale handle held back the next scale-up until another scale call in a first version)
        for key in (name, str(name)):
            self.cluster.worker_spec.pop(key, None)
        self.client.retire_workers(workers=[victim], close_workers=True)
        self.cluster.scale(len(self.cluster.worker_spec))
        return victim, None

    def add(self, alive: dict[str, Any]) -> str | None:
        self.cluster.scale(len(self.cluster.worker_spec) + 1)
        return None


class SlurmInjector(Injector):
    """Faults on a ``HeterogeneousSLURMCluster``: ``scancel`` of a worker's job, ``scale_group`` down and up.

    Every read or change of the cluster's job table runs on the cluster's
    event loop (:meth:`on_loop`), where training's own job replacement
    (``replace_lost``) changes it too, so the two never interleave.
    """

    join_timeout = 180.0  # a SLURM job is queued, started, imports Python and dask, then connects

    def on_loop(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` called on the cluster's event loop (awaited if it returns an awaitable)."""
        from distributed.utils import sync

        async def call() -> Any:
            out = fn(*args)  # scale_group returns a coroutine when called on the loop
            return (await out) if inspect.isawaitable(out) else out

        return sync(self.cluster.loop, call, callback_timeout=300)

    def _jobs(self) -> dict[str, str]:
        """``{job name: SLURM job id}`` of the jobs in the cluster's spec that SLURM has accepted."""
        cluster = self.cluster
        return self.on_loop(
            lambda: {
                name: str(job.job_id)
                for name, job in cluster.workers.items()
                if name in cluster.worker_spec and getattr(job, "job_id", None)
            }
        )

    def _counts(self) -> dict[str, int]:
        return dict(self.on_loop(self.cluster.requested_jobs))

    def size(self) -> int:
        return sum(self._counts().values())

    def ready(self) -> None:
        t_end = time.monotonic() + 120.0
        while len(self.alive()) < 2 and not self.stop.is_set():
            if time.monotonic() > t_end:
                raise RuntimeError(f"fewer than 2 workers up for 120 s at {self.elapsed():.1f} s")
            time.sleep(0.2)

    def kill(self, alive: dict[str, Any]) -> tuple[str | None, str | None]:
        jobs = self._jobs()
        victim = self.choose([a for a, w in alive.items() if str(w.get("name")) in jobs], "kill")
        name = str(alive[victim]["name"])
        subprocess.run(["scancel", jobs[name]], check=True, capture_output=True, timeout=60)
        return victim, f"{name} ({jobs[name]})"

    def _scale(self, group: str, delta: int) -> str:
        """Change ``group``'s job count by ``delta`` (+1 or -1); returns the job that came or went.

        One coroutine on the loop: the count is read and the spec edited with no ``await`` in between,
        so a job replacement of the trainer's (``replace_lost``, on the same loop) cannot slip into the
        difference; then the submission or cancellation is awaited.
        """
        from distributed.utils import sync

        cluster = self.cluster

        async def call() -> set[str]:
            before = set(cluster.worker_spec)
            # called on the loop, scale_group edits the spec at once and returns the sbatch/scancel to await
            pending = cluster.scale_group(group, cluster.requested_jobs()[group] + delta)
            changed = before ^ set(cluster.worker_spec)
            await pending
            return changed

        (job,) = sync(cluster.loop, call, callback_timeout=300)
        return str(job)

    def retire(self, alive: dict[str, Any]) -> tuple[str | None, str | None]:
        counts = self._counts()
        groups = sorted(g for g, k in counts.items() if k > 1)  # every group keeps a job
        if not groups:
            raise RuntimeError(f"retire: no group with 2 jobs at {self.elapsed():.1f} s ({counts})")
        group = self.victims.choice(groups)
        ids = self._jobs()
        job = self._scale(group, -1)
        worker = next((a for a, w in alive.items() if str(w.get("name")) == job), None)
        return worker, f"{job} ({ids.get(job, 'not submitted')})"

    def add(self, alive: dict[str, Any]) -> str | None:
        group = self.victims.choice(sorted(self._counts()))
        job = self._scale(group, +1)
        return f"{job} ({self._jobs().get(job, '?')})"


# -- the clusters ----------------------------------------------------------------


def _by_value() -> None:
    """Pickle this module's plugin by value: the workers cannot import the benchmark's module."""
    import cloudpickle

    module = sys.modules.get(__name__)
    if module is not None and __name__ != "__main__":
        cloudpickle.register_pickle_by_value(module)


@contextmanager
def local_setup(workers: int) -> Iterator[tuple[Any, Any, str]]:
    """A LocalCluster of ``workers`` processes x 1 thread and its client, and a description."""
    from distributed import Client, LocalCluster

    with (
        LocalCluster(
            n_workers=workers,
            threads_per_worker=1,
            processes=True,
            dashboard_address=":0",
            silence_logs=50,
        ) as cluster,
        Client(cluster) as client,
    ):
        client.wait_for_workers(workers)
        _by_value()
        client.register_plugin(ChaosTrap())  # unarmed until a trap kind arms it
        yield (
            cluster,
            client,
            f"distributed.LocalCluster(processes=True), {workers} worker processes x 1 thread at start, "
            f"equal speeds (no emulated heterogeneity), {os.cpu_count()} cores shared",
        )


@contextmanager
def slurm_setup(workers: int) -> Iterator[tuple[Any, Any, str]]:
    """A HeterogeneousSLURMCluster of two EMULATED groups (``SLURM_SPEEDS``) with ``workers`` jobs in all."""
    from distributed import Client

    from dask_rpm.slurm import HeterogeneousSLURMCluster, WorkerGroup, slurm_unavailable

    partitions = os.environ.get("DASK_RPM_SLURM_PARTITIONS", "fast slow").split()
    reason = slurm_unavailable(partitions)
    if reason:
        raise RuntimeError(f"the --slurm soak needs SLURM: {reason}")
    (fast, fast_speed), (slow, slow_speed) = SLURM_SPEEDS.items()
    jobs = {fast: workers - workers // 2, slow: workers // 2}
    groups = [
        WorkerGroup(
            name,
            jobs=jobs[name],
            cores=1,
            memory="1GiB",
            queue=partition,
            walltime="00:30:00",
            speed=speed,
        )
        for (name, speed), partition in zip(SLURM_SPEEDS.items(), (partitions[0], partitions[-1]))
    ]
    logs = tempfile.mkdtemp(prefix="rpm-chaos-slurm-")
    options = dict(
        interface="lo",
        scheduler_options={"host": "127.0.0.1", "dashboard_address": ":0"},
        python=sys.executable,
        log_directory=logs,
    )
    try:
        with HeterogeneousSLURMCluster(groups, **options) as cluster, Client(cluster) as client:
            cluster.wait_for_groups(timeout=300)
            yield (
                cluster,
                client,
                f"dask_rpm.slurm.HeterogeneousSLURMCluster on the local SLURM ({os.environ.get('SLURM_CONF')}), "
                f"groups {fast} (EMULATED speed {fast_speed}) and {slow} (EMULATED speed {slow_speed}), "
                f"{jobs[fast]} + {jobs[slow]} jobs at start, 1 worker x 1 core per job; EMULATED heterogeneity "
                f"on one machine, {os.cpu_count()} cores shared",
            )
    finally:
        shutil.rmtree(logs, ignore_errors=True)


@contextmanager
def log_lines(needles: tuple[str, ...]) -> Iterator[list[str]]:
    """Collect the messages of ``dask_rpm``'s loggers that contain one of ``needles`` (e.g. job replacements)."""
    found: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            msg = record.getMessage()
            if any(n in msg for n in needles):
                found.append(msg)

    handler, logger = Keep(), logging.getLogger("dask_rpm")
    logger.addHandler(handler)
    try:
        yield found
    finally:
        logger.removeHandler(handler)


# -- training under faults ---------------------------------------------------------


class Training(NamedTuple):
    """What one run under the injector left."""

    result: Any  # dask_rpm's FitResult, or None if training failed
    error: str | None  # the traceback when it failed
    ticks: list[tuple[float, int]]  # (monotonic time, iteration) at every block boundary
    started: float  # monotonic time training started
    seconds: float  # training time


def train_under_faults(
    client: Any,
    injector: Injector,
    x: np.ndarray,
    d: np.ndarray,
    init: tuple[np.ndarray, np.ndarray],
    seconds: float,
    **fit_kwargs: Any,
) -> Training:
    """``dask_rpm.fit`` for ``seconds`` (then it stops at the next block boundary) with ``injector`` running."""
    from dask_rpm import fit

    deadline = time.monotonic() + seconds

    def should_stop() -> bool:
        if time.monotonic() >= deadline:
            injector.stop.set()  # no fault after the deadline: the run is ending
            return True
        return False

    ticks: list[tuple[float, int]] = []

    def callback(info: dict[str, Any]) -> None:
        injector.iteration = info["iteration"]
        ticks.append((time.monotonic(), info["iteration"]))

    t0 = time.monotonic()
    injector.until = deadline - injector.quiet_end
    injector.start()
    error, r = None, None
    try:
        r = fit(
            x,
            d,
            init=init,
            client=client,
            should_stop=should_stop,
            callback=callback,
            progress="none",
            **fit_kwargs,
        )
    except BaseException as exc:  # reported in full: a fault the engine did not survive
        import traceback

        error = "".join(traceback.format_exception(exc))
    finally:
        injector.stop.set()
        injector.join()
    return Training(r, error, ticks, t0, time.monotonic() - t0)


def problem(
    samples: int, n: int, m: int, l: int, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Inputs (a column of ones as bias), teacher signals in (0.1, 0.9), and seeded initial weights."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(samples, n))
    x[:, -1] = 1.0
    d = rng.uniform(0.1, 0.9, size=(samples, l))
    W0 = rng.uniform(-0.1, 0.1, size=(m, n))
    V0 = rng.uniform(-0.1, 0.1, size=(l, m))
    return x, d, W0, V0


def norm_diff(a: np.ndarray, b: np.ndarray) -> float:
    """Normwise relative difference max|a - b| / max|b|."""
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b))) / np.max(np.abs(np.asarray(b))))


def rel_diff(a: np.ndarray, b: np.ndarray) -> float:
    """Largest elementwise relative difference |a - b| / |b|."""
    a, b = np.asarray(a), np.asarray(b)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.abs(a - b) / np.abs(b)
    r = np.where(a == b, 0.0, r)
    return float(np.max(r)) if r.size else 0.0


# -- the report ----------------------------------------------------------------------


def _outcome(f: Fault, remaps: list[dict[str, Any]], members: set[str]) -> str:
    """What the run recorded for fault ``f``."""
    if f.kind == "add":
        return "added"
    if f.worker is None:
        return "cancelled before its worker connected (held no rows)"
    for rec in remaps:
        if f.worker in (rec.get("lost") or []) or (
            rec.get("lost") and f.worker in str(rec.get("reason"))
        ):
            return f"recovered from the {rec.get('recovered_from')}"
        if f.worker in (rec.get("retired") or []):
            return "retired by the run"
    if f.trap:
        return "trap not sprung (its task did not come within the time armed)"
    if f.worker not in members:
        return "left before the run took it in (held no rows)"
    return "UNACCOUNTED"


_REMAP_FIELDS = (
    "iteration",
    "kind",
    "reason",
    "lost",
    "joined",
    "retired",
    "recovered_from",
    "replayed",
    "bytes",
    "store_bytes",
    "sample_bytes",
    "seconds",
)


def _serial_check(
    r: Any,
    x: np.ndarray,
    d: np.ndarray,
    init: tuple[np.ndarray, np.ndarray],
    hidden: int,
    lr: float,
) -> dict[str, Any]:
    """The run against ``fit_serial`` for the iterations it did, and the problem's conditioning."""
    from dask_rpm import fit_serial

    W0, V0 = init
    iterations = int(r.history.sizes["iteration"])
    kw = dict(hidden=hidden, iterations=iterations, learning_rate=lr)
    ref = fit_serial(x, d, init=(W0, V0), **kw)
    (W, V), err = ref.params, ref.errors
    Wp, Vp = fit_serial(x, d, init=(W0 + 1e-15, V0), **kw).params
    conditioning = max(norm_diff(Wp, W), norm_diff(Vp, V))
    diff = max(rel_diff(r.params[0], W), rel_diff(r.params[-1], V))
    diff_err = rel_diff(r.history["error"].values, err)
    differing = int(
        np.sum(~np.isclose(r.params[0], W, rtol=1e-10, atol=0))
        + np.sum(~np.isclose(r.params[-1], V, rtol=1e-10, atol=0))
    )
    return dict(
        iterations=iterations,
        bytes_lost=differing * np.dtype("float64").itemsize,
        relative_difference_vs_serial=diff,
        relative_difference_errors=diff_err,
        equal_to_serial=diff <= 1e-10 and diff_err <= 1e-10,
        conditioning_1e15_W0=conditioning,
        relative_difference_normwise=max(norm_diff(r.params[0], W), norm_diff(r.params[-1], V)),
        well_conditioned=conditioning < 1e-12,
    )


def _fault_figures(run: Training, faults: list[Fault]) -> dict[str, Any]:
    """Outcomes, recoveries, recomputed iterations, bytes moved, time lost and stalls of a completed run."""
    r = run.result
    members = set(r.history["address"].values.tolist())
    for p in r.plans:
        members |= set(p.workers or ())
    fault_remaps = [
        rec for rec in r.remaps if rec.get("lost") or rec.get("joined") or rec.get("retired")
    ]
    replayed = int(sum(rec.get("replayed", 0) or 0 for rec in r.remaps))
    spi = r.seconds_per_iteration
    remap_seconds = float(sum(rec.get("seconds", 0.0) for rec in fault_remaps))
    lost_seconds = remap_seconds + replayed * spi
    # stalls: gaps between block boundaries longer than 2 s (a block takes ~0.1 s here); the time lost
    # computed from the remap records misses them (detection time: the run waits until it sees a loss)
    ticks = run.ticks
    gaps = [
        (b[0] - a[0], a[1], round(a[0] - run.started, 1))
        for a, b in zip(ticks, ticks[1:])
        if b[0] - a[0] > 2.0
    ]
    return dict(
        stopped=r.stopped,
        outcomes=[_outcome(f, r.remaps, members) for f in faults],
        recovered_from={
            src: sum(1 for rec in r.remaps if rec.get("lost") and rec.get("recovered_from") == src)
            for src in ("buddy", "columns", "checkpoint", "initial weights")
        },
        recomputed_per_loss=[
            int(rec.get("replayed", 0) or 0) for rec in r.remaps if rec.get("lost")
        ],
        mean_recomputed_per_loss=float(
            np.mean([rec.get("replayed", 0) or 0 for rec in r.remaps if rec.get("lost")] or [0.0])
        ),
        buddies={
            k: r.stats.get("buddies", {}).get(k)
            for k in ("on", "every", "every_chosen", "copies_taken", "copies_sent", "sends_skipped")
        },
        remaps={
            "fault": len(fault_remaps),
            "all": len(r.remaps),
            "lost": sum(1 for rec in r.remaps if rec.get("lost")),
            "joined": sum(1 for rec in r.remaps if rec.get("joined")),
            "retired_by_lifetime": sum(1 for rec in r.remaps if rec.get("retired")),
        },
        iterations_recomputed=replayed,
        weight_bytes_moved=int(
            sum(
                (rec.get("bytes", 0) or 0) + (rec.get("store_bytes", 0) or 0)
                for rec in fault_remaps
            )
        ),
        sample_bytes_reread=int(sum(rec.get("sample_bytes", 0) or 0 for rec in fault_remaps)),
        remap_seconds=round(remap_seconds, 4),
        median_seconds_per_iteration=spi,
        time_lost_seconds=round(lost_seconds, 4),
        time_lost_per_fault_seconds=round(lost_seconds / len(faults), 4) if faults else 0.0,
        final_workers=len(r.plan.planned_workers),
        stalls=[{"seconds": round(g, 2), "at_iteration": it, "at_s": at} for g, it, at in gaps],
        stalled_seconds=round(sum(g for g, _, _ in gaps), 2),
        fault_remap_records=[{k: rec.get(k) for k in _REMAP_FIELDS} for rec in fault_remaps],
    )


def soak(
    seconds: float = 180.0,
    seed: int = 0,
    *,
    slurm: bool = False,
    workers: int = 3,
    min_workers: int = 2,
    max_workers: int = 5,
    interval: tuple[float, float] | None = None,
    samples: int = 128,
    n: int = 16,
    hidden: int = 64,
    outputs: int = 4,
    learning_rate: float = 1e-3,
    block: int = 20,
    checkpoint_every: int = 100,
    mapping: str = "drpm",
    max_iterations: int = 10_000_000,
    checkpoint_store: bool = False,
    buddies: bool = True,
    kinds: tuple[str, ...] = KINDS,
) -> dict[str, Any]:
    """Run the soak, on a LocalCluster or (``slurm=True``) on SLURM; returns the report (module docstring).

    ``checkpoint_store``: checkpoints go into a store the workers write and read
    (``fit(checkpoint_dir=...)``, a temporary directory on this host) instead of the driver's
    memory.
    """
    import tempfile

    import dask

    import dask_rpm  # noqa: F401  # loads rpm.yaml's defaults first: the overrides below must restore them, not drop them

    interval = interval or (SLURM_EVERY if slurm else LOCAL_EVERY)
    x, d, W0, V0 = problem(samples, n, hidden, outputs, seed)
    wall0 = time.monotonic()
    store_kw = {}
    with (
        tempfile.TemporaryDirectory(prefix="rpm-chaos-") as tmp,
        dask.config.set(SLURM_CONFIG if slurm else {}),
        dask.config.set({"rpm.resilience.buddies": buddies}),
        (slurm_setup if slurm else local_setup)(workers) as (cluster, client, label),
        log_lines(("to replace it", "not resubmitting")) as replacements,
    ):
        if checkpoint_store:
            store_kw = {"checkpoint_dir": os.path.join(tmp, "store")}
        injector = (SlurmInjector if slurm else LocalInjector)(
            cluster,
            client,
            seed,
            interval=interval,
            min_workers=min_workers,
            max_workers=max_workers,
            kinds=kinds,
        )
        run = train_under_faults(
            client,
            injector,
            x,
            d,
            (W0, V0),
            seconds,
            hidden=hidden,
            iterations=max_iterations,
            learning_rate=learning_rate,
            mapping=mapping,
            interval=block,
            checkpoint_every=checkpoint_every,
            **store_kw,
        )
    faults = injector.faults
    report: dict[str, Any] = {
        "setup": {
            "mode": "slurm" if slurm else "local",
            "cluster": label,
            "network": f"{n}-{hidden}-{outputs}",
            "samples": samples,
            "learning_rate": learning_rate,
            "mapping": mapping,
            "block": block,
            "checkpoint_every": checkpoint_every,
            "checkpoints": "store (workers write and read)" if checkpoint_store else "driver",
            "buddies": buddies,
            "kinds": list(kinds),
            "seed": seed,
            "seconds": seconds,
            "fault_interval_s": list(interval),
            "min_workers": min_workers,
            "max_workers": max_workers,
            **({"config": SLURM_CONFIG} if slurm else {}),
        },
        "faults": [f._asdict() for f in faults],
        "faults_by_kind": {k: sum(f.kind == k for f in faults) for k in (*KINDS, *TRAP_KINDS)},
        "injector_errors": injector.errors,
        "error": run.error,
        "jobs_resubmitted": sum("to replace it" in m for m in replacements),
        "nannies_replaced": getattr(injector, "nannies_replaced", 0),
        "replacement_log": replacements,
    }
    if run.result is None:
        report.update(
            completed=False, faults_survived=0, wall_seconds=round(time.monotonic() - wall0, 2)
        )
        return report
    report.update(completed=True, faults_injected=len(faults))
    report.update(_serial_check(run.result, x, d, (W0, V0), hidden, learning_rate))
    report.update(_fault_figures(run, faults))
    survived = sum(1 for o in report["outcomes"] if o != "UNACCOUNTED")
    report["traps"] = {
        "armed": sum(f.trap for f in faults),
        "sprung": sum(
            f.trap and not o.startswith("trap not sprung")
            for f, o in zip(faults, report["outcomes"])
        ),
    }
    report.update(
        faults_survived=survived if report["equal_to_serial"] else 0,
        train_seconds=round(run.seconds, 2),
        wall_seconds=round(time.monotonic() - wall0, 2),
    )
    return report


def summary(rep: dict[str, Any]) -> str:
    """The human-readable summary."""
    s = rep["setup"]
    lines = [
        f"chaos soak ({s['mode']}), seed {s['seed']}: {s['cluster']}",
        f"  network {s['network']}, {s['samples']} samples, lr {s['learning_rate']}, mapping {s['mapping']}, "
        f"blocks of {s['block']}, checkpoint every {s['checkpoint_every']} "
        f"({s.get('checkpoints', 'driver')}), a fault every "
        f"{s['fault_interval_s'][0]:g}-{s['fault_interval_s'][1]:g} s, {s['min_workers']}-{s['max_workers']} "
        f"workers",
        f"  faults injected: {len(rep['faults'])} "
        + "("
        + ", ".join(f"{k} {v}" for k, v in rep["faults_by_kind"].items())
        + ")",
    ]
    for f, o in zip(rep["faults"], rep.get("outcomes") or ["-"] * len(rep["faults"])):
        who = " ".join(str(v) for v in (f["worker"], f.get("job")) if v)
        lines.append(
            f"    {f['seconds']:7.1f} s  it {f['iteration']:6d}  {f['kind']:6s} {who:38s} -> {o}"
        )
    if rep.get("nannies_replaced"):
        lines.append(f"  closed nannies replaced (not faults): {rep['nannies_replaced']}")
    if rep["injector_errors"]:
        lines.append(f"  injector errors: {rep['injector_errors']}")
    if s["mode"] == "slurm":
        lines.append(f"  jobs resubmitted by the trainer (replace-lost): {rep['jobs_resubmitted']}")
    if not rep["completed"]:
        lines.append("  TRAINING FAILED:\n" + rep["error"])
        return "\n".join(lines)
    lines += [
        f"  faults survived: {rep['faults_survived']} of {rep['faults_injected']}; remaps {rep['remaps']}; "
        f"recovered from {rep['recovered_from']}",
        f"  iterations: {rep['iterations']} ({rep['median_seconds_per_iteration'] * 1e3:.2f} ms median); "
        f"recomputed {rep['iterations_recomputed']}, {rep['mean_recomputed_per_loss']:.2f} per loss on "
        f"average (each: {rep['recomputed_per_loss']})",
        f"  buddy copies: {rep['buddies']}",
        f"  traps (a worker armed to die at its next recovery / remap task): {rep['traps']}",
        f"  weight bytes moved {rep['weight_bytes_moved']}, sample bytes re-read {rep['sample_bytes_reread']}",
        f"  time lost: {rep['time_lost_seconds']:.2f} s in all, {rep['time_lost_per_fault_seconds']:.3f} s per fault "
        f"(remaps {rep['remap_seconds']:.2f} s + recomputed iterations)",
        f"  stalls (> 2 s between block boundaries): {len(rep['stalls'])}, {rep['stalled_seconds']:.1f} s in all"
        + "".join(
            f"\n    {g['seconds']:.1f} s at iteration {g['at_iteration']} ({g['at_s']:.1f} s)"
            for g in rep["stalls"]
        ),
        f"  bytes lost: {rep['bytes_lost']}; final relative difference vs fit_serial: weights "
        f"{rep['relative_difference_vs_serial']:.2e}, errors {rep['relative_difference_errors']:.2e} "
        f"({'EQUAL' if rep['equal_to_serial'] else 'NOT EQUAL'} at rtol 1e-10); conditioning "
        f"(1e-15 change of W0): {rep['conditioning_1e15_W0']:.2e}",
        f"  wall time {rep['wall_seconds']:.1f} s (training {rep['train_seconds']:.1f} s)",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--seconds", type=float, default=180.0, help="training time (default 180)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the faults and of the problem")
    ap.add_argument(
        "--slurm",
        action="store_true",
        help="on SLURM (SLURM_CONF; slurm/local-cluster.sh start): scancel and scale_group instead of "
        "SIGKILL, retire_workers and scale",
    )
    ap.add_argument(
        "--workers", type=int, default=3, help="workers (SLURM: jobs) at start (default 3)"
    )
    ap.add_argument("--min-workers", type=int, default=2)
    ap.add_argument("--max-workers", type=int, default=5)
    ap.add_argument(
        "--every",
        type=float,
        nargs=2,
        default=None,
        metavar=("MIN", "MAX"),
        help=f"seconds between faults, uniform (default {LOCAL_EVERY[0]:g} {LOCAL_EVERY[1]:g}; "
        f"with --slurm {SLURM_EVERY[0]:g} {SLURM_EVERY[1]:g})",
    )
    ap.add_argument("--mapping", default="drpm")
    ap.add_argument("--block", type=int, default=20, help="iterations per block")
    ap.add_argument("--checkpoint-every", type=int, default=100)
    ap.add_argument(
        "--checkpoint-store",
        action="store_true",
        help="checkpoints into a store the workers write and read (fit(checkpoint_dir=...)), "
        "not the driver's memory",
    )
    ap.add_argument(
        "--no-buddies",
        action="store_true",
        help="buddy copies off (rpm.resilience.buddies: false): losses take rows from another "
        "column or a checkpoint",
    )
    ap.add_argument(
        "--kinds",
        default=",".join(KINDS),
        help=f"the faults to draw from, comma-separated (default {','.join(KINDS)}; kill: SIGKILL only)",
    )
    ap.add_argument("--json", metavar="PATH", help="write the report as JSON here")
    a = ap.parse_args(argv)
    if not a.min_workers >= 1 or a.workers < a.min_workers or a.max_workers < a.workers:
        ap.error(
            f"need 1 <= --min-workers ({a.min_workers}) <= --workers ({a.workers}) <= --max-workers "
            f"({a.max_workers})"
        )
    if a.slurm and a.min_workers < 2:
        ap.error(f"--slurm needs --min-workers >= 2 (one job per group), got {a.min_workers}")
    rep = soak(
        a.seconds,
        a.seed,
        slurm=a.slurm,
        workers=a.workers,
        min_workers=a.min_workers,
        max_workers=a.max_workers,
        interval=tuple(a.every) if a.every else None,
        mapping=a.mapping,
        block=a.block,
        checkpoint_every=a.checkpoint_every,
        checkpoint_store=a.checkpoint_store,
        buddies=not a.no_buddies,
        kinds=tuple(k.strip() for k in a.kinds.split(",") if k.strip()),
    )
    print(summary(rep))
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(rep, fh, indent=1, default=str)
    ok = (
        rep["completed"]
        and rep["equal_to_serial"]
        and rep["faults_survived"] == rep["faults_injected"]
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
