"""Between the hidden layers of a column: activations gathered forward, deltas summed backward.

A worker holds its rows of every hidden layer (:mod:`dask_rpm.nn.layers`), so
layer ``k + 1`` needs the outputs of *all* units of layer ``k`` - the column's
members hold them between them. Forward, after each hidden layer but the last,
every member sends its units' outputs to the others and places theirs
(an all-gather of ``s x m_k`` values: :func:`gather_activations`). Backward, each
member's layer ``k + 1`` gives a part of the gradient for every unit of layer
``k``; the parts are summed in column order, each member receiving the
columns of its own units (a reduce-scatter: :func:`scatter_deltas`). These are
the exchanges of Megatron-LM's column-parallel layer (all-gather before, a
reduction of the input gradient after), with unequal shards.

Why every layer column-parallel rather than alternating with row-parallel
layers (which exchanges at every second boundary only): a row-parallel layer's
outputs are a sum over the column, so its activation is computed on every
member's whole ``s x m_k`` - work that does not shrink with the worker's
rectangle - and the output layer's cut then depends on the depth's parity.
Cutting every layer by the same rows keeps each worker's work and memory
proportional to its area, which is what the planners and DRPM assume. In bytes
the two move the same: an allreduce is a reduce-scatter plus an all-gather.

Pure message plumbing over :class:`~dask_rpm.engine.block`'s exchange (``send``,
``receive``); nothing here imports ``distributed``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..nn import backend as xb
from ..nn.layers import Layers

__all__ = ["gather_activations", "scatter_deltas"]


async def gather_activations(
    ex: Any, it: int, k: int, local: np.ndarray, full: np.ndarray, layers: Layers
) -> np.ndarray:
    """All of hidden layer ``k``'s outputs into ``full`` (``s x m_k``), from my units' ``local``
    and the other members'; returns ``full``."""
    lay = ex.state.layout
    me = lay.worker
    others = [p for p in lay.members if p.worker != me]
    for p in others:  # the send copies (dask_rpm.engine.worker): local may change afterwards
        ex.send(p.address, it, f"a{k}", (local,))
    got = await ex.receive(it, f"a{k}", [p.worker for p in others], ex.deadline())
    for p in lay.members:
        a, b = layers.layer_rows(p.rows)[k]
        xb.copyto(full[:, a:b], local if p.worker == me else got[p.worker][0])
    return full


async def scatter_deltas(
    ex: Any, it: int, k: int, grad: np.ndarray, delta: np.ndarray, layers: Layers
) -> None:
    """Layer ``k - 1``'s deltas of my units into ``delta``: the column's parts ``grad`` of the
    gradient for layer ``k``'s whole input, summed in column order (the same order on every
    member, whatever arrives first)."""
    lay = ex.state.layout
    me = lay.worker
    others = [p for p in lay.members if p.worker != me]
    for p in others:
        a, b = layers.layer_rows(p.rows)[k - 1]
        ex.send(p.address, it, f"g{k}", (grad[:, a:b],))
    got = await ex.receive(it, f"g{k}", [p.worker for p in others], ex.deadline())
    a, b = layers.layer_rows(lay.rows)[k - 1]
    for i, p in enumerate(lay.members):
        part = grad[:, a:b] if p.worker == me else got[p.worker][0]
        if i == 0:
            xb.copyto(delta, part)
        else:
            delta += part
