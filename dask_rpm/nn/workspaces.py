"""The workspace of a rectangle, for whichever network it trains: an MLP's or a CNN's.

Pure. The engine, the serial reference and the validation set ask here, so they need not know
which kind of network a run trains (:func:`~dask_rpm.nn.cnn.is_conv`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .backend import Backend
from .cnn import is_conv
from .cnn_kernels import ConvWorkspace
from .kernels import Workspace
from .network import Network

__all__ = ["workspace", "whole_workspace"]


def workspace(s: int, **kw: Any) -> Workspace:
    """The workspace of a rectangle of ``layers=`` (an MLP's :class:`~dask_rpm.nn.kernels.Workspace`,
    or a CNN's :class:`~dask_rpm.nn.cnn_kernels.ConvWorkspace`); the keywords are
    :class:`~dask_rpm.nn.kernels.Workspace`'s."""
    if is_conv(kw.get("layers")):
        return ConvWorkspace(s, **kw)
    return Workspace(s, **kw)


def whole_workspace(
    s: int,
    params: Sequence[np.ndarray],
    net: Network | None = None,
    loss_scale: float = 1.0,
    backend: Backend | None = None,
    layers: Any = None,
) -> Workspace:
    """:meth:`Workspace.whole <dask_rpm.nn.kernels.Workspace.whole>` for an MLP (``layers`` None:
    read from ``params``) or a CNN (``layers`` its :class:`~dask_rpm.nn.cnn.ConvLayers`)."""
    if is_conv(layers):
        return ConvWorkspace.whole(s, params, net, loss_scale, backend, layers=layers)
    return Workspace.whole(s, params, net, loss_scale, backend)
