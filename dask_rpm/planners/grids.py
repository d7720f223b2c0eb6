"""The paper's baselines on a regular grid, and the proportional 1-D split.

``uniform`` (method 1), ``grid-h`` (method H), ``grid-hrev`` (method H_rev) place the workers
on an ``N_DP x N/N_DP`` grid and pick ``N_DP`` (a divisor of N) by the ``t_comm`` model unless
``dp`` is given; ``split-1d`` gives every worker a column of its own (pure data parallelism).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..cost import t_comm_partition
from ..plan.partition import PlanError, RealPartition
from .inputs import normalise
from .registry import PlannerResult

__all__ = ["divisors", "grid_h", "grid_hrev", "split_1d", "uniform"]


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _grid_dp_values(
    n_workers: int, shape: tuple[int, int, int], samples: int, dp: int | None, method: str
) -> list[int]:
    """The data-parallel degrees to try; PlanError if ``dp`` is given and invalid."""
    m = shape[1]
    divs = divisors(n_workers)
    ok = [d for d in divs if d <= samples and n_workers // d <= m]
    if dp is not None:
        if n_workers % dp:
            raise PlanError(
                f"dp={dp} does not divide the {n_workers} workers; {method} needs N_DP to divide N: "
                f"use one of {', '.join(map(str, divs))}"
            )
        if dp > samples:
            raise PlanError(
                f"samples={samples} is fewer than the dp={dp} columns; each column needs at least "
                f"one sample: use one of {', '.join(map(str, ok)) or 'no N_DP (add samples)'}"
            )
        if n_workers // dp > m:
            raise PlanError(
                f"dp={dp} puts {n_workers // dp} workers in a column but the network has only "
                f"m={m} hidden units and each worker needs one: use one of "
                f"{', '.join(map(str, ok)) or 'no N_DP (add hidden units)'}"
            )
        return [dp]
    if not ok:
        raise PlanError(
            f"no data-parallel degree N_DP dividing {n_workers} workers gives at most m={m} workers "
            f"per column and at most samples={samples} columns; use more samples or hidden units, "
            f"or another worker count"
        )
    return ok


def _best_grid(
    build: Callable[[int], RealPartition],
    dps: list[int],
    shape: tuple[int, int, int],
    samples: int,
    method: str,
) -> PlannerResult:
    scored = []
    for d in dps:
        part = build(d)
        scored.append((t_comm_partition(part, shape, samples), d, part))
    tc, d, part = min(scored, key=lambda x: (x[0], x[1]))  # ties -> fewer columns
    if len(dps) > 1:
        note = f"{method}: N_DP={d} is best by the t_comm model among {', '.join(map(str, dps))}"
    else:
        note = f"{method}: N_DP={d}"
    return PlannerResult(part, tc, (), method=method, notes=(note,), meta={"dp": d})


def uniform(
    abilities: np.ndarray, shape: tuple[int, int, int], samples: int, *, dp: int | None = None
) -> PlannerResult:
    """Method 1: equal work for everyone on a regular ``N_DP x N/N_DP`` grid.

    Heterogeneity is ignored, so workers fill the columns in the order given.
    ``dp=None`` picks the ``N_DP`` (a divisor of N) with the smallest ``t_comm``.
    """
    n = len(abilities)

    def build(d: int) -> RealPartition:
        k = n // d
        cols = tuple(tuple(range(c * k, (c + 1) * k)) for c in range(d))
        return RealPartition(cols, (1.0 / d,) * d, ((1.0 / k,) * k,) * d)

    return _best_grid(
        build, _grid_dp_values(n, shape, samples, dp, "uniform"), shape, samples, "uniform"
    )


def _grid(
    abilities: np.ndarray, shape: tuple[int, int, int], samples: int, dp: int | None, rev: bool
) -> PlannerResult:
    p = normalise(abilities)
    n = len(p)
    order = np.argsort(p, kind="stable")
    method = "grid-hrev" if rev else "grid-h"

    def build(d: int) -> RealPartition:
        k = n // d
        groups = [order[g * k : (g + 1) * k] for g in range(d)]
        slowest = np.array([p[g[0]] for g in groups])  # groups are sorted ascending
        widths = tuple(float(v) for v in slowest / slowest.sum())
        if rev:
            first = p[groups[0]]
            rows = tuple(float(v) for v in first / first.sum())
        else:
            rows = (1.0 / k,) * k
        cols = tuple(tuple(int(i) for i in g) for g in groups)
        return RealPartition(cols, widths, (rows,) * d)

    return _best_grid(build, _grid_dp_values(n, shape, samples, dp, method), shape, samples, method)


def grid_h(
    abilities: np.ndarray, shape: tuple[int, int, int], samples: int, *, dp: int | None = None
) -> PlannerResult:
    """Method H (Azuma et al.): sorted groups of ``N/N_DP``; samples by each group's
    slowest member, hidden units split equally; a regular grid."""
    return _grid(abilities, shape, samples, dp, rev=False)


def grid_hrev(
    abilities: np.ndarray, shape: tuple[int, int, int], samples: int, *, dp: int | None = None
) -> PlannerResult:
    """Method H_rev: as :func:`grid_h`, but hidden units split in the ability ratio
    of the slowest group's workers (the same row cuts in every column)."""
    return _grid(abilities, shape, samples, dp, rev=True)


def split_1d(
    abilities: np.ndarray, shape: tuple[int, int, int], samples: int, *, dp: int | None = None
) -> PlannerResult:
    """Proportional 1-D batch split: pure data parallelism, samples by ability.

    Every worker is a column of its own (all ``m`` hidden units, no vertical
    exchange) and gets a share of the samples proportional to its ability;
    the weight updates are exchanged among all ``N`` columns. ``dp`` must be
    ``None`` or ``N`` (the number of columns is fixed).
    """
    p = normalise(abilities)
    n = len(p)
    if dp is not None and dp != n:
        raise PlanError(
            f"dp={dp} but split-1d always has one column per worker ({n}); leave dp out"
        )
    if samples < n:
        raise PlanError(
            f"samples={samples} is fewer than the {n} workers; split-1d gives each worker "
            f"at least one sample: use more samples or fewer workers"
        )
    part = RealPartition(
        tuple((i,) for i in range(n)), tuple(float(v) for v in p), tuple((1.0,) for _ in range(n))
    )
    return PlannerResult(
        part,
        t_comm_partition(part, shape, samples),
        (),
        method="split-1d",
        notes=(f"split-1d: {n} columns of one worker each, samples by ability",),
        meta={"dp": n},
    )
