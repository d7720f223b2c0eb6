"""Heterogeneous worker provisioning on SLURM: one Dask scheduler, several job types.

dask-jobqueue's :class:`~dask_jobqueue.SLURMCluster` submits one kind of job.
A heterogeneous run wants several kinds at once - for example two partitions
with different node types - all feeding the *same* scheduler, so the planner
sees every worker and can give each a rectangle sized to its ability.

:class:`WorkerGroup` describes one kind of job (partition, cores, memory, ...).
:class:`HeterogeneousSLURMCluster` is a :class:`~dask_jobqueue.SLURMCluster`
whose ``worker_spec`` holds jobs of several groups. dask-jobqueue has no public
API for this; the semi-private parts of ``SpecCluster`` and
``JobQueueCluster`` (``worker_spec``, ``workers``, ``_correct_state``,
``_job_kwargs``) are touched only inside that class, and its tests pin the
behaviour (dask-jobqueue is pinned to 0.9.0).

How a worker carries its group
------------------------------
Three views of the same fact, each for a different reader:

* the **worker name** is ``<group>-<n>`` (``<group>-<n>-<k>`` when a job runs
  ``k`` processes), so the dashboard, logs, plans and histories show the
  group without any lookup;
* the job script exports ``DASK_RPM_GROUP=<group>`` (:data:`GROUP_ENV`), so
  code running *on* the worker knows its group without parsing names;
* a worker preload (this module's :func:`dask_setup`) copies it into the
  worker's registration, so it appears on the scheduler as
  ``scheduler_info()["workers"][address]["rpm_group"]`` (:data:`GROUP_KEY`)
  and ``WorkerState.extra["rpm_group"]`` for scheduler plugins.

Worker *resources* (``--resources group_fast=1``) were rejected: resources
change task placement semantics, and plans pin tasks to worker addresses
anyway.

Scaling is the trainer's job
----------------------------
The trainer decides how many workers of each group exist (a plan is made for
a fixed set of workers), so :meth:`HeterogeneousSLURMCluster.adapt` raises and
plain ``scale(n)`` is refused (which group would ``n`` mean?). Use
:meth:`~HeterogeneousSLURMCluster.scale_group`.

Emulated speed
--------------
``WorkerGroup.speed`` exists **only to emulate heterogeneity on one machine**
(tests, demos, the local SLURM of ``slurm/local-cluster.sh``). It is exported
to the job as ``DASK_RPM_EMULATED_SPEED=<speed>`` (:data:`SPEED_ENV`) and the
job's workers also preload :mod:`dask_rpm.emulation`, which reads the variable
and paces the kernels to that relative speed. On real hardware leave it
``None``: abilities are then measured (probe, DRPM), never assumed.
"""

from __future__ import annotations

import asyncio
import difflib
import logging
import math
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import KW_ONLY, dataclass, fields
from typing import Any

import dask.config
from dask.utils import parse_bytes, parse_timedelta
from dask_jobqueue import SLURMCluster
from dask_jobqueue.slurm import SLURMJob
from distributed.core import Status
from distributed.utils import NoOpAwaitable

from . import config

__all__ = [
    "GROUP_ENV",
    "GROUP_KEY",
    "SPEED_ENV",
    "SPEED_KEY",
    "HeterogeneousSLURMCluster",
    "SlurmConfigError",
    "WorkerGroup",
    "dask_setup",
    "group_from_name",
    "load_groups",
    "slurm_unavailable",
]

logger = logging.getLogger(__name__)

#: Environment variable holding the worker's group name inside its job.
GROUP_ENV = "DASK_RPM_GROUP"
#: Environment variable holding the emulated relative speed (emulation only).
SPEED_ENV = "DASK_RPM_EMULATED_SPEED"
#: Key of the group name in the scheduler's worker info (``WorkerState.extra``).
GROUP_KEY = "rpm_group"
#: Key of the emulated speed in the scheduler's worker info, when set.
SPEED_KEY = "rpm_emulated_speed"

# Module the workers preload so they report their group to the scheduler.
_WORKER_PRELOAD = __name__
# Module that turns DASK_RPM_EMULATED_SPEED into paced kernels (emulation only).
_EMULATION_PRELOAD = "dask_rpm.emulation"

# Group names become worker-name prefixes, SLURM job names and shell values:
# keep them simple, and without "-" so "<group>-<n>-<k>" parses one way only.
_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
# SLURM time formats: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S.
_WALLTIME_RE = re.compile(r"^(\d+-\d+(:\d+){0,2}|\d+(:\d+){0,2})$")
# Worker options the cluster sets itself from the group's fields.
_MANAGED_WORKER_ARGS = ("--name", "--nworkers", "--nthreads", "--memory-limit", "--nprocs")
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


class SlurmConfigError(ValueError):
    """A worker group or cluster setting is invalid (the message says how to fix it)."""


# --------------------------------------------------------------------------
# Worker groups
# --------------------------------------------------------------------------


def _fail(group: str | None, field: str, got: Any, valid: str, fix: str) -> SlurmConfigError:
    where = f"worker group {group!r}" if group else "worker group"
    return SlurmConfigError(f"{where}: {field}={got!r} is invalid; {valid}. {fix}")


def _str_tuple(group: str, field: str, value: Any, example: str) -> tuple[str, ...]:
    # A bare string would silently become a tuple of characters.
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise _fail(
            group, field, value, "expected a list of strings", f"Write e.g. {field}=[{example!r}]."
        )
    out = tuple(value)
    bad = [v for v in out if not isinstance(v, str)]
    if bad:
        raise _fail(group, field, value, "every item must be a string", f"Quote the items {bad!r}.")
    return out


def _walltime_seconds(walltime: Any) -> float | None:
    """Seconds of a SLURM time (``M``, ``M:S``, ``H:M:S``, ``D-H[:M[:S]]``); None if unlimited/unknown."""
    if not isinstance(walltime, str) or not _WALLTIME_RE.match(walltime):
        return None
    days, _, rest = walltime.rpartition("-")
    parts = [int(p) for p in rest.split(":")]
    if days:  # D-H, D-H:M, D-H:M:S
        parts += [0] * (3 - len(parts))
        h, m, sec = parts
        return ((int(days) * 24 + h) * 60 + m) * 60.0 + sec
    if len(parts) == 1:  # minutes
        return parts[0] * 60.0
    if len(parts) == 2:  # M:S
        return parts[0] * 60.0 + parts[1]
    h, m, sec = parts
    return (h * 60 + m) * 60.0 + sec


def _lifetime_args(g: Any, walltime: Any) -> list[str]:
    """``--lifetime`` for the group's workers: given, or 10 % (at most 5 min) before the walltime ends."""
    if g.lifetime is False:
        return []
    if g.lifetime is not None:
        return ["--lifetime", str(g.lifetime)]
    seconds = _walltime_seconds(walltime)
    if seconds is None:
        return []
    return ["--lifetime", f"{int(seconds - min(0.1 * seconds, 300.0))}s"]


@dataclass(frozen=True)
class WorkerGroup:
    """One kind of SLURM job: a set of identical workers with a shared name.

    Parameters
    ----------
    name
        Group name: letters, digits and ``_``, starting with a letter (no
        ``-``: worker names are ``<name>-<n>``). Also used as the SLURM job
        name ``dask-rpm-<name>``.
    jobs
        Number of jobs to submit when the cluster starts (``0`` submits none;
        change later with :meth:`HeterogeneousSLURMCluster.scale_group`).
    cores
        Cores per job (``#SBATCH --cpus-per-task``), split evenly between the
        job's worker processes as threads.
    memory
        Memory per job, e.g. ``"4GiB"`` (``#SBATCH --mem``).
    processes
        Dask worker processes per job; must divide ``cores``.
    queue
        SLURM partition (``#SBATCH -p``). ``partition`` is accepted as an
        alias by :meth:`from_dict`. ``None`` uses the site default.
    account
        SLURM account (``#SBATCH -A``), or ``None``.
    walltime
        Time limit, a SLURM time such as ``"01:00:00"`` or ``"1-12:00:00"``;
        ``None`` uses dask-jobqueue's ``jobqueue.slurm.walltime``.
    job_extra_directives
        Extra ``#SBATCH`` options, without the ``#SBATCH`` prefix, e.g.
        ``["--exclusive", "--constraint=skylake"]``.
    job_script_prologue
        Shell lines run before the worker starts (``module load ...``).
    worker_extra_args
        Extra ``dask worker`` options. ``--name``, ``--nworkers``,
        ``--nthreads`` and ``--memory-limit`` are derived from the fields
        above and may not be given here.
    lifetime
        The Dask worker's ``--lifetime``: a duration such as ``"55m"``, ``False``
        for none, or ``None`` (default): from the walltime, 10 % (at most 5
        minutes) before it ends. Training retires a worker shortly before its
        lifetime ends, moving its rows to the others first
        (:mod:`dask_rpm.engine.retirement`), so a walltime never costs work.
    speed
        **EMULATION ONLY.** Relative speed this group pretends to have when
        heterogeneity is emulated on one machine; exported to the job as
        ``DASK_RPM_EMULATED_SPEED`` and applied by the
        :mod:`dask_rpm.emulation` preload. A job cannot run faster than its
        cores, so keep speeds at most 1 (e.g. 1.0 and 0.5) unless the
        prologue also sets ``DASK_RPM_EMULATED_SCALE``. On real,
        heterogeneous hardware leave it ``None`` - abilities are then
        *measured*, and a made-up speed here would slow real workers down
        for no reason.
    """

    name: str
    _: KW_ONLY
    jobs: int = 1
    cores: int = 1
    memory: str = "1GiB"
    processes: int = 1
    queue: str | None = None
    account: str | None = None
    walltime: str | None = None
    job_extra_directives: tuple[str, ...] = ()
    job_script_prologue: tuple[str, ...] = ()
    worker_extra_args: tuple[str, ...] = ()
    speed: float | None = None
    lifetime: str | bool | None = None

    def __post_init__(self) -> None:
        name = self.name
        if not isinstance(name, str) or not _NAME_RE.match(name):
            fix = "Use letters, digits and '_' and start with a letter, e.g. 'fast' or 'node_a'."
            if isinstance(name, str) and "-" in name:
                fix = f"Use {name.replace('-', '_')!r}: '-' separates the group from the worker number."
            raise _fail(None, "name", name, "a group name is an identifier such as 'fast'", fix)

        def integer(field: str, lo: int) -> int:
            v = getattr(self, field)
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise _fail(
                    name,
                    field,
                    v,
                    f"expected an integer >= {lo}",
                    f"Give e.g. {field}={max(lo, 1)}.",
                )
            return v

        integer("jobs", 0)
        cores = integer("cores", 1)
        processes = integer("processes", 1)
        if cores % processes:
            raise _fail(
                name,
                "processes",
                processes,
                f"it must divide cores={cores} (each process gets cores/processes threads)",
                f"Use processes=1 or a divisor of {cores}.",
            )

        memory = self.memory
        if isinstance(memory, int) and not isinstance(memory, bool):
            memory = f"{memory}B"
            object.__setattr__(self, "memory", memory)
        try:
            nbytes = parse_bytes(memory) if isinstance(memory, str) else None
        except (ValueError, TypeError):
            nbytes = None
        if not nbytes or nbytes <= 0:
            raise _fail(
                name,
                "memory",
                self.memory,
                "expected a size such as '4GiB' or '500MB'",
                "Give memory per job.",
            )
        if nbytes < 1024**2 * processes:
            raise _fail(
                name,
                "memory",
                memory,
                "less than 1 MiB per worker process",
                "Give memory per job, e.g. '2GiB'.",
            )

        for field in ("queue", "account"):
            v = getattr(self, field)
            if v is not None and (
                not isinstance(v, str) or not v.strip() or any(c.isspace() for c in v)
            ):
                raise _fail(
                    name,
                    field,
                    v,
                    "expected a SLURM name without spaces, or None",
                    f"Check {field}.",
                )

        walltime = self.walltime
        if walltime is not None:
            # Integers are refused: YAML 1.1 reads an unquoted 12:00:00 as the
            # number 43200, which SLURM would take as 43200 minutes.
            if not isinstance(walltime, str) or not (
                _WALLTIME_RE.match(walltime) or walltime.upper() in {"UNLIMITED", "INFINITE"}
            ):
                raise _fail(
                    name,
                    "walltime",
                    self.walltime,
                    "expected a SLURM time string: minutes ('90'), 'HH:MM:SS' or 'D-HH:MM:SS'",
                    'Give a string; in YAML quote it, e.g. walltime: "01:00:00" (unquoted it becomes a number).',
                )

        directives = _str_tuple(
            name, "job_extra_directives", self.job_extra_directives, "--exclusive"
        )
        for d in directives:
            if d.lstrip().upper().startswith("#SBATCH"):
                raise _fail(
                    name,
                    "job_extra_directives",
                    d,
                    "the '#SBATCH' prefix is added for you",
                    f"Write {d.lstrip()[len('#SBATCH') :].strip()!r}.",
                )
        object.__setattr__(self, "job_extra_directives", directives)
        object.__setattr__(
            self,
            "job_script_prologue",
            _str_tuple(name, "job_script_prologue", self.job_script_prologue, "module load python"),
        )
        args = _str_tuple(name, "worker_extra_args", self.worker_extra_args, "--lifetime=55m")
        for a in args:
            if a.split("=", 1)[0] in _MANAGED_WORKER_ARGS:
                raise _fail(
                    name,
                    "worker_extra_args",
                    a,
                    f"{', '.join(_MANAGED_WORKER_ARGS)} are set from the group's fields",
                    "Use name, processes, cores and memory instead.",
                )
        object.__setattr__(self, "worker_extra_args", args)
        lifetime = self.lifetime
        if lifetime is not None and lifetime is not False:
            try:
                ok = isinstance(lifetime, str) and parse_timedelta(lifetime) > 0
            except (ValueError, KeyError, TypeError):
                ok = False
            if not ok:
                raise _fail(
                    name,
                    "lifetime",
                    lifetime,
                    "expected a duration such as '55m' or '2h', false, or null (from the walltime)",
                    'Give e.g. lifetime: "50m".',
                )
        if any(a.split("=", 1)[0] == "--lifetime" for a in args) and lifetime not in (None, False):
            raise _fail(
                name,
                "lifetime",
                lifetime,
                "worker_extra_args already has --lifetime",
                "Give the lifetime in one place.",
            )

        speed = self.speed
        if speed is not None:
            ok = (
                isinstance(speed, (int, float))
                and not isinstance(speed, bool)
                and math.isfinite(speed)
                and speed > 0
            )
            if not ok:
                raise _fail(
                    name,
                    "speed",
                    speed,
                    "expected a positive number (relative speed, emulation only) or None",
                    "Leave speed unset on real hardware; abilities are measured.",
                )
            object.__setattr__(self, "speed", float(speed))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> WorkerGroup:
        """Build a group from a mapping such as one item of ``rpm.slurm.groups``.

        Keys may use ``-`` or ``_`` (``job-extra-directives`` or
        ``job_extra_directives``); ``partition`` is an alias of ``queue``.

        Raises
        ------
        SlurmConfigError
            On unknown keys (with the closest valid key), a missing name, or an
            invalid value.
        """
        if isinstance(d, WorkerGroup):
            return d
        if not isinstance(d, Mapping):
            raise SlurmConfigError(
                f"a worker group must be a mapping such as {{'name': 'fast', 'jobs': 2, 'cores': 4, "
                f"'memory': '8GiB'}}; got {type(d).__name__} {d!r}"
            )
        valid = [f.name for f in fields(cls) if f.name != "_"]
        kwargs: dict[str, Any] = {}
        for key, value in d.items():
            k = str(key).replace("-", "_")
            if k == "partition":
                k = "queue"
            if k not in valid:
                close = difflib.get_close_matches(k, [*valid, "partition"], n=1)
                hint = f" Did you mean {close[0]!r}?" if close else ""
                raise SlurmConfigError(
                    f"worker group {d.get('name', '?')!r}: unknown key {key!r}. Valid keys: "
                    f"{', '.join(valid)} (and 'partition' for queue).{hint}"
                )
            if k in kwargs and kwargs[k] != value:
                raise SlurmConfigError(
                    f"worker group {d.get('name', '?')!r}: {k} given twice ({kwargs[k]!r} and {value!r}, "
                    f"perhaps as both 'queue' and 'partition'); keep one"
                )
            kwargs[k] = value
        if "name" not in kwargs:
            raise SlurmConfigError(f"worker group {dict(d)!r} has no 'name'; add e.g. name: fast")
        name = kwargs.pop("name")
        return cls(name, **kwargs)

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form (lists, not tuples); ``from_dict(g.to_dict()) == g``."""
        out: dict[str, Any] = {}
        for f in fields(self):
            if f.name == "_":
                continue
            v = getattr(self, f.name)
            out[f.name] = list(v) if isinstance(v, tuple) else v
        return out


def load_groups(
    groups: Iterable[WorkerGroup | Mapping[str, Any]] | None = None,
) -> list[WorkerGroup]:
    """Resolve worker groups given in Python or in dask config.

    Parameters
    ----------
    groups
        :class:`WorkerGroup` objects or mappings; ``None`` reads
        ``rpm.slurm.groups`` from dask config at call time.

    Returns
    -------
    list of WorkerGroup
        At least one group, names unique, in the given order.

    Raises
    ------
    SlurmConfigError
        If there are no groups, a group is invalid, or names repeat.
    """
    raw = config.get("slurm.groups", groups)
    if isinstance(raw, (str, Mapping)) or not isinstance(raw, Iterable):
        raise SlurmConfigError(
            f"worker groups must be a list of groups; got {type(raw).__name__} {raw!r}. "
            f"In YAML write rpm: slurm: groups: [ {{name: fast, cores: 4, memory: 8GiB}}, ... ]"
        )
    out = [WorkerGroup.from_dict(g) for g in raw]
    if not out:
        raise SlurmConfigError(
            "no worker groups: pass groups=[WorkerGroup('fast', cores=4, memory='8GiB'), ...] "
            "or set rpm.slurm.groups in dask config (see docs/slurm.md)"
        )
    names = [g.name for g in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise SlurmConfigError(
            f"worker group names must be unique; repeated: {dup}. Rename or merge those groups."
        )
    return out


def slurm_unavailable(partitions: Iterable[str] = ()) -> str | None:
    """Say why SLURM cannot take jobs from here, or return ``None`` when it can.

    Checks, in order: ``sbatch`` on the ``PATH``; ``SLURM_CONF`` set (the
    local cluster of ``slurm/local-cluster.sh`` is not on the default path)
    and pointing at a file; ``sinfo`` answering; and each of ``partitions``
    known to it. Every reason says how to fix it, so scripts can print it and
    exit (the tutorials do).
    """
    if not shutil.which("sbatch"):
        return (
            "sbatch is not on the PATH (install SLURM, or run slurm/local-cluster.sh start as root)"
        )
    conf = os.environ.get("SLURM_CONF")
    if not conf:
        return (
            "SLURM_CONF is not set; for the local cluster: "
            "export SLURM_CONF=/tmp/dask-rpm-slurm/slurm.conf (after sudo slurm/local-cluster.sh start)"
        )
    if not os.path.isfile(conf):
        return f"SLURM_CONF={conf} does not exist; start the cluster with sudo slurm/local-cluster.sh start"
    try:
        p = subprocess.run(["sinfo", "-h", "-o", "%P"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"sinfo did not answer ({e}); is slurmctld running? (slurm/local-cluster.sh status)"
    if p.returncode != 0:
        return f"sinfo failed: {p.stderr.strip()[:200]}"
    known = {name.rstrip("*") for name in p.stdout.split()}
    missing = [q for q in partitions if q not in known]
    if missing:
        return (
            f"partition(s) {', '.join(missing)} not in this SLURM (it has: {', '.join(sorted(known)) or 'none'}); "
            f"set DASK_RPM_SLURM_PARTITIONS or edit the worker groups"
        )
    return None


def group_from_name(worker_name: Any, groups: Iterable[str]) -> str | None:
    """Group of a worker named ``<group>-<n>`` or ``<group>-<n>-<k>``, else ``None``.

    Works without a cluster object, e.g. on names stored in a training history.
    """
    s = str(worker_name)
    for g in sorted(groups, key=len, reverse=True):
        rest = s[len(g) + 1 :] if s.startswith(g + "-") else None
        if rest and all(part.isdigit() for part in rest.split("-")):
            return g
    return None


# --------------------------------------------------------------------------
# Worker preload: report the group to the scheduler
# --------------------------------------------------------------------------


def dask_setup(worker: Any) -> None:
    """Worker preload hook: copy the job's group (and emulated speed) into its registration.

    Jobs of :class:`HeterogeneousSLURMCluster` start their workers with
    ``--preload dask_rpm.slurm``; the values then show up on the scheduler as
    ``scheduler_info()["workers"][addr]["rpm_group"]`` and in
    ``WorkerState.extra``. A worker started by hand without the environment
    variables is left untouched.
    """
    group = os.environ.get(GROUP_ENV)
    if group:
        worker.startup_information[GROUP_KEY] = lambda _w, g=group: g
    speed = os.environ.get(SPEED_ENV)
    if speed:
        try:
            value = float(speed)
        except ValueError:
            logger.warning("ignoring %s=%r: not a number", SPEED_ENV, speed)
        else:
            worker.startup_information[SPEED_KEY] = lambda _w, v=value: v


# --------------------------------------------------------------------------
# The cluster
# --------------------------------------------------------------------------


class _MarkFailedOnStart:
    """Job mixin: a job whose submission raised is marked failed.

    Otherwise it stays "created", and SpecCluster's close asserts that every
    job it made is closing, closed or failed.
    """

    async def start(self) -> None:
        try:
            await super().start()  # type: ignore[misc]
        except BaseException:
            self.status = Status.failed  # type: ignore[attr-defined]
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
        self._replacements: dict[
            str, list[float]
        ] = {}  # group -> when its ended jobs were resubmitted
        self._given_up: set[str] = set()  # groups no longer resubmitted (their jobs keep ending)
        first = next(iter(self._groups.values()))
        # The base class validates job keywords by building one job; give it
        # the first group so the check is real. Its own new_spec is unused.
        super().__init__(n_workers=0, **self._job_options(first, kwargs))
        self.job_cls = type(self.job_cls.__name__, (_MarkFailedOnStart, self.job_cls), {})
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
        exports = [f"export {GROUP_ENV}={shlex.quote(g.name)}"]
        preloads = ["--preload", _WORKER_PRELOAD]
        if g.speed is not None:
            # Emulation only: dask_rpm.emulation's preload reads the variable
            # and paces the worker's kernels to this relative speed.
            exports.append(f"export {SPEED_ENV}={g.speed!r}")
            preloads += ["--preload", _EMULATION_PRELOAD]
        return {
            **common,
            "cores": g.cores,
            "memory": g.memory,
            "processes": g.processes,
            "queue": g.queue,
            "account": g.account,
            "walltime": g.walltime,
            "job_name": f"dask-rpm-{g.name}",
            "job_extra_directives": self._config_list("job-extra-directives", config_name)
            + list(g.job_extra_directives),
            "job_script_prologue": self._config_list("job-script-prologue", config_name)
            + exports
            + list(g.job_script_prologue),
            "worker_extra_args": (
                args := self._config_list("worker-extra-args", config_name)
                + list(g.worker_extra_args)
            )
            + (
                []
                if any(a.split("=", 1)[0] == "--lifetime" for a in args)
                else _lifetime_args(g, g.walltime or common.get("walltime"))
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
        ids = {name: i for name, i in ids.items() if i}
        if not ids:
            return []
        out = subprocess.run(
            ["squeue", "-h", "-o", "%i", "-j", ",".join(ids.values())],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if out.returncode not in (0, 1):  # 1: every id given has ended ("Invalid job id")
            logger.warning("squeue failed (%s): %s", out.returncode, out.stderr.strip())
            return []
        alive = set(out.stdout.split())
        return [name for name, i in ids.items() if i not in alive]

    async def replace_lost(self) -> dict[str, str]:
        """Keep every group at its job count: resubmit jobs that ended (``{lost job: new job}``).

        A group that lost ``rpm.slurm.replace-max`` jobs within ``rpm.slurm.replace-window``
        seconds is not resubmitted any more (its jobs keep failing); the log says so once.
        """
        import time as _time

        replaced: dict[str, str] = {}
        limit, window = (
            int(config.get("slurm.replace-max")),
            float(config.get("slurm.replace-window")),
        )
        now = _time.monotonic()
        for job in await asyncio.get_running_loop().run_in_executor(None, self.lost_jobs):
            group = self._job_group[job]
            history = self._replacements.setdefault(group, [])
            history[:] = [t for t in history if now - t < window]
            del self.worker_spec[job]
            self.workers.pop(job, None)
            if len(history) >= limit:
                if group not in self._given_up:
                    self._given_up.add(group)
                    logger.warning(
                        f"group {group!r}: {len(history) + 1} jobs ended within {window:g} s "
                        f"(rpm.slurm.replace-window); not resubmitting it any more"
                    )
                continue
            history.append(now)
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

    def scale(
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
