"""The one worker ordering: index ``i`` of a plan is worker ``i`` in this order.

A leaf (no ``distributed``): the engine, the probe and the dashboard all
order a scheduler's workers with :func:`ordered_workers`, so "worker 2" means
the same worker in a plan, a probe result and the ``/rpm`` page.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["ordered_workers", "worker_sort_key"]


def worker_sort_key(name: Any) -> tuple[str, int, str]:
    """Sort key of a worker name: text first, a trailing number compared as a number.

    ``"w-10"`` sorts after ``"w-9"``; a name without a trailing number sorts
    before the numbered ones of the same prefix.
    """
    s = str(name)
    head = s.rstrip("0123456789")
    tail = s[len(head) :]
    return (head, int(tail) if tail else -1, s)


def ordered_workers(info: Mapping[str, Any]) -> list[str]:
    """Worker addresses in a stable order: by group/name, numbers compared as numbers.

    Parameters
    ----------
    info : mapping
        The scheduler's identity (``scheduler.identity()``): its ``workers``
        maps each address to a dict that may hold the worker's ``name``.

    Returns
    -------
    list of str
        Addresses; index ``i`` in this order is worker ``i`` of a plan (and
        ``speeds[i]`` of :func:`dask_rpm.local_cluster`).
    """
    ws = info["workers"]
    return sorted(ws, key=lambda a: worker_sort_key(ws[a].get("name", a)))
