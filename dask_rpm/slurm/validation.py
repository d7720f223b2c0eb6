"""The checks a :class:`~dask_rpm.slurm.WorkerGroup` runs on its fields.

Each check names the group and the field, says what was received, what is
valid and how to fix it, and returns the field's normalised value (a tuple
for a list, a float for a speed, ``"<n>B"`` for a memory given in bytes).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from typing import Any

from dask.utils import parse_bytes, parse_timedelta

from .walltime import WALLTIME_RE

__all__ = [
    "GPU_DIRECTIVES",
    "MANAGED_WORKER_ARGS",
    "SlurmConfigError",
    "check_cores",
    "check_directives",
    "check_gpu_requests",
    "check_gpus",
    "check_integer",
    "check_lifetime",
    "check_memory",
    "check_name",
    "check_site_name",
    "check_speed",
    "check_walltime",
    "check_worker_args",
    "config_error",
    "gres_asks_gpu",
    "option_value",
    "split_option",
    "str_tuple",
]

# Group names become worker-name prefixes, SLURM job names and shell values:
# keep them simple, and without "-" so "<group>-<n>-<k>" parses one way only.
_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
# a command-line option and its value, given as "--opt=value" or "--opt value"
_OPTION_RE = re.compile(r"^(--?[A-Za-z][\w-]*)(?:(?:=|\s+)(.*))?$", re.S)
#: ``#SBATCH`` options that ask for GPUs: the group's ``gpus`` field does (``--gres=gpu:N``).
GPU_DIRECTIVES = ("--gpus", "--gpus-per-node", "--gpus-per-task", "--gpus-per-socket", "-G")
#: Worker options the cluster sets itself from the group's fields.
MANAGED_WORKER_ARGS = ("--name", "--nworkers", "--nthreads", "--memory-limit", "--nprocs")


class SlurmConfigError(ValueError):
    """A worker group or cluster setting is invalid (the message says how to fix it)."""


def config_error(group: str | None, field: str, got: Any, valid: str, fix: str) -> SlurmConfigError:
    """The error for ``field=got`` of ``group``: what is valid and how to fix it."""
    where = f"worker group {group!r}" if group else "worker group"
    return SlurmConfigError(f"{where}: {field}={got!r} is invalid; {valid}. {fix}")


def str_tuple(group: str, field: str, value: Any, example: str) -> tuple[str, ...]:
    """``value`` as a tuple of strings; a bare string is refused (it would become its characters)."""
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise config_error(
            group, field, value, "expected a list of strings", f"Write e.g. {field}=[{example!r}]."
        )
    out = tuple(value)
    bad = [v for v in out if not isinstance(v, str)]
    if bad:
        raise config_error(
            group, field, value, "every item must be a string", f"Quote the items {bad!r}."
        )
    return out


def check_name(name: Any) -> str:
    """A group name: an identifier without ``-`` (it separates the group from the worker number)."""
    if not isinstance(name, str) or not _NAME_RE.match(name):
        fix = "Use letters, digits and '_' and start with a letter, e.g. 'fast' or 'node_a'."
        if isinstance(name, str) and "-" in name:
            fix = f"Use {name.replace('-', '_')!r}: '-' separates the group from the worker number."
        raise config_error(None, "name", name, "a group name is an identifier such as 'fast'", fix)
    return name


def check_integer(group: str, field: str, value: Any, lo: int) -> int:
    """An integer (not a bool) of at least ``lo``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise config_error(
            group, field, value, f"expected an integer >= {lo}", f"Give e.g. {field}={max(lo, 1)}."
        )
    return value


def check_gpus(group: str, gpus: Any, processes: Any) -> tuple[int, int]:
    """GPUs per job (an integer >= 0) and the worker processes that follow: one per GPU.

    Returns ``(gpus, processes)``: ``processes`` left out (None) is ``gpus``
    for a GPU group, 1 otherwise; given, it must equal ``gpus`` when that is > 0.
    """
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 0:
        raise config_error(
            group,
            "gpus",
            gpus,
            "expected an integer >= 0: GPUs per job (--gres=gpu:N), one worker process each",
            "Give e.g. gpus=2, or leave it out (0) for a group without GPUs.",
        )
    if processes is None:
        return gpus, gpus or 1
    if gpus and processes != gpus:
        raise config_error(
            group,
            "processes",
            processes,
            f"with gpus={gpus} a job runs one worker process per GPU, so processes must be {gpus}",
            f"Leave processes out (it follows gpus), or set gpus={processes!r} for that many GPUs "
            f"per job.",
        )
    return gpus, processes


def check_cores(group: str, cores: int, processes: int, gpus: int = 0) -> None:
    """``processes`` must divide ``cores``: each process gets ``cores / processes`` threads."""
    if gpus and cores % processes:
        raise config_error(
            group,
            "cores",
            cores,
            f"with gpus={gpus} each of a job's {gpus} GPU workers gets cores/gpus threads, so "
            f"cores must be a multiple of {gpus}",
            f"Use e.g. cores={gpus * max(1, cores // gpus)}.",
        )
    if cores % processes:
        raise config_error(
            group,
            "processes",
            processes,
            f"it must divide cores={cores} (each process gets cores/processes threads)",
            f"Use processes=1 or a divisor of {cores}.",
        )


def check_memory(group: str, memory: Any, processes: int) -> str:
    """Memory per job as a size string (an integer means bytes), at least 1 MiB per process."""
    if isinstance(memory, int) and not isinstance(memory, bool):
        memory = f"{memory}B"
    try:
        nbytes = parse_bytes(memory) if isinstance(memory, str) else None
    except (ValueError, TypeError):
        nbytes = None
    if not nbytes or nbytes <= 0:
        raise config_error(
            group,
            "memory",
            memory,
            "expected a size such as '4GiB' or '500MB'",
            "Give memory per job.",
        )
    if nbytes < 1024**2 * processes:
        raise config_error(
            group,
            "memory",
            memory,
            "less than 1 MiB per worker process",
            "Give memory per job, e.g. '2GiB'.",
        )
    return memory


def check_site_name(group: str, field: str, value: Any) -> None:
    """A SLURM partition or account: a name without spaces, or None."""
    if value is not None and (
        not isinstance(value, str) or not value.strip() or any(c.isspace() for c in value)
    ):
        raise config_error(
            group, field, value, "expected a SLURM name without spaces, or None", f"Check {field}."
        )


def check_walltime(group: str, walltime: Any) -> None:
    """A SLURM time string, ``UNLIMITED``/``INFINITE``, or None."""
    if walltime is None:
        return
    # Integers are refused: YAML 1.1 reads an unquoted 12:00:00 as the
    # number 43200, which SLURM would take as 43200 minutes.
    if not isinstance(walltime, str) or not (
        WALLTIME_RE.match(walltime) or walltime.upper() in {"UNLIMITED", "INFINITE"}
    ):
        raise config_error(
            group,
            "walltime",
            walltime,
            "expected a SLURM time string: minutes ('90'), 'HH:MM:SS' or 'D-HH:MM:SS'",
            'Give a string; in YAML quote it, e.g. walltime: "01:00:00" (unquoted it becomes a number).',
        )


def check_directives(group: str, value: Any) -> tuple[str, ...]:
    """Extra ``#SBATCH`` options, given without the ``#SBATCH`` prefix."""
    directives = str_tuple(group, "job_extra_directives", value, "--exclusive")
    for d in directives:
        if d.lstrip().upper().startswith("#SBATCH"):
            raise config_error(
                group,
                "job_extra_directives",
                d,
                "the '#SBATCH' prefix is added for you",
                f"Write {d.lstrip()[len('#SBATCH') :].strip()!r}.",
            )
    return directives


def check_worker_args(group: str, value: Any) -> tuple[str, ...]:
    """Extra ``dask worker`` options, none of :data:`MANAGED_WORKER_ARGS`."""
    args = str_tuple(group, "worker_extra_args", value, "--lifetime=55m")
    for a in args:
        if a.split("=", 1)[0] in MANAGED_WORKER_ARGS:
            raise config_error(
                group,
                "worker_extra_args",
                a,
                f"{', '.join(MANAGED_WORKER_ARGS)} are set from the group's fields",
                "Use name, processes, cores and memory instead.",
            )
    return args


def split_option(item: str) -> tuple[str, str | None]:
    """An option's name and value: ``--opt=v`` and ``--opt v`` give ``("--opt", "v")``, ``--opt``
    alone ``("--opt", None)``; anything else is its own name."""
    m = _OPTION_RE.match(item.strip())
    if m is None:
        return item.strip(), None
    return m.group(1), m.group(2)


def option_value(args: Sequence[str], option: str) -> tuple[int, str] | None:
    """Where ``option`` is in ``args`` and its value (``--opt=v``, ``--opt v`` or the next item), the last one."""
    found = None
    for i, a in enumerate(args):
        name, value = split_option(a)
        if name == option:
            found = (i, value if value is not None else (args[i + 1] if i + 1 < len(args) else ""))
    return found


def gres_asks_gpu(spec: str) -> bool:
    """Whether a ``--gres`` value (``gpu:2``, ``gpu:a100:1,nvme:1``) names GPUs."""
    return any(item.strip().split(":", 1)[0] == "gpu" for item in spec.split(","))


def check_gpu_requests(
    group: str, gpus: int, directives: tuple[str, ...], worker_args: tuple[str, ...]
) -> None:
    """No GPUs asked for outside the ``gpus`` field: it alone gives each worker its own GPU.

    A ``--gres=gpu``/``--gpus`` directive would give a group's workers GPUs the
    cluster does not hand out (a group without ``gpus`` hides them:
    ``CUDA_VISIBLE_DEVICES=""``), and a ``GPU`` worker resource would claim one.
    """
    for d in directives:
        name, value = split_option(d)
        if name in GPU_DIRECTIVES or (name == "--gres" and gres_asks_gpu(value or "")):
            raise config_error(
                group,
                "job_extra_directives",
                d,
                "GPUs are asked for with the group's gpus field: it writes --gres=gpu:N, runs "
                "one worker per GPU and gives each worker its own",
                f"Remove {d!r} and set gpus: N (now {gpus}).",
            )
    found = option_value(worker_args, "--resources")
    if found and any(pair.split("=", 1)[0] == "GPU" for pair in found[1].replace(",", " ").split()):
        raise config_error(
            group,
            "worker_extra_args",
            f"--resources {found[1]}",
            "the GPU resource follows the group's gpus field (GPU=1 on each worker of a GPU group)",
            "Remove GPU from --resources and set gpus: N.",
        )


def check_lifetime(group: str, lifetime: Any, worker_args: tuple[str, ...]) -> None:
    """A duration, False or None; not also given as ``--lifetime`` in the worker options."""
    if lifetime is not None and lifetime is not False:
        try:
            ok = isinstance(lifetime, str) and parse_timedelta(lifetime) > 0
        except (ValueError, KeyError, TypeError):
            ok = False
        if not ok:
            raise config_error(
                group,
                "lifetime",
                lifetime,
                "expected a duration such as '55m' or '2h', false, or null (from the walltime)",
                'Give e.g. lifetime: "50m".',
            )
    if any(a.split("=", 1)[0] == "--lifetime" for a in worker_args) and lifetime not in (
        None,
        False,
    ):
        raise config_error(
            group,
            "lifetime",
            lifetime,
            "worker_extra_args already has --lifetime",
            "Give the lifetime in one place.",
        )


def check_speed(group: str, speed: Any) -> float | None:
    """An EMULATED relative speed: a finite number > 0, or None (real hardware)."""
    if speed is None:
        return None
    ok = (
        isinstance(speed, (int, float))
        and not isinstance(speed, bool)
        and math.isfinite(speed)
        and speed > 0
    )
    if not ok:
        raise config_error(
            group,
            "speed",
            speed,
            "expected a positive number (relative speed, emulation only) or None",
            "Leave speed unset on real hardware; abilities are measured.",
        )
    return float(speed)
