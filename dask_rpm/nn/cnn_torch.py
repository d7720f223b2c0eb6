"""CNNs and torch: reading a ``torch.nn.Sequential`` (its layers and its weights) and building one.

Pure apart from torch, which it reaches through :func:`dask_rpm.nn.backend.torch` only when a
user's module is read or a module is asked for. The parameters are in
:class:`~dask_rpm.nn.cnn.ConvLayers`' layout (``W1, b1, ..., V``, the output bias in ``V``'s bias
channel).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from . import backend as xb
from .cnn import SUPPORTED_LAYERS, ConvLayers, NetworkSpecError

__all__ = ["torch_records", "params_from_torch", "user_params", "to_torch"]


def torch_records(module: Any) -> list[Any]:
    """The layer records of a ``torch.nn.Sequential``, as a user would write them (refusing what
    the kernels do not compute); :func:`~dask_rpm.nn.cnn_records.layer_records` checks them."""
    if not isinstance(module, xb.torch().nn.Sequential):
        raise NetworkSpecError(
            f"network is a {type(module).__name__}; give a torch.nn.Sequential of "
            f"{SUPPORTED_LAYERS}, or a list of layer records"
        )
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
                    f"{where} has {', '.join(bad)}; supported: {SUPPORTED_LAYERS}. Use groups=1, "
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
                raise NetworkSpecError(
                    f"{where} has {', '.join(extra)}; supported: {SUPPORTED_LAYERS}"
                )
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
                f"{where} is not supported; supported: {SUPPORTED_LAYERS}. Remove it (BatchNorm, "
                f"Dropout and others change training in ways the exact engine does not compute)"
            )
        out.append(rec)
    return out


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
