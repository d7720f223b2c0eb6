"""Control from the client: read, label and change the EMULATED workers of any cluster.

Every helper works with any Dask cluster (workers without emulation are
listed as ``None`` or skipped) and with a client made from an address, since
it asks the workers' ``"rpm-emulation"`` plugins rather than a cluster object.
With an asynchronous client the helpers return awaitables.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from distributed import Worker

from ..runtime.labels import run_label
from .pacing import EmulationPlugin
from .profile import PLUGIN_NAME, check_speed

__all__ = [
    "emulation_info",
    "emulation_label",
    "emulation_report",
    "format_report",
    "reset_clock",
    "set_speed",
    "worker_addresses",
]

logger = logging.getLogger(__name__)


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
        check_speed(speed)
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
    ``DASK_RPM_EMULATED_SPEED`` and clients made from an address
    (:func:`dask_rpm.runtime.labels.run_label`). Returns ``None`` when no worker is
    emulated; an awaitable for an asynchronous client.
    """
    return _call(client, run_label)


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
