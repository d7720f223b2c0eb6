"""Silence for the notices distributed logs while a cluster this process owns is closing.

When a cluster shuts down, the scheduler (it runs in the process that owns the
cluster) can still be writing a batched message to a worker or client whose
connection has just closed; distributed then logs "Batched Comm Closed" with a
``CommClosedError`` traceback at INFO level, on the stderr of whoever closed
the cluster. Nothing is wrong. :class:`ClosingNoise` drops exactly that record,
and only once its cluster is closing or closed; while the cluster runs, every
record is kept. A leaf (no dask_rpm imports): both cluster classes use it.
"""

from __future__ import annotations

import logging
from typing import Any

__all__ = ["ClosingNoise", "quiet_when_closing"]


class ClosingNoise(logging.Filter):
    """Drop "Batched Comm Closed" records once ``cluster`` is closing (module docstring)."""

    def __init__(self, cluster: Any) -> None:
        super().__init__()
        self.cluster = cluster

    def filter(self, record: logging.LogRecord) -> bool:
        status = str(getattr(getattr(self.cluster, "status", None), "name", ""))
        if status not in ("closing", "closing_gracefully", "closed"):
            return True
        return not str(record.msg).startswith("Batched Comm Closed")


def quiet_when_closing(cluster: Any) -> ClosingNoise:
    """Attach a :class:`ClosingNoise` for ``cluster`` to distributed's batched-send logger."""
    noise = ClosingNoise(cluster)
    logging.getLogger("distributed.batched").addFilter(noise)
    return noise
