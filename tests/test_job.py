"""``dask-rpm train --config FILE`` (dask_rpm.job): job files, output, checkpoints, --resume, SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import xarray as xr
import yaml
from distributed import Client, LocalCluster

from dask_rpm.cli import main
from dask_rpm.data import write_dataset
from dask_rpm.job import JobError, load_job, run_job
from dask_rpm.kernels import fit_serial

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
        "data": data_path, "hidden": 12, "iterations": 60, "learning-rate": 0.005, "mapping": "drpm",
        "output": "result.nc", "workers": {"local": {"speeds": [1.0, 0.5]}}, "config": {"drpm": {"interval": 10}},
    }
    job.update(over)
    job = {k: v for k, v in job.items() if v is not None}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def _open(path):
    with xr.open_dataset(path, engine="h5netcdf") as ds:
        return ds.load()


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
        ({"checkpoint": {"every": -1}}, "every=-1"),
        ({"output": "nodir/result.nc"}, "does not exist"),
    ],
)
def test_bad_job_exits_2_with_one_line(tmp_path, digits, capsys, over, needle):
    path = write_job(tmp_path, digits[0], **over)
    assert main(["train", "--config", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err


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


def test_job_trains_to_target_and_writes_one_output(tmp_path, digits):
    data, x, d = digits
    _, _, err = fit_serial(x, d, hidden=12, iterations=200, learning_rate=0.005, seed=0)
    target = float(err[77])
    path = write_job(tmp_path, data, iterations=200, **{"target-error": target})
    with LocalCluster(n_workers=3, threads_per_worker=1, processes=False, dashboard_address=":0") as cluster:
        with Client(cluster) as client:
            log = tmp_path / "log.txt"
            with open(log, "w") as out:
                summary = run_job(path, client=client, out=out)
    lines = log.read_text().splitlines()
    assert any(line.startswith("iteration 10/200: error ") for line in lines)
    assert lines[-1].startswith("done: 80 iterations")
    assert summary["iterations"] == 80 and summary["final_error"] <= target
    ds = _open(tmp_path / "result.nc")
    assert ds.attrs["status"] == "complete" and ds.attrs["iterations"] == 80
    assert "target error" in ds.attrs["stopped"]
    W, V, err = fit_serial(x, d, hidden=12, iterations=80, learning_rate=0.005, seed=0)
    np.testing.assert_allclose(ds["W"].values, W, rtol=RTOL, atol=0)
    np.testing.assert_allclose(ds["V"].values, V, rtol=RTOL, atol=0)
    np.testing.assert_allclose(ds["error"].values, err, rtol=RTOL, atol=0)
    assert ds.sizes["plan"] >= 1 and '"rectangles"' in str(ds["plan_json"].values[0])
    # Atomic writes leave no temporary files behind.
    assert sorted(os.listdir(tmp_path)) == ["job.yaml", "log.txt", "result.nc"]


def test_sigterm_checkpoints_and_resume_equals_uninterrupted(tmp_path, digits):
    data, x, d = digits
    path = write_job(tmp_path, data, iterations=150, checkpoint={"every": 20})
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "dask_rpm.cli", "train", "--config", str(path)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
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
    ck = _open(tmp_path / "result.checkpoint.nc")
    assert ck.attrs["iteration"] == k and ck.sizes["iteration"] == k

    p = subprocess.run([sys.executable, "-m", "dask_rpm.cli", "train", "--config", str(path), "--resume"],
                       capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    assert f"resuming from checkpoint {tmp_path / 'result.checkpoint.nc'} at iteration {k}" in p.stdout
    resumed = _open(tmp_path / "result.nc")
    assert resumed.attrs["resumed_from_iteration"] == k and resumed.sizes["iteration"] == 150
    assert not (tmp_path / "result.checkpoint.nc").exists()

    # The same job, uninterrupted.
    os.rename(tmp_path / "result.nc", tmp_path / "resumed.nc")
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0") as cluster:
        with Client(cluster) as client, open(os.devnull, "w") as out:
            run_job(path, client=client, out=out)
    whole = _open(tmp_path / "result.nc")
    for v in ("W", "V", "error"):
        np.testing.assert_allclose(resumed[v].values, whole[v].values, rtol=RTOL, atol=0)
    W, V, _ = fit_serial(x, d, hidden=12, iterations=150, learning_rate=0.005, seed=0)
    np.testing.assert_allclose(resumed["W"].values, W, rtol=RTOL, atol=0)


def test_resume_refuses_a_checkpoint_of_another_job(tmp_path, digits):
    from dask_rpm.job import write_checkpoint

    path = write_job(tmp_path, digits[0], checkpoint={"every": 10})
    job = load_job(path)
    W, V = np.zeros((12, 65)), np.zeros((10, 12))
    write_checkpoint(job, {"iteration": 10, "W": W, "V": V, "errors": np.ones(10)})
    path = write_job(tmp_path, digits[0], hidden=13, checkpoint={"every": 10})
    with pytest.raises(JobError, match="different job"):
        run_job(path, resume=True)


def test_time_limit_stops_cleanly(tmp_path, digits):
    path = write_job(tmp_path, digits[0], iterations=100_000, checkpoint={"every": 10}, **{"time-limit": 1.0})
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0") as cluster:
        with Client(cluster) as client, open(tmp_path / "log.txt", "w") as out:
            t0 = time.monotonic()
            summary = run_job(path, client=client, out=out)
            assert time.monotonic() - t0 < 60
    assert summary["stopped"].startswith("stop requested") and summary["checkpoint"]
    assert "time-limit 1 s" in (tmp_path / "log.txt").read_text()
    ck = _open(tmp_path / "result.checkpoint.nc")
    assert ck.attrs["iteration"] == summary["iterations"] > 0
    assert not (tmp_path / "result.nc").exists()
