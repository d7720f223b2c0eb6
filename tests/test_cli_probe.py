"""`dask-rpm probe`: the probe from the command line (dask_rpm.cli.probe)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import xarray as xr
from distributed import LocalCluster

from dask_rpm.cli import main


def _run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dask_rpm.cli", "probe", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.slow
def test_local_emulated_probe_prints_a_table_and_the_plan_command():
    p = _run("--speeds", "1,0.25", "--repeats", "4", "--max-seconds", "1")
    assert p.returncode == 0, p.stderr[-3000:]
    out = p.stdout
    assert "EMULATED" in out.splitlines()[0]
    import dask

    shape, samples = dask.config.get("rpm.demo.shape"), dask.config.get("rpm.demo.samples")
    assert (
        f"probe of 2 worker(s) for a {shape} job on {samples} samples" in out
    )  # the demo's job by default
    rows = [ln.split() for ln in out.splitlines() if ln.strip().startswith(("P1 ", "P2 "))]
    assert [r[0] for r in rows] == ["P1", "P2"]
    ability = [float(r[3]) for r in rows]
    assert sum(ability) == pytest.approx(1.0, abs=2e-3)
    assert all(
        float(r[2]) > 0 for r in rows
    )  # throughput (no speed ratio here: timings are for benchmarks)
    assert "links (0->1" in out and "latency" in out
    cmd = out.strip().splitlines()[-1].split()
    assert cmd[:3] == ["dask-rpm", "plan", "--abilities"] and "--shape" in cmd
    # the printed command runs
    assert main(cmd[1:] + ["--no-draw"]) == 0


@pytest.mark.slow
def test_default_local_probe_starts_the_demos_workers():
    """dask-rpm probe and dask-rpm train start the same EMULATED workers: one default, rpm.demo.speeds."""
    import dask

    speeds = [float(v) for v in dask.config.get("rpm.demo.speeds")]
    assert len(speeds) == 4
    p = _run("--json", "--repeats", "2", "--max-seconds", "0.5")
    assert p.returncode == 0, p.stderr[-3000:]
    d = json.loads(p.stdout)
    assert len(d["workers"]) == len(speeds)
    assert d["emulation"].startswith(
        "EMULATED heterogeneity on one machine: speeds " + ", ".join(str(v) for v in speeds)
    )


def test_scheduler_json_and_netcdf(tmp_path, capsys):
    path = tmp_path / "probe.nc"
    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0"
    ) as cluster:
        code = main(
            [
                "probe",
                "--scheduler",
                cluster.scheduler_address,
                "--shape",
                "20-16-4",
                "--samples",
                "256",
                "--repeats",
                "3",
                "--max-seconds",
                "0.5",
                "--json",
                "--netcdf",
                str(path),
            ]
        )
        addresses = sorted(cluster.scheduler_info["workers"])
    assert code == 0
    d = json.loads(capsys.readouterr().out)
    assert d["shape"] == "20-16-4" and d["samples"] == 256 and d["emulation"] is None
    assert sorted(w["address"] for w in d["workers"]) == addresses
    assert all(w["throughput"] > 0 for w in d["workers"])
    assert sum(w["ability"] for w in d["workers"]) == pytest.approx(1.0)
    assert d["throughput_units"] == "work units/s" and d["repeats"] == 3
    with xr.open_dataset(path) as ds:
        assert ds.sizes["worker"] == 2
        assert [float(v) for v in ds["throughput"].values] == pytest.approx(
            [w["throughput"] for w in d["workers"]]
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["probe.nc"]


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--shape", "20-16"], "shape must be three positive integers"),
        (["--samples", "x"], "--samples='x' is not a whole number"),
        (["--samples", "0"], "--samples=0 must be at least 1"),
        (["--repeats", "0"], "--repeats='0' must be > 0"),
        (["--repeats", "2.5"], "--repeats='2.5' is not a whole number"),
        (["--max-seconds", "nan"], "--max-seconds='nan' must be > 0"),
        (["--speeds", "1,x"], "--speeds='1,x' is not a comma-separated list"),
        (["--speeds", "1,-1"], "give one finite speed > 0"),
        (["--speeds", "1", "--scheduler", "tcp://a:1"], "not allowed with argument"),
        (["--netcdf", "/nonexistent-dir/p.nc"], "does not exist"),
        (
            ["--scheduler", "tcp://127.0.0.1:1", "--timeout", "1"],
            "cannot connect to scheduler 'tcp://127.0.0.1:1'",
        ),
    ],
)
def test_bad_input_exits_2_with_one_clear_line(args, needle, capsys):
    assert main(["probe", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1, err


def test_help_shows_examples(capsys):
    assert main(["probe", "--help"]) == 0
    out = capsys.readouterr().out
    assert "examples:" in out and "dask-rpm probe --scheduler" in out and "EMULATED" in out
