"""The full-batch objective of a network and its gradient: what a quasi-Newton solver minimises.

Pure. scikit-learn's lbfgs minimises the mean loss over the samples plus the L2 penalty
``0.5 alpha sum W^2 / samples`` (weights only, not biases); its gradient is the summed
gradient plus ``alpha W``, divided by the samples (``_loss_grad_lbfgs``). One evaluation is
one iteration of full-batch BP without its step: forward, output deltas, backward. The
kernels are the training kernels (:class:`~dask_rpm.nn.kernels.Workspace`), so
:class:`SerialObjective` and the cluster's evaluation
(:class:`dask_rpm.engine.objective.ClusterObjective`) compute the same numbers to rounding.
Both end with :func:`mean_objective`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from . import backend as xb
from . import sparse
from .backend import NUMPY, Backend
from .layers import layers_of_params
from .network import Network
from .optim import mean_gradient, penalty
from .workspaces import whole_workspace

__all__ = ["SerialObjective", "mean_objective"]


def mean_objective(
    params: Sequence[np.ndarray],
    error: float,
    sums: list[np.ndarray],
    divisor: Any,
    alpha: float,
    net: Network,
) -> tuple[float, list[np.ndarray]]:
    """scikit-learn's lbfgs objective and gradient from one full-batch iteration's ``error``
    (the summed loss plus ``0.5 alpha sum W^2``) and summed gradient ``sums`` (overwritten):
    ``error / divisor`` and ``(sums + alpha W) / divisor``, ``alpha W`` on the weights only.

    ``params`` are the augmented parameters ``W_1 .. W_L, V`` the iteration ran on;
    ``divisor`` is what scikit-learn divides by, the samples
    (:meth:`Recipe.divisor <dask_rpm.nn.recipe.Recipe.divisor>` of the full batch).
    """
    layers = layers_of_params(params)
    biases = layers.bias_columns((0, layers.m), net.bias)
    mean_gradient(params, sums, divisor, alpha, biases)
    return error / divisor, sums


class SerialObjective:
    """The objective of a network on ``x, d`` in this process, on ``backend``.

    Parameters
    ----------
    x : numpy.ndarray or scipy.sparse matrix
        Inputs ``(s, n)`` with the bias input appended when ``net`` has bias
        (:meth:`~dask_rpm.nn.network.Network.augment`); sparse: :mod:`dask_rpm.nn.sparse`.
    d : numpy.ndarray
        Targets ``(s, l)``.
    params : sequence of numpy.ndarray
        Parameters of the network's shapes (augmented ``W_1 .. W_L, V``): the buffers are
        sized for them.
    net : Network
    alpha : float
        The L2 penalty.
    loss_scale : float
        Factor on the squared loss (:meth:`dask_rpm.nn.recipe.Recipe.loss_scale`: ``1 / l`` is
        scikit-learn's mean over the outputs).
    divisor : float, optional
        What the objective is divided by (:func:`mean_objective`; default the samples).
    backend : Backend, optional
        Where the data, the weights and the kernels' buffers live (default numpy).
    """

    def __init__(
        self,
        x: np.ndarray,
        d: np.ndarray,
        params: Sequence[np.ndarray],
        net: Network,
        alpha: float = 0.0,
        loss_scale: float = 1.0,
        divisor: float | None = None,
        backend: Backend | None = None,
    ) -> None:
        self.backend = backend or NUMPY
        be = self.backend
        self.x, self.d = sparse.placed(be, x), be.asarray(d)  # CSR stays CSR on numpy
        self.divisor = float(x.shape[0] if divisor is None else divisor)
        self.net, self.alpha = net, float(alpha)
        self.params = [be.copy_of(p) for p in params]  # the weights of each evaluation, copied in
        self.ws = whole_workspace(int(x.shape[0]), self.params, net, loss_scale, backend=be)
        layers = layers_of_params(self.params)
        self.biases = layers.bias_columns((0, layers.m), net.bias)

    def sums(self, params: Sequence[np.ndarray]) -> tuple[float, list[np.ndarray]]:
        """One full-batch iteration without its step: the error (summed loss plus the penalty)
        and the summed gradient of every parameter (host copies)."""
        for p, q in zip(self.params, params):
            xb.copyto(p, q)
        ws, x = self.ws, self.x
        delta2, error = ws.output_delta(ws.forward(x, self.params), self.d)
        if self.alpha:
            error += 0.5 * self.alpha * penalty(self.params, self.biases)
        grads = ws.backward(x, self.params, delta2)
        return float(error), [xb.host_copy(g) for g in grads]

    def __call__(self, params: Sequence[np.ndarray]) -> tuple[float, list[np.ndarray]]:
        """The mean loss with the penalty at ``params`` and its gradient (:func:`mean_objective`)."""
        error, sums = self.sums(params)
        return mean_objective(params, error, sums, self.divisor, self.alpha, self.net)

    def close(self) -> None:
        """Nothing to release in this process (:class:`dask_rpm.engine.objective.ClusterObjective`
        releases its workers' state)."""

    def __enter__(self) -> SerialObjective:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
