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

Modules: :mod:`~dask_rpm.cost.network` (link classes and the network parameters),
:mod:`~dask_rpm.cost.collectives` (messages, rounds, collective exchanges),
:mod:`~dask_rpm.cost.predict` (one iteration of a plan) and :mod:`~dask_rpm.cost.fitting`
(network parameters from measured runs).
"""

from __future__ import annotations

from ..partition import t_comm_model
from .collectives import (
    ENGINE_HORIZONTAL,
    ENGINE_VERTICAL,
    HORIZONTAL_MODES,
    SCALABLE,
    VERTICAL_MODES,
    EngineRule,
    Message,
    best_collective,
    collective_seconds,
    engine_algorithm,
    engine_horizontal,
    round_seconds,
    schedule_seconds,
)
from .fitting import fit_network
from .network import LINK_CLASSES, Interconnect, LinkClass, link_class, network_from_config
from .predict import (
    expected_max_normal,
    predict_breakdown,
    predict_iteration_seconds,
    t_comm,
    t_comm_partition,
)

__all__ = [
    "ENGINE_HORIZONTAL",
    "ENGINE_VERTICAL",
    "EngineRule",
    "HORIZONTAL_MODES",
    "LINK_CLASSES",
    "SCALABLE",
    "VERTICAL_MODES",
    "LinkClass",
    "Message",
    "Interconnect",
    "best_collective",
    "collective_seconds",
    "engine_algorithm",
    "engine_horizontal",
    "expected_max_normal",
    "fit_network",
    "link_class",
    "network_from_config",
    "predict_breakdown",
    "predict_iteration_seconds",
    "round_seconds",
    "schedule_seconds",
    "t_comm",
    "t_comm_model",
    "t_comm_partition",
]
