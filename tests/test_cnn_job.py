"""Job files that train a CNN (``network:``): images from netCDF, the output, checkpoints, errors.

* a job with ``network:`` (a list of layers) trains on the images of its data file,
  ``x(sample, channel, height, width)``, on its own local workers, and its output holds the
  parameters of every stage (``W1, b1, ..., V``, dimensioned per stage) and the network, and its
  model file a :class:`~dask_rpm.CNNModel`; they equal :func:`~dask_rpm.nn.serial.fit_serial`'s
  on the same file to 1e-10 relative;
* stopped with a checkpoint in one netCDF file, ``--resume`` ends where one run ends;
* a bad ``network:``, ``hidden:`` beside it, images for an MLP or rows for a CNN are refused
  before any worker starts, with one line and exit code 2.

Problems are tiny (8x8 images, 1-2 channels, a few dozen samples).
"""

from __future__ import annotations

import io
import json
import threading

import numpy as np
import pytest
import xarray as xr
import yaml
from distributed import Client, LocalCluster

from dask_rpm.cli import main
from dask_rpm.job import JobError, load_job, run_job
from dask_rpm.model.cnn import CNNModel
from dask_rpm.nn.data import write_dataset
from dask_rpm.nn.serial import fit_serial

RTOL = 1e-10
NETWORK = [
    {"conv": 3, "kernel": 3, "padding": 1},
    "relu",
    {"maxpool": 2},
    "flatten",
    {"linear": 5},
    "tanh",
    {"linear": 3},
]
#: what the job trains, as job keys and as fit_serial's keywords
KEYS = {"loss": "cross-entropy", "optimizer": "adam", "reduction": "mean", "learning-rate": 0.05}
KW = dict(loss="cross-entropy", optimizer="adam", reduction="mean", learning_rate=0.05, seed=0)


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """24 images of 2 channels, 8x8, and 3 classes written as labels (one-hot in the file)."""
    rng = np.random.default_rng(3)
    x = rng.normal(size=(24, 2, 8, 8))
    y = rng.integers(0, 3, size=24)
    path = tmp_path_factory.mktemp("data") / "images.nc"
    write_dataset(path, x, y)
    return str(path)


@pytest.fixture(scope="module")
def client():
    with (
        LocalCluster(
            n_workers=3, threads_per_worker=1, processes=False, dashboard_address=":0"
        ) as c,
        Client(c) as cl,
    ):
        yield cl


def write_job(tmp_path, data, **over):
    job = {
        "data": data,
        "network": NETWORK,
        "iterations": 8,
        "mapping": "srpm",
        "output": "result.nc",
        "workers": {"local": {"speeds": [1.0, 0.5, 0.25]}},
        **KEYS,
    }
    job.update({k.replace("_", "-"): v for k, v in over.items()})
    job = {k: v for k, v in job.items() if v is not None}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def _open(path):
    with xr.open_dataset(path, engine="h5netcdf") as ds:
        return ds.load()


def assert_equals_serial(ds, ref):
    names = ["W1", "b1", "W2", "b2", "V"]
    assert [n for n in names if n in ds] == names
    for name, want in zip(names, ref.params):
        got = ds[name].values
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=1e-14 * np.abs(want).max())
    np.testing.assert_allclose(ds["error"].values, ref.errors, rtol=RTOL, atol=0)


def test_a_network_job_trains_on_the_images_of_its_file_equal_to_serial(tmp_path, images):
    """The job's own EMULATED workers, mini-batches, Adam: the output is the serial result."""
    path = write_job(tmp_path, images, batch_size=8)
    job = load_job(path)
    assert job.network == "2x8x8-conv3-linear5-3" and job.shape == (24, 128, 3)
    assert job.model == str(tmp_path / "result.model.nc") and job.training.network == NETWORK
    out = io.StringIO()
    summary = run_job(path, out=out)
    assert summary["iterations"] == 8, out.getvalue()
    assert "training 2x8x8-conv3-linear5-3 on 24 samples" in out.getvalue()
    ds = _open(tmp_path / "result.nc")
    ref = fit_serial(images, network=NETWORK, iterations=8, batch_size=8, **KW)
    assert ref.iterations == 8 and list(ref.classes) == [0, 1, 2]
    assert_equals_serial(ds, ref)
    # every stage's rows as planned (the bias channel last), and the network to rebuild it
    assert ds["W1"].dims == ("stage1", "stage1_input", "stage1_kernel_y", "stage1_kernel_x")
    assert ds["V"].dims == ("output", "stage2", "stage2_position")
    assert ds.sizes["stage2"] == 6
    assert json.loads(ds.attrs["network"]) == ref.recipe.layers.spec()
    assert list(ds.attrs["image_shape"]) == [2, 8, 8]
    # the model file: the same network and weights, classifying with the file's labels
    model = CNNModel.load(tmp_path / "result.model.nc")
    assert model.records == ref.recipe.layers.spec() and model.image_shape == (2, 8, 8)
    for got, want in zip(model.params, ref.params):
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=1e-14 * np.abs(want).max())
    x = _open(images)["x"].values
    assert list(model.classes) == [0, 1, 2] and model.predict(x).shape == (24,)


def test_a_network_job_stopped_into_a_netcdf_checkpoint_resumes_to_the_serial_result(
    tmp_path, images, client
):
    path = write_job(tmp_path, images, iterations=12, checkpoint={"every": 4, "path": "ck.nc"})
    stop = threading.Event()
    stop.set()  # stop after the first block: its checkpoint, no output
    first = run_job(path, client=client, stop=stop, out=io.StringIO())
    assert first["checkpoint"].endswith("ck.nc") and not (tmp_path / "result.nc").exists()
    ck = _open(tmp_path / "ck.nc")
    assert {"W1", "b1", "W2", "b2", "V", "optimizer_m_W1", "optimizer_v_V"} <= set(ck.data_vars)
    assert 0 < ck.attrs["iteration"] < 12
    run_job(path, client=client, resume=True, out=io.StringIO())
    ref = fit_serial(images, network=NETWORK, iterations=12, **KW)
    assert_equals_serial(_open(tmp_path / "result.nc"), ref)
    assert not (tmp_path / "ck.nc").exists()  # the output holds everything the checkpoint did


def test_the_network_is_part_of_what_a_checkpoint_must_match(tmp_path, images):
    one = load_job(write_job(tmp_path, images))
    other = [{"conv": 4, "kernel": 3, "padding": 1}, *NETWORK[1:]]
    two = load_job(write_job(tmp_path, images, network=other))
    assert one.network != two.network and one.fingerprint != two.fingerprint


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    rng = np.random.default_rng(0)
    path = tmp_path_factory.mktemp("rows") / "rows.nc"
    write_dataset(path, rng.normal(size=(20, 5)), rng.integers(0, 2, size=20))
    return str(path)


BAD = [
    (dict(hidden=4), "network: (a CNN's layers) given with hidden=4"),
    (dict(activation="tanh", bias=True), "given with activation='tanh', bias=True"),
    (dict(network={"conv": 3}), "network={'conv': 3} is invalid; expected a list of layers"),
    (
        dict(network=[{"conv": 3, "kernel": 9}, "flatten", {"linear": 3}]),
        "job file: network: layer 0 (conv): kernel 9 (padding 0) does not fit maps of 8x8",
    ),
    (
        dict(network=[{"conv": 3}, "flatten", {"linear": 4}]),
        "the network's last Linear has 4 outputs but the targets have 3 columns",
    ),
    (dict(network=[{"conv": 3}, "softmax", {"linear": 3}]), "layer 1 is 'softmax'"),
    (dict(network=None), "has no 'hidden'; add e.g. hidden: 32"),
]


@pytest.mark.parametrize("over,message", BAD)
def test_bad_network_jobs_are_one_line_and_exit_2(tmp_path, images, capsys, over, message):
    path = write_job(tmp_path, images, **over)
    with pytest.raises(JobError, match=None) as err:
        load_job(path)
    assert message in str(err.value), str(err.value)
    assert main(["train", "--config", str(path)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], lines
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.yaml"]


def test_rows_for_a_network_and_images_for_hidden_units_say_which_is_which(tmp_path, images, rows):
    with pytest.raises(JobError, match=r"a CNN trains on images: x must be 4-D \(sample, channel"):
        load_job(write_job(tmp_path, rows))
    with pytest.raises(JobError, match=r"images \(sample, channel, height, width\) train a CNN"):
        load_job(write_job(tmp_path, images, network=None, hidden=4))
