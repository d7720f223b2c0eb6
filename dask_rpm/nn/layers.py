"""The model as a list of parameters, each split along one axis by the rectangle's hidden rows.

Pure (numpy only). A network of ``n`` inputs, hidden layers of ``m_1 .. m_L``
units and ``l`` outputs has ``L + 1`` weight matrices: ``W_k`` of shape
``(m_k, m_{k-1})`` (``m_0 = n``) and ``V`` of shape ``(l, m_L)``. A worker
whose rectangle spans hidden rows ``[a, b)`` of the plan holds rows of
*every* hidden layer: ``W_k``'s rows (axis 0) of layer ``k``'s units and
``V``'s columns (axis 1) of the last layer's units - Megatron-LM's
``partition_dim``. Everything that moves, stores or sums weights (shards,
gathers, remaps, checkpoints, the horizontal exchange, optimizer state) loops
over :attr:`Layers.params`; only the kernels know what each parameter
computes.

The plan's hidden coordinate
----------------------------
Planners cut ``m`` rows, ``m`` the narrowest hidden layer as planned
(:attr:`Layers.m`). Layer ``k`` maps a plan row boundary ``x`` to
``round(x m_k / m)`` (:meth:`Layers.boundary`): monotone, ``0 -> 0`` and
``m -> m_k``, so the rectangles of a column tile every layer exactly once;
and since ``m_k >= m``, a worker with at least one plan row holds at least
one row of every layer. Its share of every layer is its plan height to
within one row, so its work stays proportional to its area. The one-layer
network is ``m_1 = m``: the mapping is the identity, and the parameters
are the paper's ``W`` and ``V``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from .backend import to_host

__all__ = ["Param", "Layers", "layers_of", "layers_of_params"]


class Param(NamedTuple):
    """One weight matrix: its name, the hidden layer whose units split it, and along which axis."""

    name: str
    layer: int  # 0-based hidden layer whose rows (units) cut this parameter
    axis: int  # 0: its rows are that layer's units (W_k); 1: its columns are (V)


class Layers(NamedTuple):
    """The network's sizes as planned (bias input and bias units included).

    Attributes
    ----------
    n : int
        Inputs (with the constant-1 input when the network has bias terms).
    hidden : tuple of int
        Units of each hidden layer, first to last (each with its bias unit).
    l : int
        Outputs.
    """

    n: int
    hidden: tuple[int, ...]
    l: int  # noqa: E741 - the paper's name for the output size

    @property
    def depth(self) -> int:
        """Number of hidden layers."""
        return len(self.hidden)

    @property
    def m(self) -> int:
        """Hidden rows the planners cut: the narrowest layer (module docstring)."""
        return min(self.hidden)

    @property
    def shape(self) -> tuple[int, ...]:
        """``(n, m_1, ..., m_L, l)``: what a manifest, a model file and ``--shape`` write."""
        return (self.n, *self.hidden, self.l)

    @property
    def plan_shape(self) -> tuple[int, int, int]:
        """``(n, m, l)``: the shape a plan is made for."""
        return (self.n, self.m, self.l)

    @property
    def cost_shape(self) -> tuple[int, int, int]:
        """``(n', m, l')`` for the paper's communication model (docs/method.md §4) of this network.

        The model counts ``l`` elements per sample for each vertical message and ``(n + l)``
        per hidden row for each horizontal one. With several hidden layers a column also
        gathers each hidden layer but the last's activations and sums its deltas - as many
        messages as the partial products, ``m_k`` elements per sample - and the columns sum
        every parameter's rows: ``l' = l + m_1 + ... + m_(L-1)`` and ``(n' + l') m`` is the
        number of weights. One hidden layer: ``(n, m, l)`` itself.
        """
        l_eff = self.l + sum(self.hidden[:-1])
        weights = sum(r * c for r, c in self.full_shapes())
        return (max(1, round(weights / self.m) - l_eff), self.m, l_eff)

    @property
    def params(self) -> tuple[Param, ...]:
        """``W`` and ``V`` for one hidden layer (the paper's names); ``W1 .. WL`` and ``V`` deeper."""
        if self.depth == 1:
            return (Param("W", 0, 0), Param("V", 0, 1))
        ws = tuple(Param(f"W{k + 1}", k, 0) for k in range(self.depth))
        return (*ws, Param("V", self.depth - 1, 1))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)

    def inputs(self, k: int) -> int:
        """Inputs of hidden layer ``k`` (``n`` for the first, the previous layer's units after)."""
        return self.n if k == 0 else self.hidden[k - 1]

    def full_shapes(self) -> list[tuple[int, int]]:
        """Each parameter's full shape."""
        return self.shapes([(0, m) for m in self.hidden])

    def shapes(self, layer_rows: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
        """Each parameter's shape when holding ``layer_rows[k]`` of every layer ``k``."""
        out = []
        for p in self.params:
            a, b = layer_rows[p.layer]
            out.append((b - a, self.inputs(p.layer)) if p.axis == 0 else (self.l, b - a))
        return out

    def boundary(self, k: int, x: int) -> int:
        """Layer ``k``'s row at plan row boundary ``x`` (round half up: exact integers)."""
        m, mk = self.m, self.hidden[k]
        return x if mk == m else (2 * x * mk + m) // (2 * m)

    def layer_rows(self, rows: tuple[int, int]) -> tuple[tuple[int, int], ...]:
        """Rows of every layer held by plan rows ``rows = (a, b)``."""
        a, b = rows
        return tuple((self.boundary(k, a), self.boundary(k, b)) for k in range(self.depth))

    def units(self, rows: tuple[int, int]) -> tuple[int, ...]:
        """How many units of each layer plan rows ``rows`` hold."""
        return tuple(b - a for a, b in self.layer_rows(rows))

    def zeros(self, rows: tuple[int, int], dtype: Any) -> list[np.ndarray]:
        """Zero arrays shaped like the parameters of plan rows ``rows``."""
        return [np.zeros(s, dtype) for s in self.shapes(self.layer_rows(rows))]

    def views(
        self, arrays: Sequence[np.ndarray], rows: tuple[int, int], origin: int = 0
    ) -> list[np.ndarray]:
        """Plan rows ``rows`` of ``arrays`` (parameters holding plan rows from ``origin`` on), as
        views: to write into, or to read without a copy."""
        out = []
        for p, arr, (a, b), (o, _) in self._cut(arrays, rows, origin):
            sl = slice(a - o, b - o)
            out.append(arr[sl] if p.axis == 0 else arr[:, sl])
        return out

    def take(
        self, arrays: Sequence[np.ndarray], rows: tuple[int, int], origin: int = 0
    ) -> list[np.ndarray]:
        """:meth:`views` as contiguous host arrays (a GPU's copied to the host:
        :func:`~dask_rpm.nn.backend.to_host`)."""
        return [np.ascontiguousarray(to_host(v)) for v in self.views(arrays, rows, origin)]

    def put(
        self,
        dst: Sequence[np.ndarray],
        src: Sequence[np.ndarray],
        rows: tuple[int, int],
        origin: int = 0,
    ) -> None:
        """Write ``src`` (parameters of plan rows ``rows``) into ``dst`` (parameters holding plan
        rows from ``origin`` on)."""
        for view, piece in zip(self.views(dst, rows, origin), src):
            np.copyto(view, piece)

    def _cut(
        self, arrays: Sequence[np.ndarray], rows: tuple[int, int], origin: int
    ) -> list[tuple[Param, np.ndarray, tuple[int, int], tuple[int, int]]]:
        if len(arrays) != len(self.params):
            raise ValueError(
                f"{len(arrays)} arrays for the {len(self.params)} parameters {self.names}"
            )
        want, at = self.layer_rows(rows), self.layer_rows((origin, origin))
        return [(p, arr, want[p.layer], at[p.layer]) for p, arr in zip(self.params, arrays)]

    def join(self, shards: Sequence[Sequence[np.ndarray]]) -> list[np.ndarray]:
        """Full parameters from the shards of a column, top to bottom."""
        return [
            np.concatenate([s[i] for s in shards], axis=p.axis) for i, p in enumerate(self.params)
        ]

    def bias_columns(self, rows: tuple[int, int], bias: bool) -> list[int | None]:
        """Each parameter's local column of bias weights (left out of the L2 penalty), or None.

        ``W_k``'s last column multiplies the constant input or the previous layer's bias unit;
        ``V``'s bias column is the last layer's bias unit, if these rows hold it.
        """
        if not bias:
            return [None] * len(self.params)
        out: list[int | None] = []
        for p, (a, b) in zip(self.params, (self.layer_rows(rows)[p.layer] for p in self.params)):
            if p.axis == 0:
                out.append(self.inputs(p.layer) - 1)
            else:
                g = self.hidden[p.layer] - 1
                out.append(g - a if a <= g < b else None)
        return out

    def bias_rows(self, rows: tuple[int, int], bias: bool) -> tuple[int | None, ...]:
        """Each layer's local row of its bias unit (output held at 1), or None if not held here."""
        if not bias:
            return (None,) * self.depth
        out = []
        for k, (a, b) in enumerate(self.layer_rows(rows)):
            g = self.hidden[k] - 1
            out.append(g - a if a <= g < b else None)
        return tuple(out)

    def nbytes(self, rows: tuple[int, int], itemsize: int) -> int:
        """Bytes of the parameters of plan rows ``rows``."""
        return int(sum(r * c for r, c in self.shapes(self.layer_rows(rows))) * itemsize)


def layers_of(shape: Sequence[int]) -> Layers:
    """:class:`Layers` of ``(n, m_1, ..., m_L, l)`` (``(n, m, l)``: one hidden layer)."""
    dims = [int(v) for v in shape]
    if len(dims) < 3 or any(v < 1 for v in dims):
        raise ValueError(
            f"network shape {tuple(shape)}; give (inputs, hidden units of each layer..., outputs), "
            f"every size at least 1"
        )
    return Layers(dims[0], tuple(dims[1:-1]), dims[-1])


def layers_of_params(params: Sequence[np.ndarray]) -> Layers:
    """:class:`Layers` of whole parameters ``W_1 .. W_L, V`` (checked to fit together)."""
    if len(params) < 2 or any(np.ndim(p) != 2 for p in params):
        raise ValueError(
            f"parameters of shapes {[np.shape(p) for p in params]}; give 2-D weight matrices "
            f"W_1 (m_1, n), ..., W_L (m_L, m_(L-1)), V (l, m_L)"
        )
    layers = Layers(
        int(params[0].shape[1]),
        tuple(int(p.shape[0]) for p in params[:-1]),
        int(params[-1].shape[0]),
    )
    want = layers.full_shapes()
    got = [tuple(p.shape) for p in params]
    if got != want:
        raise ValueError(
            f"parameters of shapes {got} do not fit together: a network with inputs {layers.n}, "
            f"hidden {list(layers.hidden)} and outputs {layers.l} has {want}"
        )
    return layers
