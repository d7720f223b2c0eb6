"""scikit-learn estimators: :class:`MLPClassifier` and :class:`MLPRegressor`, drop-ins for scikit-learn's.

Same parameters, defaults and meaning as ``sklearn.neural_network``'s
``MLPClassifier`` / ``MLPRegressor`` (solvers ``lbfgs``, ``sgd`` and ``adam``),
the same fitted attributes, and **the same model**: with the same
parameters and ``random_state`` the fitted ``coefs_`` and ``intercepts_``
equal scikit-learn's to rounding (float64), trained serially or on any Dask
cluster and plan. What makes them equal:

* initial weights drawn from ``check_random_state(random_state)`` in
  scikit-learn's order and bounds, every layer's coefficients then its
  intercepts (Glorot uniform; ``factor`` 2 for logistic);
* the early-stopping split by ``train_test_split`` from the same generator
  (stratified for single-output classifiers), then scikit-learn's cumulative
  per-epoch shuffles from what is left of it (:mod:`dask_rpm.nn.batches`);
* ``solver="lbfgs"`` is scipy's L-BFGS-B on the client with scikit-learn's options and
  packing, minimising the mean loss plus ``0.5 alpha sum W^2 / samples``, evaluated on the
  cluster by rectangles (:mod:`dask_rpm.estimators.lbfgs`);
* each iteration's gradient is the batch mean plus ``alpha W / batch``
  (``reduction="mean"``, :mod:`dask_rpm.nn.optim`), stepped by scikit-learn's
  Adam or SGD arithmetic (``convention="scikit-learn"``);
* the epoch loss, ``tol`` / ``n_iter_no_change`` stopping, early stopping on
  the validation score and the ``invscaling`` / ``adaptive`` learning rates
  are :class:`dask_rpm.nn.convergence.ConvergenceRule`, run at epoch ends by
  the serial loop and by the engine alike.

Like xgboost.dask's and dask-ml's estimators they take a ``client``: with
one (or a default client in this process) they train with
:func:`dask_rpm.fit` on its workers, else serially in this process. The
client is not pickled: an unpickled estimator (e.g. in ``GridSearchCV``'s
worker processes) finds the default client again, or trains serially, which
gives the same model.

Any depth: ``hidden_layer_sizes=(100, 50)`` trains two hidden layers, and
``coefs_`` / ``intercepts_`` hold one array per layer in scikit-learn's
shapes (``(fan_in, fan_out)``).

The parameters are scikit-learn's and dask_rpm's own (``client``, ``mapping``,
``abilities``, ``progress``, ``backend``, ``device``), declared as scikit-learn
declares them (``_parameter_constraints``) and checked when ``fit`` starts: a bad
value is scikit-learn's ``InvalidParameterError`` (a ``ValueError``), with the
same message. ``fit`` and ``partial_fit`` take ``sample_weight``, carried through the loss, the
gradients the workers exchange and the validation split as scikit-learn's; ``X`` may be a
CSR / CSC matrix (its rows reach the workers sparse, :mod:`dask_rpm.nn.sparse`), and float32
``X`` trains in float32 end to end (kernels, exchanges, ``coefs_``).

Dask's own data, as dask-ml's wrappers take it (:mod:`dask_rpm.estimators.dask_data`): ``X`` and
``y`` may be dask arrays chunked along samples, dask DataFrames / Series, xarray objects backed
by dask with a ``sample`` dimension, or a zarr store (``fit(store)``: its ``x`` and ``d``). On a
cluster they stay there - the classes are found and the labels binarized on the workers, the
early-stopping split is taken by index, lbfgs evaluates its objective on the chunks - and the
model equals the one trained on the computed arrays; without one they are computed first.
``predict`` / ``predict_proba`` of Dask's ``X`` return a dask array (one task per chunk, the
fitted model held once in the graph) and ``score`` is reductions on the workers. Not yet on a
cluster: a dask ``sample_weight`` (computed and trained serially without one) and multi-label
dask ``y``.

:class:`CNNClassifier` (:mod:`dask_rpm.estimators.cnn`) is a convolutional network with the
same conventions, solvers and training rules.

Needs scikit-learn (the optional extra ``sklearn``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

try:
    from sklearn.base import ClassifierMixin, RegressorMixin, _fit_context
    from sklearn.metrics import accuracy_score, r2_score
    from sklearn.preprocessing import LabelBinarizer
    from sklearn.utils._param_validation import StrOptions
    from sklearn.utils.metaestimators import available_if
    from sklearn.utils.multiclass import (
        _check_partial_fit_first_call,
        check_classification_targets,
        type_of_target,
        unique_labels,
    )
    from sklearn.utils.validation import column_or_1d, validate_data
except ImportError as exc:  # pragma: no cover - exercised only without scikit-learn
    raise ImportError(
        "dask_rpm.MLPClassifier, MLPRegressor and CNNClassifier need scikit-learn: pip install "
        "'dask-rpm[sklearn]'"
    ) from exc

from ..nn.chunked import is_chunked
from ..nn.recipe import forward
from . import dask_data
from ._base import MLPBase
from .cnn import CNNClassifier
from .errors import EstimatorError

__all__ = ["MLPClassifier", "MLPRegressor", "CNNClassifier", "EstimatorError"]


_COMMON_DOC = """
    Parameters
    ----------
    hidden_layer_sizes, activation, solver, alpha, batch_size, learning_rate, learning_rate_init,
    power_t, max_iter, shuffle, random_state, tol, verbose, warm_start, momentum,
    nesterovs_momentum, early_stopping, validation_fraction, beta_1, beta_2, epsilon,
    n_iter_no_change, max_fun
        scikit-learn's, with its defaults and meaning (any number of hidden layers; solvers
        lbfgs, sgd and adam; ``partial_fit`` with sgd and adam only, as scikit-learn's).
    client : distributed.Client, optional
        Train on this cluster; None: the default client if any, else serially.
    mapping, abilities, progress
        As in :func:`dask_rpm.fit` (ignored when training serially).
    backend, device
        Where the kernels run, as in :func:`dask_rpm.fit` (serially too: ``backend="torch",
        device="cuda"`` trains on this process's GPU); the fitted ``coefs_`` are numpy arrays.

    Attributes
    ----------
    coefs_, intercepts_, loss_, loss_curve_, best_loss_, validation_scores_,
    best_validation_score_, n_iter_, t_, n_layers_, n_outputs_, out_activation_,
    n_features_in_, feature_names_in_
        scikit-learn's, with its meaning (``n_iter_`` counts epochs, or lbfgs's iterations; the
        losses are per-sample means with the L2 penalty; lbfgs, as scikit-learn's, sets no
        ``loss_curve_``, ``best_loss_`` or validation scores).
    model_ : MLPModel or None
        The trained network (save, load, to_torch); None for several hidden layers, which
        :class:`~dask_rpm.MLPModel` does not hold.
    result_ : FitResult, SerialResult or LbfgsResult
        What :func:`dask_rpm.fit` (or the serial loop, :class:`dask_rpm.nn.serial.SerialResult`)
        returned for the last fit; with lbfgs scipy's result and the count of evaluations
        (:class:`dask_rpm.estimators.lbfgs.LbfgsResult`).
"""


def _params_init(self: Any, **params: Any) -> None:
    for k, v in params.items():
        setattr(self, k, v)


class MLPClassifier(ClassifierMixin, MLPBase):
    __doc__ = (
        "A multi-layer perceptron classifier: scikit-learn's ``MLPClassifier``, trained by "
        "dask_rpm.\n" + _COMMON_DOC + "    classes_ : numpy.ndarray\n"
    )

    _loss_name = "cross-entropy"

    def __init__(
        self,
        hidden_layer_sizes: Any = (100,),
        activation: str = "relu",
        *,
        solver: str = "adam",
        alpha: float = 0.0001,
        batch_size: Any = "auto",
        learning_rate: str = "constant",
        learning_rate_init: float = 0.001,
        power_t: float = 0.5,
        max_iter: int = 200,
        shuffle: bool = True,
        random_state: Any = None,
        tol: float = 1e-4,
        verbose: bool = False,
        warm_start: bool = False,
        momentum: float = 0.9,
        nesterovs_momentum: bool = True,
        early_stopping: bool = False,
        validation_fraction: float = 0.1,
        beta_1: float = 0.9,
        beta_2: float = 0.999,
        epsilon: float = 1e-8,
        n_iter_no_change: int = 10,
        max_fun: int = 15000,
        client: Any = None,
        mapping: Any = None,
        abilities: Any = None,
        progress: Any = None,
        backend: str | None = None,
        device: str | None = None,
    ) -> None:
        _params_init(self, **{k: v for k, v in locals().items() if k not in ("self", "__class__")})

    @property
    def _output_name(self) -> str:
        return "softmax" if self.out_activation_ == "softmax" else "sigmoid"

    def __sklearn_tags__(self) -> Any:
        tags = super().__sklearn_tags__()
        tags.classifier_tags.multi_label = True  # indicator y: one logistic output per label
        return tags

    def _validate_input(
        self, X: Any, y: Any, incremental: bool, reset: bool
    ) -> tuple[Any, np.ndarray]:
        """scikit-learn's checks of ``X`` and the labels, the classes a warm start or a
        ``partial_fit`` may see, and the binarized targets in ``X``'s dtype."""
        X, y = validate_data(
            self,
            X,
            y,
            reset=reset,
            accept_sparse=["csr", "csc"],
            dtype=(np.float64, np.float32),
            multi_output=True,
        )
        if y.ndim == 2 and y.shape[1] == 1:
            y = column_or_1d(y, warn=True)
        check_classification_targets(y)
        self._fit_classes(y, lambda: unique_labels(y), incremental, reset)
        return X, self._label_binarizer.transform(y).astype(X.dtype)

    def _fit_classes(
        self, fit_on: Any, seen: Callable[[], Any], incremental: bool, reset: bool
    ) -> None:
        """A new fit's label binarizer, fitted on ``fit_on``; or, for a warm start or a
        ``partial_fit``, the check that ``seen()``, this call's classes, fits the classes seen
        before. With ``reset`` the output activation the binarized targets call for."""
        if not hasattr(self, "classes_") or (not self.warm_start and not incremental):
            self._label_binarizer = LabelBinarizer()
            self._label_binarizer.fit(fit_on)
            self.classes_ = self._label_binarizer.classes_
        else:
            classes = seen()
            if self.warm_start:
                if set(classes) != set(self.classes_):
                    raise EstimatorError(
                        "warm_start can only be used where `y` has the same classes as in the "
                        f"previous call to fit. Previously got {self.classes_}, `y` has {classes}"
                    )
            elif len(np.setdiff1d(classes, self.classes_, assume_unique=True)):
                raise EstimatorError(
                    f"`y` has classes not in `self.classes_`. `self.classes_` has "
                    f"{self.classes_}. 'y' has {classes}."
                )
        if reset:
            kind = self._label_binarizer.y_type_
            self.out_activation_ = "softmax" if kind == "multiclass" else "logistic"

    def _validate_dask(self, X: Any, y: Any, incremental: bool, reset: bool) -> tuple[Any, Any]:
        """:meth:`_validate_input` of dask ``X`` and labels: the classes found on the workers,
        the labels binarized there (only the classes reach the client)."""
        X = dask_data.features(self, X, reset)
        if y.ndim == 2 and y.shape[1] == 1:
            y = y[:, 0]
        if y.ndim != 1:
            raise EstimatorError(
                f"y is a dask array of shape {y.shape}; on a cluster the classifier takes 1-D "
                f"class labels from dask (multi-label y: compute it, y.compute(), and pass numpy)"
            )
        found = dask_data.unique(self._client(), y)
        check_classification_targets(found)  # the type of the labels is the type of their values
        self._fit_classes(found, lambda: found, incremental, reset)
        return X, dask_data.labels(self, y, self._label_binarizer, X.dtype)

    def _validation_targets(self, Yv: np.ndarray) -> Any:
        return self._label_binarizer.inverse_transform(Yv)

    def _scorer(self, Xv: Any, yv: Any, sw: Any = None) -> Any:
        net = self._net()

        def score(params: Sequence[np.ndarray]) -> float:
            pred = self._labels(forward(Xv, params, net))
            return float(accuracy_score(yv, pred, sample_weight=sw))

        return score

    def _labels(self, out: np.ndarray) -> Any:
        if out.shape[1] == 1:
            out = out.ravel()
        return self._label_binarizer.inverse_transform(out)

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X: Any, y: Any = None, sample_weight: Any = None) -> MLPClassifier:
        """Fit the model to ``X (s, n)`` (an array, or a CSR / CSC matrix) and labels ``y``
        (one weight per sample in ``sample_weight``, or None: 1 each); returns self.

        ``X`` and ``y`` may be Dask's (:mod:`dask_rpm.nn.chunked`: dask arrays, xarray with a
        ``sample`` dimension, or ``y`` left out for a ``Dataset`` / zarr store holding ``x`` and
        ``d``): on a cluster they stay there, the classes found and the labels binarized on the
        workers; without one they are computed first."""
        X, y = dask_data.inputs(self._client(), X, y)
        return self._fit(X, y, incremental=False, sample_weight=sample_weight)

    @available_if(MLPBase._check_solver)
    @_fit_context(prefer_skip_nested_validation=True)
    def partial_fit(
        self, X: Any, y: Any, sample_weight: Any = None, classes: Any = None
    ) -> MLPClassifier:
        """One epoch over ``X, y`` (``classes``: every label, needed on the first call, the
        same on every later one; multi-label ``y`` gives its own)."""
        X, y = dask_data.inputs(self._client(), X, y)
        if _check_partial_fit_first_call(self, classes):
            self._label_binarizer = LabelBinarizer()
            if not dask_data.is_lazy(y) and type_of_target(y).startswith("multilabel"):
                self._label_binarizer.fit(y)
            else:
                self._label_binarizer.fit(classes)
        return self._fit(X, y, incremental=True, sample_weight=sample_weight)

    def predict(self, X: Any) -> Any:
        """Class labels (a dask array computed on the workers for Dask's ``X``)."""
        if is_chunked(X):
            return self._lazy("predict", X)
        X = self._check_predict_X(X)
        return self._labels(self._forward(X))

    def predict_proba(self, X: Any) -> Any:
        """Class probabilities ``(samples, classes)``, columns in the order of ``classes_`` (a
        dask array computed on the workers for Dask's ``X``)."""
        if is_chunked(X):
            return self._lazy("predict_proba", X)
        X = self._check_predict_X(X)
        out = self._forward(X)
        if out.shape[1] == 1 and len(self.classes_) == 2:
            return np.hstack([1.0 - out, out])
        return out

    def predict_log_proba(self, X: Any) -> Any:
        """Logarithms of :meth:`predict_proba`."""
        if is_chunked(X):
            return self._lazy("predict_log_proba", X)
        with np.errstate(divide="ignore"):
            return np.log(self.predict_proba(X))

    def score(self, X: Any, y: Any, sample_weight: Any = None) -> float:
        """scikit-learn's mean accuracy of :meth:`predict` on ``X`` against ``y``; for Dask's
        data computed by reductions on the workers."""
        if is_chunked(X, y) or dask_data.is_lazy(sample_weight):
            return dask_data.score(self, X, y, sample_weight, "accuracy")
        return float(super().score(X, y, sample_weight=sample_weight))


class MLPRegressor(RegressorMixin, MLPBase):
    __doc__ = (
        "A multi-layer perceptron regressor: scikit-learn's ``MLPRegressor``, trained by "
        "dask_rpm (squared error and identity outputs, or the Poisson deviance and "
        "exponential outputs).\n"
        + _COMMON_DOC.replace(
            "    hidden_layer_sizes, activation,",
            "    loss : {'squared_error', 'poisson'}\n    hidden_layer_sizes, activation,",
        )
    )

    _parameter_constraints = {
        **MLPBase._parameter_constraints,
        "loss": [StrOptions({"squared_error", "poisson"})],
    }

    @property
    def _loss_name(self) -> str:
        return "poisson" if self.loss == "poisson" else "squared"

    @property
    def _output_name(self) -> str:
        return "exp" if self.loss == "poisson" else "linear"

    def __init__(
        self,
        loss: str = "squared_error",
        hidden_layer_sizes: Any = (100,),
        activation: str = "relu",
        *,
        solver: str = "adam",
        alpha: float = 0.0001,
        batch_size: Any = "auto",
        learning_rate: str = "constant",
        learning_rate_init: float = 0.001,
        power_t: float = 0.5,
        max_iter: int = 200,
        shuffle: bool = True,
        random_state: Any = None,
        tol: float = 1e-4,
        verbose: bool = False,
        warm_start: bool = False,
        momentum: float = 0.9,
        nesterovs_momentum: bool = True,
        early_stopping: bool = False,
        validation_fraction: float = 0.1,
        beta_1: float = 0.9,
        beta_2: float = 0.999,
        epsilon: float = 1e-8,
        n_iter_no_change: int = 10,
        max_fun: int = 15000,
        client: Any = None,
        mapping: Any = None,
        abilities: Any = None,
        progress: Any = None,
        backend: str | None = None,
        device: str | None = None,
    ) -> None:
        _params_init(self, **{k: v for k, v in locals().items() if k not in ("self", "__class__")})

    def __sklearn_tags__(self) -> Any:
        tags = super().__sklearn_tags__()
        tags.target_tags.multi_output = True  # y may be (samples, outputs): one output unit each
        return tags

    def _validate_input(
        self, X: Any, y: Any, incremental: bool, reset: bool
    ) -> tuple[Any, np.ndarray]:
        """scikit-learn's checks of ``X`` and ``y``; the targets as columns in ``X``'s dtype."""
        X, y = validate_data(
            self,
            X,
            y,
            reset=reset,
            accept_sparse=["csr", "csc"],
            dtype=(np.float64, np.float32),
            multi_output=True,
            y_numeric=True,
        )
        y = np.asarray(y, dtype=X.dtype)
        if reset:
            self.out_activation_ = "exp" if self.loss == "poisson" else "identity"
        return X, (y.reshape(-1, 1) if y.ndim == 1 else y)

    def _validate_dask(self, X: Any, y: Any, incremental: bool, reset: bool) -> tuple[Any, Any]:
        """:meth:`_validate_input` of dask ``X`` and ``y`` (numbers; columns in ``X``'s dtype)."""
        X = dask_data.features(self, X, reset)
        if y.dtype.kind not in "biuf":
            raise EstimatorError(
                f"y has dtype {y.dtype}; a regressor's targets must be numbers: convert them "
                f"(y.astype('float64'))"
            )
        y = y.astype(X.dtype)
        if reset:
            self.out_activation_ = "exp" if self.loss == "poisson" else "identity"
        return X, (y[:, None] if y.ndim == 1 else y)

    def _validation_targets(self, Yv: np.ndarray) -> Any:
        return Yv.ravel() if Yv.shape[1] == 1 else Yv

    def _scorer(self, Xv: Any, yv: Any, sw: Any = None) -> Any:
        net = self._net()

        def score(params: Sequence[np.ndarray]) -> float:
            out = forward(Xv, params, net)
            pred = out.ravel() if out.shape[1] == 1 else out
            if not np.isfinite(pred).all():
                return math.nan
            return float(r2_score(yv, pred, sample_weight=sw))

        return score

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X: Any, y: Any = None, sample_weight: Any = None) -> MLPRegressor:
        """Fit the model to ``X (s, n)`` (an array, or a CSR / CSC matrix) and targets ``y (s,)``
        or ``(s, outputs)`` (one weight per sample in ``sample_weight``, or None: 1 each);
        returns self. ``X`` and ``y`` may be Dask's, as :meth:`MLPClassifier.fit` says."""
        X, y = dask_data.inputs(self._client(), X, y)
        return self._fit(X, y, incremental=False, sample_weight=sample_weight)

    @available_if(MLPBase._check_solver)
    @_fit_context(prefer_skip_nested_validation=True)
    def partial_fit(self, X: Any, y: Any, sample_weight: Any = None) -> MLPRegressor:
        """One epoch over ``X, y``."""
        X, y = dask_data.inputs(self._client(), X, y)
        return self._fit(X, y, incremental=True, sample_weight=sample_weight)

    def predict(self, X: Any) -> Any:
        """Predicted targets, ``(samples,)`` for one output (a dask array computed on the
        workers for Dask's ``X``)."""
        if is_chunked(X):
            return self._lazy("predict", X)
        X = self._check_predict_X(X)
        out = self._forward(X)
        return out.ravel() if out.shape[1] == 1 else out

    def score(self, X: Any, y: Any, sample_weight: Any = None) -> float:
        """scikit-learn's coefficient of determination R^2 of :meth:`predict` on ``X`` against
        ``y``; for Dask's data computed by reductions on the workers."""
        if is_chunked(X, y) or dask_data.is_lazy(sample_weight):
            return dask_data.score(self, X, y, sample_weight, "r2")
        return float(super().score(X, y, sample_weight=sample_weight))
