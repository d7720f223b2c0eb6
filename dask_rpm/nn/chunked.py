"""Training data as Dask arrays chunked along samples: ``dask.array``, xarray and zarr.

Pure (dask.array and xarray; no ``distributed``): what :func:`dask_rpm.fit` and
:func:`dask_rpm.fit_serial` do alike with a Dask user's data before any work. Every form
becomes one :class:`ChunkedPair`, ``x (samples, inputs)`` and ``d (samples, outputs)`` (or
1-D class labels) chunked along samples only, with ``d``'s row chunks those of ``x``:

* a ``dask.array`` (``d`` a dask array, or numpy, cut like ``x``);
* an ``xarray.DataArray`` with a ``sample`` dimension, or a ``Dataset`` holding
  ``x(sample, input)`` and ``d(sample, output)`` as a training dataset file does;
* a zarr store path or URL (``*.zarr``, or a directory with zarr metadata), opened with
  ``xarray.open_zarr`` (the ``zarr`` package).

``fit_serial`` computes the pair (:func:`computed`); ``fit`` keeps it on the cluster
(:mod:`dask_rpm.engine.dask_data`). :class:`LazySamples` is what :func:`~dask_rpm.nn.prepare.prepare`
is given for data left on the cluster: their shape and classes, without the rows.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any, NamedTuple

import numpy as np

from .batches import ChunkOrder
from .data import DataError
from .recipe import holdout

__all__ = [
    "ChunkedPair",
    "LazySamples",
    "as_chunked",
    "chunked_inputs",
    "chunked_weights",
    "computed",
    "is_chunked",
    "zarr_path",
    "zarr_variables",
]

logger = logging.getLogger("dask_rpm")

SAMPLE = "sample"  # the sample dimension of xarray data, as in a training dataset file
_ZARR_META = (".zgroup", ".zarray", "zarr.json")


class ChunkedPair(NamedTuple):
    """``x`` and ``d`` as dask arrays with the same row chunks; ``notes``: what was changed."""

    x: Any
    d: Any
    notes: tuple[str, ...] = ()


class LazySamples(NamedTuple):
    """Training samples that stay on the cluster, as :func:`~dask_rpm.nn.prepare.prepare` sees them.

    ``shape`` is ``(samples, inputs, outputs)`` of the training samples, ``classes`` the labels
    one-hot encoded (or None), and ``holder`` the engine's object that gives each worker its
    rows (and puts a plan's cuts on its chunks).
    """

    shape: tuple[int, int, int]
    classes: np.ndarray | None
    holder: Any
    #: a CNN's image shape ``(channels, height, width)``: each row is one image, flattened
    image: tuple[int, int, int] | None = None
    #: the training samples' weights (``sample_weight``), also the targets' last column
    weights: np.ndarray | None = None
    #: the validation rows held out on the cluster, ``(x, d)`` (None: no fraction held out)
    held: tuple[Any, Any] | None = None


def zarr_path(x: Any) -> bool:
    """Whether ``x`` names a zarr store: a path or URL ending in ``.zarr``, or a directory
    holding zarr metadata."""
    if not isinstance(x, (str, os.PathLike)):
        return False
    s = os.fspath(x).rstrip("/")
    if s.endswith(".zarr"):
        return True
    return os.path.isdir(s) and any(os.path.exists(os.path.join(s, m)) for m in _ZARR_META)


def _is_dask(a: Any) -> bool:
    return type(a).__module__.startswith("dask.array")


def _xarray_dask(a: Any) -> bool:
    """An xarray object with at least one dask-backed variable."""
    if not type(a).__module__.startswith("xarray"):
        return False
    arrays = [a.data] if hasattr(a, "dims") and not hasattr(a, "data_vars") else []
    if hasattr(a, "data_vars"):
        arrays = [v.data for v in a.data_vars.values()]
    return any(_is_dask(v) for v in arrays)


def _is_frame(a: Any) -> bool:
    """A dask DataFrame or Series."""
    return type(a).__module__.startswith("dask.dataframe") and hasattr(a, "to_dask_array")


def is_chunked(x: Any, d: Any = None) -> bool:
    """Whether the data are Dask's: a dask array, dask-backed xarray, a dask DataFrame or Series,
    or a zarr store."""
    return any(_is_dask(v) or _xarray_dask(v) or _is_frame(v) for v in (x, d)) or zarr_path(x)


def _frame_array(a: Any, name: str, labels: bool) -> tuple[Any, str]:
    """A dask DataFrame's numeric columns (or a Series) as a dask array with known chunk sizes,
    and the note saying so. Its partitions' lengths are computed (one pass over the data, with
    Dask's current scheduler), since a column's rows are cut by sample index. A Series of
    ``labels`` may hold any values (class labels)."""
    import warnings

    if a.ndim == 2:
        bad = [str(c) for c, t in a.dtypes.items() if getattr(t, "kind", "O") not in "biuf"]
        if bad:
            raise DataError(
                f"{name} is a dask DataFrame whose columns {bad} are not numbers; every column "
                f"must be numeric: drop them ({name}.drop(columns={bad})) or encode them "
                f"(e.g. dask_ml.preprocessing.Categorizer and DummyEncoder)"
            )
    elif not labels and getattr(a.dtype, "kind", "O") not in "biuf":
        raise DataError(
            f"{name} is a dask Series of {a.dtype}; it must hold numbers: convert it "
            f"({name}.astype('float64'))"
        )
    with warnings.catch_warnings():  # a Series of strings becomes object labels, as intended
        warnings.filterwarnings("ignore", message=".*converting pandas extension dtypes.*")
        arr = a.to_dask_array(lengths=True)
    kind = "DataFrame" if a.ndim == 2 else "Series"
    return arr, (
        f"{name} was a dask {kind}; converted with to_dask_array(lengths=True), its partitions "
        f"the row chunks"
    )


def as_chunked(x: Any, d: Any = None) -> ChunkedPair:
    """``x`` and ``d`` in any of the module's forms as one :class:`ChunkedPair`.

    Raises
    ------
    DataError
        A form it does not take, unknown chunk sizes, arrays of other lengths or
        dimensions; chunks along features and ``d`` chunked unlike ``x`` are fixed with a note
        (logged on ``dask_rpm``).
    """
    import dask.array as da  # a dask array module: imported when dask data are given

    if zarr_path(x):
        x = _open_zarr(x)
    if hasattr(x, "data_vars"):  # a Dataset: x(sample, input), d(sample, output)
        if d is not None:
            raise DataError(
                "d given with an xarray Dataset; its d(sample, output) are the targets: leave d "
                "out, or pass x and d as DataArrays"
            )
        missing = [v for v in ("x", "d") if v not in x.data_vars]
        if missing:
            raise DataError(
                f"the Dataset has variables {sorted(x.data_vars)}; it needs x(sample, input) and "
                f"d(sample, output) (missing: {missing}), as dask_rpm.nn.data.write_dataset writes"
            )
        x, d = x["x"], x["d"]
    if d is None:
        raise DataError("d is required with dask x: pass the targets (or 1-D class labels)")
    notes: list[str] = []
    if _is_frame(x):
        x, note = _frame_array(x, "x", labels=False)
        notes.append(note)
    if _is_frame(d):
        d, note = _frame_array(d, "d", labels=True)
        notes.append(note)
    xa = _array(x, "x", da, None)
    da_ = _array(d, "d", da, xa.chunks[0] if xa.ndim else None)
    if xa.ndim not in (2, 4):
        raise DataError(
            f"x has shape {xa.shape}; dask x must be (samples, inputs), or a CNN's images "
            f"(samples, channels, height, width)"
        )
    if da_.ndim not in (1, 2):
        raise DataError(f"d must be (samples, outputs) or 1-D labels; got shape {da_.shape}")
    for name, a in (("x", xa), ("d", da_)):
        if any(np.isnan(c) for dim in a.chunks for c in dim):
            raise DataError(
                f"{name} has unknown chunk sizes (shape {a.shape}), e.g. after boolean indexing; "
                f"call {name} = {name}.compute_chunk_sizes() first"
            )
    if xa.shape[0] != da_.shape[0]:
        raise DataError(
            f"x has {xa.shape[0]} samples and d {da_.shape[0]}; they must have the same samples"
        )
    if any(len(c) > 1 for c in xa.chunks[1:]):  # a column's rows are whole samples
        xa = xa.rechunk({i: -1 for i in range(1, xa.ndim)})
        what = "inputs" if xa.ndim == 2 else "channels, height or width"
        notes.append(f"x was chunked along its {what}; rechunked to whole samples")
    if da_.ndim == 2 and len(da_.chunks[1]) > 1:
        da_ = da_.rechunk({1: -1})
        notes.append("d was chunked along its outputs; rechunked to whole rows")
    if da_.chunks[0] != xa.chunks[0]:
        da_ = da_.rechunk({0: xa.chunks[0]})
        notes.append("d was chunked unlike x along samples; rechunked to x's chunks")
    for note in notes:
        logger.warning(f"dask data: {note}")
    return ChunkedPair(xa, da_, tuple(notes))


def _array(a: Any, name: str, da: Any, rows: Any) -> Any:
    """One dask array of ``a``: xarray with ``sample`` first, a dask array as it is, numpy cut
    into ``rows`` along samples (x's row chunks; None: one chunk)."""
    if type(a).__module__.startswith("xarray"):
        if SAMPLE not in a.dims:
            raise DataError(
                f"{name} has dimensions {a.dims}; xarray data need a {SAMPLE!r} dimension "
                f"(rename yours: {name}.rename({{'time': 'sample'}}))"
            )
        a = a.transpose(SAMPLE, ...).data
    if _is_dask(a):
        return a
    arr = np.asarray(a)
    if rows is None or arr.ndim == 0 or arr.shape[0] != sum(rows):
        return da.from_array(arr, chunks=(-1,) * arr.ndim)  # the length check then says why
    return da.from_array(arr, chunks=(rows, *((-1,) * (arr.ndim - 1))))


def chunked_weights(w: Any, rows: Any) -> Any:
    """Sample weights ``w`` (numpy, a dask array or Series, an xarray ``DataArray`` with a
    ``sample`` dimension) as one 1-D dask array cut into x's row chunks ``rows``."""
    import dask.array as da  # with dask data only

    if _is_frame(w):
        w = _frame_array(w, "sample_weight", labels=False)[0]
    wa = _array(w, "sample_weight", da, rows)
    if wa.ndim != 1 or wa.shape[0] != sum(rows):
        raise DataError(
            f"sample_weight has shape {wa.shape}; give one number per sample: ({sum(rows)},)"
        )
    return wa.rechunk({0: rows}) if wa.chunks[0] != tuple(rows) else wa


def _open_zarr(path: Any) -> Any:
    """The zarr store at ``path`` as a dask-backed Dataset."""
    import xarray as xr  # xarray's zarr backend needs the zarr package: imported when asked

    try:
        import zarr  # noqa: F401 - only to say what is missing
    except ImportError:
        raise DataError(
            f"{os.fspath(path)!r} is a zarr store; reading it needs the zarr package: "
            f"pip install 'dask-rpm[zarr]'"
        ) from None
    try:
        return xr.open_zarr(os.fspath(path))
    except (FileNotFoundError, KeyError, ValueError) as exc:
        raise DataError(
            f"cannot open the zarr store {os.fspath(path)!r}: {exc}; give a store written by "
            f"xarray (Dataset.to_zarr) with x(sample, input) and d(sample, output)"
        ) from None


def computed(x: Any, d: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """``x`` and ``d`` (any form :func:`as_chunked` takes) computed into numpy arrays: what
    :func:`~dask_rpm.nn.serial.fit_serial`, the reference, trains on."""
    import dask  # computed with the current scheduler (a default distributed client, if any)

    pair = as_chunked(x, d)
    xv, dv = dask.compute(pair.x, pair.d)
    return np.asarray(xv), np.asarray(dv)


def chunked_inputs(x: Any) -> Any:
    """``x`` alone, what a trained model predicts from, as one dask array chunked along samples
    only: a dask array, an xarray ``DataArray`` with a ``sample`` dimension, or the ``x`` of a
    ``Dataset`` or zarr store. Chunks across the other dimensions are joined (a model's input
    is a whole row or image), with a note logged on ``dask_rpm``.

    Raises
    ------
    DataError
        A form it does not take, a Dataset or store without ``x``, fewer than 2 dimensions,
        unknown chunk sizes.
    """
    import dask.array as da  # a dask array module: imported when dask data are given

    if zarr_path(x):
        x = _open_zarr(x)
    if _is_frame(x):
        x, note = _frame_array(x, "x", labels=False)
        logger.warning(f"dask data: {note}")
    if hasattr(x, "data_vars"):
        if "x" not in x.data_vars:
            raise DataError(
                f"the Dataset has variables {sorted(map(str, x.data_vars))}; the inputs are its "
                f"x(sample, input): name them x, or pass the DataArray itself"
            )
        x = x["x"]
    xa = _array(x, "x", da, None)
    if xa.ndim < 2:
        raise DataError(
            f"x has shape {xa.shape}; inputs are (samples, inputs), or a CNN's images "
            f"(samples, channels, height, width): reshape 1-D x to x[:, None]"
        )
    if any(np.isnan(c) for dim in xa.chunks for c in dim):
        raise DataError(
            f"x has unknown chunk sizes (shape {xa.shape}), e.g. after boolean indexing; call "
            f"x = x.compute_chunk_sizes() first"
        )
    if any(len(c) > 1 for c in xa.chunks[1:]):
        xa = xa.rechunk({i: -1 for i in range(1, xa.ndim)})
        logger.warning("dask data: x was chunked along its inputs; rechunked to whole rows")
    return xa


def zarr_variables(path: Any, x: str = "x", d: str = "d") -> tuple[Any, Any]:
    """The variables ``x`` and ``d`` of the zarr store at ``path`` as dask-backed
    ``DataArray`` objects with a ``sample`` dimension (what a job file's ``data: {zarr: PATH,
    x: VAR, d: VAR}`` trains on); nothing is read but the store's metadata.

    Raises
    ------
    DataError
        No store at ``path``, the zarr package missing, a variable missing (the message lists
        the store's variables), a variable without a ``sample`` dimension.
    """
    where = os.fspath(path)
    if not os.path.exists(where) and "://" not in where:
        raise DataError(
            f"the zarr store {where!r} does not exist; give the directory a Dataset.to_zarr "
            f"wrote (e.g. data: {{zarr: train.zarr, x: x, d: d}})"
        )
    ds = _open_zarr(path)
    have = sorted(map(str, ds.data_vars))
    for role, name in (("x", x), ("d", d)):
        if name not in ds.data_vars:
            raise DataError(
                f"the zarr store {where!r} has no variable {name!r} for {role} (its variables: "
                f"{have}); name the {'inputs' if role == 'x' else 'targets'} with {role}: VAR"
            )
        if SAMPLE not in ds[name].dims:
            raise DataError(
                f"variable {name!r} of the zarr store {where!r} has dimensions {ds[name].dims}; "
                f"it needs a {SAMPLE!r} dimension (rename yours when writing the store: "
                f"ds.rename({{'time': 'sample'}}).to_zarr(...))"
            )
    return ds[x], ds[d]


def chunk_order(chunks: Any, rows: np.ndarray | None = None, stream: bool = False) -> Any:
    """The chunk-local shuffle (``shuffle="chunks"``), or with ``stream`` the chunk stream
    (``"stream"``), over data chunks of ``chunks`` rows: a
    :class:`~dask_rpm.nn.batches.ChunkOrder` of the training samples each chunk holds.

    ``rows`` are the data rows trained on (sorted: a validation split's), None: every row. A
    chunk's training samples are then consecutive, so the training chunks are their counts
    (a chunk left without any is dropped).
    """
    sizes = np.asarray([int(c) for c in chunks], dtype=np.int64)
    if rows is not None:
        bounds = np.concatenate([[0], np.cumsum(sizes)])
        sizes = np.diff(np.searchsorted(np.asarray(rows), bounds))
    return ChunkOrder(tuple(int(c) for c in sizes if c > 0), stream)


def serial_inputs(x: Any, d: Any, options: Any) -> tuple[np.ndarray, np.ndarray, Any]:
    """What :func:`~dask_rpm.nn.serial.fit_serial` trains on for Dask's data: ``x`` and ``d``
    computed, and ``options`` (:class:`~dask_rpm.nn.options.TrainingOptions`) with
    ``shuffle="chunks"`` / ``"stream"`` made the chunk-local shuffle / chunk stream over the
    data's chunks, as ``fit`` on
    the cluster does."""
    pair = as_chunked(x, d)
    xv, dv = computed(pair.x, pair.d)
    o = options.resolved()
    if isinstance(o.shuffle, str) and o.shuffle in ("chunks", "stream"):
        rows = None
        val = o.validation
        if val is not None and not isinstance(val, (tuple, list, bool)):
            rows = holdout(xv.shape[0], float(val), int(o.seed))[0]
        order = chunk_order(pair.x.chunks[0], rows, o.shuffle == "stream")
        options = dataclasses.replace(options, shuffle=order)
    return xv, dv, options
