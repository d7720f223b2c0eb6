"""``dask-rpm train`` writes a model (job training keys); ``dask-rpm predict`` applies it; bad input exits 2."""

from __future__ import annotations

import os

import numpy as np
import pytest
import xarray as xr
import yaml
from distributed import Client, LocalCluster

from dask_rpm import MLPModel, fit_serial
from dask_rpm.cli import main
from dask_rpm.job import JobError, load_job, run_job
from dask_rpm.nn.data import write_dataset
from dask_rpm.nn.network import Network

RTOL = 1e-10


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    """400 scikit-learn digits (pixels / 16, one-hot targets) for training, 200 more for prediction."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = x / 16.0
    d = np.eye(10)[y]
    base = tmp_path_factory.mktemp("data")
    write_dataset(base / "train.nc", x[:400], d[:400])
    write_dataset(base / "test.nc", x[400:600], d[400:600])
    np.save(base / "test.npy", x[400:600])
    return base, x, y, d


JOB = {
    "hidden": 16,
    "learning-rate": 0.01,
    "mapping": "srpm",
    "output": "result.nc",
    "seed": 3,
    "workers": {"local": {"speeds": [1.0, 0.5]}},
    "epochs": 3,
    "batch-size": 50,
    "loss": "cross-entropy",
    "activation": "tanh",
    "bias": True,
    "optimizer": "adam",
    "validation": 0.1,
}


def _job(tmp_path, data, **over):
    job = dict(JOB, data=str(data))
    job.update(over)
    job = {k: v for k, v in job.items() if v is not None}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def test_train_job_with_training_keys_writes_a_model_that_predict_applies(tmp_path, digits, capsys):
    base, x, y, d = digits
    path = _job(tmp_path, base / "train.nc")
    job = load_job(path)
    # 400 samples, 40 held out: 360 train, batches of 50 -> 8 per epoch
    assert job.training.iterations == 3 * 8 and job.model == str(tmp_path / "result.model.nc")
    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0"
    ) as cluster:
        with Client(cluster) as client, open(os.devnull, "w") as out:
            run_job(path, client=client, out=out)
    model = MLPModel.load(tmp_path / "result.model.nc")
    assert model.net == Network("tanh", "cross-entropy", "softmax", True) and model.is_classifier
    assert (
        model.meta["recipe"]["optimizer"]["name"] == "adam"
        and model.meta["recipe"]["batch_size"] == 50
    )
    assert model.meta["plans"] and "job" in model.meta and len(model.meta["validation"]) == 3
    ref = fit_serial(
        x[:400],
        d[:400],
        hidden=16,
        epochs=3,
        batch_size=50,
        learning_rate=0.01,
        seed=3,
        loss="cross-entropy",
        activation="tanh",
        bias=True,
        optimizer="adam",
        validation=0.1,
    )
    np.testing.assert_allclose(model.params[0], ref.params[0], rtol=RTOL, atol=0)
    np.testing.assert_allclose(model.params[-1], ref.params[-1], rtol=RTOL, atol=0)

    out = tmp_path / "pred.nc"
    assert (
        main(
            [
                "predict",
                "--model",
                str(tmp_path / "result.model.nc"),
                "--data",
                str(base / "test.nc"),
                "--output",
                str(out),
            ]
        )
        == 0
    )
    line = capsys.readouterr().out
    with xr.open_dataset(out, engine="h5netcdf") as ds:
        ds.load()
    assert np.array_equal(ds["prediction"].values, model.predict(x[400:600]))
    assert np.array_equal(ds["probability"].values, model.predict_proba(x[400:600]))
    assert list(ds["class"].values) == list(range(10))
    acc = float(np.mean(model.predict(x[400:600]) == y[400:600]))
    assert ds.attrs["accuracy"] == acc and f"accuracy against d: {acc:.4f}" in line
    assert acc > 0.6  # 24 Adam steps on 360 digits: well above chance (0.1)
    # the same from a .npy array; an existing output needs --overwrite
    assert (
        main(
            [
                "predict",
                "--model",
                str(tmp_path / "result.model.nc"),
                "--data",
                str(base / "test.npy"),
                "--output",
                str(out),
                "--overwrite",
            ]
        )
        == 0
    )
    with xr.open_dataset(out, engine="h5netcdf") as ds2:
        assert np.array_equal(ds2["prediction"].values, ds["prediction"].values)
        assert "accuracy" not in ds2.attrs  # no d in a .npy file


def test_predict_regression_model(tmp_path, digits, capsys):
    base, x, _, _ = digits
    rng = np.random.default_rng(0)
    net = Network("relu", "squared", "linear", True)
    W, V = net.join(
        rng.normal(size=(5, 64)) * 0.1, rng.normal(size=(2, 5)), np.zeros(5), np.ones(2)
    )
    path = MLPModel(W, V, net, target_shift=[10.0, 0.0], target_scale=[2.0, 1.0]).save(
        tmp_path / "reg.nc"
    )
    assert (
        main(
            [
                "predict",
                "--model",
                path,
                "--data",
                str(base / "test.npy"),
                "--output",
                str(tmp_path / "p.nc"),
            ]
        )
        == 0
    )
    assert "regression model" in capsys.readouterr().out
    with xr.open_dataset(tmp_path / "p.nc", engine="h5netcdf") as ds:
        np.testing.assert_array_equal(
            ds["prediction"].values, MLPModel.load(path).predict(x[400:600])
        )


def test_predict_bad_input_exits_2_and_writes_nothing(tmp_path, digits, capsys):
    base, x, _, d = digits
    rng = np.random.default_rng(1)
    net = Network("sigmoid", "cross-entropy", "softmax", False)
    model = MLPModel(rng.normal(size=(4, 64)), rng.normal(size=(10, 4)), net).save(
        tmp_path / "m.nc"
    )
    write_dataset(tmp_path / "narrow.nc", x[:5, :10], d[:5])
    np.save(tmp_path / "bad.npy", x[0])  # one sample, 1-D
    (tmp_path / "exists.nc").write_text("keep me")
    out = str(tmp_path / "out.nc")
    capsys.readouterr()  # (warnings of the writes above)

    def run(*args):
        code = main(["predict", *args])
        return code, capsys.readouterr().err

    cases = [
        (
            [
                "--model",
                str(tmp_path / "nope.nc"),
                "--data",
                str(base / "test.nc"),
                "--output",
                out,
            ],
            "--model: model file .*nope.nc' does not exist",
        ),
        (
            ["--model", str(base / "test.nc"), "--data", str(base / "test.nc"), "--output", out],
            r"--model: .*test.nc' is not a dask_rpm model file: it has variables \['d', 'x'\]",
        ),
        (
            ["--model", model, "--data", str(tmp_path / "none.nc"), "--output", out],
            "--data .*none.nc' does not exist",
        ),
        (
            ["--model", model, "--data", str(tmp_path / "narrow.nc"), "--output", out],
            r"x has shape \(5, 10\); this model takes \(samples, 64\)",
        ),
        (
            ["--model", model, "--data", str(tmp_path / "bad.npy"), "--output", out],
            r"x is 1-D \(shape \(64,\)\); .* x.reshape\(1, -1\)",
        ),
        (
            ["--model", model, "--data", str(tmp_path / "exists.nc"), "--output", out],
            "cannot be read as netCDF",
        ),
        (
            [
                "--model",
                model,
                "--data",
                str(base / "test.nc"),
                "--output",
                str(tmp_path / "exists.nc"),
            ],
            "already exists and would be overwritten; .* pass --overwrite",
        ),
        (
            ["--model", model, "--data", str(base / "test.nc"), "--output", str(base / "test.nc")],
            "is the data file",
        ),
        (
            ["--model", model, "--data", str(base / "test.nc"), "--output", str(tmp_path)],
            "--output .* refused",
        ),
        (
            ["--model", model, "--data", str(base / "test.nc")],
            "the following arguments are required: --output",
        ),
    ]
    import re

    for args, pattern in cases:
        code, err = run(*args)
        assert code == 2, (args, err)
        assert re.search(pattern, err), (pattern, err)
        assert len(err.strip().splitlines()) == 1  # one line
    assert sorted(os.listdir(tmp_path)) == [
        "bad.npy",
        "exists.nc",
        "m.nc",
        "narrow.nc",
    ]  # nothing written
    assert (tmp_path / "exists.nc").read_text() == "keep me"


def test_job_model_key(tmp_path, digits):
    data = digits[0] / "train.nc"
    with pytest.raises(JobError, match="model=.* it is the output or the data file"):
        load_job(_job(tmp_path, data, model="result.nc"))
    with pytest.raises(JobError, match="model=.* it is the output or the data file"):
        load_job(_job(tmp_path, data, model=str(data)))
    assert load_job(_job(tmp_path, data, model=False)).model is None  # no model file
    assert load_job(_job(tmp_path, data, model="models/m.nc")).model == str(
        tmp_path / "models" / "m.nc"
    )
    # an existing model file is refused before training, like the output
    (tmp_path / "result.model.nc").write_text("an older model")
    with pytest.raises(
        JobError, match="job file: model .*result.model.nc' already exists .* overwrite: true"
    ):
        run_job(_job(tmp_path, data))
    assert (tmp_path / "result.model.nc").read_text() == "an older model"
