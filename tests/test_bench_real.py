"""dask-rpm bench --real: REAL unpaced workers against an unpaced DDP peer.

Speed is not asserted (benchmarks/real_hardware.py and docs/benchmarks.md measure it); the checks
are that the run uses real workers with the threads asked for, that every figure is measured and
labelled REAL, and that the unpaced DDP peer still trains what dask_rpm trains.
"""

from __future__ import annotations

import json
import math

import pytest

from dask_rpm import bench
from dask_rpm.cli import main


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--workloads", "custom"], "--real runs compute, minibatch, paper"),
        (["--methods", "srpm-assumed"], "--real runs drpm"),
        (["--mix", "0,2"], "give threads per worker"),
        (["--mix", "two"], "give threads per worker"),
        (["--threads-per-worker", "0"], "whole number >= 1"),
    ],
)
def test_bad_real_options_exit_2(argv, needle, capsys, tmp_path):
    assert main(["bench", "--real", *argv, "--out", str(tmp_path / "o")]) == 2
    assert needle in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_real_run_on_a_threads_mix(tmp_path, capsys):
    argv = ["bench", "--real", "--n", "1", "--mix", "1,2", "--workloads", "paper"]
    argv += ["--methods", "srpm-time,uniform,ddp", "--iterations", "12"]
    assert main([*argv, "--out", str(tmp_path), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["threads"] for r in rows] == [[1], [1, 2]]
    for r in rows:
        assert r["label"] == "REAL" and r["workload"] == "paper"
        assert len(r["alone"]) == len(r["threads"]) and all(a > 0 for a in r["alone"])
        for name, m in r["methods"].items():
            if "skipped" in m:  # DDP without torch
                assert name == "ddp"
                continue
            assert m["seconds"] > 0 and math.isfinite(m["gamma"])
    mix = rows[1]["methods"]
    assert mix["uniform"]["threads"] == [1, 2]  # each worker's kernels on its own threads
    assert json.loads((tmp_path / "real.json").read_text()) == rows


@pytest.mark.slow
def test_unpaced_ddp_with_threads_trains_the_serial_weights():
    pytest.importorskip("torch")
    from dask_rpm import fit_serial
    from dask_rpm.demo.train import demo_data

    x, d = demo_data(64, (6, 4, 2))
    res = bench.run_ddp(
        x,
        d,
        hidden=4,
        speeds=[1.0, 1.0],
        scale=1.0,
        iterations=5,
        learning_rate=0.01,
        threads=[2, 1],
        paced=False,
    )
    W, V = fit_serial(x, d, hidden=4, iterations=5, learning_rate=0.01).params
    assert bench.weights_difference(res["params"], (W, V)) < 1e-12
