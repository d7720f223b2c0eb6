"""scikit-learn estimators: :class:`MLPClassifier` and :class:`MLPRegressor`.

They follow scikit-learn's conventions (``get_params``/``set_params``,
``clone``, ``fit(X, y)`` returning ``self``, fitted attributes ending in
``_``) and, like dask-ml's and xgboost.dask's estimators, take a ``client``:
with a Dask client they train with :func:`dask_rpm.fit` on its workers; with
``client=None`` on the current default client if there is one, else with the
serial reference :func:`dask_rpm.fit_serial` in this process. Because every
distributed run equals the serial reference (float64, relative 1e-10), the
choice changes how fast a model trains, not which model comes out.

Needs scikit-learn (the optional extra ``sklearn``).

Defaults
--------
Every hyperparameter defaults to ``None``, resolved when ``fit`` runs: first
``rpm.estimator.*``, then ``rpm.train.*`` (``docs/configuration.md``). The
estimator section differs from the paper's training defaults where a user of
scikit-learn expects it to: 100 hidden units, mini-batches of 200, Adam with
learning rate 1e-3, 200 epochs, and **bias terms on** - the paper's network
has no biases (``rpm.train.bias: false``), but a classifier or regressor
without intercepts can only model functions through the origin of its
(unscaled) inputs, and every scikit-learn model fits an intercept.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

try:
    from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin
    from sklearn.utils.multiclass import check_classification_targets
    from sklearn.utils.validation import check_is_fitted, column_or_1d, validate_data
except ImportError as exc:  # pragma: no cover - exercised only without scikit-learn
    raise ImportError(
        "dask_rpm.MLPClassifier and MLPRegressor need scikit-learn: pip install 'dask-rpm[sklearn]'"
    ) from exc

from . import config
from .model import MLPModel
from .recipe import RecipeError, holdout, one_hot
from .serial import fit_serial

__all__ = ["MLPClassifier", "MLPRegressor", "EstimatorError"]


class EstimatorError(ValueError):
    """Invalid estimator input (data or hyperparameters); the message says what is valid."""


#: hyperparameter -> rpm.estimator key (None values there fall through to rpm.train.*)
_ESTIMATOR_KEYS = {
    "hidden_units": "hidden-units",
    "activation": "activation",
    "optimizer": "optimizer",
    "learning_rate": "learning-rate",
    "batch_size": "batch-size",
    "epochs": "epochs",
    "bias": "bias",
    "validation_fraction": "validation-fraction",
}


class _MLPBase(BaseEstimator):
    """Shared hyperparameters and training of both estimators."""

    _loss: str = "squared"
    _output: str = "linear"

    def __init__(
        self,
        hidden_units: int | None = None,
        *,
        activation: str | None = None,
        optimizer: Any = None,
        learning_rate: float | None = None,
        batch_size: int | None = None,
        epochs: int | None = None,
        iterations: int | None = None,
        bias: bool | None = None,
        shuffle: bool | None = None,
        validation_fraction: float | None = None,
        early_stopping: int | None = None,
        validate_every: int | None = None,
        tol: float | None = None,
        seed: int | None = None,
        dtype: str | None = None,
        client: Any = None,
        mapping: Any = None,
        abilities: Any = None,
        progress: Any = None,
    ) -> None:
        self.hidden_units = hidden_units
        self.activation = activation
        self.optimizer = optimizer
        self.learning_rate = learning_rate
        self.batch_size = batch_size
        self.epochs = epochs
        self.iterations = iterations
        self.bias = bias
        self.shuffle = shuffle
        self.validation_fraction = validation_fraction
        self.early_stopping = early_stopping
        self.validate_every = validate_every
        self.tol = tol
        self.seed = seed
        self.dtype = dtype
        self.client = client
        self.mapping = mapping
        self.abilities = abilities
        self.progress = progress

    # ------------------------------------------------------------- settings
    def _setting(self, name: str) -> Any:
        """The hyperparameter, else ``rpm.estimator.<key>``, else None (-> ``rpm.train.*`` downstream)."""
        import dask.config

        value = getattr(self, name)
        if value is None and name in _ESTIMATOR_KEYS:
            value = dask.config.get(f"rpm.estimator.{_ESTIMATOR_KEYS[name]}", None)
        return value

    def _training_options(self, samples: int) -> dict[str, Any]:
        hidden = self._setting("hidden_units")
        if isinstance(hidden, bool) or not isinstance(hidden, (int, np.integer)) or hidden < 1:
            raise EstimatorError(f"hidden_units={hidden!r}; give a positive integer")
        epochs, iterations = self._setting("epochs"), self.iterations
        if iterations is not None and self.epochs is None:
            epochs = None  # an explicit iteration count replaces the configured epochs
        batch = self._setting("batch_size")
        seed = int(config.get("train.seed", self.seed))
        return dict(
            hidden=int(hidden),
            epochs=epochs,
            iterations=iterations,
            learning_rate=self._setting("learning_rate"),
            seed=seed,
            dtype=self.dtype,
            batch_size=batch,
            shuffle=self.shuffle,
            activation=self._setting("activation"),
            loss=self._loss,
            output=self._output,
            bias=self._setting("bias"),
            optimizer=self._setting("optimizer"),
            validate_every=self.validate_every,
            early_stopping=self.early_stopping,
            tol=self.tol,
        )

    def _split(self, X: np.ndarray, D: np.ndarray, seed: int) -> tuple[Any, Any, Any]:
        """Training and held-out samples: a validation split when ``validation_fraction`` or
        ``early_stopping`` asks for one (the seeded split of :func:`dask_rpm.recipe.holdout`)."""
        fraction = self.validation_fraction
        if fraction is None and self.early_stopping is not None:
            fraction = self._setting("validation_fraction")
        if fraction is None:
            return X, D, None
        try:
            train, val = holdout(
                len(X), float(fraction) if not isinstance(fraction, bool) else fraction, seed
            )
        except (TypeError, ValueError, RecipeError) as exc:
            raise EstimatorError(f"validation_fraction: {exc}") from None
        return X[train], D[train], (X[val], D[val])

    def _check_X_y(self, X: Any, y: Any, **kw: Any) -> tuple[np.ndarray, np.ndarray]:
        # scikit-learn's own checks and messages: 2-D, numeric, finite, dense, >= 2 samples and 1 feature;
        # sets n_features_in_ (and feature_names_in_ for DataFrames)
        return validate_data(self, X, y, dtype=np.float64, ensure_min_samples=2, **kw)

    def _train(
        self,
        X: np.ndarray,
        D: np.ndarray,
        classes: Any = None,
        *,
        target_shift: Any = None,
        target_scale: Any = None,
    ) -> MLPModel:
        opts = self._training_options(len(X))
        Xt, Dt, val = self._split(X, D, opts["seed"])
        opts["validation"] = val
        client = self._client()
        if client is None:
            result: Any = fit_serial(Xt, Dt, full_output=True, **opts)
            stopped = result["stopped"]
        else:
            from .engine import fit  # only with a client: the serial path needs no distributed

            result = fit(
                Xt,
                Dt,
                client=client,
                mapping=self.mapping,
                abilities=self.abilities,
                progress=self.progress,
                **opts,
            )
            stopped = result.stopped
        if stopped and "diverged" in stopped:
            raise EstimatorError(
                f"{stopped}; lower learning_rate (now {opts['learning_rate']!r}, or the "
                f"configured default) or standardize X"
            )
        model = MLPModel.from_result(
            result, classes=classes, target_shift=target_shift, target_scale=target_scale
        )
        rows = model.meta["validation"]
        self.result_ = result
        self.model_ = model
        self.loss_curve_ = list(model.meta["loss_curve"] or [])
        self.n_iter_ = len(self.loss_curve_)
        self.validation_loss_ = [float(r[1]) for r in rows]
        self.validation_scores_ = self._validation_scores(rows, val)
        self.stopped_ = stopped
        return model

    def _client(self) -> Any:
        if self.client is not None:
            return self.client
        try:
            from distributed import default_client
        except ImportError:  # pragma: no cover - distributed is a dependency
            return None
        try:
            return default_client()
        except ValueError:  # no client in this process: train with the serial reference
            return None

    def _validation_scores(self, rows: list, val: Any) -> list[float]:
        return [float(r[2]) for r in rows]

    # ------------------------------------------------------------- fitted
    def _check_predict_X(self, X: Any) -> np.ndarray:
        check_is_fitted(self, "model_")
        # the same checks as in fit, and the feature count fit saw
        return validate_data(self, X, reset=False, dtype=self.model_.W.dtype)

    def save(self, path: Any) -> str:
        """Write the fitted model (:meth:`dask_rpm.MLPModel.save`); :meth:`dask_rpm.MLPModel.load` reads it."""
        check_is_fitted(self, "model_")
        return self.model_.save(path)


class MLPClassifier(ClassifierMixin, _MLPBase):
    """A 3-layer perceptron classifier trained by dask_rpm (softmax outputs, cross-entropy loss).

    Parameters
    ----------
    hidden_units : int, default ``rpm.estimator.hidden-units`` (100)
    activation : {"sigmoid", "tanh", "relu"}, default ``rpm.train.activation``
    optimizer : str or dict, default ``rpm.estimator.optimizer`` (adam)
        ``"sgd"``, ``"momentum"``, ``"adam"`` or ``{"name": ..., "beta1": ...}``
        (PyTorch's conventions on the summed gradient).
    learning_rate : float, default ``rpm.estimator.learning-rate`` (0.001)
    batch_size : int, default ``rpm.estimator.batch-size`` (200)
        Samples per mini-batch (the whole set when it has fewer).
    epochs, iterations : int
        Training length: epochs (default ``rpm.estimator.epochs``, 200), or
        iterations (mini-batch steps) instead.
    bias : bool, default ``rpm.estimator.bias`` (True; the module docstring says why)
    shuffle : bool, default ``rpm.train.shuffle``
    validation_fraction : float, optional
        Hold out this fraction of the samples (seeded) and evaluate on it;
        with ``early_stopping`` and no fraction, ``rpm.estimator.validation-fraction``.
    early_stopping : int, optional
        Stop after this many evaluations without validation-loss improvement
        by more than ``tol`` (relative).
    validate_every, tol
        As in :func:`dask_rpm.fit`.
    seed, dtype
        Initial weights, shuffling and split; float64 (exact) or float32.
    client : distributed.Client, optional
        Train on this cluster; None: the default client if any, else serially.
    mapping, abilities, progress
        As in :func:`dask_rpm.fit` (ignored when training serially).

    Attributes
    ----------
    classes_ : numpy.ndarray
        Class labels, in output order.
    model_ : MLPModel
        The trained network (predict, save, to_torch).
    result_ : FitResult or dict
        What :func:`dask_rpm.fit` (or ``fit_serial(..., full_output=True)``) returned.
    n_iter_ : int
        Iterations (mini-batch steps) trained.
    loss_curve_ : list of float
        Summed training loss of each iteration's batch, before its update.
    validation_scores_ : list of float
        Held-out accuracy at each evaluation (empty without validation).
    validation_loss_ : list of float
        Held-out summed cross-entropy at each evaluation.
    n_features_in_ : int
    """

    _loss = "cross-entropy"
    _output = "softmax"

    def fit(self, X: Any, y: Any) -> MLPClassifier:
        """Train on samples ``X (s, n)`` and labels ``y (s,)`` (any sortable labels); returns self."""
        X, y = self._check_X_y(X, y)
        y = column_or_1d(y, warn=True)
        check_classification_targets(y)
        classes = np.unique(y)
        if len(classes) < 2:
            raise EstimatorError(
                f"y has only one class ({classes[0]!r}); a classifier needs at least 2"
            )
        D, classes = one_hot(y, classes)
        self.classes_ = classes
        self._train(X, D, classes)
        return self

    def predict(self, X: Any) -> np.ndarray:
        """Class labels ``(samples,)``."""
        X = self._check_predict_X(X)
        return self.model_.predict(X)

    def predict_proba(self, X: Any) -> np.ndarray:
        """Class probabilities ``(samples, classes)``, columns in the order of ``classes_``."""
        X = self._check_predict_X(X)
        return self.model_.predict_proba(X)

    def predict_log_proba(self, X: Any) -> np.ndarray:
        """Logarithms of :meth:`predict_proba`."""
        with np.errstate(divide="ignore"):
            return np.log(self.predict_proba(X))

    def decision_function(self, X: Any) -> np.ndarray:
        """Logits ``(samples, classes)``: the output pre-activations before the softmax; for two classes
        (scikit-learn's convention) ``(samples,)``, the second logit minus the first (> 0: ``classes_[1]``)."""
        X = self._check_predict_X(X)
        u = self.model_.decision_function(X)
        return u[:, 1] - u[:, 0] if u.shape[1] == 2 else u

    def score(self, X: Any, y: Any, sample_weight: Any = None) -> float:
        """Mean accuracy on ``X, y``."""
        if sample_weight is not None:
            return super().score(X, y, sample_weight=sample_weight)
        X = self._check_predict_X(X)
        return self.model_.score(X, y)


class MLPRegressor(RegressorMixin, _MLPBase):
    """A 3-layer perceptron regressor trained by dask_rpm (linear outputs, squared error).

    The targets are standardized for training (per output: minus the mean,
    divided by the standard deviation of the training part) and predictions
    are mapped back, so the learning rate and the initial weights suit any
    target scale; the fitted ``model_`` holds the mapping (``target_shift``,
    ``target_scale``) and applies it in ``predict``, also after saving and
    loading. Inputs are used as given: standardize them (e.g. scikit-learn's
    ``StandardScaler`` in a pipeline), as for any MLP.

    Parameters and attributes are those of :class:`MLPClassifier` (without
    ``classes_``), except:

    Attributes
    ----------
    validation_scores_ : list of float
        Held-out R^2 at each evaluation: ``1 - SS_res / SS_tot`` summed over
        the outputs (exactly scikit-learn's R^2 for one output).
    validation_loss_ : list of float
        Held-out loss ``0.5 sum (h - d)^2`` in standardized target units.
    """

    _loss = "squared"
    _output = "linear"

    def __sklearn_tags__(self) -> Any:
        tags = super().__sklearn_tags__()
        tags.target_tags.multi_output = True  # y may be (samples, outputs): one output unit each
        return tags

    def fit(self, X: Any, y: Any) -> MLPRegressor:
        """Train on samples ``X (s, n)`` and targets ``y (s,)`` or ``(s, outputs)``; returns self."""
        X, y = self._check_X_y(X, y, multi_output=True, y_numeric=True)
        self._y_1d = y.ndim == 1
        D = y.reshape(-1, 1) if y.ndim == 1 else y
        D = D.astype(np.float64)
        # the scaling is taken from the training part only (the held-out part stays unseen)
        seed = self._training_options(len(X))["seed"]
        Dt = self._split(X, D, seed)[1]
        shift = Dt.mean(axis=0)
        scale = Dt.std(axis=0)
        scale[~(scale > 0)] = 1.0  # a constant target: no scaling
        self._train(X, (D - shift) / scale, target_shift=shift, target_scale=scale)
        return self

    def _validation_scores(self, rows: list, val: Any) -> list[float]:
        if not rows or val is None:
            return []
        dv = val[1]
        ss_tot = float(((dv - dv.mean(axis=0)) ** 2).sum())
        if ss_tot <= 0:
            return [math.nan for _ in rows]
        return [1.0 - 2.0 * float(r[1]) / ss_tot for r in rows]

    def predict(self, X: Any) -> np.ndarray:
        """Predicted targets, ``(samples,)`` when fitted on 1-D ``y``, else ``(samples, outputs)``."""
        X = self._check_predict_X(X)
        p = self.model_.predict(X)
        return p[:, 0] if getattr(self, "_y_1d", False) else p

    def score(self, X: Any, y: Any, sample_weight: Any = None) -> float:
        """R^2 (coefficient of determination, averaged uniformly over outputs)."""
        if sample_weight is not None:
            return super().score(X, y, sample_weight=sample_weight)
        X = self._check_predict_X(X)
        return self.model_.score(X, y)
