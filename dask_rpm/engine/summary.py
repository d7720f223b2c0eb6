"""What a finished run reports: :attr:`FitResult.stats` and :attr:`FitResult.history`.

Both are read off the driver (its counters, timing log and final plan), the
training loop and the run's start once the workers are done; nothing here
talks to the cluster.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..results import describe_history
from .checkpoint import StoredCheckpoint
from .dask_data import ChunkedRows
from .driver import Driver, Placed
from .drpm import DRPMState
from .history import add_validation, build_history
from .loop import TrainingLoop
from .records import Checkpoint

__all__ = ["run_history", "run_stats"]


def run_stats(
    driver: Driver, ckpt: Any, start: Checkpoint | StoredCheckpoint, loop: TrainingLoop
) -> dict[str, Any]:
    """``FitResult.stats``: the engine's counters."""
    return {
        "tasks": driver.tasks_submitted,
        "blocks": driver.epoch,
        "threads": dict(driver.kernel_threads),  # BLAS threads of each worker's kernels
        "backend": dict(
            driver.kernel_backends
        ),  # where each worker's kernels ran (torch-cuda, ...)
        "checkpoints": list(ckpt.times),  # (iteration, seconds) of each checkpoint
        "start": _start_stats(start, loop),
        # in-memory samples scattered in this run, and the copies reused from an earlier fit of
        # the same arrays on this client (engine.sent)
        "samples": {"sent_bytes": driver.sender.sent_bytes, "reused": driver.sender.reused},
        "memory": _memory(driver, driver.recipe.optimizer.slots),
        # buddy copies (dask_rpm.engine.buddies): R, who kept whose copies, the bytes they took
        "buddies": driver.book.stats() if driver.book is not None else {"on": False},
        # iterations losses cost: where each was seen less where training went on from
        "recomputed_iterations": int(
            sum(r.get("replayed", 0) for r in loop.remaps if r.get("lost"))
        ),
        # Dask's data (engine.dask_data): the chunks, which moved to which worker, their bytes
        **({"dask": driver.source.stats()} if isinstance(driver.source, ChunkedRows) else {}),
    }


def _start_stats(start: Checkpoint | StoredCheckpoint, loop: TrainingLoop) -> dict[str, Any]:
    """Where the run started and what placing its first shards moved (``FitResult.stats["start"]``)."""
    placed = loop.placed or Placed(0, 0, 0.0)
    return {
        "iteration": start.iteration,
        "from": "checkpoint store"
        if isinstance(start, StoredCheckpoint)
        else ("checkpoint" if start.iteration else "initial weights"),
        "client_bytes": placed.client_bytes,
        "store_bytes": placed.store_bytes,
        "seconds": placed.seconds,
    }


def _memory(driver: Driver, slots: Sequence[str]) -> dict[str, int]:
    """Bytes each worker holds for the run (``FitResult.stats["memory"]``): the weights and
    optimizer state of its rows of every layer in the final plan, and the most bytes of buddy
    copies it held at once (its own and those it kept for its buddy; a worker the plan leaves
    idle may hold copies only). The shard's two spare copies for rollback and divergence
    (:class:`~dask_rpm.engine.worker.Shard`) are not counted; the copies alone are
    ``FitResult.stats["buddies"]["memory"]``."""
    itemsize = np.dtype(driver.dtype).itemsize
    plan = driver.plan
    out = {
        driver.addresses[w]: driver.layers.nbytes(plan.rectangle(w).hidden, itemsize)
        * (1 + len(slots))
        for w in plan.planned_workers
    }
    for address, nbytes in (driver.book.memory if driver.book is not None else {}).items():
        out[address] = out.get(address, 0) + nbytes
    return out


def run_history(
    driver: Driver,
    drpm: DRPMState | None,
    names: dict[str, Any],
    emulation: str | None,
    validation: list[Any],
) -> Any:
    """The run's ``xarray`` history: timings, DRPM estimates, names, emulation, validation."""
    history = build_history(driver.log, driver.plan, driver.addresses, driver.run)
    if drpm is not None:
        drpm.add_to_history(history)
    # the network as trained, every hidden layer (the plan's shape has the one it cuts)
    history.attrs["shape"] = "-".join(map(str, driver.layers.shape))
    describe_history(history, driver.plan)
    history.coords["name"] = (
        "worker",
        np.array([str(names.get(a, a)) for a in history["address"].values], dtype=object),
        {"description": "Dask worker name (on SLURM <group>-<n>)"},
    )
    if emulation:
        history.attrs["emulation"] = emulation
    if (
        driver.exchanges
    ):  # which allreduce algorithms the last plan ran (rpm.engine.vertical/horizontal)
        history.attrs["exchanges"] = driver.exchanges
    add_validation(history, validation)
    return history
