"""The training loop the estimators share: scikit-learn's ``BaseMultilayerPerceptron`` on dask_rpm.

:class:`MLPBase` declares the parameters (scikit-learn's ``_parameter_constraints``, checked
by ``_validate_params`` when ``fit`` starts, as scikit-learn's own estimators do), draws the
initial weights and the early-stopping split from scikit-learn's generator in scikit-learn's
order, and trains with :func:`dask_rpm.fit` (a client) or the serial loop (none), both ending
each epoch with a :class:`dask_rpm.nn.convergence.ConvergenceRule`. :class:`ClusterEstimator`
is what every dask_rpm estimator (:class:`dask_rpm.CNNClassifier` too) does with its client.
:mod:`dask_rpm.estimators` holds the public classes and says what makes their model
scikit-learn's.
"""

from __future__ import annotations

import math
import sys
import warnings
from numbers import Integral, Real
from typing import Any, ClassVar

import numpy as np
from sklearn.base import BaseEstimator, is_classifier
from sklearn.exceptions import ConvergenceWarning
from sklearn.model_selection import train_test_split
from sklearn.utils import check_random_state
from sklearn.utils._param_validation import (
    HasMethods,
    Interval,
    InvalidParameterError,
    Options,
    StrOptions,
)
from sklearn.utils.validation import _check_sample_weight, check_is_fitted, validate_data

from .._version import __version__
from ..model.mlp import MLPModel
from ..nn.backend import resolve
from ..nn.convergence import LEARNING_RATE_SCHEDULES, ConvergenceRule
from ..nn.network import Network
from ..nn.options import TrainingOptions
from ..nn.prepare import prepare
from ..nn.recipe import forward
from ..nn.serial import train_arrays
from ..plan.partition import Plan
from ..progress import MODES
from . import dask_data, lbfgs
from .errors import EstimatorError

__all__ = ["MLPBase", "ClusterEstimator", "CLUSTER_CONSTRAINTS"]


#: scikit-learn's activation names, as dask_rpm's kernels call them
_ACTIVATIONS = {"logistic": "sigmoid", "tanh": "tanh", "relu": "relu", "identity": "identity"}


#: scikit-learn's constraints on the stochastic solvers' parameters (its
#: ``BaseMultilayerPerceptron._parameter_constraints``), as every estimator declares them
SOLVER_CONSTRAINTS: dict[str, list[Any]] = {
    "alpha": [Interval(Real, 0, None, closed="left")],
    "batch_size": [StrOptions({"auto"}), Interval(Integral, 1, None, closed="left")],
    "learning_rate": [StrOptions(set(LEARNING_RATE_SCHEDULES))],
    "learning_rate_init": [Interval(Real, 0, None, closed="neither")],
    "power_t": [Interval(Real, 0, None, closed="left")],
    "max_iter": [Interval(Integral, 1, None, closed="left")],
    "shuffle": ["boolean"],
    "random_state": ["random_state"],
    "tol": [Interval(Real, 0, None, closed="left")],
    "verbose": ["verbose"],
    "warm_start": ["boolean"],
    "momentum": [Interval(Real, 0, 1, closed="both")],
    "nesterovs_momentum": ["boolean"],
    "beta_1": [Interval(Real, 0, 1, closed="left")],
    "beta_2": [Interval(Real, 0, 1, closed="left")],
    "epsilon": [Interval(Real, 0, None, closed="neither")],
    "n_iter_no_change": [Interval(Integral, 1, None, closed="left"), Options(Real, {np.inf})],
}

#: dask_rpm's own estimator parameters: where it trains (:func:`dask_rpm.fit`'s keywords of the
#: same names), as every estimator declares them
CLUSTER_CONSTRAINTS: dict[str, list[Any]] = {
    "client": [None, HasMethods(["submit", "gather"])],
    "mapping": [None, str, Plan],
    "abilities": [None, StrOptions({"probe"}), "array-like"],
    "progress": [None, "boolean", StrOptions(set(MODES))],
    "backend": [None, str],
    "device": [None, str],
}


class ClusterEstimator(BaseEstimator):
    """What every dask_rpm estimator shares: its ``client`` (the default client when None, else
    serial training), clones and pickles that share or drop the client, and scikit-learn's
    parameter check after refusing the values of :attr:`_unsupported` with why."""

    #: scikit-learn's values that dask_rpm does not train, and why: refused by
    #: :meth:`_validate_params` with the reason
    _unsupported: ClassVar[dict[str, dict[str, str]]] = {}

    client: Any

    def _validate_params(self) -> None:
        """scikit-learn's check of :attr:`_parameter_constraints`, after refusing the values of
        :attr:`_unsupported` with why (the same ``InvalidParameterError``)."""
        for name, why in self._unsupported.items():
            value = getattr(self, name)
            if isinstance(value, str) and value in why:
                valid = " or ".join(str(c) for c in self._parameter_constraints[name])
                raise InvalidParameterError(
                    f"The {name!r} parameter of {type(self).__name__} must be {valid}. Got "
                    f"{value!r} instead: {why[value]}."
                )
        super()._validate_params()

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

    def _lazy(self, method: str, X: Any) -> Any:
        """``method`` (``predict``, ``predict_proba``, ...) of Dask's ``X`` (a dask array, xarray
        with a ``sample`` dimension, a zarr store's ``x``) as a dask array computed on the
        workers, one task per chunk (:func:`dask_rpm.estimators.dask_data.lazy`)."""
        check_is_fitted(self)
        return dask_data.lazy(self, method, X)

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


class MLPBase(ClusterEstimator):
    """Training shared by both estimators (scikit-learn's ``BaseMultilayerPerceptron``'s loop)."""

    #: scikit-learn's ``BaseMultilayerPerceptron._parameter_constraints``, and dask_rpm's own
    #: parameters
    _parameter_constraints: ClassVar[dict[str, list[Any]]] = {
        "hidden_layer_sizes": ["array-like", Interval(Integral, 1, None, closed="left")],
        "activation": [StrOptions(set(_ACTIVATIONS))],
        "solver": [StrOptions({"lbfgs", "sgd", "adam"})],
        "early_stopping": ["boolean"],
        "validation_fraction": [Interval(Real, 0, 1, closed="left")],
        "max_fun": [Interval(Integral, 1, None, closed="left")],
        **SOLVER_CONSTRAINTS,
        **CLUSTER_CONSTRAINTS,
    }

    # ------------------------------------------------------------- settings
    def _check_solver(self) -> bool:
        """scikit-learn's condition for ``partial_fit``: a stochastic solver."""
        if self.solver not in ("sgd", "adam"):
            raise AttributeError(
                f"partial_fit is only available for stochastic optimizers. {self.solver} is not "
                f"stochastic."
            )
        return True

    def _hidden_sizes(self) -> tuple[int, ...]:
        """``hidden_layer_sizes`` as a tuple of positive integers (an int is one layer)."""
        hidden = self.hidden_layer_sizes
        sizes = tuple(hidden) if hasattr(hidden, "__iter__") else (hidden,)
        if not sizes or any(
            isinstance(h, (bool, np.bool_)) or not isinstance(h, Integral) or h < 1 for h in sizes
        ):
            raise InvalidParameterError(
                f"hidden_layer_sizes must be > 0, one positive integer per hidden layer (at least "
                f"one); got {hidden!r}: give e.g. (100,) or (100, 50)"
            )
        return tuple(int(h) for h in sizes)

    def _progress(self) -> Any:
        """``progress`` for :func:`dask_rpm.fit`: silent unless ``verbose`` or given, as
        scikit-learn's estimators print nothing unless ``verbose``."""
        if self.progress is not None:
            return self.progress
        return None if self.verbose else False

    def __sklearn_tags__(self) -> Any:
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True  # CSR / CSC X: the first layer multiplies it as it is
        return tags

    # ------------------------------------------------------------- training
    def _fit(self, X: Any, y: Any, incremental: bool, sample_weight: Any = None) -> Any:
        hidden = self._hidden_sizes()
        if self.early_stopping and incremental:
            raise EstimatorError("partial_fit does not support early_stopping=True")
        first_pass = not hasattr(self, "coefs_") or (not self.warm_start and not incremental)
        fitted = () if first_pass else tuple(c.shape[1] for c in self.coefs_[:-1])
        if fitted and fitted != hidden:
            raise EstimatorError(
                f"hidden_layer_sizes={hidden!r}, but {'partial_fit' if incremental else 'warm_start'} "
                f"goes on with the fitted network's hidden layers {fitted!r}: fit it anew "
                f"(warm_start=False) to train other sizes"
            )
        if dask_data.is_lazy(sample_weight):  # one number per sample: the recipe holds them all
            client = self._client() if dask_data.is_lazy(X) else None
            (sample_weight,) = dask_data.compute(client, sample_weight)
        # Dask's data on a cluster (without one, the public methods computed them)
        if dask_data.is_lazy(X):
            X, Y = self._validate_dask(X, y, incremental, first_pass)
        else:
            X, Y = self._validate_input(X, y, incremental, first_pass)
        sw = None
        if sample_weight is not None:  # scikit-learn's check, in X's dtype (float32 stays float32)
            sw = _check_sample_weight(sample_weight, X, dtype=X.dtype, ensure_non_negative=True)
        self.n_outputs_ = Y.shape[1]
        rs = check_random_state(self.random_state)
        if first_pass:
            self._initialize(X.shape[1], hidden, Y, rs, X.dtype)
        if self.solver == "lbfgs":  # full batch: no validation split, no batches
            return self._fit_lbfgs(X, Y, sw)
        return self._fit_stochastic(X, Y, sw, hidden, incremental, rs)

    def _fit_stochastic(
        self,
        X: Any,
        Y: np.ndarray,
        sw: np.ndarray | None,
        hidden: tuple[int, ...],
        incremental: bool,
        rs: Any,
    ) -> Any:
        """scikit-learn's ``_fit_stochastic``: the early-stopping split, then epochs of adam or
        sgd (serially or on the cluster) until the :class:`ConvergenceRule` stops them."""
        Xt, Yt, swt, val = self._split(X, Y, sw, rs)
        n = Xt.shape[0]
        if self.batch_size == "auto":
            batch = min(200, n)
        else:
            if self.batch_size > n:
                warnings.warn(
                    "Got `batch_size` less than 1 or larger than sample size. It is going to be "
                    "clipped",
                    stacklevel=4,
                )
            batch = int(np.clip(self.batch_size, 1, n))
        if not incremental or not hasattr(self, "_optimizer_state"):
            self._optimizer_state, self._steps = None, 0  # a new optimizer, as scikit-learn's
            self._lr = float(self.learning_rate_init)
        rule = self._rule(n, val)
        start = self._params()  # scikit-learn's best weights until a validation score beats them
        epochs = 1 if incremental else self.max_iter
        params = self._train(Xt, Yt, swt, hidden, batch, epochs, rs, rule)
        if self._stopped and "diverged" in self._stopped:
            params = self._diverged(params, rule, epochs, start)
        elif rule.best is not None:  # early stopping: the weights of the best validation score
            params = rule.best
        self._store(params, rule)
        if not incremental and rule.epochs == self.max_iter and not self._stopped:
            warnings.warn(
                f"Stochastic Optimizer: Maximum iterations ({self.max_iter}) reached and the "
                f"optimization hasn't converged yet.",
                ConvergenceWarning,
                stacklevel=4,
            )
        return self

    def _rule(self, n: int, val: tuple[Any, Any, Any] | None) -> ConvergenceRule:
        """The end-of-epoch rule of this fit, going on from the last one's bookkeeping."""
        # n_iter_no_change=np.inf (scikit-learn's "never"): more epochs than can ever run
        patience = sys.maxsize if self.n_iter_no_change == np.inf else int(self.n_iter_no_change)
        rule = ConvergenceRule(
            n,
            self.learning_rate_init,
            solver=self.solver,
            learning_rate=self.learning_rate,
            power_t=self.power_t,
            tol=self.tol,
            n_iter_no_change=patience,
            score=None if val is None else self._scorer(*val),
            state=self._rule_state,
            verbose=bool(self.verbose),
        )
        # the rate the optimizer reached (sgd's invscaling and adaptive change it; partial_fit goes on)
        rule.lr = self._lr
        return rule

    def _diverged(
        self, params: list[np.ndarray], rule: ConvergenceRule, epochs: int, start: list[np.ndarray]
    ) -> list[np.ndarray]:
        """Weights gone non-finite, as scikit-learn goes on (its issue 29504): with early stopping
        the epochs left end with NaN weights (NaN loss, a validation score of NaN weights) and
        the best weights come back - those training started from when no score beat them;
        without it, or when the best are NaN, scikit-learn's ValueError."""
        if self.early_stopping:
            lost = [np.full_like(p, np.nan) for p in params]
            self._stopped = None
            while rule.epochs < epochs and self._stopped is None:
                self._stopped = rule.end_epoch(math.nan, lost).stop
            params = rule.best if rule.best is not None else start
        if self.early_stopping and all(np.isfinite(p).all() for p in params):
            return params
        raise EstimatorError(
            "Solver produced non-finite parameter weights. The input data may contain large "
            f"values and need to be preprocessed (training diverged; lower learning_rate_init, "
            f"now {self.learning_rate_init!r}, or scale the inputs)"
        )

    def _initialize(
        self, n_features: int, hidden: tuple[int, ...], Y: np.ndarray, rs: Any, dtype: Any
    ) -> None:
        """scikit-learn's ``_initialize``: Glorot-uniform weights drawn from ``rs`` in its order
        (each layer's coefficients, then its intercepts, first layer to output layer), in the
        data's ``dtype``."""
        factor = 2.0 if self.activation == "logistic" else 6.0
        units = [n_features, *hidden, Y.shape[1]]
        self.coefs_, self.intercepts_ = [], []
        for fan_in, fan_out in zip(units[:-1], units[1:]):
            bound = np.sqrt(factor / (fan_in + fan_out))
            self.coefs_.append(rs.uniform(-bound, bound, (fan_in, fan_out)).astype(dtype))
            self.intercepts_.append(rs.uniform(-bound, bound, fan_out).astype(dtype))
        self.n_iter_, self.t_ = 0, 0
        self.n_layers_ = len(units)
        self._rule_state: dict[str, Any] | None = None
        if hasattr(self, "_optimizer_state"):
            del self._optimizer_state

    def _split(
        self, X: Any, Y: np.ndarray, sw: np.ndarray | None, rs: Any
    ) -> tuple[Any, np.ndarray, np.ndarray | None, tuple[Any, Any, Any] | None]:
        """scikit-learn's early-stopping split: training samples, targets and weights, and the
        validation ``(X, labels or targets, weights)`` (None without early stopping)."""
        if not self.early_stopping:
            return X, Y, sw, None
        single = is_classifier(self) and Y.shape[1] == 1
        if dask_data.is_lazy(X):  # the same rows by index: the training rows stay on the cluster
            Xt, Yt, Xv, Yv, train, held = dask_data.split(
                self._client(), X, Y, rs, self.validation_fraction, stratify=single
            )
            if Xv.shape[0] < 2:
                raise EstimatorError(
                    "The validation set is too small. Increase 'validation_fraction' or the size "
                    "of your dataset."
                )
            swt, swv = (None, None) if sw is None else (sw[train], sw[held])
            return Xt, Yt, swt, (Xv, self._validation_targets(Yv), swv)
        # scikit-learn stratifies on its boolean targets (their names are in its messages)
        stratify = Y.astype(bool) if single else None
        parts = train_test_split(
            *((X, Y) if sw is None else (X, Y, sw)),
            random_state=rs,
            test_size=self.validation_fraction,
            stratify=stratify,
        )
        Xt, Xv, Yt, Yv = parts[:4]
        swt, swv = (None, None) if sw is None else (parts[4], parts[5])
        if Xv.shape[0] < 2:
            raise EstimatorError(
                "The validation set is too small. Increase 'validation_fraction' or the size of "
                "your dataset."
            )
        return Xt, Yt, swt, (Xv, self._validation_targets(Yv), swv)

    def _net(self) -> Network:
        return Network(_ACTIVATIONS[self.activation], self._loss_name, self._output_name, True)

    def _train(
        self,
        X: Any,
        Y: np.ndarray,
        sw: np.ndarray | None,
        hidden: tuple[int, ...],
        batch: int,
        epochs: int,
        rs: Any,
        rule: ConvergenceRule,
    ) -> list[np.ndarray]:
        dtype = np.dtype(Y.dtype)  # X's (the targets were cast to it): float32 end to end
        net = self._net()
        opt: dict[str, Any] = {"name": self.solver, "convention": "scikit-learn"}
        if self.solver == "adam":
            opt.update(beta1=self.beta_1, beta2=self.beta_2, eps=self.epsilon)
        else:
            opt.update(momentum=self.momentum, nesterov=bool(self.nesterovs_momentum))
        opt["steps"] = self._steps
        # (weights, biases): every layer's, in the kernels' (fan_out, fan_in) orientation
        init = (
            [np.asarray(c.T, dtype=dtype) for c in self.coefs_],
            [np.asarray(b, dtype=dtype) for b in self.intercepts_],
        )
        options = TrainingOptions(
            hidden=hidden,
            epochs=epochs,
            learning_rate=self._lr,
            init=init,
            dtype=dtype.name,
            batch_size=batch,
            shuffle=rs if self.shuffle else False,
            activation=net.activation,
            loss=net.loss,
            output=net.output,
            bias=True,
            optimizer=opt,
            alpha=self.alpha,
            reduction="mean",
            sample_weight=sw,
        )
        client = self._client()
        if client is None:
            job = prepare(X, Y, options, load=True)
            assert job.arrays is not None
            out = train_arrays(
                net.augment(job.arrays[0]),
                job.arrays[1],
                job.params0,
                job.recipe,
                rules=[rule],
                opt_state=self._optimizer_state,
                backend=resolve(self.backend, self.device),
            )
            params, stopped, state = out.params, out.stopped, out.optimizer_state
            self.result_: Any = out
        else:
            params, stopped, state = self._train_on_cluster(client, X, Y, batch, options, rule)
        self._stopped = stopped
        self._optimizer_state = state
        # the rule stops training on epoch ends only: so many steps were taken
        self._steps += rule.epochs * math.ceil(X.shape[0] / batch)
        self._lr = rule.lr
        return list(params)

    def _train_on_cluster(
        self,
        client: Any,
        X: np.ndarray,
        Y: np.ndarray,
        batch: int,
        options: TrainingOptions,
        rule: ConvergenceRule,
    ) -> tuple[list[np.ndarray], str | None, Any]:
        """:func:`dask_rpm.fit` on ``client``'s workers: the parameters, why it stopped, the
        optimizer's state."""
        from ..engine import fit  # only with a client: the serial path needs no distributed

        resume = None
        if self._optimizer_state is not None:  # partial_fit goes on with the optimizer's state
            resume = {
                "iteration": 0,
                "params": self._params(),
                "optimizer_state": self._optimizer_state,
            }
        per_epoch = math.ceil(X.shape[0] / batch)
        result = fit(
            X,
            Y,
            client=client,
            mapping=self.mapping,
            abilities=self.abilities,
            progress=self._progress(),
            backend=self.backend,
            device=self.device,
            callbacks=[rule],
            resume=resume,
            # a worker loss replays from the last epoch end, at that epoch's learning rate
            checkpoint_every=per_epoch if self.learning_rate != "constant" else None,
            options=options,
        )
        self.result_ = result
        return list(result.params), result.stopped, result.optimizer_state

    def _fit_lbfgs(self, X: Any, Y: np.ndarray, sw: np.ndarray | None = None) -> Any:
        """scikit-learn's ``_fit_lbfgs`` from the current weights (:mod:`dask_rpm.estimators.lbfgs`):
        scipy's L-BFGS-B here, the objective on the cluster or serially."""
        out = lbfgs.fit(
            X,
            Y,
            self.coefs_,
            self.intercepts_,
            self._net(),
            self.alpha,
            client=self._client(),
            cluster={
                "mapping": self.mapping,
                "abilities": self.abilities,
                "backend": self.backend,
                "device": self.device,
            },
            max_iter=self.max_iter,
            max_fun=self.max_fun,
            tol=self.tol,
            verbose=self.verbose,
            sample_weight=sw,
        )
        if not all(np.isfinite(a).all() for a in (*out.coefs, *out.intercepts)):
            raise EstimatorError(
                "Solver produced non-finite parameter weights. The input data may contain large "
                "values and need to be preprocessed."
            )
        # scikit-learn's lbfgs sets these (no loss_curve_, best_loss_ or validation scores)
        self.coefs_, self.intercepts_ = out.coefs, out.intercepts
        self.n_iter_, self.loss_ = out.n_iter, out.loss
        self.result_ = out
        self._stopped = str(out.optimize_result.message)  # scipy's reason
        self.stopped_: str | None = self._stopped
        self._set_model(self._params())
        return self

    def _store(self, params: list[np.ndarray], rule: ConvergenceRule) -> None:
        """scikit-learn's fitted attributes from the augmented parameters ``W_1 .. W_L, V`` and the
        rule's bookkeeping."""
        net = self._net()
        weights, biases = net.split_params(params)
        self.coefs_ = [np.array(w.T) for w in weights]
        self.intercepts_ = [np.array(b) for b in biases]
        self.n_iter_ = rule.epochs
        self.t_ = rule.t
        self.loss_curve_ = list(rule.loss_curve)
        self.loss_ = self.loss_curve_[-1]
        self._rule_state = rule.state()
        self._no_improvement_count = rule.no_improvement
        # scikit-learn's: validation scores with early stopping, else the best training loss
        early = bool(self.early_stopping)
        self.validation_scores_: list[float] | None = (
            list(rule.validation_scores) if early else None
        )
        self.best_validation_score_: float | None = rule.best_score if early else None
        self.best_loss_: float | None = None if early else rule.best_loss
        self.stopped_ = self._stopped
        self._set_model(params)

    def _set_model(self, params: list[np.ndarray]) -> None:
        """``model_`` of the augmented parameters ``params``."""
        # MLPModel (save, load, to_torch) holds one hidden layer's W and V; deeper: no model yet
        self.model_: MLPModel | None = None
        if len(params) != 2:
            return
        self.model_ = MLPModel(
            params[0],
            params[1],
            self._net(),
            classes=getattr(self, "classes_", None) if self._output_name != "linear" else None,
            meta={
                "estimator": type(self).__name__,
                "dask_rpm_version": __version__,
                # scikit-learn's parameters as trained (plain values; the client and plans stay out)
                "params": {
                    k: (list(v) if isinstance(v, tuple) else v)
                    for k, v in self.get_params(deep=False).items()
                    if v is None or isinstance(v, (bool, int, float, str, tuple))
                },
                "loss_curve": list(getattr(self, "loss_curve_", [])),  # lbfgs has none
                "validation": [],
            },
        )

    # ------------------------------------------------------------- fitted
    def _forward(self, X: np.ndarray) -> np.ndarray:
        """The outputs of the network ``coefs_`` / ``intercepts_`` hold, by the kernels that train
        it (:func:`dask_rpm.nn.recipe.forward`)."""
        return forward(X, self._params(), self._net())

    def _params(self) -> list[np.ndarray]:
        """The augmented parameters ``W_1 .. W_L, V`` that ``coefs_`` / ``intercepts_`` hold."""
        net = self._net()
        return net.join_params([c.T for c in self.coefs_], list(self.intercepts_))

    def _check_predict_X(self, X: Any) -> np.ndarray:
        check_is_fitted(self, "coefs_")
        return validate_data(
            self, X, reset=False, accept_sparse=["csr", "csc"], dtype=(np.float64, np.float32)
        )

    def save(self, path: Any, *, overwrite: bool = False) -> str:
        """Write the fitted model (:meth:`dask_rpm.MLPModel.save`: an existing file only with
        ``overwrite=True``); :meth:`dask_rpm.MLPModel.load` reads it."""
        check_is_fitted(self, "model_")
        if self.model_ is None:
            raise EstimatorError(
                f"save writes a dask_rpm.MLPModel, which holds one hidden layer; this network has "
                f"{len(self.coefs_) - 1}: pickle the estimator instead (pickle.dump(est, file))"
            )
        return self.model_.save(path, overwrite=overwrite)
