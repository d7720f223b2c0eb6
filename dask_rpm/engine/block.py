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
layer's activations and deltas between layers (:mod:`dask_rpm.engine.column`); the
vertical and horizontal exchanges are the same, over every parameter.

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
:mod:`dask_rpm.engine.worker`); the exchanges only need ``state.send``,
``state.receive`` and ``state.flush``, so this module does not import
``distributed``.
"""

from __future__ import annotations

import math
import time
from typing import Any, NamedTuple

import numpy as np

from ..comm.exchange import Schedule, WorkerStep, apply_received, build, worker_steps
from ..nn import backend as xb
from ..nn.kernels import layer_work, rectangle_work
from ..nn.optim import mean_gradient, penalty
from ..runtime.hooks import worker_hooks
from .column import gather_activations, scatter_deltas
from .errors import BlockAborted, PeerError
from .records import BlockResult, BlockSpec, TimingRecord

__all__ = ["run_block"]


class _Exchange:
    """One block's view of the messages: deadline, names, epoch, and the schedules it runs."""

    def __init__(self, state: Any, spec: BlockSpec) -> None:
        self.state = state
        self.epoch = spec.epoch
        self.timeout = spec.receive_timeout
        lay = state.layout
        self.names = {p.worker: p.address for p in lay.members}
        for col in lay.partners:
            self.names.update({p.worker: p.address for p in col})
        for g in lay.bands:
            self.names.update(zip(g.holders, g.addresses))
        # (algorithm, holders, size) -> this worker's steps; a mini-batch's column share
        # can change size between iterations, so schedules are built per size, once
        self._steps: dict[tuple[str, tuple[int, ...], int], tuple[Schedule, list[WorkerStep]]] = {}

    def steps(
        self, algorithm: str, holders: tuple[int, ...], size: int
    ) -> tuple[Schedule, list[WorkerStep]]:
        key = (algorithm, holders, size)
        if key not in self._steps:
            sched = build(algorithm, holders, size)
            self._steps[key] = (sched, worker_steps(sched, self.state.layout.worker))
        return self._steps[key]

    def deadline(self) -> float:
        return time.monotonic() + self.timeout

    def send(self, address: str, it: int, phase: str, payload: tuple) -> None:
        self.state.send(address, self.epoch, it, phase, payload)

    async def receive(
        self, it: int, phase: str, senders: list[int], deadline: float, place: bool = True
    ) -> dict[int, Any]:
        """The payloads of ``senders``; with ``place`` their arrays on this worker's backend
        (else in host memory, as they arrived)."""
        got = await self.state.receive(
            self.epoch, it, phase, senders, deadline, self.names, self.timeout
        )
        be = self.state.shard.backend
        if not place or be.name == "numpy":
            return got
        return {
            w: tuple(be.asarray(p) if isinstance(p, np.ndarray) else p for p in payload)
            for w, payload in got.items()
        }


class _Allreduce(NamedTuple):
    """One allreduce of a flat buffer by a schedule of :mod:`dask_rpm.comm.exchange`."""

    tag: str  # phase prefix of its messages: round r is phase f"{tag}{r}"
    buffer: np.ndarray
    schedule: Schedule
    steps: list[WorkerStep]


async def _allreduce(ex: _Exchange, it: int, runs: list[_Allreduce], deadline: float) -> None:
    """Run allreduces side by side, round by round; each buffer ends as the sum, on every holder.

    A round's slices are sent as they are when the round starts (copies: the
    buffer changes when the round's receives are applied). Rounds advance in
    lock step over all ``runs``: every round-``r`` message is sent before any
    round-``r`` receive is awaited, so no holder waits on a message its
    sender can only send later - the exchange cannot deadlock.
    """
    me = ex.state.layout.worker
    steps = [{st.round: st for st in run.steps} for run in runs]
    last = max((st.round for run in runs for st in run.steps), default=-1)
    for r in range(last + 1):
        for run, by_round in zip(runs, steps):
            st = by_round.get(r)
            if st is not None:
                for t in st.sends:
                    ex.send(ex.names[t.dst], it, f"{run.tag}{r}", (run.buffer[t.lo : t.hi],))
        for run, by_round in zip(runs, steps):
            st = by_round.get(r)
            if st is None or not st.receives:
                continue
            senders = [t.src for t in st.receives]
            got = await ex.receive(it, f"{run.tag}{r}", senders, deadline, place=False)
            payloads = {t: got[t.src][0] for t in st.receives}
            apply_received(run.buffer, me, st, payloads, run.schedule.holders)


async def _vertical_scheduled(
    ex: _Exchange,
    it: int,
    partial: np.ndarray,
    ws: Any,
    d: np.ndarray,
    finite: bool,
    pen: float,
    deadline: float,
) -> tuple[np.ndarray, float, bool]:
    """The vertical exchange by a schedule: partials, penalties and a "not finite" count summed
    together."""
    lay = ex.state.layout
    host = xb.to_host(partial)
    size = host.size + 2
    buf = np.empty(size, dtype=host.dtype)
    buf[:-2] = host.ravel()
    buf[-2] = pen
    buf[-1] = 0.0 if finite else 1.0  # sums exactly: the number of members with bad weights
    sched, steps = ex.steps(lay.vertical, tuple(p.worker for p in lay.members), size)
    await _allreduce(ex, it, [_Allreduce("v", buf, sched, steps)], deadline)
    u = ws.u
    xb.copyto(u, buf[:-2].reshape(tuple(u.shape)))
    delta2, err = ws.output_delta(u, d)
    return delta2, _with_penalty(lay, err, float(buf[-2])), bool(buf[-1] == 0)


def _with_penalty(lay: Any, err: float, pen: float) -> float:
    """The column's error plus the L2 penalty of the whole network (summed over the column's
    members, who hold every row between them) in column 0 only: counted once in the total."""
    return err + pen if lay.column == 0 and pen else err


async def _vertical(
    ex: _Exchange,
    it: int,
    partial: np.ndarray,
    ws: Any,
    d: np.ndarray,
    finite: bool,
    pen: float,
    deadline: float,
) -> tuple[np.ndarray, float, bool]:
    """Output deltas, column error and "every member's weights are finite" for iteration ``it``.

    ``pen`` is this worker's share of the L2 penalty (0 without one); the column's
    error includes the whole network's in column 0 (:func:`_with_penalty`).
    """
    lay = ex.state.layout
    me = lay.worker
    others = [p for p in lay.members if p.worker != me]
    if not others:
        delta2, err = ws.output_delta(partial, d)
        return delta2, _with_penalty(lay, err, pen), finite
    if lay.vertical not in ("allgather", "leader"):
        return await _vertical_scheduled(ex, it, partial, ws, d, finite, pen, deadline)
    if lay.vertical == "leader" and me != lay.leader:
        leader = next(p for p in lay.members if p.worker == lay.leader)
        ex.send(leader.address, it, "v", (partial, finite, pen))
        ((delta2, err, ok),) = (await ex.receive(it, "vd", [lay.leader], deadline)).values()
        return delta2, float(err), bool(ok)
    if lay.vertical == "leader":
        got = await ex.receive(it, "v", [p.worker for p in others], deadline)
    else:  # allgather: everyone sends to everyone, everyone sums
        for p in others:
            ex.send(p.address, it, "v", (partial, finite, pen))
        got = await ex.receive(it, "v", [p.worker for p in others], deadline)
    u = ws.u
    ok = finite
    total_pen = 0.0
    for i, p in enumerate(lay.members):  # column order: identical bits on every member
        part, flag, share = (partial, finite, pen) if p.worker == me else got[p.worker]
        ok = ok and bool(flag)
        total_pen += share
        if i == 0:
            xb.copyto(u, part)
        else:
            u += part
    delta2, err = ws.output_delta(u, d)
    err = _with_penalty(lay, err, total_pen)
    if lay.vertical == "leader":
        for p in others:
            ex.send(p.address, it, "vd", (delta2, err, ok))
    return delta2, err, ok


async def _horizontal(
    ex: _Exchange,
    it: int,
    grads: list[np.ndarray],
    sums: list[np.ndarray] | None,
    err: float,
    ok: bool,
    deadline: float,
) -> tuple[list[np.ndarray], list[float], bool]:
    """Sum the weight updates of my rows over all columns; every column's error and status."""
    lay = ex.state.layout
    if lay.n_columns == 1 or sums is None:
        return grads, [err], ok
    if lay.horizontal == "groups":
        return await _horizontal_groups(ex, it, grads, sums, err, ok, deadline)
    layers, m0 = ex.state.shard.layers, lay.rows[0]
    for col in lay.partners:
        for p in col:
            # views: the send copies them (dask_rpm.engine.worker)
            ex.send(p.address, it, "h", (*layers.views(grads, p.rows, m0), err, ok))
    senders = [p.worker for col in lay.partners for p in col]
    got = await ex.receive(it, "h", senders, deadline)
    k = len(grads)
    errors, all_ok = [], True
    for c, col in enumerate(lay.partners):  # column order: identical bits on every holder of a row
        if c == lay.column:
            pieces = [(lay.rows, grads)]
            col_err, col_ok = err, ok
        else:
            pieces = []
            for p in col:
                msg = got[p.worker]
                pieces.append((p.rows, msg[:k]))
                col_err, col_ok = msg[k], msg[k + 1]
        for rows, piece in pieces:
            for view, g in zip(layers.views(sums, rows, m0), piece):
                if c == 0:
                    xb.copyto(view, g)
                else:
                    view += g
        errors.append(float(col_err))
        all_ok = all_ok and bool(col_ok)
    return sums, errors, all_ok


async def _horizontal_groups(
    ex: _Exchange,
    it: int,
    grads: list[np.ndarray],
    sums: list[np.ndarray],
    err: float,
    ok: bool,
    deadline: float,
) -> tuple[list[np.ndarray], list[float], bool]:
    """The horizontal exchange by schedules: one allreduce per group of bands I hold.

    A group's buffer packs, parameter by parameter, its bands' rows of that
    parameter's update, then one slot per column for its error and one for
    "its weights are not finite" - zero but in the sender's own column's
    slot, so the sums carry every column's error unchanged (adding zeros is
    exact) and every worker learns all of them from any one of its groups.
    """
    lay = ex.state.layout
    layers, C, m0 = ex.state.shard.layers, lay.n_columns, lay.rows[0]
    runs = []
    for group in lay.bands:
        # staged through host memory: the allreduce sums host buffers
        pieces = [[xb.to_host(v) for v in layers.views(grads, band, m0)] for band in group.rows]
        size = sum(v.size for views in pieces for v in views)
        buf = np.zeros(size + 2 * C, dtype=pieces[0][0].dtype)
        at = 0
        for i in range(len(grads)):  # one parameter after another, its bands top to bottom
            for views in pieces:
                v = views[i]
                buf[at : at + v.size] = v.ravel()
                at += v.size
        buf[at + lay.column] = err
        buf[at + C + lay.column] = 0.0 if ok else 1.0
        sched, steps = ex.steps(group.algorithm, group.holders, buf.size)
        # tagged by the group's first row: the same on every holder (an index into my own
        # groups would not be - holders hold different sets of groups)
        runs.append(_Allreduce(f"h{group.rows[0][0]}.", buf, sched, steps))
    await _allreduce(ex, it, runs, deadline)
    for run, group in zip(runs, lay.bands):
        buf, at = run.buffer, 0
        targets = [layers.views(sums, band, m0) for band in group.rows]
        for i in range(len(sums)):
            for views in targets:
                v = views[i]
                n = math.prod(v.shape)
                xb.copyto(v, buf[at : at + n].reshape(tuple(v.shape)))
                at += n
    tail = runs[0].buffer[-2 * C :]
    return sums, [float(e) for e in tail[:C]], not bool(np.any(tail[C:] != 0))


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


class _Kernels:
    """One block's kernels on this worker's shard, each padded to its EMULATED speed (a no-op
    on a worker that emulates none)."""

    def __init__(self, state: Any, spec: BlockSpec) -> None:
        self.ws, self.shard, self.spec = state.kernels(), state.shard, spec
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
        """My rows' share of the L2 penalty ``0.5 alpha sum W^2`` (0.0 without one)."""
        alpha = self.recipe.alpha
        if not alpha:
            return 0.0
        return 0.5 * alpha * penalty(self.shard.params, self.biases)

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
            f = ws.layer_forward(k, inp, params[k])
            out = self._done(ws.output_partial(params[-1]) if k == self.layers.depth - 1 else f)
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
                ws.output_backward(params[-1], delta2)
            out = self._done(ws.layer_backward(k, inp, params[k]))
        self.spent += time.monotonic() - t0
        return out

    def modify(self, it: int, sums: list[np.ndarray]) -> None:
        # run where forward and backward run (the compute thread for large work), so that an
        # EMULATED worker's padding of the update does not hold its event loop either; no
        # handler touches the shard during a block (rpm_rows serves remaps, between blocks)
        with self.pace(it, ("modify", self.shard.W.shape)):
            rec = self.recipe
            if rec.alpha or rec.reduction == "mean":
                mean_gradient(self.shard.params, sums, rec.divisor(it), rec.alpha, self.biases)
            self.shard.update(sums, self.spec.learning_rate, self.opt, it + 1)
            self._done(None)


async def _forward(
    ex: _Exchange, state: Any, k: _Kernels, it: int, x: np.ndarray, inline: bool
) -> np.ndarray:
    """The forward pass to the partial product: all layers at once where this worker holds all
    units of its column's layers, else layer by layer with the column's activations gathered."""
    if k.layers.depth == 1 or len(state.layout.members) == 1:
        return await state.compute(inline, k.forward, it, x)
    inp = x
    for j in range(k.layers.depth):
        out = await state.compute(inline, k.layer_forward, it, j, inp)
        if j < k.layers.depth - 1:
            inp = await gather_activations(ex, it, j, out, k.ws.full(j), k.layers)
    return out


async def _backward(
    ex: _Exchange, state: Any, k: _Kernels, it: int, x: np.ndarray, delta2: np.ndarray, inline: bool
) -> list[np.ndarray]:
    """The update sums of my rows of every parameter; layer by layer, with the column's deltas
    summed between layers, where the forward pass went layer by layer."""
    if k.layers.depth == 1 or len(state.layout.members) == 1:
        return await state.compute(inline, k.backward, it, x, delta2)
    for j in range(k.layers.depth - 1, -1, -1):
        inp = k.ws.full(j - 1) if j else x
        g = await state.compute(inline, k.layer_backward, it, j, inp, delta2)
        if g is not None:
            await scatter_deltas(ex, it, j, g, k.ws.delta(j - 1), k.layers)
    return k.ws.grads


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
    state.begin(spec.epoch)
    ex = _Exchange(state, spec)
    data = state.data
    shard = state.shard
    shard.snapshot(spec.first)
    k = _Kernels(state, spec)
    inline = k.inline(data.capacity, inline_work)

    # scratch for the summed updates (one column: the worker's own updates are the sums)
    sums = [shard.backend.ns.empty_like(p) for p in shard.params] if lay.n_columns > 1 else None
    reporter = _Reporter(log, state.run, spec.report_seconds)
    records: list[TimingRecord] = []
    errors: dict[int, float] = {}
    status, message = "ok", ""
    try:
        for it in range(spec.first, spec.first + spec.count):
            state.check_abort(spec.epoch)
            # last iteration's messages are out: buffers are free
            await state.flush(spec.receive_timeout, spec.epoch)
            if not data.ready(it):  # a new epoch of mini-batches: this column's rows of it
                await state.compute(False, data.load, it)  # (off the event loop)
            x, d = data.batch(it)
            t_f0, k.spent = time.monotonic(), 0.0
            partial = await _forward(ex, state, k, it, x, inline)
            t_f1 = t_f0 + k.spent if k.layered else time.monotonic()
            pen = k.penalty()
            delta2, err, ok = await _vertical(
                ex, it, partial, k.ws, d, shard.finite, pen, ex.deadline()
            )
            t_b0, k.spent = time.monotonic(), 0.0
            grads = await _backward(ex, state, k, it, x, delta2, inline)
            t_b1 = t_b0 + k.spent if k.layered else time.monotonic()
            summed, col_errors, ok = await _horizontal(ex, it, grads, sums, err, ok, ex.deadline())
            total = _column_total(col_errors)
            if not ok or not math.isfinite(total):
                status = "diverged"
                break
            errors[it] = total
            t_m0 = time.monotonic()
            await state.compute(inline, k.modify, it, summed)
            t_m1 = time.monotonic()
            state.iteration = it + 1
            rec = TimingRecord(it, lay.worker, t_f0, t_f1, t_b0, t_b1, t_m0, t_m1)
            records.append(rec)
            reporter.add(rec, it, total)
            if spec.target_error is not None and total <= spec.target_error:
                status = "target"
                break
        await state.flush(spec.receive_timeout, spec.epoch)
    except BlockAborted as exc:
        status, message = "aborted", str(exc)
    except PeerError as exc:
        status, message = "failed", str(exc)
    reporter.flush()
    return BlockResult(lay.worker, status, state.iteration, errors, records, shard.finite, message)
