"""A convolutional network as the rectangle model cuts it: every layer split along its output channels.

Pure (numpy only). How a user describes a network (a ``torch.nn.Sequential`` or layer records)
is :mod:`dask_rpm.nn.cnn_records`; moving weights to and from torch modules is
:mod:`dask_rpm.nn.cnn_torch`.

A network is a sequence of **stages**. A stage is one ``Conv2d`` or ``Linear``
followed by the per-channel operations after it (an activation, pooling,
``Flatten``); the network ends with one ``Linear``, the output layer. A
convolution computes ``Out_j = sum_i W_{j,i} (*) In_i``: output channel ``j``
needs the whole input and its own filters only, so a stage's output channels
(a dense stage's units) are the same axis as an MLP's hidden units
(:mod:`dask_rpm.nn.layers`), and the planner's hidden rows cut them the same way
(:meth:`ConvLayers.boundary`). Pooling and activations act on the channels a
worker holds; the column gathers a stage's output for the next stage and sums
the gradients for it on the way back (:mod:`dask_rpm.comm.collectives`).

Parameters, each split along the axis of its stage's channels:

* ``W{k}``: ``(channels, in_channels, K, K)`` for a conv stage,
  ``(units, in_features)`` for a dense one; ``b{k}``: ``(channels,)``.
* ``V``: the output layer, ``(outputs, channels of the last stage, positions)``
  - ``Linear``'s ``(outputs, features)`` seen channel by channel (``Flatten``
  orders features channel-major), split along axis 1 as an MLP's ``V``.

The output bias rides in ``V`` as an MLP's does: the last stage gets one extra
channel (the *bias channel*, the last row, its weights held at 0) whose output
is 1 at its first position and 0 elsewhere, so ``V[:, -1, 0]`` is the output
bias and the rest of ``V[:, -1]`` stays 0 (its gradient is 0). So every
parameter is cut by one stage's rows, and everything that moves, stores or sums
weights works on a CNN unchanged.

"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple, TypeGuard, cast

import numpy as np

from .errors import DataError
from .layers import Layers, Param

__all__ = [
    "LAYER_KINDS",
    "POOLS",
    "SUPPORTED_LAYERS",
    "NetworkSpecError",
    "Stage",
    "ConvLayers",
    "is_conv",
    "cnn_work",
    "LayerCost",
]

#: The layer kinds a network may use, as records name them.
LAYER_KINDS = ("conv", "maxpool", "avgpool", "flatten", "linear", "relu", "tanh", "sigmoid")
#: The pooling kinds (the others after a layer are activations).
POOLS = ("maxpool", "avgpool")
#: The torch layers a network may use, for messages.
SUPPORTED_LAYERS = (
    "Conv2d (groups=1, dilation=1, zero padding), MaxPool2d / AvgPool2d (no padding), Flatten, "
    "Linear, ReLU, Tanh, Sigmoid"
)


class NetworkSpecError(DataError):
    """A network dask_rpm cannot train: an unsupported layer, or one that does not fit its input."""


class Stage(NamedTuple):
    """One conv or dense layer with the per-channel operations after it.

    Attributes
    ----------
    kind : {"conv", "linear"}
    units : int
        Rows as planned: output channels (units), plus the bias channel on the last stage of a
        network whose output layer has a bias.
    channels : int
        The layer's own output channels (units).
    inputs : int
        Input channels (conv) or input features (dense).
    in_hw : tuple of int
        The input map's height and width (``(1, 1)`` for a dense stage).
    kernel, stride, padding : int
        The convolution's (1, 1, 0 for a dense stage).
    bias : bool
        Whether the layer has biases (a ``b{k}`` parameter).
    post : tuple of tuple
        The operations after the layer, in order: ``("relu",)``, ``("tanh",)``,
        ``("sigmoid",)``, ``("maxpool", k, s)``, ``("avgpool", k, s)``.
    conv_hw, out_hw : tuple of int
        The map after the layer, and after its operations.
    """

    kind: str
    units: int
    channels: int
    inputs: int
    in_hw: tuple[int, int]
    kernel: int
    stride: int
    padding: int
    bias: bool
    post: tuple[tuple, ...]
    conv_hw: tuple[int, int]
    out_hw: tuple[int, int]

    @property
    def positions(self) -> int:
        """Output positions per channel (1 for a dense stage)."""
        return self.out_hw[0] * self.out_hw[1]

    @property
    def fan_in(self) -> int:
        """Weights per output channel."""
        return self.inputs * self.kernel * self.kernel

    def flop(self) -> float:
        """Multiply-adds x 2 of the layer per sample and output channel (the seed's Table 1 per
        channel)."""
        return 2.0 * self.fan_in * self.conv_hw[0] * self.conv_hw[1]


class ConvLayers(NamedTuple):
    """A CNN's geometry as planned: what :class:`~dask_rpm.nn.layers.Layers` is for an MLP.

    Attributes
    ----------
    image : tuple of int
        ``(channels, height, width)`` of one input sample.
    stages : tuple of Stage
    l : int
        Outputs.
    out_bias : bool
        Whether the output layer has biases (the bias channel, module docstring).
    """

    image: tuple[int, int, int]
    stages: tuple[Stage, ...]
    l: int  # noqa: E741 - the outputs, as Layers names them
    out_bias: bool = True

    # ------------------------------------------------------------ what Layers has
    @property
    def n(self) -> int:
        """Inputs per sample (the image flattened: samples travel as ``(samples, n)`` rows)."""
        c, h, w = self.image
        return c * h * w

    @property
    def hidden(self) -> tuple[int, ...]:
        return tuple(st.units for st in self.stages)

    @property
    def depth(self) -> int:
        return len(self.stages)

    @property
    def m(self) -> int:
        """Rows the planners cut: the narrowest stage (as :attr:`Layers.m`)."""
        return min(self.hidden)

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.n, *self.hidden, self.l)

    @property
    def plan_shape(self) -> tuple[int, int, int]:
        return (self.n, self.m, self.l)

    @property
    def cost_shape(self) -> tuple[int, int, int]:
        """``(n', m, l')`` for the communication model, as :attr:`Layers.cost_shape`: the column
        gathers every stage but the last's output (``channels x positions`` per sample) and the
        columns sum every parameter."""
        l_eff = self.l + sum(st.units * st.positions for st in self.stages[:-1])
        weights = sum(int(np.prod(s)) for s in self.full_shapes())
        return (max(1, round(weights / self.m) - l_eff), self.m, l_eff)

    @property
    def params(self) -> tuple[Param, ...]:
        out = []
        for k, st in enumerate(self.stages):
            out.append(Param(f"W{k + 1}", k, 0))
            if st.bias:
                out.append(Param(f"b{k + 1}", k, 0))
        out.append(Param("V", self.depth - 1, 1))
        return tuple(out)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)

    def inputs(self, k: int) -> int:
        """Input features of stage ``k`` per sample."""
        if k == 0:
            return self.n
        prev = self.stages[k - 1]
        return prev.units * prev.positions

    def _shape(self, p: Param, rows: int) -> tuple[int, ...]:
        st = self.stages[p.layer]
        if p.name.startswith("b"):
            return (rows,)
        if p.axis == 1:
            return (self.l, rows, st.positions)
        if st.kind == "conv":
            return (rows, st.inputs, st.kernel, st.kernel)
        return (rows, st.inputs)

    def full_shapes(self) -> list[tuple[int, ...]]:
        return self.shapes([(0, st.units) for st in self.stages])

    def shapes(self, layer_rows: Sequence[tuple[int, int]]) -> list[tuple[int, ...]]:
        return [
            self._shape(p, layer_rows[p.layer][1] - layer_rows[p.layer][0]) for p in self.params
        ]

    # the row arithmetic is the MLP's (Layers' methods read only m, hidden, depth and params)
    def boundary(self, k: int, x: int) -> int:
        """Stage ``k``'s row at plan row boundary ``x`` (:meth:`Layers.boundary`)."""
        return Layers.boundary(cast(Any, self), k, x)

    def layer_rows(self, rows: tuple[int, int]) -> tuple[tuple[int, int], ...]:
        return Layers.layer_rows(cast(Any, self), rows)

    def units(self, rows: tuple[int, int]) -> tuple[int, ...]:
        return Layers.units(cast(Any, self), rows)

    def views(self, arrays: Sequence[Any], rows: tuple[int, int], origin: int = 0) -> list[Any]:
        return Layers.views(cast(Any, self), arrays, rows, origin)

    def take(self, arrays: Sequence[Any], rows: tuple[int, int], origin: int = 0) -> list[Any]:
        return Layers.take(cast(Any, self), arrays, rows, origin)

    def put(
        self, dst: Sequence[Any], src: Sequence[Any], rows: tuple[int, int], origin: int = 0
    ) -> None:
        Layers.put(cast(Any, self), dst, src, rows, origin)

    def join(self, shards: Sequence[Sequence[Any]]) -> list[Any]:
        return Layers.join(cast(Any, self), shards)

    def _cut(self, arrays: Sequence[Any], rows: tuple[int, int], origin: int) -> list[Any]:
        return Layers._cut(cast(Any, self), arrays, rows, origin)

    def zeros(self, rows: tuple[int, int], dtype: Any) -> list[np.ndarray]:
        return [np.zeros(s, dtype) for s in self.shapes(self.layer_rows(rows))]

    def nbytes(self, rows: tuple[int, int], itemsize: int) -> int:
        return int(sum(int(np.prod(s)) for s in self.shapes(self.layer_rows(rows))) * itemsize)

    def bias_rows(self, rows: tuple[int, int], bias: bool = False) -> tuple[int | None, ...]:
        """Each stage's local row of the bias channel, or None (only the last stage has one).
        ``bias`` (an MLP's augmented inputs) does not apply: the geometry holds the biases."""
        out: list[int | None] = [None] * self.depth
        if self.out_bias:
            a, b = self.layer_rows(rows)[-1]
            g = self.stages[-1].units - 1
            out[-1] = g - a if a <= g < b else None
        return tuple(out)

    def bias_columns(self, rows: tuple[int, int], bias: bool = False) -> list[int | None]:
        """What the L2 penalty leaves out of each parameter: ``b{k}`` whole (0 on a 1-D array:
        :func:`dask_rpm.nn.optim.penalty`), ``V``'s bias channel where held, no ``W{k}`` row."""
        last = self.bias_rows(rows)[-1]
        out: list[int | None] = []
        for p in self.params:
            if p.name.startswith("b"):
                out.append(0)
            elif p.axis == 1:
                out.append(last)
            else:
                out.append(None)
        return out

    def records(self) -> list[dict[str, Any]]:
        """The network as normalised layer records
        (:func:`~dask_rpm.nn.cnn_records.layer_records`' form): what a job file, a model file and
        :func:`~dask_rpm.nn.cnn_torch.to_torch` rebuild it from."""
        out: list[dict[str, Any]] = []
        for st in self.stages:
            if st.kind == "conv":
                out.append(
                    dict(
                        kind="conv",
                        out=st.channels,
                        kernel=st.kernel,
                        stride=st.stride,
                        padding=st.padding,
                        bias=st.bias,
                    )
                )
            else:
                out.append(dict(kind="linear", out=st.channels, bias=st.bias))
            for op in st.post:
                if len(op) == 1:
                    out.append({"kind": op[0]})
                else:
                    out.append({"kind": op[0], "kernel": op[1], "stride": op[2]})
            if st.kind == "conv" and self._flattened_after(st):
                out.append({"kind": "flatten"})
        out.append(dict(kind="linear", out=self.l, bias=self.out_bias))
        return out

    def _flattened_after(self, st: Stage) -> bool:
        i = self.stages.index(st)
        return i == self.depth - 1 or self.stages[i + 1].kind == "linear"

    def spec(self) -> list[Any]:
        """The layer records in the form a user writes them (a job file's ``network:``)."""
        out: list[Any] = []
        for rec in self.records():
            kind = rec["kind"]
            if kind in ("relu", "tanh", "sigmoid", "flatten"):
                out.append(kind)
            elif kind in ("conv", "linear"):
                r = {kind: rec["out"], **{k: v for k, v in rec.items() if k not in ("kind", "out")}}
                out.append(r)
            else:
                out.append({kind: rec["kernel"], "stride": rec["stride"]})
        return out

    def describe(self) -> list[str]:
        """One line per stage for people: its kind, channels and map."""
        lines = []
        for k, st in enumerate(self.stages):
            post = " ".join(op[0] if len(op) == 1 else f"{op[0]}{op[1]}" for op in st.post)
            what = (
                f"conv {st.inputs}->{st.channels} k{st.kernel} s{st.stride} p{st.padding}"
                if st.kind == "conv"
                else f"linear {st.inputs}->{st.channels}"
            )
            lines.append(
                f"stage {k + 1}: {what} {post} -> {st.channels} x {st.out_hw[0]}x{st.out_hw[1]}"
            )
        lines.append(f"output: linear {self._v_in()}->{self.l}")
        return lines

    def _v_in(self) -> int:
        st = self.stages[-1]
        return st.channels * st.positions

    def flop(self) -> list[float]:
        """Each stage's forward flop per sample, whole (the seed's Table 1)."""
        return [st.flop() * st.channels for st in self.stages]

    def layer_costs(self, itemsize: int = 8) -> list[LayerCost]:
        """The seed's Table 1 of this network: per stage, then the output layer, its forward flop,
        parameter bytes and input and output activation bytes per sample.

        Counted as the user's layers hold them (the planner's bias channel left out): a stage's
        input is the map it reads, its output the map after its activation and pooling (what
        the column gathers). Dense stages and the output layer are ``"fc"``, so the list is what
        :mod:`dask_rpm.cost.cnn_model` takes as a ``network`` (its ``Layer`` has these fields
        in this order).

        Parameters
        ----------
        itemsize : int
            Bytes per element (8: float64, 4: float32).

        Returns
        -------
        list of LayerCost
            ``stage 1`` .. ``stage L``, then ``output``.
        """
        out: list[LayerCost] = []
        for k, st in enumerate(self.stages):
            params = st.channels * st.fan_in + (st.channels if st.bias else 0)
            out.append(
                LayerCost(
                    f"stage {k + 1}",
                    "conv" if st.kind == "conv" else "fc",
                    st.flop() * st.channels,
                    params * itemsize,
                    st.inputs * st.in_hw[0] * st.in_hw[1] * itemsize,
                    st.channels * st.positions * itemsize,
                )
            )
        features = self._v_in()
        out.append(
            LayerCost(
                "output",
                "fc",
                2.0 * self.l * features,
                (self.l * features + (self.l if self.out_bias else 0)) * itemsize,
                features * itemsize,
                self.l * itemsize,
            )
        )
        return out

    def unit_work(self) -> float:
        """Flop equivalents of one work unit, one plan row x one sample, forward and backward
        (:func:`cnn_work`, what EMULATED workers are paced by, over every stage's rows at the
        plan's ``m``): what turns a rate in flop equivalents per second into the planner's work
        units per second."""
        units = self.hidden
        work = sum(
            cnn_work(kind, k, 1, units, self)
            for k in range(self.depth)
            for kind in ("forward", "backward")
        )
        return work / self.m


def is_conv(layers: Any) -> TypeGuard[ConvLayers]:
    """Whether ``layers`` is a CNN's geometry (else an MLP's)."""
    return isinstance(layers, ConvLayers)


def cnn_work(kind: str, k: int, s: int, units: Sequence[int], layers: ConvLayers) -> float:
    """Flop equivalents of stage ``k``'s kernels for ``units[k]`` channels on ``s`` samples
    (the output layer's with the last stage): the work EMULATED workers are paced by and the
    planner's speeds are measured in, proportional to ``s`` times the channels held."""
    st, u = layers.stages[k], float(units[k])
    per = st.flop() + 4.0 * st.conv_hw[0] * st.conv_hw[1]  # the layer, its activation and pooling
    if k == layers.depth - 1:
        per += 2.0 * layers.l * st.positions
    if kind == "forward":
        return float(s) * u * per
    if kind == "backward":
        # the weight gradient, and the input gradient on every stage but the first
        return float(s) * u * per * (2.0 if k else 1.0)
    raise ValueError(f"kind={kind!r}; expected 'forward' or 'backward'")


class LayerCost(NamedTuple):
    """One layer of a network as the seed's Table 1 counts it (:meth:`ConvLayers.layer_costs`).

    Attributes
    ----------
    name : str
        ``stage k`` or ``output``.
    kind : {"conv", "fc"}
        A conv stage (compute-bound in the seed's model) or a dense one (memory-bound).
    flop : float
        Forward flop per sample (2 x multiply-adds).
    param_bytes : int
        Weights and biases.
    input_bytes, output_bytes : int
        The layer's input and output activations per sample (the output after pooling).
    """

    name: str
    kind: str
    flop: float
    param_bytes: int
    input_bytes: int
    output_bytes: int
