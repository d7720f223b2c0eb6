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
import uuid
from collections.abc import Mapping
from typing import Any, NamedTuple

from . import store
from .tasks import run_file_digest, run_write_mark, run_write_rows

__all__ = ["StoredCheckpoint", "CheckpointFailed", "write_store", "check_shared", "check_readable"]


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
    got = await driver.run_each(
        {
            driver.addresses[w]: (run_write_rows, (driver.run, directory, iteration, ranges))
            for w, ranges in jobs.items()
        }
    )
    # Every writer has ended, or left (a retiring one may still finish its file: it is named for
    # this iteration, which no manifest will name, and a later clean-up removes it).
    results = list(got.values())
    failed = [r for r in results if isinstance(r, BaseException)]
    if failed:
        raise CheckpointFailed(
            f"{len(failed)} of {len(results)} writer(s) failed ({type(failed[0]).__name__}: {failed[0]})"
        )
    files = [
        store.RowFile(name, (int(a), int(b)), int(size), digest)
        for rows in results
        for name, (a, b), size, digest in rows
    ]

    def finish() -> dict[str, Any]:
        # The driver must see every file it is about to name (a worker that joined later may write
        # to its own disk at that path): else the manifest would make an unreadable checkpoint valid.
        unseen = store.unseen_files(directory, files)
        if unseen:
            raise CheckpointFailed(
                f"the driver does not see {len(unseen)} row file(s) the workers wrote into "
                f"{directory!r} (e.g. {unseen[0]!r}): not a file system every worker and the driver "
                f"share"
            )
        return store.commit(
            directory,
            iteration=iteration,
            shape=driver.layers.shape,
            dtype=driver.dtype,
            files=files,
            slots=list(driver.recipe.optimizer.slots),
            extra={**(extra or {}), **store.network_entry(driver.layers)},
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
        got = await driver.run_each(
            {addr: (run_write_mark, (directory, names[w], addr)) for w, addr in workers.items()}
        )
        failed = [(a, r) for a, r in got.items() if isinstance(r, BaseException)]
        for addr, exc in failed:
            if not await driver.left(addr):  # a worker that left: the next block recovers
                raise store.StoreError(
                    f"checkpoint_dir={directory!r}: worker {addr} cannot write there "
                    f"({type(exc).__name__}: {exc}): the directory is missing on its node (not a "
                    f"shared file system) or not writable; give a directory on a file system the "
                    f"workers and the driver all mount, writable by the workers"
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


async def check_readable(driver: Any, directory: str) -> None:
    """Refuse to resume from a store the planned workers do not see as the driver does.

    Every planned worker reads the store's ``manifest.json`` and returns its
    SHA-256, which must be the driver's: else the workers, which read their
    rows themselves, would fail on files they cannot see (or read another
    checkpoint). Nothing is written. Raises :class:`~dask_rpm.engine.store.StoreError`.
    """
    path = os.path.join(directory, store.MANIFEST)
    mine = store.file_digest(path)
    workers = [driver.addresses[w] for w in driver.plan.planned_workers]
    got = await driver.run_each({a: (run_file_digest, (path,)) for a in workers})
    differ = [
        a
        for a, r in got.items()
        if (isinstance(r, BaseException) and not await driver.left(a))
        or (not isinstance(r, BaseException) and r != mine)
    ]
    if differ:
        raise store.StoreError(
            f"resume={directory!r}: worker(s) {', '.join(differ)} do not see the checkpoint this "
            f"process reads there (its {store.MANIFEST} is missing or another on their nodes): "
            f"the workers read their rows themselves, so the store must be on a file system the "
            f"workers and the driver all mount; or pass resume=dask_rpm.engine.store.load(path) "
            f"to hand the weights out from here"
        )
