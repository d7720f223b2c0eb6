"""Worker groups: one kind of SLURM job each (partition, cores, memory, ...).

A :class:`WorkerGroup` checks its fields when made (:mod:`.validation`);
:func:`load_groups` reads them from Python or ``rpm.slurm.groups``, and
:func:`group_from_name` finds a worker's group from its name alone.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from dataclasses import KW_ONLY, dataclass, fields
from typing import Any

from .. import config
from .validation import (
    SlurmConfigError,
    check_cores,
    check_directives,
    check_gpu_requests,
    check_gpus,
    check_integer,
    check_lifetime,
    check_memory,
    check_name,
    check_site_name,
    check_speed,
    check_walltime,
    check_worker_args,
    config_error,
    str_tuple,
)

__all__ = ["WorkerGroup", "group_from_name", "load_groups"]


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
        Dask worker processes per job; must divide ``cores``. Left out: ``gpus``
        for a GPU group, else 1.
    gpus
        GPUs per job (default 0: none). The job asks for ``--gres=gpu:<gpus>``
        and runs one worker process per GPU (``processes`` is ``gpus``; giving
        another is an error); each worker holds the Dask resource ``GPU=1`` and
        sees its own GPU of the job, as device 0 (``CUDA_VISIBLE_DEVICES``,
        set by the job's nannies: :mod:`dask_rpm.slurm.gpu`). Workers of a group
        without GPUs see none (``CUDA_VISIBLE_DEVICES=""``), so
        ``fit(backend="auto")`` trains on the GPUs of the GPU groups and on
        the CPUs of the others. Ask for GPUs here only, not in
        ``job_extra_directives``.
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
    processes: int = None  # type: ignore[assignment]  # None: from gpus (__post_init__ sets an int)
    gpus: int = 0
    queue: str | None = None
    account: str | None = None
    walltime: str | None = None
    job_extra_directives: tuple[str, ...] = ()
    job_script_prologue: tuple[str, ...] = ()
    worker_extra_args: tuple[str, ...] = ()
    speed: float | None = None
    lifetime: str | bool | None = None

    def __post_init__(self) -> None:
        # frozen: normalised values (tuples, "<n>B", float speed) are set through object.__setattr__
        name = check_name(self.name)
        check_integer(name, "jobs", self.jobs, 0)
        cores = check_integer(name, "cores", self.cores, 1)
        gpus, processes = check_gpus(name, self.gpus, self.processes)
        object.__setattr__(self, "processes", check_integer(name, "processes", processes, 1))
        check_cores(name, cores, processes, gpus)
        object.__setattr__(self, "memory", check_memory(name, self.memory, processes))
        for field in ("queue", "account"):
            check_site_name(name, field, getattr(self, field))
        check_walltime(name, self.walltime)
        object.__setattr__(
            self, "job_extra_directives", check_directives(name, self.job_extra_directives)
        )
        object.__setattr__(
            self,
            "job_script_prologue",
            str_tuple(name, "job_script_prologue", self.job_script_prologue, "module load python"),
        )
        args = check_worker_args(name, self.worker_extra_args)
        object.__setattr__(self, "worker_extra_args", args)
        check_lifetime(name, self.lifetime, args)
        object.__setattr__(self, "speed", check_speed(name, self.speed))
        check_gpu_requests(name, gpus, self.job_extra_directives, args)
        if gpus and self.speed is not None:
            raise config_error(
                name,
                "speed",
                self.speed,
                f"a group with gpus={gpus} runs REAL: its workers train on their GPUs, unpaced",
                "Leave speed unset; EMULATED speeds are for CPU groups on one machine.",
            )

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
