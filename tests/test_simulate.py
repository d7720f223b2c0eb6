"""dask-rpm simulate: cost-model predictions checked against hand-computed cases."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from dask_rpm.bench.simulate import SimulateError, simulate, speeds_for
from dask_rpm.cli import main


def test_split_1d_two_equal_workers_by_hand():
    n, m, l, spw, lat, bw, rate = 10, 8, 2, 100, 1e-3, 1e6, 1e4
    ds = simulate(
        ns=[2],
        distribution="equal",
        shape=(n, m, l),
        samples_per_worker=spw,
        latency=lat,
        bandwidth=bw,
        unit_rate=rate,
        methods=["split-1d"],
        overhead=0.0,
        exchanges="paper",
    )
    s = 2 * spw
    compute = m * (s / 2) / rate  # each worker: all m units x half the samples
    horizontal = (
        2 * 1 * (lat + (n + l) * m * 8 / bw)
    )  # one band, C = 2 columns, no vertical exchange
    t = compute + horizontal
    assert ds["seconds_per_iteration"].sel({"method": "split-1d", "N": 2}).item() == pytest.approx(
        t, rel=1e-12
    )
    # gamma = (1/T) / sum_i 1/T_series(i), T_series(i) = m s / rate
    assert ds["gamma"].sel({"method": "split-1d", "N": 2}).item() == pytest.approx(
        (1 / t) / (2 * rate / (m * s)), rel=1e-12
    )


def test_free_communication_gives_gamma_one_for_srpm_on_one_column_per_worker():
    # latency 0 and huge bandwidth: SRPM's balanced rectangles have gamma -> 1
    ds = simulate(
        ns=[4],
        distribution="two:0.5,0.5",
        shape=(10, 64, 2),
        samples_per_worker=256,
        latency=0.0,
        bandwidth=1e30,
        unit_rate=1e5,
        overhead=0.0,
    )
    assert ds["gamma"].sel({"method": "srpm", "N": 4}).item() == pytest.approx(1.0, rel=0.02)
    # uniform ignores speeds: the half-speed workers take twice as long -> gamma = (2*1+2*0.5)/(4*... )
    # every worker gets m s / 4 units; slowest rate 0.5e5: T = m s / (4 * 0.5e5); gamma = m s / (T * 3e5) = 2/3
    assert ds["gamma"].sel({"method": "uniform", "N": 4}).item() == pytest.approx(2 / 3, rel=1e-9)


def test_speed_distributions():
    assert speeds_for("equal", 3).tolist() == [1, 1, 1]
    assert speeds_for("two:0.25,0.5", 8).tolist() == [0.5, 0.5] + [1.0] * 6
    u = speeds_for("uniform:0.25,1", 100, seed=1)
    assert (
        u.min() >= 0.25
        and u.max() <= 1
        and np.array_equal(u, speeds_for("uniform:0.25,1", 100, seed=1))
    )
    assert speeds_for("B", 9).tolist()[:4] == [0.5, 0.5, 0.5, 1.0]
    with pytest.raises(SimulateError, match="uniform:LO,HI"):
        speeds_for("uniform:1", 4)


def test_bad_input_is_rejected():
    with pytest.raises(SimulateError, match="positive"):
        simulate(ns=[0])
    with pytest.raises(SimulateError, match="method"):
        simulate(ns=[4], methods=["nope"])


def test_cli_writes_outputs_and_json(tmp_path, capsys):
    rc = main(["simulate", "--n", "4,16", "--distribution", "A", "--out", str(tmp_path), "--json"])
    assert rc == 0
    rows = json.loads(capsys.readouterr().out)
    assert {(r["method"], r["N"]) for r in rows} == {
        (m, n) for m in ("srpm-time", "srpm", "split-1d", "uniform") for n in (4, 16)
    }
    assert all(0 < r["gamma"] <= 1 and r["seconds_per_iteration"] > 0 for r in rows)
    for f in ("simulate.nc", "simulate.md", "simulate.png"):
        assert (tmp_path / f).stat().st_size > 0
    assert "SIMULATION" in (tmp_path / "simulate.md").read_text()


@pytest.mark.parametrize(
    "argv",
    [
        ["simulate", "--distribution", "uniform:2,1"],
        ["simulate", "--n", "a,b"],
        ["simulate", "--latency", "-1"],
        ["simulate", "--check", "/nonexistent/bench.nc"],
    ],
)
def test_cli_bad_input_exits_2(argv, capsys):
    assert main(argv) == 2
    assert "error" in capsys.readouterr().err


@pytest.mark.parametrize("exchanges", ["scalable", "engine"])
def test_srpm_time_is_never_predicted_slower_than_the_others(exchanges):
    ds = simulate(
        ns=[8, 32],
        distribution="two:0.5,0.05",
        shape=(203, 256, 26),
        samples_per_worker=512,
        latency=9e-4,
        bandwidth=1.3e9,
        unit_rate=1.25e7,
        exchanges=exchanges,
    )
    t = ds["seconds_per_iteration"]
    for n in (8, 32):
        best_other = min(
            t.sel({"method": m, "N": n}).item() for m in ("srpm", "split-1d", "uniform")
        )
        assert t.sel({"method": "srpm-time", "N": n}).item() <= best_other * (1 + 1e-9)
    assert ds.attrs["exchanges"] == exchanges


def test_bad_exchanges_and_overhead():
    with pytest.raises(SimulateError, match="exchanges='fast' is not one of"):
        simulate(ns=[4], exchanges="fast")
    with pytest.raises(SimulateError, match="overhead=-1.0"):
        simulate(ns=[4], overhead=-1.0)


def test_simulate_is_pure():
    """The cost-model simulation loads neither distributed nor torch (fresh interpreter)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    code = (
        "import sys, dask_rpm.bench.simulate; "
        "print(sorted(m for m in ('distributed', 'torch') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout


def test_cli_writes_no_file_unless_asked(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["simulate", "--n", "4", "--distribution", "A"]) == 0
    out = capsys.readouterr()
    assert out.out.startswith("SIMULATION (cost model, not measured)") and "| 4 |" in out.out
    assert "--out DIR also writes" in out.err
    assert os.listdir(tmp_path) == []  # nothing in the working directory
