"""Batch back-propagation kernels for a 3-layer perceptron (SPEC section 1).

Pure numpy; every kernel is a handful of GEMMs over a whole block of samples,
so the work runs at BLAS speed with no Python loop over samples. The same
functions serve the serial reference (:func:`fit_serial`) and the rectangle
tasks of the distributed engine, which is what makes the two agree to rounding.

Shapes: ``x`` is ``(s, n)``, ``d`` is ``(s, l)``, ``W`` is ``(m, n)``,
``V`` is ``(l, m)``. A worker holding hidden units ``[m0, m1)`` has
``W[m0:m1]`` and ``V[:, m0:m1]``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = [
    "sigmoid",
    "forward_partial",
    "output_delta",
    "backward_partial",
    "init_weights",
    "fit_serial",
    "block_work",
    "Workspace",
    "all_finite",
]

#: Cost of one sigmoid (exp, add, reciprocal) in multiply-add equivalents; only
#: the forward/backward balance depends on it (EMULATED pacing, dask_rpm.emulation).
_SIGMOID_COST = 20.0


def sigmoid(u: np.ndarray) -> np.ndarray:
    """Logistic function, computed in place on a fresh array.

    ``exp(-u)`` overflows to ``inf`` for very negative ``u``; the result is
    then exactly 0, which is the right limit, so the warning is silenced.
    """
    with np.errstate(over="ignore"):
        out = np.exp(-u)
    out += 1.0
    np.reciprocal(out, out=out)
    return out


def forward_partial(x: np.ndarray, W: np.ndarray, V: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Hidden outputs ``f = sigma(x W^T)`` and the partial product ``f V^T``.

    Returns ``(f, partial)`` with shapes ``(s, m_i)`` and ``(s, l)``; summing the
    partials of all workers of a column gives the output pre-activation.
    """
    f = sigmoid(x @ W.T)
    return f, f @ V.T


def block_work(kind: str, s: int, m: int, n: int, l: int) -> float:
    """Floating-point work of one rectangle kernel, in flop equivalents.

    ``kind`` is ``"forward"`` (:func:`forward_partial`) or ``"backward"``
    (:func:`backward_partial`) on ``s`` samples and ``m`` hidden units of an
    ``n``-``m``-``l`` network. Both are proportional to ``s * m`` (SPEC
    section 1), which is what lets EMULATED workers run a block for exactly
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


def output_delta(u: np.ndarray, d: np.ndarray) -> tuple[np.ndarray, float]:
    """Output deltas ``(h - d) h (1 - h)`` and the error ``0.5 sum (h - d)^2``.

    ``u`` is the summed pre-activation of the output layer, ``(s, l)``.
    """
    h = sigmoid(u)
    diff = h - d
    err = 0.5 * float(np.vdot(diff, diff))
    return diff * h * (1.0 - h), err


def backward_partial(
    x: np.ndarray, f: np.ndarray, V: np.ndarray, delta2: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Weight-update sums of one rectangle: ``(dW_i, dV_i)``.

    ``dW_i = (f (1 - f) * (delta2 V_i))^T x`` is ``(m_i, n)``;
    ``dV_i = delta2^T f`` is ``(l, m_i)``. Both are sums over the rectangle's
    samples; summing them over columns gives the batch update.
    """
    delta1 = delta2 @ V
    delta1 *= f
    delta1 *= 1.0 - f
    return delta1.T @ x, delta2.T @ f


class Workspace:
    """Buffers for the kernels of one rectangle, kept across iterations.

    Every kernel writes into buffers allocated once (``out=``, in-place
    sigmoid), so an iteration allocates nothing: no page faults from memory
    that Dask's ``MALLOC_TRIM_THRESHOLD_`` hands back to the system after
    every iteration, and the GEMMs run at BLAS speed. The arithmetic is that
    of :func:`forward_partial`, :func:`output_delta` and
    :func:`backward_partial`, operation for operation.

    Parameters
    ----------
    s, m, n, l : int
        Samples and hidden units of the rectangle, inputs and outputs.
    dtype : numpy dtype
    """

    def __init__(self, s: int, m: int, n: int, l: int, dtype: Any = "float64") -> None:  # noqa: E741
        self.key = (s, m, n, l, np.dtype(dtype).str)
        dt = np.dtype(dtype)
        self.f = np.empty((s, m), dt)  # hidden outputs; 1 - f after backward
        self.partial = np.empty((s, l), dt)  # f V^T
        self.u = np.empty((s, l), dt)  # summed pre-activation of the column
        self.h = np.empty((s, l), dt)
        self.diff = np.empty((s, l), dt)
        self.delta2 = np.empty((s, l), dt)
        self.delta1 = np.empty((s, m), dt)
        self.dW = np.empty((m, n), dt)
        self.dV = np.empty((l, m), dt)

    def fits(self, s: int, m: int, n: int, l: int, dtype: Any) -> bool:  # noqa: E741
        return self.key == (s, m, n, l, np.dtype(dtype).str)

    @staticmethod
    def _sigmoid(a: np.ndarray) -> np.ndarray:
        # the arithmetic of sigmoid(): exp(-a), + 1, reciprocal, in place
        np.negative(a, out=a)
        with np.errstate(over="ignore"):
            np.exp(a, out=a)
        a += 1.0
        np.reciprocal(a, out=a)
        return a

    def forward(self, x: np.ndarray, W: np.ndarray, V: np.ndarray) -> np.ndarray:
        """Hidden outputs into ``self.f``; returns the partial product ``f V^T`` (``self.partial``)."""
        np.matmul(x, W.T, out=self.f)
        self._sigmoid(self.f)
        np.matmul(self.f, V.T, out=self.partial)
        return self.partial

    def output_delta(self, u: np.ndarray, d: np.ndarray) -> tuple[np.ndarray, float]:
        """Output deltas (``self.delta2``) and the error of the summed pre-activation ``u``."""
        h = self.h
        np.copyto(h, u)
        self._sigmoid(h)
        np.subtract(h, d, out=self.diff)
        err = 0.5 * float(np.vdot(self.diff, self.diff))
        np.multiply(self.diff, h, out=self.delta2)
        np.subtract(1.0, h, out=h)
        self.delta2 *= h
        return self.delta2, err

    def backward(self, x: np.ndarray, V: np.ndarray, delta2: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Weight-update sums ``(dW, dV)`` of the rectangle (``self.dW``, ``self.dV``); uses ``self.f``."""
        f, d1 = self.f, self.delta1
        np.matmul(delta2, V, out=d1)
        d1 *= f
        np.matmul(delta2.T, f, out=self.dV)
        np.subtract(1.0, f, out=f)  # f is not needed after dV: reuse it for 1 - f
        d1 *= f
        np.matmul(d1.T, x, out=self.dW)
        return self.dW, self.dV


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


def fit_serial(
    x: np.ndarray,
    d: np.ndarray,
    *,
    hidden: int | None = None,
    iterations: int | None = None,
    learning_rate: float | None = None,
    init: tuple[np.ndarray, np.ndarray] | None = None,
    seed: int | None = None,
    dtype: str | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Serial batch BP: the reference every distributed run must equal.

    Parameters
    ----------
    x, d : array_like or xarray.Dataset or path
        Inputs ``(s, n)`` and teacher signals ``(s, l)`` (see :func:`dask_rpm.fit`).
    hidden : int
        Number of hidden units ``m`` (ignored when ``init`` is given).
    iterations : int
        Number of batch iterations.
    learning_rate : float
        ``eps`` in ``W <- W - eps * sum_x dW(x)``.
    init : (W0, V0), optional
        Initial weights; default :func:`init_weights` with ``seed``.
    seed, dtype
        As in :func:`dask_rpm.fit`.

    Returns
    -------
    W, V : numpy.ndarray
        Final weights.
    err : numpy.ndarray
        Error ``0.5 sum (h - d)^2`` of each iteration's forward pass (before
        that iteration's update).
    """
    from . import config
    from .data import as_arrays, check_training_args

    x, d = as_arrays(x, d)
    dtype = config.get("train.dtype", dtype)
    iterations = int(config.get("train.iterations", iterations))
    learning_rate = float(config.get("train.learning-rate", learning_rate))
    seed = int(config.get("train.seed", seed))
    W, V = check_training_args(
        x, d, hidden=hidden, iterations=iterations, learning_rate=learning_rate, init=init,
        seed=seed, dtype=dtype,
    )
    x = np.ascontiguousarray(x, dtype=dtype)
    d = np.ascontiguousarray(d, dtype=dtype)
    err = np.empty(iterations)
    ws = Workspace(x.shape[0], W.shape[0], x.shape[1], d.shape[1], dtype)
    W, V = W.copy(), V.copy()
    for k in range(iterations):
        u = ws.forward(x, W, V)
        delta2, err[k] = ws.output_delta(u, d)
        dW, dV = ws.backward(x, V, delta2)
        dW *= learning_rate  # W - eps * dW, in place
        dV *= learning_rate
        W -= dW
        V -= dV
    return W, V, err
