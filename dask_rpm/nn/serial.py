"""The serial reference: one process, the same kernels, the same recipe as the distributed engine.

Every distributed run must equal :func:`fit_serial` (float64, relative
1e-10) for every plan, through remaps, worker loss and resume.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .convergence import epoch_error
from .data import DataError
from .kernels import Workspace, all_finite
from .optim import mean_gradient, penalty, step
from .options import TRAINING_FIELDS, TrainingOptions
from .prepare import prepare
from .recipe import Recipe, Validator

__all__ = ["fit_serial", "train_arrays"]


def train_arrays(
    x: np.ndarray,
    d: np.ndarray,
    W0: np.ndarray,
    V0: np.ndarray,
    rec: Recipe,
    validator: Validator | None = None,
    target_error: float | None = None,
    rules: Sequence[Any] = (),
    opt_state: dict[str, list[np.ndarray]] | None = None,
) -> dict[str, Any]:
    """Train on prepared arrays (``x`` with the bias input already appended when the recipe has bias).

    ``rules`` are end-of-epoch rules (:class:`dask_rpm.convergence.ConvergenceRule`);
    ``opt_state`` the optimizer state to start from (default zeros).

    Returns a dict: ``W``, ``V`` (augmented, as planned), ``errors`` (loss of
    each iteration's forward pass, before its update), ``stopped`` (reason or
    None), ``validation`` (rows ``(iteration, loss, accuracy)``), ``optimizer_state``.
    """
    sched, net, opt = rec.schedule, rec.net, rec.optimizer
    W, V = W0.copy(), V0.copy()
    params = [W, V]
    state = (
        {k: [a.copy() for a in v] for k, v in opt_state.items()}
        if opt_state
        else {slot: [np.zeros_like(W), np.zeros_like(V)] for slot in opt.slots}
    )
    biases = (W.shape[1] - 1 if net.bias else None, net.bias_row(W.shape[0]))
    lr = rec.learning_rate
    ws = Workspace(
        min(sched.batch, x.shape[0]),
        W.shape[0],
        W.shape[1],
        d.shape[1],
        W.dtype,
        net,
        net.bias_row(W.shape[0]),
        rec.loss_scale(d.shape[1]),
    )
    errors = np.empty(rec.iterations)
    stopped = None
    order_epoch, order = -1, np.arange(0)  # replaced at the first mini-batch (epoch 0)
    done = 0
    for k in range(rec.iterations):
        if sched.full_batch:
            xb, db = x, d
        else:
            e = sched.epoch(k)
            if e != order_epoch:
                order_epoch, order = e, sched.order(e)
            lo, hi = sched.positions(k)
            idx = order[lo:hi]
            xb, db = x[idx], d[idx]
        u = ws.forward(xb, W, V)
        delta2, errors[k] = ws.output_delta(u, db)
        if rec.alpha:
            errors[k] += 0.5 * rec.alpha * penalty(params, biases)
        if not (np.isfinite(errors[k]) and all_finite(W) and all_finite(V)):
            stopped = f"training diverged at iteration {k}"
            break
        dW, dV = ws.backward(xb, V, delta2)
        if rec.alpha or rec.reduction == "mean":
            mean_gradient(params, [dW, dV], rec.divisor(k), rec.alpha, biases)
        step(opt, lr, k + 1, params, [dW, dV], state)
        done = k + 1
        if target_error is not None and errors[k] <= target_error:
            stopped = f"target error reached at iteration {k}"
            break
        if validator is not None and validator.due(done):
            reason = validator.evaluate(done, W, V)
            if reason:
                stopped = reason
                break
        if rules and done % sched.per_epoch == 0:
            lr, stopped = _end_epoch(rules, errors[done - sched.per_epoch : done], W, V, lr)
            if stopped:
                break
    return {
        "W": W,
        "V": V,
        "optimizer_state": state,
        "errors": errors[: done if stopped else rec.iterations],
        "stopped": stopped,
        "validation": [] if validator is None else validator.rows,
        "iterations": done,
    }


def _end_epoch(
    rules: Sequence[Any], errors: np.ndarray, W: np.ndarray, V: np.ndarray, lr: float
) -> tuple[float, str | None]:
    """Every rule's decision at an epoch's end: the next learning rate, and a reason to stop."""
    total = epoch_error(errors)
    stop = None
    for rule in rules:
        decision = rule.end_epoch(total, W, V) if rule.needs_weights else rule.end_epoch(total)
        lr = decision.learning_rate
        stop = stop or decision.stop
    return lr, stop


def fit_serial(
    x: Any,
    d: Any = None,
    *,
    hidden: int | None = None,
    iterations: int | None = None,
    learning_rate: float | None = None,
    init: tuple[np.ndarray, np.ndarray] | None = None,
    seed: int | None = None,
    dtype: str | None = None,
    epochs: int | None = None,
    batch_size: int | None = None,
    shuffle: bool | None = None,
    activation: str | None = None,
    loss: str | None = None,
    output: str | None = None,
    bias: bool | None = None,
    optimizer: Any = None,
    validation: Any = None,
    validate_every: int | None = None,
    early_stopping: int | None = None,
    tol: float | None = None,
    target_error: float | None = None,
    alpha: float | None = None,
    reduction: str | None = None,
    callbacks: Any = None,
    full_output: bool = False,
    options: TrainingOptions | None = None,
) -> Any:
    """Serial BP: the reference every distributed run must equal.

    Takes the training keywords of :func:`dask_rpm.fit` (same meaning, same
    ``rpm.train.*`` defaults).

    Parameters
    ----------
    x, d : array_like or xarray.Dataset or path
        Inputs ``(s, n)`` and targets ``(s, l)``; with ``loss="cross-entropy"``
        ``d`` may be 1-D class labels.
    hidden : int
        Number of hidden units ``m`` (ignored when ``init`` is given).
    iterations, epochs : int
        Number of iterations (mini-batch steps), or of epochs.
    learning_rate : float
        ``eps`` (the optimizer's step size on the summed gradient).
    init : (W0, V0), optional
        Initial weights (data inputs and hidden units, without bias terms);
        default :func:`dask_rpm.kernels.init_weights` with ``seed``.
    full_output : bool
        Return a dict (weights, errors, validation, stop reason) instead of
        ``(W, V, err)``.
    seed, dtype, batch_size, shuffle, activation, loss, output, bias, optimizer, validation,
    validate_every, early_stopping, tol, target_error, alpha, reduction
        As in :func:`dask_rpm.fit`.
    callbacks : sequence, optional
        Epoch rules such as :class:`dask_rpm.convergence.ConvergenceRule`: the same objects
        :func:`dask_rpm.fit` takes in ``callbacks=``, called at the end of every epoch.
    options : TrainingOptions, optional
        The training options as one record (:class:`dask_rpm.options.TrainingOptions`); the
        keywords above set its fields, each given once.

    Returns
    -------
    W, V : numpy.ndarray
        Final weights as planned: with ``bias=True`` ``W`` has the hidden
        biases as its last column and the bias unit as its last row, ``V``
        the output biases as its last column (:class:`dask_rpm.network.Network`).
    err : numpy.ndarray
        Loss of each iteration's forward pass (before that iteration's update).
    """
    # the keywords map one to one onto the fields of the options record
    given = {k: v for k, v in locals().items() if k in TRAINING_FIELDS}
    job = prepare(x, d, TrainingOptions.of(options, **given), load=True)
    assert job.arrays is not None
    for rule in callbacks or ():
        if not hasattr(rule, "end_epoch"):
            raise DataError(
                f"callbacks: {type(rule).__name__} has no end_epoch; fit_serial takes epoch rules "
                f"such as dask_rpm.convergence.ConvergenceRule"
            )
    x_train, d_train = job.arrays
    out = train_arrays(
        job.recipe.net.augment(x_train),
        d_train,
        job.W0,
        job.V0,
        job.recipe,
        job.validator(),
        job.target_error,
        rules=list(callbacks or ()),
    )
    if full_output:
        out["recipe"] = job.recipe
        out["classes"] = job.classes
        return out
    return out["W"], out["V"], out["errors"]
