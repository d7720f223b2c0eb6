"""A convolutional network as the rectangle model cuts it: every layer split along its output channels.

Pure (numpy only; torch is imported only to read or build a ``torch.nn.Sequential``).

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

Describing a network without torch: a list of layer records, each a dict with
one kind key (``{"conv": 6, "kernel": 5, "stride": 1, "padding": 2}``,
``{"maxpool": 2}``, ``{"avgpool": 2, "stride": 2}``, ``{"linear": 120}``) or a
name (``"relu"``, ``"tanh"``, ``"sigmoid"``, ``"flatten"``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, TypeGuard, cast

import numpy as np

from . import backend as xb
from .errors import DataError
from .layers import Layers, Param

__all__ = [
    "LAYER_KINDS",
    "NetworkSpecError",
    "Stage",
    "ConvLayers",
    "conv_layers",
    "layer_records",
    "params_from_torch",
    "to_torch",
    "init_conv_params",
    "is_conv",
    "cnn_work",
    "LayerCost",
]

#: The layer kinds a network may use, as records name them.
LAYER_KINDS = ("conv", "maxpool", "avgpool", "flatten", "linear", "relu", "tanh", "sigmoid")
_ACTIVATIONS = ("relu", "tanh", "sigmoid")
_POOLS = ("maxpool", "avgpool")
_SUPPORTED = (
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
        """The network as normalised layer records (:func:`layer_records`'s form): what a job
        file, a model file and :func:`to_torch` rebuild it from."""
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


# ---------------------------------------------------------------------- records


def _int(rec: Mapping[str, Any], key: str, default: int, where: str, low: int = 0) -> int:
    v = rec.get(key, default)
    if isinstance(v, (tuple, list)):
        if len(set(v)) != 1:
            raise NetworkSpecError(
                f"{where}: {key}={tuple(v)}; only square {key}s are supported, give one number"
            )
        v = v[0]
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < low:
        raise NetworkSpecError(f"{where}: {key}={v!r}; give a whole number >= {low}")
    return int(v)


def _record(item: Any, i: int) -> dict[str, Any]:
    """One layer record as a dict with its ``kind``."""
    where = f"layer {i}"
    if isinstance(item, str):
        name = item.strip().lower()
        if name not in ("relu", "tanh", "sigmoid", "flatten"):
            raise NetworkSpecError(
                f"{where} is {item!r}; a layer named by a string is one of relu, tanh, sigmoid, "
                f"flatten; others are dicts such as {{'conv': 6, 'kernel': 5}}"
            )
        return {"kind": name}
    if not isinstance(item, Mapping):
        raise NetworkSpecError(
            f"{where} is {item!r}; give a dict such as {{'conv': 6, 'kernel': 5}} or a name"
        )
    kinds = [k for k in item if k in LAYER_KINDS]
    if len(kinds) != 1:
        raise NetworkSpecError(
            f"{where} is {dict(item)!r}; it needs exactly one kind key of {', '.join(LAYER_KINDS)}"
        )
    kind = kinds[0]
    allowed = {
        "conv": {"kernel", "stride", "padding", "bias", "inputs"},
        "linear": {"bias", "inputs"},
        "maxpool": {"stride"},
        "avgpool": {"stride"},
    }.get(kind, set())
    extra = sorted(set(item) - {kind} - allowed)
    if extra:
        raise NetworkSpecError(
            f"{where} ({kind}) has unknown key(s) {extra}; valid: {sorted(allowed) or 'none'}"
        )
    out: dict[str, Any] = {"kind": kind}
    if kind in ("conv", "linear"):
        out["out"] = _int(item, kind, 0, where, 1)
        out["bias"] = bool(item.get("bias", True))
        if "inputs" in item:  # what a torch layer declares: checked against what reaches it
            out["inputs"] = _int(item, "inputs", 0, where, 1)
    if kind == "conv":
        out["kernel"] = _int(item, "kernel", 3, where, 1)
        out["stride"] = _int(item, "stride", 1, where, 1)
        out["padding"] = _int(item, "padding", 0, where, 0)
    if kind in _POOLS:
        out["kernel"] = _int(item, kind, 2, where, 1)
        out["stride"] = _int(item, "stride", out["kernel"], where, 1)
    return out


def _torch_records(module: Any) -> list[dict[str, Any]]:
    """Layer records of a ``torch.nn.Sequential`` (refusing what the kernels do not compute)."""
    tnn = xb.torch().nn

    out: list[dict[str, Any]] = []
    for i, layer in enumerate(module):
        name = type(layer).__name__
        rec: Any
        where = f"layer {i} ({name})"
        if isinstance(layer, tnn.Conv2d):
            bad = []
            if layer.groups != 1:
                bad.append(f"groups={layer.groups}")
            if tuple(layer.dilation) != (1, 1):
                bad.append(f"dilation={tuple(layer.dilation)}")
            if layer.padding_mode != "zeros":
                bad.append(f"padding_mode={layer.padding_mode!r}")
            if isinstance(layer.padding, str):
                bad.append(f"padding={layer.padding!r}")
            if bad:
                raise NetworkSpecError(
                    f"{where} has {', '.join(bad)}; supported: {_SUPPORTED}. Use groups=1, "
                    f"dilation=1, zero padding given as a number"
                )
            rec = {
                "conv": layer.out_channels,
                "inputs": layer.in_channels,
                "kernel": tuple(layer.kernel_size),
                "stride": tuple(layer.stride),
                "padding": tuple(layer.padding),
                "bias": layer.bias is not None,
            }
        elif isinstance(layer, (tnn.MaxPool2d, tnn.AvgPool2d)):
            kind = "maxpool" if isinstance(layer, tnn.MaxPool2d) else "avgpool"
            pad = layer.padding
            extra = []
            if (pad if isinstance(pad, int) else max(pad)) != 0:
                extra.append(f"padding={pad}")
            if getattr(layer, "ceil_mode", False):
                extra.append("ceil_mode=True")
            if kind == "maxpool" and layer.dilation not in (1, (1, 1)):
                extra.append(f"dilation={layer.dilation}")
            if kind == "maxpool" and layer.return_indices:
                extra.append("return_indices=True")
            if extra:
                raise NetworkSpecError(f"{where} has {', '.join(extra)}; supported: {_SUPPORTED}")
            stride = layer.stride if layer.stride is not None else layer.kernel_size
            rec = {kind: layer.kernel_size, "stride": stride}
        elif isinstance(layer, tnn.Flatten):
            if layer.start_dim != 1 or layer.end_dim != -1:
                raise NetworkSpecError(
                    f"{where} has start_dim={layer.start_dim}, end_dim={layer.end_dim}; "
                    f"supported: Flatten() (start_dim=1, end_dim=-1)"
                )
            rec = "flatten"
        elif isinstance(layer, tnn.Linear):
            rec = {
                "linear": layer.out_features,
                "inputs": layer.in_features,
                "bias": layer.bias is not None,
            }
        elif isinstance(layer, (tnn.ReLU, tnn.Tanh, tnn.Sigmoid)):
            rec = name.lower()
        else:
            raise NetworkSpecError(
                f"{where} is not supported; supported: {_SUPPORTED}. Remove it (BatchNorm, "
                f"Dropout and others change training in ways the exact engine does not compute)"
            )
        out.append(_record(rec, i))
    return out


def layer_records(network: Any) -> list[dict[str, Any]]:
    """The network as normalised layer records (each a dict with its ``kind``): from a
    ``torch.nn.Sequential`` or from a list of records."""
    if type(network).__module__.startswith("torch"):
        tnn = xb.torch().nn

        if not isinstance(network, tnn.Sequential):
            raise NetworkSpecError(
                f"network is a {type(network).__name__}; give a torch.nn.Sequential of "
                f"{_SUPPORTED}, or a list of layer records"
            )
        return _torch_records(network)
    if isinstance(network, (str, bytes, Mapping)) or not isinstance(network, Sequence):
        raise NetworkSpecError(
            f"network={network!r}; give a torch.nn.Sequential or a list of layer records such "
            f"as [{{'conv': 6, 'kernel': 5}}, 'relu', {{'maxpool': 2}}, 'flatten', {{'linear': 10}}]"
        )
    return [_record(item, i) for i, item in enumerate(network)]


def conv_layers(network: Any, image: Sequence[int], outputs: int | None = None) -> ConvLayers:
    """The :class:`ConvLayers` of ``network`` (a ``torch.nn.Sequential`` or layer records) on
    images of ``(channels, height, width)``; ``outputs`` (the targets' width), when given, must
    match the last layer's."""
    recs = layer_records(network)
    if len(image) != 3 or any(int(v) < 1 for v in image):
        raise NetworkSpecError(
            f"images of shape {tuple(image)}; a CNN trains on (samples, channels, height, width)"
        )
    c, h, w = (int(v) for v in image)
    if not recs or recs[-1]["kind"] != "linear":
        raise NetworkSpecError(
            "the network must end with a Linear layer (the output layer; the loss applies its "
            f"softmax or sigmoid); it ends with {recs[-1]['kind'] if recs else 'nothing'}"
        )
    stages: list[Stage] = []
    shape: tuple[int, ...] = (c, h, w)  # the current activation per sample
    cur: dict[str, Any] | None = None  # the stage being built
    post: list[tuple] = []

    def close(out_hw: tuple[int, int]) -> None:
        nonlocal cur, post
        if cur is not None:
            stages.append(
                Stage(
                    cur["kind"],
                    cur["out"],
                    cur["out"],
                    cur["inputs"],
                    cur["in_hw"],
                    cur.get("kernel", 1),
                    cur.get("stride", 1),
                    cur.get("padding", 0),
                    cur["bias"],
                    tuple(post),
                    cur["conv_hw"],
                    out_hw,
                )
            )
        cur, post = None, []

    for i, rec in enumerate(recs):
        kind, where = rec["kind"], f"layer {i} ({rec['kind']})"
        if "inputs" in rec and kind in ("conv", "linear"):
            have = shape[0]
            if len(shape) == 3 and kind == "linear":
                break  # reported below: a Flatten is missing
            if rec["inputs"] != have:
                what = "input channels" if kind == "conv" else "input features"
                raise NetworkSpecError(
                    f"{where} takes {rec['inputs']} {what}; the layer before gives {have} "
                    f"(images are {c}x{h}x{w}). Make them agree"
                )
        if i == len(recs) - 1:
            break
        if kind == "conv":
            if len(shape) != 3:
                raise NetworkSpecError(
                    f"{where} follows a flattened or dense layer; a conv layer needs maps of "
                    f"(channels, height, width): put conv layers before Flatten"
                )
            close((shape[1], shape[2]))
            k, s, p = rec["kernel"], rec["stride"], rec["padding"]
            ho, wo = (shape[1] + 2 * p - k) // s + 1, (shape[2] + 2 * p - k) // s + 1
            if ho < 1 or wo < 1:
                raise NetworkSpecError(
                    f"{where}: kernel {k} (padding {p}) does not fit maps of "
                    f"{shape[1]}x{shape[2]}; images are {c}x{h}x{w}. Use a smaller kernel, "
                    f"more padding or larger images"
                )
            cur = dict(
                kind="conv",
                out=rec["out"],
                inputs=shape[0],
                in_hw=shape[1:],
                kernel=k,
                stride=s,
                padding=p,
                bias=rec["bias"],
                conv_hw=(ho, wo),
            )
            shape = (rec["out"], ho, wo)
        elif kind == "linear":
            if len(shape) != 1:
                raise NetworkSpecError(
                    f"{where} follows maps of {shape}; put a Flatten before the first Linear"
                )
            close((1, 1))
            cur = dict(
                kind="linear",
                out=rec["out"],
                inputs=shape[0],
                in_hw=(1, 1),
                bias=rec["bias"],
                conv_hw=(1, 1),
            )
            shape = (rec["out"],)
        elif kind == "flatten":
            if len(shape) == 3:
                if cur is not None:
                    close((shape[1], shape[2]))
                elif not stages:
                    raise NetworkSpecError(
                        f"{where}: the images are flattened before any conv layer; this is "
                        f"an MLP: train it with hidden=... (or put a conv layer first)"
                    )
                shape = (int(np.prod(shape)),)
        else:  # activation or pooling: on the channels of the stage before
            if cur is None:
                raise NetworkSpecError(
                    f"{where} comes before any conv or linear layer (or right after Flatten "
                    f"closed one); put it after a conv or linear layer"
                )
            if kind in _POOLS:
                if len(shape) != 3:
                    raise NetworkSpecError(f"{where} follows a dense layer; pool conv maps only")
                k, s = rec["kernel"], rec["stride"]
                ho, wo = (shape[1] - k) // s + 1, (shape[2] - k) // s + 1
                if ho < 1 or wo < 1:
                    raise NetworkSpecError(
                        f"{where}: window {k} does not fit maps of {shape[1]}x{shape[2]}; images "
                        f"are {c}x{h}x{w}. Use a smaller window or larger images"
                    )
                post.append((kind, k, s))
                shape = (shape[0], ho, wo)
            else:
                post.append((kind,))
    if len(shape) != 1:
        raise NetworkSpecError(
            f"the output Linear follows maps of {shape}; put a Flatten before it"
        )
    close((1, 1) if cur is None or cur["kind"] == "linear" else cur["conv_hw"])
    if not stages:
        raise NetworkSpecError(
            "the network has no conv or hidden linear layer before its output layer; a single "
            "Linear is a linear model, train it with fit(hidden=...) as an MLP"
        )
    last = recs[-1]
    l = last["out"]  # noqa: E741
    if outputs is not None and int(outputs) != l:
        raise NetworkSpecError(
            f"the network's last Linear has {l} outputs but the targets have {outputs} columns "
            f"(classes); make them agree"
        )
    # the output layer's input: the last stage's output (after Flatten)
    if shape[0] != stages[-1].channels * stages[-1].positions:
        raise NetworkSpecError(
            f"the output Linear takes {shape[0]} features; the last stage gives "
            f"{stages[-1].channels * stages[-1].positions}"
        )
    if last["bias"]:
        stages[-1] = stages[-1]._replace(units=stages[-1].units + 1)
    return ConvLayers((c, h, w), tuple(stages), l, bool(last["bias"]))


# ---------------------------------------------------------------------- parameters


def init_conv_params(
    layers: ConvLayers, *, seed: int = 0, dtype: Any = "float64"
) -> list[np.ndarray]:
    """Seeded initial parameters, uniform in ``[-1/sqrt(fan_in), 1/sqrt(fan_in)]`` per layer (the
    bound PyTorch's default initialisation uses), the bias channel at 0."""
    rng = np.random.default_rng(seed)
    out = []
    for p, shape in zip(layers.params, layers.full_shapes()):
        st = layers.stages[p.layer]
        fan = st.fan_in if p.axis == 0 else st.channels * st.positions
        a = rng.uniform(-1.0, 1.0, size=shape) / np.sqrt(fan)
        out.append(a.astype(dtype))
    _zero_bias_channel(layers, out)
    return out


def _zero_bias_channel(layers: ConvLayers, params: list[np.ndarray]) -> None:
    if not layers.out_bias:
        return
    last = layers.depth - 1
    for p, a in zip(layers.params, params):
        if p.layer == last and p.axis == 0:
            a[-1] = 0.0
        elif p.axis == 1:
            a[:, -1, 1:] = 0.0


def params_from_torch(module: Any, layers: ConvLayers, dtype: Any = "float64") -> list[np.ndarray]:
    """The parameters of ``module`` (its weights now) in :class:`ConvLayers`' layout."""
    tnn = xb.torch().nn

    dense = [m for m in module if isinstance(m, (tnn.Conv2d, tnn.Linear))]
    out: list[np.ndarray] = []
    for k, st in enumerate(layers.stages):
        m = dense[k]
        w = m.weight.detach().cpu().double().numpy()
        b = m.bias.detach().cpu().double().numpy() if m.bias is not None else None
        if st.units != st.channels:  # the bias channel's zero row
            w = np.concatenate([w, np.zeros((1, *w.shape[1:]))])
            b = None if b is None else np.concatenate([b, [0.0]])
        out.append(np.ascontiguousarray(w, dtype=dtype))
        if b is not None:
            out.append(np.ascontiguousarray(b, dtype=dtype))
    last = dense[-1]
    st = layers.stages[-1]
    V = np.zeros((layers.l, st.units, st.positions), dtype=dtype)
    V[:, : st.channels, :] = (
        last.weight.detach().cpu().double().numpy().reshape(layers.l, st.channels, st.positions)
    )
    if last.bias is not None:
        V[:, -1, 0] = last.bias.detach().cpu().double().numpy()
    out.append(V)
    return out


def user_params(
    layers: ConvLayers, params: Sequence[np.ndarray]
) -> list[tuple[np.ndarray, np.ndarray | None]]:
    """``(weight, bias)`` of every layer, output layer last, as ``torch.nn`` holds them."""
    out: list[tuple[np.ndarray, np.ndarray | None]] = []
    it = iter(zip(layers.params, params))
    for st in layers.stages:
        _, w = next(it)
        b = next(it)[1] if st.bias else None
        if st.units != st.channels:
            w, b = w[: st.channels], (None if b is None else b[: st.channels])
        out.append((w, b))
    V = params[-1]
    st = layers.stages[-1]
    out.append(
        (
            V[:, : st.channels, :].reshape(layers.l, st.channels * st.positions),
            V[:, -1, 0].copy() if layers.out_bias else None,
        )
    )
    return out


def to_torch(layers: ConvLayers, params: Sequence[np.ndarray]) -> Any:
    """A ``torch.nn.Sequential`` of the network holding ``params`` (float64 for float64 ones)."""
    torch = xb.torch()
    tnn = torch.nn

    mods: list[Any] = []
    shape: tuple[int, ...] = layers.image
    for rec in layers.records():
        kind = rec["kind"]
        if kind == "conv":
            mods.append(
                tnn.Conv2d(
                    shape[0],
                    rec["out"],
                    rec["kernel"],
                    rec["stride"],
                    rec["padding"],
                    bias=rec["bias"],
                )
            )
            shape = (rec["out"],)
        elif kind == "linear":
            mods.append(tnn.Linear(shape[0], rec["out"], bias=rec["bias"]))
            shape = (rec["out"],)
        elif kind == "maxpool":
            mods.append(tnn.MaxPool2d(rec["kernel"], rec["stride"]))
        elif kind == "avgpool":
            mods.append(tnn.AvgPool2d(rec["kernel"], rec["stride"]))
        elif kind == "flatten":
            mods.append(tnn.Flatten())
            st = layers.stages[sum(1 for m in mods if isinstance(m, (tnn.Conv2d, tnn.Linear))) - 1]
            shape = (st.channels * st.positions,)
        else:
            mods.append({"relu": tnn.ReLU, "tanh": tnn.Tanh, "sigmoid": tnn.Sigmoid}[kind]())
    seq = tnn.Sequential(*mods)
    if np.asarray(params[0]).dtype == np.float64:  # before the copies: float32 would round them
        seq = seq.double()
    dense = [m for m in seq if isinstance(m, (tnn.Conv2d, tnn.Linear))]
    with torch.no_grad():
        for m, (w, b) in zip(dense, user_params(layers, params)):
            m.weight.copy_(torch.from_numpy(np.ascontiguousarray(w)).to(m.weight.dtype))
            if b is not None:
                m.bias.copy_(torch.from_numpy(np.ascontiguousarray(b)).to(m.bias.dtype))
    return seq


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
