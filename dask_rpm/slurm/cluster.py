"""The cluster: one Dask scheduler fed by SLURM jobs of several worker groups.

dask-jobqueue has no public API for several job kinds; the semi-private
parts of ``SpecCluster`` and ``JobQueueCluster`` (``worker_spec``,
``workers``, ``_correct_state``, ``_job_kwargs``) are touched only inside
:class:`HeterogeneousSLURMCluster`, and its tests pin the behaviour
(dask-jobqueue is pinned to 0.9.0). See :mod:`dask_rpm.slurm`.
"""

from __future__ import annotations

import asyncio
import logging
import shlex
import time
from collections.abc import Iterable, Mapping
from typing import Any

import dask.config
from dask_jobqueue import SLURMCluster
from dask_jobqueue.slurm import SLURMJob

from .. import config
from .._distributed import NoOpAwaitable, Status
from ..runtime.closing import quiet_when_closing
from .gpu import gpu_exports, gres_directives, with_gpu_resource
from .groups import WorkerGroup, group_from_name, load_groups
from .preload import EMULATION_PRELOAD, GROUP_ENV, GROUP_KEY, SPEED_ENV, WORKER_PRELOAD
from .replacement import ReplacementBudget, ended_jobs
from .validation import SlurmConfigError
from .walltime import lifetime_args

__all__ = ["HeterogeneousSLURMCluster"]

logger = logging.getLogger(__name__)

# Job keywords that are per group; passing them cluster-wide is an error.
_PER_GROUP_KWARGS = {
    "cores": "cores",
    "memory": "memory",
    "processes": "processes",
    "queue": "queue",
    "account": "account",
    "walltime": "walltime",
    "job_extra_directives": "job_extra_directives",
    "job_script_prologue": "job_script_prologue",
    "worker_extra_args": "worker_extra_args",
    "job_name": None,
    "job_cpu": "cores",
    "job_mem": "memory",
    "n_workers": "jobs",
    "project": "account",
}


class _MarkFailedOnStart:
    """Job mixin: a job whose submission raised is marked failed.

    Otherwise it stays "created", and SpecCluster's close asserts that every
    job it made is closing, closed or failed.
    """

    async def start(self) -> None:
        try:
            await super().start()  # type: ignore[misc]  # a Job class mixin: start is the next class's
        except BaseException:
            self.status = Status.failed
            raise


class HeterogeneousSLURMCluster(SLURMCluster):
    """One Dask scheduler fed by SLURM jobs of several kinds (:class:`WorkerGroup`).

    Parameters
    ----------
    groups
        Worker groups (objects or mappings); ``None`` reads
        ``rpm.slurm.groups`` from dask config.
    submit
        Submit each group's initial ``jobs`` on start. ``False`` submits
        nothing (e.g. to inspect :meth:`job_scripts` where there is no SLURM).
    **kwargs
        Passed to :class:`dask_jobqueue.SLURMCluster` for every group:
        ``interface``, ``scheduler_options`` (``host``, ``dashboard_address``,
        ``preload`` for scheduler plugins, ...), ``python``, ``log_directory``,
        ``local_directory``, ``death_timeout``, ``shebang``, ``nanny``,
        ``job_directives_skip``, ``name``, ``asynchronous``, ``security``, ...
        Per-group settings (``cores``, ``memory``, ``queue``, ...) belong in
        the groups and are refused here.

    Notes
    -----
    Worker names are ``<group>-<n>``; see the module docstring for the other
    ways a worker carries its group. Numbers are never reused within a
    cluster, so a retiring worker never clashes with its replacement.

    Adaptive scaling is disabled: the trainer owns the worker set (see
    :meth:`adapt`). Site-wide lists from dask-jobqueue's config
    (``jobqueue.slurm.job-extra-directives``, ``job-script-prologue``,
    ``worker-extra-args``) are kept and the group's items appended.

    Examples
    --------
    >>> groups = [WorkerGroup("fast", jobs=2, cores=4, memory="8GiB", queue="fast"),
    ...           WorkerGroup("slow", jobs=4, cores=2, memory="4GiB", queue="slow")]
    >>> cluster = HeterogeneousSLURMCluster(groups, interface="ib0")  # doctest: +SKIP
    >>> cluster.scale_group("slow", 2)  # doctest: +SKIP
    >>> cluster.wait_for_groups(timeout=300)  # doctest: +SKIP
    """

    def __init__(
        self,
        groups: Iterable[WorkerGroup | Mapping[str, Any]] | None = None,
        *,
        submit: bool = True,
        **kwargs: Any,
    ) -> None:
        self._groups: dict[str, WorkerGroup] = {g.name: g for g in load_groups(groups)}
        refused = sorted(set(kwargs) & set(_PER_GROUP_KWARGS))
        if refused:
            where = {k: _PER_GROUP_KWARGS[k] for k in refused}
            raise SlurmConfigError(
                f"{refused} are per-group settings and cannot be given to the cluster; set the matching "
                f"WorkerGroup fields instead ({', '.join(f'{k} -> {v}' for k, v in where.items() if v)}"
                f"{'; job_name is always dask-rpm-<group>' if 'job_name' in where else ''})"
            )
        self._job_group: dict[str, str] = {}  # job (spec) name -> group name
        self._next_index: dict[str, int] = {name: 0 for name in self._groups}
        self._group_specs: dict[str, dict[str, Any]] = {}
        self._retiring: set[str] = set()  # worker names of removed jobs, retired before scancel
        self._budget = ReplacementBudget()  # how many ended jobs of each group are resubmitted
        first = next(iter(self._groups.values()))
        # The base class validates job keywords by building one job; give it
        # the first group so the check is real. Its own new_spec is unused.
        super().__init__(n_workers=0, **self._job_options(first, kwargs))
        quiet_when_closing(
            self
        )  # the scheduler's notices while it closes (dask_rpm.runtime.closing)
        # a subclass made here, so that every group shares the start-failure marking
        self.job_cls = type(self.job_cls.__name__, (_MarkFailedOnStart, self.job_cls), {})  # type: ignore[assignment]
        common = {k: v for k, v in self._job_kwargs.items() if k not in _JOB_FIELDS}
        self._group_specs = {name: self._make_spec(g, common) for name, g in self._groups.items()}
        if submit and any(g.jobs for g in self._groups.values()):
            for g in self._groups.values():
                self._set_jobs(g.name, g.jobs)
            if not self.asynchronous:  # an asynchronous cluster submits when awaited
                try:
                    self.sync(self._correct_state_checked)
                except Exception:
                    self.close()  # cancels the jobs that were submitted
                    raise

    # -- building job specs ------------------------------------------------

    def _config_list(self, key: str, config_name: str | None) -> list[str]:
        value = dask.config.get(f"jobqueue.{config_name or SLURMJob.config_name}.{key}", None)
        return list(value or [])

    def _job_options(self, g: WorkerGroup, common: Mapping[str, Any]) -> dict[str, Any]:
        """Keywords for :class:`SLURMJob` (via the cluster) for group ``g``."""
        config_name = common.get("config_name")
        exports = [f"export {GROUP_ENV}={shlex.quote(g.name)}", *gpu_exports(g.gpus)]
        preloads = ["--preload", WORKER_PRELOAD]
        if g.gpus:  # the nannies give each worker its own GPU before starting it (.gpu)
            preloads += ["--preload-nanny", WORKER_PRELOAD]
        if g.speed is not None:
            # Emulation only: dask_rpm.emulation's preload reads the variable
            # and paces the worker's kernels to this relative speed.
            exports.append(f"export {SPEED_ENV}={g.speed!r}")
            preloads += ["--preload", EMULATION_PRELOAD]
        args = self._config_list("worker-extra-args", config_name) + list(g.worker_extra_args)
        if g.gpus:  # each worker of a GPU group holds the Dask resource GPU=1
            args = with_gpu_resource(args)
        return {
            **common,
            "cores": g.cores,
            "memory": g.memory,
            "processes": g.processes,
            "queue": g.queue,
            "account": g.account,
            "walltime": g.walltime,
            "job_name": f"dask-rpm-{g.name}",
            "job_extra_directives": gres_directives(
                g.gpus,
                self._config_list("job-extra-directives", config_name)
                + list(g.job_extra_directives),
            ),
            "job_script_prologue": self._config_list("job-script-prologue", config_name)
            + exports
            + list(g.job_script_prologue),
            "worker_extra_args": args
            + (
                []
                if any(a.split("=", 1)[0] == "--lifetime" for a in args)
                else lifetime_args(g.lifetime, g.walltime or common.get("walltime"))
            )
            + preloads,
        }

    def _make_spec(self, g: WorkerGroup, common: Mapping[str, Any]) -> dict[str, Any]:
        spec: dict[str, Any] = {"cls": self.job_cls, "options": self._job_options(g, common)}
        if g.processes > 1:
            # SpecCluster maps a job to its k worker names "<job>-0" ... "<job>-(k-1)".
            spec["group"] = [f"-{i}" for i in range(g.processes)]
        return spec

    # -- groups -------------------------------------------------------------

    @property
    def groups(self) -> tuple[WorkerGroup, ...]:
        """The worker groups, in the order given."""
        return tuple(self._groups.values())

    def _group(self, name: str) -> WorkerGroup:
        try:
            return self._groups[name]
        except KeyError:
            raise KeyError(
                f"no worker group {name!r}; this cluster has {list(self._groups)}"
            ) from None

    def requested_jobs(self) -> dict[str, int]:
        """Jobs currently wanted per group (submitted or about to be)."""
        out = {name: 0 for name in self._groups}
        for job in self.worker_spec:
            out[self._job_group[job]] += 1
        return out

    def _job_of(self, worker_name: Any) -> str | None:
        s = str(worker_name)
        if s in self._job_group:
            return s
        head, _, tail = s.rpartition("-")
        if head in self._job_group and tail.isdigit():
            return head
        return None

    def group_of(self, worker: str) -> str:
        """Group of a worker given by name (``"fast-0"``) or address.

        Raises
        ------
        KeyError
            If ``worker`` is neither a known worker name nor the address of a
            connected worker of this cluster.
        """
        info = self.scheduler_info.get("workers", {}) if self.scheduler_info else {}
        name: Any = worker
        if worker in info:
            ident = info[worker]
            if ident.get(GROUP_KEY) in self._groups:
                return ident[GROUP_KEY]
            name = ident.get("name", worker)
        job = self._job_of(name)
        if job is not None:
            return self._job_group[job]
        group = group_from_name(name, self._groups)
        if group is not None:  # a job already removed from the spec
            return group
        raise KeyError(
            f"{worker!r} is not a worker of this cluster (names look like "
            f"'{next(iter(self._groups))}-0'; connected: {sorted(str(v.get('name')) for v in info.values())})"
        )

    def worker_groups(self) -> dict[str, str]:
        """``{address: group}`` for the workers connected now."""
        info = self.scheduler_info.get("workers", {}) if self.scheduler_info else {}
        return {addr: self.group_of(addr) for addr in info}

    # -- scaling ------------------------------------------------------------

    def _set_jobs(self, name: str, jobs: int) -> None:
        """Edit the job spec of group ``name`` to hold ``jobs`` jobs (submits nothing)."""
        g = self._group(name)
        if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 0:
            raise SlurmConfigError(
                f"scale_group({name!r}, jobs={jobs!r}): jobs must be an integer >= 0"
            )
        if jobs and self.status in (Status.closing, Status.closed):
            raise RuntimeError(f"cannot add {name!r} jobs: the cluster is {self.status.name}")
        mine = [job for job in self.worker_spec if self._job_group.get(job) == name]
        if len(mine) > jobs:
            info = self.scheduler_info.get("workers", {}) if self.scheduler_info else {}
            connected = {self._job_of(v.get("name")) for v in info.values()}
            # Drop jobs still queued in SLURM before jobs whose workers work;
            # among equals, the newest.
            order = sorted(mine, key=lambda j: (j in connected, -int(j.rsplit("-", 1)[1])))
            for job in order[: len(mine) - jobs]:
                del self.worker_spec[job]
                suffixes = self._group_specs.get(name, {}).get("group", [""])
                self._retiring.update(f"{job}{suffix}" for suffix in suffixes)
        while len(mine) < jobs:
            # Fresh numbers only: a retiring worker never shares a name with its successor.
            job = f"{g.name}-{self._next_index[name]}"
            self._next_index[name] += 1
            self._job_group[job] = name
            self.worker_spec[job] = self._group_specs[name]
            mine.append(job)

    def _forget_failed_jobs(self) -> list[str]:
        # A job whose submission raised stays in self.workers; SpecCluster
        # would never retry it. Drop it from the spec so the cluster stays
        # consistent and a later scale_group submits a fresh job.
        failed = [
            name
            for name, job in self.workers.items()
            if job.status in (Status.created, Status.failed)
        ]
        for name in failed:
            self.workers.pop(name).status = Status.failed
            self.worker_spec.pop(name, None)
        if failed:
            logger.warning("submission failed for jobs %s; removed them from the cluster", failed)
        return failed

    async def _correct_state_checked(self) -> None:
        # SpecCluster asks the scheduler to retire workers by *job* name, which
        # the scheduler reads as addresses and ignores; retire by worker name
        # first so their data moves to the remaining workers before scancel.
        names, self._retiring = sorted(self._retiring), set()
        if names and self.scheduler_comm is not None and self.status == Status.running:
            await self.scheduler_comm.retire_workers(names=names)
        try:
            await self._correct_state()
        except Exception:
            self._forget_failed_jobs()
            raise

    def _apply(self) -> Any:
        # Submit/cancel now rather than in a background callback, so sbatch
        # and scancel errors reach the caller instead of only the log.
        if self.asynchronous:
            return self._correct_state_checked()
        return self.sync(self._correct_state_checked)

    def lost_jobs(self) -> list[str]:
        """Jobs of the spec whose SLURM job has ended (walltime, ``scancel``, node failure): not in ``squeue``."""
        ids = {
            name: str(getattr(job, "job_id", "") or "")
            for name, job in self.workers.items()
            if name in self.worker_spec
        }
        return ended_jobs({name: i for name, i in ids.items() if i})

    async def replace_lost(self) -> dict[str, str]:
        """Keep every group at its job count: resubmit jobs that ended (``{lost job: new job}``).

        A group that lost ``rpm.slurm.replace-max`` jobs within ``rpm.slurm.replace-window``
        seconds is not resubmitted any more (its jobs keep failing); the log says so once.
        """
        replaced: dict[str, str] = {}
        slurm = config.section("slurm")  # read once per call
        limit, window = int(slurm["replace_max"]), float(slurm["replace_window"])
        now = time.monotonic()
        for job in await asyncio.get_running_loop().run_in_executor(None, self.lost_jobs):
            group = self._job_group[job]
            del self.worker_spec[job]
            self.workers.pop(job, None)
            if not self._budget.allow(group, now, limit, window):
                continue
            before = set(self.worker_spec)
            self._set_jobs(
                group, sum(1 for j in self.worker_spec if self._job_group.get(j) == group) + 1
            )
            (new,) = set(self.worker_spec) - before
            replaced[job] = new
        if replaced:
            await self._correct_state_checked()
            logger.info(
                "replaced ended SLURM job(s): %s",
                ", ".join(f"{old} -> {new}" for old, new in replaced.items()),
            )
        return replaced

    def scale_group(self, name: str, jobs: int) -> Any:
        """Ask for exactly ``jobs`` jobs of group ``name``.

        Jobs are added with fresh names. When shrinking, jobs whose workers
        have not connected yet (still queued in SLURM) go first, then the
        newest; their workers are retired before the jobs are cancelled.

        Returns once the jobs are submitted or cancelled (an awaitable when
        ``asynchronous``), not when the workers have connected: use
        :meth:`wait_for_groups` for that.

        Raises
        ------
        KeyError
            Unknown group.
        SlurmConfigError
            ``jobs`` is not an integer >= 0.
        RuntimeError
            Submission failed (the message holds sbatch's output).
        """
        self._set_jobs(name, jobs)
        return self._apply()

    def scale_groups(self, jobs: Mapping[str, int]) -> Any:
        """:meth:`scale_group` for several groups at once, e.g. ``{"fast": 2, "slow": 0}``."""
        for name, n in jobs.items():  # check everything before changing anything
            self._group(name)
            if isinstance(n, bool) or not isinstance(n, int) or n < 0:
                raise SlurmConfigError(
                    f"scale_groups: jobs for {name!r} is {n!r}; give an integer >= 0"
                )
        for name, n in jobs.items():
            self._set_jobs(name, n)
        return self._apply()

    def scale(  # type: ignore[override]  # jobs/memory/cores: dask-jobqueue's, refused below
        self,
        n: int | None = None,
        jobs: int = 0,
        memory: str | None = None,
        cores: int | None = None,
    ) -> Any:
        """Only ``scale(0)`` (stop every job) is supported; use :meth:`scale_group`.

        A single number cannot say which kind of worker to add.
        """
        if n or jobs or memory or cores:
            raise NotImplementedError(
                f"scale(n={n!r}, jobs={jobs!r}, memory={memory!r}, cores={cores!r}) is ambiguous on a heterogeneous "
                f"cluster; use scale_group(name, jobs) or scale_groups({{name: jobs}}) with groups {list(self._groups)}"
            )
        # Also called by SpecCluster._close on the event loop, which then
        # applies the change itself: only edit the spec here.
        for name in self._groups:
            self._set_jobs(name, 0)
        assert self.loop is not None  # a started cluster has its event loop
        self.loop.add_callback(self._correct_state)
        return NoOpAwaitable() if self.asynchronous else None

    def adapt(self, *args: Any, **kwargs: Any) -> Any:
        """Refused: the trainer decides the worker set, so adaptive scaling is off.

        A plan assigns work to a fixed set of workers; workers appearing or
        vanishing under an adaptive policy would break it mid-iteration. Use
        :meth:`scale_group` between training runs (or let the trainer do it).
        """
        raise NotImplementedError(
            "adaptive scaling is disabled on HeterogeneousSLURMCluster: the trainer owns the worker set. "
            "Use cluster.scale_group(name, jobs) instead."
        )

    def _expected_workers(self) -> dict[str, int]:
        return {name: n * self._groups[name].processes for name, n in self.requested_jobs().items()}

    def _count_by_group(self, workers: Mapping[str, Mapping[str, Any]]) -> dict[str, int]:
        out = {name: 0 for name in self._groups}
        for ident in workers.values():
            if ident.get("status", "running") != "running":
                continue
            group = ident.get(GROUP_KEY)
            if group not in out:
                job = self._job_of(ident.get("name"))
                group = (
                    self._job_group[job]
                    if job
                    else group_from_name(ident.get("name"), self._groups)
                )
            if group in out:
                out[group] += 1
        return out

    async def _wait_for_groups(self, timeout: float | None) -> dict[str, int]:
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            ident = await self.scheduler_comm.identity()
            have = self._count_by_group(ident.get("workers", {}))
            want = self._expected_workers()
            if have == want:
                return have
            if deadline is not None and loop.time() > deadline:
                raise TimeoutError(
                    f"workers per group after {timeout}s: {have}, wanted {want}. Check the jobs with "
                    f"'squeue' and their output (log_directory), and that the workers can reach the scheduler "
                    f"at {self.scheduler_address}"
                )
            await asyncio.sleep(0.2)

    def wait_for_groups(self, timeout: float | None = None) -> Any:
        """Wait until every group has exactly its requested workers running.

        Waits for up- and down-scaling alike. Returns ``{group: workers}``.

        Raises
        ------
        TimeoutError
            After ``timeout`` seconds, with the counts seen and wanted.
        """
        return self.sync(self._wait_for_groups, timeout)

    # -- job scripts ----------------------------------------------------------

    def job_scripts(self) -> dict[str, str]:
        """The job script each group submits, ``{group: script}``.

        The worker name inside reads ``<group>-dummy``; real jobs get
        ``<group>-<n>``. Needs no SLURM.
        """
        try:
            address = self.scheduler.address
        except AttributeError:
            address = None
        address = address or "tcp://<insert-scheduler-address-here>:8786"
        return {
            name: self.job_cls(address, name=f"{name}-dummy", **spec["options"]).job_script()
            for name, spec in self._group_specs.items()
        }

    def job_script(self, group: str | None = None) -> str:
        """The job script of ``group`` (may be omitted when there is only one group)."""
        if group is None:
            if len(self._groups) != 1:
                raise ValueError(
                    f"several worker groups {list(self._groups)}: say which, job_script('<group>')"
                )
            group = next(iter(self._groups))
        self._group(group)
        return self.job_scripts()[group]


# Per-group job keywords (everything else in the job options is cluster-wide).
_JOB_FIELDS = {
    "cores",
    "memory",
    "processes",
    "queue",
    "account",
    "walltime",
    "job_name",
    "job_extra_directives",
    "job_script_prologue",
    "worker_extra_args",
}
