"""Files dask_rpm writes are standard netCDF-4: ``ncdump`` and xarray's netCDF4 engine read them, no warnings.

Covers ``dask_rpm.nn.data.atomic_to_netcdf`` (datasets, job output, checkpoints)
through the command a user runs: ``dask-rpm train --config job.yaml``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import warnings

import numpy as np
import pytest
import xarray as xr
import yaml

from dask_rpm.nn.data import write_dataset


def _need_readers() -> None:
    in_ci = os.environ.get("CI", "").lower() == "true"
    missing = [
        what
        for what, ok in (
            ("ncdump (apt package netcdf-bin)", shutil.which("ncdump")),
            ("the netCDF4 Python package", _has_netcdf4()),
        )
        if not ok
    ]
    if missing:
        msg = f"needs {' and '.join(missing)} (tests/run.sh installs them)"
        pytest.fail(msg) if in_ci else pytest.skip(msg)


def _has_netcdf4() -> bool:
    try:
        import netCDF4  # noqa: F401
    except ImportError:
        return False
    return True


def _read_with_other_tools(path) -> xr.Dataset:
    """ncdump must print the header without complaint; the netCDF-C library (netCDF4) must open it warning-free."""
    p = subprocess.run(["ncdump", "-h", str(path)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stderr == "", p.stderr
    assert p.stdout.startswith("netcdf ")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with xr.open_dataset(path, engine="netcdf4") as ds:
            return ds.load()


def test_training_dataset_is_standard_netcdf4(tmp_path):
    _need_readers()
    x = np.arange(12.0).reshape(4, 3)
    d = np.eye(4)[:, :2]
    with warnings.catch_warnings():
        warnings.simplefilter(
            "error"
        )  # h5netcdf warns when it writes features other tools cannot read
        write_dataset(tmp_path / "data.nc", x, d, source="test")
    ds = _read_with_other_tools(tmp_path / "data.nc")
    np.testing.assert_array_equal(ds["x"].values, x)
    np.testing.assert_array_equal(ds["d"].values, d)
    assert ds.attrs["source"] == "test"


@pytest.mark.slow
def test_train_config_output_is_standard_netcdf4_and_prints_no_warning(tmp_path):
    _need_readers()
    rng = np.random.default_rng(0)
    x = np.column_stack([rng.normal(size=(200, 5)), np.ones(200)])
    d = (x[:, :2] > 0).astype(float)
    write_dataset(tmp_path / "data.nc", x, d)
    job = {
        "data": "data.nc",
        "hidden": 6,
        "iterations": 30,
        "learning-rate": 0.01,
        "mapping": "drpm",
        "output": "result.nc",
        "checkpoint": {"every": 10},
        "workers": {"local": {"speeds": [1.0, 0.5]}},
        "config": {"drpm": {"interval": 10}},
    }
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    p = subprocess.run(
        [sys.executable, "-m", "dask_rpm.cli", "train", "--config", "job.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert "netcdf" not in p.stderr.lower() and "warning" not in p.stderr.lower(), p.stderr[-3000:]
    ds = _read_with_other_tools(tmp_path / "result.nc")
    assert ds.attrs["status"] == "complete" and int(ds.attrs["iterations"]) == 30
    assert ds["W"].shape == (6, 6) and ds["V"].shape == (2, 6) and ds.sizes["iteration"] == 30
    assert '"rectangles"' in str(ds["plan_json"].values[0])
    assert ds["address"].dtype.kind in "UO" and all(
        str(a).startswith("tcp://") for a in ds["address"].values
    )
    # the model file written next to the output (dask_rpm.MLPModel) is standard netCDF-4 too
    assert sorted(os.listdir(tmp_path)) == ["data.nc", "job.yaml", "result.model.nc", "result.nc"]
    model = _read_with_other_tools(tmp_path / "result.model.nc")
    assert model.sizes and len(model.data_vars) >= 2
