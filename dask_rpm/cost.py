"""Cost models for plans: the paper's element count and a seconds prediction.

Pure module (numpy only).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from .partition import Plan

__all__ = ["t_comm"]


def t_comm(plan: "Plan") -> float:
    """The paper's communication cost of a plan, in elements (SPEC section 3).

    ``2 l s max_c(s_c* (k(c) - 1)) + 2 (l + n) m (C - 1)`` where ``s_c*`` is the
    column's sample fraction and ``k(c)`` its number of workers.
    """
    n, m, l = plan.shape
    s = plan.samples
    vertical = max(
        (plan.column_samples(c)[1] - plan.column_samples(c)[0]) / s * (len(col) - 1)
        for c, col in enumerate(plan.columns)
    )
    return float(2 * l * s * vertical + 2 * (l + n) * m * (plan.n_columns - 1))
