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

One step is one pass over each parameter: a numpy parameter is stepped in blocks of rows that
stay in the core's cache while every operation of the update runs on them (the mean gradient,
the moments, the new weights), instead of a dozen passes over arrays larger than the cache, and
no operation allocates a temporary the size of a parameter. The update can write the new
weights and state into other arrays (``out=``), so that a worker keeps the ones before the
step without copying them (:class:`dask_rpm.engine.worker.Shard`). The operations are the
same, in the same order, whatever the blocks: a block of rows steps to the bits a whole
parameter would. While the new weights are in the cache the step also tells whether they are
finite, and their sum of squares for the next iteration's penalty (:class:`Stepped`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from . import backend as xb
from .errors import DataError
from .kernels import all_finite

__all__ = [
    "Optimizer",
    "OPTIMIZERS",
    "CONVENTIONS",
    "optimizer",
    "OptimizerError",
    "step",
    "Stepped",
    "mean_gradient",
    "penalty",
    "squares",
]

#: Elements of a parameter's block of rows that one pass of the update works on (numpy): the
#: five arrays of a block (weights, gradient, two moments, scratch; 1.25 MiB in float64) stay
#: near a core (measured on 2 cores with 1 MiB of L2 each: 8,192 to 262,144 alike, within noise).
BLOCK = 32768

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
        total += squares(p, skip)
    return total


def squares(p: Any, skip: int | None) -> float:
    """``sum p^2`` over ``p`` without its column ``skip`` (a 1-D ``p`` with a ``skip``: all bias,
    0.0), with no temporary the size of ``p``: the whole array's sum less the column's."""
    if skip is None:
        return xb.vdot(p, p)
    if p.ndim == 1:
        return 0.0
    col = p[:, skip]
    return xb.vdot(p, p) - xb.vdot(col, col)


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
        _mean(p, g, batch, alpha, skip, None)


def _mean(p: Any, g: Any, batch: Any, alpha: float, skip: int | None, tmp: Any) -> None:
    """:func:`mean_gradient` of one parameter (or block of rows); ``tmp`` scratch of ``p``'s size
    at least (flat), or None (one is made where ``alpha`` needs it)."""
    if alpha:
        for gp, pp in zip(_weights(g, skip), _weights(p, skip)):
            if tmp is None:
                gp += alpha * pp
            else:
                t = _part(tmp, gp)
                xb.namespace(pp).multiply(pp, alpha, out=t)
                gp += t
    g /= batch


class Stepped(NamedTuple):
    """What :func:`step` found while the new weights were in the cache."""

    #: every new parameter is finite
    finite: bool
    #: ``sum W^2`` of the new weights, biases left out (:func:`penalty`'s); NaN unless asked
    squares: float


def step(
    opt: Optimizer,
    lr: float,
    t: int,
    params: Sequence[np.ndarray],
    grads: Sequence[np.ndarray],
    state: Mapping[str, Sequence[np.ndarray]],
    *,
    out: tuple[Sequence[np.ndarray], Mapping[str, Sequence[np.ndarray]]] | None = None,
    batch: Any = None,
    alpha: float = 0.0,
    biases: Sequence[int | None] = (),
    sum_squares: bool = False,
) -> Stepped:
    """One update of ``params`` from the ``grads`` (used as scratch: overwritten).

    ``t`` is the 1-based step number (Adam's bias correction); ``state[slot][i]``
    belongs to ``params[i]``. The new parameters and state go to ``out = (params, state)``
    (arrays of the same shapes; ``params`` and ``state`` are then left as they were), or by
    default in place. With ``batch`` the gradient is first :func:`mean_gradient`'s
    ``(g + alpha W) / batch`` (``biases``: each parameter's bias column, as there). With
    ``sum_squares`` the result carries :func:`penalty` of the new parameters.
    """
    t += opt.steps
    new_params, new_state = (params, state) if out is None else out
    skips = list(biases) or [None] * len(params)
    slots = list(opt.slots)
    update = _updater(opt, lr, t)
    finite, total, tmp = True, 0.0, None
    for i, (p, g, skip) in enumerate(zip(params, grads, skips)):
        arrays = [p, g, new_params[i]]
        arrays += [state[k][i] for k in slots] + [new_state[k][i] for k in slots]
        for block in _blocks(arrays):
            bp, bg, bo = block[:3]
            if tmp is None or _count(tmp) < _count(bg) or type(tmp) is not type(bg):
                tmp = _scratch(bg)
            if batch is not None:
                _mean(bp, bg, batch, alpha, skip, tmp)
            update(block, tmp)
            if sum_squares:
                total += squares(bo, skip)
            if finite and not _finite_sum(bo):
                finite = False
    if not finite:  # a sum may overflow for finite numbers: the exact check decides
        finite = all(all_finite(p) for p in new_params)
    return Stepped(finite, total if sum_squares else math.nan)


def _finite_sum(a: Any) -> bool:
    total = float(np.add.reduce(a, axis=None)) if isinstance(a, np.ndarray) else float(a.sum())
    return math.isfinite(total)


def _count(a: Any) -> int:
    """Elements of ``a`` (``size`` is a method on torch tensors)."""
    return math.prod(a.shape)


def _part(tmp: Any, like: Any) -> Any:
    """The leading elements of flat scratch ``tmp`` in the shape of ``like``."""
    return tmp[: _count(like)].reshape(tuple(like.shape))


def _scratch(g: Any) -> Any:
    """Flat scratch of ``g``'s size on its backend."""
    if isinstance(g, np.ndarray):
        return np.empty(g.size, dtype=g.dtype)
    return xb.namespace(g).empty_like(g).reshape(-1)


def _blocks(arrays: list[Any]) -> Any:
    """The same rows of every array of ``arrays`` (C-contiguous numpy matrices of one shape),
    :data:`BLOCK` elements or so at a time (whole rows: a bias column stays a column); anything
    else whole."""
    first = arrays[0]
    if not (
        isinstance(first, np.ndarray)
        and first.ndim == 2
        and first.size > BLOCK
        and all(isinstance(a, np.ndarray) and a.flags.c_contiguous for a in arrays)
    ):
        yield arrays
        return
    rows = max(1, BLOCK // first.shape[1])
    for a in range(0, first.shape[0], rows):
        yield [x[a : a + rows] for x in arrays]


def _updater(opt: Optimizer, lr: float, t: int) -> Any:
    """``update(block, tmp)``: the optimizer's arithmetic on one block ``[p, g, p_out, *state,
    *state_out]`` (``g`` scratch; ``tmp`` flat scratch of at least the block's size)."""
    if opt.name == "adam":
        return _adam(opt, lr, t)
    if opt.convention == "scikit-learn":
        return _sgd_sklearn(opt, lr)
    if opt.name == "sgd":

        def sgd(block: list[Any], tmp: Any) -> None:
            p, g, po = block
            g *= lr
            xb.namespace(p).subtract(p, g, out=po)

        return sgd
    if opt.name == "momentum":

        def momentum(block: list[Any], tmp: Any) -> None:
            p, g, po, buf, bo = block
            xp = xb.namespace(p)
            xp.multiply(buf, opt.momentum, out=bo)
            bo += g
            xp.multiply(bo, lr, out=g)
            xp.subtract(p, g, out=po)

        return momentum
    raise OptimizerError(f"optimizer {opt.name!r} is not known")  # pragma: no cover


def _adam(opt: Optimizer, lr: float, t: int) -> Any:
    """Adam in either convention: PyTorch adds ``eps`` to ``sqrt(v)`` after its bias correction,
    scikit-learn before it (and folds the correction into the step size)."""
    b1, b2, eps = opt.beta1, opt.beta2, opt.eps
    bc1 = 1.0 - b1**t
    root_bc2 = math.sqrt(1.0 - b2**t)
    sklearn = opt.convention == "scikit-learn"
    size = lr * root_bc2 / bc1 if sklearn else lr / bc1

    def adam(block: list[Any], tmp: Any) -> None:
        p, g, po, m, v, mo, vo = block
        xp = xb.namespace(p)
        sq = _part(tmp, g)
        # v' = b2 v + (1 - b2) g^2 and m' = b1 m + (1 - b1) g, each product rounded as before
        xp.multiply(g, g, out=sq)
        sq *= 1.0 - b2
        xp.multiply(v, b2, out=vo)
        vo += sq
        g *= 1.0 - b1
        xp.multiply(m, b1, out=mo)
        mo += g
        xp.sqrt(vo, out=sq)  # the denominator
        if not sklearn:
            sq /= root_bc2
        sq += eps
        xp.divide(mo, sq, out=sq)
        sq *= size
        xp.subtract(p, sq, out=po)

    return adam


def _sgd_sklearn(opt: Optimizer, lr: float) -> Any:
    """scikit-learn's ``SGDOptimizer`` update, operation for operation."""
    mu = opt.momentum

    def sgd(block: list[Any], tmp: Any) -> None:
        p, g, po, vel, vo = block
        xp = xb.namespace(p)
        g *= lr
        xp.multiply(vel, mu, out=vo)
        vo -= g
        if opt.nesterov:
            ahead = _part(tmp, g)
            xp.multiply(vo, mu, out=ahead)
            ahead -= g
            xp.add(p, ahead, out=po)
        else:
            xp.add(p, vo, out=po)

    return sgd
