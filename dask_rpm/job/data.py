"""The ``data:`` section of a job file: where the samples are and the shape they have.

A netCDF file (an MLP's ``x(sample, input)`` and ``d(sample, output)``, or a CNN's images
``x(sample, channel, height, width)``) or a zarr store and its two variables; each is read
far enough to know its shape, so a job with bad data is refused before any worker starts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import numpy as np

from ..nn.chunked import zarr_path, zarr_variables
from ..nn.data import DataError, data_shape, image_shape
from .spec import JobError, bad, unknown

T = TypeVar("T")

__all__ = ["data_source", "image_file_shape", "netcdf_shape", "zarr_image_shape", "zarr_shape"]


def _read(raw: Mapping[str, Any], read: Callable[[str], T], data: str, layout: str) -> T:
    """``read(data)``, its errors as one job-file error; ``layout``: the file's variables."""
    try:
        return read(data)
    except DataError as e:
        raise JobError(f"job file: data: {e}") from None
    except (OSError, ValueError) as e:
        raise JobError(
            f"job file: data={raw['data']!r} cannot be read as netCDF ({e}); give a netCDF file "
            f"with {layout}"
        ) from None


def netcdf_shape(raw: Mapping[str, Any], data: str) -> tuple[int, int, int]:
    """``(samples, inputs, outputs)`` of the data file."""
    return _read(raw, data_shape, data, "x(sample, input) and d(sample, output)")


#: The keys of ``data:`` given as a mapping (a zarr store and its variables).
_ZARR_KEYS = ("zarr", "x", "d")


def data_source(
    raw: Mapping[str, Any], rel: Callable[[Any, str], str]
) -> tuple[str, tuple[str, str] | None]:
    """``(path of the data, (x, d) variable names of a zarr store or None for netCDF)``:
    ``data: FILE.nc``, ``data: STORE.zarr`` or ``data: {zarr: PATH, x: VAR, d: VAR}``."""
    spec = raw["data"]
    if not isinstance(spec, Mapping):
        path = rel(spec, "data")
        return path, (("x", "d") if zarr_path(path) else None)
    unknown(spec, _ZARR_KEYS, "data")
    if "zarr" not in spec:
        raise bad(
            "data",
            dict(spec),
            "a mapping names a zarr store: zarr: PATH, with optional x: and d: variables",
            "Write e.g. data: {zarr: train.zarr, x: x, d: d}, or data: FILE.nc for netCDF.",
        )
    path = rel(spec["zarr"], "data.zarr")
    names = []
    for key in ("x", "d"):
        v = spec.get(key, key)
        if not isinstance(v, str) or not v.strip():
            raise bad(
                f"data.{key}",
                v,
                "expected the name of a variable of the store",
                f"Write e.g. {key}: {key}.",
            )
        names.append(v)
    return path, (names[0], names[1])


def _zarr_pair(path: str, names: tuple[str, str], images: bool) -> tuple[Any, Any, int]:
    """The store's ``x`` and ``d`` (``sample`` first) and the number of outputs (1-D class
    labels: their classes, found by reading the labels alone); ``images``: a CNN's ``x``."""
    try:
        x, d = zarr_variables(path, *names)
    except DataError as e:
        raise JobError(f"job file: data: {e}") from None
    want = 4 if images else 2
    if x.ndim != want or d.ndim not in (1, 2):
        layout = (
            "a CNN trains on images x(sample, channel, height, width)"
            if images
            else "an MLP trains on x(sample, input)"
        )
        raise JobError(
            f"job file: data: the zarr store {path!r} has {names[0]}{x.dims} and "
            f"{names[1]}{d.dims}; {layout} and d(sample, output) or 1-D class labels d(sample)"
        )
    if x.sizes["sample"] != d.sizes["sample"]:
        raise JobError(
            f"job file: data: in the zarr store {path!r} {names[0]} has {x.sizes['sample']} "
            f"samples and {names[1]} {d.sizes['sample']}; they must have the same samples"
        )
    x = x.transpose("sample", ...)
    if d.ndim == 2:
        return x, d, int(d.transpose("sample", ...).shape[1])
    return x, d, int(np.unique(d.values).size)


def zarr_shape(path: str, names: tuple[str, str]) -> tuple[int, int, int]:
    """``(samples, inputs, outputs)`` of a zarr store's variables for an MLP."""
    x, _, l = _zarr_pair(path, names, images=False)
    return int(x.shape[0]), int(x.shape[1]), l


def zarr_image_shape(path: str, names: tuple[str, str]) -> tuple[int, tuple[int, int, int], int]:
    """``(samples, (channels, height, width), outputs)`` of a zarr store's images for a CNN."""
    x, _, l = _zarr_pair(path, names, images=True)
    return int(x.shape[0]), (int(x.shape[1]), int(x.shape[2]), int(x.shape[3])), l


def image_file_shape(raw: Mapping[str, Any], data: str) -> tuple[int, tuple[int, int, int], int]:
    """``(samples, (channels, height, width), outputs)`` of a CNN's data file."""
    layout = "x(sample, channel, height, width) and d(sample, output)"
    return _read(raw, image_shape, data, layout)
