"""Problems the tests train on (imported by test modules; pytest puts this directory on the path)."""

from __future__ import annotations

import numpy as np


def regression_problem(
    s: int = 48, n: int = 6, l: int = 3, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """``s`` samples of ``n`` normal inputs, the last a constant 1 (a bias), and ``l`` targets
    uniform in (0.1, 0.9), from ``seed``: small and well conditioned at small learning rates."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(s, n))
    x[:, -1] = 1.0
    d = rng.uniform(0.1, 0.9, size=(s, l))
    return x, d
