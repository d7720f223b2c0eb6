"""scikit-learn estimators: :class:`MLPClassifier` and :class:`MLPRegressor`, drop-ins for scikit-learn's.

Same parameters, defaults and meaning as ``sklearn.neural_network``'s
``MLPClassifier`` / ``MLPRegressor`` (stochastic solvers ``adam`` and
``sgd``), the same fitted attributes, and **the same model**: with the same
parameters and ``random_state`` the fitted ``coefs_`` and ``intercepts_``
equal scikit-learn's to rounding (float64), trained serially or on any Dask
cluster and plan. What makes them equal:

* initial weights drawn from ``check_random_state(random_state)`` in
  scikit-learn's order and bounds (Glorot uniform; ``factor`` 2 for logistic);
* the early-stopping split by ``train_test_split`` from the same generator
  (stratified for single-output classifiers), then scikit-learn's cumulative
  per-epoch shuffles from what is left of it (:mod:`dask_rpm.batches`);
* each iteration's gradient is the batch mean plus ``alpha W / batch``
  (``reduction="mean"``, :mod:`dask_rpm.optim`), stepped by scikit-learn's
  Adam or SGD arithmetic (``convention="scikit-learn"``);
* the epoch loss, ``tol`` / ``n_iter_no_change`` stopping, early stopping on
  the validation score and the ``invscaling`` / ``adaptive`` learning rates
  are :class:`dask_rpm.convergence.ConvergenceRule`, run at epoch ends by
  the serial loop and by the engine alike.

Like xgboost.dask's and dask-ml's estimators they take a ``client``: with
one (or a default client in this process) they train with
:func:`dask_rpm.fit` on its workers, else serially in this process. The
client is not pickled: an unpickled estimator (e.g. in ``GridSearchCV``'s
worker processes) finds the default client again, or trains serially, which
gives the same model.

Not supported: ``solver="lbfgs"``, more than one hidden layer (one
``hidden_layer_sizes`` entry), ``activation="identity"``, ``sample_weight``
and ``loss="poisson"``; each is refused with a message saying so.

Needs scikit-learn (the optional extra ``sklearn``).
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np

try:
    from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin, is_classifier
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.metrics import accuracy_score, r2_score
    from sklearn.model_selection import train_test_split
    from sklearn.preprocessing import LabelBinarizer
    from sklearn.utils import check_random_state
    from sklearn.utils.multiclass import check_classification_targets, type_of_target
    from sklearn.utils.validation import check_is_fitted, column_or_1d, validate_data
except ImportError as exc:  # pragma: no cover - exercised only without scikit-learn
    raise ImportError(
        "dask_rpm.MLPClassifier and MLPRegressor need scikit-learn: pip install 'dask-rpm[sklearn]'"
    ) from exc

from .convergence import LEARNING_RATE_SCHEDULES, ConvergenceRule
from .model import MLPModel
from .network import Network
from .prepare import prepare
from .serial import train_arrays

__all__ = ["MLPClassifier", "MLPRegressor", "EstimatorError"]


class EstimatorError(ValueError):
    """Invalid estimator input (data or hyperparameters); the message says what is valid."""


_ACTIVATIONS = {"logistic": "sigmoid", "tanh": "tanh", "relu": "relu"}


class _MLPBase(BaseEstimator):
    """Training shared by both estimators (scikit-learn's ``BaseMultilayerPerceptron``'s loop)."""

    # ------------------------------------------------------------- settings
    def _resolved(self) -> dict[str, Any]:
        """The parameters after dask_rpm's older names (``hidden_units``, ``epochs``, ``seed``,
        ``optimizer``, a float ``learning_rate``, an integer ``early_stopping``) are mapped onto
        scikit-learn's."""
        p = self.get_params(deep=False)
        if p["hidden_units"] is not None:
            p["hidden_layer_sizes"] = (p["hidden_units"],)
        if p["epochs"] is not None:
            p["max_iter"] = p["epochs"]
        if p["seed"] is not None:
            p["random_state"] = p["seed"]
        if p["optimizer"] is not None:
            names = {"adam": ("adam", p["momentum"]), "sgd": ("sgd", 0.0), "momentum": ("sgd", 0.9)}
            if p["optimizer"] not in names:
                raise EstimatorError(
                    f"optimizer={p['optimizer']!r}; valid: {', '.join(names)} (or scikit-learn's "
                    f"solver='adam' / 'sgd')"
                )
            p["solver"], p["momentum"] = names[p["optimizer"]]
            p["nesterovs_momentum"] = p["nesterovs_momentum"] and p["optimizer"] != "momentum"
        lr = p["learning_rate"]
        if isinstance(lr, (int, float, np.number)) and not isinstance(lr, bool):
            p["learning_rate_init"], p["learning_rate"] = float(lr), "constant"
        es = p["early_stopping"]
        if isinstance(es, (int, np.integer)) and not isinstance(es, bool):
            p["early_stopping"], p["n_iter_no_change"] = True, int(es)
        return p

    def _check_params(self, p: dict[str, Any]) -> tuple[int, ...]:
        hidden = p["hidden_layer_sizes"]
        sizes = tuple(hidden) if hasattr(hidden, "__iter__") else (hidden,)
        if not sizes or any(
            isinstance(h, bool) or not isinstance(h, (int, np.integer)) or h < 1 for h in sizes
        ):
            raise EstimatorError(
                f"hidden_layer_sizes={hidden!r}; give positive integers, e.g. (100,)"
            )
        if len(sizes) != 1:
            raise EstimatorError(
                f"hidden_layer_sizes={hidden!r} has {len(sizes)} hidden layers; dask_rpm trains "
                f"networks with one hidden layer: give one size, e.g. ({sizes[0]},)"
            )
        if p["solver"] not in ("adam", "sgd"):
            raise EstimatorError(
                f"solver={p['solver']!r}; dask_rpm trains with 'adam' or 'sgd' (mini-batch "
                f"solvers that split across workers); 'lbfgs' is not supported"
            )
        if p["activation"] not in _ACTIVATIONS:
            raise EstimatorError(
                f"activation={p['activation']!r}; valid: {', '.join(_ACTIVATIONS)}"
            )
        if p["learning_rate"] not in LEARNING_RATE_SCHEDULES:
            raise EstimatorError(
                f"learning_rate={p['learning_rate']!r}; valid: "
                f"{', '.join(LEARNING_RATE_SCHEDULES)} (or a number: learning_rate_init)"
            )
        checks = [
            ("alpha", 0.0, False),
            ("learning_rate_init", 0.0, True),
            ("tol", 0.0, False),
            ("power_t", 0.0, False),
            ("epsilon", 0.0, True),
        ]
        for name, low, strict in checks:
            v = p[name]
            ok = isinstance(v, (int, float, np.number)) and not isinstance(v, bool)
            if not ok or not math.isfinite(v) or (v <= low if strict else v < low):
                rel = ">" if strict else ">="
                raise EstimatorError(f"{name}={v!r}; it must be a finite number {rel} {low:g}")
        for name in ("max_iter", "n_iter_no_change"):
            v = p[name]
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise EstimatorError(f"{name}={v!r}; it must be a positive integer")
        for name in ("momentum", "beta_1", "beta_2", "validation_fraction"):
            v = p[name]
            if not isinstance(v, (int, float, np.number)) or not 0.0 <= v < 1.0:
                raise EstimatorError(f"{name}={v!r}; it must be in [0, 1)")
        b = p["batch_size"]
        if b != "auto" and (isinstance(b, bool) or not isinstance(b, (int, np.integer)) or b < 1):
            raise EstimatorError(f"batch_size={b!r}; give a positive integer or 'auto'")
        return sizes

    # ------------------------------------------------------------- training
    def _fit(self, X: Any, y: Any, incremental: bool, classes: Any = None) -> Any:
        p = self._resolved()
        (hidden,) = self._check_params(p)
        first_pass = not hasattr(self, "coefs_") or (not p["warm_start"] and not incremental)
        X, Y = self._validate_input(X, y, incremental, first_pass, classes)
        self.n_outputs_ = Y.shape[1]
        rs = check_random_state(p["random_state"])
        if first_pass:
            self._initialize(X.shape[1], hidden, Y, rs, p)
        if p["early_stopping"] and incremental:
            raise EstimatorError("partial_fit does not support early_stopping=True")
        Xt, Yt, val = self._split(X, Y, rs, p)
        n = Xt.shape[0]
        if p["batch_size"] == "auto":
            batch = min(200, n)
        else:
            if p["batch_size"] > n:
                warnings.warn(
                    "Got `batch_size` less than 1 or larger than sample size. It is going to be "
                    "clipped",
                    stacklevel=3,
                )
            batch = int(np.clip(p["batch_size"], 1, n))
        if not incremental or not hasattr(self, "_optimizer_state"):
            self._optimizer_state, self._steps = None, 0  # a new optimizer, as scikit-learn's
            self._lr = float(p["learning_rate_init"])
        score = None
        if val is not None:
            score = self._scorer(*val)
        rule = ConvergenceRule(
            n,
            p["learning_rate_init"],
            solver=p["solver"],
            learning_rate=p["learning_rate"],
            power_t=p["power_t"],
            tol=p["tol"],
            n_iter_no_change=p["n_iter_no_change"],
            score=score,
            state=self._rule_state,
        )
        # the rate the optimizer reached (sgd's invscaling and adaptive change it; partial_fit goes on)
        rule.lr = self._lr
        W, V = self._train(Xt, Yt, hidden, batch, 1 if incremental else p["max_iter"], rs, p, rule)
        if rule.best is not None:  # early stopping: the weights of the best validation score
            W, V = rule.best
        self._store(W, V, rule, p)
        if not incremental and rule.epochs == p["max_iter"] and not self._stopped:
            warnings.warn(
                f"Stochastic Optimizer: Maximum iterations ({p['max_iter']}) reached and the "
                f"optimization hasn't converged yet.",
                ConvergenceWarning,
                stacklevel=3,
            )
        return self

    def _initialize(
        self, n_features: int, hidden: int, Y: np.ndarray, rs: Any, p: dict[str, Any]
    ) -> None:
        """scikit-learn's ``_initialize``: Glorot-uniform weights drawn from ``rs`` in its order."""
        factor = 2.0 if p["activation"] == "logistic" else 6.0
        self.coefs_, self.intercepts_ = [], []
        for fan_in, fan_out in ((n_features, hidden), (hidden, Y.shape[1])):
            bound = np.sqrt(factor / (fan_in + fan_out))
            self.coefs_.append(rs.uniform(-bound, bound, (fan_in, fan_out)))
            self.intercepts_.append(rs.uniform(-bound, bound, fan_out))
        self.n_iter_, self.t_ = 0, 0
        self.n_layers_ = 3
        self._rule_state: dict[str, Any] | None = None
        if hasattr(self, "_optimizer_state"):
            del self._optimizer_state

    def _split(
        self, X: np.ndarray, Y: np.ndarray, rs: Any, p: dict[str, Any]
    ) -> tuple[np.ndarray, np.ndarray, tuple[np.ndarray, Any] | None]:
        if not p["early_stopping"]:
            return X, Y, None
        stratify = Y if is_classifier(self) and Y.shape[1] == 1 else None
        Xt, Xv, Yt, Yv = train_test_split(
            X, Y, random_state=rs, test_size=p["validation_fraction"], stratify=stratify
        )
        if Xv.shape[0] < 2:
            raise EstimatorError(
                f"validation_fraction={p['validation_fraction']} of {X.shape[0]} samples holds out "
                f"{Xv.shape[0]}; the validation set needs at least 2: increase validation_fraction "
                f"or give more samples"
            )
        return Xt, Yt, (Xv, self._validation_targets(Yv))

    def _net(self, p: dict[str, Any]) -> Network:
        return Network(_ACTIVATIONS[p["activation"]], self._loss_name, self._output_name, True)

    def _train(
        self,
        X: np.ndarray,
        Y: np.ndarray,
        hidden: int,
        batch: int,
        epochs: int,
        rs: Any,
        p: dict[str, Any],
        rule: ConvergenceRule,
    ) -> tuple[np.ndarray, np.ndarray]:
        net = self._net(p)
        opt: dict[str, Any] = {"name": p["solver"], "convention": "scikit-learn", "steps": 0}
        if p["solver"] == "adam":
            opt.update(beta1=p["beta_1"], beta2=p["beta_2"], eps=p["epsilon"])
        else:
            opt.update(momentum=p["momentum"], nesterov=bool(p["nesterovs_momentum"]))
        opt["steps"] = self._steps
        init = (self.coefs_[0].T, self.coefs_[1].T, self.intercepts_[0], self.intercepts_[1])
        options = dict(
            hidden=hidden,
            epochs=epochs,
            learning_rate=self._lr,
            init=init,
            dtype="float64",
            batch_size=batch,
            shuffle=rs if p["shuffle"] else False,
            activation=net.activation,
            loss=net.loss,
            output=net.output,
            bias=True,
            optimizer=opt,
            alpha=p["alpha"],
            reduction="mean",
        )
        client = self._client()
        if client is None:
            job = prepare(X, Y, **options, iterations=None, seed=0, load=True)
            assert job.arrays is not None
            out = train_arrays(
                net.augment(job.arrays[0]),
                job.arrays[1],
                job.W0,
                job.V0,
                job.recipe,
                rules=[rule],
                opt_state=self._optimizer_state,
            )
            W, V, stopped, state = out["W"], out["V"], out["stopped"], out["optimizer_state"]
            self.result_ = out
        else:
            from .engine import fit  # only with a client: the serial path needs no distributed

            resume = None
            if self._optimizer_state is not None:  # partial_fit goes on with the optimizer's state
                W0, V0 = net.join(*init[:2], init[2], init[3])
                resume = {"iteration": 0, "W": W0, "V": V0, "optimizer_state": self._optimizer_state}
            per_epoch = math.ceil(X.shape[0] / batch)
            result = fit(
                X,
                Y,
                client=client,
                mapping=p["mapping"],
                abilities=p["abilities"],
                progress=p["progress"],
                callbacks=[rule],
                resume=resume,
                # a worker loss replays from the last epoch end, at that epoch's learning rate
                checkpoint_every=per_epoch if p["learning_rate"] != "constant" else None,
                **options,
            )
            W, V, stopped, state = result.W, result.V, result.stopped, result.optimizer_state
            self.result_ = result
        if stopped and "diverged" in stopped:
            raise EstimatorError(
                "Solver produced non-finite parameter weights. The input data may contain large "
                f"values and need to be preprocessed ({stopped}; or lower learning_rate_init, now "
                f"{p['learning_rate_init']!r})"
            )
        self._stopped = stopped
        self._optimizer_state = state
        # the rule stops training on epoch ends only: so many steps were taken
        self._steps += rule.epochs * math.ceil(X.shape[0] / batch)
        self._lr = rule.lr
        return W, V

    def _store(self, W: np.ndarray, V: np.ndarray, rule: ConvergenceRule, p: dict[str, Any]) -> None:
        """scikit-learn's fitted attributes from the augmented weights and the rule's bookkeeping."""
        net = self._net(p)
        parts = net.split(W, V)
        self.coefs_ = [np.array(parts["W"].T), np.array(parts["V"].T)]
        self.intercepts_ = [np.array(parts["b"]), np.array(parts["c"])]
        self.n_iter_ = rule.epochs
        self.t_ = rule.t
        self.loss_curve_ = list(rule.loss_curve)
        self.loss_ = self.loss_curve_[-1]
        self._rule_state = rule.state()
        self._no_improvement_count = rule.no_improvement
        if p["early_stopping"]:
            self.validation_scores_ = list(rule.validation_scores)
            self.best_validation_score_ = rule.best_score
            self.best_loss_ = None
        else:
            self.validation_scores_ = None
            self.best_validation_score_ = None
            self.best_loss_ = rule.best_loss
        self.stopped_ = self._stopped
        self.model_ = MLPModel(
            W,
            V,
            net,
            classes=getattr(self, "classes_", None) if self._output_name != "linear" else None,
            meta={"loss_curve": self.loss_curve_, "validation": []},
        )

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

    def __sklearn_clone__(self) -> Any:
        # a client is shared by the clones (GridSearchCV's), not deep-copied: it holds sockets
        client = self.client
        self.client = None
        try:
            twin = super().__sklearn_clone__()
        finally:
            self.client = client
        twin.client = client
        return twin

    def __getstate__(self) -> dict[str, Any]:
        # a client holds sockets and tasks; the unpickled estimator finds the default client again
        state = dict(super().__getstate__())
        state["client"] = None
        state.pop("result_", None)
        return state

    # ------------------------------------------------------------- fitted
    def _forward(self, X: np.ndarray) -> np.ndarray:
        """scikit-learn's ``_forward_pass_fast`` on ``coefs_`` / ``intercepts_``."""
        a = X @ self.coefs_[0] + self.intercepts_[0]
        act = self._resolved()["activation"]
        if act == "logistic":
            a = 1.0 / (1.0 + np.exp(-a))
        elif act == "tanh":
            a = np.tanh(a)
        else:
            a = np.maximum(a, 0.0)
        out = a @ self.coefs_[1] + self.intercepts_[1]
        if self.out_activation_ == "softmax":
            out = out - out.max(axis=1, keepdims=True)
            out = np.exp(out)
            out /= out.sum(axis=1, keepdims=True)
        elif self.out_activation_ == "logistic":
            out = 1.0 / (1.0 + np.exp(-out))
        return out

    def _check_predict_X(self, X: Any) -> np.ndarray:
        check_is_fitted(self, "coefs_")
        return validate_data(self, X, reset=False, dtype=(np.float64, np.float32))

    def save(self, path: Any) -> str:
        """Write the fitted model (:meth:`dask_rpm.MLPModel.save`); :meth:`dask_rpm.MLPModel.load` reads it."""
        check_is_fitted(self, "model_")
        return self.model_.save(path)


_COMMON_DOC = """
    Parameters
    ----------
    hidden_layer_sizes, activation, solver, alpha, batch_size, learning_rate, learning_rate_init,
    power_t, max_iter, shuffle, random_state, tol, verbose, warm_start, momentum,
    nesterovs_momentum, early_stopping, validation_fraction, beta_1, beta_2, epsilon,
    n_iter_no_change, max_fun
        scikit-learn's, with its defaults and meaning (one hidden layer; solvers adam
        and sgd; ``max_fun`` is lbfgs's and unused).
    client : distributed.Client, optional
        Train on this cluster; None: the default client if any, else serially.
    mapping, abilities, progress
        As in :func:`dask_rpm.fit` (ignored when training serially).
    hidden_units, epochs, seed, optimizer
        dask_rpm's older names: ``hidden_layer_sizes=(hidden_units,)``,
        ``max_iter``, ``random_state``, ``solver`` (``"momentum"``: sgd with
        momentum 0.9); a number as ``learning_rate`` is ``learning_rate_init``
        and an integer ``early_stopping`` is ``n_iter_no_change`` with early stopping.

    Attributes
    ----------
    coefs_, intercepts_, loss_, loss_curve_, best_loss_, validation_scores_,
    best_validation_score_, n_iter_, t_, n_layers_, n_outputs_, out_activation_,
    n_features_in_, feature_names_in_
        scikit-learn's, with its meaning (``n_iter_`` counts epochs; the
        losses are per-sample means with the L2 penalty).
    model_ : MLPModel
        The trained network (save, load, to_torch).
    result_ : FitResult or dict
        What :func:`dask_rpm.fit` (or the serial loop) returned for the last fit.
"""


def _params_init(self: Any, **params: Any) -> None:
    for k, v in params.items():
        setattr(self, k, v)


class MLPClassifier(ClassifierMixin, _MLPBase):
    __doc__ = (
        "A one-hidden-layer perceptron classifier: scikit-learn's ``MLPClassifier``, trained by "
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
        learning_rate: Any = "constant",
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
        early_stopping: Any = False,
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
        hidden_units: int | None = None,
        epochs: int | None = None,
        seed: int | None = None,
        optimizer: str | None = None,
    ) -> None:
        _params_init(self, **{k: v for k, v in locals().items() if k not in ("self", "__class__")})

    @property
    def _output_name(self) -> str:
        return "softmax" if self.out_activation_ == "softmax" else "sigmoid"

    def _validate_input(
        self, X: Any, y: Any, incremental: bool, reset: bool, classes: Any
    ) -> tuple[np.ndarray, np.ndarray]:
        X, y = validate_data(
            self, X, y, reset=reset, dtype=(np.float64, np.float32), multi_output=True
        )
        X = np.asarray(X, dtype=np.float64)
        if y.ndim == 2 and y.shape[1] == 1:
            y = column_or_1d(y, warn=True)
        check_classification_targets(y)
        if reset or not hasattr(self, "classes_"):
            self._label_binarizer = LabelBinarizer()
            self._label_binarizer.fit(y if classes is None else classes)
            self.classes_ = self._label_binarizer.classes_
            kind = self._label_binarizer.y_type_
            self.out_activation_ = "softmax" if kind == "multiclass" else "logistic"
        else:
            seen = np.setdiff1d(np.unique(y), self.classes_) if y.ndim == 1 else []
            if len(seen):
                raise EstimatorError(
                    f"y has labels {list(seen)} that are not in classes_ {list(self.classes_)}; "
                    f"pass every class to the first partial_fit with classes="
                )
        if len(self.classes_) < 2 and type_of_target(y) != "multilabel-indicator":
            raise EstimatorError(
                f"y has only one class ({self.classes_[0]!r}); a classifier needs at least 2"
            )
        Y = self._label_binarizer.transform(y).astype(np.float64)
        return X, Y

    def _validation_targets(self, Yv: np.ndarray) -> Any:
        return self._label_binarizer.inverse_transform(Yv)

    def _scorer(self, Xv: np.ndarray, yv: Any) -> Any:
        def score(W: np.ndarray, V: np.ndarray) -> float:
            return float(accuracy_score(yv, self._labels(self._augmented_outputs(Xv, W, V))))

        return score

    def _augmented_outputs(self, X: np.ndarray, W: np.ndarray, V: np.ndarray) -> np.ndarray:
        from .recipe import forward

        net = self._net(self._resolved())
        return forward(X, W, V, net)

    def _labels(self, out: np.ndarray) -> Any:
        if out.shape[1] == 1:
            out = out.ravel()
        return self._label_binarizer.inverse_transform(out)

    def fit(self, X: Any, y: Any) -> MLPClassifier:
        """Fit the model to ``X (s, n)`` and labels ``y``; returns self."""
        return self._fit(X, y, incremental=False)

    def partial_fit(self, X: Any, y: Any, classes: Any = None) -> MLPClassifier:
        """One epoch over ``X, y`` (``classes``: every label, needed on the first call)."""
        if not hasattr(self, "classes_") and classes is None:
            raise EstimatorError(
                "classes must be passed on the first call to partial_fit (every label, e.g. "
                "np.unique(y_all))"
            )
        return self._fit(X, y, incremental=True, classes=classes)

    def predict(self, X: Any) -> np.ndarray:
        """Class labels."""
        X = self._check_predict_X(X)
        return self._labels(self._forward(X))

    def predict_proba(self, X: Any) -> np.ndarray:
        """Class probabilities ``(samples, classes)``, columns in the order of ``classes_``."""
        X = self._check_predict_X(X)
        out = self._forward(X)
        if out.shape[1] == 1 and len(self.classes_) == 2:
            return np.hstack([1.0 - out, out])
        return out

    def predict_log_proba(self, X: Any) -> np.ndarray:
        """Logarithms of :meth:`predict_proba`."""
        with np.errstate(divide="ignore"):
            return np.log(self.predict_proba(X))


class MLPRegressor(RegressorMixin, _MLPBase):
    __doc__ = (
        "A one-hidden-layer perceptron regressor: scikit-learn's ``MLPRegressor``, trained by "
        "dask_rpm (squared error, identity outputs).\n"
        + _COMMON_DOC.replace(
            "    hidden_layer_sizes, activation,", "    loss : {'squared_error'}\n    hidden_layer_sizes, activation,"
        )
    )

    _loss_name = "squared"
    _output_name = "linear"

    def __init__(
        self,
        loss: str = "squared_error",
        hidden_layer_sizes: Any = (100,),
        activation: str = "relu",
        *,
        solver: str = "adam",
        alpha: float = 0.0001,
        batch_size: Any = "auto",
        learning_rate: Any = "constant",
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
        early_stopping: Any = False,
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
        hidden_units: int | None = None,
        epochs: int | None = None,
        seed: int | None = None,
        optimizer: str | None = None,
    ) -> None:
        _params_init(self, **{k: v for k, v in locals().items() if k not in ("self", "__class__")})

    def __sklearn_tags__(self) -> Any:
        tags = super().__sklearn_tags__()
        tags.target_tags.multi_output = True  # y may be (samples, outputs): one output unit each
        return tags

    def _validate_input(
        self, X: Any, y: Any, incremental: bool, reset: bool, classes: Any
    ) -> tuple[np.ndarray, np.ndarray]:
        if self.loss != "squared_error":
            raise EstimatorError(f"loss={self.loss!r}; dask_rpm's MLPRegressor trains 'squared_error'")
        X, y = validate_data(
            self, X, y, reset=reset, dtype=(np.float64, np.float32), multi_output=True, y_numeric=True
        )
        X = np.asarray(X, dtype=np.float64)
        y = np.asarray(y, dtype=np.float64)
        self.out_activation_ = "identity"
        return X, (y.reshape(-1, 1) if y.ndim == 1 else y)

    def _validation_targets(self, Yv: np.ndarray) -> Any:
        return Yv.ravel() if Yv.shape[1] == 1 else Yv

    def _scorer(self, Xv: np.ndarray, yv: Any) -> Any:
        from .recipe import forward

        net = self._net(self._resolved())

        def score(W: np.ndarray, V: np.ndarray) -> float:
            out = forward(Xv, W, V, net)
            pred = out.ravel() if out.shape[1] == 1 else out
            if not np.isfinite(pred).all():
                return math.nan
            return float(r2_score(yv, pred))

        return score

    def fit(self, X: Any, y: Any) -> MLPRegressor:
        """Fit the model to ``X (s, n)`` and targets ``y (s,)`` or ``(s, outputs)``; returns self."""
        return self._fit(X, y, incremental=False)

    def partial_fit(self, X: Any, y: Any) -> MLPRegressor:
        """One epoch over ``X, y``."""
        return self._fit(X, y, incremental=True)

    def predict(self, X: Any) -> np.ndarray:
        """Predicted targets, ``(samples,)`` for one output."""
        X = self._check_predict_X(X)
        out = self._forward(X)
        return out.ravel() if out.shape[1] == 1 else out
