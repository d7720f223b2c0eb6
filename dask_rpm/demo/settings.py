"""``rpm.demo.*`` as one record, read once per call (:func:`demo_settings`): the demo job of
``dask-rpm train`` and the workers ``dask-rpm probe`` starts.

Light: no ``distributed``, so the commands read it before they start a cluster.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from .. import config
from ..planners import parse_shape

__all__ = ["DemoSettings", "demo_settings"]


class DemoSettings(NamedTuple):
    """The demo job, from ``rpm.demo.*`` (``dask-rpm probe`` starts the same workers)."""

    speeds: tuple[float, ...]
    shape: tuple[int, int, int]
    samples: int
    iterations: int
    compare_iterations: int


def demo_settings(
    speeds: Sequence[float] | None = None,
    iterations: int | None = None,
    samples: int | None = None,
    shape: Any = None,
) -> DemoSettings:
    """``rpm.demo.*``, read once now, with the given values taking precedence."""
    c = config.section("demo", speeds=speeds, iterations=iterations, samples=samples, shape=shape)
    return DemoSettings(
        speeds=tuple(float(v) for v in c["speeds"]),
        shape=parse_shape(c["shape"]),
        samples=int(c["samples"]),
        iterations=int(c["iterations"]),
        compare_iterations=int(c["compare_iterations"]),
    )
