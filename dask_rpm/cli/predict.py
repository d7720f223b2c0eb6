"""``dask-rpm predict``: apply a saved model to a data file.

Reads a model (:func:`dask_rpm.model.cnn.load_model`: an MLP written by ``dask-rpm train``
or ``MLPModel.save``, or a CNN written by ``CNNModel.save``) and inputs ``x(sample, input)``
from a netCDF file or a zarr store (a training dataset works: its ``d`` is ignored for
prediction, used for the score line) or a 2-D ``.npy`` array - for a CNN also a 4-D ``.npy`` array of images
``(samples, channels, height, width)``; a CNN reads rows of ``channels x height x width``
inputs as its images, channel-major (``images.reshape(samples, -1)``) - and writes the predictions as one netCDF
file, atomically. Every bad input is refused before anything is written, with
exit code 2.
"""

from __future__ import annotations

import argparse
import os
import time
import warnings
from typing import TYPE_CHECKING, Any

import numpy as np

from .._files import TargetError, check_target
from .._version import __version__
from ..model.cnn import CNNModel, load_model
from ..model.mlp import ModelError
from ..nn.chunked import zarr_path
from ..nn.data import atomic_to_netcdf
from ._common import CLIError

if TYPE_CHECKING:  # xarray costs about 0.3 s to import: only functions building datasets load it
    import xarray as xr

__all__ = ["add_parser", "run", "read_inputs", "predictions_dataset"]

_EPILOG = """\
examples:
  # after 'dask-rpm train --config job.yaml' (the job's model: <output stem>.model.nc)
  dask-rpm predict --model result.model.nc --data test.nc --output predictions.nc

  # inputs from a zarr store (Dataset.to_zarr) holding x(sample, input)
  dask-rpm predict --model result.model.nc --data test.zarr --output predictions.nc

  # inputs as a numpy array (samples, inputs)
  dask-rpm predict --model result.model.nc --data x.npy --output predictions.nc --overwrite

  # a CNN (CNNModel.save): images (samples, channels, height, width) as a .npy array
  dask-rpm predict --model cnn.model.nc --data images.npy --output predictions.nc

The output holds prediction(sample) class labels and probability(sample, class)
for classifiers, prediction(sample, output) for regression models. With a
netCDF or zarr input that also has d(sample, output), the accuracy (classifiers) or R^2
on it is printed.
"""


def add_parser(subparsers: Any) -> None:
    """Add the ``predict`` subcommand."""
    p = subparsers.add_parser(
        "predict",
        help="apply a saved model to a data file and write the predictions",
        description="Apply a model saved by 'dask-rpm train' (or MLPModel.save, CNNModel.save) to inputs "
        "x(sample, input) from a netCDF file, a zarr store or a .npy file (a CNN: also images as a 4-D .npy array); write predictions (and class probabilities) to a netCDF file, "
        "atomically.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--model", required=True, metavar="FILE", help="model file (.nc) written by dask-rpm train"
    )
    p.add_argument(
        "--data",
        required=True,
        metavar="FILE",
        help="inputs: netCDF or a zarr store with x(sample, input), or a 2-D .npy array (a CNN: "
        "or 4-D images)",
    )
    p.add_argument(
        "--output", required=True, metavar="FILE", help="where the predictions go (netCDF)"
    )
    p.add_argument("--overwrite", action="store_true", help="replace an existing output file")
    p.set_defaults(func=run)


def read_inputs(path: str) -> tuple[np.ndarray, np.ndarray | None]:
    """``(x, d)`` from a netCDF file or a zarr store (``d`` None when absent) or ``(x, None)``
    from a ``.npy`` file."""
    import xarray as xr  # see TYPE_CHECKING above

    if zarr_path(path):
        return _read_zarr(path)
    if not os.path.exists(path):
        raise CLIError(
            f"--data {path!r} does not exist; give a netCDF file with x(sample, input) or a .npy array"
        )
    if os.path.isdir(path):
        raise CLIError(
            f"--data {path!r} is a directory; give a netCDF file with x(sample, input) or a .npy array"
        )
    if path.endswith(".npy"):
        try:
            x = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise CLIError(f"--data {path!r} cannot be read as a .npy array ({e})") from None
        return x, None
    try:
        with xr.open_dataset(path, engine="h5netcdf") as ds:
            if "x" not in ds.variables:
                raise CLIError(
                    f"--data {path!r} has variables {sorted(map(str, ds.data_vars))}; it needs "
                    f"x(sample, input) (a .npy file is read as x itself)"
                )
            x = np.asarray(ds["x"].values)
            d = np.asarray(ds["d"].values) if "d" in ds.variables else None
    except CLIError:
        raise
    except Exception as e:  # h5py/h5netcdf raise many types for a file that is not netCDF
        raise CLIError(
            f"--data {path!r} cannot be read as netCDF ({type(e).__name__}: {e}); give a netCDF file "
            f"with x(sample, input) or a .npy array"
        ) from None
    return x, d


def _read_zarr(path: str) -> tuple[np.ndarray, np.ndarray | None]:
    """``(x, d)`` of a zarr store (``d`` None when absent), ``sample`` first, read whole as a
    netCDF file's are."""
    import xarray as xr  # see TYPE_CHECKING above

    if not os.path.exists(path) and "://" not in path:
        raise CLIError(
            f"--data {path!r} does not exist; give a zarr store (or netCDF file) with "
            f"x(sample, input), or a .npy array"
        )
    try:
        import zarr  # noqa: F401 - only to say what is missing
    except ImportError:
        raise CLIError(
            f"--data {path!r} is a zarr store; reading it needs the zarr package: pip install "
            f"'dask-rpm[zarr]'"
        ) from None
    try:
        ds = xr.open_zarr(path)
    except Exception as e:  # zarr raises many types for a directory that is not a store
        raise CLIError(
            f"--data {path!r} cannot be read as a zarr store ({type(e).__name__}: {e}); give a "
            f"store written by Dataset.to_zarr with x(sample, input)"
        ) from None
    if "x" not in ds.data_vars:
        raise CLIError(
            f"--data {path!r} has variables {sorted(map(str, ds.data_vars))}; it needs "
            f"x(sample, input)"
        )

    def values(name: str) -> np.ndarray:
        v = ds[name]
        return np.asarray((v.transpose("sample", ...) if "sample" in v.dims else v).values)

    return values("x"), (values("d") if "d" in ds.data_vars else None)


def predictions_dataset(model: Any, x: np.ndarray) -> xr.Dataset:
    """The predictions of ``model`` for ``x`` as an ``xarray.Dataset``."""
    import xarray as xr  # see TYPE_CHECKING above

    pred = model.predict(x)
    if model.is_classifier:
        proba = model.predict_proba(x)
        cls = model.classes
        labels = cls.astype(str) if cls.dtype.kind in "OUS" else cls
        ds = xr.Dataset(
            {
                "prediction": (
                    ("sample",),
                    pred.astype(str) if cls.dtype.kind in "OUS" else pred,
                    {"description": "predicted class label (the most probable class)"},
                ),
                "probability": (("sample", "class"), proba, {"description": "class probabilities"}),
            },
            coords={"class": ("class", labels, {"description": "class labels, in output order"})},
        )
    else:
        ds = xr.Dataset(
            {"prediction": (("sample", "output"), pred, {"description": "predicted targets"})}
        )
    return ds


def run(args: argparse.Namespace) -> int:
    """Runner of ``dask-rpm predict``."""
    model_path, data_path = os.path.abspath(args.model), os.path.abspath(args.data)
    output = os.path.abspath(args.output)
    if output in (model_path, data_path):
        raise CLIError(
            f"--output {args.output!r} is the {'model' if output == model_path else 'data'} file; "
            f"write the predictions to a new file"
        )
    try:
        check_target(
            output, what="--output", overwrite=args.overwrite, hint="pass --overwrite to replace it"
        )
    except TargetError as e:
        raise CLIError(str(e)) from None
    try:
        model = load_model(model_path)
    except ModelError as e:
        raise CLIError(f"--model: {e}") from None
    x, d = read_inputs(data_path)
    if isinstance(model, CNNModel) and x.ndim == 2 and x.shape[1] == model.n_inputs:
        x = x.reshape(-1, *model.image_shape)  # rows of flattened images, as training carries them
    try:
        ds = predictions_dataset(model, x)
        score = None
        if d is not None and d.ndim in (1, 2) and len(d) == len(x):
            truth = _truth(model, d)
            if truth is not None:
                score = model.score(x, truth)
    except ModelError as e:
        raise CLIError(f"--data {args.data!r}: {e}") from None
    ds.attrs.update(
        title="dask_rpm predictions",
        model=model_path,
        data=data_path,
        dask_rpm_version=__version__,
        written=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )
    if score is not None:
        ds.attrs["accuracy" if model.is_classifier else "r2"] = score
    # h5netcdf's note on string attributes; readers here use h5netcdf
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*invalid netcdf features.*")
        atomic_to_netcdf(ds, output)
    n_classes = 0 if model.classes is None else len(model.classes)
    kind = f"classifier of {n_classes} classes" if model.is_classifier else "regression model"
    line = f"predicted {len(x)} sample(s) with {os.path.basename(model_path)} ({kind})"
    if score is not None:
        line += f"; {'accuracy' if model.is_classifier else 'R^2'} against d: {score:.4f}"
    print(f"{line}; wrote {output}")
    return 0


def _truth(model: Any, d: np.ndarray) -> np.ndarray | None:
    """The targets ``d`` as :meth:`MLPModel.score` takes them (class labels for a classifier);
    None when their width does not fit the model."""
    classes = model.classes
    if model.is_classifier and d.ndim == 1:  # class labels, as write_dataset takes them
        return d.astype(str) if classes is not None and classes.dtype.kind in "US" else d
    if d.ndim == 1:
        d = d[:, None]
    if model.is_classifier:
        if classes is None or d.shape[1] != len(classes):
            return None
        return classes[np.argmax(d, axis=1)]
    return d if d.shape[1] == model.n_outputs else None
