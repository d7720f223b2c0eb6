"""The collectives a block of iterations calls, named for what they do to the network.

Inside a column (the workers that split the hidden units of the same samples):

* :func:`column_reduce` - the vertical exchange: the members' partial products of the
  output layer summed, the output deltas and the column's error from the sum;
* :func:`column_allgather` - forward between hidden layers: every member gets the whole
  layer's activations from the members' units (Megatron-LM's all-gather after a
  column-parallel layer);
* :func:`column_reduce_scatter` - backward between hidden layers: the parts of the
  gradient for a layer's input summed, each member receiving its own units' (the
  reduction of the input gradient).

Across columns (the workers that hold the same hidden rows for other samples):

* :func:`row_allreduce` - the horizontal exchange: every holder of a row gets the sum of
  its weight updates over all columns, and every column's error.

Why every layer column-parallel rather than alternating with row-parallel layers (which
exchanges at every second boundary only): a row-parallel layer's outputs are a sum over
the column, so its activation is computed on every member's whole ``s x m_k`` - work that
does not shrink with the worker's rectangle - and the output layer's cut then depends on
the depth's parity. Cutting every layer by the same rows keeps each worker's work and
memory proportional to its area, which is what the planners and DRPM assume. In bytes the
two move the same: an allreduce is a reduce-scatter plus an all-gather.

Every holder sums the same numbers in the same order (column order, or a schedule's fixed
order), so the replicas of a row stay bit-identical and the result equals serial BP to
rounding. Each collective runs one of the algorithms the plan's layout names (one hop, a
leader, or a schedule of :mod:`dask_rpm.comm.schedules` that :mod:`dask_rpm.comm.exchange`
applies round by round), chosen by one rule (:func:`dask_rpm.comm.engine_algorithm`).

Pure (asyncio, numpy and the array backends; no ``distributed``): messages go through a
:class:`Channel` over the worker's :class:`~dask_rpm.comm.mailbox.Mailbox`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from ..nn import backend as xb
from ..nn.layers import Layers
from .exchange import WorkerStep, apply_received, worker_steps
from .mailbox import Mailbox
from .schedules import Schedule, build

__all__ = [
    "Allreduce",
    "Channel",
    "Finish",
    "allreduce",
    "column_allgather",
    "column_reduce",
    "column_reduce_scatter",
    "row_allreduce",
]

#: ``finish(u, penalty) -> (result, error)``: what :func:`column_reduce` makes of the sum.
Finish = Callable[[Any, float], tuple[Any, float]]


class Channel:
    """One block's view of a worker's mailbox: its epoch, the receive deadline, the peers'
    addresses by worker index, and the schedules of its allreduces (built once per size).

    Parameters
    ----------
    mailbox : Mailbox
    layout : Layout
        The worker's view of the plan (:class:`dask_rpm.engine.records.Layout`): its column's
        members, its partners in the other columns, its groups of bands, the algorithms.
    backend : Backend
        Where received arrays are placed for the sums on this worker's own arrays.
    layers : Layers
        The network's layers as this worker's rows cut them (which rows of every parameter).
    epoch : int
        The block's number (the mailbox drops messages of older blocks).
    timeout : float
        Seconds a receive waits for a peer (``rpm.engine.receive-timeout``).
    """

    def __init__(
        self,
        mailbox: Mailbox,
        layout: Any,
        backend: xb.Backend,
        layers: Layers,
        epoch: int,
        timeout: float,
    ) -> None:
        self.mailbox, self.layout, self.backend, self.layers = mailbox, layout, backend, layers
        self.epoch = epoch
        self.timeout = timeout
        lay = layout
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
            self._steps[key] = (sched, worker_steps(sched, self.layout.worker))
        return self._steps[key]

    def deadline(self) -> float:
        return time.monotonic() + self.timeout

    def send(self, address: str, it: int, phase: str, payload: tuple) -> None:
        self.mailbox.send(address, self.epoch, it, phase, payload)

    async def receive(
        self, it: int, phase: str, senders: list[int], deadline: float, place: bool = True
    ) -> dict[int, Any]:
        """The payloads of ``senders``; with ``place`` their arrays on this worker's backend
        (else in host memory, as they arrived)."""
        got = await self.mailbox.receive(
            self.epoch, it, phase, senders, deadline, self.names, self.timeout
        )
        be = self.backend
        if not place or be.name == "numpy":
            return got
        return {
            w: tuple(be.asarray(p) if isinstance(p, np.ndarray) else p for p in payload)
            for w, payload in got.items()
        }


class Allreduce(NamedTuple):
    """One allreduce of a flat buffer by a schedule of :mod:`dask_rpm.comm.exchange`."""

    tag: str  # phase prefix of its messages: round r is phase f"{tag}{r}"
    buffer: np.ndarray
    schedule: Schedule
    steps: list[WorkerStep]


async def allreduce(ch: Channel, it: int, runs: list[Allreduce], deadline: float) -> None:
    """Run allreduces side by side, round by round; each buffer ends as the sum, on every holder.

    A round's slices are sent as they are when the round starts (copies: the
    buffer changes when the round's receives are applied). Rounds advance in
    lock step over all ``runs``: every round-``r`` message is sent before any
    round-``r`` receive is awaited, so no holder waits on a message its
    sender can only send later - the exchange cannot deadlock.
    """
    me = ch.layout.worker
    steps = [{st.round: st for st in run.steps} for run in runs]
    last = max((st.round for run in runs for st in run.steps), default=-1)
    for r in range(last + 1):
        for run, by_round in zip(runs, steps):
            st = by_round.get(r)
            if st is not None:
                for t in st.sends:
                    ch.send(ch.names[t.dst], it, f"{run.tag}{r}", (run.buffer[t.lo : t.hi],))
        for run, by_round in zip(runs, steps):
            st = by_round.get(r)
            if st is None or not st.receives:
                continue
            senders = [t.src for t in st.receives]
            got = await ch.receive(it, f"{run.tag}{r}", senders, deadline, place=False)
            payloads = {t: got[t.src][0] for t in st.receives}
            apply_received(run.buffer, me, st, payloads, run.schedule.holders)


async def _column_reduce_scheduled(
    ch: Channel,
    it: int,
    partial: np.ndarray,
    out: np.ndarray,
    finite: bool,
    pen: float,
    finish: Finish,
    deadline: float,
) -> tuple[Any, float, bool]:
    """:func:`column_reduce` by a schedule: partials, penalties and a "not finite" count summed
    together."""
    lay = ch.layout
    host = xb.to_host(partial)
    size = host.size + 2
    buf = np.empty(size, dtype=host.dtype)
    buf[:-2] = host.ravel()
    buf[-2] = pen
    buf[-1] = 0.0 if finite else 1.0  # sums exactly: the number of members with bad weights
    sched, steps = ch.steps(lay.vertical, tuple(p.worker for p in lay.members), size)
    await allreduce(ch, it, [Allreduce("v", buf, sched, steps)], deadline)
    xb.copyto(out, buf[:-2].reshape(tuple(out.shape)))
    result, err = finish(out, float(buf[-2]))
    return result, err, bool(buf[-1] == 0)


async def column_reduce(
    ch: Channel,
    it: int,
    partial: np.ndarray,
    out: np.ndarray,
    finite: bool,
    pen: float,
    finish: Finish,
    deadline: float,
) -> tuple[Any, float, bool]:
    """The vertical exchange of iteration ``it``: the column's partial products summed in column
    order into ``out``, and what ``finish`` makes of the sum, on every member.

    ``finish(u, penalty)`` returns ``(result, error)`` from the summed partial products ``u``
    and the members' summed ``pen`` (each member's share of the L2 penalty): the output deltas
    and the column's error. It runs on every member (``allgather``, or a schedule), or on
    the column's leader, which sends its result to the others (``leader``); a column of one
    runs it on its own partial product. Returns ``(result, error, every member's weights
    are finite)``.
    """
    lay = ch.layout
    me = lay.worker
    others = [p for p in lay.members if p.worker != me]
    if not others:
        result, err = finish(partial, pen)
        return result, err, finite
    if lay.vertical not in ("allgather", "leader"):
        return await _column_reduce_scheduled(ch, it, partial, out, finite, pen, finish, deadline)
    if lay.vertical == "leader" and me != lay.leader:
        leader = next(p for p in lay.members if p.worker == lay.leader)
        ch.send(leader.address, it, "v", (partial, finite, pen))
        ((result, err, ok),) = (await ch.receive(it, "vd", [lay.leader], deadline)).values()
        return result, float(err), bool(ok)
    if lay.vertical == "leader":
        got = await ch.receive(it, "v", [p.worker for p in others], deadline)
    else:  # allgather: everyone sends to everyone, everyone sums
        for p in others:
            ch.send(p.address, it, "v", (partial, finite, pen))
        got = await ch.receive(it, "v", [p.worker for p in others], deadline)
    u = out
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
    result, err = finish(u, total_pen)
    if lay.vertical == "leader":
        for p in others:
            ch.send(p.address, it, "vd", (result, err, ok))
    return result, err, ok


async def row_allreduce(
    ch: Channel,
    it: int,
    grads: list[np.ndarray],
    sums: list[np.ndarray] | None,
    err: float,
    ok: bool,
    deadline: float,
) -> tuple[list[np.ndarray], list[float], bool]:
    """The horizontal exchange of iteration ``it``: the updates ``grads`` of my rows of every
    parameter summed over all columns in column order (into ``sums``), with every column's
    error and whether every column's weights are finite.

    ``pairwise`` sends each partner in another column the rows it shares with me;
    ``groups`` runs one scheduled allreduce per group of bands I hold. A plan of one column
    has nothing to sum: ``grads`` are the sums.
    """
    lay = ch.layout
    if lay.n_columns == 1 or sums is None:
        return grads, [err], ok
    if lay.horizontal == "groups":
        return await _row_allreduce_groups(ch, it, grads, sums, err, ok, deadline)
    layers, m0 = ch.layers, lay.rows[0]
    for col in lay.partners:
        for p in col:
            # views: the send copies them (dask_rpm.engine.worker)
            ch.send(p.address, it, "h", (*layers.views(grads, p.rows, m0), err, ok))
    senders = [p.worker for col in lay.partners for p in col]
    got = await ch.receive(it, "h", senders, deadline)
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


async def _row_allreduce_groups(
    ch: Channel,
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
    lay = ch.layout
    layers, C, m0 = ch.layers, lay.n_columns, lay.rows[0]
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
        sched, steps = ch.steps(group.algorithm, group.holders, buf.size)
        # tagged by the group's first row: the same on every holder (an index into my own
        # groups would not be - holders hold different sets of groups)
        runs.append(Allreduce(f"h{group.rows[0][0]}.", buf, sched, steps))
    await allreduce(ch, it, runs, deadline)
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


async def column_allgather(
    ch: Channel, it: int, k: int, local: np.ndarray, full: np.ndarray
) -> np.ndarray:
    """Forward between hidden layers ``k`` and ``k + 1``: all of layer ``k``'s outputs into
    ``full`` (``s x m_k``), from my units' ``local`` and the other members'; returns ``full``."""
    lay, layers = ch.layout, ch.layers
    me = lay.worker
    others = [p for p in lay.members if p.worker != me]
    for p in others:  # the send copies (dask_rpm.engine.worker): local may change afterwards
        ch.send(p.address, it, f"a{k}", (local,))
    got = await ch.receive(it, f"a{k}", [p.worker for p in others], ch.deadline())
    for p in lay.members:
        a, b = layers.layer_rows(p.rows)[k]
        xb.copyto(full[:, a:b], local if p.worker == me else got[p.worker][0])
    return full


async def column_reduce_scatter(
    ch: Channel, it: int, k: int, grad: np.ndarray, delta: np.ndarray
) -> None:
    """Backward between hidden layers ``k`` and ``k - 1``: layer ``k - 1``'s deltas of my units
    into ``delta``, the column's parts ``grad`` of the gradient for layer ``k``'s whole input
    summed in column order (the same order on every member, whatever arrives first)."""
    lay, layers = ch.layout, ch.layers
    me = lay.worker
    others = [p for p in lay.members if p.worker != me]
    for p in others:
        a, b = layers.layer_rows(p.rows)[k - 1]
        ch.send(p.address, it, f"g{k}", (grad[:, a:b],))
    got = await ch.receive(it, f"g{k}", [p.worker for p in others], ch.deadline())
    a, b = layers.layer_rows(lay.rows)[k - 1]
    for i, p in enumerate(lay.members):
        part = grad[:, a:b] if p.worker == me else got[p.worker][0]
        if i == 0:
            xb.copyto(delta, part)
        else:
            delta += part
