"""Batch back-propagation kernels for a 3-layer perceptron (docs/method.md §1).

Pure; every kernel is a handful of GEMMs over a whole block of samples,
so the work runs at BLAS (or GPU) speed with no Python loop over samples. The
arrays are numpy's, torch's or cupy's (:mod:`~dask_rpm.nn.backend`): the kernels
use the operations the three share, so one set of kernels serves every backend. The same
functions serve the serial reference (:func:`dask_rpm.nn.serial.fit_serial`) and the rectangle
tasks of the distributed engine, which is what makes the two agree to rounding.
The serial training loop itself is :func:`dask_rpm.nn.serial.fit_serial`.

Shapes: ``x`` is ``(s, n)``, ``d`` is ``(s, l)``, ``W`` is ``(m, n)``,
``V`` is ``(l, m)``. A worker holding hidden units ``[m0, m1)`` has
``W[m0:m1]`` and ``V[:, m0:m1]``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from . import backend as xb
from . import sparse
from .backend import NUMPY, Backend
from .cnn import cnn_work, is_conv
from .layers import Layers, layers_of_params
from .network import Network

__all__ = [
    "init_weights",
    "init_params",
    "block_work",
    "layer_work",
    "rectangle_work",
    "Workspace",
    "kernel_pass",
    "all_finite",
    "binary_log_loss",
]

#: Cost of one sigmoid (exp, add, reciprocal) in multiply-add equivalents; only
#: the forward/backward balance depends on it (EMULATED pacing, dask_rpm.emulation).
_SIGMOID_COST = 20.0


def block_work(kind: str, s: int, m: int, n: int, l: int) -> float:
    """Floating-point work of one rectangle kernel, in flop equivalents.

    ``kind`` is ``"forward"`` (:meth:`Workspace.forward`) or ``"backward"``
    (:meth:`Workspace.backward`) on ``s`` samples and ``m`` hidden units of an
    ``n``-``m``-``l`` network. Both are proportional to ``s * m`` (docs/method.md
    §1), which is what lets EMULATED workers run a block for exactly
    ``work / (rate * speed)`` seconds, free of the CPU-time noise of a shared
    machine.
    """
    return layer_work(kind, 0, s, (m,), Layers(n, (m,), l))


def layer_work(kind: str, k: int, s: int, units: Sequence[int], layers: Layers) -> float:
    """:func:`block_work` of hidden layer ``k``'s kernels alone, for a rectangle holding ``units``
    rows of each layer; the output layer's work goes with the last hidden layer. The work of all
    layers is their sum (:func:`rectangle_work`). A CNN's: :func:`~dask_rpm.nn.cnn.cnn_work`."""
    if is_conv(layers):
        return cnn_work(kind, k, s, units, layers)
    u, inp, l, last = (
        float(units[k]),
        float(layers.inputs(k)),
        float(layers.l),
        k == layers.depth - 1,
    )
    if kind == "forward":
        per = 2.0 * inp + _SIGMOID_COST + (2.0 * l if last else 0.0)
    elif kind == "backward":
        # dW_k and the derivative; the output deltas and dV on the last layer; the gradient for
        # the previous layer's outputs on every layer but the first
        per = 2.0 * inp + 3.0 + (4.0 * l if last else 0.0) + (2.0 * inp if k else 0.0)
    else:
        raise ValueError(f"kind={kind!r}; expected 'forward' or 'backward'")
    return float(s) * u * per


def rectangle_work(kind: str, s: int, units: Sequence[int], layers: Layers) -> float:
    """:func:`layer_work` summed over the layers: one rectangle's forward or backward pass."""
    return sum(layer_work(kind, k, s, units, layers) for k in range(layers.depth))


def _key(
    m: int = 0,
    n: int = 0,
    l: int = 0,  # noqa: E741
    dtype: Any = "float64",
    net: Network | None = None,
    bias_row: int | None = None,
    loss_scale: float = 1.0,
    *,
    layers: Layers | None = None,
    units: tuple[int, ...] | None = None,
    bias_rows: tuple[int | None, ...] | None = None,
    backend: Backend | None = None,
) -> tuple[Any, ...]:
    """:class:`Workspace`'s arguments, normalised: what two workspaces must share to be one."""
    if layers is None:
        layers, units, bias_rows = Layers(n, (m,), l), (m,), (bias_row,)
    units = tuple(int(u) for u in (layers.hidden if units is None else units))
    bias_rows = (None,) * layers.depth if bias_rows is None else tuple(bias_rows)
    net = Network() if net is None else net
    return (layers, units, np.dtype(dtype), net, bias_rows, float(loss_scale), backend or NUMPY)


class Workspace:
    """Buffers for the kernels of one rectangle, kept across iterations.

    Every kernel writes into buffers allocated once (``out=``, in-place
    activations), so an iteration allocates nothing: no page faults from memory
    that Dask's ``MALLOC_TRIM_THRESHOLD_`` hands back to the system after
    every iteration, and the GEMMs run at BLAS speed. The one set of kernels:
    serial and distributed training, the probe and the EMULATED rate all run
    these (:func:`kernel_pass`).

    A rectangle holds ``units[k]`` rows of every hidden layer ``k``
    (:mod:`dask_rpm.nn.layers`). :meth:`forward` and :meth:`backward` run
    all layers when those are all of them (one worker per column, or the
    serial reference); a worker sharing its column runs one layer at a time
    (:meth:`layer_forward`, :meth:`layer_backward`) and exchanges activations
    and deltas with its column between them (:mod:`dask_rpm.engine.block`).

    Mini-batches: the buffers hold ``s`` samples, the most a batch share can
    have; a smaller batch uses their leading rows (still C-contiguous).

    Parameters
    ----------
    s, m, n, l : int
        Samples (at most) and hidden units of the rectangle, inputs and outputs
        of a one-hidden-layer network (``n`` and ``m`` as planned: with bias
        terms they include the constant input and the bias unit). Ignored
        (pass anything) when ``layers`` is given.
    dtype : numpy dtype
    net : Network, optional
        Activation, output and loss (default: the paper's).
    bias_row : int, optional
        Local index of the bias unit among the rectangle's hidden rows: its
        output is held at 1 and its delta at 0 (:mod:`dask_rpm.nn.network`).
    loss_scale : float
        Factor on the squared loss reported (not on its deltas): ``1 / l`` is
        scikit-learn's per-sample mean over the outputs (:meth:`dask_rpm.nn.recipe.Recipe.loss_scale`).
    layers : Layers, optional
        The network's sizes as planned, for any depth (:class:`~dask_rpm.nn.layers.Layers`).
    units : tuple of int, optional
        Rows of each hidden layer the rectangle holds (default: all).
    bias_rows : tuple, optional
        ``bias_row`` of each layer (with ``layers``).
    backend : Backend, optional
        Where the buffers live (:mod:`~dask_rpm.nn.backend`; default numpy): the
        arrays the kernels are given must be on it.
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
        layers: Layers | None = None,
        units: tuple[int, ...] | None = None,
        bias_rows: tuple[int | None, ...] | None = None,
        backend: Backend | None = None,
    ) -> None:
        self.key = (
            s,
            *_key(
                m,
                n,
                l,
                dtype,
                net,
                bias_row,
                loss_scale,
                layers=layers,
                units=units,
                bias_rows=bias_rows,
                backend=backend,
            ),
        )
        layers, units, dt, self.net, self.bias_rows, self.loss_scale, be = self.key[1:]
        self.backend, self.xp = be, be.ns
        empty = be.empty
        self.layers, self.units = layers, units
        L, l = layers.depth, layers.l  # noqa: E741
        # local activations of every layer; after backward, their derivatives
        self._f = [empty((s, u), dt) for u in units]
        self._d = [empty((s, u), dt) for u in units]  # local deltas of every layer
        # the gathered (full) input of layer k + 1, and the gradient for the full input of layer
        # k: the local buffers themselves when this rectangle holds the whole layer
        self._full = [
            self._f[k] if units[k] == layers.hidden[k] else empty((s, layers.hidden[k]), dt)
            for k in range(L - 1)
        ]
        # (layer 0's input is x: no gradient for it)
        self._gin: list[Any] = [empty((0, 0), dt)] + [
            self._d[k - 1]
            if units[k - 1] == layers.hidden[k - 1]
            else empty((s, layers.hidden[k - 1]), dt)
            for k in range(1, L)
        ]
        self._output_buffers(s, l, dt)
        self.grads = [empty(shape, dt) for shape in layers.shapes([(0, u) for u in units])]
        self.rows = s

    def _output_buffers(self, s: int, l: int, dt: Any) -> None:  # noqa: E741
        """The output layer's buffers for ``s`` samples and ``l`` outputs (every network's)."""
        empty = self.backend.empty
        self._partial = empty((s, l), dt)  # f_L V^T
        self._u = empty((s, l), dt)  # summed pre-activation of the column
        self._h = empty((s, l), dt)
        self._diff = empty((s, l), dt)
        self._delta2 = empty((s, l), dt)
        if self.net.weighted:  # the targets and the weights, apart (Network: the last column)
            self._target = empty((s, l), dt)
            self._weight = empty((s, 1), dt)

    @classmethod
    def whole(
        cls,
        s: int,
        params: Sequence[np.ndarray],
        net: Network | None = None,
        loss_scale: float = 1.0,
        backend: Backend | None = None,
    ) -> Workspace:
        """A workspace for the whole network whose parameters are ``params`` (every unit, the
        bias units of :mod:`~dask_rpm.nn.network` in each layer's last row), on ``backend``."""
        layers = layers_of_params(params)
        net = Network() if net is None else net
        return cls(
            s,
            dtype=xb.dtype_of(params[0]),
            net=net,
            loss_scale=loss_scale,
            layers=layers,
            bias_rows=layers.bias_rows((0, layers.m), net.bias),
            backend=backend,
        )

    def fits(self, s: int, *args: Any, **kw: Any) -> bool:
        """Whether this workspace serves ``Workspace(s, *args, **kw)``'s rectangle (at most ``s``
        samples): the same shapes, network and bias rows."""
        return self.key[1:] == _key(*args, **kw) and s <= self.key[0]

    def use(self, s: int) -> None:
        """Work on ``s`` samples (at most the capacity) from now on."""
        if s > self.key[0]:
            raise ValueError(f"workspace holds {self.key[0]} samples, asked for {s}")
        self.rows = s

    # views of the leading rows in use
    partial = property(lambda self: self._partial[: self.rows])
    u = property(lambda self: self._u[: self.rows])
    h = property(lambda self: self._h[: self.rows])
    diff = property(lambda self: self._diff[: self.rows])
    delta2 = property(lambda self: self._delta2[: self.rows])
    f = property(lambda self: self._f[-1][: self.rows])  # the last hidden layer's outputs

    def full(self, k: int) -> np.ndarray:
        """The whole of hidden layer ``k``'s outputs (the input of layer ``k + 1``)."""
        return self._full[k][: self.rows]

    def local(self, k: int) -> np.ndarray:
        """This rectangle's outputs of hidden layer ``k``."""
        return self._f[k][: self.rows]

    def delta(self, k: int) -> np.ndarray:
        """This rectangle's deltas of hidden layer ``k``."""
        return self._d[k][: self.rows]

    def grad_input(self, k: int) -> np.ndarray:
        """This rectangle's part of the gradient for layer ``k``'s whole input (``k >= 1``)."""
        return self._gin[k][: self.rows]

    @staticmethod
    def _sigmoid(a: Any) -> Any:
        # the arithmetic of sigmoid(): exp(-a), + 1, reciprocal, in place
        xp = xb.namespace(a)
        xp.negative(a, out=a)
        with xb.errstate(a):
            xp.exp(a, out=a)
        a += 1.0
        xp.reciprocal(a, out=a)
        return a

    def _activate(self, a: np.ndarray, bias_row: int | None) -> None:
        act = self.net.activation
        if act == "sigmoid":
            self._sigmoid(a)
        elif act == "tanh":
            self.xp.tanh(a, out=a)
        elif act == "relu":
            xb.relu_(a)
        if bias_row is not None:
            a[:, bias_row] = 1.0

    def layer_forward(self, k: int, inp: np.ndarray, params: Sequence[np.ndarray]) -> np.ndarray:
        """Hidden layer ``k``'s outputs (this rectangle's units) from its whole input ``inp``
        (``params``: this rectangle's parameters, every layer's)."""
        if k == 0:
            self.use(inp.shape[0])
        f = self.local(k)
        if sparse.issparse(inp):  # the first layer's input, CSR (dask_rpm.nn.sparse)
            f[...] = inp @ params[k].T
        else:
            self.xp.matmul(inp, params[k].T, out=f)
        self._activate(f, self.bias_rows[k])
        return f

    def output_partial(self, params: Sequence[np.ndarray]) -> np.ndarray:
        """The partial product ``f_L V^T`` of this rectangle's last-layer units (``self.partial``)."""
        partial = self.partial
        self.xp.matmul(self.f, params[-1].T, out=partial)
        return partial

    def forward(self, x: np.ndarray, params: Sequence[np.ndarray]) -> np.ndarray:
        """Every layer, when this rectangle holds all units of every layer but the last; returns the
        partial product ``f_L V^T`` (``self.partial``; the output pre-activation on one worker)."""
        inp = x
        for k in range(self.layers.depth):
            inp = self.layer_forward(k, inp, params)
        return self.output_partial(params)

    def outputs(self, u: np.ndarray) -> np.ndarray:
        """The network's outputs ``h`` for the summed pre-activation ``u``, as a new array (the
        arithmetic of :meth:`output_delta`: one sigmoid, one softmax in the package)."""
        h = xb.copy(u)
        out = self.net.output
        if out == "sigmoid":
            return self._sigmoid(h)
        if out == "softmax":
            h -= xb.row_max(h)
            xb.namespace(h).exp(h, out=h)
            h /= xb.row_sum(h)
        elif out == "exp":
            with xb.errstate(h):
                xb.namespace(h).exp(h, out=h)
        return h

    def _split_targets(self, d: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """The targets and, for a weighted network, the ``(s, 1)`` column of sample weights
        (copied apart from the targets' last column: :mod:`~dask_rpm.nn.network`)."""
        if not self.net.weighted:
            return d, None
        target, weight = self._target[: self.rows], self._weight[: self.rows]
        xb.copyto(target, d[:, :-1])
        xb.copyto(weight, d[:, -1:])
        return target, weight

    def output_delta(self, u: np.ndarray, d: np.ndarray) -> tuple[np.ndarray, float]:
        """Output deltas (``self.delta2``) and the loss of the summed pre-activation ``u``; with
        sample weights each sample's delta and loss times its weight (scikit-learn's)."""
        h, diff, delta2, xp = self.h, self.diff, self.delta2, self.xp
        d, w = self._split_targets(d)
        out = self.net.output
        xb.copyto(h, u)
        if out == "softmax":
            # log-softmax with the row maximum subtracted: no overflow for any u
            h -= xb.row_max(h)
            xp.exp(h, out=diff)
            z = xb.row_sum(diff)
            xp.log(z, out=z)
            h -= z  # log softmax(u)
            if w is not None:
                xp.multiply(h, w, out=diff)
            err = -xb.vdot(d, h if w is None else diff)
            xp.exp(h, out=h)
            xp.subtract(h, d, out=delta2)
            return _weigh(delta2, w), err
        if out == "exp":
            return self._poisson(h, d, w)
        if out == "sigmoid":
            self._sigmoid(h)
            if self.net.loss == "cross-entropy":
                xp.subtract(h, d, out=delta2)  # the log loss's delta through a sigmoid
                return _weigh(delta2, w), binary_log_loss(h, d, diff, w)
        xp.subtract(h, d, out=diff)
        if out == "linear":
            xb.copyto(delta2, diff)
        else:
            xp.multiply(diff, h, out=delta2)
            xp.subtract(1.0, h, out=h)
            delta2 *= h
        if w is None:
            err = 0.5 * xb.vdot(diff, diff)
        else:  # h is free now: the weighted differences
            xp.multiply(diff, w, out=h)
            err = 0.5 * xb.vdot(h, diff)
        if self.loss_scale != 1.0:
            err *= self.loss_scale
        return _weigh(delta2, w), err

    def _poisson(
        self, h: np.ndarray, d: np.ndarray, w: np.ndarray | None
    ) -> tuple[np.ndarray, float]:
        """The Poisson loss's deltas ``h - d`` (``h = exp(u)``, the canonical link) and its
        half deviance ``sum [d log(d / h) - d + h]`` (0 log 0 = 0), as scikit-learn's
        ``poisson_loss`` sums it."""
        xp, diff, delta2 = self.xp, self.diff, self.delta2
        with xb.errstate(h):
            xp.exp(h, out=h)
            xp.divide(d, h, out=diff)
        # log(d / h) where d > 0; 1 (log 1 = 0) where d = 0, whose term d log(d / h) is 0
        diff[...] = xp.where(d > 0, diff, 1.0)
        xp.log(diff, out=diff)
        diff *= d
        diff -= d
        diff += h
        if w is not None:
            diff *= w
        err = float(diff.sum())
        xp.subtract(h, d, out=delta2)
        return _weigh(delta2, w), err

    def output_backward(self, params: Sequence[np.ndarray], delta2: np.ndarray) -> np.ndarray:
        """``V``'s update sum (into ``self.grads[-1]``); the last layer's deltas before the
        activation's derivative go to ``self.delta(L - 1)``."""
        L, V = self.layers.depth, params[-1]
        self.xp.matmul(delta2, V, out=self.delta(L - 1))
        self.xp.matmul(delta2.T, self.f, out=self.grads[-1])
        return self.grads[-1]

    def layer_backward(
        self, k: int, inp: np.ndarray, params: Sequence[np.ndarray]
    ) -> np.ndarray | None:
        """Layer ``k``'s update sum (``self.grads[k]``) from its deltas and whole input ``inp``;
        for ``k >= 1`` returns this rectangle's part of the gradient for ``inp``
        (``self.grad_input(k)``: summed over the column, its rows are layer ``k - 1``'s deltas)."""
        f, d, xp = self.local(k), self.delta(k), self.xp
        act = self.net.activation
        # f is not needed after this layer's deltas: it becomes the activation's derivative,
        # written from f itself
        if act == "sigmoid":
            d *= f
            xp.subtract(1.0, f, out=f)
        elif act == "tanh":
            xp.multiply(f, f, out=f)
            xp.subtract(1.0, f, out=f)
        elif act == "relu":  # 1 where the unit is active
            xb.positive_(f)
        if act != "identity":  # (identity: the derivative is 1)
            d *= f
        if self.bias_rows[k] is not None:
            d[:, self.bias_rows[k]] = 0.0
        if sparse.issparse(inp):  # (inp^T d)^T: scipy's sparse-times-dense product
            self.grads[k][...] = (inp.T @ d).T
        else:
            xp.matmul(d.T, inp, out=self.grads[k])
        if k == 0:
            return None
        g = self.grad_input(k)
        xp.matmul(d, params[k], out=g)
        return g

    def backward(
        self, x: np.ndarray, params: Sequence[np.ndarray], delta2: np.ndarray
    ) -> list[np.ndarray]:
        """Every parameter's update sum (``self.grads``), when this rectangle holds all units of every
        layer but the last (as :meth:`forward`); uses the activations of the forward pass."""
        self.output_backward(params, delta2)
        for k in range(self.layers.depth - 1, -1, -1):
            self.layer_backward(k, self.full(k - 1) if k else x, params)
        return self.grads


def _weigh(delta2: np.ndarray, w: np.ndarray | None) -> np.ndarray:
    """Each sample's output delta times its weight (``w``: a column; None: unweighted)."""
    if w is not None:
        delta2 *= w
    return delta2


def binary_log_loss(
    h: np.ndarray, d: np.ndarray, scratch: np.ndarray | None = None, w: np.ndarray | None = None
) -> float:
    """``-sum [d log h + (1 - d) log(1 - h)]`` with ``h`` clipped to ``[eps, 1 - eps]`` (machine
    epsilon of its dtype), as scikit-learn's ``binary_log_loss`` sums it (each sample's terms
    times its weight, a column ``w``, when given)."""
    xp, eps = xb.namespace(h), xb.eps_of(h)
    p = xp.empty_like(h) if scratch is None else scratch
    xp.clip(h, eps, 1.0 - eps, out=p)
    xp.log(p, out=p)
    if w is not None:
        p *= w
    total = xb.vdot(d, p)
    xp.clip(h, eps, 1.0 - eps, out=p)
    xp.subtract(1.0, p, out=p)
    xp.log(p, out=p)
    if w is not None:
        p *= w
    total += xb.vdot(1.0 - d, p)
    return -total


def kernel_pass(ws: Workspace, x: np.ndarray, d: np.ndarray, *params: np.ndarray) -> float:
    """One rectangle's kernels of one iteration, as training runs them: forward, output deltas,
    backward (no update); returns the loss. What the probe and the EMULATED rate time, so that
    a measured rate is the rate of the code that trains. ``params``: ``W, V`` (or every layer's)."""
    partial = ws.forward(x, params)
    delta2, err = ws.output_delta(partial, d)
    ws.backward(x, params, delta2)
    return err


def all_finite(a: np.ndarray) -> bool:
    """Whether every element of ``a`` is finite, without a temporary the size of ``a``.

    A sum of finite numbers is finite unless it overflows; only then (or when
    something is NaN or infinite) the exact, allocating check runs.
    """
    if isinstance(a, np.ndarray):
        total = float(np.add.reduce(a, axis=None))
    else:
        total = float(a.sum())
    if math.isfinite(total):
        return True
    return bool(xb.namespace(a).isfinite(a).all())


def init_weights(
    n: int, m: int, l: int, *, seed: int = 0, scale: float = 0.1, dtype: str | np.dtype = "float64"
) -> tuple[np.ndarray, np.ndarray]:
    """Seeded small random initial weights ``(W0, V0)``, uniform in ``[-scale, scale]``."""
    W0, V0 = init_params(Layers(n, (m,), l), seed=seed, scale=scale, dtype=dtype)
    return W0, V0


def init_params(
    layers: Layers, *, seed: int = 0, scale: float = 0.1, dtype: str | np.dtype = "float64"
) -> list[np.ndarray]:
    """Seeded initial parameters of any depth, uniform in ``[-scale, scale]``, drawn in the order of
    :attr:`Layers.params <dask_rpm.nn.layers.Layers.params>` (one hidden layer: :func:`init_weights`'s)."""
    rng = np.random.default_rng(seed)
    return [rng.uniform(-scale, scale, size=shape).astype(dtype) for shape in layers.full_shapes()]
