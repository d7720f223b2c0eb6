"""Cost models for plans: the paper's element count and a seconds prediction.

Pure subpackage (numpy only).

Two models live here:

* :func:`t_comm` (and :func:`t_comm_model`, :func:`t_comm_partition`) - the
  paper's communication cost in *elements*, which SRPM minimises. It ignores
  computation and message latency.
* :func:`predict_iteration_seconds` / :func:`predict_breakdown` - a
  latency-bandwidth (alpha-beta) model in *seconds* for one BP iteration of an
  integer plan on workers of known speeds. See :func:`predict_breakdown` for
  the model and its assumptions.

The network model and the cost of each exchange live in :mod:`dask_rpm.comm`.
Modules: :mod:`~dask_rpm.cost.predict` (one iteration of a plan) and :mod:`~dask_rpm.cost.fitting`
(network parameters from measured runs).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_attributes
from ..plan.partition import t_comm_model
from .fitting import fit_network
from .predict import (
    CostModel,
    expected_max_normal,
    predict_breakdown,
    predict_iteration_seconds,
    t_comm,
    t_comm_partition,
)

if not TYPE_CHECKING:  # type checkers resolve submodules themselves; a catch-all hides typos
    __getattr__, __dir__ = lazy_attributes(__name__, __path__)  # submodules on first use

__all__ = [
    "CostModel",
    "expected_max_normal",
    "fit_network",
    "predict_breakdown",
    "predict_iteration_seconds",
    "t_comm",
    "t_comm_model",
    "t_comm_partition",
]
