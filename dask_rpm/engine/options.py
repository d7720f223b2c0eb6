"""What :func:`~dask_rpm.engine.fit` was asked: its options after ``rpm.*`` defaults, and where it starts."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from .. import config
from ..drpm.policy import first_interval
from ..nn.backend import check_names
from ..nn.data import DataError
from ..nn.prepare import Prepared
from ..plan.partition import Plan, PlanError
from ..planners import describe_names, mapping_names
from ..runtime.threads import threads_setting
from .checkpoint import StoredCheckpoint
from .records import Checkpoint
from .store import open_resume

logger = logging.getLogger("dask_rpm")


__all__ = [
    "RunKeywords",
    "RUN_FIELDS",
    "Options",
    "resolve_options",
    "resume_state",
    "start_checkpoint",
]


@dataclass
class Options:
    """``fit``'s keywords after defaults (``rpm.*`` config) and validation."""

    iterations: int
    learning_rate: float
    dtype: str
    mapping: Any
    interval: int
    auto_interval: bool
    on_worker_loss: str
    min_workers: int
    elastic: bool
    checkpoint_every: int
    target_error: float | None
    #: the checkpoint store the workers write (absolute, created), or None: checkpoints via the driver
    checkpoint_dir: str | None = None
    #: BLAS/OpenMP threads of each worker's kernels (rpm.engine.threads); 0: each worker's nthreads
    threads: int = 0
    #: the kernels' (backend, device) names (rpm.engine.backend / device); each worker resolves auto
    placement: tuple[str, str] = ("numpy", "auto")


@dataclass(frozen=True, eq=False)
class RunKeywords:
    """``fit``'s keywords about how and where a run goes (not what it computes), as given;
    :func:`resolve_options` turns them into :class:`Options`."""

    mapping: Any = None
    abilities: Any = None
    interval: Any = None
    progress: Any = None
    on_worker_loss: str | None = None
    min_workers: int | None = None
    elastic: bool | None = None
    checkpoint_every: int | None = None
    checkpoint_dir: Any = None
    on_checkpoint: Any = None
    should_stop: Any = None
    callback: Any = None
    callbacks: Any = None
    resume: Any = None
    backend: str | None = None
    device: str | None = None


#: The field names of :class:`RunKeywords`: fit's keywords besides the training options.
RUN_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(RunKeywords))


def resolve_options(kw: RunKeywords, job: Prepared) -> Options:
    mapping = config.get("train.mapping", kw.mapping)
    if not isinstance(mapping, Plan) and str(mapping).strip().lower() not in mapping_names():
        raise PlanError(
            f"mapping={mapping!r} is not known; valid: {describe_names(mapping_names())}, or a Plan"
        )
    try:  # with R="auto" the first check comes after one estimation window
        interval, auto = first_interval(kw.interval)
    except ValueError as exc:
        raise DataError(str(exc)) from None
    on_loss = config.get("train.on-worker-loss", kw.on_worker_loss)
    if on_loss not in ("recover", "raise"):
        raise DataError(
            f"on_worker_loss={on_loss!r}; use 'recover' (go on without the worker) or 'raise'"
        )
    min_workers = config.get("train.min-workers", kw.min_workers)
    if (
        isinstance(min_workers, bool)
        or not isinstance(min_workers, (int, np.integer))
        or min_workers < 1
    ):
        raise DataError(f"min_workers={min_workers!r}; it must be a positive integer")
    every = config.get("checkpoint.every", kw.checkpoint_every)
    if isinstance(every, bool) or not isinstance(every, (int, np.integer)) or every < 0:
        raise DataError(
            f"checkpoint_every={every!r}; it must be an integer >= 0 (0: no checkpoints)"
        )
    try:
        threads = threads_setting()
    except ValueError as exc:
        raise DataError(str(exc)) from None
    directory = config.get("checkpoint.dir", kw.checkpoint_dir)
    if directory is not None and not every:
        raise DataError(
            f"checkpoint_dir={os.fspath(directory)!r} but checkpoint_every={every!r}: no checkpoint would be "
            f"written; set checkpoint_every to the iterations between checkpoints (e.g. 50)"
        )
    placement = check_names(
        config.get("engine.backend", kw.backend), config.get("engine.device", kw.device)
    )
    return Options(
        iterations=job.recipe.iterations,
        learning_rate=job.recipe.learning_rate,
        dtype=job.dtype,
        mapping=mapping,
        interval=interval,
        auto_interval=auto,
        on_worker_loss=on_loss,
        min_workers=int(min_workers),
        elastic=bool(config.get("train.elastic", kw.elastic)) and not isinstance(mapping, Plan),
        checkpoint_every=int(every),
        target_error=job.target_error,
        checkpoint_dir=None if directory is None else os.fspath(directory),
        threads=threads,
        placement=placement,
    )


def resume_state(resume: Any, data: Prepared) -> dict[str, Any] | None:
    """``fit``'s ``resume=`` as a checkpoint dict: of a store directory only the manifest is read
    (its network shape checked first; :func:`~dask_rpm.engine.store.describe`'s keys, no weights);
    a dict or None is returned as it is."""
    if isinstance(resume, (str, os.PathLike)):
        return open_resume(resume, data.layers.shape)
    return resume


def start_checkpoint(
    resume: Any, data: Prepared, stored: bool = False
) -> Checkpoint | StoredCheckpoint:
    """Where training starts: iteration 0 with the initial weights, or a checkpoint to resume from.

    ``stored``: ``resume`` is :func:`resume_state`'s summary of a store directory
    (its shape checked), and the start a
    :class:`~dask_rpm.engine.checkpoint.StoredCheckpoint` the workers read.
    """
    if resume is None:
        return Checkpoint(0, data.params0)
    if not isinstance(resume, dict) or not (
        stored or "iteration" in resume and ("params" in resume or {"W", "V"} <= set(resume))
    ):
        raise DataError(
            f"resume={type(resume).__name__}; it must be a checkpoint store directory (the "
            "checkpoint_dir a run wrote) or a checkpoint dict with 'iteration' and 'params' (or "
            "'W', 'V'; and 'optimizer_state'), as fit's on_checkpoint receives it"
        )
    k = resume["iteration"]
    if (
        isinstance(k, bool)
        or not isinstance(k, (int, np.integer))
        or not 0 <= k < data.recipe.iterations
    ):
        raise DataError(
            f"resume: the checkpoint is at iteration {k!r}; it must be below iterations="
            f"{data.recipe.iterations} (the total to reach)"
        )
    if stored:
        _check_slots(resume["optimizer_slots"], data)
        return StoredCheckpoint(int(k), resume["directory"])
    given = resume.get("params") or (resume["W"], resume["V"])
    params = tuple(np.asarray(p, dtype=data.dtype) for p in given)
    have, need = [p.shape for p in params], [p.shape for p in data.params0]
    if have != need:
        raise DataError(
            f"resume: the checkpoint's weights have shapes {have}; this network needs {need} "
            f"(same data, hidden units and bias)"
        )
    state = resume.get("optimizer_state") or None
    _check_slots(state or (), data)
    return Checkpoint(
        int(k),
        params,
        {k2: [np.asarray(a, dtype=data.dtype) for a in v] for k2, v in state.items()}
        if state
        else None,
    )


def _check_slots(have: Any, data: Prepared) -> None:
    """The checkpoint's optimizer state slots must be the optimizer's (none: it starts at zero)."""
    have, slots = set(have), set(data.recipe.optimizer.slots)
    if (not have and slots) or (have and have != slots):
        raise DataError(
            f"resume: the checkpoint has optimizer state {sorted(have)}; optimizer "
            f"{data.recipe.optimizer.name!r} needs {sorted(slots)} (resume with the optimizer it was "
            f"written with)"
        )
