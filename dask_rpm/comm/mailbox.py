"""One worker's messages of one training run: sends until written, receives until read.

Pure (asyncio and numpy; no ``distributed``): the transport that writes a message to a
peer is injected (``post``), as distributed's P2P shuffle injects its comm into a run.
The engine's worker plugin gives it Dask's worker-to-worker RPC and calls
:meth:`Mailbox.deliver` from its message handler; the collectives
(:mod:`dask_rpm.comm.collectives`) send and receive through it.

Receive slots are keyed ``(epoch, iteration, phase, sender)``: ``epoch`` numbers the
engine's blocks (a retried block gets a new one), so messages of an aborted block still
in flight are dropped instead of being mistaken for the retry's. The block loop, the
message handler and the control calls all run on the worker's event loop, so the slots
need no lock. Every receive has a deadline: a lost peer never leaves anyone waiting forever.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from ..nn import backend as xb

__all__ = ["BlockAborted", "Mailbox", "PeerError", "pack", "unpack"]

#: Message phases by their first letter, as errors name them: "v", "vd" and "v<round>" are
#: vertical; "h" and "h<group>.<round>" horizontal; "a<layer>" and "g<layer>" between hidden
#: layers (:mod:`dask_rpm.comm.collectives`).
PHASE_NAMES = {"v": "vertical", "h": "horizontal", "a": "activation", "g": "delta"}


class BlockAborted(Exception):
    """Raised inside a worker's block loop when the driver aborts the block."""


class PeerError(Exception):
    """Raised inside a worker's block loop when a peer could not be reached or did not answer in time."""


def pack(value: Any) -> Any:
    """An array as ``[bytes, dtype, shape]`` for the wire (from host memory: a GPU array is
    copied to the host first, :func:`~dask_rpm.nn.backend.to_host`).

    Plain bytes go through msgpack as they are; wrapping the array for Dask's
    serializers instead costs about 0.1-0.2 ms of CPU per message on the 2-core
    development machine (dispatch and metering), more than copying a 200 KB partial
    product twice. The copy also means the receiver never sees a buffer the
    sender reuses (the in-process transport passes objects by reference).
    """
    if xb.is_array(value):
        host = xb.to_host(value)
        return ["nd", host.tobytes(), host.dtype.str, list(host.shape)]
    return value


def unpack(value: Any) -> Any:
    """What :func:`pack` made of a value, as it was (arrays in host memory)."""
    if isinstance(value, (list, tuple)) and len(value) == 4 and value[0] == "nd":
        return np.frombuffer(value[1], dtype=value[2]).reshape(value[3])
    return value


class Mailbox:
    """The messages one worker exchanges in one run.

    Parameters
    ----------
    run : str
        The run's name, carried by every message.
    me : int
        This worker's index in the run (stable for the run: the driver's worker list only grows).
    address : str
        This worker's address, for error messages.
    post : callable
        ``await post(address, message)`` writes one message (a dict) to the peer at
        ``address``; it raises when the peer cannot be reached.
    """

    def __init__(
        self,
        run: str,
        me: int,
        address: str,
        post: Callable[[str, dict[str, Any]], Awaitable[None]],
    ) -> None:
        self.run, self.me, self.address, self.post = run, me, address, post
        self.slots: dict[tuple[int, int, str, int], Any] = {}
        self.epoch = -1
        self.aborted: dict[int, str] = {}
        self.pending: list[asyncio.Future] = []
        self.send_error: str | None = None
        self._waiting: tuple[list[tuple[int, int, str, int]], asyncio.Future] | None = None

    def begin(self, epoch: int) -> None:
        """Start block ``epoch``: forget slots of older epochs and any send error."""
        self.epoch = epoch
        for key in [k for k in self.slots if k[0] < epoch]:
            del self.slots[key]
        self.send_error = None
        self.pending = []

    def _wake(self, exc: BaseException | None = None) -> None:
        if self._waiting is None:
            return
        keys, fut = self._waiting
        if fut.done():
            return
        if exc is not None:
            fut.set_exception(exc)
        elif all(k in self.slots for k in keys):
            fut.set_result(None)

    def deliver(self, epoch: int, iteration: int, phase: str, sender: int, payload: Any) -> None:
        """A message arrived (the worker's message handler calls this)."""
        if epoch < self.epoch:  # from an aborted block
            return
        self.slots[(epoch, iteration, phase, sender)] = payload
        self._wake()

    def abort(self, epoch: int, reason: str) -> None:
        self.aborted[epoch] = reason
        if epoch == self.epoch:
            self._wake(BlockAborted(reason))

    def check_abort(self, epoch: int) -> None:
        reason = self.aborted.get(epoch)
        if reason is not None:
            raise BlockAborted(reason)

    def send(self, address: str, epoch: int, iteration: int, phase: str, payload: tuple) -> None:
        """Send a message (in the background); ``payload``'s arrays must stay unchanged until
        :meth:`flush` returns."""
        msg = {
            "run": self.run,
            "epoch": epoch,
            "iteration": iteration,
            "phase": phase,
            "sender": self.me,
            "payload": tuple(pack(p) for p in payload),
        }
        self.pending.append(asyncio.ensure_future(self._send(address, msg)))

    async def _send(self, address: str, msg: dict[str, Any]) -> None:
        try:
            await self.post(address, msg)
        except Exception as exc:  # a peer that is gone or cannot be reached
            # a send of an aborted block, failing late: not this block's
            if msg["epoch"] != self.epoch:
                return
            if self.send_error is None:
                what = PHASE_NAMES.get(msg["phase"][:1], msg["phase"])
                self.send_error = (
                    f"worker {self.address} could not send {what} data of iteration "
                    f"{msg['iteration']} to {address}: {type(exc).__name__}: {exc}"
                )
            self._wake(PeerError(self.send_error))

    async def flush(self, timeout: float, epoch: int | None = None) -> None:
        """Wait until every message sent so far has been written (its buffers may then be reused).

        An abort of block ``epoch`` ends the wait at once (:class:`BlockAborted`): a send to a
        peer that has just left retries its connection until Dask's connect timeout (30 s), and
        the block must not hold its worker that long. The send goes
        on in the background; its late failure is not charged to a later block.
        """
        if self.pending:
            pending: set[asyncio.Future] = set(self.pending)
            self.pending = []
            deadline = time.monotonic() + timeout
            while pending:
                if epoch is not None:
                    self.check_abort(epoch)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise PeerError(
                        f"worker {self.address}: {len(pending)} message(s) could not be "
                        f"written within {timeout:g} s"
                    )
                # all written: returns at once; else look at the abort flag every 0.1 s
                _, pending = await asyncio.wait(pending, timeout=min(left, 0.1))
        if self.send_error is not None:
            raise PeerError(self.send_error)

    async def receive(
        self,
        epoch: int,
        iteration: int,
        phase: str,
        senders: list[int],
        deadline: float,
        names: dict[int, str],
        timeout: float,
    ) -> dict[int, Any]:
        """The payloads of ``senders`` for one phase; raises if aborted, a send failed or the
        deadline passed (``names``: the senders' addresses, ``timeout``: the setting, for the
        message)."""
        keys = [(epoch, iteration, phase, s) for s in senders]
        if not all(k in self.slots for k in keys):
            self.check_abort(epoch)
            if self.send_error is not None:
                raise PeerError(self.send_error)
            fut = asyncio.get_running_loop().create_future()
            self._waiting = (keys, fut)
            try:
                await asyncio.wait_for(fut, max(deadline - time.monotonic(), 0.0))
            except TimeoutError:
                missing = [k[3] for k in keys if k not in self.slots]
                who = ", ".join(f"worker {w} ({names.get(w, '?')})" for w in missing)
                what = PHASE_NAMES.get(phase[:1], phase)
                raise PeerError(
                    f"worker {self.address} received no {what} data of iteration {iteration} "
                    f"from {who} within {timeout:g} s (rpm.engine.receive-timeout)"
                ) from None
            finally:
                self._waiting = None
        return {k[3]: self.slots.pop(k) for k in keys}
