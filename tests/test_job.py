"""``dask-rpm train --config FILE`` (dask_rpm.job): job files, output, checkpoints, --resume, SIGTERM."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time

import dask.config
import numpy as np
import pytest
import xarray as xr
import yaml
from distributed import Client, LocalCluster

from dask_rpm.cli import main
from dask_rpm.engine import store
from dask_rpm.job import JobError, load_job, run_job, write_checkpoint
from dask_rpm.nn.data import write_dataset
from dask_rpm.nn.serial import fit_serial

RTOL = 1e-10


def digits_dataset(path, samples=None):
    """scikit-learn's shipped 8x8 digits: 64 pixels / 16 plus a bias input; one-hot 0.1 / 0.9 targets."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    if samples:
        x, y = x[:samples], y[:samples]
    x = np.column_stack([x / 16.0, np.ones(len(x))])
    d = np.full((len(x), 10), 0.1)
    d[np.arange(len(x)), y] = 0.9
    write_dataset(path, x, d, source="sklearn.datasets.load_digits")
    return x, d


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "digits.nc"
    x, d = digits_dataset(path, samples=600)
    return str(path), x, d


def write_job(tmp_path, data_path, **over):
    job = {
        "data": data_path,
        "hidden": 12,
        "iterations": 60,
        "learning-rate": 0.005,
        "mapping": "drpm",
        "output": "result.nc",
        "workers": {"local": {"speeds": [1.0, 0.5]}},
        "config": {"drpm": {"interval": 10}},
    }
    job.update(over)
    job = {k: v for k, v in job.items() if v is not None}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def _open(path):
    with xr.open_dataset(path, engine="h5netcdf") as ds:
        return ds.load()


def _stored(tmp_path, name="result.checkpoint"):
    """The valid checkpoint of the job's store (the default ``<output stem>.checkpoint``), checksums checked."""
    return store.load(tmp_path / name)


@pytest.mark.parametrize(
    "over, needle",
    [
        ({"hidden": 0}, "hidden=0"),
        ({"hidden": None}, "has no 'hidden'"),
        ({"data": "missing.nc"}, "does not exist"),
        ({"iterations": None}, "'iterations:'"),
        ({"learning-rate": -1}, "learning-rate=-1"),
        ({"mapping": "best"}, "mapping='best'"),
        ({"itterations": 5}, "Did you mean 'iterations'"),
        ({"workers": None}, "no 'workers:'"),
        ({"workers": {"local": {"speeds": [1, 0]}}}, "speeds"),
        ({"workers": {"slurm": {"groups": [{"name": "a-b"}]}}}, "'a_b'"),
        ({"min-workers": 5}, "starts only 2 worker(s)"),
        ({"checkpoint": {"every": -1}}, "checkpoint.every=-1"),
        ({"output": "nodir/result.nc"}, "does not exist"),
        ({"output": "/dev/full", "overwrite": True}, "'/dev/full' is refused: it is a device"),
        ({"output": "/proc/result.nc"}, "'/proc/result.nc' cannot be written"),
        ({"overwrite": "yes"}, "overwrite='yes' is invalid; expected true or false"),
        (
            {"config": {"drpm": {"intervall": 10}}},
            "unknown setting rpm.drpm.intervall under 'config:'",
        ),
        ({"config": {"drpm": {"intervall": 10}}}, "Did you mean 'interval'?"),
        ({"config": {"trian": {"seed": 1}}}, "Did you mean 'train'?"),
        ({"batch-size": 0}, "batch-size: batch_size=0; give a positive integer"),
        ({"optimizer": "lbfgs"}, "optimizer 'lbfgs' is not known; valid: sgd, momentum, adam"),
        ({"epochs": 3}, "both iterations=60 and epochs=3; give one of them"),
        ({"validation": 2}, "validation=2 is invalid; expected a fraction"),
        (
            {"loss": "cross-entropy", "output-layer": "linear"},
            "output='linear' with loss='cross-entropy'",
        ),
        ({"mapping": "best"}, "valid: drpm, srpm,"),
        ({"batch-sise": 64}, "Did you mean 'batch-size'"),
    ],
)
def test_bad_job_exits_2_with_one_line(tmp_path, digits, capsys, over, needle):
    path = write_job(tmp_path, digits[0], **over)
    assert main(["train", "--config", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err


def test_yaml_as_its_author_means_it(tmp_path, digits, capsys):
    """``1e-3`` is a number (PyYAML alone reads it as text); a key given twice and an empty file
    are refused with one line each."""
    from dask_rpm.job import load_job

    path = write_job(tmp_path, digits[0])
    text = path.read_text().replace("learning-rate: 0.005", "learning-rate: 5e-3")
    assert "5e-3" in text
    path.write_text(text)
    assert load_job(path).training.learning_rate == 0.005
    path.write_text(text + "hidden: 20\n")
    assert main(["train", "--config", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'hidden' is given twice (lines" in err[0], err
    path.write_text("# nothing yet\n")
    assert main(["train", "--config", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is empty; it must hold a mapping" in err[0], err


def test_a_batch_larger_than_the_data_says_so_in_one_line(tmp_path, digits, capsys):
    path = write_job(tmp_path, digits[0], iterations=None, epochs=1, **{"batch-size": 5000})
    assert main(["train", "--config", str(path)]) == 0
    err = capsys.readouterr().err
    assert "warning: batch_size=5000 is more than the 600 training samples" in err


def test_nan_in_the_data_file_exits_2_naming_the_sample(tmp_path, digits, capsys):
    """Found by the worker reading the slice, before the first iteration; nothing is written."""
    _, x, d = digits
    x = x.copy()
    x[417, 5] = np.nan
    write_dataset(tmp_path / "nan.nc", x, d)
    path = write_job(tmp_path, str(tmp_path / "nan.nc"), checkpoint={"every": 5})
    before = sorted(os.listdir(tmp_path))
    assert main(["train", "--config", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert (
        len(err) == 1
        and "x has 1 NaN or infinite value(s); the first is x[417, 5] = nan (sample 417)" in err[0]
    ), err
    assert sorted(os.listdir(tmp_path)) == before


def test_unreachable_scheduler_is_one_line_exit_2(tmp_path, digits, capsys, monkeypatch):
    import socket

    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT", "2s")
    import dask

    dask.config.refresh()
    try:
        path = write_job(tmp_path, digits[0], workers={"scheduler": f"tcp://127.0.0.1:{port}"})
        assert main(["train", "--config", str(path)]) == 2
    finally:
        monkeypatch.delenv("DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT")
        dask.config.refresh()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(
        f"dask-rpm train: error: job file: workers.scheduler='tcp://127.0.0.1:{port}': "
        f"cannot connect within 2s"
    ), err
    assert not (tmp_path / "result.nc").exists()


def _tree(path):
    """``{file: bytes}`` under ``path``: what a refused command must leave as it was."""
    return {
        str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()
    }


def test_an_existing_checkpoint_is_not_overwritten_without_resume(tmp_path, digits, capsys):
    # the default: a store of a stopped run at <output stem>.checkpoint
    path = write_job(tmp_path, digits[0], checkpoint={"every": 10})
    W, V = np.ones((12, 65)), np.ones((10, 12))
    write_checkpoint(load_job(path), {"iteration": 10, "params": [W, V], "errors": np.ones(10)})
    assert (tmp_path / "result.checkpoint" / "manifest.json").is_file()
    before = _tree(tmp_path)
    assert main(["train", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert (
        f"checkpoint path {str(tmp_path / 'result.checkpoint')!r} already holds a checkpoint" in err
    )
    assert "continue that run with --resume" in err
    assert _tree(tmp_path) == before and np.array_equal(_stored(tmp_path)["params"][0], W)
    # the opt-in netCDF file (a checkpoint.path ending in .nc)
    path = write_job(tmp_path, digits[0], checkpoint={"every": 10, "path": "result.checkpoint.nc"})
    (tmp_path / "result.checkpoint.nc").write_text("the only copy of a stopped run")
    assert main(["train", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "checkpoint path" in err and "continue that run with --resume" in err
    assert (tmp_path / "result.checkpoint.nc").read_text() == "the only copy of a stopped run"


def test_cli_errors(tmp_path, digits, capsys):
    assert main(["train", "--config", str(tmp_path / "nope.yaml")]) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "bad.yaml").write_text("data: [unclosed\n")
    assert main(["train", "--config", str(tmp_path / "bad.yaml")]) == 2
    assert "not valid YAML" in capsys.readouterr().err
    assert main(["train", "--resume"]) == 2
    assert "--resume needs --config" in capsys.readouterr().err
    path = write_job(tmp_path, digits[0])
    assert main(["train", "--config", str(path), "--speeds", "1,2"]) == 2
    assert "belong to the demo" in capsys.readouterr().err
    assert main(["train", "--config", str(path), "--resume"]) == 2
    assert "no checkpoint" in capsys.readouterr().err


def _plan_methods(path):
    return [json.loads(str(p))["method"] for p in _open(path)["plan_json"].values]


def test_keys_a_job_leaves_out_stay_none_and_fall_back_on_rpm_train(tmp_path, digits):
    """mapping, seed, dtype, min-workers, on-worker-loss: None in the Job (fit reads rpm.train.*)."""
    path = write_job(tmp_path, digits[0], mapping=None)
    job = load_job(path)
    run, training = job.run, job.training
    assert (run.mapping, training.seed, training.dtype, run.min_workers, run.on_worker_loss) == (
        None,
    ) * 5
    assert job.effective("mapping") == "drpm" and job.effective("seed") == 0
    with dask.config.set({"rpm.train.mapping": "uniform", "rpm.train.min-workers": 2}):
        assert job.effective("mapping") == "uniform" and job.effective("min_workers") == 2
    # the job's config: section (with or without the rpm: level) comes before the dask config
    path = write_job(tmp_path, digits[0], mapping=None, config={"rpm": {"train": {"seed": 4}}})
    with dask.config.set({"rpm.train.seed": 9}):
        assert load_job(path).effective("seed") == 4
    # a key the job file sets wins over both
    path = write_job(tmp_path, digits[0], mapping="srpm", config={"train": {"mapping": "uniform"}})
    assert load_job(path).effective("mapping") == "srpm"


@pytest.mark.parametrize(
    "config, settings, needle",
    [
        ({"train": {"mapping": "best"}}, {}, "rpm.train.mapping='best' is invalid; valid: "),
        ({}, {"rpm.train.mapping": "best"}, "rpm.train.mapping='best' is invalid; valid: "),
        ({"train": {"dtype": "int8"}}, {}, "rpm.train.dtype='int8' is invalid"),
        ({}, {"rpm.train.on-worker-loss": "retry"}, "rpm.train.on-worker-loss='retry'"),
        ({}, {"rpm.train.min-workers": 5}, "rpm.train.min-workers=5 is invalid; the job starts "),
    ],
)
def test_rpm_train_values_a_job_falls_back_on_are_checked(
    tmp_path, digits, config, settings, needle
):
    path = write_job(tmp_path, digits[0], mapping=None, config=config or None)
    with dask.config.set(settings), pytest.raises(JobError) as e:
        load_job(path)
    assert needle in str(e.value)


def test_mapping_and_seed_from_the_config_section_are_honoured(tmp_path, digits):
    """``config: {rpm: {train: {mapping, seed}}}`` reaches fit: the plan's method, serial-equal weights."""
    data, x, d = digits
    path = write_job(
        tmp_path,
        data,
        iterations=12,
        mapping=None,
        config={"rpm": {"train": {"mapping": "grid", "seed": 3}}},
    )
    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0"
    ) as cluster:
        with Client(cluster) as client:
            out = io.StringIO()
            run_job(path, client=client, out=out)
    assert "mapping grid," in out.getvalue()
    assert _plan_methods(tmp_path / "result.nc") == ["grid-hrev"]
    W, V = fit_serial(x, d, hidden=12, iterations=12, learning_rate=0.005, seed=3).params
    ds = _open(tmp_path / "result.nc")
    np.testing.assert_allclose(ds["W"].values, W, rtol=RTOL, atol=0)
    np.testing.assert_allclose(ds["V"].values, V, rtol=RTOL, atol=0)


def test_mapping_and_seed_from_dask_config_set_are_honoured(tmp_path, digits):
    """The same through ``dask.config.set`` around ``run_job`` (what DASK_RPM__TRAIN__... does too)."""
    data, x, d = digits
    path = write_job(tmp_path, data, iterations=12, mapping=None, config=None)
    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0"
    ) as cluster:
        with (
            Client(cluster) as client,
            dask.config.set({"rpm.train.mapping": "uniform", "rpm.train.seed": 5}),
        ):
            out = io.StringIO()
            run_job(path, client=client, out=out)
    assert "mapping uniform," in out.getvalue()
    assert _plan_methods(tmp_path / "result.nc") == ["uniform"]
    W, V = fit_serial(x, d, hidden=12, iterations=12, learning_rate=0.005, seed=5).params
    ds = _open(tmp_path / "result.nc")
    np.testing.assert_allclose(ds["W"].values, W, rtol=RTOL, atol=0)
    np.testing.assert_allclose(ds["V"].values, V, rtol=RTOL, atol=0)


def test_job_trains_to_target_and_writes_one_output(tmp_path, digits):
    data, x, d = digits
    err = fit_serial(x, d, hidden=12, iterations=200, learning_rate=0.005, seed=0).errors
    # between two iterations' errors (distributed sums differ from serial in the last bits):
    # iteration 78 is the first at or below it, and training stops right after its update
    target = float(0.5 * (err[77] + err[78]))
    path = write_job(tmp_path, data, iterations=200, **{"target-error": target})
    with LocalCluster(
        n_workers=3, threads_per_worker=1, processes=False, dashboard_address=":0"
    ) as cluster:
        with Client(cluster) as client:
            log = tmp_path / "log.txt"
            with open(log, "w") as out:
                summary = run_job(path, client=client, out=out)
    lines = log.read_text().splitlines()
    assert any(line.startswith("iteration 10/200: error ") for line in lines)
    assert lines[-1].startswith("done: 79 iterations")
    assert summary["iterations"] == 79 and summary["final_error"] <= target
    ds = _open(tmp_path / "result.nc")
    assert ds.attrs["status"] == "complete" and ds.attrs["iterations"] == 79
    assert "target error" in ds.attrs["stopped"]
    ref = fit_serial(x, d, hidden=12, iterations=79, learning_rate=0.005, seed=0)
    (W, V), err = ref.params, ref.errors
    np.testing.assert_allclose(ds["W"].values, W, rtol=RTOL, atol=0)
    np.testing.assert_allclose(ds["V"].values, V, rtol=RTOL, atol=0)
    np.testing.assert_allclose(ds["error"].values, err, rtol=RTOL, atol=0)
    assert ds.sizes["plan"] >= 1 and '"rectangles"' in str(ds["plan_json"].values[0])
    # Atomic writes leave no temporary files behind; the model goes next to the output by default.
    assert sorted(os.listdir(tmp_path)) == ["job.yaml", "log.txt", "result.model.nc", "result.nc"]
    from dask_rpm import MLPModel

    model = MLPModel.load(tmp_path / "result.model.nc")
    assert np.array_equal(model.params[0], ds["W"].values) and model.meta["iterations"] == 79
    assert lines[-1].endswith(
        f"wrote {tmp_path / 'result.nc'}, model {tmp_path / 'result.model.nc'}"
    )


@pytest.mark.slow
def test_sigterm_checkpoints_and_resume_equals_uninterrupted(tmp_path, digits):
    data, x, d = digits
    path = write_job(tmp_path, data, iterations=150, checkpoint={"every": 20})
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "dask_rpm.cli", "train", "--config", str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    lines = []
    for line in proc.stdout:
        lines.append(line.rstrip())
        if line.startswith("checkpoint at iteration 40"):
            proc.send_signal(signal.SIGTERM)  # what SLURM sends before the walltime
    assert proc.wait(timeout=120) == 0, lines
    stop = [line for line in lines if line.startswith("stopped at iteration")]
    assert stop and "SIGTERM" in stop[0] and "--resume" in stop[0], lines
    k = int(stop[0].split()[3])
    assert 40 <= k < 150
    assert not (tmp_path / "result.nc").exists()  # no output that looks complete
    # the default checkpoint: a store the workers wrote (and the driver's final write at the stop)
    assert not (tmp_path / "result.checkpoint.nc").exists()
    ck = _stored(tmp_path)
    assert ck["iteration"] == k and len(ck["errors"]) == k
    drpm = ck["drpm"]  # DRPM's plan, checks and windows, for --resume
    assert drpm["plan"] == ck["plan"] and drpm["checks"] and drpm["windows"]

    p = subprocess.run(
        [sys.executable, "-m", "dask_rpm.cli", "train", "--config", str(path), "--resume"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert f"resuming from checkpoint {tmp_path / 'result.checkpoint'} at iteration {k}" in p.stdout
    assert f"DRPM continues on the checkpoint's plan ({len(drpm['checks'])} check(s)" in p.stdout
    resumed = _open(tmp_path / "result.nc")
    assert resumed.attrs["resumed_from_iteration"] == k and resumed.sizes["iteration"] == 150
    assert not (tmp_path / "result.checkpoint").exists()  # folded into the result

    # The same job, uninterrupted.
    os.rename(tmp_path / "result.nc", tmp_path / "resumed.nc")
    os.rename(tmp_path / "result.model.nc", tmp_path / "resumed.model.nc")
    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0"
    ) as cluster:
        with Client(cluster) as client, open(os.devnull, "w") as out:
            run_job(path, client=client, out=out)
    whole = _open(tmp_path / "result.nc")
    for v in ("W", "V", "error"):
        np.testing.assert_allclose(resumed[v].values, whole[v].values, rtol=RTOL, atol=0)
    W, V = fit_serial(x, d, hidden=12, iterations=150, learning_rate=0.005, seed=0).params
    np.testing.assert_allclose(resumed["W"].values, W, rtol=RTOL, atol=0)


@pytest.mark.slow
def test_ctrl_c_stops_with_a_checkpoint_exit_130_and_no_traceback(tmp_path, digits):
    """A real SIGINT to the whole process group of ``dask-rpm train --config`` (what Ctrl-C in a
    terminal sends: the driver and its local workers): one line saying what happened, the
    checkpoint written, exit 130, and ``--resume`` ends equal to serial training."""
    data, x, d = digits
    path = write_job(tmp_path, data, iterations=400, checkpoint={"every": 20})
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "dask_rpm.cli", "train", "--config", str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,  # its own process group, as a terminal's foreground job
    )
    lines = []
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line.rstrip())
        if line.startswith("checkpoint at iteration 40"):
            os.killpg(proc.pid, signal.SIGINT)
    assert proc.wait(timeout=120) == 130, lines
    err = proc.stderr.read() if proc.stderr else ""
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    assert "interrupted: stopping after the current block and writing a checkpoint" in err
    stop = [line for line in lines if line.startswith("stopped at iteration")]
    assert stop and "SIGINT" in stop[0] and "--resume" in stop[0], lines
    k = int(stop[0].split()[3])
    assert _stored(tmp_path)["iteration"] == k and not (tmp_path / "result.nc").exists()
    p = subprocess.run(
        [sys.executable, "-m", "dask_rpm.cli", "train", "--config", str(path), "--resume"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    W, V = fit_serial(x, d, hidden=12, iterations=400, learning_rate=0.005, seed=0).params
    np.testing.assert_allclose(_open(tmp_path / "result.nc")["W"].values, W, rtol=RTOL, atol=0)


@pytest.fixture(scope="module")
def digits_onehot(tmp_path_factory):
    """Digits with one-hot targets (cross-entropy) and pixels / 16, no constant input (bias: true)."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x, y = x[:600] / 16.0, y[:600]
    d = np.eye(10)[y]
    path = tmp_path_factory.mktemp("data") / "digits-onehot.nc"
    write_dataset(path, x, d)
    return str(path), x, d


@pytest.mark.slow
def test_classifier_job_with_adam_minibatches_resumes_equal_to_uninterrupted(
    tmp_path, digits_onehot
):
    """Training keys in the job file; SIGTERM, --resume: Adam's state and the batch order carry on."""
    data, x, d = digits_onehot
    keys = {
        "loss": "cross-entropy",
        "optimizer": "adam",
        "batch-size": 64,
        "bias": True,
        "activation": "tanh",
        "validation": 0.2,
        "early-stopping": None,
    }
    path = write_job(
        tmp_path,
        data,
        iterations=None,
        epochs=15,
        checkpoint={"every": 10},
        **{"learning-rate": 0.002},
        **keys,
    )
    job = load_job(path)
    assert (
        job.training.iterations == 15 * 8 and job.training.batch_size == 64
    )  # 480 training samples / 64 -> 8 per epoch
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "dask_rpm.cli", "train", "--config", str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    lines = []
    for line in proc.stdout:
        lines.append(line.rstrip())
        if line.startswith("checkpoint at iteration 30"):
            proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 0, lines
    ck = _stored(tmp_path)
    assert {"m", "v"} <= set(ck["optimizer_state"])  # Adam's moments, rows from every worker
    for slot in ("m", "v"):
        assert [a.shape for a in ck["optimizer_state"][slot]] == [p.shape for p in ck["params"]]
    p = subprocess.run(
        [sys.executable, "-m", "dask_rpm.cli", "train", "--config", str(path), "--resume"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    resumed = _open(tmp_path / "result.nc")
    out = fit_serial(
        x,
        d,
        hidden=12,
        iterations=120,
        learning_rate=0.002,
        seed=0,
        loss="cross-entropy",
        optimizer="adam",
        batch_size=64,
        bias=True,
        activation="tanh",
        validation=0.2,
    )
    np.testing.assert_allclose(
        resumed["W"].values, out.params[0], rtol=RTOL, atol=1e-14 * np.abs(out.params[0]).max()
    )
    np.testing.assert_allclose(resumed["error"].values, out.errors, rtol=RTOL)


@pytest.mark.parametrize(
    "where, kind",
    [(None, "checkpoint store"), ("result.checkpoint.nc", "checkpoint")],
    ids=["default-store", "netcdf-file"],
)
def test_resume_refuses_a_checkpoint_of_another_job(tmp_path, digits, where, kind):
    ck = {"every": 10, "path": where}
    path = write_job(tmp_path, digits[0], checkpoint=ck)
    job = load_job(path)
    assert job.checkpoint_store == (where is None)
    W, V = np.zeros((12, 65)), np.zeros((10, 12))
    write_checkpoint(job, {"iteration": 10, "params": [W, V], "errors": np.ones(10)})
    shown = repr(str(tmp_path / (where or "result.checkpoint")))
    path = write_job(tmp_path, digits[0], hidden=13, checkpoint=ck)
    with pytest.raises(
        JobError, match=rf"{kind} {re.escape(shown)} is for a 65-12-10 network .* trains 65-13-10"
    ):
        run_job(path, resume=True)
    path = write_job(tmp_path, digits[0], checkpoint=ck, **{"learning-rate": 0.004})
    with pytest.raises(JobError, match=rf"{kind} {re.escape(shown)} is from a different job"):
        run_job(path, resume=True)


def test_time_limit_stops_cleanly(tmp_path, digits):
    path = write_job(
        tmp_path, digits[0], iterations=100_000, checkpoint={"every": 10}, **{"time-limit": 1.0}
    )
    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0"
    ) as cluster:
        with Client(cluster) as client, open(tmp_path / "log.txt", "w") as out:
            t0 = time.monotonic()
            summary = run_job(path, client=client, out=out)
            assert time.monotonic() - t0 < 60
    assert summary["stopped"].startswith("stop requested") and summary["checkpoint"]
    assert "time-limit 1 s" in (tmp_path / "log.txt").read_text()
    assert summary["checkpoint"] == str(tmp_path / "result.checkpoint")
    assert _stored(tmp_path)["iteration"] == summary["iterations"] > 0
    assert not (tmp_path / "result.nc").exists()


def test_overwrite_replaces_an_existing_output_and_new_results_honour_the_umask(tmp_path, digits):
    data, x, d = digits
    path = write_job(tmp_path, data, iterations=5)
    out = tmp_path / "result.nc"
    out.write_text("a result of last week")
    assert (
        main(["train", "--config", str(path)]) == 2
    )  # refused before any work: the file is untouched
    assert out.read_text() == "a result of last week"
    os.chmod(out, 0o604)
    old = os.umask(0o027)
    try:
        with LocalCluster(
            n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0"
        ) as cluster:
            with Client(cluster) as client, open(os.devnull, "w") as log:
                run_job(path, client=client, out=log, overwrite=True)  # as --overwrite
                assert _open(out).attrs["iterations"] == 5
                assert stat.S_IMODE(os.stat(out).st_mode) == 0o604  # a replaced file keeps its mode
                out.unlink()
                path = write_job(
                    tmp_path, data, iterations=5, overwrite=True
                )  # as the job file says
                run_job(path, client=client, out=log)
    finally:
        os.umask(old)
    assert (
        stat.S_IMODE(os.stat(out).st_mode) == 0o640
    )  # a new file: 0666 minus the umask (mkstemp gives 0600)
    W, V = fit_serial(x, d, hidden=12, iterations=5, learning_rate=0.005, seed=0).params
    np.testing.assert_allclose(_open(out)["W"].values, W, rtol=RTOL, atol=0)


@pytest.mark.parametrize("ck_name", ["result.checkpoint", "result.checkpoint.nc"])
def test_final_write_failing_saves_the_result_next_to_the_checkpoint(tmp_path, digits, ck_name):
    """Both kinds of checkpoint: a store (a path without .nc) and the opt-in netCDF file."""
    data, x, d = digits
    (tmp_path / "out").mkdir()
    (tmp_path / "ck").mkdir()
    path = write_job(
        tmp_path,
        data,
        iterations=30,
        output="out/result.nc",
        checkpoint={"every": 10, "path": f"ck/{ck_name}"},
    )

    class Log(io.StringIO):
        """After the first checkpoint the output directory turns into a file: the final write must fail."""

        def write(self, text: str) -> int:
            if text.startswith("checkpoint at iteration") and (tmp_path / "out").is_dir():
                shutil.rmtree(tmp_path / "out")
                (tmp_path / "out").write_text("no longer a directory")
            return super().write(text)

    log = Log()
    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0"
    ) as cluster:
        with Client(cluster) as client:
            summary = run_job(path, client=client, out=log)
    rescued = tmp_path / "ck" / "result.nc"
    assert summary["rescued"] and summary["output"] == str(rescued), summary
    text = log.getvalue()
    assert f"could not write the output {str(tmp_path / 'out' / 'result.nc')!r}" in text
    assert f"saved to {str(rescued)!r} instead" in text and f"wrote {rescued}" in text
    ds = _open(rescued)
    assert ds.attrs["status"] == "complete" and ds.attrs["iterations"] == 30
    W, V = fit_serial(x, d, hidden=12, iterations=30, learning_rate=0.005, seed=0).params
    np.testing.assert_allclose(ds["W"].values, W, rtol=RTOL, atol=0)
    # the checkpoint is folded into the result; the model (default out/result.model.nc) is rescued with it
    assert sorted(os.listdir(tmp_path / "ck")) == ["result.model.nc", "result.nc"]
    assert f"could not write the model {str(tmp_path / 'out' / 'result.model.nc')!r}" in text


# --------------------------------------------------------------------------
# Through real SLURM: slurm/train.sbatch runs the driver, which submits the
# worker jobs (two groups) to the local SLURM of slurm/local-cluster.sh.
# --------------------------------------------------------------------------

SBATCH = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "slurm", "train.sbatch"
)
# Full digits set: 1797 samples, 65-24-10. Serial BP reaches error 120 at iteration 181.
DIGITS_JOB = {
    "hidden": 24,
    "learning-rate": 0.005,
    "mapping": "drpm",
    "config": {"drpm": {"interval": 10}},
}


def slurm_job(tmp_path, partitions, groups, **over):
    data = tmp_path / "digits.nc"
    if not data.exists():
        digits_dataset(data)
    fast_p, slow_p = partitions[0], partitions[-1]
    job = {
        "data": str(data),
        "output": str(tmp_path / "result.nc"),
        **DIGITS_JOB,
        "workers": {
            "slurm": {
                "groups": [
                    {
                        "partition": fast_p if g["name"] == "big" else slow_p,
                        "cores": 1,
                        "memory": "1GiB",
                        "walltime": "00:15:00",
                        **g,
                    }
                    for g in groups
                ],
                "cluster": {
                    "interface": "lo",
                    "python": sys.executable,
                    "scheduler-options": {"host": "127.0.0.1", "dashboard_address": ":0"},
                    "log-directory": str(tmp_path / "jobs"),
                },
            }
        },
    }
    # DRPM's idle choice off, in the job itself (tests/conftest.py turns it off for the session):
    # these tests are about worker jobs, and a job this small runs fastest on one worker
    drpm = {**job["config"].get("drpm", {}), "idle": False}
    job["config"] = {**job["config"], "train": {"wait-workers": 180}, "drpm": drpm}
    job.update(over)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def _squeue(fmt="%i %j %T"):
    out = subprocess.run(
        ["squeue", "-h", "-o", fmt], capture_output=True, text=True, check=True
    ).stdout
    return [line.split() for line in out.splitlines() if line.strip()]


class Driver:
    """The driver job submitted with ``sbatch slurm/train.sbatch``; its output file is the log."""

    def __init__(self, tmp_path, job_file, *args):
        self.log = tmp_path / "driver.out"
        self.t0 = time.monotonic()
        # The driver job gets this environment (sbatch exports it); point train.sbatch at
        # this interpreter's dask-rpm even when its bin directory is not on PATH.
        exe = os.path.join(os.path.dirname(sys.executable), "dask-rpm")
        env = dict(os.environ, DASK_RPM=exe if os.path.exists(exe) else "dask-rpm")
        self.id = (
            subprocess.run(
                [
                    "sbatch",
                    "--parsable",
                    f"--output={self.log}",
                    "--job-name=dask-rpm-train-test",
                    SBATCH,
                    str(job_file),
                    *args,
                ],
                capture_output=True,
                text=True,
                check=True,
                env=env,
            )
            .stdout.strip()
            .split(";")[0]
        )
        self.marks = {}

    def text(self):
        return self.log.read_text() if self.log.exists() else ""

    def wait_for(self, needle, timeout=240):
        deadline = time.monotonic() + timeout
        while needle not in self.text():
            assert self.running() and time.monotonic() < deadline, (
                f"no {needle!r} in the driver log:\n{self.text()}"
            )
            time.sleep(0.1)
        self.marks[needle] = time.monotonic() - self.t0

    def running(self):
        return any(row[0] == self.id for row in _squeue())

    def finish(self, timeout=300):
        deadline = time.monotonic() + timeout
        while self.running():
            if time.monotonic() > deadline:
                subprocess.run(["scancel", self.id])
                pytest.fail(f"driver job {self.id} still running after {timeout} s:\n{self.text()}")
            time.sleep(0.5)
        self.seconds = time.monotonic() - self.t0
        return self.text()

    def worker_jobs(self, group):
        return [row[0] for row in _squeue() if row[1] == f"dask-rpm-{group}"]


def _serial_check(ds, x, d, iterations):
    ref = fit_serial(x, d, hidden=24, iterations=iterations, learning_rate=0.005, seed=0)
    (W, V), err = ref.params, ref.errors
    np.testing.assert_allclose(ds["W"].values, W, rtol=RTOL, atol=0)
    np.testing.assert_allclose(ds["V"].values, V, rtol=RTOL, atol=0)
    np.testing.assert_allclose(ds["error"].values, err, rtol=RTOL, atol=0)


def _digits_arrays(tmp_path):
    from dask_rpm.nn.data import as_arrays

    return as_arrays(str(tmp_path / "digits.nc"))


@pytest.mark.slurm
def test_sbatch_driver_two_groups_reaches_target_error(slurm_cluster, tmp_path):
    groups = [{"name": "big", "jobs": 2, "speed": 1.0}, {"name": "small", "jobs": 2, "speed": 0.5}]
    path = slurm_job(
        tmp_path,
        slurm_cluster.partitions,
        groups,
        iterations=400,
        **{"target-error": 120.0, "min-workers": 4, "checkpoint": {"every": 50}},
    )
    drv = Driver(tmp_path, path)
    drv.wait_for("iteration 10/400")
    assert len(drv.worker_jobs("big")) == 2 and len(drv.worker_jobs("small")) == 2
    log = drv.finish()
    print(
        f"\n[slurm] two groups, 4 worker jobs, digits to error 120: {drv.seconds:.1f} s from sbatch to done "
        f"(first iteration block logged after {drv.marks['iteration 10/400']:.1f} s)"
    )
    assert "workers: SLURM groups big: 2 job(s) x 1 worker(s), small: 2 job(s) x 1 worker(s)" in log
    # serial BP's error first falls to 120 or below at iteration 181 (120.022 at 180): stop right there
    assert "done: 182 iterations, error 119.292 (target 120)" in log, log
    ds = _open(tmp_path / "result.nc")
    assert ds.attrs["status"] == "complete" and ds.attrs["final_error"] <= 120.0
    assert sorted(ds["name"].values) == ["big-0", "big-1", "small-0", "small-1"]
    assert sorted(ds["group"].values) == ["big", "big", "small", "small"]
    x, d = _digits_arrays(tmp_path)
    _serial_check(ds, x, d, 182)
    # The trained net classifies most digits right (argmax of the outputs).
    from dask_rpm.nn.network import Network
    from dask_rpm.nn.recipe import forward

    h = forward(x, [ds["W"].values, ds["V"].values], Network())  # the paper's network
    accuracy = float(np.mean(h.argmax(1) == d.argmax(1)))
    assert accuracy > 0.9, accuracy
    assert not [
        row for row in _squeue() if row[1] in ("dask-rpm-big", "dask-rpm-small")
    ]  # workers cancelled


@pytest.mark.slurm
def test_scancel_of_a_worker_job_still_ends_serial_equal(slurm_cluster, tmp_path):
    groups = [{"name": "big", "jobs": 2, "speed": 1.0}, {"name": "small", "jobs": 2, "speed": 0.5}]
    path = slurm_job(
        tmp_path,
        slurm_cluster.partitions,
        groups,
        iterations=300,
        **{"min-workers": 4, "checkpoint": {"every": 50}},
    )
    drv = Driver(tmp_path, path)
    drv.wait_for("iteration 60/300")
    victim = drv.worker_jobs("small")[0]
    t_cancel = time.monotonic()
    subprocess.run(["scancel", victim], check=True)
    drv.wait_for("lost; rows from the")
    detect = time.monotonic() - t_cancel
    log = drv.finish()
    ds = _open(tmp_path / "result.nc")
    assert ds.attrs["status"] == "complete" and ds.sizes["iteration"] == 300
    x, d = _digits_arrays(tmp_path)
    _serial_check(ds, x, d, 300)
    import json

    (rec,) = [r for r in json.loads(ds.attrs["remaps"]) if r.get("lost")]
    assert rec["recovered_from"] in ("columns", "checkpoint") and rec["kind"] == "whole"
    spi = float(np.nanmedian(ds["iteration_time"].values))
    print(
        f"\n[slurm] scancel of worker job {victim}: recovered from the {rec['recovered_from']}, "
        f"{rec['bytes']} weight bytes + {rec['sample_bytes']} sample bytes re-read, remap {rec['seconds']:.3f} s, {rec['replayed']} iteration(s) recomputed "
        f"(~{rec['replayed'] * spi:.2f} s at {spi * 1e3:.1f} ms/iteration); scancel -> recovery logged in "
        f"{detect:.1f} s; whole test run {drv.seconds:.1f} s"
    )
    assert "worker(s) 1 of" not in log  # sanity: the log names addresses, not counts


@pytest.mark.slurm
def test_late_worker_job_is_absorbed(slurm_cluster, tmp_path):
    # The small group's job is submitted held (a real queued job that cannot start yet);
    # training starts with min-workers=2 and the job is released once it runs.
    groups = [
        {"name": "big", "jobs": 2, "speed": 1.0},
        {"name": "small", "jobs": 1, "speed": 0.5, "job-extra-directives": ["--hold"]},
    ]
    # enough iterations to outlast the late job's start (an iteration takes ~3 ms on the direct data plane)
    path = slurm_job(
        tmp_path, slurm_cluster.partitions, groups, iterations=6000, **{"min-workers": 2}
    )
    drv = Driver(tmp_path, path)
    drv.wait_for("iteration 20/6000")
    (late,) = drv.worker_jobs("small")
    states = {row[0]: row[2] for row in _squeue()}
    assert states[late] == "PENDING"
    subprocess.run(["scontrol", "release", late], check=True)
    drv.wait_for("joined), ")
    log = drv.finish()
    ds = _open(tmp_path / "result.nc")
    import json

    joins = [r for r in json.loads(ds.attrs["remaps"]) if r.get("joined")]
    assert joins and joins[0]["kind"] == "whole", log
    assert ds.sizes["worker"] == 3 and ds.sizes["iteration"] == 6000
    x, d = _digits_arrays(tmp_path)
    _serial_check(ds, x, d, 6000)
    print(
        f"\n[slurm] late job absorbed at iteration {joins[0]['iteration']}: {joins[0]['bytes']} bytes, "
        f"{joins[0]['seconds']:.3f} s; whole test run {drv.seconds:.1f} s"
    )


@pytest.mark.slurm
def test_walltime_signal_checkpoints_and_sbatch_resume_finishes(slurm_cluster, tmp_path):
    # What #SBATCH --signal=B:TERM@120 does before the walltime, sent by hand.
    groups = [{"name": "big", "jobs": 1, "speed": 1.0}, {"name": "small", "jobs": 1, "speed": 0.5}]
    path = slurm_job(
        tmp_path,
        slurm_cluster.partitions,
        groups,
        iterations=200,
        # the opt-in netCDF checkpoint the driver writes (the default store: the test below)
        **{"min-workers": 2, "checkpoint": {"every": 25, "path": "result.checkpoint.nc"}},
    )
    drv = Driver(tmp_path, path)
    drv.wait_for("checkpoint at iteration 50")
    subprocess.run(["scancel", "--batch", "--signal=TERM", drv.id], check=True)
    log = drv.finish()
    stop = [line for line in log.splitlines() if line.startswith("stopped at iteration")]
    assert stop and "SIGTERM" in stop[0], log
    k = int(stop[0].split()[3])
    assert not (tmp_path / "result.nc").exists()
    assert _open(tmp_path / "result.checkpoint.nc").attrs["iteration"] == k
    assert not (tmp_path / "result.checkpoint").exists()  # no store next to the chosen file
    first = drv.seconds

    drv = Driver(tmp_path, path, "--resume")
    log = drv.finish()
    assert f"at iteration {k}" in log and "done: 200 iterations" in log, log
    ds = _open(tmp_path / "result.nc")
    assert ds.attrs["resumed_from_iteration"] == k
    x, d = _digits_arrays(tmp_path)
    _serial_check(ds, x, d, 200)
    assert not (tmp_path / "result.checkpoint.nc").exists()  # folded into the result
    print(
        f"\n[slurm] SIGTERM at iteration {k}, resumed with sbatch ... --resume: {first:.1f} s + {drv.seconds:.1f} s"
    )


@pytest.mark.slurm
@pytest.mark.parametrize(
    "dataset, hidden", [("digits", 32), ("breast_cancer", 32), ("digits", [32, 16])]
)
def test_sbatch_classifier_reaches_sklearns_held_out_accuracy(
    slurm_cluster, tmp_path, dataset, hidden
):
    """A real classification job through sbatch: cross-entropy, Adam, mini-batches, bias, a held-out split;
    one hidden layer, or two (``hidden: [32, 16]``: every layer cut by the same rectangles).

    The held-out accuracy is compared with scikit-learn's own MLPClassifier (one process, same split, same
    hidden layers) measured here; the weights still equal the serial reference.
    """
    from sklearn import datasets
    from sklearn.neural_network import MLPClassifier

    from dask_rpm.nn.recipe import holdout

    x, y = getattr(datasets, f"load_{dataset}")(return_X_y=True)
    x = (x - x.mean(0)) / np.where(x.std(0) > 0, x.std(0), 1.0)  # standardized features
    d = np.eye(y.max() + 1)[y]
    write_dataset(tmp_path / f"{dataset}.nc", x, d, source=f"sklearn.datasets.load_{dataset}")
    keys = {
        "loss": "cross-entropy",
        "optimizer": "adam",
        "batch-size": 64,
        "bias": True,
        "activation": "relu",
        "validation": 0.2,
        "epochs": 30,
        "learning-rate": 0.002,
        "hidden": hidden,
    }
    groups = [{"name": "big", "jobs": 1, "speed": 1.0}, {"name": "small", "jobs": 2, "speed": 0.5}]
    path = slurm_job(
        tmp_path,
        slurm_cluster.partitions,
        groups,
        **{"min-workers": 3},
        **keys,
        data=str(tmp_path / f"{dataset}.nc"),
    )
    drv = Driver(tmp_path, path)
    log = drv.finish()
    ds = _open(tmp_path / "result.nc")
    ours = float(ds["validation_accuracy"].values[-1])
    train, held = holdout(len(x), 0.2, 0)
    sizes = tuple(hidden) if isinstance(hidden, list) else (hidden,)
    sk = MLPClassifier(hidden_layer_sizes=sizes, max_iter=300, random_state=0).fit(
        x[train], y[train]
    )
    theirs = float(sk.score(x[held], y[held]))
    print(
        f"\n[slurm] {dataset}, hidden layers {sizes}: held-out accuracy {ours:.3f} (scikit-learn "
        f"MLPClassifier {theirs:.3f}), {drv.seconds:.1f} s from sbatch to done"
    )
    assert ours >= theirs - 0.03 and ours > 0.9, (ours, theirs, log)
    out = fit_serial(
        x,
        d,
        hidden=tuple(sizes),
        epochs=30,
        batch_size=64,
        learning_rate=0.002,
        loss="cross-entropy",
        optimizer="adam",
        bias=True,
        activation="relu",
        validation=0.2,
        seed=0,
    )
    first = "W" if len(sizes) == 1 else "W1"
    for name, want in ((first, out.params[0]), ("V", out.params[-1])):
        np.testing.assert_allclose(
            ds[name].values, want, rtol=RTOL, atol=1e-14 * np.abs(want).max()
        )


@pytest.mark.slurm
def test_a_worker_job_near_its_walltime_retires_without_losing_work(slurm_cluster, tmp_path):
    """A group with a short walltime: its worker's Dask lifetime is set from it; training moves the worker's
    rows to the others before the lifetime ends and retires it. Nothing recomputed, nothing lost."""
    groups = [
        {"name": "big", "jobs": 1, "speed": 1.0, "walltime": "00:01:10"},
        {"name": "small", "jobs": 2, "speed": 0.5, "walltime": "00:10:00"},
    ]
    path = slurm_job(
        tmp_path,
        slurm_cluster.partitions,
        groups,
        iterations=100000,
        **{"min-workers": 3, "time-limit": 55, "checkpoint": {"every": 1000}},
    )
    raw = yaml.safe_load(path.read_text())
    raw["config"]["train"]["retire-margin"] = 20.0
    path.write_text(yaml.safe_dump(raw))
    drv = Driver(tmp_path, path)
    log = drv.finish()
    retire = [line for line in log.splitlines() if "retiring (Dask lifetime ends in" in line]
    assert len(retire) == 1 and "remap at iteration" in retire[0], log
    assert "lost" not in log and "recomputed" not in log, log
    k = int(retire[0].split("remap at iteration ")[1].split(":")[0])
    ck = _stored(tmp_path)
    assert ck["iteration"] > k  # trained on after the retirement, on the two others
    x, d = _digits_arrays(tmp_path)
    ref = fit_serial(x, d, hidden=24, iterations=ck["iteration"], learning_rate=0.005, seed=0)
    W, err = ref.params[0], ref.errors
    # thousands of iterations: compare on the scale of the weights (an entry near 0 carries rounding
    # of the order of the largest ones, ~1e-15 absolute)
    assert np.abs(ck["params"][0] - W).max() <= RTOL * np.abs(W).max()
    np.testing.assert_allclose(ck["errors"], err, rtol=RTOL, atol=0)


@pytest.mark.slow
def test_driver_sigkill_then_resume_equals_uninterrupted(tmp_path, digits):
    """The driver process itself killed (no chance to write anything): --resume continues from the last
    periodic checkpoint and ends with the weights of an uninterrupted run."""
    data, x, d = digits
    path = write_job(tmp_path, data, iterations=120, checkpoint={"every": 20})
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "dask_rpm.cli", "train", "--config", str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
        start_new_session=True,
    )
    lines = []
    for line in proc.stdout:
        lines.append(line.rstrip())
        if line.startswith("checkpoint at iteration 40"):
            os.killpg(proc.pid, signal.SIGKILL)  # the driver and its local workers, at once
            break
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, lines
    assert not (tmp_path / "result.nc").exists()
    # the last checkpoint the workers wrote into the default store before the kill
    k = _stored(tmp_path)["iteration"]
    assert k >= 40
    p = subprocess.run(
        [sys.executable, "-m", "dask_rpm.cli", "train", "--config", str(path), "--resume"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert f"at iteration {k}" in p.stdout
    out = _open(tmp_path / "result.nc")
    ref = fit_serial(x, d, hidden=12, iterations=120, learning_rate=0.005, seed=0)
    W, err = ref.params[0], ref.errors
    np.testing.assert_allclose(out["W"].values, W, rtol=RTOL, atol=0)
    np.testing.assert_allclose(out["error"].values, err, rtol=RTOL, atol=0)


@pytest.mark.slurm
def test_an_ended_worker_job_is_resubmitted_and_its_worker_absorbed(slurm_cluster, tmp_path):
    """scancel of a worker job: training recovers, resubmits the group's job, and takes in its worker."""
    groups = [{"name": "big", "jobs": 1, "speed": 1.0}, {"name": "small", "jobs": 2, "speed": 0.5}]
    path = slurm_job(
        tmp_path,
        slurm_cluster.partitions,
        groups,
        iterations=100000,
        **{"min-workers": 3, "time-limit": 50, "checkpoint": {"every": 500}},
    )
    drv = Driver(tmp_path, path)
    drv.wait_for("iteration 100/")
    victim = drv.worker_jobs("small")[0]
    subprocess.run(["scancel", victim], check=True)
    drv.wait_for("lost; rows from the")
    drv.wait_for("joined")  # the replacement's worker, absorbed with a whole remap
    log = drv.finish()
    assert len(drv.worker_jobs("small")) == 0  # all cancelled at the end
    assert "to replace it" in log and "not resubmitting" not in log, log
    ck = _stored(tmp_path)
    x, d = _digits_arrays(tmp_path)
    ref = fit_serial(x, d, hidden=24, iterations=ck["iteration"], learning_rate=0.005, seed=0)
    W, err = ref.params[0], ref.errors
    assert (
        np.abs(ck["params"][0] - W).max() <= RTOL * np.abs(W).max()
    )  # on the scale of the weights
    np.testing.assert_allclose(ck["errors"], err, rtol=RTOL, atol=0)


class _StopAfter(io.StringIO):
    """A job's ``out`` that sets ``stop`` once a line starting with ``line`` was printed, and keeps the
    manifest of the store ``ck`` (if given) as it is at each "checkpoint at iteration" line."""

    def __init__(self, stop, line, ck=None):
        super().__init__()
        self.stop, self.line, self.ck, self.manifests = stop, line, ck, []

    def write(self, text):
        if self.ck is not None and text.startswith("checkpoint at iteration"):
            self.manifests.append(store.read_manifest(self.ck))
        if text.startswith(self.line):
            self.stop.set()
        return super().write(text)


def test_a_job_checkpoints_into_a_store_by_default_and_resumes_to_the_serial_result(
    tmp_path, digits
):
    """No ``checkpoint.path``: the workers write ``<output stem>.checkpoint/`` (row files, a manifest);
    stopped, then ``--resume``: the weights of an uninterrupted run, and the store folded into the result."""
    import threading

    data, x, d = digits
    path = write_job(tmp_path, data, iterations=40, checkpoint={"every": 10})
    ck = tmp_path / "result.checkpoint"
    assert load_job(path).checkpoint_path == str(ck)
    stop = threading.Event()
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        out = _StopAfter(stop, "checkpoint at iteration 20", ck=ck)
        summary = run_job(path, client=client, out=out, stop=stop)
        assert summary["stopped"].startswith("stop requested") and summary["iterations"] == 20
        assert f"checkpoint at iteration 10 -> {ck}" in out.getvalue()
        # the periodic checkpoints: row files from both workers, each its own rows
        assert [m["iteration"] for m in out.manifests] == [10, 20]
        assert all(len(m["files"]) >= 2 for m in out.manifests), out.manifests
        # at the stop the driver adds the weights fit returned (one file) to the same store
        assert (ck / "manifest.json").is_file() and store.read_manifest(ck)["iteration"] == 20
        assert json.loads((ck / "job.json").read_text())["network"] == "65-12-10"
        assert not (tmp_path / "result.nc").exists()
        assert not (tmp_path / "result.checkpoint.nc").exists()  # no driver-written file
        # an existing store is not overwritten without --resume
        assert main(["train", "--config", str(path)]) == 2
        log = io.StringIO()
        run_job(path, client=client, out=log, resume=True)
    assert f"resuming from checkpoint {ck} at iteration 20" in log.getvalue()
    ref = fit_serial(x, d, hidden=12, iterations=40, learning_rate=0.005, seed=0)
    W, err = ref.params[0], ref.errors
    res = _open(tmp_path / "result.nc")
    assert res.attrs["resumed_from_iteration"] == 20
    np.testing.assert_allclose(res["W"].values, W, rtol=RTOL, atol=0)
    np.testing.assert_allclose(res["error"].values, err, rtol=RTOL)
    assert not ck.exists()  # folded into the result


def test_resume_refuses_a_checkpoint_store_of_another_network(tmp_path, digits, capsys):
    path = write_job(tmp_path, digits[0], checkpoint={"every": 10})
    W, V = np.zeros((12, 65)), np.zeros((10, 12))
    write_checkpoint(load_job(path), {"iteration": 10, "params": [W, V], "errors": np.ones(10)})
    path = write_job(tmp_path, digits[0], hidden=13, checkpoint={"every": 10})
    assert main(["train", "--config", str(path), "--resume"]) == 2
    err = capsys.readouterr().err
    assert "is for a 65-12-10 network" in err and "this job trains 65-13-10" in err
    assert "run without --resume" in err
    (tmp_path / "result.checkpoint" / "job.json").unlink()
    assert main(["train", "--config", str(path), "--resume"]) == 2
    assert "no checkpoint of this job" in capsys.readouterr().err


def test_resume_without_the_default_store_names_an_older_checkpoint_file(tmp_path, digits, capsys):
    """``<output stem>.checkpoint.nc`` was the default before the store: --resume says how to use it."""
    path = write_job(tmp_path, digits[0], checkpoint={"every": 10})
    assert main(["train", "--config", str(path), "--resume"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith(
        f"--resume: no checkpoint at {str(tmp_path / 'result.checkpoint')!r}; run without --resume "
        f"to start from scratch (or set checkpoint.path to where the checkpoint is)"
    ), err
    old = write_job(tmp_path, digits[0], checkpoint={"every": 10, "path": "result.checkpoint.nc"})
    write_checkpoint(
        load_job(old),
        {
            "iteration": 10,
            "params": [np.zeros((12, 65)), np.zeros((10, 12))],
            "errors": np.ones(10),
        },
    )
    path = write_job(tmp_path, digits[0], checkpoint={"every": 10})
    assert main(["train", "--config", str(path), "--resume"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith(
        "(or set checkpoint.path to where the checkpoint is, e.g. checkpoint.path: "
        f"{tmp_path / 'result.checkpoint.nc'})"
    ), err
    assert not (tmp_path / "result.checkpoint").exists()


@pytest.mark.slurm
def test_sbatch_workers_write_the_checkpoint_store_and_resume_finishes(slurm_cluster, tmp_path):
    """Real SLURM worker jobs write their rows into the job's default store (``<output stem>.checkpoint``,
    on the file system every node mounts); SIGTERM, then ``--resume`` ends serial-equal."""
    groups = [{"name": "big", "jobs": 1, "speed": 1.0}, {"name": "small", "jobs": 1, "speed": 0.5}]
    path = slurm_job(
        tmp_path,
        slurm_cluster.partitions,
        groups,
        iterations=200,
        **{"min-workers": 2, "checkpoint": {"every": 25}},
    )
    drv = Driver(tmp_path, path)
    drv.wait_for("checkpoint at iteration 50")
    man = store.read_manifest(tmp_path / "result.checkpoint")
    assert man["iteration"] >= 50 and len(man["files"]) >= 2  # both worker jobs wrote rows
    subprocess.run(["scancel", "--batch", "--signal=TERM", drv.id], check=True)
    log = drv.finish()
    stop = [line for line in log.splitlines() if line.startswith("stopped at iteration")]
    assert stop and "SIGTERM" in stop[0], log
    k = int(stop[0].split()[3])
    assert store.read_manifest(tmp_path / "result.checkpoint")["iteration"] == k
    drv = Driver(tmp_path, path, "--resume")
    log = drv.finish()
    assert f"at iteration {k}" in log and "done: 200 iterations" in log, log
    ds = _open(tmp_path / "result.nc")
    assert ds.attrs["resumed_from_iteration"] == k
    x, d = _digits_arrays(tmp_path)
    _serial_check(ds, x, d, 200)
    assert not (tmp_path / "result.checkpoint").exists()


def test_a_slurm_job_without_a_reachable_slurm_is_one_line_and_exit_2(tmp_path, digits):
    data, _, _ = digits
    path = write_job(
        tmp_path, data, workers={"slurm": {"groups": [{"name": "cpu", "cores": 1, "jobs": 1}]}}
    )
    (tmp_path / "bin").mkdir()
    env = dict(os.environ, PATH=str(tmp_path / "bin"))  # no sbatch here
    p = subprocess.run(
        [sys.executable, "-m", "dask_rpm.cli", "train", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert (
        len(lines) == 1
        and "SLURM cannot take jobs from here: sbatch is not on the PATH" in lines[0]
    )
    assert sorted(os.listdir(tmp_path)) == ["bin", "job.yaml"]  # nothing written


@pytest.mark.slow
def test_nan_found_by_a_worker_prints_no_worker_traceback(tmp_path, digits):
    """The worker returns the user's data error instead of failing its task: its log (this
    process group's stderr, as on a terminal) shows no "Compute Failed" traceback."""
    _, x, d = digits
    x = x.copy()
    x[3, 1] = np.inf
    write_dataset(tmp_path / "bad.nc", x, d)
    path = write_job(tmp_path, str(tmp_path / "bad.nc"))
    p = subprocess.run(
        [sys.executable, "-m", "dask_rpm.cli", "train", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "x[3, 1] = inf (sample 3)" in lines[0], p.stderr[-3000:]


@pytest.mark.slow
def test_a_classification_job_from_labels_written_with_write_dataset(tmp_path):
    """The documented way to make a job's data: ``write_dataset(path, x, labels)`` (labels of any
    kind, written one-hot with the labels kept); the job's model predicts those labels, and
    ``dask-rpm predict`` scores against the file's targets."""
    from sklearn.datasets import load_iris

    from dask_rpm import MLPModel

    x, y = load_iris(return_X_y=True)
    names = np.array(["setosa", "versicolor", "virginica"])[y]
    x = (x - x.mean(axis=0)) / x.std(axis=0)
    write_dataset(tmp_path / "iris.nc", x, names)
    path = write_job(
        tmp_path,
        str(tmp_path / "iris.nc"),
        iterations=300,
        loss="cross-entropy",
        bias=True,
        optimizer="adam",
        **{"learning-rate": 0.01},
    )
    assert main(["train", "--config", str(path)]) == 0
    model = MLPModel.load(tmp_path / "result.model.nc")
    assert list(model.classes) == ["setosa", "versicolor", "virginica"]
    assert model.score(x, names) > 0.9
    p = subprocess.run(
        [
            sys.executable, "-m", "dask_rpm.cli", "predict",
            "--model", str(tmp_path / "result.model.nc"),
            "--data", str(tmp_path / "iris.nc"),
            "--output", str(tmp_path / "pred.nc"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    acc = float(p.stdout.split("accuracy against d: ")[1].split(";")[0])
    assert acc == pytest.approx(model.score(x, names), abs=1e-12)
    labels = _open(tmp_path / "pred.nc")["prediction"].values
    assert set(labels) <= {"setosa", "versicolor", "virginica"}
    # a file of the user's own with 1-D labels as d: scored against them too
    import xarray

    xarray.Dataset({"x": (("sample", "input"), x), "d": (("sample",), names)}).to_netcdf(
        tmp_path / "own.nc", engine="h5netcdf"
    )
    out = main(
        ["predict", "--model", str(tmp_path / "result.model.nc"), "--data", str(tmp_path / "own.nc"),
         "--output", str(tmp_path / "pred2.nc")]
    )  # fmt: skip
    assert out == 0 and _open(tmp_path / "pred2.nc").attrs["accuracy"] == pytest.approx(acc)


@pytest.mark.slurm
def test_worker_job_logs_go_next_to_the_output_not_into_the_working_directory(
    slurm_cluster, tmp_path, monkeypatch
):
    groups = [{"name": "big", "jobs": 1, "speed": 1.0}]
    path = slurm_job(tmp_path, slurm_cluster.partitions, groups, iterations=20)
    job = yaml.safe_load(path.read_text())
    del job["workers"]["slurm"]["cluster"]["log-directory"]  # the default
    path.write_text(yaml.safe_dump(job))
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    assert main(["train", "--config", str(path)]) == 0
    assert list(cwd.iterdir()) == []  # nothing where the command happened to run
    logs = list((tmp_path / "result.slurm-logs").glob("*.out"))
    assert logs, sorted(os.listdir(tmp_path))


def test_alpha_and_reduction_in_a_job_file_equal_fit_serial(tmp_path, digits, capsys):
    data, x, d = digits
    path = write_job(
        tmp_path, data, iterations=20, alpha=0.5, reduction="mean", **{"batch-size": 100}
    )
    assert main(["train", "--config", str(path)]) == 0
    ds = _open(tmp_path / "result.nc")
    ref = fit_serial(
        x, d, hidden=12, iterations=20, learning_rate=0.005, seed=0, batch_size=100, alpha=0.5,
        reduction="mean",
    )  # fmt: skip
    W, err = ref.params[0], ref.errors
    np.testing.assert_allclose(ds["W"].values, W, rtol=RTOL, atol=0)
    np.testing.assert_allclose(ds["error"].values, err, rtol=RTOL, atol=0)
