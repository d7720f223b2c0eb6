"""Cost models for plans: the paper's element count and a seconds prediction.

Pure module (numpy only).

Two models live here:

* :func:`t_comm` (and :func:`t_comm_model`, :func:`t_comm_partition`) - the
  paper's communication cost in *elements*, which SRPM minimises (SPEC
  section 3). It ignores computation and message latency.
* :func:`predict_iteration_seconds` / :func:`predict_breakdown` - a
  latency-bandwidth (alpha-beta) model in *seconds* for one BP iteration of an
  integer plan on workers of known speeds. See :func:`predict_breakdown` for
  the model and its assumptions.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from . import config

if TYPE_CHECKING:  # pragma: no cover
    from .partition import Plan, RealPartition

__all__ = [
    "t_comm",
    "t_comm_model",
    "t_comm_partition",
    "predict_iteration_seconds",
    "predict_breakdown",
]


def t_comm_model(
    widths: Sequence[float], sizes: Sequence[int], shape: tuple[int, int, int], samples: int
) -> float:
    """``2 l s max_c(s_c* (k(c) - 1)) + 2 (l + n) m (C - 1)`` from column widths and sizes.

    Parameters
    ----------
    widths
        Sample fraction ``s_c*`` of each column (any positive scale; normalised here).
    sizes
        Number of workers ``k(c)`` of each column.
    shape
        ``(n, m, l)``.
    samples
        ``s``.
    """
    n, m, l = shape
    total = float(sum(widths))
    vertical = max(w / total * (k - 1) for w, k in zip(widths, sizes))
    return float(2 * l * samples * vertical + 2 * (l + n) * m * (len(sizes) - 1))


def t_comm_partition(part: "RealPartition", shape: tuple[int, int, int], samples: int) -> float:
    """The element-count model of a real-valued partition (row cuts do not matter)."""
    return t_comm_model(part.widths, [len(c) for c in part.columns], shape, samples)


def t_comm(plan: "Plan") -> float:
    """The paper's communication cost of an integer plan, in elements (SPEC section 3).

    ``2 l s max_c(s_c* (k(c) - 1)) + 2 (l + n) m (C - 1)`` where ``s_c*`` is the
    column's sample fraction and ``k(c)`` its number of workers.
    """
    s = plan.samples
    widths = [plan.column_samples(c)[1] - plan.column_samples(c)[0] for c in range(plan.n_columns)]
    return t_comm_model(widths, [len(col) for col in plan.columns], plan.shape, s)


def _speed_of(speeds: Sequence[float] | Mapping[Any, float], plan: "Plan", w: int) -> float:
    if isinstance(speeds, Mapping):
        key: Any = w
        if w not in speeds and plan.workers is not None and plan.workers[w] in speeds:
            key = plan.workers[w]
        if key not in speeds:
            raise ValueError(f"no speed given for planned worker P{w + 1} (index {w})")
        v = speeds[key]
    else:
        if len(speeds) != len(plan.abilities):
            raise ValueError(
                f"{len(speeds)} speeds given for a plan of {len(plan.abilities)} workers; "
                f"give one per worker (excluded ones included) or a mapping"
            )
        v = speeds[w]
    v = float(v)
    if not (math.isfinite(v) and v > 0):
        raise ValueError(f"speed of P{w + 1} is {v}; speeds must be positive finite work units/second")
    return v


def predict_breakdown(
    plan: "Plan",
    speeds: Sequence[float] | Mapping[Any, float],
    *,
    latency: float | None = None,
    bandwidth: float | None = None,
    itemsize: int | None = None,
) -> dict[str, Any]:
    """Predicted seconds of one BP iteration of ``plan``, part by part.

    Model (alpha-beta, everything in seconds):

    * compute of worker ``i``: ``area_i / speed_i`` where ``area_i`` is hidden
      units x samples of its rectangle (the work unit of SPEC section 1);
    * vertical exchange of column ``c`` (``k`` workers, ``s_c`` samples): one
      worker gathers the ``l x s_c`` partial products from the other ``k - 1``
      and broadcasts the sum back, one point-to-point message at a time:
      ``2 (k - 1) (latency + l s_c itemsize / bandwidth)``;
    * horizontal exchange of band ``b`` (``r_b`` hidden units, held by one
      worker per column): reduce then broadcast of its ``(n + l) r_b`` weight
      update elements among the ``C`` holders:
      ``2 (C - 1) (latency + (n + l) r_b itemsize / bandwidth)``;
    * iteration = ``max_c (max compute in c + vertical_c) + sum_b horizontal_b``.

    Assumptions: columns run concurrently and independently until the
    horizontal exchange; the horizontal exchanges of different bands do not
    overlap (they share workers and links - the paper makes the same
    assumption when it counts the whole ``(l + n) m`` per column); compute and
    communication do not overlap; links are uniform (one latency, one
    bandwidth); the small ``l s_i`` parts of the work are folded into the
    speed. With ``latency = 0`` and one band per weight the communication part
    is proportional to the paper's ``t_comm`` terms; the latency term is what
    makes thin bands (:func:`~dask_rpm.partition.snap_small_groups`) costly.

    Parameters
    ----------
    plan
        An integer plan.
    speeds
        Work units (hidden units x samples) per second, one per worker of
        ``plan.abilities`` (excluded workers included, their value unused), or
        a mapping from worker index or worker name to speed.
    latency, bandwidth, itemsize
        Seconds per message, bytes per second and bytes per element;
        ``None`` reads ``rpm.cost.latency``, ``rpm.cost.bandwidth``,
        ``rpm.cost.itemsize``.

    Returns
    -------
    dict
        ``compute`` (per worker index), ``column_compute``, ``vertical`` and
        ``column_total`` (per column), ``bands`` (list of ``(m0, m1)``),
        ``horizontal_by_band``, ``horizontal``, ``bottleneck_column`` and
        ``total`` (seconds).
    """
    latency = float(config.get("cost.latency", latency))
    bandwidth = float(config.get("cost.bandwidth", bandwidth))
    itemsize = int(config.get("cost.itemsize", itemsize))
    if not (math.isfinite(latency) and latency >= 0):
        raise ValueError(f"latency={latency} must be a non-negative number of seconds")
    if not (bandwidth > 0):
        raise ValueError(f"bandwidth={bandwidth} must be positive (bytes per second)")
    if itemsize < 1:
        raise ValueError(f"itemsize={itemsize} must be a positive number of bytes")
    n, _, l = plan.shape
    compute: dict[int, float] = {}
    column_compute, vertical, column_total = [], [], []
    for c, col in enumerate(plan.columns):
        times = []
        for w in col:
            t = plan.rectangle(w).area / _speed_of(speeds, plan, w)
            compute[w] = t
            times.append(t)
        s0, s1 = plan.column_samples(c)
        k = len(col)
        v = 2 * (k - 1) * (latency + l * (s1 - s0) * itemsize / bandwidth)
        column_compute.append(max(times))
        vertical.append(v)
        column_total.append(max(times) + v)
    bands = plan.bands()
    C = plan.n_columns
    horizontal_by_band = [
        2 * (C - 1) * (latency + (n + l) * (b1 - b0) * itemsize / bandwidth) for b0, b1 in bands
    ]
    bottleneck = max(range(C), key=lambda c: column_total[c])
    horizontal = float(sum(horizontal_by_band))
    return {
        "compute": compute,
        "column_compute": column_compute,
        "vertical": vertical,
        "column_total": column_total,
        "bands": bands,
        "horizontal_by_band": horizontal_by_band,
        "horizontal": horizontal,
        "bottleneck_column": bottleneck,
        "total": float(column_total[bottleneck] + horizontal),
    }


def predict_iteration_seconds(
    plan: "Plan",
    speeds: Sequence[float] | Mapping[Any, float],
    *,
    latency: float | None = None,
    bandwidth: float | None = None,
    itemsize: int | None = None,
) -> float:
    """Predicted seconds of one BP iteration; the ``total`` of :func:`predict_breakdown`."""
    return predict_breakdown(plan, speeds, latency=latency, bandwidth=bandwidth, itemsize=itemsize)["total"]
