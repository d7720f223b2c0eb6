"""`dask-rpm train`: the README's main job on the embedded default."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dask_rpm.cli import main


def _run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dask_rpm.cli", "train", *args],
        capture_output=True, text=True, timeout=timeout,
    )


def test_demo_trains_and_reports_json():
    p = _run("--iterations", "24", "--json")
    assert p.returncode == 0, p.stderr[-2000:]
    summary = json.loads(p.stdout.strip().splitlines()[-1])
    assert summary["iterations"] == 24
    assert summary["final_error"] < summary["initial_error"]
    assert summary["seconds_per_iteration"] > 0
    assert "EMULATED" in summary["emulation"]
    assert summary["workers"] == 4 and len(summary["plan"]["rectangles"]) == 4
    # DRPM without initial abilities remaps at its first check (iteration 20).
    assert summary["remaps"] and summary["remaps"][0]["kind"] == "whole"


def test_mapping_names_come_from_the_planner_registry(capsys):
    from dask_rpm.planners import PLANNERS

    assert main(["train", "--mapping", "best"]) == 2
    err = capsys.readouterr().err
    for name in ("drpm", *PLANNERS):
        assert name in err


def test_demo_human_output_names_emulation():
    p = _run("--iterations", "4", "--speeds", "1,0.5", "--mapping", "srpm")
    assert p.returncode == 0, p.stderr[-2000:]
    assert "EMULATED heterogeneity" in p.stdout
    assert "ms/iteration" in p.stdout and "error" in p.stdout


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--speeds", "1,x"], "--speeds '1,x'"),
        (["--speeds", "1,-2"], "finite number > 0"),
        (["--speeds", "1,nan"], "finite number > 0"),
        (["--iterations", "0"], "--iterations 0"),
        (["--mapping", "best"], "--mapping 'best'"),
    ],
)
def test_bad_input_exits_2_with_one_line(capsys, args, needle):
    assert main(["train", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0]
