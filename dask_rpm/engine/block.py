"""The block loop: one worker's iterations of batch BP, exchanging with its peers directly.

Runs inside one Dask task per worker per block (:func:`dask_rpm.engine.tasks.t_block`).
Per iteration::

    forward      f_i = sigma(x_c W_i^T), p_i = f_i V_i^T              (paced: EMULATED speed)
    vertical     partials of the column summed in column order -> u; output deltas, column error
    backward     dW_i, dV_i over the column's samples                 (paced)
    horizontal   rows of dW_i, dV_i that overlap each worker of the other columns go to it;
                 the received rows are summed in column order          -> sum dW, sum dV of my rows
    modify       one optimizer step on my rows from sum dW, sum dV       (sgd: W_i -= eps * sum dW)

With mini-batches the column's rows of each iteration come from
:class:`~dask_rpm.engine.samples.ColumnData` (its share of the batch).

Several hidden layers: a worker holds its rows of every layer (:mod:`dask_rpm.nn.layers`),
and forward and backward go layer by layer, the column's members exchanging the
layer's activations and deltas between layers; the vertical and horizontal exchanges are
the same, over every parameter. Every exchange is a named collective of
:mod:`dask_rpm.comm.collectives`.

Every holder of a row sums the same numbers in the same order, so the
replicas of a row stay bit-identical and the result equals serial BP to
rounding. The column errors ride along with the horizontal messages, so
every worker knows the total error of every iteration (identical bits) and
all of them take the same decision to stop: divergence (a non-finite error
or non-finite weights, before the update) or a reached target error (after
it). Each worker also tells its column whether its weights are finite.

Arrays live on the worker's backend (:mod:`~dask_rpm.nn.backend`: numpy, or torch / cupy on
a CPU or a GPU). Messages travel from host memory: a received array is placed on the backend
when its sum is formed on the worker's own arrays, and the scheduled allreduces sum in host
buffers, staged once per iteration each way.

The loop is a coroutine on the worker's event loop (see
:mod:`dask_rpm.engine.worker`); its messages go through the run's mailbox
(:mod:`dask_rpm.comm.mailbox`), so this module does not import ``distributed``.
"""

from __future__ import annotations

import math
import time
from typing import Any, NamedTuple

import numpy as np

from ..comm.collectives import (
    Channel,
    column_allgather,
    column_reduce,
    column_reduce_scatter,
    row_allreduce,
)
from ..comm.mailbox import BlockAborted, PeerError
from ..nn import backend as xb
from ..nn.kernels import layer_work, rectangle_work
from ..nn.optim import penalty
from ..runtime.hooks import worker_hooks
from .records import BlockResult, BlockSpec, TimingRecord

__all__ = ["run_block"]


def _with_penalty(lay: Any, err: float, pen: float) -> float:
    """The column's error plus the L2 penalty of the whole network (summed over the column's
    members, who hold every row between them) in column 0 only: counted once in the total."""
    return err + pen if lay.column == 0 and pen else err


class _Reporter:
    """Streams timing records and errors to the scheduler plugin, at most every ``seconds``."""

    def __init__(self, log: Any, run: str, seconds: float) -> None:
        self.log, self.run, self.seconds = log, run, seconds
        self.records: list[tuple] = []
        self.errors: list[tuple[int, float]] = []
        self.last = time.monotonic()

    def add(self, rec: TimingRecord, it: int, error: float) -> None:
        self.records.append(tuple(rec))
        self.errors.append((it, error))
        if time.monotonic() - self.last >= self.seconds:
            self.flush()

    def flush(self) -> None:
        if self.records and self.log is not None:
            self.log(
                {
                    "kind": "iterations",
                    "run": self.run,
                    "records": self.records,
                    "errors": self.errors,
                }
            )
        self.records, self.errors = [], []
        self.last = time.monotonic()


def _column_total(col_errors: list[float]) -> float:
    """The iteration's error: the columns' errors added in column order, the same on every
    worker (a fixed order of float additions, so every worker sees the same number)."""
    total = 0.0
    for e in col_errors:
        total += e
    return total


class _Local(NamedTuple):
    """What :meth:`_Kernels.local` did: the clock readings of the timing record, the column's
    error, whether its weights are finite, the update sums, and whether (and when) it stepped."""

    forward_start: float
    forward_end: float
    backward_start: float
    backward_end: float
    error: float
    finite: bool
    grads: list[Any]
    stepped: bool
    modify_start: float
    modify_end: float


class _Kernels:
    """One block's kernels on this worker's shard, each padded to its EMULATED speed (a no-op
    on a worker that emulates none)."""

    def __init__(self, state: Any, spec: BlockSpec) -> None:
        self.ws, self.shard, self.spec = state.kernels(), state.shard, spec
        self.layout = state.layout
        self.recipe = state.recipe
        self.opt = state.recipe.optimizer
        self.layers = state.shard.layers
        self.units = self.layers.units(state.layout.rows)
        # the worker's hooks (dask_rpm.runtime.hooks): a no-op on a real worker, the EMULATED speed's
        # padding where the emulation put it
        self.pace = worker_hooks(state.worker).pace
        # each parameter's bias column (local; None: not held), left out of the L2 penalty
        self.biases = self.layers.bias_columns(state.layout.rows, self.recipe.net.bias)
        self.dtype = state.data.dtype
        # a GPU's kernels return once queued: wait for them, so that the timing records (and
        # DRPM's speeds) measure the compute, not the launch
        self.gpu = state.shard.backend.device != "cpu"
        # layer by layer (a deep network in a column of several): the exchanges between layers
        # wait on the column's slowest member, so the kernels' own seconds are summed here, and
        # the timing record's compute phases are those (DRPM's speeds must not be the wait's)
        self.layered = self.layers.depth > 1 and len(state.layout.members) > 1
        self.spent = 0.0

    def penalty(self) -> float:
        """My rows' share of the L2 penalty ``0.5 alpha sum W^2`` (0.0 without one): the sum the
        last step left (:meth:`Shard.update <dask_rpm.engine.worker.Shard.update>`, while the
        new weights were in the cache), else summed here (a block's first iteration)."""
        alpha = self.recipe.alpha
        if not alpha:
            return 0.0
        if math.isnan(self.shard.squares):
            self.shard.squares = penalty(self.shard.params, self.biases)
        return 0.5 * alpha * self.shard.squares

    def _work(self, kind: str, s: int, k: int | None = None) -> float:
        if k is None:
            return rectangle_work(kind, s, self.units, self.layers)
        return layer_work(kind, k, s, self.units, self.layers)

    def _done(self, out: Any) -> Any:
        if self.gpu:
            xb.synchronize(self.shard.params[0])
        return out

    def inline(self, rows: int, inline_work: float) -> bool:
        """Whether an iteration's kernels are small enough for the event loop."""
        return self._work("forward", rows) + self._work("backward", rows) <= inline_work

    def forward(self, it: int, x: np.ndarray) -> np.ndarray:
        """Every layer (this worker holds all units of its column); the partial product."""
        s = x.shape[0]
        with self.pace(it, ("forward", s, self.units), self._work("forward", s), self.dtype):
            return self._done(self.ws.forward(x, self.shard.params))

    def backward(self, it: int, x: np.ndarray, delta2: np.ndarray) -> list[np.ndarray]:
        s = x.shape[0]
        with self.pace(it, ("backward", s, self.units), self._work("backward", s), self.dtype):
            return self._done(self.ws.backward(x, self.shard.params, delta2))

    def layer_forward(self, it: int, k: int, inp: np.ndarray) -> np.ndarray:
        """Hidden layer ``k``'s outputs of my units; at the last layer, the partial product."""
        s, ws, params, t0 = inp.shape[0], self.ws, self.shard.params, time.monotonic()
        with self.pace(it, ("forward", k, s, self.units), self._work("forward", s, k), self.dtype):
            f = ws.layer_forward(k, inp, params)
            out = self._done(ws.output_partial(params) if k == self.layers.depth - 1 else f)
        self.spent += time.monotonic() - t0
        return out

    def layer_backward(
        self, it: int, k: int, inp: np.ndarray, delta2: np.ndarray
    ) -> np.ndarray | None:
        """Layer ``k``'s update sum (after ``V``'s at the last layer); my part of the gradient
        for its whole input (``k >= 1``)."""
        s, ws, params, t0 = inp.shape[0], self.ws, self.shard.params, time.monotonic()
        with self.pace(
            it, ("backward", k, s, self.units), self._work("backward", s, k), self.dtype
        ):
            if k == self.layers.depth - 1:
                ws.output_backward(params, delta2)
            out = self._done(ws.layer_backward(k, inp, params))
        self.spent += time.monotonic() - t0
        return out

    def local(self, it: int, x: np.ndarray, d: np.ndarray, step: bool) -> _Local:
        """A column of one's iteration up to the update sums, in one call: forward, the output
        deltas and the error (with my penalty: I hold every row), backward; with ``step`` (a
        plan of one column, whose sums are the total) the update too where the error and the
        weights are finite - one hand-off to the compute thread per iteration, not three."""
        t_f0 = time.monotonic()
        partial = self.forward(it, x)
        t_f1 = time.monotonic()
        delta2, err = self.ws.output_delta(partial, d)
        err = _with_penalty(self.layout, err, self.penalty())
        ok = self.shard.finite
        t_b0 = time.monotonic()
        grads = self.backward(it, x, delta2)
        t_b1 = time.monotonic()
        stepped = step and ok and math.isfinite(err)
        if stepped:
            self.modify(it, grads)
        return _Local(t_f0, t_f1, t_b0, t_b1, err, ok, grads, stepped, t_b1, time.monotonic())

    def modify(self, it: int, sums: list[np.ndarray]) -> None:
        # run where forward and backward run (the compute thread for large work), so that an
        # EMULATED worker's padding of the update does not hold its event loop either; no
        # handler touches the shard during a block (rpm_rows serves remaps, between blocks)
        with self.pace(it, ("modify", self.shard.params[0].shape)):
            rec = self.recipe
            mean = rec.alpha or rec.reduction == "mean"
            self.shard.update(
                sums,
                self.spec.learning_rate,
                self.opt,
                it + 1,
                batch=rec.divisor(it) if mean else None,
                alpha=rec.alpha,
                biases=self.biases,
            )
            self._done(None)


async def _forward(
    ch: Channel, state: Any, k: _Kernels, it: int, x: np.ndarray, inline: bool
) -> np.ndarray:
    """The forward pass to the partial product: all layers at once where this worker holds all
    units of its column's layers, else layer by layer with the column's activations gathered."""
    if k.layers.depth == 1 or len(state.layout.members) == 1:
        return await state.compute(inline, k.forward, it, x)
    inp = x
    for j in range(k.layers.depth):
        out = await state.compute(inline, k.layer_forward, it, j, inp)
        if j < k.layers.depth - 1:
            inp = await column_allgather(ch, it, j, out, k.ws.full(j))
    return out


async def _backward(
    ch: Channel, state: Any, k: _Kernels, it: int, x: np.ndarray, delta2: np.ndarray, inline: bool
) -> list[np.ndarray]:
    """The update sums of my rows of every parameter; layer by layer, with the column's deltas
    summed between layers, where the forward pass went layer by layer."""
    if k.layers.depth == 1 or len(state.layout.members) == 1:
        return await state.compute(inline, k.backward, it, x, delta2)
    for j in range(k.layers.depth - 1, -1, -1):
        inp = k.ws.full(j - 1) if j else x
        g = await state.compute(inline, k.layer_backward, it, j, inp, delta2)
        if g is not None:
            await column_reduce_scatter(ch, it, j, g, k.ws.delta(j - 1))
    return k.ws.grads


async def _exchanged(
    ch: Channel, state: Any, k: _Kernels, it: int, x: np.ndarray, d: np.ndarray, inline: bool
) -> _Local:
    """A column of several's iteration up to the update sums: forward to the partial product,
    the column's sum of the partials with the output deltas and the column error, backward
    (the step is left to :func:`_modify`, after the horizontal exchange)."""
    lay = state.layout
    t_f0, k.spent = time.monotonic(), 0.0
    partial = await _forward(ch, state, k, it, x, inline)
    t_f1 = t_f0 + k.spent if k.layered else time.monotonic()

    def finish(u: Any, pen: float) -> tuple[Any, float]:
        delta2, err = k.ws.output_delta(u, d)
        return delta2, _with_penalty(lay, err, pen)

    delta2, err, ok = await column_reduce(
        ch, it, partial, k.ws.u, state.shard.finite, k.penalty(), finish, ch.deadline()
    )
    t_b0, k.spent = time.monotonic(), 0.0
    grads = await _backward(ch, state, k, it, x, delta2, inline)
    t_b1 = t_b0 + k.spent if k.layered else time.monotonic()
    return _Local(t_f0, t_f1, t_b0, t_b1, err, ok, grads, False, math.nan, math.nan)


async def _modify(
    state: Any, spec: BlockSpec, k: _Kernels, it: int, summed: Any, loc: _Local, inline: bool
) -> tuple[float, float]:
    """The iteration's step on my rows from the summed updates (or, for an evaluation, the
    summed gradient kept as the result); the clock readings of the modify phase."""
    if loc.stepped:  # (the step ran with the kernels)
        return loc.modify_start, loc.modify_end
    t_m0 = time.monotonic()
    if spec.step:
        await state.compute(inline, k.modify, it, summed)
    else:  # an evaluation (engine.objective): the summed gradient is the result
        state.gradient = summed
    return t_m0, time.monotonic()


async def run_block(
    state: Any, spec: BlockSpec, log: Any = None, inline_work: float = 2e7
) -> BlockResult:
    """Run iterations ``spec.first`` .. ``spec.first + spec.count - 1`` on this worker.

    ``log(msg)`` streams progress (the worker's ``log_event``); None: silent.
    Kernels of at most ``inline_work`` flop equivalents per iteration run on
    the event loop, larger ones in the run's compute thread.
    """
    lay = state.layout
    if state.iteration != spec.first:
        raise RuntimeError(
            f"block starts at iteration {spec.first} but worker {lay.address} is at {state.iteration}"
        )
    mailbox, data, shard = state.mailbox, state.data, state.shard
    mailbox.begin(spec.epoch)
    ch = Channel(mailbox, lay, shard.backend, shard.layers, spec.epoch, spec.receive_timeout)
    shard.snapshot(spec.first)
    k = _Kernels(state, spec)
    inline = k.inline(data.capacity, inline_work)

    # scratch for the summed updates (one column: the worker's own updates are the sums)
    sums = [shard.backend.ns.empty_like(p) for p in shard.params] if lay.n_columns > 1 else None
    reporter = _Reporter(log, state.run, spec.report_seconds)
    records: list[TimingRecord] = []
    errors: dict[int, float] = {}
    status, message = "ok", ""
    copy = _copier(state, spec)
    # a column of one has no vertical exchange: its partial product is the column's sum; in a
    # plan of one column too (solo), its update sums are the total and it steps at once
    lone = len(lay.members) == 1
    solo = lone and lay.n_columns == 1
    try:
        for it in range(spec.first, spec.first + spec.count):
            mailbox.check_abort(spec.epoch)
            # last iteration's messages are out: buffers are free
            await mailbox.flush(spec.receive_timeout, spec.epoch)
            copy(it)
            if not data.ready(it):  # a new epoch of mini-batches: this column's rows of it
                await state.compute(False, data.load, it)  # (off the event loop)
            x, d = data.batch(it)
            if lone:  # forward to update sums (and the step) in one call: no exchange waits
                loc = await state.compute(inline, k.local, it, x, d, solo and spec.step)
            else:
                loc = await _exchanged(ch, state, k, it, x, d, inline)
            t_f0, t_f1, t_b0, t_b1, err, ok, grads = loc[:7]
            summed, col_errors, ok = await row_allreduce(
                ch, it, grads, sums, err, ok, ch.deadline()
            )
            total = _column_total(col_errors)
            if not ok or not math.isfinite(total):
                status = "diverged"
                break
            errors[it] = total
            t_m0, t_m1 = await _modify(state, spec, k, it, summed, loc, inline)
            state.iteration = it + 1
            rec = TimingRecord(it, lay.worker, t_f0, t_f1, t_b0, t_b1, t_m0, t_m1)
            records.append(rec)
            reporter.add(rec, it, total)
            if spec.target_error is not None and total <= spec.target_error:
                status = "target"
                break
        await mailbox.flush(spec.receive_timeout, spec.epoch)
    except BlockAborted as exc:
        status, message = "aborted", str(exc)
    except PeerError as exc:
        status, message = "failed", str(exc)
    reporter.flush()
    report = state.copies.report() if state.copies is not None else None
    return BlockResult(
        lay.worker, status, state.iteration, errors, records, shard.finite, message, copies=report
    )


def _copier(state: Any, spec: BlockSpec) -> Any:
    """``copy(it)``: this worker's buddy copy before iteration ``it`` where one is due
    (:mod:`dask_rpm.engine.copies`); every worker copies at the same iterations, so the copies
    of an iteration fit together."""
    copies, lay = state.copies, state.layout
    if copies is None or not spec.copy_every:
        return lambda it: None
    copies.keep_from(spec.keep_from)
    buddy = spec.buddies[lay.worker] if lay.worker < len(spec.buddies) else None

    def copy(it: int) -> None:
        if copies.due(it, spec.copy_every, lay.version):
            copies.take(it, lay.version, lay.rows, state.shard, buddy)

    return copy
