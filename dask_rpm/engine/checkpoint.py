"""Checkpoints the workers write (the driver's side): who writes which rows, then the manifest.

At a block boundary the driver sends each writer :func:`dask_rpm.engine.store.writers`
picks a control call (:func:`~dask_rpm.engine.tasks.run_write_rows`, through
``client.run``) naming the store, the iteration and its row ranges; every
writer copies those rows of its shard on its event loop and writes them in a
thread, all writers at once. The driver receives only each file's name,
size and checksum (never an array), writes the manifest when every writer
succeeded, and then removes the files of older or failed checkpoints. The
file format and the reasons for it are in :mod:`dask_rpm.engine.store`.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Mapping
from typing import Any, NamedTuple

from . import store
from .tasks import run_write_mark, run_write_rows

__all__ = ["StoredCheckpoint", "CheckpointFailed", "write_store", "check_shared"]


class CheckpointFailed(RuntimeError):
    """A checkpoint could not be completed (a writer failed or left); the previous one stays valid."""


class StoredCheckpoint(NamedTuple):
    """The recovery point kept in a store: the workers read their rows of it when a recovery needs it."""

    iteration: int
    directory: str

    def manifest(self) -> dict[str, Any]:
        """The store's manifest, checked to be this checkpoint's (the driver reads no row file)."""
        man = store.read_manifest(self.directory)
        if int(man["iteration"]) != self.iteration:
            raise store.StoreError(
                f"checkpoint store {self.directory!r} is at iteration {man['iteration']}, not at "
                f"{self.iteration} as this run wrote it: another run writes to the same directory; "
                f"give each run its own checkpoint_dir"
            )
        return man


async def write_store(driver: Any, directory: str, extra: Mapping[str, Any]) -> dict[str, Any]:
    """Write the checkpoint of ``driver.iteration`` into ``directory`` from the workers; returns the manifest.

    Raises :class:`CheckpointFailed` (nothing made valid, the previous
    manifest untouched) when a writer fails or leaves.
    """
    plan, iteration = driver.plan, driver.iteration
    jobs = store.writers(plan)
    calls = [
        driver.client.run(
            run_write_rows,
            driver.run,
            directory,
            iteration,
            ranges,
            workers=[driver.addresses[w]],
        )
        for w, ranges in jobs.items()
    ]
    # wait for every writer, also after one failed: no write of this checkpoint may still run
    # when the next one cleans up
    results = await asyncio.gather(*calls, return_exceptions=True)
    failed = [r for r in results if isinstance(r, BaseException)]
    if failed:
        raise CheckpointFailed(
            f"{len(failed)} of {len(calls)} writer(s) failed ({type(failed[0]).__name__}: {failed[0]})"
        )
    files = [
        store.RowFile(name, (int(a), int(b)), int(size), digest)
        for got in results
        for rows in got.values()  # type: ignore[union-attr]
        for name, (a, b), size, digest in rows
    ]

    def finish() -> dict[str, Any]:
        return store.commit(
            directory,
            iteration=iteration,
            shape=plan.shape,
            dtype=driver.dtype,
            files=files,
            slots=list(driver.recipe.optimizer.slots),
            extra=extra,
        )

    return await asyncio.get_running_loop().run_in_executor(None, finish)


async def check_shared(driver: Any, directory: str) -> None:
    """Refuse a checkpoint store the driver and the planned workers do not share, before training.

    Every planned worker writes a small file into ``directory``; the driver
    must see each with the text its writer put in it. A directory on each
    node's own disk (not a shared file system) would otherwise give
    manifests naming row files the driver, and a recovery on other workers,
    cannot read. Raises :class:`~dask_rpm.engine.store.StoreError`; the check's
    files are removed either way.
    """
    token = uuid.uuid4().hex[:8]
    workers = {w: driver.addresses[w] for w in driver.plan.planned_workers}
    marks = {f"{store.MARK}{token}-{w}": addr for w, addr in workers.items()}
    names = dict(zip(workers, marks))
    try:
        got = await asyncio.gather(
            *(
                driver.client.run(run_write_mark, directory, names[w], addr, workers=[addr])
                for w, addr in workers.items()
            ),
            return_exceptions=True,
        )
        failed = [(workers[w], r) for w, r in zip(workers, got) if isinstance(r, BaseException)]
        for addr, exc in failed:
            if not await _left(driver, addr):  # a worker that left: the next block recovers
                raise store.StoreError(
                    f"checkpoint_dir={directory!r}: worker {addr} cannot write there "
                    f"({type(exc).__name__}: {exc}); give a directory every worker can write"
                )
        written = {n: a for n, a in marks.items() if a not in {addr for addr, _ in failed}}
        unseen = store.unseen_marks(directory, written)
        if unseen:
            who = ", ".join(marks[n] for n in unseen)
            raise store.StoreError(
                f"checkpoint_dir={directory!r} is not shared: the driver does not see the files "
                f"worker(s) {who} wrote there (each has its own disk at that path); give a directory "
                f"on a file system the workers and the driver all mount (on SLURM, the shared one "
                f"the output goes to), or checkpoint through the driver (on_checkpoint=, or a "
                f"checkpoint.path ending in .nc in a job file)"
            )
    finally:
        for name in marks:
            try:
                os.unlink(os.path.join(directory, name))
            except OSError:
                pass


async def _left(driver: Any, address: str, grace: float = 2.0) -> bool:
    """Whether ``address`` left (waiting up to ``grace`` s for the scheduler to notice)."""
    deadline = time.monotonic() + grace
    while not await driver.leaving([address]):
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(0.1)
    return True
