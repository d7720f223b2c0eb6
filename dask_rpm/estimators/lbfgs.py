"""scikit-learn's ``solver="lbfgs"``: scipy's L-BFGS-B on the client, the objective where the data is.

scikit-learn's ``_fit_lbfgs`` hands ``scipy.optimize.minimize(method="L-BFGS-B", jac=True)``
its coefficients and intercepts packed into one vector (every layer's ``coefs_`` raveled,
then every layer's ``intercepts_``) and its ``_loss_grad_lbfgs``: the mean loss plus
``0.5 alpha sum W^2 / samples`` and its gradient, over the whole training set.
:func:`minimize` does the same with the same options (``maxiter=max_iter``,
``maxfun=max_fun``, ``gtol=tol``, scikit-learn's ``iprint`` where scipy still takes it), so
it takes scikit-learn's steps; only the objective is dask_rpm's: serially
(:class:`dask_rpm.nn.objective.SerialObjective`) or, with a client, on the cluster
(:class:`dask_rpm.engine.objective.ClusterObjective`: set up once, then each evaluation sends
the workers their weight rows and gathers the summed gradient). As in dask-glm's lbfgs, scipy
and the weights stay on the client.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import scipy.optimize
from sklearn.utils.fixes import _get_additional_lbfgs_options_dict
from sklearn.utils.optimize import _check_optimize_result

from ..nn.backend import resolve
from ..nn.network import Network
from ..nn.objective import SerialObjective
from ..nn.options import TrainingOptions
from ..nn.prepare import prepare

__all__ = ["Packing", "LbfgsResult", "minimize", "fit"]


class Packing:
    """scikit-learn's packing of ``coefs_`` and ``intercepts_`` into one vector, and dask_rpm's
    augmented parameters ``W_1 .. W_L, V`` (:meth:`~dask_rpm.nn.network.Network.join_params`)."""

    def __init__(self, coefs: Sequence[np.ndarray], net: Network) -> None:
        self.net = net
        self.shapes = [c.shape for c in coefs]
        sizes = [int(np.prod(s)) for s in self.shapes] + [s[1] for s in self.shapes]
        self.bounds = np.cumsum([0, *sizes])

    def pack(self, coefs: Sequence[np.ndarray], intercepts: Sequence[np.ndarray]) -> np.ndarray:
        """scikit-learn's ``_pack``: every coefficient matrix raveled, then every intercept."""
        return np.hstack([np.ravel(a) for a in (*coefs, *intercepts)])

    def unpack(self, packed: np.ndarray) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """``coefs_`` and ``intercepts_`` (copies) from a packed vector."""
        parts = [packed[a:b] for a, b in zip(self.bounds[:-1], self.bounds[1:])]
        L = len(self.shapes)
        coefs = [np.array(p.reshape(s)) for p, s in zip(parts[:L], self.shapes)]
        return coefs, [np.array(p) for p in parts[L:]]

    def params(self, packed: np.ndarray) -> list[np.ndarray]:
        """The augmented parameters a packed vector holds."""
        coefs, intercepts = self.unpack(packed)
        return self.net.join_params([c.T for c in coefs], intercepts)

    def gradient(self, grads: Sequence[np.ndarray]) -> np.ndarray:
        """The packed gradient from the augmented parameters' (the bias units' rows, always 0,
        left out)."""
        weights, biases = self.net.split_params(grads)
        return self.pack([w.T for w in weights], [b for b in biases if b is not None])


class LbfgsResult(NamedTuple):
    """What :func:`minimize` ends with: scikit-learn's fitted values, and scipy's result."""

    coefs: list[np.ndarray]
    intercepts: list[np.ndarray]
    n_iter: int
    loss: float
    evaluations: int
    optimize_result: Any


def minimize(
    objective: Any,
    packing: Packing,
    x0: np.ndarray,
    *,
    max_iter: int,
    max_fun: int,
    tol: float,
    verbose: Any,
) -> LbfgsResult:
    """scikit-learn's ``_fit_lbfgs`` with ``objective(params) -> (loss, gradients)`` (the
    augmented parameters' mean loss with the penalty, and its gradient of each).

    Warns scikit-learn's ``ConvergenceWarning`` when scipy stops short of convergence
    (``max_iter`` or ``max_fun`` reached, or the line search failing).
    """
    evaluations = 0

    def loss_grad(packed: np.ndarray) -> tuple[float, np.ndarray]:
        nonlocal evaluations
        evaluations += 1
        loss, grads = objective(packing.params(packed))
        return loss, packing.gradient(grads)

    # scikit-learn's verbosity: scipy's own lines, where the installed scipy still prints them
    iprint = 1 if verbose is True or verbose >= 1 else -1
    res = scipy.optimize.minimize(
        loss_grad,
        x0,
        method="L-BFGS-B",
        jac=True,
        options={
            "maxfun": max_fun,
            "maxiter": max_iter,
            "gtol": tol,
            **_get_additional_lbfgs_options_dict("iprint", iprint),
        },
    )
    # scikit-learn's own check: the same n_iter_ and the same ConvergenceWarning text
    n_iter = _check_optimize_result("lbfgs", res, max_iter)
    coefs, intercepts = packing.unpack(res.x)
    return LbfgsResult(coefs, intercepts, int(n_iter), float(res.fun), evaluations, res)


def fit(
    X: np.ndarray,
    Y: np.ndarray,
    coefs: Sequence[np.ndarray],
    intercepts: Sequence[np.ndarray],
    net: Network,
    alpha: float,
    *,
    client: Any,
    cluster: dict[str, Any],
    max_iter: int,
    max_fun: int,
    tol: float,
    verbose: Any,
    sample_weight: np.ndarray | None = None,
) -> LbfgsResult:
    """scikit-learn's lbfgs from ``coefs`` / ``intercepts`` on ``X, Y`` (targets ``(s, l)``):
    the objective of ``net`` with the L2 penalty ``alpha`` on ``client``'s workers, or serially
    (``client`` None); ``sample_weight`` weighs each sample's loss and gradient, the objective
    then divided by their sum, as scikit-learn's.

    ``cluster`` holds :class:`~dask_rpm.engine.objective.ClusterObjective`'s ``mapping``,
    ``abilities``, ``backend`` and ``device`` (serially, ``backend`` and ``device`` place the
    kernels in this process).
    """
    packing = Packing(coefs, net)
    options = TrainingOptions(
        hidden=tuple(c.shape[1] for c in coefs[:-1]),
        iterations=1,
        init=([c.T for c in coefs], list(intercepts)),
        dtype=X.dtype.name,
        batch_size=int(X.shape[0]),  # every sample: the objective is the whole training set's
        shuffle=False,
        activation=net.activation,
        loss=net.loss,
        output=net.output,
        bias=net.bias,
        optimizer="sgd",  # never stepped: an optimizer without state
        alpha=alpha,
        reduction="mean",  # scikit-learn's squared loss: a mean over the outputs too
        sample_weight=sample_weight,
    )
    objective: Any
    if client is None:
        job = prepare(X, Y, options, load=True)
        assert job.arrays is not None  # arrays given: loaded
        x, d = job.arrays
        rec = job.recipe
        objective = SerialObjective(
            net.augment(x),
            d,
            job.params0,
            rec.net,
            rec.alpha,
            rec.loss_scale(job.layers.l),
            rec.divisor(0),  # the full batch's: the samples
            backend=resolve(cluster.get("backend"), cluster.get("device")),
        )
    else:
        from ..engine.objective import ClusterObjective  # only with a client: needs distributed

        objective = ClusterObjective(client, X, Y, options, **cluster)
    with objective:
        return minimize(
            objective,
            packing,
            packing.pack(coefs, intercepts),
            max_iter=max_iter,
            max_fun=max_fun,
            tol=tol,
            verbose=verbose,
        )
