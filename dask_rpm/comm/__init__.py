"""Communication between workers: the one home of the exchange.

Pure (asyncio and numpy; no ``distributed``). :mod:`~dask_rpm.comm.network` holds the link
classes and the network parameters, :mod:`~dask_rpm.comm.schedules` the schedules of a
collective (who sends what to whom in each round), :mod:`~dask_rpm.comm.cost` their cost in
seconds and the one rule that picks the engine's algorithm (:func:`engine_algorithm`,
:func:`engine_horizontal`), :mod:`~dask_rpm.comm.exchange` how a worker applies a schedule's
rounds, :mod:`~dask_rpm.comm.mailbox` a worker's messages of one run (the transport
injected), and :mod:`~dask_rpm.comm.collectives` the named collectives the block loop calls.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_attributes
from .cost import (
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
from .network import (
    LINK_CLASSES,
    CostSettings,
    Interconnect,
    LinkClass,
    link_class,
    network_from_config,
)

if not TYPE_CHECKING:  # type checkers resolve submodules themselves; a catch-all hides typos
    __getattr__, __dir__ = lazy_attributes(__name__, __path__)  # submodules on first use

__all__ = [
    "ENGINE_HORIZONTAL",
    "ENGINE_VERTICAL",
    "HORIZONTAL_MODES",
    "LINK_CLASSES",
    "SCALABLE",
    "VERTICAL_MODES",
    "CostSettings",
    "EngineRule",
    "Interconnect",
    "LinkClass",
    "Message",
    "best_collective",
    "collective_seconds",
    "engine_algorithm",
    "engine_horizontal",
    "link_class",
    "network_from_config",
    "round_seconds",
    "schedule_seconds",
]
