"""A job file's ``workers:``: EMULATED local workers (``local: {speeds: [...]}``) or SLURM
worker groups (``slurm: {groups: [...]}``), checked before anything starts."""

from __future__ import annotations

import math
from typing import Any

from ..slurm import SlurmConfigError, load_groups
from .spec import JobError, bad, unknown

__all__ = ["workers_spec"]


def _speeds(value: Any) -> dict[str, Any]:
    """``workers: {local: {speeds: [...]}}``."""
    if not isinstance(value, dict):
        raise bad(
            "workers.local",
            value,
            "expected a mapping with 'speeds'",
            "Write local: {speeds: [1.0, 0.5]}.",
        )
    unknown(value, ("speeds",), "workers.local")
    speeds = value.get("speeds")
    if (
        not isinstance(speeds, list)
        or not speeds
        or any(
            isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0
            for v in speeds
        )
    ):
        raise bad(
            "workers.local.speeds",
            speeds,
            "expected a list of EMULATED relative speeds > 0",
            "Write speeds: [1.0, 0.5, 0.25].",
        )
    return {"local": {"speeds": [float(v) for v in speeds]}}


def _slurm(value: Any) -> dict[str, Any]:
    """``workers: {slurm: {groups: [...], cluster: {...}}}``."""
    if not isinstance(value, dict):
        raise bad(
            "workers.slurm",
            value,
            "expected a mapping with 'groups' and optionally 'cluster'",
            "See docs/slurm.md.",
        )
    unknown(value, ("groups", "cluster"), "workers.slurm")
    try:
        groups = load_groups(value.get("groups"))
    except SlurmConfigError as e:
        raise JobError(f"job file: workers.slurm.groups: {e}") from None
    cluster = value.get("cluster") or {}
    if not isinstance(cluster, dict):
        raise bad(
            "workers.slurm.cluster",
            cluster,
            "expected a mapping of dask-jobqueue options",
            "Write e.g. cluster: {interface: ib0}.",
        )
    cluster = {str(k).replace("-", "_"): v for k, v in cluster.items()}
    return {"slurm": {"groups": groups, "cluster": cluster}}


def workers_spec(spec: Any) -> dict[str, Any]:
    """The checked ``workers:`` section: ``{"local": ...}``, ``{"slurm": ...}`` or ``{"scheduler": address}``."""
    if spec is None:
        raise JobError(
            "job file: no 'workers:'; add one of workers: {local: {speeds: [1.0, 0.5]}} "
            "(EMULATED, this machine), workers: {slurm: {groups: [...]}} or "
            "workers: {scheduler: tcp://host:8786}"
        )
    if not isinstance(spec, dict) or len(spec) != 1:
        raise bad(
            "workers",
            spec,
            "expected exactly one of 'local', 'slurm', 'scheduler'",
            "Keep one of them.",
        )
    unknown(spec, ("local", "slurm", "scheduler"), "workers")
    kind, value = next(iter(spec.items()))
    if kind == "scheduler":
        if not isinstance(value, str) or "://" not in value and ":" not in value:
            raise bad(
                "workers.scheduler",
                value,
                "expected a scheduler address",
                "Write e.g. scheduler: tcp://10.0.0.1:8786.",
            )
        return {"scheduler": value}
    return _speeds(value) if kind == "local" else _slurm(value)
