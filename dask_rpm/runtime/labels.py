"""The EMULATED label of a run: the emulated speeds of its workers, in one line.

Every result of a run on EMULATED workers carries this label (``FitResult.emulation``, the
probe's, the history's): emulation shows the method, it is not hardware. It is found the same
way for every kind of client: the cluster object's own ``emulation_label`` where the client
was made from one, else what the workers say of themselves - each EMULATED worker's plugin
puts a ``describe`` hook on it (:mod:`dask_rpm.runtime.hooks`), so a client made from an
address, workers emulated through ``DASK_RPM_EMULATED_SPEED`` (SLURM groups with a
``speed``) and real clusters all get the same answer without the caller importing the
emulation.

A leaf: it imports only the hooks; the client is any Dask client (duck-typed).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from .hooks import worker_hooks

__all__ = ["format_label", "run_label", "worker_description"]

logger = logging.getLogger("dask_rpm")


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


def format_label(
    speeds: Sequence[float],
    scale: Sequence[float] | float,
    where: str,
    schedule: Mapping[int, Sequence[Sequence[Any]]] | None = None,
) -> str:
    """The one-line EMULATED label printed with every result of an emulated cluster.

    Parameters
    ----------
    speeds : sequence of float
        Relative speeds in worker order.
    scale : float or sequence of float
        Fraction of a core per unit speed (several when workers differ).
    where : str
        ``"on one machine"`` or ``"on N hosts"``.
    schedule : dict, optional
        Speed changes per worker index.
    """
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


def worker_description(dask_worker: Any) -> tuple[Any, dict[str, Any] | None]:
    """``(name, what the worker's describe hook says)`` on a worker (``client.run``); the
    description is None on a worker that emulates nothing."""
    describe = worker_hooks(dask_worker).describe
    return dask_worker.name, (None if describe is None else describe())


async def run_label(client: Any) -> str | None:
    """The EMULATED label of results obtained through ``client`` (awaited on its event loop).

    Returns
    -------
    str or None
        ``None`` when no worker is emulated, or when the workers could not be asked (a
        connection lost meanwhile: the label is informative, never a reason to fail a run;
        the log says so).
    """
    label = getattr(getattr(client, "cluster", None), "emulation_label", None)
    if label:
        return str(label)
    try:
        raw = await client.run(worker_description)
    except (OSError, TimeoutError) as e:
        logger.warning(f"could not ask the workers for their EMULATED speeds: {e!r}")
        return None
    emu = sorted(
        (d for _, d in raw.values() if d is not None),
        key=lambda d: (d["index"] is None, d["index"] or 0, str(d.get("name"))),
    )
    if not emu:
        return None
    hosts = {d.get("host") for d in emu}
    where = "on one machine" if len(hosts) <= 1 else f"on {len(hosts)} hosts"
    sched = {
        d["index"] if d["index"] is not None else k: d["schedule"]
        for k, d in enumerate(emu)
        if d["schedule"]
    }
    text = format_label([d["speed"] for d in emu], [d["scale"] for d in emu], where, sched)
    if len(emu) < len(raw):
        text += f" ({len(raw) - len(emu)} of {len(raw)} workers not emulated)"
    return text
