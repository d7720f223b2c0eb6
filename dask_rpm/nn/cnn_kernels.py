"""Forward and backward kernels of a CNN rectangle: a worker's channels of every stage.

Pure (numpy; torch's convolution and pooling kernels where torch is installed). The
:class:`ConvWorkspace` has the interface of the MLP's
:class:`~dask_rpm.nn.kernels.Workspace` (the engine's block loop, the serial reference and the
probe run either), and shares its output layer, loss and buffers for the summed output.

Two kernel sets compute the same thing:

* ``torch``: ``conv2d`` / ``max_pool2d`` / ``avg_pool2d`` and their backward kernels (what
  a PyTorch loop runs), on torch tensors, or on numpy arrays through zero-copy views;
* ``numpy``: im2col by stride tricks and one GEMM per convolution, its transpose for the
  input gradient (a loop over the ``K x K`` filter taps, none over pixels or samples), and
  pooling by windows (max-pooling keeps the first maximum of a window in row-major order, as
  PyTorch does).

``kernels="auto"`` is torch's where torch can be imported, else numpy's. The serial reference
and the workers of a run choose the same way, so they compute the same numbers.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from . import backend as xb
from .backend import NUMPY, Backend
from .cnn import ConvLayers
from .kernels import Workspace
from .network import Network

__all__ = ["ConvWorkspace", "resolve_kernels", "check_backend", "KERNELS"]

#: The kernel sets a :class:`ConvWorkspace` takes (``kernels=``; training uses ``auto``).
KERNELS = ("auto", "torch", "numpy")


def check_backend(backend_name: str) -> None:
    """Refuse a backend that has no CNN kernels before any work starts (a
    :class:`~dask_rpm.nn.backend.BackendError` saying which do)."""
    if backend_name == "cupy":
        raise xb.BackendError(
            "backend='cupy' has no CNN kernels; a CNN trains with backend='torch' (its CPU or "
            "GPU kernels), 'numpy' or 'auto' (torch on a worker's GPU)"
        )


def resolve_kernels(name: str, backend: Backend) -> str:
    """``torch`` or ``numpy`` for the kernel set ``name`` on ``backend`` (a torch backend always
    runs torch's)."""
    if name not in KERNELS:
        raise ValueError(f"cnn kernels={name!r}; valid: {', '.join(KERNELS)}")
    if backend.name == "torch":
        return "torch"
    if backend.name != "numpy":
        raise ValueError(
            f"backend {backend.label!r} has no CNN kernels; use backend='numpy' or 'torch'"
        )
    if name == "auto":
        return "torch" if importlib.util.find_spec("torch") is not None else "numpy"
    return name


# ---------------------------------------------------------------------- kernel sets


class _NumpyOps:
    """im2col convolution and window pooling on numpy arrays."""

    @staticmethod
    def conv(x: np.ndarray, W: np.ndarray, b: Any, stride: int, pad: int) -> tuple[Any, Any]:
        s, c, h, w = x.shape
        K = W.shape[2]
        if pad:
            xp = np.zeros((s, c, h + 2 * pad, w + 2 * pad), dtype=x.dtype)
            xp[:, :, pad : pad + h, pad : pad + w] = x
        else:
            xp = x
        win = sliding_window_view(xp, (K, K), axis=(2, 3))[:, :, ::stride, ::stride]
        ho, wo = win.shape[2], win.shape[3]
        cols = np.ascontiguousarray(win.transpose(0, 2, 3, 1, 4, 5)).reshape(s * ho * wo, c * K * K)
        out = cols @ W.reshape(W.shape[0], -1).T
        if b is not None:
            out += b
        z = np.ascontiguousarray(out.reshape(s, ho, wo, W.shape[0]).transpose(0, 3, 1, 2))
        return z, (cols, x.shape, xp.shape)

    @staticmethod
    def conv_backward(
        dz: np.ndarray, cache: Any, W: np.ndarray, stride: int, pad: int, bias: bool, need_dx: bool
    ) -> tuple[Any, Any, Any]:
        cols, xshape, pshape = cache
        s, r, ho, wo = dz.shape
        K = W.shape[2]
        dz2 = np.ascontiguousarray(dz.transpose(0, 2, 3, 1)).reshape(s * ho * wo, r)
        dW = (dz2.T @ cols).reshape(W.shape)
        db = dz2.sum(axis=0) if bias else None
        if not need_dx:
            return dW, db, None
        dcols = (dz2 @ W.reshape(r, -1)).reshape(s, ho, wo, xshape[1], K, K)
        dxp = np.zeros(pshape, dtype=dz.dtype)
        for i in range(K):
            for j in range(K):
                dxp[:, :, i : i + stride * ho : stride, j : j + stride * wo : stride] += dcols[
                    :, :, :, :, i, j
                ].transpose(0, 3, 1, 2)
        h, w = xshape[2], xshape[3]
        return dW, db, dxp[:, :, pad : pad + h, pad : pad + w]

    @staticmethod
    def maxpool(x: np.ndarray, k: int, s: int) -> tuple[Any, Any]:
        win = sliding_window_view(x, (k, k), axis=(2, 3))[:, :, ::s, ::s]
        flat = win.reshape(*win.shape[:4], k * k)
        idx = flat.argmax(axis=-1)  # the first maximum in row-major order
        out = np.take_along_axis(flat, idx[..., None], axis=-1)[..., 0]
        return np.ascontiguousarray(out), (idx, x.shape)

    @staticmethod
    def maxpool_backward(g: np.ndarray, cache: Any, k: int, s: int) -> np.ndarray:
        idx, shape = cache
        ho, wo = g.shape[2], g.shape[3]
        dx = np.zeros(shape, dtype=g.dtype)
        for t in range(k * k):
            i, j = divmod(t, k)
            dx[:, :, i : i + s * ho : s, j : j + s * wo : s] += np.where(idx == t, g, 0.0)
        return dx

    @staticmethod
    def avgpool(x: np.ndarray, k: int, s: int) -> tuple[Any, Any]:
        win = sliding_window_view(x, (k, k), axis=(2, 3))[:, :, ::s, ::s]
        return win.mean(axis=(-2, -1)), x.shape

    @staticmethod
    def avgpool_backward(g: np.ndarray, shape: Any, k: int, s: int) -> np.ndarray:
        ho, wo = g.shape[2], g.shape[3]
        dx = np.zeros(shape, dtype=g.dtype)
        share = g / (k * k)
        for i in range(k):
            for j in range(k):
                dx[:, :, i : i + s * ho : s, j : j + s * wo : s] += share
        return dx


class _TorchOps:
    """torch's kernels; numpy arrays in and out through zero-copy views (``wrap``)."""

    def __init__(self, wrap: bool) -> None:
        torch = xb.torch()
        self.torch, self.F, self.wrap = torch, torch.nn.functional, wrap

    def _t(self, a: Any) -> Any:
        return self.torch.from_numpy(np.ascontiguousarray(a)) if self.wrap else a

    def _n(self, t: Any) -> Any:
        return t.numpy() if self.wrap else t

    def conv(self, x: Any, W: Any, b: Any, stride: int, pad: int) -> tuple[Any, Any]:
        xt = self._t(x)
        z = self.F.conv2d(xt, self._t(W), None if b is None else self._t(b), stride, pad)
        return self._n(z), xt

    def conv_backward(
        self, dz: Any, xt: Any, W: Any, stride: int, pad: int, bias: bool, need_dx: bool
    ) -> tuple[Any, Any, Any]:
        Wt = self._t(W)
        gi, gw, gb = self.torch.ops.aten.convolution_backward(
            self._t(dz),
            xt,
            Wt,
            [Wt.shape[0]] if bias else None,
            [stride, stride],
            [pad, pad],
            [1, 1],
            False,
            [0, 0],
            1,
            [need_dx, True, bias],
        )
        return self._n(gw), (self._n(gb) if bias else None), (self._n(gi) if need_dx else None)

    def maxpool(self, x: Any, k: int, s: int) -> tuple[Any, Any]:
        xt = self._t(x)
        out, idx = self.F.max_pool2d(xt, k, s, return_indices=True)
        return self._n(out), (xt, idx)

    def maxpool_backward(self, g: Any, cache: Any, k: int, s: int) -> Any:
        xt, idx = cache
        return self._n(
            self.torch.ops.aten.max_pool2d_with_indices_backward(
                self._t(g), xt, [k, k], [s, s], [0, 0], [1, 1], False, idx
            )
        )

    def avgpool(self, x: Any, k: int, s: int) -> tuple[Any, Any]:
        xt = self._t(x)
        return self._n(self.F.avg_pool2d(xt, k, s)), xt

    def avgpool_backward(self, g: Any, xt: Any, k: int, s: int) -> Any:
        return self._n(
            self.torch.ops.aten.avg_pool2d_backward(
                self._t(g), xt, [k, k], [s, s], [0, 0], False, True, None
            )
        )


def _ops(kernels: str, backend: Backend) -> Any:
    name = resolve_kernels(kernels, backend)
    if name == "numpy":
        return _NumpyOps()
    return _TorchOps(wrap=backend.name == "numpy")


# ---------------------------------------------------------------------- workspace


class ConvWorkspace(Workspace):
    layers: ConvLayers

    """Buffers and kernels of one CNN rectangle: ``units[k]`` channels of every stage ``k``.

    The engine's interface of :class:`~dask_rpm.nn.kernels.Workspace`: :meth:`forward` /
    :meth:`backward` when the rectangle holds every channel, else :meth:`layer_forward` /
    :meth:`layer_backward` stage by stage with the column's exchanges between them; the output
    layer, the loss and its deltas are the MLP's (:meth:`output_delta`).

    Samples arrive as rows of ``n = channels x height x width`` (how every sample path carries
    them) and are seen as images here, without a copy.
    """

    def __init__(
        self,
        s: int,
        m: int = 0,
        n: int = 0,
        l: int = 0,  # noqa: E741
        dtype: Any = "float64",
        net: Network | None = None,
        bias_row: int | None = None,
        loss_scale: float = 1.0,
        *,
        layers: ConvLayers,
        units: tuple[int, ...] | None = None,
        bias_rows: tuple[int | None, ...] | None = None,
        backend: Backend | None = None,
        kernels: str = "auto",
    ) -> None:
        self.key = (
            s,
            *_conv_key(
                dtype=dtype,
                net=net,
                loss_scale=loss_scale,
                layers=layers,
                units=units,
                bias_rows=bias_rows,
                backend=backend,
                kernels=kernels,
            ),
        )
        layers, units, dt, self.net, self.bias_rows, self.loss_scale, be, kernels = self.key[1:]
        self.backend, self.xp = be, be.ns
        self.layers, self.units = layers, units
        self.ops = _ops(kernels, be)
        empty = be.empty
        L, l = layers.depth, layers.l  # noqa: E741
        self._shapes = [self._out_shape(k, u) for k, u in enumerate(units)]
        self._f = [empty((s, *sh), dt) for sh in self._shapes]
        self._d = [empty((s, *sh), dt) for sh in self._shapes]
        self._full = [
            self._f[k]
            if units[k] == layers.hidden[k]
            else empty((s, *self._out_shape(k, layers.hidden[k])), dt)
            for k in range(L - 1)
        ]
        self._gin: list[Any] = [empty((0, 0), dt)] + [
            self._d[k - 1]
            if units[k - 1] == layers.hidden[k - 1]
            else empty((s, *self._out_shape(k - 1, layers.hidden[k - 1])), dt)
            for k in range(1, L)
        ]
        self._output_buffers(s, l, dt)
        self.grads = [empty(shape, dt) for shape in layers.shapes([(0, u) for u in units])]
        # each stage's parameter indices (W, and b or None)
        self._pidx: list[tuple[int, int | None]] = []
        names = layers.names
        for k, st in enumerate(layers.stages):
            self._pidx.append(
                (names.index(f"W{k + 1}"), names.index(f"b{k + 1}") if st.bias else None)
            )
        self._cache: list[Any] = [None] * L
        self.rows = s

    def _out_shape(self, k: int, u: int) -> tuple[int, ...]:
        st = self.layers.stages[k]
        return (u, *st.out_hw) if st.kind == "conv" else (u,)

    @classmethod
    def whole(  # type: ignore[override]  # a CNN's geometry is not in its parameters
        cls,
        s: int,
        params: Sequence[np.ndarray],
        net: Network | None = None,
        loss_scale: float = 1.0,
        backend: Backend | None = None,
        *,
        layers: ConvLayers,
        kernels: str = "auto",
    ) -> ConvWorkspace:
        """A workspace for the whole network (every channel), on ``backend``."""
        return cls(
            s,
            dtype=xb.dtype_of(params[0]),
            net=net,
            loss_scale=loss_scale,
            layers=layers,
            bias_rows=layers.bias_rows((0, layers.m)),
            backend=backend,
            kernels=kernels,
        )

    def fits(self, s: int, *args: Any, **kw: Any) -> bool:
        if not isinstance(kw.get("layers"), ConvLayers):
            return False
        return self.key[1:] == _conv_key(*args, **kw) and s <= self.key[0]

    # ------------------------------------------------------------ forward
    def _input(self, k: int, inp: Any) -> Any:
        """Stage ``k``'s whole input in the shape its layer takes (a view)."""
        st = self.layers.stages[k]
        s = inp.shape[0]
        if st.kind == "conv":
            if k == 0:
                return inp.reshape(s, *self.layers.image)
            return inp
        return inp.reshape(s, -1)

    def _real(self, k: int) -> int:
        """Channels of stage ``k`` this rectangle computes (its rows but the bias channel)."""
        return self.units[k] - (1 if self.bias_rows[k] is not None else 0)

    def layer_forward(self, k: int, inp: Any, params: Sequence[Any]) -> Any:
        """Stage ``k``'s outputs of my channels from its whole input ``inp``."""
        if k == 0:
            self.use(inp.shape[0])
        st, ops, xp = self.layers.stages[k], self.ops, self.xp
        iw, ib = self._pidx[k]
        r = self._real(k)
        W = params[iw][:r]
        b = params[ib][:r] if ib is not None else None
        x = self._input(k, inp)
        if r == 0:  # the bias channel alone: nothing to compute
            self._cache[k] = (x, None, [])
            f = self.local(k)
            self._bias_channel(f, self.bias_rows[k])
            return f
        if st.kind == "conv":
            z, conv_cache = ops.conv(x, W, b, st.stride, st.padding)
        else:
            z = x @ W.T
            if b is not None:
                z += b
            conv_cache = None
        steps = []
        a = z
        for op in st.post:
            name = op[0]
            if name == "relu":
                xb.relu_(a)
                steps.append(a)
            elif name == "tanh":
                xp.tanh(a, out=a)
                steps.append(a)
            elif name == "sigmoid":
                self._sigmoid(a)
                steps.append(a)
            elif name == "maxpool":
                a, c = ops.maxpool(a, op[1], op[2])
                steps.append(c)
            else:  # avgpool
                a, c = ops.avgpool(a, op[1], op[2])
                steps.append(c)
        self._cache[k] = (x, conv_cache, steps)
        f = self.local(k)
        if r:
            xb.copyto(f[:, :r], a)
        self._bias_channel(f, self.bias_rows[k])
        return f

    @staticmethod
    def _bias_channel(f: Any, br: int | None) -> None:
        """The bias channel's output: 1 at its first position, 0 elsewhere (module docstring of
        :mod:`dask_rpm.nn.cnn`), so ``V[:, -1, 0]`` is the output bias."""
        if br is None:
            return
        f[:, br] = 0.0
        if f.ndim == 4:
            f[:, br, 0, 0] = 1.0
        else:
            f[:, br] = 1.0

    def output_partial(self, params: Sequence[Any]) -> Any:
        """The partial product of my last-stage channels with my columns of ``V``."""
        partial = self.partial
        f = self.local(self.layers.depth - 1)
        V = params[-1]
        self.xp.matmul(f.reshape(f.shape[0], -1), V.reshape(V.shape[0], -1).T, out=partial)
        return partial

    def forward(self, x: Any, params: Sequence[Any]) -> Any:
        inp = x
        for k in range(self.layers.depth):
            inp = self.layer_forward(k, inp, params)
        return self.output_partial(params)

    # ------------------------------------------------------------ backward
    def output_backward(self, params: Sequence[Any], delta2: Any) -> Any:
        L = self.layers.depth
        f, d, V, xp = self.local(L - 1), self.delta(L - 1), params[-1], self.xp
        xp.matmul(delta2, V.reshape(V.shape[0], -1), out=d.reshape(d.shape[0], -1))
        g = self.grads[-1]
        xp.matmul(delta2.T, f.reshape(f.shape[0], -1), out=g.reshape(g.shape[0], -1))
        return g

    def layer_backward(self, k: int, inp: Any, params: Sequence[Any]) -> Any:
        """Stage ``k``'s update sums from its deltas; for ``k >= 1`` my part of the gradient
        for its whole input (``self.grad_input(k)``)."""
        st, ops = self.layers.stages[k], self.ops
        x, conv_cache, steps = self._cache[k]
        iw, ib = self._pidx[k]
        r = self._real(k)
        gW, gb = self.grads[iw], (self.grads[ib] if ib is not None else None)
        if r < self.units[k]:  # the bias channel: no weights to train
            gW[r:] = 0.0
            if gb is not None:
                gb[r:] = 0.0
        if r == 0:
            if k:
                self.grad_input(k)[...] = 0.0
                return self.grad_input(k)
            return None
        g = xb.copy(self.delta(k)[:, :r])
        for op, c in zip(reversed(st.post), reversed(steps)):
            name = op[0]
            if name == "relu":
                g *= c > 0
            elif name == "tanh":
                g *= 1.0 - c * c
            elif name == "sigmoid":
                g *= c * (1.0 - c)
            elif name == "maxpool":
                g = ops.maxpool_backward(g, c, op[1], op[2])
            else:
                g = ops.avgpool_backward(g, c, op[1], op[2])
        W = params[iw][:r]
        if st.kind == "conv":
            dW, db, dx = ops.conv_backward(
                g, conv_cache, W, st.stride, st.padding, gb is not None, k > 0
            )
        else:
            dW = g.T @ x
            db = g.sum(0) if gb is not None else None
            dx = g @ W if k else None
        xb.copyto(gW[:r], dW)
        if gb is not None:
            xb.copyto(gb[:r], db)
        if not k:
            return None
        gin = self.grad_input(k)
        xb.copyto(gin, dx.reshape(gin.shape))
        return gin

    def backward(self, x: Any, params: Sequence[Any], delta2: Any) -> list[Any]:
        self.output_backward(params, delta2)
        for k in range(self.layers.depth - 1, -1, -1):
            self.layer_backward(k, self.full(k - 1) if k else x, params)
        return self.grads


def _conv_key(
    m: int = 0,
    n: int = 0,
    l: int = 0,  # noqa: E741
    dtype: Any = "float64",
    net: Network | None = None,
    bias_row: int | None = None,
    loss_scale: float = 1.0,
    *,
    layers: ConvLayers,
    units: tuple[int, ...] | None = None,
    bias_rows: tuple[int | None, ...] | None = None,
    backend: Backend | None = None,
    kernels: str = "auto",
) -> tuple[Any, ...]:
    """:class:`ConvWorkspace`'s arguments, normalised (the MLP's ``m, n, l, bias_row`` are
    unused: the geometry has them)."""
    units = tuple(int(u) for u in (layers.hidden if units is None else units))
    if bias_rows is None:
        bias_rows = (
            layers.bias_rows((0, layers.m)) if units == layers.hidden else (None,) * layers.depth
        )
    net = Network(activation="relu", loss="cross-entropy", output="softmax") if net is None else net
    return (
        layers,
        units,
        np.dtype(dtype),
        net,
        bias_rows,
        float(loss_scale),
        backend or NUMPY,
        kernels,
    )
