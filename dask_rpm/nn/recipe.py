"""A training recipe: network, optimizer, mini-batches, validation and early stopping.

Pure (numpy only). :func:`recipe` turns the keywords that :func:`dask_rpm.fit`
and :func:`dask_rpm.fit_serial` share into one validated :class:`Recipe`
(``None`` reads ``rpm.train.*``), so the serial reference and the distributed
engine train by the same rules. :class:`Validator` decides, from validation
losses alone, when to stop early — the async loop and the serial loop both
just ask it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from ..records import Validation
from . import sparse
from .batches import BatchSchedule, schedule
from .errors import DataError
from .network import Network, network
from .optim import Optimizer, optimizer
from .options import TrainingOptions
from .workspaces import whole_workspace

__all__ = [
    "Recipe",
    "recipe",
    "SampleWeights",
    "RecipeError",
    "Validator",
    "holdout",
    "forward",
    "evaluate",
    "accuracy",
    "one_hot",
    "recipe_summary",
]


class RecipeError(DataError):
    """Invalid training options; the message says what is valid."""


class SampleWeights:
    """The training samples' weights, and each mini-batch's weight sum (what scikit-learn divides
    a weighted batch's gradient and loss by), computed once per epoch wherever it is asked.

    Every process sums the same weights of the same batch in the same order (numpy's sum of the
    batch's weights in batch order, scikit-learn's ``sample_weight.sum()``), so every worker and
    the serial loop divide by identical bits.

    Parameters
    ----------
    weights : numpy.ndarray
        One weight per training sample, in the run's dtype.
    """

    def __init__(self, weights: np.ndarray) -> None:
        self.weights = weights
        self._epoch: tuple[int, list[Any]] | None = None  # (epoch, its batches' sums)

    def __getstate__(self) -> dict[str, Any]:
        return {"weights": self.weights, "_epoch": None}  # each process sums its own

    def batch_sum(self, schedule: BatchSchedule, iteration: int) -> Any:
        """The weight sum of ``iteration``'s batch (a numpy scalar of the weights' dtype)."""
        e = schedule.epoch(iteration)
        cached = self._epoch
        if cached is None or cached[0] != e:
            order = schedule.order(e)
            first = e * schedule.per_epoch
            sums = []
            for it in range(first, first + schedule.per_epoch):
                lo, hi = schedule.positions(it)
                sums.append(self.weights[order[lo:hi]].sum())
            cached = self._epoch = (e, sums)
        return cached[1][iteration % schedule.per_epoch]


class Recipe(NamedTuple):
    """Everything that decides *what* is computed (not where)."""

    net: Network
    optimizer: Optimizer
    schedule: BatchSchedule
    iterations: int
    learning_rate: float
    validate_every: int | None
    patience: int | None
    tol: float
    #: L2 penalty ``0.5 alpha sum W^2`` on the weights (not the biases), part of every iteration's error
    alpha: float = 0.0
    #: "sum": the optimizer steps on the summed gradient (the paper's); "mean": on the gradient
    #: divided by the iteration's batch size (scikit-learn's; PyTorch's ``reduction="mean"``)
    reduction: str = "sum"
    #: a CNN's geometry (:class:`~dask_rpm.nn.cnn.ConvLayers`), the layers it computes; None: an
    #: MLP, whose sizes its parameters give
    layers: Any = None
    #: the training samples' weights (the network is then ``weighted``: its targets carry them);
    #: None: every sample weighs 1
    weights: SampleWeights | None = None

    def loss_scale(self, outputs: int) -> float:
        """Factor on the squared loss reported: with "mean", scikit-learn's per-sample mean over the
        ``outputs`` (its deltas stay ``h - d``, as scikit-learn's do); else 1."""
        if self.reduction == "mean" and self.net.loss == "squared" and outputs > 1:
            return 1.0 / outputs
        return 1.0

    def divisor(self, iteration: int) -> Any:
        """What the gradient of ``iteration`` is divided by: its batch size ("mean"; with sample
        weights the batch's weight sum, scikit-learn's), else 1."""
        if self.reduction != "mean":
            return 1
        if self.weights is not None:
            return self.weights.batch_sum(self.schedule, iteration)
        lo, hi = self.schedule.positions(iteration)
        return hi - lo

    def error_scale(self, iteration: int) -> float:
        """What ``iteration``'s error is multiplied by in its epoch's loss: with sample weights and
        "mean", its batch size over its weight sum (scikit-learn adds each batch's weighted mean
        loss times the batch size); else 1."""
        if self.weights is None or self.reduction != "mean":
            return 1.0
        lo, hi = self.schedule.positions(iteration)
        return (hi - lo) / float(self.weights.batch_sum(self.schedule, iteration))

    def validation_points(self) -> list[int]:
        """Iteration counts after which the validation set is evaluated."""
        if self.validate_every is None:
            return []
        return list(range(self.validate_every, self.iterations + 1, self.validate_every))


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise RecipeError(f"{name}={value!r}; it must be a positive integer")
    return int(value)


def recipe(
    samples: int,
    options: TrainingOptions | None = None,
    *,
    validation: bool = False,
    weights: np.ndarray | None = None,
) -> Recipe:
    """Validate and complete the training options (``None`` fields: ``rpm.train.*``, read by
    :meth:`~dask_rpm.nn.options.TrainingOptions.resolved`).

    ``samples`` is the number of training samples (after a validation split);
    ``validation`` says whether there is a validation set; ``weights`` are the training samples'
    weights (checked by :func:`dask_rpm.nn.prepare.prepare`), or None. ``epochs`` and
    ``iterations`` are alternatives; with ``epochs`` the run has
    ``epochs * ceil(samples / batch_size)`` iterations.
    """
    o: Any = (options or TrainingOptions()).resolved()  # every value is checked below
    iterations, epochs, lr, seed = o.iterations, o.epochs, o.learning_rate, int(o.seed)
    every, patience, tol = o.validate_every, o.early_stopping, float(o.tol)
    alpha, reduction = o.alpha, o.reduction
    sched = schedule(samples, o.batch_size, shuffle=o.shuffle, seed=seed)
    net = network(o.activation, o.loss, o.output, o.bias, weights is not None)
    opt = optimizer(o.optimizer)
    if epochs is not None and iterations is not None:
        raise RecipeError(
            f"both iterations={iterations!r} and epochs={epochs!r} given; give one of them"
        )
    if epochs is not None:
        iterations = _positive_int("epochs", epochs) * sched.per_epoch
    iterations = _positive_int("iterations", iterations)
    try:
        lr = float(lr)
    except (TypeError, ValueError):
        raise RecipeError(f"learning_rate={lr!r}; it must be a finite number > 0") from None
    if not (math.isfinite(lr) and lr > 0):
        raise RecipeError(f"learning_rate={lr!r}; it must be a finite number > 0")
    if not validation:
        if options is not None and options.early_stopping is not None:
            raise RecipeError(
                f"early_stopping={options.early_stopping!r} needs validation data: pass validation= "
                f"(a fraction such as 0.1, or (x_val, d_val))"
            )
        every, patience = None, None
    else:
        # auto: once an epoch with mini-batches; every 10 full-batch iterations
        every = (
            (sched.per_epoch if not sched.full_batch else 10)
            if every in (None, "auto")
            else _positive_int("validate_every", every)
        )
        patience = None if patience is None else _positive_int("early_stopping", patience)
    if not (math.isfinite(tol) and tol >= 0):
        raise RecipeError(f"tol={tol!r}; it must be a finite number >= 0")
    try:
        alpha = float(alpha)
    except (TypeError, ValueError):
        raise RecipeError(
            f"alpha={alpha!r}; it must be a finite number >= 0 (0: no penalty)"
        ) from None
    if not (math.isfinite(alpha) and alpha >= 0):
        raise RecipeError(f"alpha={alpha!r}; it must be a finite number >= 0 (0: no penalty)")
    if reduction not in ("sum", "mean"):
        raise RecipeError(
            f"reduction={reduction!r}; valid: 'sum' (step on the summed gradient, the paper's) or "
            f"'mean' (on the batch mean, scikit-learn's)"
        )
    return Recipe(
        net,
        opt,
        sched,
        iterations,
        lr,
        every,
        patience,
        tol,
        alpha,
        str(reduction),
        weights=None if weights is None else SampleWeights(weights),
    )


def holdout(samples: int, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Sorted ``(train, validation)`` sample indices: a seeded random ``fraction`` held out."""
    if not (isinstance(fraction, float) and 0.0 < fraction < 1.0):
        raise RecipeError(
            f"validation={fraction!r}; give a fraction in (0, 1) to hold out, or (x_val, d_val)"
        )
    k = int(round(fraction * samples))
    if k < 1 or k >= samples:
        raise RecipeError(
            f"validation={fraction} of {samples} samples holds out {k}; at least 1 sample must be "
            f"held out and at least 1 left to train on"
        )
    perm = np.random.default_rng((seed, 104729)).permutation(samples)
    return np.sort(perm[k:]), np.sort(perm[:k])


def one_hot(
    labels: Any, classes: Sequence[Any] | np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """``(one_hot, classes)`` of 1-D labels; ``classes`` sorted unique labels unless given."""
    y = np.asarray(labels)
    if y.ndim != 1:
        raise RecipeError(f"labels must be 1-D; got shape {y.shape}")
    cls = np.unique(y) if classes is None else np.asarray(classes)
    pos = np.searchsorted(cls, y)
    pos = np.clip(pos, 0, len(cls) - 1)
    if not np.all(cls[pos] == y):
        bad = y[cls[pos] != y][0]
        raise RecipeError(f"label {bad!r} is not one of the classes {list(cls)}")
    out = np.zeros((y.size, len(cls)))
    out[np.arange(y.size), pos] = 1.0
    return out, cls


def _rows(x: Any, params: Sequence[np.ndarray], net: Network, layers: Any) -> np.ndarray:
    """Samples as the kernels take them: rows, images flattened, the bias input appended (sparse
    ``x`` as CSR: :mod:`~dask_rpm.nn.sparse`)."""
    if sparse.issparse(x):
        return net.augment(sparse.as_csr(x, params[0].dtype))
    xa = np.ascontiguousarray(x, dtype=params[0].dtype)
    if layers is not None:
        return xa.reshape(xa.shape[0], -1)
    return net.augment(xa)


def forward(
    x: np.ndarray, params: Sequence[np.ndarray], net: Network, layers: Any = None
) -> np.ndarray:
    """Network outputs ``h`` for inputs ``x`` (data inputs; augmented parameters ``W_1 .. V``;
    ``layers`` a CNN's geometry, None for an MLP)."""
    xa = _rows(x, params, net, layers)
    ws = whole_workspace(xa.shape[0], params, net, layers=layers)
    return ws.outputs(ws.forward(xa, params))


def evaluate(
    x: np.ndarray, d: np.ndarray, params: Sequence[np.ndarray], net: Network, layers: Any = None
) -> tuple[np.ndarray, float]:
    """Outputs ``h`` and the summed loss of the network on ``x`` against ``d``, by the kernels that
    train it (:class:`~dask_rpm.nn.kernels.Workspace`: one loss in the package)."""
    xa = _rows(x, params, net, layers)
    ws = whole_workspace(xa.shape[0], params, net, layers=layers)
    u = ws.forward(xa, params)
    h = ws.outputs(u)
    _, err = ws.output_delta(u, np.ascontiguousarray(d, dtype=params[0].dtype))
    return h, err


def accuracy(h: np.ndarray, d: np.ndarray) -> float:
    """Fraction of samples whose largest output is the target's (one output: both sides of 0.5)."""
    if h.shape[1] == 1:
        return float(np.mean((h[:, 0] > 0.5) == (d[:, 0] > 0.5)))
    return float(np.mean(np.argmax(h, axis=1) == np.argmax(d, axis=1)))


class Validator:
    """Validation losses in, "stop now?" out (pure; the same rule in serial and distributed runs).

    Stops after ``patience`` evaluations in a row that did not improve the
    best validation loss by more than ``tol`` (relative).
    """

    def __init__(self, recipe: Recipe, x: np.ndarray, d: np.ndarray) -> None:
        self.recipe, self.x, self.d = recipe, x, d
        self.points = recipe.validation_points()
        self.rows: list[Validation] = []
        self.best = math.inf
        self.bad = 0

    def due(self, done: int) -> bool:
        return done in self.points

    def next_point(self, done: int) -> int | None:
        """Iterations until the next evaluation (for block boundaries), or None."""
        later = [p for p in self.points if p > done]
        return later[0] - done if later else None

    def evaluate(self, done: int, params: Sequence[np.ndarray]) -> str | None:
        """Record the validation loss after ``done`` iterations; a reason to stop, or None."""
        h, val = evaluate(self.x, self.d, params, self.recipe.net, self.recipe.layers)
        # (a weighted network's targets carry the weights as their last column)
        d = self.d[:, :-1] if self.recipe.net.weighted else self.d
        acc = accuracy(h, d) if self.recipe.net.output in ("sigmoid", "softmax") else float("nan")
        self.rows.append(Validation(done, val, acc))
        if val < self.best * (1.0 - self.recipe.tol) or not math.isfinite(self.best):
            self.best, self.bad = val, 0
        else:
            self.bad += 1
        if self.recipe.patience is not None and self.bad >= self.recipe.patience:
            return (
                f"early stopping after iteration {done}: validation loss has not improved for "
                f"{self.bad} evaluation(s) (best {self.best:.6g})"
            )
        return None


def recipe_summary(rec: Any) -> dict[str, Any]:
    """The hyperparameters of a :class:`dask_rpm.nn.recipe.Recipe` as a JSON-ready dict."""
    sched = rec.schedule
    return {
        "activation": rec.net.activation,
        "loss": rec.net.loss,
        "output": rec.net.output,
        "bias": rec.net.bias,
        "optimizer": rec.optimizer._asdict(),
        "learning_rate": float(rec.learning_rate),
        "iterations": int(rec.iterations),
        "batch_size": sched.batch_size,
        "shuffle": bool(sched.shuffle),
        "seed": int(sched.seed),
        "samples": int(sched.samples),
        "validate_every": rec.validate_every,
        "early_stopping": rec.patience,
        "tol": float(rec.tol),
        "alpha": float(rec.alpha),
        "reduction": rec.reduction,
    }
