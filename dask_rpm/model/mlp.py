"""A trained network to use: predict, score, save and load, export to PyTorch.

Pure (numpy and xarray; PyTorch only inside :meth:`MLPModel.to_torch`): a
model is applied on the client or anywhere else, with no cluster. It holds
the weights *as planned* (augmented with the bias input and bias unit when
the network has bias terms, :mod:`dask_rpm.nn.network`), so a model's outputs
are computed by the same kernels (:func:`dask_rpm.nn.recipe.forward`) that
trained it, and a saved model reloads bit for bit.

File format
-----------
One netCDF file, written atomically; each weight matrix under its name
(``W`` and ``V`` for one hidden layer, ``W1 .. WL`` and ``V`` deeper), the
network, classes, target scale and ``meta`` as variables and attributes
(:mod:`dask_rpm.model.files`, which also reads the files of older formats).
:meth:`MLPModel.load` refuses any other file with a message saying what it
is and what to give instead.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .._version import __version__
from ..nn.kernels import Workspace
from ..nn.layers import Layers, layers_of_params
from ..nn.network import Network
from ..nn.recipe import forward, recipe_summary
from ..results import validation_rows
from .files import (
    FORMAT_VERSION,
    ModelError,
    model_dataset,
    model_parts,
    read_model_file,
    save_dataset,
)

__all__ = ["MLPModel", "ModelError", "FORMAT_VERSION", "score_predictions"]


def score_predictions(p: np.ndarray, y: Any, classifier: bool) -> float:
    """Accuracy of labels ``p`` against ``y`` (``classifier``), else R^2 of outputs ``p``
    ``(samples, outputs)`` against ``y``, averaged uniformly over outputs as scikit-learn's
    ``r2_score``: what every model's ``score`` computes.

    Raises
    ------
    ModelError
        ``y`` does not have the predictions' shape.
    """
    y = np.asarray(y)
    if classifier:
        if y.shape != p.shape:
            raise ModelError(f"y has shape {y.shape}; give one label per sample, shape {p.shape}")
        return float(np.mean(p == y))
    if y.ndim == 1 and p.shape[1] == 1:
        y = y[:, None]
    if y.shape != p.shape:
        raise ModelError(f"y has shape {y.shape}; give targets of shape {p.shape}")
    y = y.astype(np.float64)
    ss_res = ((y - p) ** 2).sum(axis=0)
    ss_tot = ((y - y.mean(axis=0)) ** 2).sum(axis=0)
    # a constant target: 1 if predicted exactly, else 0 (scikit-learn's convention)
    r2 = np.where(
        ss_tot > 0,
        1.0 - ss_res / np.where(ss_tot > 0, ss_tot, 1.0),
        (ss_res == 0).astype(float),
    )
    return float(np.mean(r2))


class MLPModel:
    """A trained multi-layer perceptron (one or more hidden layers).

    Parameters
    ----------
    W, V : numpy.ndarray
        The weights of a network of one hidden layer, as planned: ``W`` is
        ``(m, n)`` and ``V`` is ``(l, m)``, or with ``net.bias`` ``(m + 1, n + 1)``
        and ``(l, m + 1)`` (hidden biases in the last column of ``W``, the bias
        unit as its last row, output biases in the last column of ``V``;
        :class:`dask_rpm.nn.network.Network`). Any depth: :meth:`from_params`.
    net : Network
        Activation, loss, output layer and bias of the trained network.
    classes : array_like, optional
        Class labels of the outputs, in output order: the model is a
        classifier. A softmax network without labels is a classifier of the
        classes ``0 .. l-1``.
    meta : dict, optional
        JSON-serializable information kept with the model (hyperparameters,
        loss curve, plan history, emulation label, ``dask_rpm_version``).
    target_shift, target_scale : array_like, optional
        Regression: predictions are ``outputs * target_scale + target_shift``
        (how :class:`dask_rpm.MLPRegressor` undoes its target standardization).

    Attributes
    ----------
    params : list of numpy.ndarray
        ``W_1 .. W_L, V`` as planned (one hidden layer: ``params[0]`` and ``params[-1]`` are
        the paper's ``W`` and ``V``).
    layers : Layers
        The sizes as planned (:class:`dask_rpm.nn.layers.Layers`: bias units included).

    Raises
    ------
    ModelError
        Shapes that do not fit together or with ``net``; classes that do not
        match the outputs.
    """

    def __init__(
        self,
        W: np.ndarray,
        V: np.ndarray,
        net: Network,
        classes: Any = None,
        meta: Mapping[str, Any] | None = None,
        *,
        target_shift: Any = None,
        target_scale: Any = None,
    ) -> None:
        self._build([W, V], net, classes, meta, target_shift, target_scale)

    @classmethod
    def from_params(
        cls,
        params: Sequence[np.ndarray],
        net: Network,
        classes: Any = None,
        meta: Mapping[str, Any] | None = None,
        *,
        target_shift: Any = None,
        target_scale: Any = None,
    ) -> MLPModel:
        """The model of a network of any depth from its parameters ``W_1 .. W_L, V``.

        Parameters
        ----------
        params : sequence of numpy.ndarray
            As planned (:meth:`dask_rpm.nn.network.Network.join_params`): ``W_k`` of
            shape ``(m_k, m_(k-1))`` (``m_0`` the inputs) and ``V`` of shape
            ``(l, m_L)``; with ``net.bias`` every ``W_k`` holds its biases as its
            last column and its layer's bias unit as its last row, and ``V`` the
            output biases as its last column.
        net, classes, meta, target_shift, target_scale
            As the constructor's.

        Returns
        -------
        MLPModel
        """
        model = cls.__new__(cls)
        model._build(params, net, classes, meta, target_shift, target_scale)
        return model

    def _build(
        self,
        params: Sequence[np.ndarray],
        net: Network,
        classes: Any,
        meta: Mapping[str, Any] | None,
        target_shift: Any,
        target_scale: Any,
    ) -> None:
        if not isinstance(net, Network):
            raise ModelError(f"net must be a dask_rpm.nn.network.Network; got {type(net).__name__}")
        self.params, self.layers = self._check_params(params, net)
        self.net = net
        self.classes = None if classes is None else np.asarray(classes)
        if self.classes is None and net.output == "softmax":
            self.classes = np.arange(self.n_outputs)
        if self.classes is not None:
            if self.classes.ndim != 1:
                raise ModelError(f"classes must be 1-D; got shape {self.classes.shape}")
            k, l = len(self.classes), self.n_outputs  # noqa: E741
            if not (k == l or (k == 2 and l == 1 and net.output == "sigmoid")):
                raise ModelError(
                    f"{k} classes for {l} output(s): give one label per output (or 2 labels for "
                    f"one sigmoid output)"
                )
        self.target_shift = self._per_output(target_shift, "target_shift")
        self.target_scale = self._per_output(target_scale, "target_scale")
        if (self.target_shift is None) != (self.target_scale is None):
            raise ModelError("give target_shift and target_scale together, or neither")
        if self.target_shift is not None and self.classes is not None:
            raise ModelError(
                "target_shift/target_scale un-standardize regression outputs; a classifier has none"
            )
        self.meta: dict[str, Any] = dict(meta or {})

    @staticmethod
    def _check_params(
        params: Sequence[np.ndarray], net: Network
    ) -> tuple[list[np.ndarray], Layers]:
        """The parameters as arrays and their :class:`Layers`, or a ModelError saying what is wrong."""
        if isinstance(params, np.ndarray) or not isinstance(params, Sequence):
            raise ModelError(
                f"params must be a list of weight matrices W_1 .. W_L, V; got {type(params).__name__}"
            )
        ps = [np.asarray(p) for p in params]
        # the names a network of this many parameters gives them, for the messages
        names = Layers(0, (0,) * max(len(ps) - 1, 1), 0).names
        got = ", ".join(f"{name}{p.shape}" for name, p in zip(names, ps)) or "(none)"
        try:
            layers = layers_of_params(ps)
        except ValueError:
            want = "W(hidden, inputs) and V(outputs, hidden)"
            if len(ps) > 2:
                want = "W1(units 1, inputs), W2(units 2, units 1), ..., V(outputs, last units)"
            raise ModelError(
                f"the weights {got} do not fit together: give {want} - each matrix's columns are "
                f"the rows of the one before, and at least two 2-D matrices"
            ) from None
        dtypes = {p.dtype for p in ps}
        if len(dtypes) > 1 or ps[0].dtype.kind != "f":
            raise ModelError(
                f"the weights must be float arrays of one dtype; got "
                f"{', '.join(f'{n}: {p.dtype}' for n, p in zip(layers.names, ps))}"
            )
        if net.bias and (layers.n < 2 or min(layers.hidden) < 2):
            raise ModelError(
                f"with bias=True the weights {got} must hold the bias input and each layer's bias "
                f"unit (every W at least 2 x 2): pass the augmented weights "
                f"(dask_rpm.nn.network.Network.join_params)"
            )
        return ps, layers

    def _per_output(self, value: Any, name: str) -> np.ndarray | None:
        if value is None:
            return None
        a = np.asarray(value, dtype=np.float64).reshape(-1)
        if a.shape != (self.n_outputs,) or not np.all(np.isfinite(a)):
            raise ModelError(
                f"{name} must be {self.n_outputs} finite number(s), one per output; got {value!r}"
            )
        return a

    # ------------------------------------------------------------------ shape
    @property
    def n_inputs(self) -> int:
        """Data inputs (without the bias input)."""
        return self.layers.n - (1 if self.net.bias else 0)

    @property
    def hidden_layer_sizes(self) -> tuple[int, ...]:
        """Units of each hidden layer, first to last (without the bias units)."""
        return tuple(m - (1 if self.net.bias else 0) for m in self.layers.hidden)

    @property
    def n_hidden(self) -> int:
        """Hidden units (without the bias unit) of a network of one hidden layer.

        Raises
        ------
        ModelError
            The network has several hidden layers (their sizes: :attr:`hidden_layer_sizes`).
        """
        sizes = self.hidden_layer_sizes
        if len(sizes) != 1:
            raise ModelError(
                f"n_hidden is the width of one hidden layer; this model has {len(sizes)} hidden "
                f"layers {sizes}: use hidden_layer_sizes"
            )
        return sizes[0]

    @property
    def n_outputs(self) -> int:
        return self.layers.l

    @property
    def is_classifier(self) -> bool:
        return self.classes is not None

    def __repr__(self) -> str:
        kind = (
            f"classifier of {len(self.classes)} classes"
            if self.classes is not None
            else "regressor"
        )
        net = self.net
        shape = "-".join(map(str, (self.n_inputs, *self.hidden_layer_sizes, self.n_outputs)))
        return (
            f"<MLPModel {shape} {kind}: {net.activation} hidden, "
            f"{net.output} output, {net.loss} loss, bias={net.bias}, {self.params[0].dtype}>"
        )

    # ------------------------------------------------------------ construction
    @classmethod
    def from_result(
        cls, result: Any, *, meta: Mapping[str, Any] | None = None, **kwargs: Any
    ) -> MLPModel:
        """The model of a training run: a :class:`dask_rpm.FitResult`, or :func:`dask_rpm.fit_serial`'s
        :class:`dask_rpm.nn.serial.SerialResult`.

        Its weights are the result's ``params`` (every layer). ``meta`` entries are added to
        what the result says about itself (hyperparameters, loss curve, validation rows, plans,
        remaps, emulation label); other keywords go to the constructor.
        """
        if isinstance(result, Mapping):
            get = result.get
            errors = get("errors")
            plans: list[Any] = []
            remaps: list[Any] = []
        else:

            def get(key: str, default: Any = None) -> Any:
                return getattr(result, key, default)

            hist = get("history")
            errors = (
                get("errors")  # fit_serial's result holds its errors, fit's a history
                if hist is None or "error" not in getattr(hist, "variables", ())
                else hist["error"].values
            )
            plans = list(get("plans") or ([get("plan")] if get("plan") is not None else []))
            remaps = list(get("remaps") or [])
        rec = get("recipe")
        if rec is None:
            raise ModelError(
                "the result has no recipe (which network was trained): give a dask_rpm.FitResult or "
                "what dask_rpm.fit_serial returns"
            )
        info: dict[str, Any] = {
            "recipe": recipe_summary(rec),
            "iterations": None if errors is None else int(len(errors)),
            "stopped": get("stopped"),
            "loss_curve": None if errors is None else [float(e) for e in np.asarray(errors)],
            "validation": [list(map(float, r)) for r in (get("validation") or [])],
            "plans": [p.to_dict() if hasattr(p, "to_dict") else p for p in plans],
            "remaps": remaps,
            "emulation": get("emulation"),
            "dask_rpm_version": str(__version__),
        }
        if info["validation"] == [] and not isinstance(result, Mapping):
            info["validation"] = validation_rows(get("history"))
        info.update(meta or {})
        params = get("params")
        if params is None or any(p is None for p in params):
            what = (
                f"a mapping with keys {sorted(map(str, result))}"
                if isinstance(result, Mapping)
                else f"a {type(result).__name__}"
            )
            raise ModelError(
                f"the result is {what}, with no weights under 'params' (the list W_1 .. W_L, V): "
                "give a dask_rpm.FitResult or what dask_rpm.fit_serial returns"
            )
        classes = kwargs.pop("classes", get("classes"))
        return cls.from_params(list(params), rec.net, classes, info, **kwargs)

    # ------------------------------------------------------------- prediction
    def _check_x(self, x: Any) -> np.ndarray:
        try:
            import xarray as xr

            if isinstance(x, xr.Dataset):
                if "x" not in x.variables:
                    raise ModelError(
                        f"the dataset has variables {sorted(map(str, x.data_vars))}; it needs "
                        f"x(sample, input)"
                    )
                x = x["x"].values
        except ImportError:  # pragma: no cover - xarray is a dependency
            pass
        a = np.asarray(x)
        if a.ndim == 1 and a.size == self.n_inputs:
            raise ModelError(
                f"x is 1-D (shape {a.shape}); give a 2-D array (samples, {self.n_inputs}) - one "
                f"sample is x.reshape(1, -1)"
            )
        if a.ndim != 2 or a.shape[1] != self.n_inputs:
            raise ModelError(
                f"x has shape {a.shape}; this model takes (samples, {self.n_inputs}) - "
                f"{self.n_inputs} input(s) per sample, as it was trained on"
            )
        if a.dtype.kind not in "biuf":
            raise ModelError(f"x has dtype {a.dtype}; give numbers")
        a = np.ascontiguousarray(a, dtype=self.params[0].dtype)
        if not np.all(np.isfinite(a)):
            bad = int(np.argmax(~np.isfinite(a).all(axis=1)))
            raise ModelError(
                f"x contains NaN or infinite values (first in sample {bad}); predictions need finite "
                f"inputs"
            )
        return a

    def outputs(self, x: Any) -> np.ndarray:
        """Network outputs ``h`` (after the output layer), ``(samples, outputs)``: exactly
        :func:`dask_rpm.nn.recipe.forward` of the weights."""
        return forward(self._check_x(x), self.params, self.net)

    def decision_function(self, x: Any) -> np.ndarray:
        """Output pre-activations ``u = f(... f(x W_1^T) ...) V^T`` (logits), ``(samples, outputs)``."""
        xa = self.net.augment(self._check_x(x))
        ws = Workspace.whole(xa.shape[0], self.params, self.net)
        return ws.forward(xa, self.params).copy()

    def predict_proba(self, x: Any) -> np.ndarray:
        """Class probabilities ``(samples, classes)`` (classifiers): the softmax outputs; for one sigmoid
        output ``[1 - h, h]``."""
        if not self.is_classifier:
            raise ModelError(
                "predict_proba needs a classifier; this model is a regressor (use predict)"
            )
        h = self.outputs(x)
        if self.net.output == "softmax":
            return h
        if self.n_outputs == 1:
            return np.hstack([1.0 - h, h])
        raise ModelError(
            f"this classifier has {self.n_outputs} independent sigmoid outputs, not a distribution; "
            f"use outputs() for their values, or train with loss='cross-entropy' (softmax)"
        )

    def predict(self, x: Any) -> np.ndarray:
        """Class labels ``(samples,)`` for classifiers (largest output; one sigmoid output: ``h > 0.5``);
        for regression the outputs ``(samples, outputs)``, un-standardized when the model has a target
        scale."""
        h = self.outputs(x)
        if self.is_classifier:
            assert self.classes is not None
            k = (h[:, 0] > 0.5).astype(np.intp) if h.shape[1] == 1 else np.argmax(h, axis=1)
            return self.classes[k]
        if self.target_scale is not None:
            h = h * self.target_scale + self.target_shift
        return h

    def score(self, x: Any, y: Any) -> float:
        """Accuracy (classifiers: fraction of ``y`` labels predicted), or R^2 (regression: the coefficient
        of determination averaged uniformly over outputs, as scikit-learn's ``r2_score``)."""
        return score_predictions(self.predict(x), y, self.is_classifier)

    def weights(self) -> dict[str, np.ndarray | None]:
        """The user's weights and biases of every layer (copies; the biases None without bias).

        One hidden layer: ``W (m, n)``, ``b (m,)``, ``V (l, m)``, ``c (l,)``. Deeper:
        ``W1 (m_1, n)``, ``b1 (m_1,)``, ..., ``WL (m_L, m_(L-1))``, ``bL (m_L,)``,
        ``V (l, m_L)``, ``c (l,)``.
        """
        weights, biases = self.net.split_params(self.params)
        out: dict[str, np.ndarray | None] = {}
        for name, w, b in zip(self.layers.names, weights, biases):
            out[name] = np.array(w)
            out["c" if name == "V" else "b" + name[1:]] = None if b is None else np.array(b)
        return out

    # ----------------------------------------------------------------- files
    def to_dataset(self) -> Any:
        """The model as an ``xarray.Dataset`` (what :meth:`save` writes; :mod:`dask_rpm.model.files`)."""
        return model_dataset(self)

    def save(self, path: str | os.PathLike, *, overwrite: bool = False) -> str:
        """Write the model to one netCDF file, atomically (readers see the old file or the new one);
        returns the path.

        As ``dask-rpm`` does with outputs: an existing file is replaced only with
        ``overwrite=True``, and the directory must exist (a typo in it is not created).
        """
        return save_dataset(self.to_dataset(), path, overwrite=overwrite)

    @classmethod
    def load(cls, path: str | os.PathLike) -> MLPModel:
        """Read a model written by :meth:`save` (or by ``dask-rpm train``), of this format or older.

        Raises
        ------
        ModelError
            The file is missing, is not netCDF, is not a dask_rpm model (e.g. a
            training dataset or result), is damaged, or is from a newer dask_rpm.
        """
        ds = read_model_file(path)
        return cls.from_dataset(ds, where=repr(os.fspath(path)))

    @classmethod
    def from_dataset(cls, ds: Any, *, where: str = "the dataset") -> MLPModel:
        """The model in an ``xarray.Dataset`` written by :meth:`to_dataset` (this format or older)."""
        parts = model_parts(ds, where=where)
        return cls.from_params(
            parts["params"],
            parts["net"],
            parts["classes"],
            parts["meta"],
            target_shift=parts["target_shift"],
            target_scale=parts["target_scale"],
        )

    # ----------------------------------------------------------------- torch
    def to_torch(self, *, output_layer: bool = True) -> Any:
        """A ``torch.nn.Sequential`` with the trained weights (needs the optional extra ``torch``).

        ``Linear(n, m_1) -> activation -> ... -> Linear(m_(L-1), m_L) -> activation ->
        Linear(m_L, l) [-> Sigmoid | Softmax(dim=1) | exp]`` in the weights' dtype; its
        outputs equal :meth:`outputs` (with the output layer; :meth:`predict_proba`
        for softmax classifiers) or :meth:`decision_function` (``output_layer=False``)
        up to rounding. Target un-standardization (regressors) is not part of it.
        """
        try:
            import torch
            from torch import nn
        except ImportError:
            raise ImportError(
                "MLPModel.to_torch needs PyTorch: pip install 'dask-rpm[torch]'"
            ) from None
        dtype = {np.dtype("float64"): torch.float64, np.dtype("float32"): torch.float32}.get(
            self.params[0].dtype
        )
        if dtype is None:
            raise ModelError(
                f"to_torch supports float32 and float64 weights; these are {self.params[0].dtype}"
            )
        activation = {
            "sigmoid": nn.Sigmoid,
            "tanh": nn.Tanh,
            "relu": nn.ReLU,
            "identity": nn.Identity,
        }[self.net.activation]
        weights, biases = self.net.split_params(self.params)
        layers: list[Any] = []
        for k, (w, b) in enumerate(zip(weights, biases)):
            linear = nn.Linear(w.shape[1], w.shape[0], bias=b is not None, dtype=dtype)
            with torch.no_grad():
                linear.weight.copy_(torch.from_numpy(np.ascontiguousarray(w)))
                if b is not None:
                    linear.bias.copy_(torch.from_numpy(np.ascontiguousarray(b)))
            layers.append(linear)
            if k < len(weights) - 1:
                layers.append(activation())
        if output_layer and self.net.output == "sigmoid":
            layers.append(nn.Sigmoid())
        elif output_layer and self.net.output == "softmax":
            layers.append(nn.Softmax(dim=1))
        elif output_layer and self.net.output == "exp":

            class Exp(nn.Module):  # torch has no exponential layer (the Poisson loss's outputs)
                def forward(self, u: Any) -> Any:
                    return torch.exp(u)

            layers.append(Exp())
        return nn.Sequential(*layers)
