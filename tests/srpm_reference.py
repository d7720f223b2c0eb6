"""SRPM's whole DP table ``t(C, q)``, which only the tests call: the package's planner keeps only
the rows it needs (:mod:`dask_rpm.planners.srpm`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dask_rpm.planners.srpm import _first_row, _next_row, _prepare, _reference_table

__all__ = ["srpm_table"]


def srpm_table(
    abilities: Sequence[float] | np.ndarray,
    *,
    max_per_column: int | None = None,
    reference: bool = False,
) -> np.ndarray:
    """The full table ``t(C, q)``, shape ``(N + 1, N + 1)``, ``inf`` where undefined.

    Row ``C``, column ``q`` is the smallest possible ``max_c s_c* (k(c) - 1)`` over
    splits of the ``q`` slowest workers into ``C`` columns of consecutive sorted
    workers (docs/method.md §5). ``reference=True`` computes it with the plain DP.
    """
    order, prefix, cap = _prepare(abilities, max_per_column)
    n = len(order)
    if reference:
        return _reference_table(prefix, cap, n)[0]
    t = np.full((n + 1, n + 1), np.inf)
    t[0, 0] = 0.0
    t[1] = row = _first_row(prefix, cap)
    for c in range(2, n + 1):
        row, _ = _next_row(prefix, row, c, cap)
        t[c] = row
    return t
