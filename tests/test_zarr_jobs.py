"""Zarr stores in job files (``data: {zarr: PATH, x: VAR, d: VAR}``) and in ``dask-rpm predict``.

A store written by xarray trains through ``dask-rpm train --config JOB`` on EMULATED local
workers and equals :func:`dask_rpm.fit_serial` on the same arrays (float64, 1e-10): the
problem is small and well conditioned at its learning rate (a 1e-12 change of the rate moves
the serial result by less than 1e-9, shown in the test), also when stopped after a checkpoint
and resumed. ``dask-rpm predict`` reads a store's
``x`` and writes the predictions as it does for netCDF.
"""

from __future__ import annotations

import io
import threading

import numpy as np
import pytest
import xarray as xr
import yaml
from distributed import Client, LocalCluster

pytest.importorskip("zarr")

from dask_rpm.cli import main  # noqa: E402
from dask_rpm.job import JobError, load_job, run_job  # noqa: E402
from dask_rpm.model.mlp import MLPModel  # noqa: E402
from dask_rpm.nn.network import Network  # noqa: E402
from dask_rpm.nn.serial import fit_serial  # noqa: E402

S, N, L, M = 240, 6, 3, 8
KW = dict(hidden=M, iterations=25, learning_rate=2e-3, seed=0)


def _problem():
    rng = np.random.default_rng(4)
    x = rng.normal(size=(S, N))
    x[:, -1] = 1.0  # a bias input
    return x, rng.uniform(0.1, 0.9, size=(S, L))


@pytest.fixture
def store(tmp_path):
    """A zarr store written by xarray from two datasets joined along samples (as from
    ``open_mfdataset``), its variables named as a user's might be, in chunks of 80 samples."""
    x, d = _problem()
    parts = [
        xr.Dataset(
            {"pixels": (("sample", "input"), x[a:b]), "target": (("sample", "output"), d[a:b])}
        )
        for a, b in ((0, 120), (120, S))
    ]
    path = tmp_path / "train.zarr"
    xr.concat(parts, dim="sample").chunk({"sample": 80}).to_zarr(path)
    return str(path), x, d


def _job(tmp_path, data, **over):
    job = {
        "data": data,
        "hidden": M,
        "iterations": KW["iterations"],
        "learning-rate": KW["learning_rate"],
        "seed": 0,
        "mapping": "srpm",
        "output": "result.nc",
        "workers": {"local": {"speeds": [1.0, 0.5]}},
        **over,
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def test_a_zarr_job_trains_through_the_cli_equal_to_fit_serial(tmp_path, store, capsys):
    path, x, d = store
    ref = fit_serial(x, d, **KW)
    bent = fit_serial(x, d, **{**KW, "learning_rate": KW["learning_rate"] * (1 + 1e-12)})
    assert max(float(np.abs(a - b).max()) for a, b in zip(ref.params, bent.params)) < 1e-9
    job = _job(tmp_path, {"zarr": path, "x": "pixels", "d": "target"})
    assert load_job(job).shape == (S, N, L)
    assert main(["train", "--config", str(job)]) == 0
    assert f"from {path}" in capsys.readouterr().out
    with xr.open_dataset(tmp_path / "result.nc", engine="h5netcdf") as ds:
        W, V = ds["W"].values, ds["V"].values
        assert ds.attrs["iterations"] == KW["iterations"]
    np.testing.assert_allclose(W, ref.params[0], rtol=1e-10, atol=0)
    np.testing.assert_allclose(V, ref.params[1], rtol=1e-10, atol=0)
    # the trained model predicts from the store's inputs, read by dask-rpm predict
    model = tmp_path / "result.model.nc"
    out = tmp_path / "pred.nc"
    xs = tmp_path / "inputs.zarr"
    xr.Dataset({"x": (("sample", "input"), x)}).chunk({"sample": 100}).to_zarr(xs)
    assert main(["predict", "--model", str(model), "--data", str(xs), "--output", str(out)]) == 0
    assert f"predicted {S} sample(s)" in capsys.readouterr().out
    with xr.open_dataset(out, engine="h5netcdf") as ds:
        pred = ds["prediction"].values
    np.testing.assert_allclose(pred, MLPModel.load(model).predict(x), rtol=1e-12)


def test_a_store_path_alone_reads_x_and_d(tmp_path):
    x, d = _problem()
    path = tmp_path / "plain.zarr"
    xr.Dataset({"x": (("sample", "input"), x), "d": (("sample", "output"), d)}).to_zarr(path)
    job = load_job(_job(tmp_path, str(path)))
    assert job.data_vars == ("x", "d") and job.shape == (S, N, L)
    labels = tmp_path / "labels.zarr"
    y = np.arange(S) % 4
    xr.Dataset({"x": (("sample", "input"), x), "y": (("sample",), y)}).to_zarr(labels)
    job = load_job(_job(tmp_path, {"zarr": str(labels), "d": "y"}, loss="cross-entropy"))
    assert job.shape == (S, N, 4)  # 1-D labels: their classes


def test_predict_scores_a_store_holding_d(tmp_path, store, capsys):
    path, x, d = store
    model = MLPModel(*fit_serial(x, d, **KW).params, Network())  # sigmoid units, linear outputs
    mpath = tmp_path / "m.nc"
    model.save(mpath)
    plain = tmp_path / "xd.zarr"
    xr.Dataset({"x": (("sample", "input"), x), "d": (("sample", "output"), d)}).to_zarr(plain)
    out = tmp_path / "p.nc"
    assert main(["predict", "--model", str(mpath), "--data", str(plain), "--output", str(out)]) == 0
    assert "R^2 against d" in capsys.readouterr().out
    with xr.open_dataset(out, engine="h5netcdf") as ds:
        assert ds.attrs["r2"] == pytest.approx(model.score(x, d), rel=1e-12)
    # a store without x
    other = str(tmp_path / "q.nc")
    assert main(["predict", "--model", str(mpath), "--data", path, "--output", other]) == 2
    err = capsys.readouterr().err
    assert "['pixels', 'target']" in err and "x(sample, input)" in err


@pytest.mark.parametrize(
    "data, needle",
    [
        ({"zarr": "missing.zarr"}, "does not exist"),
        ({"zarr": "STORE", "x": "pixel"}, "no variable 'pixel' for x (its variables: ['pixels', "),
        ({"zarr": "STORE", "x": "pixels"}, "no variable 'd' for d"),
        ({"zarr": "STORE", "x": "pixels", "d": ""}, "data.d=''"),
        ({"zarr": "STORE", "y": "target"}, "unknown key 'y' in data"),
        ({"x": "pixels"}, "a mapping names a zarr store"),
    ],
)
def test_bad_zarr_data_exits_2_with_one_line(tmp_path, store, capsys, data, needle):
    data = {k: (store[0] if v == "STORE" else v) for k, v in data.items()}
    job = _job(tmp_path, data)
    with pytest.raises(JobError):
        load_job(job)
    assert main(["train", "--config", str(job)]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1


def test_a_cnn_job_trains_on_the_images_of_a_zarr_store_equal_to_fit_serial(tmp_path, capsys):
    """Images x(sample, channel, height, width) and 1-D labels in a zarr store: the job's
    EMULATED workers train from its chunks (the classes found on the workers), the output is
    fit_serial's, and dask-rpm predict reads the store's images."""
    rng = np.random.default_rng(3)
    x, y = rng.normal(size=(24, 2, 8, 8)), rng.integers(0, 3, size=24)
    path = tmp_path / "images.zarr"
    dims = ("sample", "channel", "height", "width")
    xr.Dataset({"x": (dims, x), "y": (("sample",), y)}).chunk({"sample": 8}).to_zarr(path)
    network = [{"conv": 3, "kernel": 3, "padding": 1}, "relu", {"maxpool": 2}, "flatten"]
    network += [{"linear": 5}, "tanh", {"linear": 3}]
    kw = dict(loss="cross-entropy", optimizer="adam", reduction="mean", learning_rate=0.05)
    job = _job(tmp_path, {"zarr": str(path), "d": "y"}, hidden=None, **{"batch-size": 8})
    text = {k: v for k, v in yaml.safe_load(job.read_text()).items() if k != "hidden"}
    text.update(network=network, iterations=8, **{k.replace("_", "-"): v for k, v in kw.items()})
    job.write_text(yaml.safe_dump(text))
    assert load_job(job).shape == (24, 2 * 8 * 8, 3)
    assert main(["train", "--config", str(job)]) == 0
    ref = fit_serial(x, y, network=network, iterations=8, batch_size=8, seed=0, **kw)
    with xr.open_dataset(tmp_path / "result.nc", engine="h5netcdf") as ds:
        got = [ds[n].values for n in ("W1", "b1", "W2", "b2", "V")]
        errors = ds["error"].values
    for a, b in zip(got, ref.params):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-14 * np.abs(b).max())
    np.testing.assert_allclose(errors, ref.errors, rtol=1e-10, atol=0)
    out = tmp_path / "pred.nc"
    model = tmp_path / "result.model.nc"
    assert main(["predict", "--model", str(model), "--data", str(path), "--output", str(out)]) == 0
    assert "predicted 24 sample(s)" in capsys.readouterr().out


def test_a_cnn_job_refuses_rows_in_a_zarr_store(tmp_path, store):
    job = _job(tmp_path, {"zarr": store[0], "x": "pixels", "d": "target"}, hidden=None)
    text = yaml.safe_load(job.read_text())
    text.pop("hidden")
    text["network"] = [{"conv": 2, "kernel": 3}, "flatten", {"linear": 3}]
    job.write_text(yaml.safe_dump(text))
    with pytest.raises(JobError, match=r"a CNN trains on images x\(sample, channel, height"):
        load_job(job)


class _StopAfterCheckpoint(io.StringIO):
    """The job's progress lines; sets ``stop`` once a checkpoint is written into the store."""

    def __init__(self, stop: threading.Event) -> None:
        super().__init__()
        self.stop = stop

    def write(self, s: str) -> int:
        if s.startswith("checkpoint at iteration"):
            self.stop.set()
        return super().write(s)


def test_a_stopped_zarr_job_resumes_equal_to_fit_serial(tmp_path, store):
    """Stopped after its first checkpoint (what SIGTERM does), then --resume: the store's chunks
    are read again and the result equals the uninterrupted serial run."""
    path, x, d = store
    kw = {**KW, "iterations": 60}
    job = _job(
        tmp_path,
        {"zarr": path, "x": "pixels", "d": "target"},
        iterations=60,
        checkpoint={"every": 10},
        config={"drpm": {"interval": 10}},
    )
    stop = threading.Event()
    out = _StopAfterCheckpoint(stop)
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None
        ) as cluster,
        Client(cluster, set_as_default=False) as client,
    ):
        first = run_job(job, client=client, out=out, stop=stop)
        assert first["stopped"].startswith("stop requested") and first["iterations"] < 60
        done = run_job(job, client=client, out=io.StringIO(), resume=True)
    assert done["iterations"] == 60
    ref = fit_serial(x, d, **kw)
    with xr.open_dataset(tmp_path / "result.nc", engine="h5netcdf") as ds:
        np.testing.assert_allclose(ds["W"].values, ref.params[0], rtol=1e-10, atol=0)
        np.testing.assert_allclose(ds["V"].values, ref.params[1], rtol=1e-10, atol=0)
        np.testing.assert_allclose(ds["error"].values, ref.errors, rtol=1e-10, atol=0)
