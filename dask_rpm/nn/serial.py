"""The serial reference: one process, the same kernels, the same recipe as the distributed engine.

Every distributed run must equal :func:`fit_serial` (float64, relative
1e-10) for every plan, through remaps, worker loss and resume.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..records import Validation
from . import backend as xbk
from . import sparse
from .backend import Backend
from .chunked import is_chunked, serial_inputs
from .cnn_kernels import check_backend
from .convergence import epoch_error
from .data import DataError
from .kernels import all_finite
from .layers import layers_of_params
from .optim import penalty, step
from .options import TRAINING_FIELDS, TrainingOptions
from .prepare import prepare
from .recipe import Recipe, Validator, forward
from .workspaces import whole_workspace

__all__ = ["fit_serial", "train_arrays", "SerialResult"]


def train_arrays(
    x: np.ndarray,
    d: np.ndarray,
    params0: Sequence[np.ndarray],
    rec: Recipe,
    validator: Validator | None = None,
    target_error: float | None = None,
    rules: Sequence[Any] = (),
    opt_state: dict[str, list[np.ndarray]] | None = None,
    backend: Backend | None = None,
) -> SerialResult:
    """Train on prepared arrays (``x`` with the bias input already appended when the recipe has bias).

    ``params0`` are the initial parameters ``W_1 .. W_L, V`` (augmented, as planned:
    :mod:`dask_rpm.nn.layers`); ``rules`` end-of-epoch rules
    (:class:`dask_rpm.nn.convergence.ConvergenceRule`); ``opt_state`` the optimizer state to
    start from (default zeros); ``backend`` where the arrays live while training (default numpy:
    :mod:`~dask_rpm.nn.backend`; the results are numpy arrays whatever it is). A CNN's geometry is the
    recipe's (:attr:`~dask_rpm.nn.recipe.Recipe.layers`).

    Returns a :class:`SerialResult` (``classes`` None: the caller knows its labels).
    """
    sched, net, opt = rec.schedule, rec.net, rec.optimizer
    be = backend or xbk.NUMPY
    params = [be.copy_of(p) for p in params0]
    layers = layers_of_params(params) if rec.layers is None else rec.layers
    state = (
        {k: [be.copy_of(a) for a in v] for k, v in opt_state.items()}
        if opt_state
        else {slot: [be.ns.zeros_like(p) for p in params] for slot in opt.slots}
    )
    biases = layers.bias_columns((0, layers.m), net.bias)
    lr = rec.learning_rate
    ws = whole_workspace(
        min(sched.batch, x.shape[0]),
        params,
        net,
        rec.loss_scale(layers.l),  # (d's width: the outputs, and a weight column when weighted)
        backend=be,
        layers=rec.layers,
    )
    x, d = sparse.placed(be, x), be.asarray(d)

    def host() -> list[np.ndarray]:  # what validation and the epoch rules read
        return [xbk.to_host(p) for p in params]

    errors = np.empty(rec.iterations)
    stopped = None
    batches = _Batches(x, d, sched, be)
    done = 0
    # whether the weights are finite, and their sum W^2 (NaN: not known): each step tells both
    finite, squares = all(all_finite(p) for p in params), math.nan
    mean = bool(rec.alpha) or rec.reduction == "mean"
    for k in range(rec.iterations):
        xb, db = batches.batch(k)
        u = ws.forward(xb, params)
        delta2, errors[k] = ws.output_delta(u, db)
        if rec.alpha:
            if math.isnan(squares):
                squares = penalty(params, biases)
            errors[k] += 0.5 * rec.alpha * squares
        if not (np.isfinite(errors[k]) and finite):
            stopped = f"training diverged at iteration {k}"
            break
        grads = ws.backward(xb, params, delta2)
        finite, squares = step(
            opt,
            lr,
            k + 1,
            params,
            grads,
            state,
            batch=rec.divisor(k) if mean else None,
            alpha=rec.alpha,
            biases=biases,
            sum_squares=bool(rec.alpha),
        )
        done = k + 1
        lr, stopped = _after_step(rec, errors, done, lr, target_error, validator, rules, host)
        if stopped:
            break
    if be.name != "numpy":  # host copies: what the caller gets whatever trained
        params = [xbk.host_copy(p) for p in params]
        state = {k: [xbk.host_copy(a) for a in v] for k, v in state.items()}
    return SerialResult(
        params=params,
        errors=errors[: done if stopped else rec.iterations],
        stopped=stopped,
        validation=[] if validator is None else list(validator.rows),
        optimizer_state=state,
        iterations=done,
        recipe=rec,
    )


class _Batches:
    """Each iteration's mini-batch of the prepared samples, in the schedule's order.

    Dense numpy samples: each batch's rows are gathered into two batch-sized buffers (no
    epoch-sized copy, whose every page faults, and the batch is in the cache for its products,
    as scikit-learn's); other samples (sparse, another backend): each epoch's samples are
    gathered once in its order and the batches are slices of those.
    """

    def __init__(self, x: Any, d: Any, sched: Any, be: Backend) -> None:
        self.x, self.d, self.sched, self.be = x, d, sched, be
        self.order_epoch = -1  # the first mini-batch gathers epoch 0
        self.order: Any = None
        self.x_e: Any = None  # the epoch's samples in its order (mini-batches)
        self.d_e: Any = None
        self.rows = isinstance(x, np.ndarray) and isinstance(d, np.ndarray) and not sched.full_batch
        if self.rows:
            size = min(sched.batch, x.shape[0])
            self.x_b = np.empty((size, *x.shape[1:]), x.dtype)
            self.d_b = np.empty((size, *d.shape[1:]), d.dtype)

    def batch(self, k: int) -> tuple[Any, Any]:
        """Iteration ``k``'s samples and targets (full batch: all of them)."""
        sched, x, d = self.sched, self.x, self.d
        if sched.full_batch:
            return x, d
        e = sched.epoch(k)
        if e != self.order_epoch:  # the epoch's order (and elsewhere its samples, gathered once)
            self.order_epoch, self.order = e, sched.order(e)
            if not self.rows:
                be = self.be
                self.x_e, self.d_e = x[be.asarray(self.order)], d[be.asarray(self.order)]
        lo, hi = sched.positions(k)
        if self.rows:  # (a permutation's positions: valid indices, no check)
            order = self.order
            xb = np.take(x, order[lo:hi], axis=0, out=self.x_b[: hi - lo], mode="clip")
            db = np.take(d, order[lo:hi], axis=0, out=self.d_b[: hi - lo], mode="clip")
            return xb, db
        return self.x_e[lo:hi], self.d_e[lo:hi]


def _after_step(
    rec: Recipe,
    errors: np.ndarray,
    done: int,
    lr: float,
    target_error: float | None,
    validator: Validator | None,
    rules: Sequence[Any],
    host: Any,
) -> tuple[float, str | None]:
    """The checks after step ``done``: the target error, validation where due, the epoch's
    rules at an epoch's end; the next learning rate, and a reason to stop (None: go on).
    ``host()`` gives the weights as numpy arrays, taken only where a check reads them."""
    k = done - 1
    if target_error is not None and errors[k] <= target_error:
        return lr, f"target error reached at iteration {k}"
    if validator is not None and validator.due(done):
        reason = validator.evaluate(done, host())
        if reason:
            return lr, reason
    per_epoch = rec.schedule.per_epoch
    if rules and done % per_epoch == 0:
        scaled = [errors[j] * rec.error_scale(j) for j in range(done - per_epoch, done)]
        return _end_epoch(rules, scaled, host(), lr)
    return lr, None


def _end_epoch(
    rules: Sequence[Any], errors: Sequence[float], params: Sequence[np.ndarray], lr: float
) -> tuple[float, str | None]:
    """Every rule's decision at an epoch's end: the next learning rate, and a reason to stop."""
    total = epoch_error(errors)
    stop = None
    for rule in rules:
        decision = rule.end_epoch(total, params) if rule.needs_weights else rule.end_epoch(total)
        lr = decision.learning_rate
        stop = stop or decision.stop
    return lr, stop


def fit_serial(
    x: Any,
    d: Any = None,
    *,
    hidden: int | Sequence[int] | None = None,
    iterations: int | None = None,
    learning_rate: float | None = None,
    init: Sequence[Any] | None = None,
    seed: int | None = None,
    dtype: str | None = None,
    epochs: int | None = None,
    batch_size: int | None = None,
    shuffle: bool | str | None = None,
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
    options: TrainingOptions | None = None,
    backend: str | None = None,
    device: str | None = None,
    network: Any = None,
    sample_weight: Any = None,
) -> SerialResult:
    """Serial BP: the reference every distributed run must equal.

    Takes the training keywords of :func:`dask_rpm.fit` (same meaning, same
    ``rpm.train.*`` defaults).

    Parameters
    ----------
    x, d : array_like or xarray.Dataset or path
        Inputs ``(s, n)`` and targets ``(s, l)``; with ``loss="cross-entropy"``
        ``d`` may be 1-D class labels.
    hidden : int or sequence of int
        Number of hidden units ``m``, or of each hidden layer (``(512, 256)``: two hidden
        layers); taken from ``init`` when given.
    iterations, epochs : int
        Number of iterations (mini-batch steps), or of epochs.
    learning_rate : float
        ``eps`` (the optimizer's step size on the summed gradient).
    init : (W0, V0) or (W_1, ..., W_L, V), optional
        Initial weights (data inputs and hidden units, without bias terms; biases as
        ``(W0, V0, b0, c0)`` or ``(weights, biases)``); default
        :func:`dask_rpm.nn.kernels.init_params` with ``seed``.
    seed, dtype, batch_size, shuffle, activation, loss, output, bias, optimizer, validation,
    validate_every, early_stopping, tol, target_error, alpha, reduction, sample_weight
        As in :func:`dask_rpm.fit`.
    callbacks : sequence, optional
        Epoch rules such as :class:`dask_rpm.nn.convergence.ConvergenceRule`: the same objects
        :func:`dask_rpm.fit` takes in ``callbacks=``, called at the end of every epoch.
    options : TrainingOptions, optional
        The training options as one record (:class:`dask_rpm.nn.options.TrainingOptions`); the
        keywords above set its fields, each given once.
    backend, device : str, optional
        Where it trains, as in :func:`dask_rpm.fit` (default ``rpm.engine.backend`` /
        ``rpm.engine.device``): ``backend="torch", device="cuda"`` is the serial reference on
        one GPU. The results are numpy arrays on every backend.
    network : torch.nn.Sequential or list of layer records, optional
        A convolutional network, as in :func:`dask_rpm.fit` (``x`` then holds images
        ``(samples, channels, height, width)``, or is the path of a netCDF file with
        ``x(sample, channel, height, width)`` and ``d(sample, output)``:
        :func:`dask_rpm.nn.data.write_dataset` writes one).

    Returns
    -------
    SerialResult
        The same for every depth: ``params`` (``W_1 .. W_L, V`` as planned), ``errors``,
        ``stopped``, ``validation``, ``optimizer_state``, ``iterations``, ``recipe``,
        ``classes``, and ``predict`` / ``score``, named as :class:`dask_rpm.FitResult`'s.
    """
    # the keywords map one to one onto the fields of the options record
    given = {k: v for k, v in locals().items() if k in TRAINING_FIELDS}
    be = xbk.resolve(backend, device)
    opts = TrainingOptions.of(options, **given)
    if is_chunked(x, d):  # Dask's data (dask_rpm.nn.chunked): the reference trains on them computed
        x, d, opts = serial_inputs(x, d, opts)  # shuffle="chunks": over their chunks
    job = prepare(x, d, opts, load=True)
    if job.recipe.layers is not None:  # a CNN: torch's or numpy's kernels only
        check_backend(be.name)
    assert job.arrays is not None
    for rule in callbacks or ():
        if not hasattr(rule, "end_epoch"):
            raise DataError(
                f"callbacks: {type(rule).__name__} has no end_epoch; fit_serial takes epoch rules "
                f"such as dask_rpm.nn.convergence.ConvergenceRule"
            )
    x_train, d_train = job.arrays
    out = train_arrays(
        job.recipe.net.augment(x_train),
        d_train,
        job.params0,
        job.recipe,
        job.validator(),
        job.target_error,
        rules=list(callbacks or ()),
        backend=be,
    )
    return replace(out, classes=job.classes)


@dataclass(frozen=True, eq=False)
class SerialResult:
    """What :func:`fit_serial` returns, whatever the depth; its fields are named as
    :class:`dask_rpm.FitResult`'s, so code reads either.

    :meth:`dask_rpm.MLPModel.from_result` makes it a model to save or export.

    Attributes
    ----------
    params : list of numpy.ndarray
        Final parameters ``W_1 .. W_L, V`` as planned (:mod:`dask_rpm.nn.layers`): with
        ``bias=True`` each ``W_k`` has its layer's biases as its last column and the bias unit
        as its last row, ``V`` the output biases as its last column
        (:class:`dask_rpm.nn.network.Network`).
    errors : numpy.ndarray
        Loss of each iteration's forward pass (before that iteration's update).
    stopped : str or None
        Why training stopped early (divergence, target error, early stopping, an epoch rule),
        else None.
    validation : list of (iteration, loss, accuracy)
        Validation-set evaluations.
    optimizer_state : dict
        The optimizer's state at the end, ``{slot: [one array per parameter]}``.
    iterations : int
        Iterations completed.
    recipe : dask_rpm.nn.recipe.Recipe
        Network, optimizer, mini-batch schedule, iterations and learning rate used.
    classes : numpy.ndarray or None
        Class labels when ``d`` was given as 1-D labels (cross-entropy).
    """

    params: list[np.ndarray]
    errors: np.ndarray
    stopped: str | None
    validation: list[Validation]
    optimizer_state: dict[str, list[np.ndarray]]
    iterations: int
    recipe: Recipe
    classes: Any = None

    @property
    def error(self) -> float:
        """The last iteration's loss (NaN when none completed)."""
        return float(self.errors[-1]) if self.errors.size else float("nan")

    def outputs(self, x: Any) -> np.ndarray:
        """The network's outputs for inputs ``x`` (a CNN's: images ``(samples, channels, height,
        width)``)."""
        xa, layers = np.asarray(x), self.recipe.layers
        if layers is not None and (xa.ndim != 4 or xa.shape[1:] != tuple(layers.image)):
            c, h, w = layers.image
            raise DataError(
                f"x has shape {xa.shape}; this CNN takes images (samples, {c}, {h}, {w}), as "
                f"it was trained on"
            )
        return forward(xa, self.params, self.recipe.net, layers)

    def predict(self, x: Any) -> np.ndarray:
        """Class labels (a classifier: labels given, or softmax outputs), else the outputs."""
        h = self.outputs(x)
        classes = self.classes
        if classes is None and self.recipe.net.output == "softmax":
            classes = np.arange(h.shape[1])
        if classes is None:
            return h
        k = (h[:, 0] > 0.5).astype(np.intp) if h.shape[1] == 1 else np.argmax(h, axis=1)
        return np.asarray(classes)[k]

    def score(self, x: Any, y: Any) -> float:
        """Accuracy (a classifier), or R^2 averaged over the outputs (regression)."""
        p, y = self.predict(x), np.asarray(y)
        if p.ndim == 1:
            return float(np.mean(p == y))
        y = y.reshape(p.shape).astype(np.float64)
        ss_res = ((y - p) ** 2).sum(axis=0)
        ss_tot = ((y - y.mean(axis=0)) ** 2).sum(axis=0)
        r2 = np.where(ss_tot > 0, 1.0 - ss_res / np.where(ss_tot > 0, ss_tot, 1.0), ss_res == 0)
        return float(np.mean(r2))
