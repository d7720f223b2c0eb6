""":class:`CNNClassifier`: a convolutional network as a scikit-learn classifier, trained by dask_rpm.

The CNN of ``fit(network=...)`` (:mod:`dask_rpm.nn.cnn`) with scikit-learn's conventions: the
parameters of scikit-learn's ``MLPClassifier`` that a CNN keeps (its stochastic solvers, their
settings and the epoch rule ``tol`` / ``n_iter_no_change``), ``fit`` / ``predict`` /
``predict_proba`` / ``score``, ``clone`` and ``get_params``. It trains as
:class:`dask_rpm.MLPClassifier` does:

* each iteration steps on the batch mean plus ``alpha W / batch`` (``reduction="mean"``) by
  scikit-learn's Adam or SGD arithmetic (``convention="scikit-learn"``);
* the epochs are shuffled by ``check_random_state(random_state)``'s cumulative shuffles, and
  the epoch loss, stopping and learning-rate schedules are a
  :class:`dask_rpm.nn.convergence.ConvergenceRule`, run at epoch ends serially and on a
  cluster alike;
* with a ``client`` (or a default client in this process) it trains with
  :func:`dask_rpm.fit` on the workers, else serially with :func:`dask_rpm.fit_serial`: the same
  model either way (float64, to rounding).

The initial weights are those of ``network`` when it is a ``torch.nn.Sequential`` (trained on a
copy: the module given is left as it is), or drawn from ``random_state`` for layer records.
Not supported: ``solver="lbfgs"``, early stopping, ``partial_fit`` and ``sample_weight``.

Needs scikit-learn (the optional extra ``sklearn``); a ``torch.nn.Sequential`` network and
:meth:`CNNClassifier.to_torch` need PyTorch.
"""

from __future__ import annotations

import copy
import math
import sys
import warnings
from numbers import Integral
from typing import Any, ClassVar

import numpy as np
from sklearn.base import ClassifierMixin, _fit_context
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils import check_random_state
from sklearn.utils._param_validation import (
    HasMethods,
    InvalidParameterError,
    StrOptions,
)
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_array, check_is_fitted, column_or_1d

from .._version import __version__
from ..model.cnn import CNNModel
from ..nn.chunked import chunked_inputs, is_chunked
from ..nn.cnn_records import conv_layers
from ..nn.convergence import ConvergenceRule
from ..nn.options import TrainingOptions
from . import dask_data
from ._base import CLUSTER_CONSTRAINTS, SOLVER_CONSTRAINTS, ClusterEstimator
from .errors import EstimatorError

__all__ = ["CNNClassifier"]


class CNNClassifier(ClassifierMixin, ClusterEstimator):
    """A convolutional network classifier with scikit-learn's conventions, trained by dask_rpm.

    Parameters
    ----------
    network : torch.nn.Sequential or list of layer records
        The network (:mod:`dask_rpm.nn.cnn`: ``Conv2d``, ``MaxPool2d`` / ``AvgPool2d``,
        ``Flatten``, ``Linear``, ``ReLU`` / ``Tanh`` / ``Sigmoid``), ending with a ``Linear`` of
        one output per class (softmax and cross-entropy are the loss's). A module's weights are
        the initial weights (``fit`` trains a copy); records such as ``[{"conv": 6,
        "kernel": 3}, "relu", {"maxpool": 2}, "flatten", {"linear": 10}]`` are drawn from
        ``random_state``.
    image_shape : (channels, height, width), optional
        Lets ``fit`` and ``predict`` take 2-D ``X`` of ``channels x height x width`` columns,
        each row an image flattened channel-major (``images.reshape(samples, -1)``), e.g. after
        a scikit-learn transformer in a ``Pipeline``. None: ``X`` must be 4-D.
    solver : {"adam", "sgd"}, default "adam"
    alpha : float, default 0.0001
        L2 penalty on the weights (not the biases), scikit-learn's.
    batch_size : int or "auto", default "auto"
        Samples per step; ``"auto"`` is ``min(200, samples)``.
    learning_rate : {"constant", "invscaling", "adaptive"}, default "constant"
    learning_rate_init, power_t, momentum, nesterovs_momentum, beta_1, beta_2, epsilon
        scikit-learn's ``MLPClassifier``'s, with its defaults and meaning.
    max_iter : int, default 200
        Epochs at most.
    shuffle : bool, default True
        Shuffle the samples every epoch.
    random_state : int, RandomState or None
        The epochs' shuffles and, for layer records, the initial weights.
    tol : float, default 1e-4
    n_iter_no_change : int, default 10
        Stop when the epoch loss has not improved by ``tol`` for more than so many epochs.
    verbose : bool, default False
        Print scikit-learn's per-epoch lines.
    warm_start : bool, default False
        ``fit`` goes on from the fitted weights (and the loss curve) with a new optimizer, as
        scikit-learn's.
    client : distributed.Client, optional
        Train on this cluster; None: the default client if any, else serially.
    mapping, abilities, progress
        As in :func:`dask_rpm.fit` (ignored when training serially).
    backend, device
        Where the kernels run, as in :func:`dask_rpm.fit` (serially too).

    Attributes
    ----------
    classes_ : numpy.ndarray
        The labels, sorted; the network's outputs in this order.
    image_shape_ : tuple of int
        ``(channels, height, width)`` of the training images.
    n_features_in_ : int
        ``channels x height x width``.
    n_iter_ : int
        Epochs trained (over every warm-started ``fit``, as scikit-learn counts them).
    t_ : int
        Samples trained on.
    loss_, loss_curve_, best_loss_
        scikit-learn's: the per-sample mean loss with the L2 penalty of the last epoch, of
        every epoch, and the best.
    model_ : CNNModel
        The trained network (predict, save, load, to_torch).
    result_ : FitResult or SerialResult
        What :func:`dask_rpm.fit` (or :func:`dask_rpm.fit_serial`) returned for the last fit.
    stopped_ : str or None
        Why training stopped before ``max_iter``, else None.

    Raises
    ------
    sklearn.utils._param_validation.InvalidParameterError
        (from ``fit``) A parameter of the wrong type or range.
    dask_rpm.nn.cnn.NetworkSpecError
        (from ``fit``) A network dask_rpm cannot train, or one whose last ``Linear`` does not
        have one output per class.
    EstimatorError
        (from ``fit`` / ``predict``) ``X`` that is not images of the fitted shape, or labels
        ``fit`` cannot train on.

    Examples
    --------
    >>> import torch
    >>> net = torch.nn.Sequential(
    ...     torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
    ...     torch.nn.Flatten(), torch.nn.Linear(4 * 4 * 4, 10))
    >>> clf = CNNClassifier(net, max_iter=5, random_state=0)  # doctest: +SKIP
    >>> clf.fit(images, labels).score(images, labels)  # images (n, 1, 8, 8)  # doctest: +SKIP
    """

    _parameter_constraints: ClassVar[dict[str, list[Any]]] = {
        "network": [list, tuple, HasMethods(["forward", "parameters"])],
        "image_shape": [None, "array-like"],
        "solver": [StrOptions({"adam", "sgd"})],
        **SOLVER_CONSTRAINTS,
        **CLUSTER_CONSTRAINTS,
    }
    _unsupported: ClassVar[dict[str, dict[str, str]]] = {
        "solver": {
            "lbfgs": "CNNClassifier does not support 'lbfgs' (MLPClassifier and MLPRegressor do): "
            "it trains with the mini-batch solvers 'adam' and 'sgd'",
        },
    }

    def __init__(
        self,
        network: Any,
        *,
        image_shape: Any = None,
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
        beta_1: float = 0.9,
        beta_2: float = 0.999,
        epsilon: float = 1e-8,
        n_iter_no_change: int = 10,
        client: Any = None,
        mapping: Any = None,
        abilities: Any = None,
        progress: Any = None,
        backend: str | None = None,
        device: str | None = None,
    ) -> None:
        self.network = network
        self.image_shape = image_shape
        self.solver = solver
        self.alpha = alpha
        self.batch_size = batch_size
        self.learning_rate = learning_rate
        self.learning_rate_init = learning_rate_init
        self.power_t = power_t
        self.max_iter = max_iter
        self.shuffle = shuffle
        self.random_state = random_state
        self.tol = tol
        self.verbose = verbose
        self.warm_start = warm_start
        self.momentum = momentum
        self.nesterovs_momentum = nesterovs_momentum
        self.beta_1 = beta_1
        self.beta_2 = beta_2
        self.epsilon = epsilon
        self.n_iter_no_change = n_iter_no_change
        self.client = client
        self.mapping = mapping
        self.abilities = abilities
        self.progress = progress
        self.backend = backend
        self.device = device

    # ------------------------------------------------------------- data
    def _image_shape_param(self) -> tuple[int, int, int]:
        """``image_shape`` as three positive integers, or scikit-learn's error saying so."""
        shape = self.image_shape
        try:
            dims = tuple(shape)
        except TypeError:
            dims = ()
        if len(dims) != 3 or any(
            isinstance(v, (bool, np.bool_)) or not isinstance(v, Integral) or v < 1 for v in dims
        ):
            raise InvalidParameterError(
                f"The 'image_shape' parameter of {type(self).__name__} must be None or "
                f"(channels, height, width), three positive integers. Got {shape!r} instead: "
                f"give e.g. (1, 8, 8)"
            )
        return tuple(int(v) for v in dims)  # type: ignore[return-value]

    def _images(self, X: Any, *, reset: bool) -> Any:
        """``X`` as float64 images ``(samples, channels, height, width)``; on ``reset`` their shape
        becomes the fitted one, else it must be. A dask array stays one (its values are checked
        on the workers as training starts)."""
        lazy = dask_data.is_lazy(X)
        a = X if hasattr(X, "ndim") else np.asarray(X)
        if a.ndim == 2 and self.image_shape is not None:
            c, h, w = self._image_shape_param()
            if a.shape[1] != c * h * w:
                raise EstimatorError(
                    f"X has shape {a.shape}; with image_shape={(c, h, w)} each row holds one "
                    f"image flattened, {c * h * w} columns: give X of shape (samples, {c * h * w}) "
                    f"or set image_shape to the images' shape"
                )
            a = (a if lazy else np.asarray(a)).reshape(a.shape[0], c, h, w)
        if a.ndim != 4:
            hint = (
                " (or rows of flattened images with image_shape=(channels, height, width))"
                if a.ndim == 2
                else ""
            )
            raise EstimatorError(
                f"X has shape {tuple(a.shape)}; {type(self).__name__} takes images (samples, "
                f"channels, height, width){hint}: e.g. X.reshape(-1, 1, 8, 8) for 8x8 "
                f"grey-scale images"
            )
        if lazy:  # check_array's checks but the values' (checked on the workers)
            dask_data.numeric(a)
            a = a.astype(np.float64)
        else:
            a = check_array(a, allow_nd=True, dtype=np.float64, order="C")
        if reset:
            self.image_shape_ = tuple(int(v) for v in a.shape[1:])
            self.n_features_in_ = int(np.prod(a.shape[1:]))
        elif tuple(a.shape[1:]) != self.image_shape_:
            raise EstimatorError(
                f"X holds images of shape {tuple(a.shape[1:])}; this classifier was fitted on "
                f"{self.image_shape_} (channels, height, width)"
            )
        return a

    def _targets(self, y: Any, X: Any, *, reset: bool) -> Any:
        """One-hot targets ``(samples, classes)`` of labels ``y``; on ``reset`` their classes
        become ``classes_``. Dask's ``X``: labels found and encoded on the workers."""
        lazy = dask_data.is_lazy(X)
        n = X.shape[0]
        if lazy:
            y = dask_data.aligned(y, X)
            if y.ndim == 2 and y.shape[1] == 1:
                y = y[:, 0]
        else:
            y = column_or_1d(y, warn=True)
        if y.ndim != 1 or y.shape[0] != n:
            raise EstimatorError(
                f"X has {n} sample(s) but y has shape {tuple(y.shape)}; give one label per image"
            )
        found = dask_data.unique(self._client(), y) if lazy else np.unique(y)
        check_classification_targets(found)
        if reset:
            self.classes_ = found
            if len(self.classes_) < 2:
                raise EstimatorError(
                    f"y has only one class ({self.classes_[0]!r}); a classifier needs at least 2"
                )
        else:
            unseen = np.setdiff1d(found, self.classes_)
            if len(unseen):
                raise EstimatorError(
                    f"y has labels {list(unseen)} that are not in classes_ {list(self.classes_)}; "
                    f"warm_start goes on with the fitted classes: fit anew (warm_start=False) to "
                    f"train others"
                )
        return (y[:, None] == self.classes_[None, :]).astype(np.float64)

    # ------------------------------------------------------------- training
    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X: Any, y: Any) -> CNNClassifier:
        """Fit the network to images ``X`` ``(samples, channels, height, width)`` and labels ``y``
        ``(samples,)``; returns self. Dask's ``X`` and ``y`` (dask arrays chunked along samples,
        xarray with a ``sample`` dimension) train where their chunks are on a cluster, and are
        computed first without one."""
        if is_chunked(X, y):
            if self._client() is None:
                X, y = dask_data.images(X, y)
            else:
                X = chunked_inputs(X)
        first = not (self.warm_start and hasattr(self, "model_"))
        X = self._images(X, reset=first)
        Y = self._targets(y, X, reset=first)
        network = self._network()
        rs = check_random_state(self.random_state)
        # drawn first, for every kind of network: the shuffles are the same for a module and records
        seed = int(rs.randint(np.iinfo(np.int32).max))
        n = X.shape[0]
        batch = self._batch(n)
        if first:
            self.n_iter_ = 0
            self._rule_state: dict[str, Any] | None = None
        patience = sys.maxsize if self.n_iter_no_change == np.inf else int(self.n_iter_no_change)
        rule = ConvergenceRule(
            n,
            self.learning_rate_init,
            solver=self.solver,
            learning_rate=self.learning_rate,
            power_t=self.power_t,
            tol=self.tol,
            n_iter_no_change=patience,
            state=self._rule_state,
            verbose=bool(self.verbose),
        )
        options = TrainingOptions(
            network=network,
            seed=seed,
            epochs=self.max_iter,
            learning_rate=float(self.learning_rate_init),
            dtype="float64",
            batch_size=batch,
            shuffle=rs if self.shuffle else False,
            loss="cross-entropy",
            optimizer=self._optimizer(),
            alpha=self.alpha,
            reduction="mean",
        )
        result = self._train(X, Y, batch, options, rule)
        if result.stopped and "diverged" in result.stopped:
            raise EstimatorError(
                "Solver produced non-finite parameter weights. The input data may contain large "
                f"values and need to be preprocessed ({result.stopped}; or lower "
                f"learning_rate_init, now {self.learning_rate_init!r})"
            )
        self._fitted(result, rule)
        if rule.epochs == self.max_iter and not result.stopped:
            warnings.warn(
                f"Stochastic Optimizer: Maximum iterations ({self.max_iter}) reached and the "
                f"optimization hasn't converged yet.",
                ConvergenceWarning,
                stacklevel=2,
            )
        return self

    def _batch(self, n: int) -> int:
        """scikit-learn's batch: ``min(200, n)`` for "auto", else clipped to ``[1, n]`` (warned)."""
        if self.batch_size == "auto":
            return min(200, n)
        if self.batch_size > n:
            warnings.warn(
                "Got `batch_size` less than 1 or larger than sample size. It is going to be "
                "clipped",
                stacklevel=2,
            )
        return int(np.clip(self.batch_size, 1, n))

    def _optimizer(self) -> dict[str, Any]:
        """The solver as :func:`dask_rpm.fit`'s ``optimizer`` (scikit-learn's arithmetic)."""
        opt: dict[str, Any] = {"name": self.solver, "convention": "scikit-learn"}
        if self.solver == "adam":
            opt.update(beta1=self.beta_1, beta2=self.beta_2, eps=self.epsilon)
        else:
            opt.update(momentum=self.momentum, nesterov=bool(self.nesterovs_momentum))
        return opt

    def _fitted(self, result: Any, rule: ConvergenceRule) -> None:
        """The fitted attributes from a training result and its epoch rule."""
        self.result_: Any = result
        self.stopped_: str | None = result.stopped
        self.n_iter_ += rule.epochs
        self.t_ = rule.t
        self.loss_curve_ = list(rule.loss_curve)
        self.loss_ = self.loss_curve_[-1]
        self.best_loss_ = rule.best_loss
        self._rule_state = rule.state()
        self.model_ = CNNModel.from_result(
            result,
            classes=self.classes_,
            meta={
                "estimator": type(self).__name__,
                # the parameters as trained (plain values; the network is the file's own record)
                "params": {
                    k: (list(v) if isinstance(v, tuple) else v)
                    for k, v in self.get_params(deep=False).items()
                    if v is None or isinstance(v, (bool, int, float, str, tuple))
                },
                "loss_curve": self.loss_curve_,
                "dask_rpm_version": __version__,
            },
        )

    def _network(self) -> Any:
        """The network ``fit`` trains: a copy of ``network`` (checked against the images and
        classes), or with ``warm_start`` a module holding the fitted weights."""
        image, k = self.image_shape_, len(self.classes_)
        layers = conv_layers(self.network, image, k)  # a NetworkSpecError says what does not fit
        if not (self.warm_start and hasattr(self, "model_")):
            if isinstance(self.network, (list, tuple)):
                return list(self.network)
            return copy.deepcopy(self.network)  # the user's module keeps its weights
        if layers.records() != self.model_.layers.records():
            raise EstimatorError(
                f"warm_start goes on with the fitted network {self.model_.records}, but network "
                f"is now {layers.spec()}: fit it anew (warm_start=False) to train another network"
            )
        return self.model_.to_torch(output_layer=False)

    def _train(
        self,
        X: np.ndarray,
        Y: np.ndarray,
        batch: int,
        options: TrainingOptions,
        rule: ConvergenceRule,
    ) -> Any:
        """:func:`dask_rpm.fit` on the client's workers, or :func:`dask_rpm.fit_serial` without one."""
        client = self._client()
        if client is None:
            from ..nn.serial import fit_serial  # here, beside the engine's import below

            return fit_serial(
                X, Y, options=options, callbacks=[rule], backend=self.backend, device=self.device
            )
        from ..engine import fit  # only with a client: the serial path needs no distributed

        return fit(
            X,
            Y,
            client=client,
            mapping=self.mapping,
            abilities=self.abilities,
            progress=self.progress,
            backend=self.backend,
            device=self.device,
            callbacks=[rule],
            # a worker loss replays from the last epoch end, at that epoch's learning rate
            checkpoint_every=math.ceil(X.shape[0] / batch)
            if self.learning_rate != "constant"
            else None,
            options=options,
        )

    # ------------------------------------------------------------- fitted
    def predict(self, X: Any) -> Any:
        """Class labels of images ``X``, ``(samples,)`` (a dask array computed on the workers for
        Dask's ``X``, chunked along samples)."""
        if is_chunked(X):
            return self._lazy("predict", X)
        check_is_fitted(self, "model_")
        return self.model_.predict(self._images(X, reset=False))

    def predict_proba(self, X: Any) -> Any:
        """Class probabilities ``(samples, classes)``, columns in the order of ``classes_`` (a
        dask array computed on the workers for Dask's ``X``)."""
        if is_chunked(X):
            return self._lazy("predict_proba", X)
        check_is_fitted(self, "model_")
        return self.model_.predict_proba(self._images(X, reset=False))

    def predict_log_proba(self, X: Any) -> Any:
        """Logarithms of :meth:`predict_proba`."""
        if is_chunked(X):
            return self._lazy("predict_log_proba", X)
        with np.errstate(divide="ignore"):
            return np.log(self.predict_proba(X))

    def score(self, X: Any, y: Any, sample_weight: Any = None) -> float:
        """scikit-learn's mean accuracy of :meth:`predict`; for Dask's images computed by
        reductions on the workers."""
        if is_chunked(X, y) or dask_data.is_lazy(sample_weight):
            return dask_data.score(self, X, y, sample_weight, "accuracy")
        return float(super().score(X, y, sample_weight=sample_weight))

    def to_torch(self, *, output_layer: bool = True) -> Any:
        """The trained network as a ``torch.nn.Sequential`` (float64), :meth:`dask_rpm.CNNModel.to_torch`:
        with ``Softmax(dim=1)`` after it (its outputs are :meth:`predict_proba`'s), or without
        (``output_layer=False``: the logits, the module to go on training in PyTorch)."""
        check_is_fitted(self, "model_")
        return self.model_.to_torch(output_layer=output_layer)

    def save(self, path: Any, *, overwrite: bool = False) -> str:
        """Write the fitted model (:meth:`dask_rpm.CNNModel.save`: an existing file only with
        ``overwrite=True``); :meth:`dask_rpm.CNNModel.load` reads it."""
        check_is_fitted(self, "model_")
        return self.model_.save(path, overwrite=overwrite)
