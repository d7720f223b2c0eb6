"""A block's buddy-copy fields: the cluster as the driver sees it, put to the buddy book.

:class:`~dask_rpm.engine.buddies.BuddyBook` decides (purely) who keeps whose copy and how
often; this asks the scheduler for what it needs to decide, once per installed plan: the
hosts of the workers and the workers the plan leaves idle, which may keep copies.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .buddies import BuddyBook

if TYPE_CHECKING:
    from .driver import Driver

__all__ = ["copy_fields"]


async def copy_fields(driver: Driver, book: BuddyBook) -> dict[str, Any]:
    """The block's buddy-copy fields of :class:`~dask_rpm.engine.records.BlockSpec`: ``R``
    (``copy_every``), each worker's buddy (``buddies``), what the workers may drop
    (``keep_from``)."""
    if book.version != driver.version:
        info = await driver.client.scheduler.identity(n_workers=-1)
        hosts = {a: w.get("host", a) for a, w in info["workers"].items()}
        planned = driver._planned_addresses()
        spare = [
            a
            for i, a in enumerate(driver.addresses)
            if i not in driver.gone and a not in planned and a in hosts
        ]
        book.assign(planned, hosts, driver.version, spare)
    t = driver.log.median_iteration_time(max(driver.iteration - 20, 0), driver.iteration)
    every, buddies, keep = book.block(driver.addresses, t)  # (t: NaN before the first block)
    return {"copy_every": every, "buddies": buddies, "keep_from": keep}
