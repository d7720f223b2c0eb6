"""`dask-rpm train`: the README's main job on the embedded default."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from dask_rpm.cli import main


def _run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dask_rpm.cli", "train", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.slow
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


@pytest.mark.slow
def test_demo_prints_its_own_evidence():
    """The default demo, as a new user runs it: the numbers it prints are consistent and show the method."""
    from test_tutorials import _assert_clean_stderr, _speed_check

    p = _run()
    assert p.returncode == 0, p.stderr[-2000:]
    _assert_clean_stderr("dask-rpm train", p.stderr)
    out = p.stdout
    assert out.startswith("EMULATED heterogeneity on one machine: speeds 1.0, 0.6, 0.4, 0.25")
    assert " 1 workers" not in out and " 1 columns" not in out
    final = re.search(
        r"^final plan \(after (\d+) remaps?\): <Plan srpm: 4 workers in \d+ columns? ", out, re.M
    )
    assert final, out
    assert int(final.group(1)) == len(re.findall(r"^remap at iteration \d+: ", out, re.M)) >= 1
    for line in re.findall(r"^remap at iteration .*$", out, re.M):  # both kinds of bytes, named
        assert re.search(r"\d+ weight bytes moved, \d+ sample bytes re-read, \d+\.\d+ s$", line), (
            line
        )
    trained = re.search(
        r"trained 33-256-8 on 8192 samples for 60 iterations on 4 EMULATED workers: "
        r"error (\d+\.\d+) -> (\d+\.\d+), (\d+\.\d) ms/iteration",
        out,
    )
    assert trained and float(trained.group(2)) < float(trained.group(1))
    verdict = _speed_check(out, [1.0, 0.6, 0.4, 0.25])
    t = re.search(
        r"this plan (\d+\.\d) ms \| fastest worker alone (\d+\.\d) ms \(speed-up (\d+\.\d+)x\) \| "
        r"uniform plan (\d+\.\d) ms \(speed-up (\d+\.\d+)x\)",
        out,
    )
    assert t, out
    plan_ms, alone_ms, up_alone, uniform_ms, up_uniform = (float(v) for v in t.groups())
    assert plan_ms == float(trained.group(3))
    assert up_alone == pytest.approx(alone_ms / plan_ms, abs=0.02)
    assert up_uniform == pytest.approx(uniform_ms / plan_ms, abs=0.02)
    g = float(
        re.search(
            r"parallel efficiency gamma (\d+\.\d+) \(1 = every worker's speed used: 2.25x", out
        ).group(1)
    )
    assert g == pytest.approx((1 / plan_ms) / (2.25 / alone_ms), abs=0.02)
    if (
        verdict == "works"
    ):  # the speeds were honoured, so the plan must beat the fastest worker alone
        assert up_alone > 1.0, out
