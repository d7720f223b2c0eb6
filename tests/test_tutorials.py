"""Every tutorial in tutorials/ runs as a script and shows what its text promises."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

TUTORIALS = Path(__file__).resolve().parents[1] / "tutorials"
COVERED = {
    "01_planning.py",
    "02_local_training.py",
    "03_slurm.py",
    "04_dashboard.py",
    "05_sbatch_job.py",
    "06_classifier.py",
    "07_deep_classifier.py",
    "08_cnn.py",
    "09_dask_data.py",
}


def _run(
    name: str, *args: str, env: dict | None = None, timeout: float = 600, tmp: Path | None = None
) -> subprocess.CompletedProcess:
    """Run a tutorial; with ``tmp`` its temporary files go there (TMPDIR) and none may be left behind."""
    env = dict(os.environ if env is None else env)
    if tmp is not None:
        tmp.mkdir(exist_ok=True)
        env["TMPDIR"] = str(tmp)
    p = subprocess.run(
        [sys.executable, str(TUTORIALS / name), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=str(TUTORIALS.parent),
    )
    assert p.returncode == 0, (
        f"{name} exited {p.returncode}\nstdout:\n{p.stdout[-3000:]}\nstderr:\n{p.stderr[-3000:]}"
    )
    _assert_clean_stderr(name, p.stderr)
    if tmp is not None:
        # Dask's own scratch root (dask-scratch-space) may stay, and torch's cache root
        # (torchinductor_<user>: torch.optim's optimizers create it, empty); nothing of the tutorial's
        left = sorted(
            f
            for f in os.listdir(tmp)
            if f != "dask-scratch-space" and not f.startswith("torchinductor_")
        )
        assert left == [], f"{name} left {left} in its temporary directory"
    return p


def _assert_clean_stderr(name: str, stderr: str) -> None:
    """Only fit's progress lines may reach stderr: no tracebacks, warnings or log records."""
    other = [ln for ln in stderr.splitlines() if ln.strip() and not ln.startswith("dask-rpm fit: ")]
    assert other == [], f"{name} wrote to stderr:\n" + "\n".join(other[:40])


def _numbers(line: str) -> list[float]:
    return [float(v) for v in re.findall(r"\d+\.\d+", line.split(":", 1)[1].split("(largest")[0])]


def _speed_check(out: str, speeds: list[float], *, small: bool = False) -> str:
    """Parse the speed-check lines and verify them against ``speeds``; returns the verdict.

    "works" needs every estimate and area share within 10 % of the speed
    share (recomputed here from the printed numbers); "busy" needs the printed
    overrun count above 5 % of the blocks; the size excuse is accepted only
    for a tutorial whose size is known to be too ``small``, and only when the
    numbers really are off by more than 10 %.
    """
    lines = out.splitlines()
    truth_line = next(ln for ln in lines if "EMULATED speed shares:" in ln)
    i = lines.index(truth_line)
    truth = np.array(_numbers(truth_line))
    np.testing.assert_allclose(truth, np.array(speeds) / sum(speeds), atol=6e-4)
    est_line, area_line, verdict = lines[i + 1], lines[i + 2], lines[i + 3]
    assert "DRPM estimates (iteration " in est_line and "final plan's area shares:" in area_line, (
        lines[i : i + 4]
    )
    est, area = np.array(_numbers(est_line)), np.array(_numbers(area_line))
    assert est.shape == area.shape == truth.shape
    off = max(np.max(np.abs(est - truth) / truth), np.max(np.abs(area - truth) / truth))
    if "the method works here" in verdict:
        assert off <= 0.10 + 0.01, (off, lines[i : i + 4])  # +1 %: the printed numbers are rounded
        return "works"
    assert "not within 10%" in verdict and off > 0.10 - 0.01, (off, verdict)
    if "the machine was busy" in verdict:
        late, blocks = (
            int(v)
            for v in re.search(r"(\d+) of (\d+) paced kernel blocks ran late", verdict).groups()
        )
        assert late > 0.05 * blocks, verdict  # the excuse must be backed by the count
        return "busy"
    assert small, f"the tutorial's size should show the method: {verdict}"
    return "small"


def _assert_nonblank_png(path: Path) -> None:
    from PIL import Image

    img = np.asarray(Image.open(path).convert("RGB"), dtype=float)
    assert img.shape[0] > 200 and img.shape[1] > 200 and img.std() > 20


def test_every_tutorial_is_tested():
    assert {p.name for p in TUTORIALS.glob("*.py")} == COVERED


def test_01_planning(tmp_path):
    png = tmp_path / "plan.png"
    out = _run("01_planning.py", "--png", str(png), tmp=tmp_path / "tmp").stdout
    # the paper's worked example: C = 2 columns, {P1, P2, P3} | {P4, P5}
    assert "{P1,P2,P3} | {P4,P5}" in out
    assert "C=2:    73913.6   <- chosen" in out
    assert "P5 (ability 0.35): 666 samples x 46 hidden units" in out
    assert "as an xarray.Dataset:" in out and "hidden_start" in out
    assert "uniform    1 column(s)  imbalance 4.000" in out
    _assert_nonblank_png(png)


@pytest.mark.slow
def test_02_local_training(tmp_path):
    import xarray as xr

    nc, png = tmp_path / "history.nc", tmp_path / "run.png"
    p = _run("02_local_training.py", "--netcdf", str(nc), "--png", str(png), tmp=tmp_path / "tmp")
    out = p.stdout
    assert out.splitlines()[0].startswith(
        "EMULATED heterogeneity on one machine: speeds 1.0, 0.5, 0.25"
    )
    assert "equal to serial BP up to float64 rounding: True" in out
    assert "history variables:" in out and "iteration_time" in out and "[s]" in out
    assert (
        "plan 0 (initial, uniform, from iteration 0): w0: 1365 x 256; w1: 1366 x 256; w2: 1365 x 256"
        in out
    )
    assert (
        "remap at iteration 20: whole" in out
    )  # DRPM without initial abilities: whole remap at the first check
    assert "ability estimates at the DRPM checks" in out
    verdict = _speed_check(out, [1.0, 0.5, 0.25])
    if verdict == "works":
        # after the remaps each worker computes for about the same time (areas follow the speeds);
        # DRPM may remap again at a later check (a column remap when a loaded machine shifts the
        # estimates), so the plan that ran to the end is the one measured
        last = [
            ln for ln in out.splitlines() if re.match(r"  plan [1-9]\d* \(iterations \d+-59\)", ln)
        ][-1]
        ms = [float(v) for v in re.findall(r"(\d+\.\d) ms", last)]
        assert max(ms) / min(ms) < 1.35, last
    assert (
        "dask-rpm fit: iteration 60/60 (100%)" in p.stderr
    )  # progress lines on stderr (not a terminal)
    with xr.open_dataset(nc) as h:
        assert h.sizes["iteration"] == 60 and "EMULATED" in h.attrs["emulation"]
        assert float(h["error"][-1]) < float(h["error"][0])
    _assert_nonblank_png(png)


def test_03_slurm_skips_visibly_without_slurm(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}
    out = _run("03_slurm.py", env=env, timeout=120, tmp=tmp_path / "tmp").stdout
    assert out.startswith("SKIPPED: this tutorial needs SLURM: SLURM_CONF is not set")


@pytest.mark.slurm
def test_03_slurm(slurm_cluster, tmp_path):
    out = _run("03_slurm.py", tmp=tmp_path / "tmp").stdout  # slurm_cluster exported SLURM_CONF
    assert "SKIPPED" not in out
    assert "#SBATCH -J dask-rpm-slow" in out
    assert "workers per group: {'fast': 1, 'slow': 2}" in out
    assert "EMULATED heterogeneity" in out and "<FitResult 60 iterations" in out
    plan_lines = [
        ln.split()
        for ln in out.splitlines()
        if ln.startswith("  fast ") or ln.startswith("  slow ")
    ]
    assert sorted(ln[0] for ln in plan_lines) == ["fast", "slow", "slow"]
    # the speeds in plan-worker order are those of the groups (fast 1.0, slow 0.5)
    speeds = [1.0 if ln[0] == "fast" else 0.5 for ln in plan_lines]
    _speed_check(out, speeds)
    assert out.rstrip().splitlines()[-1].startswith(("cluster closed", "to run training itself"))


@pytest.mark.slow
def test_04_dashboard(tmp_path):
    out = _run("04_dashboard.py", tmp=tmp_path / "tmp").stdout
    assert "dashboard: http://127.0.0.1:" in out and "/rpm" in out
    assert "<FitResult 60 iterations" in out
    assert "current plan (" in out and "estimated ability" in out
    assert "EMULATED heterogeneity" in out
    _speed_check(out, [1.0, 0.5, 0.25])


def test_05_sbatch_job_skips_visibly_without_slurm(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}
    out = _run("05_sbatch_job.py", env=env, timeout=120, tmp=tmp_path / "tmp").stdout
    assert out.startswith("SKIPPED: this tutorial needs SLURM: SLURM_CONF is not set")


@pytest.mark.slurm
def test_05_sbatch_job(slurm_cluster, tmp_path):
    out = _run("05_sbatch_job.py", tmp=tmp_path / "tmp").stdout
    assert "SKIPPED" not in out
    assert "slurm/train.sbatch job.yaml   -> driver job" in out
    assert (
        "  | workers: SLURM groups fast: 2 job(s) x 1 worker(s), slow: 1 job(s) x 1 worker(s)"
        in out
    )
    # training stops right after the first iteration at or below the target (181)
    assert "  | done: 182 iterations, error 119.292 (target 120)" in out
    assert (
        "status complete, 182 iterations, error 1449.8 -> 119.3 (target error 120 reached at iteration 181)"
        in out
    )
    assert "digits classified right by the trained net: 94.4%" in out
    assert "netcdf" not in out.lower()  # no h5netcdf warning in the driver's log
    # the workers in the last plan's order and their groups' EMULATED speeds
    workers = out.split("workers: ")[-1].splitlines()[0].split(", ")
    assert len(workers) == 3
    # a small job (1797 samples x 24 hidden units): the output may say why it cannot show the speeds
    shares = [
        float(v)
        for v in re.findall(
            r"\d+\.\d+",
            next(ln for ln in out.splitlines() if "EMULATED speed shares:" in ln).split(":")[1],
        )
    ]
    speeds = [1.0 if abs(v - 0.4) < 1e-3 else 0.5 for v in shares]  # shares: fast 0.4, slow 0.2
    assert sorted(speeds) == [0.5, 1.0, 1.0]
    _speed_check(out, speeds, small=True)


@pytest.mark.slow
def test_06_classifier(tmp_path):
    model = tmp_path / "digits.model.nc"
    out = _run("06_classifier.py", "--model", str(model), tmp=tmp_path / "tmp").stdout
    assert "EMULATED heterogeneity on one machine: speeds 1.0, 0.5" in out
    assert "digits: 1347 training and 450 held-out samples, 64 pixels, 10 classes" in out
    acc = float(out.split("held-out accuracy: ")[1].split()[0])
    assert acc >= 0.95  # scikit-learn's MLPClassifier on the same split, the same model
    assert "loaded model predicts exactly the same: True" in out
    assert "the same model as scikit-learn's (rtol 1e-9): True" in out
    theirs = float(out.split("epochs, held-out accuracy ")[1].split(";")[0])
    assert theirs == acc
    import dask_rpm

    loaded = dask_rpm.MLPModel.load(model)  # the file the tutorial saved
    assert loaded.is_classifier and loaded.meta["params"]["solver"] == "adam"


@pytest.mark.slow
def test_07_deep_classifier(tmp_path):
    out = _run("07_deep_classifier.py", tmp=tmp_path / "tmp").stdout
    assert "EMULATED heterogeneity on one machine: speeds 1.0, 0.5, 0.25" in out
    assert "network 65-49-33-10 (with the bias input and bias units)" in out
    # every worker holds rows of both hidden layers, in proportion to its speed
    rows = [ln for ln in out.splitlines() if ln.startswith("  P") and "layer 2" in ln]
    assert len(rows) == 3
    kib = {ln.split()[0]: float(ln.split("holds ")[1].split()[0]) for ln in rows}
    assert kib["P1"] > kib["P2"] > kib["P3"] > 0
    columns = out.split("each column holds the whole network once (")[1]
    whole = float(columns.split()[0])
    per_column = [float(v) for v in columns.split("[")[1].split("]")[0].split(",")]
    assert per_column == [whole] * len(per_column)
    assert "(<= 1e-10: True)" in out
    line = out.split("held-out accuracy: cluster ")[1].splitlines()[0]
    cluster, serial = float(line.split(",")[0]), float(line.split("serial ")[1])
    assert cluster == serial >= 0.95
    assert "the same weights (rtol 1e-9): True" in out
    ours = float(out.split("on the cluster: held-out accuracy ")[1].split(";")[0])
    theirs = float(out.split("scikit-learn's MLPClassifier: ")[1].split(";")[0])
    assert ours == theirs >= 0.9


def test_06_without_scikit_learn_says_what_to_install(tmp_path):
    """After the README's plain ``pip install .`` (no scikit-learn), the tutorial says what to
    install instead of dying with ModuleNotFoundError."""
    hidden = tmp_path / "hide"
    (hidden / "sklearn").mkdir(parents=True)
    (hidden / "sklearn" / "__init__.py").write_text("raise ImportError('not installed')\n")
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(hidden), os.environ.get("PYTHONPATH", "")])
    )
    out = _run("06_classifier.py", env=env, timeout=120).stdout
    assert out.strip() == "SKIPPED: this tutorial needs scikit-learn: pip install '.[sklearn]'"


@pytest.mark.slow
def test_08_cnn(tmp_path):
    pytest.importorskip("torch")
    out = _run("08_cnn.py", tmp=tmp_path / "tmp").stdout
    assert "digits: 1347 training and 450 held-out images of 1x8x8" in out
    assert "EMULATED heterogeneity on one machine: speeds 1.0, 0.5, 0.25" in out
    assert "  stage 1: conv 1->8 k3 s1 p1 relu maxpool2 -> 8 x 4x4" in out
    assert "  stage 2: conv 8->16 k3 s1 p1 relu maxpool2 -> 16 x 2x2" in out
    # SRPM for mini-batches of 64: P2 and P3 split every stage's channels, P1 is a column alone
    assert "3 workers in 2 columns {P3,P2} | {P1}" in out
    rows = {
        ln.split()[0]: ln.split() for ln in out.splitlines() if re.match(r"  P\d \(\d\.\d+\) ", ln)
    }
    assert set(rows) == {"P1", "P2", "P3"}
    ranges = {w: re.findall(r"\[(\d+), (\d+)\)", " ".join(r)) for w, r in rows.items()}
    # samples, then stages 1-3; the column's members tile every stage's channels
    assert ranges["P3"][0] == ranges["P2"][0] and ranges["P1"][0][1] == "1347"
    for k, full in zip((1, 2, 3), (8, 16, 65)):
        assert ranges["P1"][k] == ("0", str(full))
        assert ranges["P3"][k][0] == "0" and ranges["P3"][k][1] == ranges["P2"][k][0]
        assert ranges["P2"][k][1] == str(full)
    # memory follows the rectangle: the column's members hold the network once between them
    kib = {w: float(r[-2]) for w, r in rows.items()}
    assert kib["P1"] > kib["P2"] > kib["P3"] > 0
    assert abs(kib["P2"] + kib["P3"] - kib["P1"]) < 0.11  # each printed to 0.1 KiB
    assert "row 64 is the output bias channel" in out
    assert "128 + 64 = 192 values per sample" in out
    acc = float(out.split("held-out accuracy ")[1].split()[0].rstrip(";"))
    assert acc >= 0.95
    assert "to_torch(layers, result.params) predicts the same labels: True" in out
    torch_line = next(ln for ln in out.splitlines() if ln.startswith("PyTorch's own loop"))
    diff = float(torch_line.split("weights ")[1].split()[0])
    assert diff <= 1e-12 and "(<= 1e-12: True)" in torch_line
    assert float(torch_line.split("held-out accuracy ")[1]) == acc  # the same network
    serial_line = next(ln for ln in out.splitlines() if ln.startswith("fit_serial"))
    assert float(serial_line.split("difference ")[1].split()[0]) <= 1e-12
    # the layer records: the same stages, another plan (one column, channels split three ways)
    assert "the same stages as the torch module: True" in out
    assert "3 workers in 1 column {P3,P2,P1}" in out
    records = out.split("equals fit_serial of the records")[1]
    assert float(records.split("difference ")[1].split()[0]) <= 1e-12
    assert float(records.split("held-out accuracy ")[1].split()[0]) >= 0.9


def test_08_without_torch_says_what_to_install(tmp_path):
    hidden = tmp_path / "hide"
    (hidden / "torch").mkdir(parents=True)
    (hidden / "torch" / "__init__.py").write_text("raise ImportError('not installed')\n")
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(hidden), os.environ.get("PYTHONPATH", "")])
    )
    out = _run("08_cnn.py", env=env, timeout=120).stdout
    assert out.strip() == (
        "SKIPPED: this tutorial needs scikit-learn and torch: pip install '.[sklearn,torch]'"
    )


@pytest.mark.slow
def test_09_dask_data(tmp_path):
    pytest.importorskip("zarr")
    out = _run("09_dask_data.py", tmp=tmp_path / "tmp").stdout
    assert "part-0.nc, part-1.nc, part-2.nc, part-3.nc" in out
    assert "chunked along samples (150, 150, 150, 150) - one chunk per file" in out
    assert "wrote the zarr store train.zarr: 4 chunks of 150 samples (13200 bytes" in out
    assert "  P1: samples [0, 300), chunks 0, 1" in out
    assert (
        "  P2: samples [300, 450), chunks 2" in out and "  P3: samples [450, 600), chunks 3" in out
    )
    runs = {part[:1]: part for part in out.split("\n\n")[-3:]}
    assert set(runs) == {"a", "b", "c"}
    for part in runs.values():  # every run: fit_serial's weights
        assert "equal to fit_serial on the same store: True" in part
        assert float(part.split("largest difference ")[1].split()[0]) <= 1e-10
    # a: wherever Dask put the chunks; the bytes are those of the chunks listed as moved in
    lines = [ln for ln in runs["a"].splitlines() if " reads chunks " in ln]
    came = sum(len(re.findall(r"\d+", ln.split("another worker: ")[1])) for ln in lines)
    assert f"bytes moved: {came * 13200};" in runs["a"]
    # b: chunks on their columns' workers move nothing
    assert "  P1 reads chunks 0, 1  held there: 0, 1  moved in from another worker: -" in runs["b"]
    assert "bytes moved: 0;" in runs["b"]
    # c: the plan turned: each column's chunks move in, and only they
    assert (
        "  P2 reads chunks 0, 1  held there: -     moved in from another worker: 0, 1" in runs["c"]
    )
    assert "  P1 reads chunks 3     held there: -     moved in from another worker: 3" in runs["c"]
    assert "bytes moved: 52800;" in runs["c"] and "every chunk moved once: True" in runs["c"]


def test_09_without_zarr_says_what_to_install(tmp_path):
    hidden = tmp_path / "hide"
    (hidden / "zarr").mkdir(parents=True)
    (hidden / "zarr" / "__init__.py").write_text("raise ImportError('not installed')\n")
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(hidden), os.environ.get("PYTHONPATH", "")])
    )
    out = _run("09_dask_data.py", env=env, timeout=120).stdout
    assert out.strip() == "SKIPPED: this tutorial needs zarr: pip install '.[zarr]'"
