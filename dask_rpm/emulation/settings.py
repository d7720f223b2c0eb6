"""``rpm.emulation.*`` as one frozen record, read once per call (:class:`EmulationSettings`).

:class:`~dask_rpm.emulation.cluster.EmulatedCluster` reads it once, on the client, and
passes it to what it builds (GPU workers, EMULATED links, each worker's
:class:`~dask_rpm.emulation.pacing.EmulationPlugin`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .. import config

__all__ = ["EmulationSettings"]


@dataclass(frozen=True)
class EmulationSettings:
    """``rpm.emulation.*``; see docs/configuration.md. Values as configured where a function
    checks them with its own message (``speeds``, ``gpus``, ``nodes``, ``links``).

    Attributes
    ----------
    headroom : float
        Fraction of the machine's cores the emulated speeds may use.
    speeds : sequence of float or None
        Default EMULATED relative speeds of :func:`~dask_rpm.emulation.local_cluster`.
    gpus : int
        Workers that train on a GPU of this machine, REAL.
    overrun_tolerance : float
        A paced block later than its target by more than this fraction overruns.
    rate_fraction : float
        Speed 1.0 x scale 1.0 as a fraction of one warm core's kernel throughput.
    nodes : sequence or None
        EMULATED node label per worker (``None``: one node).
    links : mapping
        EMULATED delay per link class (``{"host": {"latency": s, "bandwidth": B/s}, ...}``).
    """

    headroom: float
    speeds: Sequence[float] | None
    gpus: int
    overrun_tolerance: float
    rate_fraction: float
    nodes: Sequence[Any] | None
    links: Mapping[str, Any]

    @classmethod
    def from_config(cls, **overrides: Any) -> EmulationSettings:
        """``rpm.emulation.*`` read now, the ``overrides`` (field names) that are not ``None``
        winning."""
        c = config.section("emulation", **overrides)
        return cls(
            headroom=float(c["headroom"]),
            speeds=_frozen(c["speeds"]),
            gpus=c["gpus"],
            overrun_tolerance=float(c["overrun_tolerance"]),
            rate_fraction=float(c["rate_fraction"]),
            nodes=_frozen(c["nodes"]),
            links=dict(c["links"] or {}),
        )


def _frozen(value: Any) -> Any:
    """A configured list as a tuple (not the configuration's own list); anything else as given,
    for the function that checks it to say what is wrong."""
    return tuple(value) if isinstance(value, list) else value
