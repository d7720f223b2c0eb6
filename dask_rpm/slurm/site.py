"""The SLURM installation seen from here: can this process submit jobs?"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterable

__all__ = ["slurm_unavailable"]


def slurm_unavailable(partitions: Iterable[str] = (), *, conf_required: bool = False) -> str | None:
    """Say why SLURM cannot take jobs from here, or return ``None`` when it can.

    Checks, in order: ``sbatch`` on the ``PATH``; ``SLURM_CONF``, when set,
    pointing at a file; ``sinfo`` answering (unset ``SLURM_CONF``: the reason
    names the local cluster of ``slurm/local-cluster.sh``, which is not on the
    default path); and each of ``partitions`` known to it. ``conf_required``:
    ``SLURM_CONF`` must be set (the tutorials, written for the local cluster). Every reason says how to fix it, so scripts can print it and
    exit (the tutorials do).
    """
    if not shutil.which("sbatch"):
        return (
            "sbatch is not on the PATH (install SLURM, or run slurm/local-cluster.sh start as root)"
        )
    conf = os.environ.get("SLURM_CONF")
    if conf_required and not conf:
        return (
            "SLURM_CONF is not set; for the local cluster: "
            "export SLURM_CONF=/tmp/dask-rpm-slurm/slurm.conf (after sudo slurm/local-cluster.sh start)"
        )
    if conf and not os.path.isfile(conf):
        return f"SLURM_CONF={conf} does not exist; start the cluster with sudo slurm/local-cluster.sh start"
    # a site's SLURM finds its own slurm.conf; the local test cluster needs SLURM_CONF
    local_hint = (
        ""
        if conf
        else "; for the local cluster: export SLURM_CONF=/tmp/dask-rpm-slurm/slurm.conf (after "
        "sudo slurm/local-cluster.sh start)"
    )
    try:
        p = subprocess.run(["sinfo", "-h", "-o", "%P"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"sinfo did not answer ({e}); is slurmctld running?{local_hint}"
    if p.returncode != 0:
        return f"sinfo failed: {' '.join(p.stderr.split())[:200]}{local_hint}"
    known = {name.rstrip("*") for name in p.stdout.split()}
    missing = [q for q in partitions if q not in known]
    if missing:
        return (
            f"partition(s) {', '.join(missing)} not in this SLURM (it has: {', '.join(sorted(known)) or 'none'}); "
            f"set DASK_RPM_SLURM_PARTITIONS or edit the worker groups"
        )
    return None
