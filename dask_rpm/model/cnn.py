"""A trained convolutional network to use: predict, score, save and load, export to PyTorch.

What :class:`~dask_rpm.MLPModel` is for an MLP, for a network trained with
``fit(network=...)`` / ``fit_serial(network=...)`` or :class:`dask_rpm.CNNClassifier`.
Pure (numpy and xarray; PyTorch only inside :meth:`CNNModel.to_torch`): a model is applied
anywhere, with no cluster. It holds the parameters in
:class:`~dask_rpm.nn.cnn.ConvLayers`' layout (the bias channel included), so its outputs are
computed by the kernels that trained it (:func:`dask_rpm.nn.recipe.forward`) and a saved
model reloads bit for bit.

File format
-----------
One netCDF-4 file, written atomically (:func:`dask_rpm.model.files.save_dataset`: a temporary
file, then a rename), of the model file's format (attribute ``dask_rpm_model``) with
``architecture="cnn"``:

* each parameter of :attr:`ConvLayers.names <dask_rpm.nn.cnn.ConvLayers.names>` under its name
  (``W1, b1, ..., V``), its dimensions named by :func:`dimension_names` (``stage1``,
  ``stage1_input``, ..., ``output``); ``classes(class)`` for classifiers;
* attributes ``network`` (JSON: the layer records, :meth:`ConvLayers.spec
  <dask_rpm.nn.cnn.ConvLayers.spec>`), ``image_shape`` (channels, height, width),
  ``outputs``, ``parameters`` (the names in order), ``loss``, ``output``, ``kind``,
  ``dask_rpm_version``, ``emulation`` and ``meta`` (JSON: the recipe summary, loss curve,
  validation rows, plans, remaps).

:meth:`CNNModel.load` rebuilds the geometry from ``network``, ``image_shape`` and ``outputs``
and refuses a file whose parameters do not have its shapes, an MLP's file (naming
:meth:`dask_rpm.MLPModel.load`), and anything that is no model file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .._files import json_default
from .._version import __version__
from ..nn.cnn import ConvLayers, NetworkSpecError, is_conv
from ..nn.cnn_records import conv_layers
from ..nn.cnn_torch import to_torch as _layers_to_torch
from ..nn.network import Network, NetworkError, network
from ..nn.recipe import forward, recipe_summary
from ..nn.workspaces import whole_workspace
from ..results import validation_rows
from .files import (
    FORMAT_VERSION,
    ModelError,
    architecture,
    check_version,
    classes_variable,
    read_classes,
    read_model_file,
    save_dataset,
)
from .mlp import MLPModel, score_predictions

__all__ = ["CNNModel", "load_model", "dimension_names"]

#: The network a CNN trains with cross-entropy: the layers hold the biases and activations.
_CLASSIFIER_NET = Network("relu", "cross-entropy", "softmax", False)


class CNNModel:
    """A trained convolutional network (:mod:`dask_rpm.nn.cnn`).

    Parameters
    ----------
    layers : ConvLayers
        The network's geometry (:func:`dask_rpm.nn.cnn_records.conv_layers`): its layers, image shape
        and outputs.
    params : sequence of numpy.ndarray
        ``W1, b1, ..., V`` in ``layers``' layout (``layers.full_shapes()``), one float dtype:
        what ``result.params`` holds after ``fit(network=...)``.
    net : Network, optional
        Loss and output layer of the trained network (``result.recipe.net``); default softmax
        outputs with cross-entropy (a classifier). Its ``bias`` must be False: a CNN's biases
        are its layers' (``b{k}`` and the bias channel).
    classes : array_like, optional
        Class labels of the outputs, in output order. A softmax network without labels is a
        classifier of the classes ``0 .. outputs-1``.
    meta : dict, optional
        JSON-serializable information kept with the model (recipe, loss curve, plans,
        ``dask_rpm_version``).

    Attributes
    ----------
    layers : ConvLayers
    params : list of numpy.ndarray
    net : Network
    classes : numpy.ndarray or None
    meta : dict

    Raises
    ------
    ModelError
        ``layers`` is not a CNN's geometry; parameters that do not have its shapes or are not
        floats of one dtype; classes that do not match the outputs.
    """

    def __init__(
        self,
        layers: ConvLayers,
        params: Sequence[np.ndarray],
        net: Network | None = None,
        classes: Any = None,
        meta: Mapping[str, Any] | None = None,
    ) -> None:
        if not is_conv(layers):
            raise ModelError(
                f"layers is a {type(layers).__name__}; give a CNN's dask_rpm.nn.cnn.ConvLayers "
                f"(result.recipe.layers, or dask_rpm.nn.cnn_records.conv_layers(network, image_shape, "
                f"outputs)); an MLP's weights make a dask_rpm.MLPModel"
            )
        net = _CLASSIFIER_NET if net is None else net
        if not isinstance(net, Network):
            raise ModelError(f"net must be a dask_rpm.nn.network.Network; got {type(net).__name__}")
        if net.bias:
            raise ModelError(
                f"net={net}: bias=True adds an MLP's bias unit; a CNN's biases are its layers' "
                f"(give the net of result.recipe, bias=False)"
            )
        self.layers = layers
        self.params = self._check_params(layers, params)
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
        self.meta: dict[str, Any] = dict(meta or {})

    @staticmethod
    def _check_params(layers: ConvLayers, params: Sequence[np.ndarray]) -> list[np.ndarray]:
        """The parameters as arrays, or a ModelError naming each one that does not fit."""
        if isinstance(params, np.ndarray) or not isinstance(params, Sequence):
            raise ModelError(
                f"params must be a list of arrays {', '.join(layers.names)}; got "
                f"{type(params).__name__}"
            )
        ps = [np.asarray(p) for p in params]
        want = layers.full_shapes()
        got = ", ".join(f"{n}{p.shape}" for n, p in zip(layers.names, ps))
        if len(ps) != len(want) or any(p.shape != tuple(w) for p, w in zip(ps, want)):
            expected = ", ".join(f"{n}{tuple(w)}" for n, w in zip(layers.names, want))
            raise ModelError(
                f"{len(ps)} parameter(s) {got or '(none)'} do not fit the network: it takes "
                f"{expected} (ConvLayers' layout: result.params of fit(network=...))"
            )
        dtypes = {p.dtype for p in ps}
        if len(dtypes) > 1 or ps[0].dtype.kind != "f":
            raise ModelError(
                f"the parameters must be float arrays of one dtype; got "
                f"{', '.join(f'{n}: {p.dtype}' for n, p in zip(layers.names, ps))}"
            )
        return ps

    # ------------------------------------------------------------------ shape
    @property
    def image_shape(self) -> tuple[int, int, int]:
        """``(channels, height, width)`` of one input image."""
        return tuple(self.layers.image)  # type: ignore[return-value]

    @property
    def n_inputs(self) -> int:
        """Inputs per sample: ``channels x height x width``."""
        return self.layers.n

    @property
    def n_outputs(self) -> int:
        return self.layers.l

    @property
    def is_classifier(self) -> bool:
        return self.classes is not None

    @property
    def records(self) -> list[Any]:
        """The network as layer records a user writes (``layers.spec()``): with
        ``image_shape``, what ``fit(network=...)`` rebuilds it from."""
        return self.layers.spec()

    def __repr__(self) -> str:
        kind = (
            f"classifier of {len(self.classes)} classes"
            if self.classes is not None
            else "regressor"
        )
        c, h, w = self.image_shape
        return (
            f"<CNNModel {kind}: {c}x{h}x{w} images, {self.layers.depth} stage(s) "
            f"{list(self.layers.hidden)} -> {self.n_outputs} output(s), {self.net.output} "
            f"output, {self.net.loss} loss, {self.params[0].dtype}>"
        )

    # ------------------------------------------------------------ construction
    @classmethod
    def from_result(
        cls, result: Any, *, meta: Mapping[str, Any] | None = None, classes: Any = None
    ) -> CNNModel:
        """The model of a CNN's training run: a :class:`dask_rpm.FitResult`, or
        :func:`dask_rpm.fit_serial`'s :class:`dask_rpm.nn.serial.SerialResult`.

        Parameters
        ----------
        result : FitResult or SerialResult
            Of ``fit(network=...)`` / ``fit_serial(network=...)``: its ``recipe.layers`` is the
            geometry, its ``params`` the weights.
        meta : dict, optional
            Added to what the result says about itself (recipe, loss curve, validation rows,
            plans, remaps, emulation label).
        classes : array_like, optional
            The labels of the outputs; default the result's ``classes``.

        Returns
        -------
        CNNModel

        Raises
        ------
        ModelError
            The result is an MLP's (no ``recipe.layers``), or holds no recipe or weights.
        """
        rec = getattr(result, "recipe", None)
        if rec is None:
            raise ModelError(
                f"the result is a {type(result).__name__} with no recipe (which network was "
                f"trained): give a dask_rpm.FitResult or what dask_rpm.fit_serial returns"
            )
        if not is_conv(rec.layers):
            raise ModelError(
                "the result is an MLP's (its recipe has no conv layers): dask_rpm.MLPModel."
                "from_result makes its model"
            )
        params = getattr(result, "params", None)
        if params is None:
            raise ModelError(
                f"the result is a {type(result).__name__} with no weights under 'params': give "
                f"a dask_rpm.FitResult or what dask_rpm.fit_serial returns"
            )
        hist = getattr(result, "history", None)
        errors = (
            getattr(result, "errors", None)  # fit_serial's result holds its errors, fit's a history
            if hist is None or "error" not in getattr(hist, "variables", ())
            else hist["error"].values
        )
        plans = list(getattr(result, "plans", None) or [])
        if not plans and getattr(result, "plan", None) is not None:
            plans = [result.plan]
        validation = [list(map(float, r)) for r in (getattr(result, "validation", None) or [])]
        info: dict[str, Any] = {
            "recipe": recipe_summary(rec),
            "iterations": None if errors is None else int(len(errors)),
            "stopped": getattr(result, "stopped", None),
            "loss_curve": None if errors is None else [float(e) for e in np.asarray(errors)],
            "validation": validation or (validation_rows(hist) if hist is not None else []),
            "plans": [p.to_dict() if hasattr(p, "to_dict") else p for p in plans],
            "remaps": list(getattr(result, "remaps", None) or []),
            "emulation": getattr(result, "emulation", None),
            "dask_rpm_version": str(__version__),
        }
        info.update(meta or {})
        labels = getattr(result, "classes", None) if classes is None else classes
        return cls(rec.layers, list(params), rec.net, labels, info)

    # ------------------------------------------------------------- prediction
    def _check_x(self, x: Any) -> np.ndarray:
        """``x`` as ``(samples, channels, height, width)`` in the weights' dtype, or a
        ModelError saying what it is and what to give."""
        a = np.asarray(x)
        c, h, w = self.image_shape
        want = f"(samples, {c}, {h}, {w})"
        if a.ndim == 3 and a.shape == self.image_shape:
            raise ModelError(
                f"x has shape {a.shape}, one image; give a 4-D array {want} - one image is x[None]"
            )
        if a.ndim == 2 and a.shape[1] == self.n_inputs:
            raise ModelError(
                f"x has shape {a.shape}, flattened images; give images {want}: "
                f"x.reshape(-1, {c}, {h}, {w})"
            )
        if a.ndim != 4 or a.shape[1:] != self.image_shape:
            raise ModelError(
                f"x has shape {a.shape}; this model takes images {want}, as it was trained on"
            )
        if a.dtype.kind not in "biuf":
            raise ModelError(f"x has dtype {a.dtype}; give numbers")
        a = np.ascontiguousarray(a, dtype=self.params[0].dtype)
        if not np.all(np.isfinite(a)):
            bad = int(np.argmax(~np.isfinite(a.reshape(a.shape[0], -1)).all(axis=1)))
            raise ModelError(
                f"x contains NaN or infinite values (first in sample {bad}); predictions need "
                f"finite inputs"
            )
        return a

    def outputs(self, x: Any) -> np.ndarray:
        """Network outputs ``h`` (softmax probabilities for cross-entropy), ``(samples,
        outputs)``: exactly :func:`dask_rpm.nn.recipe.forward` of the weights."""
        return forward(self._check_x(x), self.params, self.net, self.layers)

    def decision_function(self, x: Any) -> np.ndarray:
        """Output pre-activations (logits), ``(samples, outputs)``: what the last ``Linear``
        gives."""
        a = self._check_x(x)
        rows = a.reshape(a.shape[0], -1)
        ws = whole_workspace(rows.shape[0], self.params, self.net, layers=self.layers)
        return np.array(ws.forward(rows, self.params))

    def predict_proba(self, x: Any) -> np.ndarray:
        """Class probabilities ``(samples, classes)`` (classifiers): the softmax outputs; for one
        sigmoid output ``[1 - h, h]``."""
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
            f"this classifier has {self.n_outputs} independent sigmoid outputs, not a "
            f"distribution; use outputs() for their values, or train with softmax outputs"
        )

    def predict(self, x: Any) -> np.ndarray:
        """Class labels ``(samples,)`` for classifiers (largest output; one sigmoid output:
        ``h > 0.5``); for regression the outputs ``(samples, outputs)``."""
        h = self.outputs(x)
        if self.classes is not None:
            k = (h[:, 0] > 0.5).astype(np.intp) if h.shape[1] == 1 else np.argmax(h, axis=1)
            return self.classes[k]
        return h

    def score(self, x: Any, y: Any) -> float:
        """Accuracy (classifiers: the fraction of labels ``y`` predicted), or R^2 (regression,
        averaged uniformly over outputs), as :meth:`dask_rpm.MLPModel.score`."""
        return score_predictions(self.predict(x), y, self.is_classifier)

    # ----------------------------------------------------------------- files
    def to_dataset(self) -> Any:
        """The model as an ``xarray.Dataset``: what :meth:`save` writes (module docstring)."""
        import xarray as xr

        layers = self.layers
        variables = {
            name: (dims, p, {"description": _description(name, layers)})
            for name, dims, p in zip(layers.names, dimension_names(layers), self.params)
        }
        attrs: dict[str, Any] = {
            "title": "dask_rpm model",
            "dask_rpm_model": FORMAT_VERSION,
            "architecture": "cnn",
            "dask_rpm_version": str(__version__),
            "network": json.dumps(self.records),
            "image_shape": np.asarray(self.image_shape, dtype=np.int64),
            "outputs": self.n_outputs,
            "parameters": " ".join(layers.names),
            "loss": self.net.loss,
            "output": self.net.output,
            "kind": "classifier" if self.is_classifier else "regressor",
            "emulation": str(self.meta.get("emulation") or ""),
            "meta": json.dumps(self.meta, default=json_default),
        }
        ds = xr.Dataset(variables, attrs=attrs)
        classes_variable(ds, self.classes)
        return ds

    def save(self, path: str | os.PathLike, *, overwrite: bool = False) -> str:
        """Write the model to one netCDF file, atomically (readers see the old file or the new
        one); returns the path.

        An existing file is replaced only with ``overwrite=True``, and the directory must exist
        (a typo in it is not created), as :meth:`dask_rpm.MLPModel.save`.
        """
        return save_dataset(self.to_dataset(), path, overwrite=overwrite)

    @classmethod
    def load(cls, path: str | os.PathLike) -> CNNModel:
        """Read a model written by :meth:`save`.

        Raises
        ------
        ModelError
            The file is missing, is not netCDF, is not a dask_rpm model, holds an MLP (read it
            with :meth:`dask_rpm.MLPModel.load`), is damaged, or is from a newer dask_rpm.
        """
        return cls.from_dataset(read_model_file(path), where=repr(os.fspath(path)))

    @classmethod
    def from_dataset(cls, ds: Any, *, where: str = "the dataset") -> CNNModel:
        """The model in an ``xarray.Dataset`` written by :meth:`to_dataset`."""
        check_version(ds, where)
        if architecture(ds) != "cnn":
            raise ModelError(
                f"{where} holds an MLP, not a CNN (attribute architecture="
                f"{architecture(ds)!r}): read it with dask_rpm.MLPModel.load"
            )
        damaged = f"{where} is a damaged dask_rpm model file"
        try:
            records = json.loads(str(ds.attrs["network"]))
            image = [int(v) for v in np.atleast_1d(ds.attrs["image_shape"])]
            layers = conv_layers(records, image, int(ds.attrs["outputs"]))
            net = network("relu", str(ds.attrs["loss"]), str(ds.attrs["output"]), False)
            meta = json.loads(str(ds.attrs.get("meta", "{}")))
        except KeyError as exc:
            raise ModelError(f"{damaged}: attribute {exc} missing") from None
        except (ValueError, TypeError, NetworkSpecError, NetworkError) as exc:
            raise ModelError(f"{damaged}: its network attributes are invalid ({exc})") from None
        names = str(ds.attrs.get("parameters", "")).split()
        if names != list(layers.names):
            raise ModelError(
                f"{damaged}: its parameters {names} are not those of its network, "
                f"{list(layers.names)}"
            )
        missing = [v for v in names if v not in ds.variables]
        if missing:
            raise ModelError(f"{damaged}: variable(s) {missing} missing")
        params = [np.ascontiguousarray(ds[v].values) for v in names]
        try:
            return cls(layers, params, net, read_classes(ds), meta)
        except ModelError as exc:
            raise ModelError(f"{damaged}: {exc}") from None

    # ----------------------------------------------------------------- torch
    def to_torch(self, *, output_layer: bool = True) -> Any:
        """A ``torch.nn.Sequential`` with the trained weights (needs the optional extra ``torch``).

        The network as trained (:func:`dask_rpm.nn.cnn_torch.to_torch`: float64 for float64 weights),
        then ``Softmax(dim=1)`` (``Sigmoid`` for sigmoid outputs) with ``output_layer=True``:
        its outputs equal :meth:`outputs` (:meth:`predict_proba` for softmax classifiers), or
        :meth:`decision_function` with ``output_layer=False`` - the module to train on in
        PyTorch (``CrossEntropyLoss`` takes logits), up to rounding.
        """
        try:
            from torch import nn
        except ImportError:
            raise ImportError(
                "CNNModel.to_torch needs PyTorch: pip install 'dask-rpm[torch]'"
            ) from None
        seq = _layers_to_torch(self.layers, self.params)
        if output_layer and self.net.output == "softmax":
            seq.append(nn.Softmax(dim=1))
        elif output_layer and self.net.output == "sigmoid":
            seq.append(nn.Sigmoid())
        return seq


def dimension_names(layers: ConvLayers) -> list[tuple[str, ...]]:
    """The dimension names of each parameter of a CNN, in ``layers.params`` order: ``W{k}`` is
    ``(stage{k}, stage{k}_input, stage{k}_kernel_y, stage{k}_kernel_x)`` for a conv stage and
    ``(stage{k}, stage{k}_input)`` for a dense one, ``b{k}`` is ``(stage{k},)`` and ``V`` is
    ``(output, stage{L}, stage{L}_position)``; ``stage{k}`` counts the rows as planned (the last
    stage's last row is the output bias channel)."""
    out: list[tuple[str, ...]] = []
    for p in layers.params:
        st, k = layers.stages[p.layer], f"stage{p.layer + 1}"
        if p.name.startswith("b"):
            out.append((k,))
        elif p.axis == 1:
            out.append(("output", k, f"{k}_position"))
        elif st.kind == "conv":
            out.append((k, f"{k}_input", f"{k}_kernel_y", f"{k}_kernel_x"))
        else:
            out.append((k, f"{k}_input"))
    return out


def _description(name: str, layers: ConvLayers) -> str:
    """What parameter ``name`` holds, for the variable's ``description``."""
    if name == "V":
        return (
            "output layer (outputs, last stage's channels + bias channel, positions); "
            "V[:, -1, 0] the output biases"
            if layers.out_bias
            else "output layer (outputs, last stage's channels, positions)"
        )
    st = layers.stages[int(name[1:]) - 1]
    what = "biases" if name.startswith("b") else "weights"
    return f"stage {name[1:]} ({st.kind}) {what}, rows as planned"


def load_model(path: str | os.PathLike) -> MLPModel | CNNModel:
    """The model in a model file, whichever it holds: a :class:`dask_rpm.MLPModel` or a
    :class:`CNNModel` (the file's ``architecture`` attribute says which).

    Raises
    ------
    ModelError
        As :meth:`dask_rpm.MLPModel.load` and :meth:`CNNModel.load`.
    """
    where = repr(os.fspath(path))
    ds = read_model_file(path)
    if architecture(ds) == "cnn":
        return CNNModel.from_dataset(ds, where=where)
    return MLPModel.from_dataset(ds, where=where)
