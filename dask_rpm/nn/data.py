"""Training data: numpy arrays, xarray Datasets, or a netCDF file the workers read.

Storage format: **netCDF-4 (HDF5) through h5netcdf**. One self-describing file
is what HPC users already keep on their shared file systems; HDF5 reads a
hyperslab ``x[s0:s1]`` without touching the rest, so each worker reads only its
column's sample range; and one file can be replaced atomically with
``os.replace``, which the result and checkpoint writers rely on. (zarr would
also slice well, but a directory store cannot be swapped in atomically.)

A dataset holds ``x(sample, input)`` and ``d(sample, output)``; a CNN's holds images,
``x(sample, channel, height, width)`` (:func:`image_shape`, :func:`load_images`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import config
from .._files import atomic_write
from . import sparse
from .errors import DataError
from .kernels import init_params
from .layers import Layers

__all__ = [
    "DataError",
    "hidden_sizes",
    "as_arrays",
    "data_shape",
    "image_shape",
    "load_images",
    "check_training_args",
    "load_slice",
    "load_rows",
    "write_dataset",
    "atomic_to_netcdf",
]

# HDF5's file locks fail on some parallel file systems and are not needed for
# read-only access by many workers.
os.environ.setdefault("HDF5_USE_FILE_LOCKING", "FALSE")


def _is_path(obj: Any) -> bool:
    return isinstance(obj, (str, os.PathLike))


def _open(path: str | os.PathLike) -> Any:
    import xarray as xr

    path = os.fspath(path)
    if not os.path.exists(path):
        raise DataError(
            f"data file {path!r} does not exist; pass a netCDF file with variables x(sample, input) and d(sample, output)"
        )
    try:
        return xr.open_dataset(path, engine="h5netcdf")
    except (OSError, ValueError) as e:  # truncated, not HDF5, not netCDF-4
        raise DataError(
            f"data file {path!r} cannot be read as netCDF-4 ({type(e).__name__}: "
            f"{' '.join(str(e).split())[:160]}); is it complete? Write one with "
            f"dask_rpm.nn.data.write_dataset"
        ) from None


def _check_dataset(ds: Any, where: str, images: bool = False) -> None:
    """``x`` and ``d`` are there, numeric, on one sample dimension; ``x`` is 2-D, or 4-D
    ``(sample, channel, height, width)`` with ``images``."""
    x_form = "x(sample, channel, height, width)" if images else "x(sample, input)"
    missing = [v for v in ("x", "d") if v not in ds.variables]
    if missing:
        raise DataError(
            f"{where} has variables {sorted(map(str, ds.data_vars))}; it needs {x_form} and "
            f"d(sample, output) (missing: {', '.join(missing)})"
        )
    if images and (ds["x"].ndim != 4 or ds["d"].ndim != 2):
        raise DataError(
            f"{where}: a CNN trains on images: x must be 4-D (sample, channel, height, width) and "
            f"d 2-D (sample, output); got x{ds['x'].dims}, d{ds['d'].dims}"
        )
    if not images and (ds["x"].ndim != 2 or ds["d"].ndim != 2):
        hint = (
            "; images (sample, channel, height, width) train a CNN (a network of layers)"
            if ds["x"].ndim == 4
            else ""
        )
        raise DataError(
            f"{where}: x and d must be 2-D (sample, feature); got x{ds['x'].dims}, "
            f"d{ds['d'].dims}{hint}"
        )
    xs, ds_ = ds["x"].dims[0], ds["d"].dims[0]
    if xs != ds_:
        raise DataError(
            f"{where}: x is indexed by ({', '.join(ds['x'].dims)}) and d by "
            f"({', '.join(ds['d'].dims)}); their first "
            f"dimension must be the same sample dimension (e.g. {x_form}, d(sample, output))"
        )
    if (
        ds["x"].shape[0] != ds["d"].shape[0]
    ):  # pragma: no cover - one netCDF dimension has one length
        raise DataError(f"{where}: x has {ds['x'].shape[0]} samples but d has {ds['d'].shape[0]}")
    for name in ("x", "d"):
        if not np.issubdtype(ds[name].dtype, np.number):
            raise DataError(f"{where}: {name} has dtype {ds[name].dtype}; it must be numeric")


def first_non_finite(name: str, arr: np.ndarray, offset: int = 0) -> str | None:
    """Where the first NaN or infinite value of ``arr`` (samples x features) is, as a message; or None.

    ``offset`` is the index of ``arr``'s first row in the whole data set, so a
    worker holding a slice reports the sample index the user knows.
    """
    if sparse.issparse(arr):  # its stored values; the implicit zeros are finite
        if sparse.all_finite(arr):
            return None
        arr = sparse.dense_on(arr, arr.dtype)  # (only to say where the first bad value is)
    finite = np.isfinite(arr)
    if finite.all():
        return None
    bad = np.argwhere(~finite)
    i, j = (int(v) for v in bad[0])
    return (
        f"{name} has {len(bad)} NaN or infinite value(s); the first is {name}[{offset + i}, {j}] = "
        f"{float(arr[i, j])} (sample {offset + i}); clean or drop those samples first"
    )


def data_shape(x: Any, d: Any = None) -> tuple[int, int, int]:
    """``(s, n, l)`` of the training data without loading it."""
    if _is_path(x):
        with _open(x) as ds:
            _check_dataset(ds, f"data file {os.fspath(x)!r}")
            s, n = ds["x"].shape
            return int(s), int(n), int(ds["d"].shape[1])
    xa, da = as_arrays(x, d)
    return xa.shape[0], xa.shape[1], da.shape[1]


def image_shape(path: str | os.PathLike) -> tuple[int, tuple[int, int, int], int]:
    """``(samples, (channels, height, width), outputs)`` of an image dataset file (a CNN's
    ``x(sample, channel, height, width)``, ``d(sample, output)``) without loading it."""
    with _open(path) as ds:
        _check_dataset(ds, f"data file {os.fspath(path)!r}", images=True)
        s, c, h, w = (int(v) for v in ds["x"].shape)
        return s, (c, h, w), int(ds["d"].shape[1])


def load_images(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
    """``x(sample, channel, height, width)`` and ``d(sample, output)`` of an image dataset file,
    loaded whole: a CNN's samples are read where training starts and sent to the workers."""
    with _open(path) as ds:
        _check_dataset(ds, f"data file {os.fspath(path)!r}", images=True)
        return np.asarray(ds["x"].values), np.asarray(ds["d"].values)


def as_arrays(x: Any, d: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """Load ``x`` and ``d`` as numpy arrays from any accepted form."""
    xr: Any
    try:
        import xarray as xr
    except ImportError:  # pragma: no cover - xarray is a dependency
        xr = None
    if _is_path(x):
        with _open(x) as ds:
            _check_dataset(ds, f"data file {os.fspath(x)!r}")
            return np.asarray(ds["x"].values), np.asarray(ds["d"].values)
    if xr is not None and isinstance(x, xr.Dataset):
        _check_dataset(x, "the dataset")
        return np.asarray(x["x"].values), np.asarray(x["d"].values)
    if d is None:
        raise DataError(
            "d (teacher signals, shape (samples, outputs)) is required when x is an array"
        )
    xa, da = np.asarray(x), np.asarray(d)
    if xa.ndim != 2 or da.ndim != 2:
        raise DataError(
            f"x must be (samples, inputs) and d (samples, outputs); got x{xa.shape}, d{da.shape}"
        )
    return xa, da


def check_training_args(
    x: np.ndarray | None,
    d: np.ndarray | None,
    *,
    hidden: Any,
    iterations: int,
    learning_rate: float,
    init: Sequence[Any] | None,
    seed: int,
    dtype: str,
    shape: tuple[int, int, int] | None = None,
) -> list[np.ndarray]:
    """Validate training arguments before any work starts; return the initial weights
    ``[W_1, ..., W_L, V]`` (data inputs, no bias terms; ``[W0, V0]`` for one hidden layer).

    ``shape`` is ``(s, n, l)`` when the data are not loaded (path input).
    """
    if shape is None:
        assert x is not None and d is not None
        if x.shape[0] != d.shape[0]:
            raise DataError(
                f"x has {x.shape[0]} samples but d has {d.shape[0]}; they must have the same number of rows"
            )
        for name, arr in (("x", x), ("d", d)):
            if not np.issubdtype(arr.dtype, np.number):
                raise DataError(f"{name} has dtype {arr.dtype}; it must be numeric")
            msg = first_non_finite(name, arr)
            if msg is not None:
                raise DataError(msg)
        s, n, l = x.shape[0], x.shape[1], d.shape[1]
    else:
        s, n, l = shape
    if s < 1:
        raise DataError("the data have no samples")
    if not (isinstance(iterations, (int, np.integer)) and iterations >= 1):
        raise DataError(f"iterations={iterations!r}; it must be a positive integer")
    if not (np.isfinite(learning_rate) and learning_rate > 0):
        raise DataError(f"learning_rate={learning_rate!r}; it must be a finite number > 0")
    try:
        np.dtype(dtype)
    except TypeError as e:
        raise DataError(f"dtype={dtype!r} is not a numpy dtype; use 'float64' or 'float32'") from e
    if np.dtype(dtype) not in (np.dtype("float64"), np.dtype("float32")):
        raise DataError(f"dtype={dtype!r}; use 'float64' (exact comparisons) or 'float32' (speed)")
    if init is not None:
        return _checked_init(init, hidden, n, l, dtype)
    widths = hidden_sizes(hidden)
    layers = Layers(n, widths, l)
    _check_fits_in_memory(layers, dtype)
    return init_params(layers, seed=seed, scale=float(config.get("train.init-scale")), dtype=dtype)


def hidden_sizes(hidden: Any) -> tuple[int, ...]:
    """``hidden`` as a tuple of layer widths: an integer (one hidden layer) or a sequence of them."""
    if isinstance(hidden, (int, np.integer)) and not isinstance(hidden, bool):
        widths: tuple[Any, ...] = (hidden,)
    elif isinstance(hidden, (tuple, list)) and hidden:
        widths = tuple(hidden)
    else:
        widths = ()
    if not widths or any(
        isinstance(w, bool) or not isinstance(w, (int, np.integer)) or w < 1 for w in widths
    ):
        raise DataError(
            f"hidden={hidden!r}; give the hidden units as a positive integer (one hidden layer) or "
            f"a list of them, one per hidden layer (e.g. [512, 256])"
        )
    return tuple(int(w) for w in widths)


def _checked_init(
    init: Sequence[Any],
    hidden: Any,
    n: int,
    l: int,
    dtype: str,  # noqa: E741
) -> list[np.ndarray]:
    """The initial weights ``W_1 .. W_L, V`` (data inputs, no bias terms), checked and copied."""
    try:
        weights = [np.asarray(a) for a in init]
    except (TypeError, ValueError) as e:
        raise DataError(
            "init must be a list of weight matrices (W0, V0) or (W_1, ..., W_L, V)"
        ) from e
    shapes = [w.shape for w in weights]
    widths = tuple(w.shape[0] for w in weights[:-1]) if all(w.ndim == 2 for w in weights) else ()
    if (
        len(weights) < 2
        or not widths
        or [tuple(x) for x in shapes] != Layers(n, widths, l).full_shapes()
    ):
        raise DataError(
            f"init has weights of shapes {[tuple(x) for x in shapes]}; with {n} inputs and {l} outputs "
            f"they must be W (m, {n}) and V ({l}, m), or W_1 (m_1, {n}), W_2 (m_2, m_1), ..., "
            f"V ({l}, m_L) for several hidden layers"
        )
    if hidden is not None and hidden_sizes(hidden) != widths:
        raise DataError(
            f"hidden={hidden!r} but init has hidden layers of {list(widths)} units; make them agree"
        )
    if not all(np.all(np.isfinite(w)) for w in weights):
        raise DataError("init weights contain NaN or infinite values")
    return [w.astype(dtype, copy=True) for w in weights]


def _check_fits_in_memory(layers: Layers, dtype: str) -> None:
    """Refuse a network whose weights alone exceed this machine's memory, before allocating them."""
    need = float(sum(r * c for r, c in layers.full_shapes())) * np.dtype(dtype).itemsize
    try:
        have = float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):  # not a POSIX system: nothing to compare with
        return
    if need > have:
        hidden = layers.hidden[0] if layers.depth == 1 else list(layers.hidden)
        raise DataError(
            f"hidden={hidden}: the weights alone need {need / 2**30:.1f} GiB ({layers.n} inputs, "
            f"{layers.l} outputs, {np.dtype(dtype).name}), more than this machine's "
            f"{have / 2**30:.1f} GiB; give fewer hidden units"
        )


def load_slice(path: str, s0: int, s1: int, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """Read samples ``[s0, s1)`` of ``x`` and ``d`` from a netCDF file (runs on a worker).

    Checks the slice as :func:`check_training_args` checks arrays: a NaN or
    infinite value raises :class:`DataError` naming its sample index in the
    whole file (every sample is read by some worker before the first iteration).
    """
    with _open(path) as ds:
        x = np.ascontiguousarray(ds["x"][s0:s1].values, dtype=dtype)
        d = np.ascontiguousarray(ds["d"][s0:s1].values, dtype=dtype)
    for name, arr in (("x", x), ("d", d)):
        msg = first_non_finite(name, arr, s0)
        if msg is not None:
            raise DataError(f"data file {os.fspath(path)!r}: {msg}")
    return x, d


def load_rows(path: str, rows: np.ndarray, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """Read the samples ``rows`` (any order; read in sorted order, returned in the given order)."""
    rows = np.asarray(rows, dtype=np.int64)
    if rows.size == 0:
        with _open(path) as ds:
            return (np.empty((0, ds["x"].shape[1]), dtype), np.empty((0, ds["d"].shape[1]), dtype))
    uniq, inverse = np.unique(rows, return_inverse=True)
    with _open(path) as ds:
        x = np.asarray(ds["x"][uniq].values, dtype=dtype)
        d = np.asarray(ds["d"][uniq].values, dtype=dtype)
    return np.ascontiguousarray(x[inverse]), np.ascontiguousarray(d[inverse])


def write_dataset(path: str | os.PathLike, x: Any, d: Any, **attrs: Any) -> str:
    """Write a training dataset: ``x(sample, input)`` and ``d(sample, output)`` in one netCDF file,
    atomically - what ``data:`` in a job file and ``fit(x=path)`` read.

    Parameters
    ----------
    path : str or path
    x : array_like or pandas.DataFrame, (samples, inputs) or (samples, channels, height, width)
        Numeric (training refuses NaN and infinite values, naming the first). Images (4-D) are
        written as ``x(sample, channel, height, width)``: a CNN's data (``network:`` in a job
        file, ``fit(path, network=...)``).
    d : array_like, (samples, outputs) or (samples,)
        Targets; 1-D class labels (numbers or strings) are written one-hot,
        with the labels as the ``output`` coordinate, so a classifier trained
        on the file predicts them.
    **attrs
        Global attributes (e.g. ``source="..."``).
    """
    import xarray as xr

    xa = np.asarray(x)
    labels = None
    da = np.asarray(d)
    if da.ndim == 1:
        labels = np.unique(da)
        da = (da[:, None] == labels[None, :]).astype(np.float64)
    if xa.ndim not in (2, 4) or da.ndim != 2 or len(xa) != len(da):
        raise DataError(
            f"x{xa.shape} and d{np.asarray(d).shape}: give x as (samples, inputs) or images "
            f"(samples, channels, height, width), and d as (samples, outputs) or 1-D labels, with "
            f"one row per sample in both"
        )
    for name, arr in (("x", xa), ("d", da)):
        if not np.issubdtype(arr.dtype, np.number):
            raise DataError(f"{name} has dtype {arr.dtype}; it must be numeric")
    # NaN and infinite values are written as they are: training refuses them, naming the sample
    coords = {}
    if labels is not None:
        kind = labels.astype(str) if labels.dtype.kind in "OUS" else labels
        coords["output"] = ("output", kind, {"description": "class labels (d is one-hot)"})
    ds = xr.Dataset(
        {
            "x": (
                ("sample", "input") if xa.ndim == 2 else ("sample", "channel", "height", "width"),
                xa,
                {"description": "network inputs" if xa.ndim == 2 else "input images"},
            ),
            "d": (("sample", "output"), da, {"description": "teacher signals"}),
        },
        coords=coords,
        attrs=attrs,
    )
    return atomic_to_netcdf(ds, path)


def dataset_classes(path: str | os.PathLike) -> np.ndarray | None:
    """The class labels of a dataset :func:`write_dataset` wrote from labels (its ``output``
    coordinate), or None."""
    with _open(path) as ds:
        if "output" not in ds.coords:
            return None
        return np.asarray(ds["output"].values)


def atomic_to_netcdf(ds: Any, path: str | os.PathLike) -> str:
    """Write an xarray Dataset to ``path`` so readers see the old file or the new, never a partial one.

    Through :func:`dask_rpm._files.atomic_write`: a temporary file in the same
    directory, flushed to disk and renamed over ``path``, with the permissions
    a plain ``open()`` would give (the umask is honoured). The directory is
    created when missing; ``path`` must not be a directory or a device.
    """
    path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    return atomic_write(path, lambda tmp: ds.to_netcdf(tmp, engine="h5netcdf"))
