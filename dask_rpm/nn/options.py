"""The training options: one typed, frozen record of what :func:`dask_rpm.fit` and
:func:`dask_rpm.fit_serial` compute.

Pure. :class:`TrainingOptions` is built once, wherever a user gives options -
the keywords of ``fit`` / ``fit_serial`` (one to one), a job file
(:mod:`dask_rpm.job`), the estimators, ``dask-rpm train`` - and travels
as it is to :func:`dask_rpm.nn.prepare.prepare`, which resolves ``None`` from
``rpm.train.*`` (:meth:`TrainingOptions.resolved`, the one place they are read) and validates
everything before any work starts. Where a
run's options go from there: docs/architecture.md, "One option, user to worker".
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .. import config

__all__ = ["TrainingOptions", "TRAINING_FIELDS"]


@dataclass(frozen=True, eq=False)
class TrainingOptions:
    """What is trained (not where): the network, the optimizer, the mini-batches, the stopping.

    Every field defaults to ``None``: the ``rpm.train.*`` setting of the same
    name, read when training starts. The meaning of each is in :func:`dask_rpm.fit`.
    """

    hidden: int | tuple[int, ...] | None = None
    iterations: int | None = None
    epochs: int | None = None
    learning_rate: float | None = None
    init: Any = None
    seed: int | None = None
    dtype: str | None = None
    batch_size: int | None = None
    shuffle: Any = None
    activation: str | None = None
    loss: str | None = None
    output: str | None = None
    bias: bool | None = None
    optimizer: Any = None
    alpha: float | None = None
    reduction: str | None = None
    validation: Any = None
    validate_every: int | None = None
    early_stopping: int | None = None
    tol: float | None = None
    target_error: float | None = None
    network: Any = None
    sample_weight: Any = None

    @classmethod
    def of(cls, options: TrainingOptions | None = None, **keywords: Any) -> TrainingOptions:
        """``options`` (default: all ``None``) with the keywords that are not ``None`` set.

        A keyword given here and set differently in ``options`` is an error: one
        option, one value. An unknown keyword names the closest valid one.
        """
        if options is not None and not isinstance(options, TrainingOptions):
            raise TypeError(
                f"options={type(options).__name__}; give a dask_rpm.TrainingOptions (or keywords)"
            )
        base = options or cls()
        unknown = sorted(set(keywords) - set(TRAINING_FIELDS))
        if unknown:
            near = difflib.get_close_matches(unknown[0], TRAINING_FIELDS, n=1)
            hint = f"; did you mean {near[0]!r}?" if near else ""
            raise TypeError(f"unknown training option(s) {unknown}{hint}")
        given = {k: v for k, v in keywords.items() if v is not None}
        clash = [
            k
            for k, v in given.items()
            if getattr(base, k) is not None and getattr(base, k) is not v
        ]
        if clash:
            raise TypeError(
                f"{', '.join(clash)} given both in options= and as keyword(s); give each once"
            )
        return dataclasses.replace(base, **given)

    def resolved(self) -> TrainingOptions:
        """These options with every field left ``None`` set from its ``rpm.train.*`` default,
        read once: what a run trains with.

        ``epochs`` and ``iterations`` are alternatives: with neither given, ``rpm.train.epochs``
        (when set) else ``rpm.train.iterations``; ``early_stopping``'s default applies only with
        a ``validation`` set; a named optimizer takes ``rpm.train.optimizer-parameters`` for the
        parameters it does not set. Resolving twice changes nothing.
        """
        train = config.section("train")
        fill = {
            f: train[f]
            for f in _FROM_CONFIG
            if getattr(self, f) is None and train.get(f) is not None
        }
        if self.iterations is None and self.epochs is None:
            fill.pop("iterations", None)
            if train["epochs"] is None:
                fill["iterations"] = train["iterations"]
        else:
            fill.pop("epochs", None)
            fill.pop("iterations", None)
        if self.validation is None:
            fill.pop("early_stopping", None)
        spec = fill.get("optimizer", self.optimizer)
        if isinstance(spec, (str, Mapping)):
            named = {"name": spec} if isinstance(spec, str) else dict(spec)
            fill["optimizer"] = {**(train["optimizer_parameters"] or {}), **named}
        return dataclasses.replace(self, **fill)

    def as_dict(self) -> dict[str, Any]:
        """The options as keywords (``fit(**options.as_dict())``)."""
        return {f: getattr(self, f) for f in TRAINING_FIELDS}


#: The field names of :class:`TrainingOptions`, in order: the training keywords of ``fit``.
TRAINING_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(TrainingOptions))

#: The fields whose default is the ``rpm.train`` setting of the same name.
_FROM_CONFIG = tuple(
    f
    for f in TRAINING_FIELDS
    if f not in ("hidden", "init", "validation", "target_error", "network", "sample_weight")
)
