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
from collections.abc import Mapping
from typing import Any, NamedTuple

from . import store
from .tasks import run_write_rows

__all__ = ["StoredCheckpoint", "CheckpointFailed", "write_store"]


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
