"""Every tutorial in tutorials/ runs as a script and shows what its text promises."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

TUTORIALS = Path(__file__).resolve().parents[1] / "tutorials"
COVERED = {"01_planning.py", "02_local_training.py", "03_slurm.py", "04_dashboard.py", "05_sbatch_job.py",
           "06_classifier.py"}


def _run(name: str, *args: str, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    p = subprocess.run([sys.executable, str(TUTORIALS / name), *args], capture_output=True, text=True,
                       timeout=timeout, env=env, cwd=str(TUTORIALS.parent))
    assert p.returncode == 0, f"{name} exited {p.returncode}\nstdout:\n{p.stdout[-3000:]}\nstderr:\n{p.stderr[-3000:]}"
    return p


def _assert_nonblank_png(path: Path) -> None:
    from PIL import Image

    img = np.asarray(Image.open(path).convert("RGB"), dtype=float)
    assert img.shape[0] > 200 and img.shape[1] > 200 and img.std() > 20


def test_every_tutorial_is_tested():
    assert {p.name for p in TUTORIALS.glob("*.py")} == COVERED


def test_01_planning(tmp_path):
    png = tmp_path / "plan.png"
    out = _run("01_planning.py", "--png", str(png)).stdout
    # the paper's worked example: C = 2 columns, {P1, P2, P3} | {P4, P5}
    assert "{P1,P2,P3} | {P4,P5}" in out
    assert "C=2:    73913.6   <- chosen" in out
    assert "P5 (ability 0.35): 666 samples x 46 hidden units" in out
    assert "as an xarray.Dataset:" in out and "hidden_start" in out
    assert "uniform    1 column(s)  imbalance 4.000" in out
    _assert_nonblank_png(png)


def test_02_local_training(tmp_path):
    import xarray as xr

    nc, png = tmp_path / "history.nc", tmp_path / "run.png"
    p = _run("02_local_training.py", "--netcdf", str(nc), "--png", str(png))
    out = p.stdout
    assert out.splitlines()[0].startswith("EMULATED heterogeneity on one machine: speeds 1.0, 0.5, 0.25")
    assert "equal to serial BP up to float64 rounding: True" in out
    assert "history variables:" in out and "iteration_time" in out and "[s]" in out
    assert "plan 0 (initial, uniform, from iteration 0)" in out
    assert "remap at iteration 20: whole" in out  # DRPM without initial abilities: whole remap at the first check
    assert "ability estimates at the DRPM checks" in out
    assert "dask-rpm fit: iteration 60/60 (100%)" in p.stderr  # progress lines on stderr (not a terminal)
    with xr.open_dataset(nc) as h:
        assert h.sizes["iteration"] == 60 and "EMULATED" in h.attrs["emulation"]
        assert float(h["error"][-1]) < float(h["error"][0])
    _assert_nonblank_png(png)


def test_03_slurm_skips_visibly_without_slurm():
    env = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}
    out = _run("03_slurm.py", env=env, timeout=120).stdout
    assert out.startswith("SKIPPED: this tutorial needs SLURM: SLURM_CONF is not set")


@pytest.mark.slurm
def test_03_slurm(slurm_cluster):
    out = _run("03_slurm.py").stdout  # slurm_cluster exported SLURM_CONF
    assert "SKIPPED" not in out
    assert "#SBATCH -J dask-rpm-slow" in out
    assert "workers per group: {'fast': 1, 'slow': 2}" in out
    assert "EMULATED heterogeneity" in out and "<FitResult 40 iterations" in out
    plan_lines = [ln.split() for ln in out.splitlines() if ln.startswith("  fast ") or ln.startswith("  slow ")]
    assert sorted(ln[0] for ln in plan_lines) == ["fast", "slow", "slow"]
    assert out.rstrip().splitlines()[-1].startswith(("cluster closed", "to run training itself"))


def test_04_dashboard():
    out = _run("04_dashboard.py").stdout
    assert "dashboard: http://127.0.0.1:" in out and "/rpm" in out
    assert "<FitResult 60 iterations" in out
    assert "current plan (" in out and "estimated ability" in out
    assert "EMULATED heterogeneity" in out


def test_05_sbatch_job_skips_visibly_without_slurm():
    env = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}
    out = _run("05_sbatch_job.py", env=env, timeout=120).stdout
    assert out.startswith("SKIPPED: this tutorial needs SLURM: SLURM_CONF is not set")


@pytest.mark.slurm
def test_05_sbatch_job(slurm_cluster):
    out = _run("05_sbatch_job.py").stdout
    assert "SKIPPED" not in out
    assert "slurm/train.sbatch job.yaml   -> driver job" in out
    assert "  | workers: SLURM groups fast: 2 job(s) x 1 worker(s), slow: 1 job(s) x 1 worker(s)" in out
    # training stops right after the first iteration at or below the target (181)
    assert "  | done: 182 iterations, error 119.292 (target 120)" in out
    assert "status complete, 182 iterations, error 1449.8 -> 119.3 (target error 120 reached at iteration 181)" in out
    assert "digits classified right by the trained net: 94.4%" in out


def test_06_classifier(tmp_path):
    model = tmp_path / "digits.model.nc"
    out = _run("06_classifier.py", "--model", str(model)).stdout
    assert "EMULATED heterogeneity on one machine: speeds 1.0, 0.5" in out
    assert "digits: 1347 training and 450 held-out samples, 64 pixels, 10 classes" in out
    acc = float(out.split("held-out accuracy: ")[1].split()[0])
    assert acc >= 0.95  # measured 0.973 (scikit-learn's MLPClassifier on the same split: 0.973)
    assert "loaded model predicts exactly the same: True" in out
    assert "equal to serial training (rtol 1e-10): True" in out
    import dask_rpm

    loaded = dask_rpm.MLPModel.load(model)  # the file the tutorial saved
    assert loaded.is_classifier and loaded.meta["recipe"]["optimizer"]["name"] == "adam"
