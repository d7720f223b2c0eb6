"""The training options: one typed, frozen record of what :func:`dask_rpm.fit` and
:func:`dask_rpm.fit_serial` compute.

Pure. :class:`TrainingOptions` is built once, wherever a user gives options -
the keywords of ``fit`` / ``fit_serial`` (one to one), a job file
(:mod:`dask_rpm.job`), the estimators, ``dask-rpm train`` - and travels
as it is to :func:`dask_rpm.nn.prepare.prepare`, which resolves ``None`` from
``rpm.train.*`` and validates everything before any work starts. Where a
run's options go from there: docs/architecture.md, "One option, user to worker".
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass
from typing import Any

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

    def as_dict(self) -> dict[str, Any]:
        """The options as keywords (``fit(**options.as_dict())``)."""
        return {f: getattr(self, f) for f in TRAINING_FIELDS}


#: The field names of :class:`TrainingOptions`, in order: the training keywords of ``fit``.
TRAINING_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(TrainingOptions))
