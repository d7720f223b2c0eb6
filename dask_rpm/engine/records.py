"""Records of the engine: what the driver sends its workers and what they send back.

Named tuples rather than positional tuples: they cross process boundaries (msgpack turns
them into lists; ``Record(*row)`` restores them) and every reader names the field it wants.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..nn.backend import Placement
from ..nn.recipe import Recipe

__all__ = [
    "RunSpec",
    "BandGroup",
    "BlockResult",
    "BlockSpec",
    "Checkpoint",
    "CopyReport",
    "Layout",
    "Peer",
    "TimingRecord",
]


class TimingRecord(NamedTuple):
    """One worker's clock readings for one iteration (``time.monotonic``, seconds).

    All readings of a record come from one worker's clock, so differences
    between them are exact on any cluster; records of different workers are
    never subtracted from each other.
    """

    iteration: int
    worker: int
    forward_start: float
    forward_end: float
    backward_start: float
    backward_end: float
    modify_start: float
    modify_end: float

    @property
    def phases(self) -> tuple[float, float, float, float, float]:
        """Seconds in each of :data:`dask_rpm.records.PHASES`."""
        return (
            self.forward_end - self.forward_start,
            self.backward_start - self.forward_end,
            self.backward_end - self.backward_start,
            self.modify_start - self.backward_end,
            self.modify_end - self.modify_start,
        )


class Peer(NamedTuple):
    """Another worker of the plan as one worker sees it."""

    worker: int
    address: str
    rows: tuple[int, int]
    """Hidden rows: a column member's own rows, or (horizontal partner) the overlap with ours."""


class BandGroup(NamedTuple):
    """A horizontal allreduce: the bands whose holders are the same workers (one per column).

    ``rows`` are the bands (hidden-unit ranges, top to bottom); every holder
    contributes its weight-update rows of them and gets their sums.
    ``algorithm`` is one of :data:`dask_rpm.comm.exchange.ALGORITHMS`.
    """

    holders: tuple[int, ...]  # left to right (column order)
    addresses: tuple[str, ...]  # of the holders, same order
    rows: tuple[tuple[int, int], ...]
    algorithm: str


class Layout(NamedTuple):
    """What one worker needs to know of a plan to run its rectangle.

    ``members`` is its column top to bottom (itself included); ``partners[c]``
    the workers of column ``c`` whose rows overlap its own, top to bottom, with
    the overlap (empty for its own column). ``vertical`` names the algorithm
    of the in-column exchange (``"allgather"``, ``"leader"`` or a schedule of
    :mod:`dask_rpm.comm.exchange`). ``horizontal`` is ``"pairwise"`` (one message
    to each overlapping partner) or ``"groups"``: one allreduce per entry of
    ``bands`` (the groups of bands this worker holds).
    """

    run: str
    version: int
    worker: int
    address: str
    shape: tuple[int, int, int]
    column: int
    n_columns: int
    samples: tuple[int, int]
    rows: tuple[int, int]
    members: tuple[Peer, ...]
    partners: tuple[tuple[Peer, ...], ...]
    vertical: str
    leader: int
    horizontal: str = "pairwise"
    bands: tuple[BandGroup, ...] = ()
    hidden: tuple[int, ...] = ()
    """Units of every hidden layer as planned (empty: one layer of ``shape[1]``)."""

    @property
    def n_hidden(self) -> int:
        return self.rows[1] - self.rows[0]

    @property
    def n_samples(self) -> int:
        return self.samples[1] - self.samples[0]


class BlockSpec(NamedTuple):
    """The driver's order for one block of iterations (the same for every worker)."""

    epoch: int
    first: int
    count: int  # type: ignore[assignment]  # a field named like tuple.count; the wire format names it
    learning_rate: float
    target_error: float | None
    receive_timeout: float
    report_seconds: float
    threads: int = (
        0  # BLAS/OpenMP threads of the kernels; 0: each worker's nthreads (rpm.engine.threads)
    )
    #: buddy copies (dask_rpm.engine.buddies): a copy before every iteration k with k % R == 0
    #: (and before the first iteration of a new plan); 0: none
    copy_every: int = 0
    #: each worker's buddy (by worker index; None: none), who keeps its copies
    buddies: tuple[str | None, ...] = ()
    #: own copies of iterations before this one may be dropped (no buddy holds them any more)
    keep_from: int = 0
    #: False: an evaluation (:mod:`dask_rpm.engine.objective`): no optimizer step; the summed
    #: gradient is left in the worker's ``RunState.gradient``
    step: bool = True


class CopyReport(NamedTuple):
    """What a worker's buddy copies stand at, at the end of a block (:mod:`dask_rpm.engine.copies`)."""

    acked: int  # the latest iteration whose copy its buddy has (-1: none yet)
    nbytes: int  # bytes of copies it holds: its own and those it keeps for others
    taken: int  # copies of its rows taken so far
    sent: int  # ... of them that reached its buddy
    skipped: int  # ... not sent because the one before was still on its way
    copy_seconds: float  # the latest copy's time on the training path (the snapshot)
    send_seconds: float = 0.0  # the latest completed send's wall time (serialised, sent, kept)


class BlockResult(NamedTuple):
    """What a worker's block task returns.

    ``status`` is how the block ended: ``ok`` (all iterations done), ``target`` (the
    error reached the target error; stopped after that iteration's update), ``diverged`` (a
    non-finite error or weights; stopped before the update), ``aborted`` (the driver aborted
    the block) or ``failed`` (a peer did not answer in time or could not be reached;
    ``message`` says which). ``stop`` is the number of iterations done when the block ended (the next
    iteration to run); ``errors`` the total error of each iteration of the
    block that ran its forward pass (identical on every worker); ``finite``
    whether the worker's weights after the block are finite; ``threads`` the
    BLAS threads its kernels ran with; ``backend`` where they ran (``numpy``, ``torch-cpu``,
    ``torch-cuda``, ...: :attr:`dask_rpm.nn.backend.Backend.label`).
    """

    worker: int
    status: str
    stop: int
    errors: dict[int, float]
    records: list[TimingRecord]
    finite: bool
    message: str = ""
    threads: int = 1
    backend: str = "numpy"
    copies: CopyReport | None = None


class Checkpoint(NamedTuple):
    """The last weights held on the client (the recovery point when no column holds lost rows)."""

    iteration: int
    params: tuple[np.ndarray, ...]
    """The whole parameters ``W_1 .. W_L, V`` (augmented, as planned)."""
    state: dict[str, list[np.ndarray]] | None = None
    """Optimizer state ``{slot: [one array per parameter]}``; None: zero (the start of training)."""


class RunSpec(NamedTuple):
    """What every worker of a run is told once, when it sets up: what it computes, in which
    dtype, where its kernels run and the engine settings it follows. The driver builds it from
    the options resolved on the client; no worker reads them from its own configuration (but
    ``rpm.engine.cpu-backend``, which is per node type by design: :func:`dask_rpm.nn.backend.resolve`)."""

    run: str
    recipe: Recipe
    dtype: str
    placement: Placement
    #: the largest kernels (flop equivalents per iteration) run on the worker's event loop on a
    #: CPU, on a GPU and on an EMULATED worker (rpm.engine.inline-work*)
    inline_work: tuple[float, float, float] = (3e8, 1e11, 2e7)
