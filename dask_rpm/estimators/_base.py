"""The training loop the estimators share: scikit-learn's ``BaseMultilayerPerceptron`` on dask_rpm.

:class:`MLPBase` resolves the parameters, draws the initial weights and the
early-stopping split from scikit-learn's generator in scikit-learn's order,
and trains with :func:`dask_rpm.fit` (a client) or the serial loop (none),
both ending each epoch with a :class:`dask_rpm.nn.convergence.ConvergenceRule`.
:mod:`dask_rpm.estimators` holds the public classes and says what makes
their model scikit-learn's.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
from sklearn.base import BaseEstimator, is_classifier
from sklearn.exceptions import ConvergenceWarning
from sklearn.model_selection import train_test_split
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_is_fitted, validate_data

from .._version import __version__
from ..model.mlp import MLPModel
from ..nn.backend import resolve
from ..nn.convergence import LEARNING_RATE_SCHEDULES, ConvergenceRule
from ..nn.network import Network
from ..nn.options import TrainingOptions
from ..nn.prepare import prepare
from ..nn.recipe import forward
from ..nn.serial import train_arrays

__all__ = ["EstimatorError", "MLPBase"]


class EstimatorError(ValueError):
    """Invalid estimator input (data or hyperparameters); the message says what is valid."""


_ACTIVATIONS = {"logistic": "sigmoid", "tanh": "tanh", "relu": "relu"}


class MLPBase(BaseEstimator):
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
        return tuple(int(h) for h in sizes)

    # ------------------------------------------------------------- training
    def _fit(self, X: Any, y: Any, incremental: bool, classes: Any = None) -> Any:
        p = self._resolved()
        hidden = self._check_params(p)
        first_pass = not hasattr(self, "coefs_") or (not p["warm_start"] and not incremental)
        fitted = () if first_pass else tuple(c.shape[1] for c in self.coefs_[:-1])
        if fitted and fitted != hidden:
            raise EstimatorError(
                f"hidden_layer_sizes={hidden!r}, but {'partial_fit' if incremental else 'warm_start'} "
                f"goes on with the fitted network's hidden layers {fitted!r}: fit it anew "
                f"(warm_start=False) to train other sizes"
            )
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
            verbose=bool(p["verbose"]),
        )
        # the rate the optimizer reached (sgd's invscaling and adaptive change it; partial_fit goes on)
        rule.lr = self._lr
        params = self._train(
            Xt, Yt, hidden, batch, 1 if incremental else p["max_iter"], rs, p, rule
        )
        if rule.best is not None:  # early stopping: the weights of the best validation score
            params = rule.best
        self._store(params, rule, p)
        if not incremental and rule.epochs == p["max_iter"] and not self._stopped:
            warnings.warn(
                f"Stochastic Optimizer: Maximum iterations ({p['max_iter']}) reached and the "
                f"optimization hasn't converged yet.",
                ConvergenceWarning,
                stacklevel=3,
            )
        return self

    def _initialize(
        self, n_features: int, hidden: tuple[int, ...], Y: np.ndarray, rs: Any, p: dict[str, Any]
    ) -> None:
        """scikit-learn's ``_initialize``: Glorot-uniform weights drawn from ``rs`` in its order
        (each layer's coefficients, then its intercepts, first layer to output layer)."""
        factor = 2.0 if p["activation"] == "logistic" else 6.0
        units = [n_features, *hidden, Y.shape[1]]
        self.coefs_, self.intercepts_ = [], []
        for fan_in, fan_out in zip(units[:-1], units[1:]):
            bound = np.sqrt(factor / (fan_in + fan_out))
            self.coefs_.append(rs.uniform(-bound, bound, (fan_in, fan_out)))
            self.intercepts_.append(rs.uniform(-bound, bound, fan_out))
        self.n_iter_, self.t_ = 0, 0
        self.n_layers_ = len(units)
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
        hidden: tuple[int, ...],
        batch: int,
        epochs: int,
        rs: Any,
        p: dict[str, Any],
        rule: ConvergenceRule,
    ) -> list[np.ndarray]:
        net = self._net(p)
        opt: dict[str, Any] = {"name": p["solver"], "convention": "scikit-learn", "steps": 0}
        if p["solver"] == "adam":
            opt.update(beta1=p["beta_1"], beta2=p["beta_2"], eps=p["epsilon"])
        else:
            opt.update(momentum=p["momentum"], nesterov=bool(p["nesterovs_momentum"]))
        opt["steps"] = self._steps
        # (weights, biases): every layer's, in the kernels' (fan_out, fan_in) orientation
        init = ([c.T for c in self.coefs_], list(self.intercepts_))
        options = TrainingOptions(
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
            job = prepare(X, Y, options, load=True)
            assert job.arrays is not None
            out = train_arrays(
                net.augment(job.arrays[0]),
                job.arrays[1],
                job.params0,
                job.recipe,
                rules=[rule],
                opt_state=self._optimizer_state,
                backend=resolve(p["backend"], p["device"]),
            )
            params, stopped, state = out["params"], out["stopped"], out["optimizer_state"]
            self.result_: Any = out
        else:
            params, stopped, state = self._train_on_cluster(client, X, Y, batch, options, p, rule)
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
        return list(params)

    def _train_on_cluster(
        self,
        client: Any,
        X: np.ndarray,
        Y: np.ndarray,
        batch: int,
        options: TrainingOptions,
        p: dict[str, Any],
        rule: ConvergenceRule,
    ) -> tuple[list[np.ndarray], str | None, Any]:
        """:func:`dask_rpm.fit` on ``client``'s workers: the parameters, why it stopped, the
        optimizer's state."""
        from ..engine import fit  # only with a client: the serial path needs no distributed

        resume = None
        if self._optimizer_state is not None:  # partial_fit goes on with the optimizer's state
            params0 = self._params()
            resume = {
                "iteration": 0,
                "params": params0,
                "W": params0[0],
                "V": params0[-1],
                "optimizer_state": self._optimizer_state,
            }
        per_epoch = math.ceil(X.shape[0] / batch)
        result = fit(
            X,
            Y,
            client=client,
            mapping=p["mapping"],
            abilities=p["abilities"],
            progress=p["progress"],
            backend=p["backend"],
            device=p["device"],
            callbacks=[rule],
            resume=resume,
            # a worker loss replays from the last epoch end, at that epoch's learning rate
            checkpoint_every=per_epoch if p["learning_rate"] != "constant" else None,
            options=options,
        )
        self.result_ = result
        # a FitResult of one hidden layer may not carry the list yet: its W, V are the list
        params = list(getattr(result, "params", None) or (result.W, result.V))
        return params, result.stopped, result.optimizer_state

    def _store(self, params: list[np.ndarray], rule: ConvergenceRule, p: dict[str, Any]) -> None:
        """scikit-learn's fitted attributes from the augmented parameters ``W_1 .. W_L, V`` and the
        rule's bookkeeping."""
        net = self._net(p)
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
        early = bool(p["early_stopping"])
        self.validation_scores_: list[float] | None = (
            list(rule.validation_scores) if early else None
        )
        self.best_validation_score_: float | None = rule.best_score if early else None
        self.best_loss_: float | None = None if early else rule.best_loss
        self.stopped_ = self._stopped
        # MLPModel (save, load, to_torch) holds one hidden layer's W and V; deeper: no model yet
        self.model_: MLPModel | None = None
        if len(params) != 2:
            return
        self.model_ = MLPModel(
            params[0],
            params[1],
            net,
            classes=getattr(self, "classes_", None) if self._output_name != "linear" else None,
            meta={
                "estimator": type(self).__name__,
                "dask_rpm_version": __version__,
                # scikit-learn's parameters as trained (plain values; the client and plans stay out)
                "params": {
                    k: (list(v) if isinstance(v, tuple) else v)
                    for k, v in p.items()
                    if v is None or isinstance(v, (bool, int, float, str, tuple))
                },
                "loss_curve": self.loss_curve_,
                "validation": [],
            },
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

    client: Any

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
        """The outputs of the network ``coefs_`` / ``intercepts_`` hold, by the kernels that train
        it (:func:`dask_rpm.nn.recipe.forward`)."""
        return forward(X, self._params(), self._net(self._resolved()))

    def _params(self) -> list[np.ndarray]:
        """The augmented parameters ``W_1 .. W_L, V`` that ``coefs_`` / ``intercepts_`` hold."""
        net = self._net(self._resolved())
        return net.join_params([c.T for c in self.coefs_], list(self.intercepts_))

    def _check_predict_X(self, X: Any) -> np.ndarray:
        check_is_fitted(self, "coefs_")
        return validate_data(self, X, reset=False, dtype=(np.float64, np.float32))

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
