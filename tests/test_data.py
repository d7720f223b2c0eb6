"""dask_rpm.nn.data: netCDF files are checked as strictly as arrays (shape, sample dimension, NaN/inf)."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

from dask_rpm.nn.data import DataError, data_shape, load_slice, write_dataset


def test_each_slice_reports_the_first_bad_value_with_its_sample_index(tmp_path):
    x, d = np.ones((10, 3)), np.zeros((10, 2))
    x[7, 2], x[8, 0], d[9, 1] = np.nan, np.inf, -np.inf
    path = write_dataset(tmp_path / "bad.nc", x, d)
    assert data_shape(path) == (
        10,
        3,
        2,
    )  # the shape is fine; values are checked where they are read
    x0, _ = load_slice(path, 0, 7, "float64")  # samples 0..6 are clean
    assert x0.shape == (7, 3)
    with pytest.raises(
        DataError,
        match=r"x has 2 NaN or infinite value\(s\); the first is x\[7, 2\] = nan \(sample 7\)",
    ):
        load_slice(path, 5, 10, "float64")
    with pytest.raises(DataError, match=r"d has 1 .* d\[9, 1\] = -inf \(sample 9\)"):
        load_slice(path, 9, 10, "float64")


def test_x_and_d_on_different_sample_dimensions_are_refused(tmp_path):
    ds = xr.Dataset(
        {"x": (("sample", "input"), np.ones((6, 3))), "d": (("row", "output"), np.ones((6, 2)))}
    )
    ds.to_netcdf(tmp_path / "dims.nc", engine="h5netcdf")
    with pytest.raises(
        DataError, match=r"x is indexed by \(sample, input\) and d by \(row, output\)"
    ):
        data_shape(tmp_path / "dims.nc")
    ds = xr.Dataset(
        {"x": (("sample", "input"), np.ones((6, 3))), "d": (("row", "output"), np.ones((5, 2)))}
    )
    ds.to_netcdf(tmp_path / "lens.nc", engine="h5netcdf")
    with pytest.raises(DataError, match="same sample dimension"):
        data_shape(tmp_path / "lens.nc")


def test_a_truncated_file_and_a_network_larger_than_memory_are_one_clear_error(tmp_path):
    from dask_rpm import fit_serial

    rng = np.random.default_rng(0)
    path = tmp_path / "data.nc"
    write_dataset(path, rng.normal(size=(500, 20)), rng.normal(size=(500, 2)))
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(DataError, match=r"data\.nc' cannot be read as netCDF-4 .*is it complete"):
        fit_serial(str(path), hidden=3, iterations=1)
    # refused before allocating: hidden units whose weights need twice this machine's memory
    import os

    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    hidden = int(2 * memory / (62 * 8))
    with pytest.raises(DataError, match=rf"hidden={hidden}: the weights alone need .* GiB"):
        fit_serial(rng.normal(size=(10, 60)), rng.normal(size=(10, 2)), hidden=hidden, iterations=1)
