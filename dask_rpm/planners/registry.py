"""The planner registry: one small interface, a strict table of names.

A planner is a plain function with the signature of :class:`Planner`; it is found by name
(case-insensitive) through :func:`get_planner`. :func:`register_planner` refuses a name that
is already taken unless ``replace=True``, so a typo or a second import cannot silently swap
the planner a run uses. Every list of mapping names shown to users is derived from this
table (:func:`mapping_names`, :func:`describe_names`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from ..plan.partition import PlanError, RealPartition

__all__ = [
    "DYNAMIC_MAPPING",
    "PLANNERS",
    "Planner",
    "PlannerResult",
    "describe_names",
    "get_planner",
    "mapping_names",
    "planner_aliases",
    "register_planner",
]


@dataclass(frozen=True)
class PlannerResult:
    """What a planner returns.

    Attributes
    ----------
    partition : RealPartition
        Worker indices refer to positions in the abilities given to the planner.
    t_comm : float
        The paper's communication model of this partition (elements).
    t_comm_by_columns : tuple of float
        ``t_comm(C)`` for C = 1..N where the planner computes it (SRPM), else empty.
    method : str
        Canonical planner name recorded in the plan.
    notes : tuple of str
        Human-readable remarks copied into ``Plan.notes``.
    meta : dict
        Anything else worth keeping (for example the chosen ``dp``).
    """

    partition: RealPartition
    t_comm: float
    t_comm_by_columns: tuple[float, ...] = ()
    method: str = ""
    notes: tuple[str, ...] = ()
    meta: dict[str, Any] = field(default_factory=dict)


class Planner(Protocol):
    """Signature every registered planner follows."""

    def __call__(
        self,
        abilities: np.ndarray,
        shape: tuple[int, int, int],
        samples: int,
        *,
        dp: int | None = None,
    ) -> PlannerResult: ...


PLANNERS: dict[str, Planner] = {}


def register_planner(name: str, fn: Planner, *, replace: bool = False) -> Planner:
    """Register ``fn`` under ``name`` (case-insensitive).

    Parameters
    ----------
    name
        The planner's name, as ``make_plan(method=...)``, ``fit(mapping=...)``, job files and
        the CLI will accept it.
    fn
        A function with the :class:`Planner` signature.
    replace
        Replace a planner already registered under ``name``. Without it a taken name is an
        error (registering the very same function again is allowed: a re-run cell or import).

    Returns
    -------
    Planner
        ``fn``, so this can be used as a plain call or inside a decorator.

    Raises
    ------
    PlanError
        The name is empty, taken (and ``replace`` is false) or reserved (``drpm``), or ``fn``
        is not callable.
    """
    if not isinstance(name, str) or not name.strip():
        raise PlanError(f"planner name must be a non-empty string, got {name!r}")
    if not callable(fn):
        raise PlanError(f"planner {name!r} must be callable, got {type(fn).__name__}")
    key = name.strip().lower()
    if key == DYNAMIC_MAPPING:
        raise PlanError(
            f"planner name {name!r} is reserved for the dynamic mapping (fit(mapping='drpm')); "
            f"choose another name"
        )
    taken = PLANNERS.get(key)
    if taken is not None and taken is not fn and not replace:
        raise PlanError(
            f"planner name {key!r} is already registered "
            f"({getattr(taken, '__module__', '?')}.{getattr(taken, '__name__', '?')}); "
            f"choose another name, or pass replace=True to replace it"
        )
    PLANNERS[key] = fn
    return fn


def get_planner(name: str) -> Planner:
    """The planner registered under ``name``; :class:`PlanError` names the valid ones."""
    key = str(name).strip().lower()
    try:
        return PLANNERS[key]
    except KeyError:
        raise PlanError(
            f"unknown planner method {name!r}; valid methods are {describe_names(sorted(PLANNERS))}"
        ) from None


#: The mapping that is not a planner: re-estimate abilities while training and
#: re-plan with SRPM (``fit(mapping="drpm")``, the default).
DYNAMIC_MAPPING = "drpm"


def planner_aliases() -> dict[str, str]:
    """Registered names that are a second name of an earlier-registered planner: ``{alias: name}``.

    Derived from the registry (the same function under two names), so a new
    alias needs no second list.
    """
    first: dict[int, str] = {}
    out: dict[str, str] = {}
    for name, fn in PLANNERS.items():
        if id(fn) in first:
            out[name] = first[id(fn)]
        else:
            first[id(fn)] = name
    return out


def mapping_names() -> list[str]:
    """Every name ``fit(mapping=...)``, job files and ``dask-rpm train --mapping`` accept.

    ``drpm`` first, then each registered planner in registration order
    (aliases included). ``dask-rpm plan --method`` accepts the planners.
    """
    return [DYNAMIC_MAPPING, *PLANNERS]


def describe_names(names: Iterable[str]) -> str:
    """``names`` for people: comma-separated, an alias as ``grid (= grid-hrev)``."""
    aliases = planner_aliases()
    return ", ".join(f"{n} (= {aliases[n]})" if n in aliases else n for n in names)
