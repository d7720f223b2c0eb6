"""The model file: :class:`dask_rpm.MLPModel` as one netCDF file, written atomically and read back.

Pure (numpy and xarray). Kept apart from :mod:`dask_rpm.model.mlp` (what a model
computes) because the file layout has versions to read and damage to name.
This module knows the layout, not the model: :func:`model_dataset` takes
any object with a model's attributes, and :func:`model_parts` returns the
constructor's arguments (:meth:`dask_rpm.MLPModel.from_params`).

File format
-----------
One netCDF-4 file (h5netcdf), written atomically (a temporary file in the
same directory, then :func:`os.replace`). Format 2 stores each weight matrix,
augmented as planned (:mod:`dask_rpm.nn.network`), under its name in
:attr:`dask_rpm.nn.layers.Layers.names` (the paper's names):

* one hidden layer: ``W(hidden, input)`` and ``V(output, hidden)``;
* ``L`` hidden layers: ``W1(hidden1, input)``, ``W2(hidden2, hidden1)``, ...,
  ``WL(hiddenL, hidden<L-1>)`` and ``V(output, hiddenL)``;

with ``classes(class)`` for classifiers, ``target_shift(output)`` and
``target_scale(output)`` when predictions are un-standardized; attributes
``dask_rpm_model`` (the format), ``parameters`` (the weight names in order),
``inputs``, ``hidden_layer_sizes`` (hidden units per layer, bias units not
counted), ``outputs``, ``dask_rpm_version``, the network (``activation``,
``loss``, ``output``, ``bias``) and ``meta`` (JSON: hyperparameters, loss
curve, validation rows, plan history, emulation label).

The attribute ``architecture`` tells an MLP's file (``"mlp"``) from a CNN's (``"cnn"``,
:class:`dask_rpm.CNNModel`: its layout is :mod:`dask_rpm.model.cnn`'s); each class refuses the
other's file and names the class that reads it (:func:`architecture`).

Format 1 (development builds before deep networks) is refused: such a model is
trained and saved again.
"""

from __future__ import annotations

import json
import os
import warnings
from typing import Any

import numpy as np

from .._files import json_default
from .._version import __version__
from ..nn.data import atomic_to_netcdf
from ..nn.layers import Layers, layers_of_params
from ..nn.network import Network, NetworkError, network

__all__ = [
    "ModelError",
    "FORMAT_VERSION",
    "model_dataset",
    "save_dataset",
    "read_model_file",
    "model_parts",
    "check_version",
    "architecture",
    "classes_variable",
    "read_classes",
]

#: Version of the model file layout; :func:`model_parts` reads this one only.
FORMAT_VERSION = 2


class ModelError(ValueError):
    """A model cannot be built, applied to this data, or read from this file; the message says why."""


def dimension_names(layers: Layers) -> list[tuple[str, str]]:
    """The ``(rows, columns)`` dimension names of each parameter of a network of ``layers``."""
    if layers.depth == 1:
        return [("hidden", "input"), ("output", "hidden")]
    units = [f"hidden{k + 1}" for k in range(layers.depth)]
    dims = [(units[k], "input" if k == 0 else units[k - 1]) for k in range(layers.depth)]
    return [*dims, ("output", units[-1])]


def _description(name: str, k: int, depth: int, bias: bool) -> str:
    """What parameter ``name`` (the ``k``-th) holds, for the variable's ``description``."""
    if name == "V":
        return "hidden-to-output weights as planned" + (
            " (last column: output biases)" if bias else ""
        )
    source = "input" if k == 0 else f"hidden layer {k}"
    target = "hidden" if depth == 1 else f"hidden layer {k + 1}"
    return f"{source}-to-{target} weights as planned" + (
        " (last column: biases; last row: the bias unit, output held at 1)" if bias else ""
    )


def model_dataset(model: Any) -> Any:
    """The ``xarray.Dataset`` of a :class:`dask_rpm.MLPModel` (module docstring: format 2)."""
    import xarray as xr

    net, layers = model.net, model.layers
    dims = dimension_names(layers)
    variables = {
        name: (dims[k], p, {"description": _description(name, k, layers.depth, net.bias)})
        for k, (name, p) in enumerate(zip(layers.names, model.params))
    }
    attrs: dict[str, Any] = {
        "title": "dask_rpm model",
        "dask_rpm_model": FORMAT_VERSION,
        "architecture": "mlp",
        "dask_rpm_version": str(__version__),
        "activation": net.activation,
        "loss": net.loss,
        "output": net.output,
        "bias": int(net.bias),
        "parameters": " ".join(layers.names),
        "inputs": model.n_inputs,
        "hidden_layer_sizes": np.asarray(model.hidden_layer_sizes, dtype=np.int64),
        "outputs": model.n_outputs,
        "kind": "classifier" if model.is_classifier else "regressor",
        "emulation": str(model.meta.get("emulation") or ""),
        "meta": json.dumps(model.meta, default=json_default),
    }
    ds = xr.Dataset(variables, attrs=attrs)
    classes_variable(ds, model.classes)
    if model.target_scale is not None:
        ds["target_shift"] = (
            ("output",),
            model.target_shift,
            {"description": "prediction = output * target_scale + target_shift"},
        )
        ds["target_scale"] = (("output",), model.target_scale, {"description": "see target_shift"})
    return ds


def classes_variable(ds: Any, classes: np.ndarray | None) -> None:
    """Add a classifier's labels to a model's dataset as ``classes(class)`` (strings as text, their
    dtype in an attribute; nothing for a regressor)."""
    if classes is None:
        return
    ds["classes"] = (
        ("class",),
        classes.astype(str) if classes.dtype.kind in "OUS" else classes,
        {"description": "class label of each output", "dtype": classes.dtype.str},
    )


def read_classes(ds: Any) -> np.ndarray | None:
    """The labels :func:`classes_variable` stored, in their dtype; None for a regressor."""
    if "classes" not in ds.variables:
        return None
    raw = ds["classes"].values
    dt = np.dtype(ds["classes"].attrs.get("dtype", raw.dtype.str))
    return np.asarray(raw.tolist(), dtype=dt) if dt.kind in "OUS" else raw.astype(dt)


def architecture(ds: Any) -> str:
    """``"mlp"`` or ``"cnn"``: which model a model file holds (files without the attribute are
    MLPs')."""
    return str(ds.attrs.get("architecture", "mlp"))


def save_dataset(ds: Any, path: str | os.PathLike, *, overwrite: bool = False) -> str:
    """Write a model's dataset to ``path`` atomically (readers see the old file or the new one);
    returns the path.

    As ``dask-rpm`` does with outputs: an existing file is replaced only with
    ``overwrite=True``, and the directory must exist (a typo in it is not created).
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        raise ModelError(f"model path {path!r} is a directory; give a file name such as model.nc")
    if os.path.exists(path) and not overwrite:
        raise ModelError(
            f"model path {path!r} exists; pass overwrite=True to replace it, or another name"
        )
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ModelError(
            f"model path {path!r}: the directory {folder!r} does not exist; create it first"
        )
    # h5netcdf's note on string attributes; readers here use h5netcdf
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*invalid netcdf features.*")
        return atomic_to_netcdf(ds, path)


def read_model_file(path: str | os.PathLike) -> Any:
    """The loaded ``xarray.Dataset`` of file ``path``; :class:`ModelError` when it is missing, a
    directory or not netCDF."""
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
    return ds


def check_version(ds: Any, where: str) -> None:
    """Refuse what is no model file, or one of another format than :data:`FORMAT_VERSION`."""
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
            f"MLPModel.save, CNNModel.save or dask-rpm train"
        )
    if int(version) > FORMAT_VERSION:
        raise ModelError(
            f"{where} is a model file of format {int(version)}, newer than this dask_rpm "
            f"({str(__version__)}) reads (format {FORMAT_VERSION}); upgrade dask_rpm"
        )
    if int(version) < FORMAT_VERSION:
        raise ModelError(
            f"{where} is a model file of format {int(version)}, written by a development build "
            f"of dask_rpm (version {ds.attrs.get('dask_rpm_version', 'unknown')}, variables "
            f"{sorted(map(str, ds.data_vars))}); this dask_rpm reads format {FORMAT_VERSION} "
            f"only (the weights listed in its 'parameters' attribute): train the model again "
            f"and save it"
        )


def _read_params(ds: Any, where: str, bias: bool) -> list[np.ndarray]:
    """The weight matrices of a model file, checked against its attributes."""
    damaged = f"{where} is a damaged dask_rpm model file"
    names = str(ds.attrs.get("parameters", "")).split()
    missing = [v for v in names if v not in ds.variables]
    if missing or not names:
        raise ModelError(f"{damaged}: variable(s) {missing or ['parameters attribute']} missing")
    params = [np.ascontiguousarray(ds[v].values) for v in names]
    try:
        layers = layers_of_params(params)
    except ValueError as exc:
        raise ModelError(f"{damaged}: {exc}") from None
    if list(layers.names) != names:
        raise ModelError(
            f"{damaged}: its parameters {names} are not those of a network of "
            f"{layers.depth} hidden layer(s), {list(layers.names)}"
        )
    said = [int(v) for v in np.atleast_1d(ds.attrs.get("hidden_layer_sizes", []))]
    held = [m - 1 if bias else m for m in layers.hidden]
    if said != held:
        raise ModelError(
            f"{damaged}: attribute hidden_layer_sizes={said} but its weights have hidden "
            f"layers of {held} units"
        )
    return params


def model_parts(ds: Any, *, where: str = "the dataset") -> dict[str, Any]:
    """The keywords of :meth:`dask_rpm.MLPModel.from_params` stored in a model's dataset (format
    :data:`FORMAT_VERSION`).

    Raises
    ------
    ModelError
        ``ds`` is not a dask_rpm model (a training dataset or result), is of another format
        (a newer dask_rpm's, or a development build's), or is damaged; the message names
        ``where`` and what it found.
    """
    check_version(ds, where)
    if architecture(ds) != "mlp":
        raise ModelError(
            f"{where} holds a {architecture(ds).upper()}, not an MLP (attribute architecture="
            f"{architecture(ds)!r}): read it with dask_rpm.CNNModel.load"
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
            f"{where} is a damaged dask_rpm model file: its network attributes are invalid ({exc})"
        ) from None
    params = _read_params(ds, where, net.bias)
    return {
        "params": params,
        "net": net,
        "classes": read_classes(ds),
        "meta": json.loads(ds.attrs.get("meta", "{}")),
        "target_shift": ds["target_shift"].values if "target_shift" in ds.variables else None,
        "target_scale": ds["target_scale"].values if "target_scale" in ds.variables else None,
    }
