"""Buddy copies, the worker's side: its own copies and the copies it keeps for its senders.

One :class:`CopyKeeper` per run on every worker, owned by the worker plugin
(:class:`~dask_rpm.engine.worker.RPMEnginePlugin`), not by the run's state: a worker that a
remap leaves without rows still serves the copies it holds to a recovery. Its transport
(``send(address, message)``, Dask's worker-to-worker RPC on a worker) is injected, so this
module does not import ``distributed``; which buddy, how often and what a recovery takes
are the pure decisions of :mod:`dask_rpm.engine.buddies`.

Double-buffered: a copy taken at iteration ``k`` is new host arrays, sent while training goes
on; the buddy replaces its previous copy of that sender only when the new one has arrived
whole, and the sender keeps its own copies back to the driver's ``keep_from``. A copy still
on its way when the next is due is not followed by another send (that copy is kept here
only, and counted as skipped): sends never queue up behind a slow link.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple

import numpy as np

from .records import CopyReport

__all__ = ["Copy", "CopyKeeper", "MAX_OWN"]

logger = logging.getLogger("dask_rpm")

#: At most this many own copies are kept, whatever ``keep_from`` says (a buddy that never
#: answers must not make them pile up).
MAX_OWN = 4


class Copy(NamedTuple):
    """A worker's rows ``rows`` of every parameter and their optimizer state at iteration
    ``iteration`` (host arrays, cut like :func:`~dask_rpm.engine.worker.rows_of`'s)."""

    iteration: int
    rows: tuple[int, int]
    params: list[np.ndarray]
    state: dict[str, list[np.ndarray]]

    @property
    def nbytes(self) -> int:
        return int(
            sum(p.nbytes for p in self.params)
            + sum(a.nbytes for v in self.state.values() for a in v)
        )


def _owned(a: Any) -> np.ndarray:
    """``a`` as an array of its own: a view (of the live shard) is copied."""
    arr = np.asarray(a)
    return arr if arr.flags.owndata else arr.copy()


class CopyKeeper:
    """One run's buddy copies on one worker.

    Parameters
    ----------
    address : str
        This worker's address (the sender named in its messages).
    send : async callable
        ``send(address, message)``: deliver a copy to a buddy and return once it holds it.
    layers : Layers or ConvLayers, optional
        The network's geometry, to cut rows out of a copy (set when the run's shard arrives).
    """

    def __init__(
        self,
        address: str,
        send: Callable[[str, dict[str, Any]], Awaitable[Any]],
        layers: Any = None,
    ) -> None:
        self.address, self.send, self.layers = address, send, layers
        self.own: dict[int, Copy] = {}
        self.held: dict[str, Copy] = {}  # sender -> its latest complete copy
        self.version: int | None = None  # the plan version of the latest own copy
        self.sending: asyncio.Task[None] | None = None
        self.acked = -1
        self.taken = self.sent = self.skipped = 0
        self.copy_seconds = self.send_seconds = 0.0
        self.peak = 0  # the most bytes of copies held at once

    # ------------------------------------------------------------- the sender
    def due(self, iteration: int, every: int, version: int) -> bool:
        """Whether a copy is due before ``iteration``: every ``every`` iterations, and at once
        on a new plan (its rows are not in any copy yet)."""
        return every > 0 and (iteration % every == 0 or version != self.version)

    def take(
        self, iteration: int, version: int, rows: tuple[int, int], shard: Any, buddy: str | None
    ) -> None:
        """Copy ``shard``'s rows (the iteration boundary: nothing updates it meanwhile) and send the
        copy to ``buddy`` in the background, unless the previous copy is still on its way."""
        t0 = time.perf_counter()
        got = shard.rows(*rows)
        copy = Copy(
            int(iteration),
            (int(rows[0]), int(rows[1])),
            [_owned(p) for p in got["params"]],
            {k: [_owned(a) for a in v] for k, v in got["state"].items()},
        )
        self.own[copy.iteration] = copy
        self.version = version
        self.taken += 1
        self.copy_seconds = time.perf_counter() - t0
        self._trim()
        self.peak = max(self.peak, self.nbytes())
        if buddy is None:
            return
        if self.sending is not None and not self.sending.done():
            self.skipped += 1
            return
        self.sending = asyncio.ensure_future(self._send(buddy, copy))

    async def _send(self, buddy: str, copy: Copy) -> None:
        message = {
            "sender": self.address,
            "iteration": copy.iteration,
            "rows": list(copy.rows),
            "params": copy.params,
            "state": copy.state,
            # the geometry, to cut rows out of the copy: a buddy the plan leaves idle has no
            # shard of the run to take it from
            "layers": self.layers,
        }
        t0 = time.perf_counter()
        try:
            await self.send(buddy, message)
        except Exception as exc:  # the buddy left: the next copy goes to the next plan's buddy
            logger.debug(f"buddy copy of iteration {copy.iteration} to {buddy} failed: {exc!r}")
            return
        self.send_seconds = time.perf_counter() - t0
        self.acked = max(self.acked, copy.iteration)
        self.sent += 1

    def _trim(self, keep_from: int | None = None) -> None:
        """Drop own copies before ``keep_from`` (never the latest), and all but the latest
        :data:`MAX_OWN`."""
        its = sorted(self.own)
        drop = its[:-MAX_OWN] if len(its) > MAX_OWN else []
        if keep_from is not None:
            drop += [k for k in its[:-1] if k < keep_from]
        for k in set(drop):
            del self.own[k]

    def keep_from(self, iteration: int) -> None:
        """Own copies before ``iteration`` are no longer needed (the driver's ``keep_from``)."""
        self._trim(iteration)

    # ------------------------------------------------------------- the buddy
    def receive(
        self,
        sender: str,
        iteration: int,
        rows: Any,
        params: Any,
        state: Any,
        layers: Any = None,
    ) -> None:
        """Keep ``sender``'s copy of ``iteration``, replacing an older one (it arrived whole);
        ``layers``: the network's geometry, for a keeper that has none yet."""
        old = self.held.get(sender)
        if old is not None and old.iteration > iteration:
            return
        if self.layers is None:
            self.layers = layers
        self.held[sender] = Copy(
            int(iteration), (int(rows[0]), int(rows[1])), list(params), dict(state)
        )
        self.peak = max(self.peak, self.nbytes())

    # ------------------------------------------------------------- a recovery
    def holdings(self) -> list[tuple[int, tuple[int, int], str]]:
        """``(iteration, rows, kind)`` of every copy here: ``own`` or ``buddy``."""
        out = [(c.iteration, c.rows, "own") for c in self.own.values()]
        out += [(c.iteration, c.rows, "buddy") for c in self.held.values()]
        return out

    def rows(self, iteration: int, a: int, b: int, kind: str) -> dict[str, Any]:
        """Rows ``[a, b)`` of iteration ``iteration`` from a copy of ``kind``, as
        :func:`~dask_rpm.engine.worker.rows_of` gives them."""
        pool = self.own.values() if kind == "own" else self.held.values()
        for c in pool:
            if c.iteration == iteration and c.rows[0] <= a < b <= c.rows[1]:
                return {
                    "params": self.layers.take(c.params, (a, b), c.rows[0]),
                    "state": {
                        k: self.layers.take(v, (a, b), c.rows[0]) for k, v in c.state.items()
                    },
                }
        raise KeyError(
            f"no {kind} copy of rows [{a}, {b}) at iteration {iteration} on {self.address}"
        )

    def drop_after(self, iteration: int) -> None:
        """Forget copies of iterations after ``iteration``: training went back to it, and what
        comes after will be computed again."""
        self.own = {k: c for k, c in self.own.items() if k <= iteration}
        self.held = {s: c for s, c in self.held.items() if c.iteration <= iteration}
        self.acked = min(self.acked, iteration)

    # ------------------------------------------------------------- reporting
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.own.values()) + sum(c.nbytes for c in self.held.values())

    def report(self) -> CopyReport:
        return CopyReport(
            self.acked,
            self.nbytes(),
            self.taken,
            self.sent,
            self.skipped,
            self.copy_seconds,
            self.send_seconds,
        )

    def close(self) -> None:
        if self.sending is not None and not self.sending.done():
            self.sending.cancel()
        self.own.clear()
        self.held.clear()
