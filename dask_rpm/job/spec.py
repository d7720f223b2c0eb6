"""What a job file is: its keys, the validated :class:`Job`, and the error it raises.

The checks of single values (:func:`whole`, :func:`number`) and the error
builders (:func:`bad`, :func:`unknown`) are shared by the loader and the
runner; every message names the key, the value received, what is valid and
how to fix it.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import dask.config

from .. import config as rpm_config
from ..engine.options import RunOptions
from ..nn.backend import BackendError, check_names
from ..nn.options import TrainingOptions

__all__ = [
    "Job",
    "JobError",
    "TRAINING_KEYS",
    "KEYS",
    "TRAIN_SETTINGS",
    "OVERWRITE_HINT",
    "bad",
    "unknown",
    "whole",
    "number",
    "flatten",
]

#: Job keys that choose what is trained, and fit()'s keyword for each (validated by dask_rpm.nn.recipe).
TRAINING_KEYS = {
    "epochs": "epochs",
    "batch-size": "batch_size",
    "shuffle": "shuffle",
    "activation": "activation",
    "loss": "loss",
    "output-layer": "output",
    "bias": "bias",
    "optimizer": "optimizer",
    "validation": "validation",
    "validate-every": "validate_every",
    "early-stopping": "early_stopping",
    "tol": "tol",
    "alpha": "alpha",
    "reduction": "reduction",
}

#: Job keys whose default is the ``rpm.train.*`` setting of the same name, by
#: :class:`Job` attribute. A job file that leaves one out passes ``None`` to
#: ``fit``, which reads the setting at call time (so the job's ``config:``
#: section, ``dask.config.set`` and ``DASK_RPM__TRAIN__...`` all apply).
TRAIN_SETTINGS = {
    "mapping": "mapping",
    "seed": "seed",
    "dtype": "dtype",
    "min_workers": "min-workers",
    "on_worker_loss": "on-worker-loss",
}

#: Every key a job file may have.
KEYS = (
    "data",
    "hidden",
    "network",
    "iterations",
    "target-error",
    "learning-rate",
    "mapping",
    "seed",
    "dtype",
    "output",
    "overwrite",
    "checkpoint",
    "min-workers",
    "on-worker-loss",
    "time-limit",
    "workers",
    "config",
    "model",
    "backend",
    "device",
    *TRAINING_KEYS,
)
OVERWRITE_HINT = "set overwrite: true in the job file (or pass --overwrite) to replace it"


class JobError(ValueError):
    """The job file is invalid; the message says which key, what was received and how to fix it."""


def flatten(d: Mapping[str, Any], prefix: str) -> Iterator[tuple[str, Any]]:
    """Dotted keys of a nested mapping (``{"drpm": {"interval": 10}}`` -> ``rpm.drpm.interval``)."""
    for k, v in d.items():
        if isinstance(v, Mapping) and v:
            yield from flatten(v, f"{prefix}.{k}")
        else:
            yield f"{prefix}.{k}", v


@dataclass
class Job:
    """A validated training job (see :mod:`dask_rpm.job` for the file format).

    It holds the records :func:`dask_rpm.fit` takes: ``training`` (what is trained: the
    network, the learning, the length; ``iterations`` always set, ``epochs`` turned into
    iterations) and ``run`` (how it runs: mapping, workers, backend and device). Fields the
    file does not set are ``None``: ``fit`` then reads ``rpm.*``; :meth:`effective` says which
    value that is for :data:`TRAIN_SETTINGS`.
    """

    path: str
    text: str
    data: str
    training: TrainingOptions
    output: str
    checkpoint_path: str
    checkpoint_every: int = 0
    #: how the run goes: mapping, min_workers, on_worker_loss, backend, device (where, not
    #: what: a checkpoint resumes on any backend, so they are not part of the fingerprint)
    run: RunOptions = field(default_factory=RunOptions)
    time_limit: float | None = None
    workers: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    shape: tuple[int, int, int] = (0, 0, 0)  # (s, n, l) of the data (n: an image's values)
    overwrite: bool = False
    model: str | None = None  # where the trained model goes (None: not written)
    #: a CNN's geometry (``network:``; :class:`~dask_rpm.nn.cnn.ConvLayers` on the data's
    #: images), None for an MLP (``hidden:``)
    conv: Any = None
    #: ``data`` is a zarr store: the names of its inputs and targets variables (``data: {zarr:
    #: PATH, x: VAR, d: VAR}``); None: a netCDF file with ``x`` and ``d``
    data_vars: tuple[str, str] | None = None

    def settings(self) -> dict[str, Any]:
        """The job's ``config:`` section as dotted ``rpm.*`` keys for ``dask.config.set``.

        Dotted keys, because setting ``{"rpm": {...}}`` would replace the
        whole ``rpm`` tree.
        """
        return dict(flatten(self.config, "rpm"))

    def effective(self, name: str) -> Any:
        """The value ``fit`` will use for ``name`` (a key of :data:`TRAIN_SETTINGS`).

        The job file's own value, else ``rpm.train.<key>`` as the job's
        ``config:`` section and the dask configuration in force now set it.
        """
        value = getattr(self.run if hasattr(self.run, name) else self.training, name)
        if value is not None:
            return value
        with dask.config.set(self.settings()):
            return rpm_config.get(f"train.{TRAIN_SETTINGS[name]}")

    @property
    def fingerprint(self) -> str:
        """What a checkpoint must match to be resumed by this job (data, network, learning)."""
        t = self.training
        given = {
            kw: v
            for kw in TRAINING_KEYS.values()
            if kw != "epochs" and (v := getattr(t, kw)) is not None
        }
        key = json.dumps(
            [
                os.path.abspath(self.data),
                list(self.shape),
                t.hidden,
                *([self.conv.spec(), list(self.conv.image)] if self.conv is not None else []),
                t.learning_rate,
                self.effective("seed"),
                self.effective("dtype"),
                *([sorted(given.items())] if given else []),
                *([list(self.data_vars)] if self.data_vars is not None else []),
            ],
        )
        return hashlib.sha256(key.encode()).hexdigest()[:16]

    @property
    def checkpoint_store(self) -> bool:
        """Whether checkpoints go to a store the workers write (the default, or a ``checkpoint.path``
        without ``.nc``) rather than to one netCDF file the driver writes."""
        return not self.checkpoint_path.endswith(".nc")

    @property
    def network(self) -> str:
        """``n-m-l`` of the network this job trains (``n-m_1-...-m_L-l`` for several hidden layers);
        a CNN's image and each stage's channels (units), e.g. ``1x8x8-conv4-linear16-10``."""
        if self.conv is not None:
            stages = (f"{st.kind}{st.channels}" for st in self.conv.stages)
            return "-".join(["x".join(map(str, self.conv.image)), *stages, str(self.conv.l)])
        hidden = self.training.hidden
        widths = hidden if isinstance(hidden, tuple) else (hidden,)
        return "-".join(str(v) for v in (self.shape[1], *widths, self.shape[2]))

    @property
    def expected_workers(self) -> int | None:
        """Workers the job starts (None for an existing scheduler)."""
        if "local" in self.workers:
            return len(self.workers["local"]["speeds"])
        if "slurm" in self.workers:
            return sum(g.jobs * g.processes for g in self.workers["slurm"]["groups"])
        return None


def placement(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The job's ``backend:`` and ``device:`` (those it sets), checked as names
    (:func:`dask_rpm.nn.backend.check_names`; each worker resolves ``auto``)."""
    given = {k: raw[k] for k in ("backend", "device") if raw.get(k) is not None}
    try:
        check_names(given.get("backend", "numpy"), given.get("device", "auto"))
    except BackendError as exc:
        raise JobError(f"job file: {exc}") from None
    return given


def bad(key: str, got: Any, valid: str, fix: str) -> JobError:
    """The error for ``key`` holding ``got``: what is valid and how to fix it."""
    return JobError(f"job file: {key}={got!r} is invalid; {valid}. {fix}")


def unknown(keys: Any, valid: tuple[str, ...], where: str) -> None:
    """Refuse the first of ``keys`` that is not in ``valid`` (with a "did you mean")."""
    for k in keys:
        if k not in valid:
            close = difflib.get_close_matches(str(k), valid, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise JobError(
                f"job file: unknown key {k!r} in {where}; valid keys: {', '.join(valid)}.{hint}"
            )


def whole(raw: Mapping[str, Any], key: str, lo: int, default: Any = None, where: str = "") -> Any:
    """``raw[key]`` as a whole number ``>= lo`` (``default`` when absent; ``None`` if that is None)."""
    v = raw.get(key, default)
    if v is None and default is None and key not in raw:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise bad(
            where + key,
            v,
            f"expected a whole number >= {lo}",
            f"Write e.g. {key}: {max(lo, 1) * 10 if lo else 0}.",
        )
    return v


def number(
    raw: Mapping[str, Any], key: str, *, positive: bool, example: str = "0.01"
) -> float | None:
    """``raw[key]`` as a finite number (``> 0`` or ``>= 0``), or ``None`` when absent."""
    v = raw.get(key)
    if v is None:
        return None
    ok = (
        isinstance(v, (int, float))
        and not isinstance(v, bool)
        and math.isfinite(v)
        and (v > 0 if positive else v >= 0)
    )
    if not ok:
        raise bad(
            key,
            v,
            f"expected a finite number {'> 0' if positive else '>= 0'}",
            f"Write e.g. {key}: {example}.",
        )
    return float(v)
