"""dask-rpm bench: a real small run on an EMULATED local cluster, schema and metric checks.

Speed is not asserted here (benchmarks measure it); the checks are that every
number in the outputs comes from the run's own measured times.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import xarray as xr

from dask_rpm import bench
from dask_rpm.cli import main

METHODS = ["srpm-assumed", "drpm", "split-1d", "ddp"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    mp = pytest.MonkeyPatch()
    # the DDP peer's skip path (torch absent) is what this small run exercises; the real peer is a slow test
    mp.setattr(bench, "torch_available", lambda: (False, "torch is not installed (test)"))
    try:
        ds = bench.run_bench(workloads=["custom"], custom=(12, 8, 3, 192), conditions=["A"], ns=[2],
                             methods=METHODS, iterations=6, series_iterations=1, quiet=True)
    finally:
        mp.undo()
    paths = bench.write_outputs(ds, str(out))
    return ds, paths


def test_dataset_schema(run):
    ds, _ = run
    assert ds["method"].values.tolist() == METHODS
    assert ds.sizes["case"] == 1 and str(ds["case"].values[0]) == "custom/A/N=2"
    for var in ("seconds_per_iteration", "gamma", "ratio_to_drpm", "series_seconds", "iteration_time", "plan"):
        assert var in ds
    assert "EMULATED" in ds.attrs["title"] and "EMULATED" in str(ds["emulation_label"].values[0])
    # the emulated truth is the SPEC profile with 0.63 -> 0.5; the first two values stay
    assert ds["speed"].values[0, :2].tolist() == [0.25, 0.31]


def test_gamma_is_computed_from_measured_times(run):
    ds, _ = run
    series = ds["series_seconds"].values[0, :2]
    assert np.all(np.isfinite(series)) and np.all(series > 0)
    for k, method in enumerate(METHODS):
        if method == "ddp":
            assert "torch is not installed" in str(ds["skipped"].values[0, k])
            continue
        t = float(ds["seconds_per_iteration"].values[0, k])
        it = ds["iteration_time"].values[0, k]
        assert t == pytest.approx(float(np.nanmedian(it[3:])))   # steady state: second half
        g = float(ds["gamma"].values[0, k])
        assert g == pytest.approx((1 / t) / np.sum(1 / series))
        assert 0 < g <= 1.5
        assert float(ds["ratio_to_drpm"].values[0, k]) == pytest.approx(t / float(ds["seconds_per_iteration"].sel({"method": "drpm"}).values[0]))
    plan = json.loads(str(ds["plan"].sel({"method": "split-1d"}).values[0]))
    assert plan["method"] == "split-1d" and len(plan["columns"]) == 2


def test_outputs_json_and_table(run, capsys):
    ds, paths = run
    back = xr.open_dataset(paths["netcdf"], engine="h5netcdf").load()
    np.testing.assert_allclose(back["gamma"].values, ds["gamma"].values)
    table = open(paths["markdown"]).read()
    assert table.startswith("**EMULATED heterogeneity")
    assert "| custom | A | 2 | drpm |" in table and "ddp skipped: torch is not installed" in table
    from PIL import Image

    with Image.open(paths["png"]) as im:
        assert im.format == "PNG" and im.size[0] > 400
    rows = bench.summary_rows(ds)
    assert [r["method"] for r in rows] == METHODS[:3]  # the skipped peer has no row
    for r in rows:
        assert {"method", "condition", "N", "gamma", "seconds_per_iteration"} <= set(r)
        assert r["condition"] == "A" and r["N"] == 2 and 0 < r["gamma"] <= 1.5
    json.dumps(rows)


def test_simulate_check_reads_the_bench_result(run):
    from dask_rpm.simulate import check_against_bench

    _, paths = run
    rows = check_against_bench(paths["netcdf"])
    assert [r["method"] for r in rows] == ["split-1d"]
    assert all(r["predicted"] > 0 and math.isfinite(r["error"]) for r in rows)


@pytest.mark.parametrize("argv, needle", [
    (["bench", "--n", "9"], "from 1 to 8"),
    (["bench", "--n", "x"], "whole numbers"),
    (["bench", "--methods", "srpm,foo"], "is not one of"),
    (["bench", "--conditions", "C"], "condition 'C'"),
    (["bench", "--workloads", "custom"], "needs a shape"),
    (["bench", "--shape", "10-8-2"], "go together"),
    (["bench", "--iterations", "1"], "at least 2"),
    (["bench", "--dp-search", "best"], "invalid choice"),
])
def test_cli_bad_input_exits_2(argv, needle, capsys):
    assert main(argv) == 2
    assert needle in capsys.readouterr().err


def test_gamma_helper():
    assert bench.gamma(1.0, [4.0, 4.0]) == pytest.approx(2.0)
    assert bench.gamma(2.0, [4.0, 4.0]) == pytest.approx(1.0)
    assert math.isnan(bench.gamma(float("nan"), [1.0]))


@pytest.mark.slow
def test_ddp_peer_runs_with_torch():
    pytest.importorskip("torch")
    from dask_rpm.train import demo_data

    x, d = demo_data(64, (6, 4, 2))
    res = bench.run_ddp(x, d, hidden=4, speeds=[1.0, 0.5], scale=0.5, iterations=3, learning_rate=0.01)
    assert len(res["times"]) == 3 and all(t > 0 for t in res["times"])
    # DDP's averaged gradient x world size is the batch sum: after 2 updates rank 0's local error
    # (its half of the samples) equals serial batch BP's weights applied to that half
    from dask_rpm import fit_serial
    from dask_rpm.kernels import sigmoid

    W, V, _ = fit_serial(x, d, hidden=4, iterations=2, learning_rate=0.01)
    h = sigmoid(sigmoid(x[:32] @ W.T) @ V.T)
    assert res["error"] == pytest.approx(0.5 * float(((h - d[:32]) ** 2).sum()), rel=1e-9)


@pytest.mark.slow
def test_ddp_peer_is_paced_on_the_same_work_model():
    """Each DDP rank lasts work / (rate x speed x scale), like a Dask worker's paced block."""
    pytest.importorskip("torch")
    from dask_rpm.kernels import block_work
    from dask_rpm.train import demo_data

    x, d = demo_data(64, (6, 4, 2))
    rows = 32  # two ranks, equal shares
    work = block_work("forward", rows, 4, 6, 2) + block_work("backward", rows, 4, 6, 2)
    rate = work / 0.2  # speed 1, scale 1: 0.2 s of forward + backward per iteration
    res = bench.run_ddp(x, d, hidden=4, speeds=[1.0, 0.5], scale=1.0, iterations=4, learning_rate=0.01, rate=rate)
    # the speed-0.5 rank needs 0.4 s and everyone waits for it at the all-reduce
    steady = sorted(res["times"][1:])
    assert 0.38 <= steady[len(steady) // 2] <= 0.8, res["times"]
