"""Record types shared by the engine, DRPM, progress reports and results.

Named tuples rather than positional tuples: they cross process boundaries
(msgpack turns them into lists; ``Record(*row)`` restores them) and every
reader names the field it wants. Nothing here imports ``distributed``.
"""

from __future__ import annotations

from typing import Any, NamedTuple, TypedDict

__all__ = [
    "PHASES",
    "Observation",
    "RemapRecord",
    "remap_record",
    "Validation",
    "REMAP_KINDS",
]

#: Phases of one iteration as the history names them (seconds each).
PHASES = ("forward", "vertical_wait", "backward", "horizontal", "modify")


class Observation(NamedTuple):
    """What DRPM's estimator learns from one worker in one iteration.

    ``t1`` is forward start to backward end (the paper's), ``t2`` the backward
    compute, ``tc`` forward plus backward compute without the vertical wait.
    """

    worker: int
    work: int
    t1: float
    t2: float
    tc: float


class Validation(NamedTuple):
    """One validation evaluation: the recipe's validator writes it, progress, history and the dashboard read it."""

    iteration: int  # iterations done when it was evaluated
    loss: float  # validation loss (the training loss on the held-out samples)
    accuracy: float  # fraction right (NaN for a regression)


#: Kinds of remap: ``whole`` (a new plan over all workers) or ``column``
#: (DRPM moves hidden rows between the workers of each column).
REMAP_KINDS = ("whole", "column")


class _RemapDone(TypedDict):
    """The keys ``Driver.remap`` writes for every remap (required)."""

    iteration: int  # the remap happened before this iteration
    kind: str  # one of REMAP_KINDS
    bytes: int  # weight bytes moved between workers (or sent from the client)
    transfers: int  # row transfers between workers
    samples_reloaded: int  # workers that read their column's samples again
    sample_bytes: int  # sample bytes (x and d rows) those workers read again


class RemapRecord(_RemapDone, total=False):
    """What one remap did: the engine writes it, progress, the job, the dashboard and results read it.

    A dict rather than a named tuple: it crosses to the scheduler plugin and
    into the result file as JSON. ``iteration``, ``kind``, ``bytes``,
    ``transfers``, ``samples_reloaded`` and ``sample_bytes`` are in every
    record; recovery, retirement and DRPM add the optional ones below.
    """

    seconds: float  # wall time of the remap (set once it is done)
    reason: str  # why (a DRPM decision, a lost, joined or retiring worker)
    lost: list[str]  # addresses of the workers lost (recovery)
    joined: list[str]  # addresses of the workers that joined (elastic)
    retired: list[str]  # addresses of the workers retired before their lifetime ended
    recovered_from: str | None  # where a lost worker's rows came from: buddy, columns, checkpoint
    rows_from: dict[str, str]  # each lost worker's rows: buddy, other column, disk, driver, initial
    replayed: int  # iterations computed again after a loss
    store_bytes: int  # row files the workers read from a checkpoint store (a recovery from it)


def remap_record(iteration: int, kind: str, **fields: Any) -> RemapRecord:
    """A :class:`RemapRecord`: the required counts default to 0, every key is checked against the
    record's (a misspelt one is an error, not a silent extra key)."""
    if kind not in REMAP_KINDS:
        raise ValueError(f"remap kind {kind!r}; valid: {', '.join(REMAP_KINDS)}")
    known = set(RemapRecord.__required_keys__) | set(RemapRecord.__optional_keys__)
    unknown = sorted(set(fields) - known)
    if unknown:
        raise TypeError(f"remap record keys {unknown} are not RemapRecord's: {sorted(known)}")
    rec: dict[str, Any] = {
        "iteration": int(iteration),
        "kind": kind,
        "bytes": 0,
        "transfers": 0,
        "samples_reloaded": 0,
        "sample_bytes": 0,
    }
    rec.update(fields)
    return rec  # type: ignore[return-value]
