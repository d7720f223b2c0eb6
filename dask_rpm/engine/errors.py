"""Exceptions of the training engine (pure: no ``distributed``)."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["TrainingError", "WorkerLostError"]


class TrainingError(RuntimeError):
    """Training cannot go on (e.g. divergence, a failed task, a peer that does not answer)."""


class WorkerLostError(TrainingError):
    """A worker holding a weight shard left the cluster during training."""

    def __init__(self, workers: Sequence[str], iteration: int) -> None:
        self.workers = list(workers)
        self.iteration = iteration
        super().__init__(
            f"worker(s) {', '.join(self.workers)} left the cluster during iteration {iteration}; "
            f"their weight shards are gone from this run"
        )
