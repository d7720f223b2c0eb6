"""A trained network to use: predict, score, save and load, export to PyTorch.

Pure (numpy and xarray; PyTorch only inside :meth:`MLPModel.to_torch`): a
model is applied on the client or anywhere else, with no cluster. It holds
the weights *as planned* (augmented with the bias input and bias unit when
the network has bias terms, :mod:`dask_rpm.network`), so a model's outputs
are computed by the same kernels (:func:`dask_rpm.recipe.forward`) that
trained it, and a saved model reloads bit for bit.

File format
-----------
One netCDF-4 file (h5netcdf), written atomically (a temporary file in the
same directory, then :func:`os.replace`): variables ``W(hidden, input)`` and
``V(output, hidden)`` (augmented), ``classes(class)`` for classifiers,
``target_shift(output)`` and ``target_scale(output)`` when predictions are
un-standardized; attributes ``dask_rpm_model`` (format version),
``dask_rpm_version``, the network (``activation``, ``loss``, ``output``,
``bias``) and ``meta`` (JSON: hyperparameters, loss curve, validation rows,
plan history, emulation label). :meth:`MLPModel.load` refuses any other file
with a message saying what it is and what to give instead.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from ._files import json_default
from ._version import __version__
from .nn.data import atomic_to_netcdf
from .nn.kernels import Workspace
from .nn.network import Network, NetworkError, network
from .nn.recipe import forward, recipe_summary
from .results import validation_rows

__all__ = ["MLPModel", "ModelError", "FORMAT_VERSION"]

#: Version of the model file layout; :meth:`MLPModel.load` reads this and older.
FORMAT_VERSION = 1


class ModelError(ValueError):
    """A model cannot be built, applied to this data, or read from this file; the message says why."""


def _float_or_none(v: Any) -> float | None:
    return None if v is None else float(v)


class MLPModel:
    """A trained 3-layer perceptron.

    Parameters
    ----------
    W, V : numpy.ndarray
        Weights as planned: ``W`` is ``(m, n)`` and ``V`` is ``(l, m)``, or with
        ``net.bias`` ``(m + 1, n + 1)`` and ``(l, m + 1)`` (hidden biases in the
        last column of ``W``, the bias unit as its last row, output biases in
        the last column of ``V``; :class:`dask_rpm.network.Network`).
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
        if not isinstance(net, Network):
            raise ModelError(f"net must be a dask_rpm.network.Network; got {type(net).__name__}")
        W, V = np.asarray(W), np.asarray(V)
        if W.ndim != 2 or V.ndim != 2 or V.shape[1] != W.shape[0]:
            raise ModelError(
                f"W{W.shape} and V{V.shape} do not fit together: W must be (hidden, inputs) and V "
                f"(outputs, hidden)"
            )
        if W.dtype.kind != "f" or V.dtype != W.dtype:
            raise ModelError(
                f"W and V must be float arrays of one dtype; got {W.dtype} and {V.dtype}"
            )
        if net.bias and (W.shape[0] < 2 or W.shape[1] < 2):
            raise ModelError(
                f"with bias=True W{W.shape} must hold the bias input and the bias unit "
                f"(at least 2 x 2): pass the augmented weights (dask_rpm.network.Network.join)"
            )
        self.W, self.V, self.net = W, V, net
        self.classes = None if classes is None else np.asarray(classes)
        if self.classes is None and net.output == "softmax":
            self.classes = np.arange(V.shape[0])
        if self.classes is not None:
            if self.classes.ndim != 1:
                raise ModelError(f"classes must be 1-D; got shape {self.classes.shape}")
            k, l = len(self.classes), V.shape[0]  # noqa: E741
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
        return self.W.shape[1] - (1 if self.net.bias else 0)

    @property
    def n_hidden(self) -> int:
        """Hidden units (without the bias unit)."""
        return self.W.shape[0] - (1 if self.net.bias else 0)

    @property
    def n_outputs(self) -> int:
        return self.V.shape[0]

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
        return (
            f"<MLPModel {self.n_inputs}-{self.n_hidden}-{self.n_outputs} {kind}: {net.activation} hidden, "
            f"{net.output} output, {net.loss} loss, bias={net.bias}, {self.W.dtype}>"
        )

    # ------------------------------------------------------------ construction
    @classmethod
    def from_result(
        cls, result: Any, *, meta: Mapping[str, Any] | None = None, **kwargs: Any
    ) -> MLPModel:
        """The model of a training run: a :class:`dask_rpm.FitResult`, or :func:`dask_rpm.fit_serial`'s
        ``full_output=True`` dict.

        ``meta`` entries are added to what the result says about itself
        (hyperparameters, loss curve, validation rows, plans, remaps,
        emulation label); other keywords go to the constructor.
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
                None
                if hist is None or "error" not in getattr(hist, "variables", ())
                else hist["error"].values
            )
            plans = list(get("plans") or ([get("plan")] if get("plan") is not None else []))
            remaps = list(get("remaps") or [])
        rec = get("recipe")
        if rec is None:
            raise ModelError(
                "the result has no recipe (which network was trained): give a dask_rpm.FitResult or "
                "fit_serial(..., full_output=True)"
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
        W, V = get("W"), get("V")
        if W is None or V is None:
            raise ValueError("the result holds no weights W and V: train it first")
        return cls(W, V, rec.net, kwargs.pop("classes", get("classes")), info, **kwargs)

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
        a = np.ascontiguousarray(a, dtype=self.W.dtype)
        if not np.all(np.isfinite(a)):
            bad = int(np.argmax(~np.isfinite(a).all(axis=1)))
            raise ModelError(
                f"x contains NaN or infinite values (first in sample {bad}); predictions need finite "
                f"inputs"
            )
        return a

    def outputs(self, x: Any) -> np.ndarray:
        """Network outputs ``h`` (after the output layer), ``(samples, outputs)``: exactly
        :func:`dask_rpm.recipe.forward` of the weights."""
        return forward(self._check_x(x), self.W, self.V, self.net)

    def decision_function(self, x: Any) -> np.ndarray:
        """Output pre-activations ``u = f(x W^T) V^T`` (logits), ``(samples, outputs)``."""
        xa = self.net.augment(self._check_x(x))
        ws = Workspace(
            xa.shape[0],
            self.W.shape[0],
            self.W.shape[1],
            self.n_outputs,
            self.W.dtype,
            self.net,
            self.net.bias_row(self.W.shape[0]),
        )
        return ws.forward(xa, self.W, self.V).copy()

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
        p = self.predict(x)
        y = np.asarray(y)
        if self.is_classifier:
            if y.shape != p.shape:
                raise ModelError(
                    f"y has shape {y.shape}; give one label per sample, shape {p.shape}"
                )
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

    def weights(self) -> dict[str, np.ndarray | None]:
        """The user's weights: ``W (m, n)``, ``b (m,)``, ``V (l, m)``, ``c (l,)`` (copies; ``b``, ``c``
        None without bias)."""
        parts = self.net.split(self.W, self.V)
        return {k: None if v is None else np.array(v) for k, v in parts.items()}

    # ----------------------------------------------------------------- files
    def to_dataset(self) -> Any:
        """The model as an ``xarray.Dataset`` (what :meth:`save` writes)."""
        import xarray as xr

        net = self.net
        ds = xr.Dataset(
            {
                "W": (
                    ("hidden", "input"),
                    self.W,
                    {
                        "description": "input-to-hidden weights as planned"
                        + (
                            " (last column: hidden biases; last row: the bias unit, output held at 1)"
                            if net.bias
                            else ""
                        )
                    },
                ),
                "V": (
                    ("output", "hidden"),
                    self.V,
                    {
                        "description": "hidden-to-output weights as planned"
                        + (" (last column: output biases)" if net.bias else "")
                    },
                ),
            },
            attrs={
                "title": "dask_rpm model",
                "dask_rpm_model": FORMAT_VERSION,
                "dask_rpm_version": str(__version__),
                "activation": net.activation,
                "loss": net.loss,
                "output": net.output,
                "bias": int(net.bias),
                "inputs": self.n_inputs,
                "hidden_units": self.n_hidden,
                "outputs": self.n_outputs,
                "kind": "classifier" if self.is_classifier else "regressor",
                "emulation": str(self.meta.get("emulation") or ""),
                "meta": json.dumps(self.meta, default=json_default),
            },
        )
        if self.classes is not None:
            cls = self.classes
            ds["classes"] = (
                ("class",),
                cls.astype(str) if cls.dtype.kind in "OUS" else cls,
                {"description": "class label of each output", "dtype": cls.dtype.str},
            )
        if self.target_scale is not None:
            ds["target_shift"] = (
                ("output",),
                self.target_shift,
                {"description": "prediction = output * target_scale + target_shift"},
            )
            ds["target_scale"] = (
                ("output",),
                self.target_scale,
                {"description": "see target_shift"},
            )
        return ds

    def save(self, path: str | os.PathLike, *, overwrite: bool = False) -> str:
        """Write the model to one netCDF file, atomically (readers see the old file or the new one);
        returns the path.

        As ``dask-rpm`` does with outputs: an existing file is replaced only with
        ``overwrite=True``, and the directory must exist (a typo in it is not created).
        """
        import warnings

        path = os.fspath(path)
        if os.path.isdir(path):
            raise ModelError(
                f"model path {path!r} is a directory; give a file name such as model.nc"
            )
        if os.path.exists(path) and not overwrite:
            raise ModelError(
                f"model path {path!r} exists; pass overwrite=True to replace it, or another name"
            )
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder):
            raise ModelError(
                f"model path {path!r}: the directory {folder!r} does not exist; create it first"
            )
        with (
            warnings.catch_warnings()
        ):  # h5netcdf's note on string attributes; readers here use h5netcdf
            warnings.filterwarnings("ignore", message=".*invalid netcdf features.*")
            return atomic_to_netcdf(self.to_dataset(), path)

    @classmethod
    def load(cls, path: str | os.PathLike) -> MLPModel:
        """Read a model written by :meth:`save` (or by ``dask-rpm train``).

        Raises
        ------
        ModelError
            The file is missing, is not netCDF, is not a dask_rpm model (e.g. a
            training dataset or result), or is from a newer dask_rpm.
        """
        import xarray as xr

        path = os.fspath(path)
        if not os.path.exists(path):
            raise ModelError(
                f"model file {path!r} does not exist; give a file written by MLPModel.save or "
                f"dask-rpm train (its 'model:' output)"
            )
        if os.path.isdir(path):
            raise ModelError(f"model file {path!r} is a directory; give the model's .nc file")
        try:
            with xr.open_dataset(path, engine="h5netcdf") as ds:
                ds.load()
        except Exception as exc:  # h5py/h5netcdf raise many types for a non-HDF5 file
            raise ModelError(
                f"{path!r} is not a dask_rpm model file: it cannot be read as netCDF "
                f"({type(exc).__name__}: {exc})"
            ) from None
        return cls.from_dataset(ds, where=repr(path))

    @classmethod
    def from_dataset(cls, ds: Any, *, where: str = "the dataset") -> MLPModel:
        """The model in an ``xarray.Dataset`` written by :meth:`to_dataset`."""
        version = ds.attrs.get("dask_rpm_model")
        if version is None:
            title = ds.attrs.get("title", "")
            what = (
                f"it is a {title}"
                if title
                else f"it has variables {sorted(map(str, ds.data_vars))} and no 'dask_rpm_model' attribute"
            )
            hint = (
                " (dask-rpm train writes the model next to it, <output stem>.model.nc)"
                if title == "dask_rpm training result"
                else ""
            )
            raise ModelError(
                f"{where} is not a dask_rpm model file: {what}{hint}. Give a file written by "
                f"MLPModel.save or dask-rpm train"
            )
        if int(version) > FORMAT_VERSION:
            raise ModelError(
                f"{where} is a model file of format {int(version)}, newer than this dask_rpm "
                f"({str(__version__)}) reads ({FORMAT_VERSION}); upgrade dask_rpm"
            )
        missing = [v for v in ("W", "V") if v not in ds.variables]
        if missing:
            raise ModelError(
                f"{where} is a damaged dask_rpm model file: variable(s) {missing} missing"
            )
        try:
            net = Network(
                str(ds.attrs["activation"]),
                str(ds.attrs["loss"]),
                str(ds.attrs["output"]),
                bool(int(ds.attrs["bias"])),
            )

            network(net.activation, net.loss, net.output, net.bias)  # validate
        except (KeyError, ValueError, NetworkError) as exc:
            raise ModelError(
                f"{where} is a damaged dask_rpm model file: its network attributes are invalid "
                f"({exc})"
            ) from None
        classes = None
        if "classes" in ds.variables:
            raw = ds["classes"].values
            dt = np.dtype(ds["classes"].attrs.get("dtype", raw.dtype.str))
            classes = np.asarray(raw.tolist(), dtype=dt) if dt.kind in "OUS" else raw.astype(dt)
        shift = ds["target_shift"].values if "target_shift" in ds.variables else None
        scale = ds["target_scale"].values if "target_scale" in ds.variables else None
        meta = json.loads(ds.attrs.get("meta", "{}"))
        W = np.ascontiguousarray(ds["W"].values)
        V = np.ascontiguousarray(ds["V"].values)
        return cls(W, V, net, classes, meta, target_shift=shift, target_scale=scale)

    # ----------------------------------------------------------------- torch
    def to_torch(self, *, output_layer: bool = True) -> Any:
        """A ``torch.nn.Sequential`` with the trained weights (needs the optional extra ``torch``).

        ``Linear(n, m) -> activation -> Linear(m, l) [-> Sigmoid | Softmax(dim=1)]``
        in the weights' dtype; its outputs equal :meth:`outputs` (with the
        output layer; :meth:`predict_proba` for softmax classifiers) or
        :meth:`decision_function` (``output_layer=False``) up to rounding.
        Target un-standardization (regressors) is not part of it.
        """
        try:
            import torch
            from torch import nn
        except ImportError:
            raise ImportError(
                "MLPModel.to_torch needs PyTorch: pip install 'dask-rpm[torch]'"
            ) from None
        parts = self.weights()
        dtype = {np.dtype("float64"): torch.float64, np.dtype("float32"): torch.float32}.get(
            self.W.dtype
        )
        if dtype is None:
            raise ModelError(
                f"to_torch supports float32 and float64 weights; these are {self.W.dtype}"
            )
        bias = self.net.bias
        hidden = nn.Linear(self.n_inputs, self.n_hidden, bias=bias, dtype=dtype)
        out = nn.Linear(self.n_hidden, self.n_outputs, bias=bias, dtype=dtype)
        with torch.no_grad():
            hidden.weight.copy_(torch.from_numpy(np.ascontiguousarray(parts["W"])))
            out.weight.copy_(torch.from_numpy(np.ascontiguousarray(parts["V"])))
            if bias:
                hidden.bias.copy_(torch.from_numpy(np.ascontiguousarray(parts["b"])))
                out.bias.copy_(torch.from_numpy(np.ascontiguousarray(parts["c"])))
        act = {"sigmoid": nn.Sigmoid, "tanh": nn.Tanh, "relu": nn.ReLU}[self.net.activation]()
        layers: list[Any] = [hidden, act, out]
        if output_layer and self.net.output == "sigmoid":
            layers.append(nn.Sigmoid())
        elif output_layer and self.net.output == "softmax":
            layers.append(nn.Softmax(dim=1))
        return nn.Sequential(*layers)
