"""Checks and conversions of a planner's inputs: abilities, the network shape, counts.

Each raises :class:`~dask_rpm.plan.partition.PlanError` naming the value received, what is valid
and how to fix it.
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from ..plan.partition import PlanError

__all__ = [
    "check_count",
    "check_fraction",
    "normalise",
    "parse_shape",
    "parse_network_shape",
    "validate_abilities",
    "worker_label",
    "worker_names",
]


def worker_label(i: int) -> str:
    return f"P{i + 1}"


def validate_abilities(abilities: Iterable[Any]) -> np.ndarray:
    """Abilities as a float array, or :class:`PlanError` naming the first bad value.

    Valid abilities are one positive, finite number per worker (any scale; they
    are normalised to sum 1).
    """
    if isinstance(abilities, (str, bytes)) or isinstance(abilities, Mapping):
        raise PlanError(
            f"abilities must be a sequence of numbers, one per worker, got {type(abilities).__name__}"
        )
    try:
        items = list(abilities)
    except TypeError:
        raise PlanError(
            f"abilities must be a sequence of numbers, one per worker, got {abilities!r}"
        ) from None
    if not items:
        raise PlanError(
            "abilities is empty: give one positive number per worker, e.g. 0.05,0.10,0.20"
        )
    out = np.empty(len(items))
    for i, a in enumerate(items):
        where = f"ability #{i + 1} ({worker_label(i)})"
        if isinstance(a, (bool, np.bool_)):
            raise PlanError(
                f"{where} is {a!r}, not a number: abilities must be positive finite numbers"
            )
        if not isinstance(a, (numbers.Real, np.floating, np.integer)):
            try:
                a = float(a)  # numeric strings and 0-d arrays are fine
            except (TypeError, ValueError):
                raise PlanError(
                    f"{where} is {a!r}, not a number: abilities must be positive finite numbers"
                ) from None
        v = float(a)
        if math.isnan(v) or math.isinf(v):
            raise PlanError(f"{where} is {v}: abilities must be positive finite numbers")
        if v < 0:
            raise PlanError(
                f"{where} is {v}: abilities must be positive (relative speeds); give its speed "
                f"or drop the worker"
            )
        if v == 0:
            raise PlanError(
                f"{where} is 0: a worker with no ability cannot hold a rectangle; "
                f"drop it from the list or give it a positive speed"
            )
        out[i] = v
    if not np.isfinite(out.sum()):
        raise PlanError("abilities overflow when summed; rescale them (only their ratios matter)")
    return out


def parse_shape(shape: Any) -> tuple[int, int, int]:
    """Network shape ``(n, m, l)`` from a 3-sequence or a string ``"n-m-l"``.

    Raises :class:`PlanError` unless there are exactly three positive integers.
    """
    out = parse_network_shape(shape, layers=False)
    return out[0], out[1], out[2]


def parse_network_shape(shape: Any, *, layers: bool = True) -> tuple[int, ...]:
    """Network shape ``(n, m_1, ..., m_L, l)`` from a sequence or a string ``"n-m_1-...-l"``
    (with ``layers=False`` exactly one hidden layer: ``n-m-l``).

    Raises :class:`PlanError` unless there are at least (exactly) three positive integers.
    """
    hint = (
        "shape must be positive integers inputs-hidden-...-outputs, e.g. 203-80-26 or 784-512-256-10"
        if layers
        else "shape must be three positive integers n-m-l (inputs-hidden-outputs), e.g. 203-80-26"
    )
    if isinstance(shape, str):
        text = shape.strip()
        if "-" in text.lstrip("-"):
            parts = re.split(r"(?<=[^-])-", text)  # keeps a leading minus with its number
        else:
            parts = re.split(r"[x,]", text)
    else:
        try:
            parts = list(shape)
        except TypeError:
            raise PlanError(f"{hint}; got {shape!r}") from None
    if len(parts) < 3 or (not layers and len(parts) != 3):
        raise PlanError(f"{hint}; got {shape!r} ({len(parts)} values)")
    names = ["n", *(["m"] if len(parts) == 3 else [f"m{k}" for k in range(1, len(parts) - 1)]), "l"]
    out = []
    for name, v in zip(names, parts):
        try:
            if isinstance(v, bool):
                raise ValueError
            if isinstance(v, str):
                iv = int(v.strip())
            else:
                iv = int(v)
                if iv != v:
                    raise ValueError
        except (TypeError, ValueError):
            raise PlanError(f"{hint}; {name}={v!r} in {shape!r} is not an integer") from None
        if iv < 1:
            raise PlanError(f"{hint}; {name}={iv} in {shape!r} must be at least 1")
        out.append(iv)
    return tuple(out)


def check_count(name: str, value: Any, hint: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (numbers.Integral, np.integer)):
        try:
            if isinstance(value, str):
                value = int(value.strip())
            elif isinstance(value, float) and value.is_integer():
                value = int(value)
            else:
                raise ValueError
        except (TypeError, ValueError):
            raise PlanError(f"{name}={value!r} is not a whole number; {hint}") from None
    if int(value) < 1:
        raise PlanError(f"{name}={int(value)} must be at least 1; {hint}")
    return int(value)


def normalise(p: np.ndarray) -> np.ndarray:
    # fsum is exactly rounded, so the result does not depend on the workers' order.
    p = np.asarray(p, dtype=float)
    return p / math.fsum(p)


def worker_names(ws: Iterable[int]) -> str:
    return ", ".join(worker_label(w) for w in sorted(ws))


def check_fraction(name: str, v: Any) -> float:
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise PlanError(
            f"{name}={v!r} is not a number; give a fraction of m in [0, 1), e.g. 0.06"
        ) from None
    if not (math.isfinite(f) and 0 <= f < 1):
        raise PlanError(
            f"{name}={v!r} must be a fraction of m in [0, 1), e.g. 0.06 (0 disables snapping)"
        )
    return f
