"""What :func:`~dask_rpm.engine.fit` was asked about how and where a run goes: its run options,
resolved once on the client (``rpm.*`` defaults, names normalised), and where it starts."""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import config
from ..drpm.policy import first_interval
from ..drpm.settings import DRPMSettings
from ..nn.backend import Placement
from ..nn.data import DataError
from ..nn.prepare import Prepared
from ..plan.partition import Plan, PlanError
from ..planners import describe_names, mapping_names
from ..runtime.threads import threads_setting
from .buddies import ResilienceSettings
from .checkpoint import StoredCheckpoint
from .records import Checkpoint
from .store import open_resume

logger = logging.getLogger("dask_rpm")


__all__ = [
    "EngineSettings",
    "RunOptions",
    "resume_state",
    "start_checkpoint",
]


@dataclass(frozen=True)
class EngineSettings:
    """The ``rpm.engine`` / ``rpm.train`` / ``rpm.slurm`` settings a run's driver and workers
    follow while it goes (not what it computes), read once when the run starts."""

    #: seconds a worker waits for a peer's message; None: auto (from the iterations seen)
    receive_timeout: float | None = None
    receive_timeout_min: float = 60.0
    report_seconds: float = 0.2
    poll_seconds: float = 0.25
    wait_workers: float = 600.0
    retire_margin: float = 30.0
    replace_lost: bool = True
    replace_check: float = 30.0
    #: the largest kernels (flop equivalents per iteration) a worker runs on its event loop, on a
    #: CPU, on a GPU and on an EMULATED (paced) worker; these travel to the workers in the run spec
    inline_work: float = 3e8
    inline_work_gpu: float = 1e11
    inline_work_emulated: float = 2e7

    @classmethod
    def of(
        cls, engine: Mapping[str, Any], train: Mapping[str, Any], slurm: Mapping[str, Any]
    ) -> EngineSettings:
        """From the ``rpm.engine``, ``rpm.train`` and ``rpm.slurm`` sections
        (:func:`dask_rpm.config.section`), read once by :meth:`RunOptions.resolved`."""
        timeout = engine["receive_timeout"]
        return cls(
            receive_timeout=None if timeout == "auto" else float(timeout),
            receive_timeout_min=float(engine["receive_timeout_min"]),
            report_seconds=float(engine["report_seconds"]),
            poll_seconds=float(engine["poll_seconds"]),
            wait_workers=float(train["wait_workers"]),
            retire_margin=float(train["retire_margin"]),
            replace_lost=bool(slurm["replace_lost"]),
            replace_check=float(slurm["replace_check"]),
            inline_work=float(engine["inline_work"]),
            inline_work_gpu=float(engine["inline_work_gpu"]),
            inline_work_emulated=float(engine["inline_work_emulated"]),
        )


@dataclass(frozen=True, eq=False)
class RunOptions:
    """``fit``'s keywords about how and where a run goes (not what it computes).

    As given, a field left ``None`` means its ``rpm.*`` default; :meth:`resolved` returns the
    record with every default read (once), every value checked and the names normalised, which
    is what the engine runs on.
    """

    mapping: Any = None
    abilities: Any = None
    interval: Any = None
    progress: Any = None
    on_worker_loss: Any = None
    min_workers: Any = None
    elastic: Any = None
    checkpoint_every: Any = None
    checkpoint_dir: Any = None
    on_checkpoint: Any = None
    should_stop: Any = None
    callback: Any = None
    callbacks: Any = None
    resume: Any = None
    backend: str | None = None
    device: str | None = None
    #: set by :meth:`resolved`: R="auto" (DRPM adapts the interval)
    auto_interval: bool = False
    #: set by :meth:`resolved`: BLAS/OpenMP threads of each worker's kernels (0: its nthreads)
    threads: int = 0
    #: set by :meth:`resolved`: the (backend, device) names; each worker resolves ``auto``
    placement: Placement = Placement()
    #: set by :meth:`resolved`
    engine: EngineSettings = EngineSettings()
    #: set by :meth:`resolved`: ``rpm.drpm.*``, read once for the run (interval, DRPM's checks,
    #: the idle choice of the first plan)
    drpm: DRPMSettings | None = None
    #: set by :meth:`resolved`: ``rpm.resilience.*`` (buddy copies)
    resilience: ResilienceSettings = ResilienceSettings()

    def resolved(self) -> RunOptions:
        """These options with the ``rpm.*`` defaults read once and every value checked.

        Raises :class:`~dask_rpm.plan.partition.PlanError` for an unknown mapping and
        :class:`~dask_rpm.nn.data.DataError` for any other bad value.
        """
        # every section once: the settings below are all built from these
        train, ckpt, engine = (
            config.section("train"),
            config.section("checkpoint"),
            config.section("engine"),
        )
        mapping = _mapping(train["mapping"] if self.mapping is None else self.mapping)
        drpm = DRPMSettings.from_config()
        try:  # with R="auto" the first check comes after one estimation window
            interval, auto = first_interval(self.interval, settings=drpm)
        except ValueError as exc:
            raise DataError(str(exc)) from None
        on_loss = train["on_worker_loss"] if self.on_worker_loss is None else self.on_worker_loss
        if on_loss not in ("recover", "raise"):
            raise DataError(
                f"on_worker_loss={on_loss!r}; use 'recover' (go on without the worker) or 'raise'"
            )
        min_workers = train["min_workers"] if self.min_workers is None else self.min_workers
        if not _whole(min_workers) or min_workers < 1:
            raise DataError(f"min_workers={min_workers!r}; it must be a positive integer")
        every = ckpt["every"] if self.checkpoint_every is None else self.checkpoint_every
        if not _whole(every) or every < 0:
            raise DataError(
                f"checkpoint_every={every!r}; it must be an integer >= 0 (0: no checkpoints)"
            )
        directory = ckpt["dir"] if self.checkpoint_dir is None else self.checkpoint_dir
        if directory is not None and not every:
            raise DataError(
                f"checkpoint_dir={os.fspath(directory)!r} but checkpoint_every={every!r}: no "
                f"checkpoint would be written; set checkpoint_every to the iterations between "
                f"checkpoints (e.g. 50)"
            )
        try:
            threads = threads_setting(engine["threads"])
        except ValueError as exc:
            raise DataError(str(exc)) from None
        elastic = train["elastic"] if self.elastic is None else self.elastic
        return dataclasses.replace(
            self,
            mapping=mapping,
            interval=interval,
            auto_interval=auto,
            on_worker_loss=on_loss,
            min_workers=int(min_workers),
            elastic=bool(elastic) and not isinstance(mapping, Plan),
            checkpoint_every=int(every),
            checkpoint_dir=None if directory is None else os.fspath(directory),
            threads=threads,
            placement=Placement.of(self.backend, self.device, engine),
            engine=EngineSettings.of(engine, train, config.section("slurm")),
            drpm=drpm,
            resilience=ResilienceSettings.of(config.section("resilience")),
        )


def _whole(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, np.integer))


def _mapping(mapping: Any) -> str | Plan:
    """A mapping name normalised (``"DRPM "`` is ``"drpm"``), or the Plan given."""
    if isinstance(mapping, Plan):
        return mapping
    name = str(mapping).strip().lower()
    if name not in mapping_names():
        raise PlanError(
            f"mapping={mapping!r} is not known; valid: {describe_names(mapping_names())}, or a Plan"
        )
    return name


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
    if not isinstance(resume, dict):
        raise DataError(
            f"resume={type(resume).__name__}; it must be a checkpoint store directory (the "
            "checkpoint_dir a run wrote) or a checkpoint dict with 'iteration', 'params' and "
            "'optimizer_state', as fit's on_checkpoint receives it"
        )
    if not stored and not {"iteration", "params"} <= set(resume):
        # the keys found name the culprit, e.g. an earlier development build's first and last
        # layers under keys of their own instead of the one list
        raise DataError(
            f"resume: the checkpoint dict has keys {sorted(map(str, resume))}; it needs "
            "'iteration' and 'params' (the list W_1 .. W_L, V; 'optimizer_state' too when the "
            "optimizer has state), as fit's on_checkpoint gives it: take a new checkpoint, or "
            "put the weights under 'params'"
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
    params = tuple(np.asarray(p, dtype=data.dtype) for p in resume["params"])
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
