"""The functional form of the network: hidden activation, output and loss, bias terms.

Pure (numpy only). A :class:`Network` is a small record that travels with the
training run to every worker; the kernels (:mod:`dask_rpm.nn.kernels`) read it.

Bias terms without a second code path
-------------------------------------
With ``bias=True`` the network gets one extra input whose value is always 1
(its weights in ``W`` are the hidden biases) and one extra hidden unit whose
output is always 1 (its weights in ``V`` are the output biases). Both are
ordinary rows and columns of the weight matrices, so they move with their
rows in remaps, checkpoints and recovery, are summed by the same horizontal
exchange, and carry optimizer state like every other weight. The bias unit
is the last hidden row (index ``m``); the kernels hold its output at 1 and
its input weights at 0 (its delta is 0). A network with ``m`` hidden units
and ``bias=True`` is therefore planned as ``n + 1`` inputs and ``m + 1``
hidden units; :meth:`Network.split` and :meth:`Network.join` convert between
those augmented matrices and the user's ``W, b, V, c``.

Sample weights without a second code path
-----------------------------------------
With ``weighted=True`` every target row carries its sample's weight as one more, last column
(as every input row carries the bias input): the weights travel with their samples to every
column and batch, and the kernels (:meth:`dask_rpm.nn.kernels.Workspace.output_delta`) weigh
each sample's loss and output delta by it, so the gradients the exchanges sum are weighted
sums. The batch's weight sum, what scikit-learn divides the gradient by, is the recipe's
(:meth:`dask_rpm.nn.recipe.Recipe.divisor`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from . import sparse
from .errors import DataError

__all__ = ["Network", "ACTIVATIONS", "OUTPUTS", "LOSSES", "network", "NetworkError"]

#: Hidden-layer activations (``identity``: none, scikit-learn's linear units).
ACTIVATIONS = ("sigmoid", "tanh", "relu", "identity")
#: Output layers; ``softmax`` goes with the ``cross-entropy`` loss only (``sigmoid`` with
#: ``cross-entropy`` is the binary / multi-label log loss: one independent probability per output);
#: ``exp`` with the ``poisson`` loss only.
OUTPUTS = ("sigmoid", "linear", "softmax", "exp")
#: Losses, summed over samples (the paper sums; so does ``reduction="sum"`` in PyTorch).
LOSSES = ("squared", "cross-entropy", "poisson")

#: The output layer a loss uses unless told otherwise.
_DEFAULT_OUTPUT = {"squared": "sigmoid", "cross-entropy": "softmax", "poisson": "exp"}
_VALID_OUTPUTS = {
    "squared": ("sigmoid", "linear"),
    "cross-entropy": ("softmax", "sigmoid"),
    "poisson": ("exp",),
}


class NetworkError(DataError):
    """An invalid combination of activation, output, loss or bias."""


class Network(NamedTuple):
    """What the kernels compute; the defaults are the paper's network.

    Attributes
    ----------
    activation : {"sigmoid", "tanh", "relu", "identity"}
        Hidden-layer activation.
    loss : {"squared", "cross-entropy", "poisson"}
        ``0.5 sum (h - d)^2``; or ``-sum d log softmax(u)`` (softmax outputs), and
        ``-sum [d log h + (1 - d) log(1 - h)]`` (sigmoid outputs); or the half Poisson deviance
        ``sum [d log(d / h) - d + h]`` with ``h = exp(u)`` (scikit-learn's ``poisson_loss``).
    output : {"sigmoid", "linear", "softmax", "exp"}
        Output layer (``h`` as a function of the pre-activation ``u``).
    bias : bool
        Hidden and output bias terms (module docstring).
    weighted : bool
        The targets' last column is each sample's weight (module docstring).
    """

    activation: str = "sigmoid"
    loss: str = "squared"
    output: str = "sigmoid"
    bias: bool = False
    weighted: bool = False

    @property
    def is_paper(self) -> bool:
        """The paper's network: sigmoid, squared error with sigmoid outputs, no bias."""
        return self == Network()

    def inputs(self, n: int) -> int:
        """Columns of ``W`` for ``n`` data inputs (one more with bias)."""
        return n + 1 if self.bias else n

    def hidden(self, m: int) -> int:
        """Rows of ``W`` (hidden units as planned) for ``m`` hidden units (one more with bias)."""
        return m + 1 if self.bias else m

    def bias_row(self, m_planned: int) -> int | None:
        """Global index of the bias unit among ``m_planned`` hidden rows, or None."""
        return m_planned - 1 if self.bias else None

    def augment(self, x: np.ndarray) -> np.ndarray:
        """``x`` with the constant-1 input appended when ``bias`` (a new C-contiguous array, or
        CSR matrix for sparse ``x``: :mod:`dask_rpm.nn.sparse`), else ``x``."""
        if not self.bias:
            return x
        if sparse.issparse(x):
            return sparse.augment(x)
        out = np.empty((x.shape[0], x.shape[1] + 1), dtype=x.dtype)
        out[:, :-1] = x
        out[:, -1] = 1.0
        return out

    def join(
        self, W: np.ndarray, V: np.ndarray, b: np.ndarray | None = None, c: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Augmented ``(W, V)`` from the user's weights (biases default to 0)."""
        Wa, Va = self.join_params([W, V], None if b is None and c is None else [b, c])
        return Wa, Va

    def join_params(
        self, weights: Sequence[np.ndarray], biases: Sequence[np.ndarray | None] | None = None
    ) -> list[np.ndarray]:
        """Augmented parameters from the user's weights ``W_1 .. W_L, V`` and biases (default 0).

        With ``bias``, ``W_k`` gains its biases as a last column (the weight of the constant
        input, or of the previous layer's bias unit) and a last row of zeros (its own bias unit,
        whose output is held at 1); ``V`` gains the output biases as a last column.
        """
        if not self.bias:
            return list(weights)
        biases = list(biases) if biases is not None else [None] * len(weights)
        out = []
        for i, (w, b) in enumerate(zip(weights, biases)):
            last = i == len(weights) - 1
            r, c = w.shape
            a = np.zeros((r if last else r + 1, c + 1), dtype=w.dtype)
            a[:r, :c] = w
            a[:r, c] = 0.0 if b is None else b
            out.append(a)
        return out

    def split(self, W: np.ndarray, V: np.ndarray) -> dict[str, Any]:
        """The user's ``W, b, V, c`` from augmented weights (``b``, ``c`` None without bias)."""
        (W_, V_), (b, c) = self.split_params([W, V])
        return {"W": W_, "b": b, "V": V_, "c": c}

    def split_params(
        self, params: Sequence[np.ndarray]
    ) -> tuple[list[np.ndarray], list[np.ndarray | None]]:
        """The user's weights and biases (None without bias) from augmented parameters (views)."""
        if not self.bias:
            return list(params), [None] * len(params)
        last = len(params) - 1
        weights = [p[:, :-1] if i == last else p[:-1, :-1] for i, p in enumerate(params)]
        biases: list[np.ndarray | None] = [
            p[:, -1] if i == last else p[:-1, -1] for i, p in enumerate(params)
        ]
        return weights, biases


def network(
    activation: str = "sigmoid",
    loss: str = "squared",
    output: str | None = "auto",
    bias: bool = False,
    weighted: bool = False,
) -> Network:
    """A validated :class:`Network` (``output="auto"`` or None follows the loss); the defaults
    are the paper's network, those of ``rpm.train.*`` as shipped (``weighted``: the targets
    carry sample weights, set by :func:`dask_rpm.nn.recipe.recipe` when there are some)."""
    if activation not in ACTIVATIONS:
        raise NetworkError(f"activation={activation!r}; valid: {', '.join(ACTIVATIONS)}")
    if loss not in LOSSES:
        raise NetworkError(f"loss={loss!r}; valid: {', '.join(LOSSES)}")
    output = _DEFAULT_OUTPUT[loss] if output in (None, "auto") else str(output)
    if output not in _VALID_OUTPUTS[loss]:
        raise NetworkError(
            f"output={output!r} with loss={loss!r}; valid with that loss: {', '.join(_VALID_OUTPUTS[loss])} "
            f"(or 'auto')"
        )
    if not isinstance(bias, (bool, np.bool_)):
        raise NetworkError(f"bias={bias!r}; give true or false")
    return Network(activation, loss, output, bool(bias), bool(weighted))
