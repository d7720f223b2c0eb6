"""How a user describes a CNN: a ``torch.nn.Sequential`` or a list of layer records, to a
:class:`~dask_rpm.nn.cnn.ConvLayers`.

Pure (numpy only; a torch module is read by :mod:`dask_rpm.nn.cnn_torch`). A layer record is a
dict with one kind key (``{"conv": 6, "kernel": 5, "stride": 1, "padding": 2}``,
``{"maxpool": 2}``, ``{"avgpool": 2, "stride": 2}``, ``{"linear": 120}``) or a name
(``"relu"``, ``"tanh"``, ``"sigmoid"``, ``"flatten"``): what a job file's ``network:`` holds
and what a CNN needs without torch. :func:`conv_layers` walks the records into stages (a conv
or linear layer and the per-channel operations after it), checking that each layer fits what
reaches it; every refusal names the layer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .cnn import LAYER_KINDS, POOLS, ConvLayers, NetworkSpecError, Stage
from .cnn_torch import torch_records

__all__ = ["layer_records", "conv_layers", "init_conv_params"]


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
    if kind in POOLS:
        out["kernel"] = _int(item, kind, 2, where, 1)
        out["stride"] = _int(item, "stride", out["kernel"], where, 1)
    return out


def layer_records(network: Any) -> list[dict[str, Any]]:
    """The network as normalised layer records (each a dict with its ``kind``): from a
    ``torch.nn.Sequential`` or from a list of records."""
    if type(network).__module__.startswith("torch"):
        return [_record(rec, i) for i, rec in enumerate(torch_records(network))]
    if isinstance(network, (str, bytes, Mapping)) or not isinstance(network, Sequence):
        raise NetworkSpecError(
            f"network={network!r}; give a torch.nn.Sequential or a list of layer records such "
            f"as [{{'conv': 6, 'kernel': 5}}, 'relu', {{'maxpool': 2}}, 'flatten', {{'linear': 10}}]"
        )
    return [_record(item, i) for i, item in enumerate(network)]


class _Stages:
    """Walks layer records into stages: the activation shape after each layer, the stage being
    built (a conv or linear layer) and the per-channel operations after it."""

    def __init__(self, image: tuple[int, int, int]) -> None:
        self.image = image
        self.shape: tuple[int, ...] = image  # the activation per sample after the last layer
        self.stages: list[Stage] = []
        self.cur: dict[str, Any] | None = None  # the stage being built
        self.post: list[tuple] = []

    def _images(self) -> str:
        c, h, w = self.image
        return f"images are {c}x{h}x{w}"

    def close(self, out_hw: tuple[int, int]) -> None:
        """End the stage being built; its output map is ``out_hw``."""
        cur = self.cur
        if cur is not None:
            self.stages.append(
                Stage(
                    cur["kind"], cur["out"], cur["out"], cur["inputs"], cur["in_hw"],
                    cur.get("kernel", 1), cur.get("stride", 1), cur.get("padding", 0),
                    cur["bias"], tuple(self.post), cur["conv_hw"], out_hw,
                )
            )  # fmt: skip
        self.cur, self.post = None, []

    def check_inputs(self, rec: dict[str, Any], where: str) -> None:
        """A torch layer's declared inputs against what reaches it."""
        have = self.shape[0]
        if rec["inputs"] != have:
            what = "input channels" if rec["kind"] == "conv" else "input features"
            raise NetworkSpecError(
                f"{where} takes {rec['inputs']} {what}; the layer before gives {have} "
                f"({self._images()}). Make them agree"
            )

    def conv(self, rec: dict[str, Any], where: str) -> None:
        shape = self.shape
        if len(shape) != 3:
            raise NetworkSpecError(
                f"{where} follows a flattened or dense layer; a conv layer needs maps of "
                f"(channels, height, width): put conv layers before Flatten"
            )
        self.close((shape[1], shape[2]))
        k, s, p = rec["kernel"], rec["stride"], rec["padding"]
        ho, wo = (shape[1] + 2 * p - k) // s + 1, (shape[2] + 2 * p - k) // s + 1
        if ho < 1 or wo < 1:
            raise NetworkSpecError(
                f"{where}: kernel {k} (padding {p}) does not fit maps of {shape[1]}x{shape[2]}; "
                f"{self._images()}. Use a smaller kernel, more padding or larger images"
            )
        self.cur = dict(
            kind="conv", out=rec["out"], inputs=shape[0], in_hw=(shape[1], shape[2]), kernel=k,
            stride=s, padding=p, bias=rec["bias"], conv_hw=(ho, wo),
        )  # fmt: skip
        self.shape = (rec["out"], ho, wo)

    def linear(self, rec: dict[str, Any], where: str) -> None:
        if len(self.shape) != 1:
            raise NetworkSpecError(
                f"{where} follows maps of {self.shape}; put a Flatten before the first Linear"
            )
        self.close((1, 1))
        self.cur = dict(
            kind="linear", out=rec["out"], inputs=self.shape[0], in_hw=(1, 1), bias=rec["bias"],
            conv_hw=(1, 1),
        )  # fmt: skip
        self.shape = (rec["out"],)

    def flatten(self, where: str) -> None:
        shape = self.shape
        if len(shape) != 3:
            return
        if self.cur is not None:
            self.close((shape[1], shape[2]))
        elif not self.stages:
            raise NetworkSpecError(
                f"{where}: the images are flattened before any conv layer; this is an MLP: "
                f"train it with hidden=... (or put a conv layer first)"
            )
        self.shape = (int(np.prod(shape)),)

    def per_channel(self, rec: dict[str, Any], where: str) -> None:
        """An activation or a pooling: on the channels of the stage before."""
        kind, shape = rec["kind"], self.shape
        if self.cur is None:
            raise NetworkSpecError(
                f"{where} comes before any conv or linear layer (or right after Flatten closed "
                f"one); put it after a conv or linear layer"
            )
        if kind not in POOLS:
            self.post.append((kind,))
            return
        if len(shape) != 3:
            raise NetworkSpecError(f"{where} follows a dense layer; pool conv maps only")
        k, s = rec["kernel"], rec["stride"]
        ho, wo = (shape[1] - k) // s + 1, (shape[2] - k) // s + 1
        if ho < 1 or wo < 1:
            raise NetworkSpecError(
                f"{where}: window {k} does not fit maps of {shape[1]}x{shape[2]}; "
                f"{self._images()}. Use a smaller window or larger images"
            )
        self.post.append((kind, k, s))
        self.shape = (shape[0], ho, wo)

    def finish(self, last: dict[str, Any], outputs: int | None) -> ConvLayers:
        """The geometry, once the records before the output ``Linear`` ``last`` are walked."""
        if len(self.shape) != 1:
            raise NetworkSpecError(
                f"the output Linear follows maps of {self.shape}; put a Flatten before it"
            )
        cur = self.cur
        self.close((1, 1) if cur is None or cur["kind"] == "linear" else cur["conv_hw"])
        stages = self.stages
        if not stages:
            raise NetworkSpecError(
                "the network has no conv or hidden linear layer before its output layer; a "
                "single Linear is a linear model, train it with fit(hidden=...) as an MLP"
            )
        l = last["out"]  # noqa: E741
        if outputs is not None and int(outputs) != l:
            raise NetworkSpecError(
                f"the network's last Linear has {l} outputs but the targets have {outputs} "
                f"columns (classes); make them agree"
            )
        if self.shape[0] != stages[-1].channels * stages[-1].positions:
            raise NetworkSpecError(
                f"the output Linear takes {self.shape[0]} features; the last stage gives "
                f"{stages[-1].channels * stages[-1].positions}"
            )
        if last["bias"]:  # the output bias channel (dask_rpm.nn.cnn)
            stages[-1] = stages[-1]._replace(units=stages[-1].units + 1)
        return ConvLayers(self.image, tuple(stages), l, bool(last["bias"]))


def conv_layers(network: Any, image: Sequence[int], outputs: int | None = None) -> ConvLayers:
    """The :class:`~dask_rpm.nn.cnn.ConvLayers` of ``network`` (a ``torch.nn.Sequential`` or
    layer records) on images of ``(channels, height, width)``; ``outputs`` (the targets' width),
    when given, must match the last layer's."""
    recs = layer_records(network)
    if len(image) != 3 or any(int(v) < 1 for v in image):
        raise NetworkSpecError(
            f"images of shape {tuple(image)}; a CNN trains on (samples, channels, height, width)"
        )
    if not recs or recs[-1]["kind"] != "linear":
        raise NetworkSpecError(
            "the network must end with a Linear layer (the output layer; the loss applies its "
            f"softmax or sigmoid); it ends with {recs[-1]['kind'] if recs else 'nothing'}"
        )
    walk = _Stages((int(image[0]), int(image[1]), int(image[2])))
    for i, rec in enumerate(recs):
        kind, where = rec["kind"], f"layer {i} ({rec['kind']})"
        if kind in ("conv", "linear") and "inputs" in rec:
            if kind == "linear" and len(walk.shape) == 3:
                break  # refused below: a Flatten is missing
            walk.check_inputs(rec, where)
        if i == len(recs) - 1:
            break
        if kind == "conv":
            walk.conv(rec, where)
        elif kind == "linear":
            walk.linear(rec, where)
        elif kind == "flatten":
            walk.flatten(where)
        else:
            walk.per_channel(rec, where)
    return walk.finish(recs[-1], outputs)


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
