"""Optimizers: plain gradient descent (the paper), momentum, Adam — elementwise, so row-split exact.

Pure (on any array backend: :mod:`~dask_rpm.nn.backend`). Every update is elementwise in the weights, so a worker
that holds some hidden rows updates them exactly as the serial reference
updates the same rows, as long as it was given the same summed gradient.
The optimizer's state (momentum buffer; Adam's first and second moments)
has the shape of the weights and is split by hidden rows like them: it
lives with its rows on the workers, moves with them in remaps and recovery,
and is saved in checkpoints. Adam's step count is the iteration number + 1,
so it needs no state of its own.

Conventions follow PyTorch's ``torch.optim.SGD`` (``dampening=0``,
``nesterov=False``) and ``torch.optim.Adam`` (``amsgrad=False``), applied to
the *summed* gradient (the paper sums over samples; ``reduction="sum"``):

* ``sgd``:      ``p -= lr * g``
* ``momentum``: ``buf = mu * buf + g``; ``p -= lr * buf`` (``buf`` starts at 0,
  so the first step is PyTorch's ``buf = g``)
* ``adam``:     ``m = b1 m + (1 - b1) g``; ``v = b2 v + (1 - b2) g^2``;
  ``p -= (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)``

With ``convention="scikit-learn"`` the arithmetic is that of scikit-learn's
``SGDOptimizer`` and ``AdamOptimizer`` (``sklearn.neural_network``), which
:class:`dask_rpm.MLPClassifier` and :class:`dask_rpm.MLPRegressor` follow:

* ``sgd``:  ``vel = mu vel - lr g``; ``p += vel`` (Nesterov: ``p += mu vel - lr g``);
  the velocity is kept even with ``momentum=0``
* ``adam``: as above, but ``eps`` is added to ``sqrt(v)`` before the bias
  correction: ``p -= lr sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) + eps)``

The gradient a step receives is the summed one; :func:`step` can first turn
it into scikit-learn's ``(sum + alpha W) / batch`` (``alpha``: L2 penalty on
the weights, never on the biases; ``batch``: the mini-batch's samples).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from . import backend as xb
from .errors import DataError

__all__ = [
    "Optimizer",
    "OPTIMIZERS",
    "CONVENTIONS",
    "optimizer",
    "OptimizerError",
    "step",
    "mean_gradient",
    "penalty",
]

#: Names of the optimizers and the state arrays each keeps per weight matrix.
OPTIMIZERS: dict[str, tuple[str, ...]] = {"sgd": (), "momentum": ("buf",), "adam": ("m", "v")}
#: Arithmetic conventions (module docstring).
CONVENTIONS = ("pytorch", "scikit-learn")


class OptimizerError(DataError):
    """An invalid optimizer name or parameter."""


class Optimizer(NamedTuple):
    """An optimizer and its hyper-parameters (the learning rate travels separately)."""

    name: str = "sgd"
    momentum: float = 0.9
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    convention: str = "pytorch"
    nesterov: bool = False
    #: steps taken before this run (Adam's step count goes on from there: a continued partial_fit)
    steps: int = 0

    @property
    def slots(self) -> tuple[str, ...]:
        """Names of the state arrays kept per weight matrix."""
        if self.convention == "scikit-learn" and self.name == "sgd":
            return ("buf",)  # scikit-learn's velocities
        return OPTIMIZERS[self.name]


def optimizer(spec: Any = "sgd") -> Optimizer:
    """A validated :class:`Optimizer` from a name, a mapping ``{"name": ..., <parameter>: ...}``
    or an :class:`Optimizer`; parameters not given take :class:`Optimizer`'s defaults (a run's
    options add ``rpm.train.optimizer-parameters``: :meth:`~dask_rpm.nn.options.TrainingOptions.resolved`)."""
    if isinstance(spec, Optimizer):
        return _check(spec)
    if isinstance(spec, str):
        spec = {"name": spec}
    if not isinstance(spec, Mapping):
        raise OptimizerError(
            f"optimizer={spec!r}; give a name ({', '.join(OPTIMIZERS)}) or a mapping like "
            f"{{'name': 'adam', 'beta1': 0.9}}"
        )
    spec = dict(spec)
    name = spec.pop("name", None)
    unknown = sorted(set(spec) - set(Optimizer._fields))
    if unknown:
        raise OptimizerError(
            f"optimizer parameter(s) {unknown} not known; valid: "
            f"{', '.join(f for f in Optimizer._fields if f != 'name')}"
        )
    params: dict[str, Any] = {
        k: float(spec.get(k, getattr(Optimizer(), k)))
        for k in ("momentum", "beta1", "beta2", "eps")
    }
    params["convention"] = str(spec.get("convention", "pytorch"))
    nesterov = spec.get("nesterov", False)
    if not isinstance(nesterov, (bool, np.bool_)):
        raise OptimizerError(f"optimizer nesterov={nesterov!r}; give true or false")
    params["nesterov"] = bool(nesterov)
    steps = spec.get("steps", 0)
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 0:
        raise OptimizerError(f"optimizer steps={steps!r}; it must be an integer >= 0")
    params["steps"] = int(steps)
    return _check(Optimizer(str(name), **params))


def _check(opt: Optimizer) -> Optimizer:
    if opt.name not in OPTIMIZERS:
        raise OptimizerError(f"optimizer {opt.name!r} is not known; valid: {', '.join(OPTIMIZERS)}")
    for key in ("momentum", "beta1", "beta2"):
        v = getattr(opt, key)
        if not (0.0 <= v < 1.0):
            raise OptimizerError(f"optimizer {key}={v!r}; it must be in [0, 1)")
    if not (math.isfinite(opt.eps) and opt.eps > 0):
        raise OptimizerError(f"optimizer eps={opt.eps!r}; it must be a finite number > 0")
    if opt.convention not in CONVENTIONS:
        raise OptimizerError(
            f"optimizer convention={opt.convention!r}; valid: {', '.join(CONVENTIONS)}"
        )
    if opt.convention == "scikit-learn" and opt.name == "momentum":
        raise OptimizerError(
            "optimizer 'momentum' with convention='scikit-learn'; scikit-learn's is 'sgd' with "
            "momentum= (and nesterov=)"
        )
    if opt.nesterov and not (opt.convention == "scikit-learn" and opt.name == "sgd"):
        raise OptimizerError(
            "optimizer nesterov=True needs name='sgd' with convention='scikit-learn'"
        )
    return opt


def penalty(params: Sequence[np.ndarray], biases: Sequence[int | None]) -> float:
    """``sum p^2`` over the weights of ``params``, leaving out the bias column ``biases[i]`` of each.

    The L2 penalty ``0.5 alpha sum W^2`` covers weights, not biases, as in scikit-learn.
    """
    total = 0.0
    for p, skip in zip(params, biases):
        for part in _weights(p, skip):
            total += xb.vdot(part, part)
    return total


def _weights(p: np.ndarray, skip: int | None) -> list[np.ndarray]:
    """The column blocks of ``p`` without column ``skip`` (views); a 1-D ``p`` (a CNN layer's
    biases) with a ``skip`` is all bias: nothing."""
    if skip is None:
        return [p]
    if p.ndim == 1:
        return []
    return [b for b in (p[:, :skip], p[:, skip + 1 :]) if b.shape[1]]


def mean_gradient(
    params: Sequence[np.ndarray],
    grads: Sequence[np.ndarray],
    batch: Any,
    alpha: float = 0.0,
    biases: Sequence[int | None] = (),
) -> None:
    """``g <- (g + alpha p) / batch`` in place, ``alpha p`` on the weights only (scikit-learn's
    gradient of the mean loss plus ``0.5 alpha sum W^2 / batch``; ``batch`` the batch size, or
    a weighted batch's weight sum)."""
    skips = list(biases) or [None] * len(params)
    for p, g, skip in zip(params, grads, skips):
        if alpha:
            for gp, pp in zip(_weights(g, skip), _weights(p, skip)):
                gp += alpha * pp
        g /= batch


def step(
    opt: Optimizer,
    lr: float,
    t: int,
    params: Sequence[np.ndarray],
    grads: Sequence[np.ndarray],
    state: Mapping[str, Sequence[np.ndarray]],
) -> None:
    """One update of ``params`` in place, from the ``grads`` (used as scratch: overwritten).

    ``t`` is the 1-based step number (Adam's bias correction); ``state[slot][i]``
    belongs to ``params[i]`` and is updated in place.
    """
    t += opt.steps
    if opt.name == "adam":
        _adam(opt, lr, t, params, grads, state)
    elif opt.convention == "scikit-learn":
        _sgd_sklearn(opt, lr, params, grads, state)
    elif opt.name == "sgd":
        for p, g in zip(params, grads):
            g *= lr
            p -= g
    elif opt.name == "momentum":
        for p, g, buf in zip(params, grads, state["buf"]):
            buf *= opt.momentum
            buf += g
            xb.namespace(g).multiply(buf, lr, out=g)
            p -= g
    else:  # pragma: no cover - validated by optimizer()
        raise OptimizerError(f"optimizer {opt.name!r} is not known")


def _adam(
    opt: Optimizer,
    lr: float,
    t: int,
    params: Sequence[np.ndarray],
    grads: Sequence[np.ndarray],
    state: Mapping[str, Sequence[np.ndarray]],
) -> None:
    """Adam in either convention: PyTorch adds ``eps`` to ``sqrt(v)`` after its bias correction,
    scikit-learn before it (and folds the correction into the step size)."""
    bc1 = 1.0 - opt.beta1**t
    root_bc2 = math.sqrt(1.0 - opt.beta2**t)
    sklearn = opt.convention == "scikit-learn"
    size = lr * root_bc2 / bc1 if sklearn else lr / bc1
    for p, g, m, v in zip(params, grads, state["m"], state["v"]):
        xp = xb.namespace(g)
        m *= opt.beta1
        m += (1.0 - opt.beta1) * g
        v *= opt.beta2
        g *= g
        g *= 1.0 - opt.beta2
        v += g
        xp.sqrt(v, out=g)  # g is scratch from here: the denominator
        if not sklearn:
            g /= root_bc2
        g += opt.eps
        xp.divide(m, g, out=g)
        g *= size
        p -= g


def _sgd_sklearn(
    opt: Optimizer,
    lr: float,
    params: Sequence[np.ndarray],
    grads: Sequence[np.ndarray],
    state: Mapping[str, Sequence[np.ndarray]],
) -> None:
    """scikit-learn's ``SGDOptimizer`` update, operation for operation."""
    for p, g, vel in zip(params, grads, state["buf"]):
        g *= lr
        vel *= opt.momentum
        vel -= g
        if opt.nesterov:
            ahead = vel * opt.momentum
            ahead -= g
            p += ahead
        else:
            p += vel
