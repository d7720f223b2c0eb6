"""Batch back-propagation kernels for a 3-layer perceptron (docs/method.md §1).

Pure numpy; every kernel is a handful of GEMMs over a whole block of samples,
so the work runs at BLAS speed with no Python loop over samples. The same
functions serve the serial reference (:func:`dask_rpm.serial.fit_serial`) and the rectangle
tasks of the distributed engine, which is what makes the two agree to rounding.
The serial training loop itself is :func:`dask_rpm.serial.fit_serial`.

Shapes: ``x`` is ``(s, n)``, ``d`` is ``(s, l)``, ``W`` is ``(m, n)``,
``V`` is ``(l, m)``. A worker holding hidden units ``[m0, m1)`` has
``W[m0:m1]`` and ``V[:, m0:m1]``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .network import Network

__all__ = [
    "init_weights",
    "block_work",
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
    if kind == "forward":
        per = 2.0 * n + 2.0 * l + _SIGMOID_COST
    elif kind == "backward":
        per = 2.0 * n + 4.0 * l + 3.0
    else:
        raise ValueError(f"kind={kind!r}; expected 'forward' or 'backward'")
    return float(s) * float(m) * per


class Workspace:
    """Buffers for the kernels of one rectangle, kept across iterations.

    Every kernel writes into buffers allocated once (``out=``, in-place
    activations), so an iteration allocates nothing: no page faults from memory
    that Dask's ``MALLOC_TRIM_THRESHOLD_`` hands back to the system after
    every iteration, and the GEMMs run at BLAS speed. The one set of kernels:
    serial and distributed training, the probe and the EMULATED rate all run
    these (:func:`kernel_pass`).

    Mini-batches: the buffers hold ``s`` samples, the most a batch share can
    have; a smaller batch uses their leading rows (still C-contiguous).

    Parameters
    ----------
    s, m, n, l : int
        Samples (at most) and hidden units of the rectangle, inputs and outputs
        (``n`` and ``m`` as planned: with bias terms they include the constant
        input and the bias unit).
    dtype : numpy dtype
    net : Network, optional
        Activation, output and loss (default: the paper's).
    bias_row : int, optional
        Local index of the bias unit among the rectangle's hidden rows: its
        output is held at 1 and its delta at 0 (:mod:`dask_rpm.network`).
    loss_scale : float
        Factor on the squared loss reported (not on its deltas): ``1 / l`` is
        scikit-learn's per-sample mean over the outputs (:meth:`dask_rpm.recipe.Recipe.loss_scale`).
    """

    def __init__(
        self,
        s: int,
        m: int,
        n: int,
        l: int,
        dtype: Any = "float64",  # noqa: E741
        net: Network | None = None,
        bias_row: int | None = None,
        loss_scale: float = 1.0,
    ) -> None:
        self.net = Network() if net is None else net
        self.bias_row = bias_row
        self.loss_scale = float(loss_scale)
        self.key = (s, m, n, l, np.dtype(dtype).str, self.net, bias_row, self.loss_scale)
        dt = np.dtype(dtype)
        self._f = np.empty((s, m), dt)  # hidden outputs; the derivative after backward
        self._partial = np.empty((s, l), dt)  # f V^T
        self._u = np.empty((s, l), dt)  # summed pre-activation of the column
        self._h = np.empty((s, l), dt)
        self._diff = np.empty((s, l), dt)
        self._delta2 = np.empty((s, l), dt)
        self._delta1 = np.empty((s, m), dt)
        self.dW = np.empty((m, n), dt)
        self.dV = np.empty((l, m), dt)
        self.rows = s

    def fits(
        self,
        s: int,
        m: int,
        n: int,
        l: int,
        dtype: Any,  # noqa: E741
        net: Network | None = None,
        bias_row: int | None = None,
        loss_scale: float = 1.0,
    ) -> bool:
        net = Network() if net is None else net
        want = (m, n, l, np.dtype(dtype).str, net, bias_row, float(loss_scale))
        return self.key[1:] == want and s <= self.key[0]

    def use(self, s: int) -> None:
        """Work on ``s`` samples (at most the capacity) from now on."""
        if s > self.key[0]:
            raise ValueError(f"workspace holds {self.key[0]} samples, asked for {s}")
        self.rows = s

    # views of the leading rows in use
    f = property(lambda self: self._f[: self.rows])
    partial = property(lambda self: self._partial[: self.rows])
    u = property(lambda self: self._u[: self.rows])
    h = property(lambda self: self._h[: self.rows])
    diff = property(lambda self: self._diff[: self.rows])
    delta2 = property(lambda self: self._delta2[: self.rows])
    delta1 = property(lambda self: self._delta1[: self.rows])

    @staticmethod
    def _sigmoid(a: np.ndarray) -> np.ndarray:
        # the arithmetic of sigmoid(): exp(-a), + 1, reciprocal, in place
        np.negative(a, out=a)
        with np.errstate(over="ignore"):
            np.exp(a, out=a)
        a += 1.0
        np.reciprocal(a, out=a)
        return a

    def _activate(self, a: np.ndarray) -> None:
        act = self.net.activation
        if act == "sigmoid":
            self._sigmoid(a)
        elif act == "tanh":
            np.tanh(a, out=a)
        else:  # relu
            np.maximum(a, 0.0, out=a)
        if self.bias_row is not None:
            a[:, self.bias_row] = 1.0

    def forward(self, x: np.ndarray, W: np.ndarray, V: np.ndarray) -> np.ndarray:
        """Hidden outputs into ``self.f``; returns the partial product ``f V^T`` (``self.partial``)."""
        self.use(x.shape[0])
        f, partial = self.f, self.partial
        np.matmul(x, W.T, out=f)
        self._activate(f)
        np.matmul(f, V.T, out=partial)
        return partial

    def outputs(self, u: np.ndarray) -> np.ndarray:
        """The network's outputs ``h`` for the summed pre-activation ``u``, as a new array (the
        arithmetic of :meth:`output_delta`: one sigmoid, one softmax in the package)."""
        h = np.array(u, copy=True)
        out = self.net.output
        if out == "sigmoid":
            return self._sigmoid(h)
        if out == "softmax":
            h -= h.max(axis=1, keepdims=True)
            np.exp(h, out=h)
            h /= h.sum(axis=1, keepdims=True)
        return h

    def output_delta(self, u: np.ndarray, d: np.ndarray) -> tuple[np.ndarray, float]:
        """Output deltas (``self.delta2``) and the loss of the summed pre-activation ``u``."""
        h, diff, delta2 = self.h, self.diff, self.delta2
        out = self.net.output
        np.copyto(h, u)
        if out == "softmax":
            # log-softmax with the row maximum subtracted: no overflow for any u
            h -= h.max(axis=1, keepdims=True)
            np.exp(h, out=diff)
            z = diff.sum(axis=1, keepdims=True)
            np.log(z, out=z)
            h -= z  # log softmax(u)
            err = -float(np.vdot(d, h))
            np.exp(h, out=h)
            np.subtract(h, d, out=delta2)
            return delta2, err
        if out == "sigmoid":
            self._sigmoid(h)
            if self.net.loss == "cross-entropy":
                np.subtract(h, d, out=delta2)  # the log loss's delta through a sigmoid
                return delta2, binary_log_loss(h, d, diff)
        np.subtract(h, d, out=diff)
        err = 0.5 * float(np.vdot(diff, diff))
        if self.loss_scale != 1.0:
            err *= self.loss_scale
        if out == "linear":
            np.copyto(delta2, diff)
            return delta2, err
        np.multiply(diff, h, out=delta2)
        np.subtract(1.0, h, out=h)
        delta2 *= h
        return delta2, err

    def backward(
        self, x: np.ndarray, V: np.ndarray, delta2: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Weight-update sums ``(dW, dV)`` of the rectangle (``self.dW``, ``self.dV``); uses ``self.f``."""
        f, d1 = self.f, self.delta1
        np.matmul(delta2, V, out=d1)
        act = self.net.activation
        np.matmul(delta2.T, f, out=self.dV)
        # f is not needed after dV: it becomes the activation's derivative, written from f itself
        if act == "sigmoid":
            d1 *= f
            np.subtract(1.0, f, out=f)
        elif act == "tanh":
            np.multiply(f, f, out=f)
            np.subtract(1.0, f, out=f)
        else:  # relu: 1 where the unit is active
            np.greater(f, 0.0, out=f, casting="unsafe")
        d1 *= f
        if self.bias_row is not None:
            d1[:, self.bias_row] = 0.0
        np.matmul(d1.T, x, out=self.dW)
        return self.dW, self.dV


def binary_log_loss(h: np.ndarray, d: np.ndarray, scratch: np.ndarray | None = None) -> float:
    """``-sum [d log h + (1 - d) log(1 - h)]`` with ``h`` clipped to ``[eps, 1 - eps]`` (machine
    epsilon of its dtype), as scikit-learn's ``binary_log_loss`` sums it."""
    eps = float(np.finfo(h.dtype).eps)
    p = np.empty_like(h) if scratch is None else scratch
    np.clip(h, eps, 1.0 - eps, out=p)
    np.log(p, out=p)
    total = float(np.vdot(d, p))
    np.clip(h, eps, 1.0 - eps, out=p)
    np.subtract(1.0, p, out=p)
    np.log(p, out=p)
    total += float(np.vdot(1.0 - d, p))
    return -total


def kernel_pass(ws: Workspace, x: np.ndarray, d: np.ndarray, W: np.ndarray, V: np.ndarray) -> float:
    """One rectangle's kernels of one iteration, as training runs them: forward, output deltas,
    backward (no update); returns the loss. What the probe and the EMULATED rate time, so that
    a measured rate is the rate of the code that trains."""
    partial = ws.forward(x, W, V)
    delta2, err = ws.output_delta(partial, d)
    ws.backward(x, V, delta2)
    return err


def all_finite(a: np.ndarray) -> bool:
    """Whether every element of ``a`` is finite, without a temporary the size of ``a``.

    A sum of finite numbers is finite unless it overflows; only then (or when
    something is NaN or infinite) the exact, allocating check runs.
    """
    if math.isfinite(float(np.add.reduce(a, axis=None))):
        return True
    return bool(np.isfinite(a).all())


def init_weights(
    n: int, m: int, l: int, *, seed: int = 0, scale: float = 0.1, dtype: str | np.dtype = "float64"
) -> tuple[np.ndarray, np.ndarray]:
    """Seeded small random initial weights ``(W0, V0)``, uniform in ``[-scale, scale]``."""
    rng = np.random.default_rng(seed)
    W0 = rng.uniform(-scale, scale, size=(m, n)).astype(dtype)
    V0 = rng.uniform(-scale, scale, size=(l, m)).astype(dtype)
    return W0, V0
