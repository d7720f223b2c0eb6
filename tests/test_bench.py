"""dask-rpm bench: a real small run on an EMULATED local cluster, schema and metric checks.

Speed is not asserted here (benchmarks measure it); the checks are that every
number in the outputs comes from the run's own measured times.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import xarray as xr

from dask_rpm import bench
from dask_rpm.bench import ddp
from dask_rpm.cli import main
from dask_rpm.nn.layers import Layers

METHODS = ["srpm-assumed", "drpm", "split-1d", "ddp"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    mp = pytest.MonkeyPatch()
    # the DDP peer's skip path (torch absent) is what this small run exercises; the real peer is a slow test
    mp.setattr(ddp, "torch_available", lambda: (False, "torch is not installed (test)"))
    try:
        ds = bench.run_bench(
            workloads=["custom"],
            custom=(12, 8, 3, 192),
            conditions=["A"],
            ns=[2],
            methods=METHODS,
            iterations=6,
            series_iterations=1,
            quiet=True,
        )
    finally:
        mp.undo()
    paths = bench.write_outputs(ds, str(out))
    return ds, paths


def test_dataset_schema(run):
    ds, _ = run
    assert ds["method"].values.tolist() == METHODS
    assert ds.sizes["case"] == 1 and str(ds["case"].values[0]) == "custom/A/N=2"
    for var in (
        "seconds_per_iteration",
        "gamma",
        "ratio_to_drpm",
        "series_seconds",
        "iteration_time",
        "plan",
    ):
        assert var in ds
    assert "EMULATED" in ds.attrs["title"] and "EMULATED" in str(ds["emulation_label"].values[0])
    # the emulated truth is the profile of docs/method.md §8 with 0.63 -> 0.5; the first two values stay
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
        assert t == pytest.approx(float(np.nanmedian(it[3:])))  # steady state: second half
        g = float(ds["gamma"].values[0, k])
        assert g == pytest.approx((1 / t) / np.sum(1 / series))
        assert 0 < g <= 1.5
        assert float(ds["ratio_to_drpm"].values[0, k]) == pytest.approx(
            t / float(ds["seconds_per_iteration"].sel({"method": "drpm"}).values[0])
        )
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
    from dask_rpm.bench.simulate import check_against_bench

    _, paths = run
    rows = check_against_bench(paths["netcdf"])
    assert [r["method"] for r in rows] == ["split-1d"]
    assert all(r["predicted"] > 0 and math.isfinite(r["error"]) for r in rows)


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["bench", "--n", "9"], "from 1 to 8"),
        (["bench", "--n", "x"], "whole numbers"),
        (["bench", "--methods", "srpm,foo"], "is not one of"),
        (["bench", "--conditions", "C"], "condition 'C'"),
        (["bench", "--workloads", "custom"], "needs a shape"),
        (["bench", "--shape", "10-8-2"], "go together"),
        (["bench", "--iterations", "1"], "at least 2"),
        (["bench", "--dp-search", "best"], "invalid choice"),
    ],
)
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
    from dask_rpm.demo.train import demo_data

    x, d = demo_data(64, (6, 4, 2))
    res = bench.run_ddp(
        x, d, hidden=4, speeds=[1.0, 0.5], scale=0.5, iterations=3, learning_rate=0.01
    )
    assert len(res["times"]) == 3 and all(t > 0 for t in res["times"])
    # DDP's averaged gradient x world size is the batch sum: after 2 updates rank 0's local error
    # (its half of the samples) equals serial batch BP's weights applied to that half
    from dask_rpm import fit_serial
    from dask_rpm.nn.network import Network
    from dask_rpm.nn.recipe import forward

    W, V = fit_serial(x, d, hidden=4, iterations=2, learning_rate=0.01).params
    h = forward(x[:32], [W, V], Network())  # the paper's network: sigmoid hidden and outputs
    assert res["error"] == pytest.approx(0.5 * float(((h - d[:32]) ** 2).sum()), rel=1e-9)


@pytest.mark.slow
def test_ddp_peer_is_paced_on_the_same_work_model():
    """Each DDP rank lasts work / (rate x speed x scale), like a Dask worker's paced block."""
    pytest.importorskip("torch")
    from dask_rpm.demo.train import demo_data
    from dask_rpm.nn.kernels import block_work

    x, d = demo_data(64, (6, 4, 2))
    rows = 32  # two ranks, equal shares
    work = block_work("forward", rows, 4, 6, 2) + block_work("backward", rows, 4, 6, 2)
    rate = work / 0.2  # speed 1, scale 1: 0.2 s of forward + backward per iteration
    res = bench.run_ddp(
        x, d, hidden=4, speeds=[1.0, 0.5], scale=1.0, iterations=4, learning_rate=0.01, rate=rate
    )
    # the speed-0.5 rank needs 0.4 s and everyone waits for it at the all-reduce
    steady = sorted(res["times"][1:])
    assert 0.38 <= steady[len(steady) // 2] <= 0.8, res["times"]


# ------------------------------------------------------------ mini-batch workload (issue 11)
MINI_METHODS = ["drpm", "split-1d", "uniform"]
MINI_SHAPE = (12, 8, 3, 192)


@pytest.fixture(scope="module")
def mini(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench-mini")
    ds = bench.run_bench(
        workloads=["custom"],
        custom=MINI_SHAPE,
        conditions=["A"],
        ns=[2],
        methods=MINI_METHODS,
        iterations=8,
        series_iterations=1,
        batch_sizes=[32, 64],
        quiet=True,
    )
    return ds, bench.write_outputs(ds, str(out), plot=False)


@pytest.mark.slow
def test_minibatch_cases_and_dimension(mini):
    ds, paths = mini
    assert ds["case"].values.tolist() == ["custom/A/N=2/B=32", "custom/A/N=2/B=64"]
    assert ds["batch_size"].values.tolist() == [32, 64] and not ds["full_batch"].values.any()
    for var in ("seconds_per_iteration", "gamma", "series_seconds"):
        v = ds[var].values[:, :2] if var == "series_seconds" else ds[var].values
        assert np.all(np.isfinite(v)) and np.all(v > 0), var
    assert np.all(ds["iterations"].values == 8)
    # the phase profile is the engine's own history: every phase measured, none negative
    ph = ds["phase_seconds"].values
    assert ds["phase"].values.tolist() == [
        "forward",
        "vertical_wait",
        "backward",
        "horizontal",
        "modify",
    ]
    assert np.all(np.isfinite(ph)) and np.all(ph >= 0)
    back = xr.open_dataset(paths["netcdf"], engine="h5netcdf").load()
    assert back["batch_size"].values.tolist() == [32, 64]
    np.testing.assert_allclose(back["weights_vs_serial"].values, ds["weights_vs_serial"].values)
    table = open(paths["markdown"]).read()
    assert (
        "| custom B=32 | A | 2 | drpm |" in table and "| custom B=64 | A | 2 | uniform |" in table
    )
    assert "mini-batches of 32 (6 per epoch)" in table and "Engine phases" in table
    rows = bench.summary_rows(ds)
    assert sorted({r["batch_size"] for r in rows}) == [32, 64] and len(rows) == 6


@pytest.mark.slow
def test_simulate_check_predicts_the_iterations_of_a_minibatch_bench(mini):
    """simulate --check on a mini-batch bench: every row predicted from the batch's rectangles."""
    from dask_rpm.bench.simulate import check_against_bench

    _, paths = mini
    rows = check_against_bench(paths["netcdf"])
    assert sorted((r["case"], r["method"]) for r in rows) == [
        (f"custom/A/N=2/B={b}", m) for b in (32, 64) for m in ("split-1d", "uniform")
    ]
    for r in rows:
        assert r["predicted"] > 0 and r["measured"] > 0 and np.isfinite(r["error"])


@pytest.mark.slow
def test_minibatch_methods_train_the_serial_batches(mini):
    """Every method ends at fit_serial's weights with the same batch size, and the check can tell
    batch sizes apart (a different batch size gives weights far from the reference)."""
    ds, _ = mini
    assert np.all(ds["weights_vs_serial"].values <= 1e-10), ds["weights_vs_serial"].values
    from dask_rpm import fit_serial
    from dask_rpm.demo.train import demo_data

    n, m, l, s = MINI_SHAPE
    x, d = demo_data(s, (n, m, l), seed=0)
    case = bench.make_cases(["custom"], ["A"], [2], step_at=1, custom=MINI_SHAPE, batch_sizes=[32])[
        0
    ]
    lr = bench.bench_learning_rate(case)
    assert lr == 0.5 / (32 * m)
    W32, V32 = fit_serial(
        x, d, hidden=m, iterations=8, learning_rate=lr, seed=0, batch_size=32
    ).params
    W64, V64 = fit_serial(
        x, d, hidden=m, iterations=8, learning_rate=lr, seed=0, batch_size=64
    ).params
    Wf, Vf = fit_serial(x, d, hidden=m, iterations=8, learning_rate=lr, seed=0).params
    assert bench.weights_difference((W64, V64), (W32, V32)) > 1e-6
    assert bench.weights_difference((Wf, Vf), (W32, V32)) > 1e-6
    # the bench's reference is fit_serial at the case's batch size and learning rate
    ref = bench.serial_reference(case, x, d, 8, {})
    assert bench.weights_difference(ref, (W32, V32)) == 0.0


def test_minibatch_workload_definition():
    cases = bench.make_cases(["minibatch", "compute"], ["A"], [4, 8], step_at=1)
    assert [c.name for c in cases] == [
        "minibatch/A/N=4/B=256",
        "minibatch/A/N=8/B=256",
        "minibatch/A/N=4/B=1024",
        "minibatch/A/N=8/B=1024",
        "minibatch/A/N=4/B=4096",
        "minibatch/A/N=8/B=4096",
        "compute/A/N=4",
        "compute/A/N=8",
    ]
    mb = cases[0]
    assert mb.shape == (203, 1024, 26) and mb.samples == 16384 and mb.samples // 4096 >= 4
    assert bench.bench_learning_rate(mb) == 0.5 / (256 * 1024)
    assert bench.bench_learning_rate(cases[-1]) == 0.5 / (32768 * 1024)


# ------------------------------------------------------------ deep workload (several hidden layers)
DEEP_METHODS = ["drpm", "split-1d", "uniform"]
#: the deep workload shrunk to test size: three hidden layers of unequal widths, two batch sizes
DEEP_TINY = bench.Workload(12, (8, 6, 8), 3, 192, (32, 64))


@pytest.fixture(scope="module")
def deep(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench-deep")
    mp = pytest.MonkeyPatch()
    mp.setitem(bench.WORKLOADS, "deep", DEEP_TINY)
    try:
        ds = bench.run_bench(
            workloads=["deep"],
            conditions=["A"],
            ns=[2],
            methods=DEEP_METHODS,
            iterations=8,
            series_iterations=1,
            quiet=True,
        )
    finally:
        mp.undo()
    return ds, bench.write_outputs(ds, str(out), plot=False)


@pytest.mark.slow
def test_deep_workload_runs_end_to_end_equal_to_serial(deep):
    ds, paths = deep
    assert ds["case"].values.tolist() == ["deep/A/N=2/B=32", "deep/A/N=2/B=64"]
    assert ds["shape"].values.tolist() == ["12-8-6-8-3"] * 2
    for var in ("seconds_per_iteration", "gamma"):
        assert np.all(np.isfinite(ds[var].values)) and np.all(ds[var].values > 0), var
    assert np.all(ds["iterations"].values == 8)
    # every method ends at fit_serial's W_1, W_2, W_3, V (same batches, learning rate)
    assert np.all(ds["weights_vs_serial"].values <= 1e-10), ds["weights_vs_serial"].values
    # the uniform baseline's plan counts the deep network's exchanges
    plan = json.loads(str(ds["plan"].sel({"method": "uniform"}).values[0]))
    assert plan["cost_shape"] == list(Layers(12, (8, 6, 8), 3).cost_shape)
    table = open(paths["markdown"]).read()
    for b in (32, 64):
        for method in DEEP_METHODS:
            assert f"| deep B={b} | A | 2 | {method} |" in table
    assert "* deep/A/N=2/B=32 (12-8-6-8-3, s = 192)" in table
    rows = bench.summary_rows(ds)
    assert len(rows) == 6 and {r["workload"] for r in rows} == {"deep"}


def test_deep_workload_definition():
    cases = bench.make_cases(["deep"], ["A"], [4, 8], step_at=1)
    assert [c.name for c in cases][:2] == ["deep/A/N=4/B=256", "deep/A/N=8/B=256"]
    assert [c.batch_size for c in cases[::2]] == [256, 1024, 4096]
    c = cases[0]
    assert c.shape == (784, 1024, 1024, 1024, 10) and c.samples == 16384
    assert c.plan_shape == (784, 1024, 10) and c.cost_shape == c.layers.cost_shape
    assert bench.bench_learning_rate(c) == 0.5 / (256 * 1024)
    # one hidden layer: the plans count the paper's (n, m, l)
    assert bench.make_cases(["minibatch"], ["A"], [4], step_at=1)[0].cost_shape is None
    # custom takes several hidden layers: (n, m_1, ..., m_L, l, s)
    (cc,) = bench.make_cases(["custom"], ["A"], [2], step_at=1, custom=(12, 8, 6, 3, 192))
    assert cc.shape == (12, 8, 6, 3) and cc.samples == 192 and cc.batch_size is None


@pytest.mark.slow
def test_ddp_peer_trains_a_deep_network_like_fit_serial():
    """The deep DDP peer (stacked Linear + sigmoid) ends at fit_serial's W_1 .. W_L, V."""
    pytest.importorskip("torch")
    from dask_rpm import fit_serial
    from dask_rpm.demo.train import demo_data

    x, d = demo_data(96, (6, 4, 2))
    lr = 0.5 / 32
    res = bench.run_ddp(
        x,
        d,
        hidden=(5, 4, 3),
        speeds=[1.0, 0.5],
        scale=1.0,
        iterations=5,
        learning_rate=lr,
        batch_size=32,
    )
    assert [p.shape for p in res["params"]] == [(5, 6), (4, 5), (3, 4), (2, 3)]
    ref = fit_serial(x, d, hidden=(5, 4, 3), iterations=5, learning_rate=lr, seed=0, batch_size=32)
    assert bench.weights_difference(res["params"], ref.params) < 1e-12


def test_weights_difference():
    a = (np.array([[1.0, -2.0]]), np.array([[4.0]]))
    b = (np.array([[1.0, -2.5]]), np.array([[4.0]]))
    assert bench.weights_difference(a, a) == 0.0
    assert bench.weights_difference(b, a) == pytest.approx(0.5 / 4.0)
    assert math.isnan(bench.weights_difference(None, a))


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["bench", "--workloads", "minibatch", "--batch-sizes", "x"], "whole numbers of samples"),
        (["bench", "--workloads", "minibatch", "--batch-sizes", "0"], "batch size 0"),
        (
            ["bench", "--workloads", "minibatch", "--batch-sizes", "99999"],
            "larger than the minibatch workload's 16384",
        ),
        (["bench", "--workloads", "paper", "--batch-sizes", "256"], "add --workloads minibatch"),
        (["bench", "--workloads", "minibatch", "--batch-sizes", "256,256"], "repeat a value"),
        (
            ["bench", "--workloads", "deep", "--batch-sizes", "99999"],
            "larger than the deep workload's 16384",
        ),
        (["bench", "--workloads", "custom", "--shape", "12-8-x-3", "--samples", "9"], "shape"),
        (["bench", "--batch-sizes", ","], "is empty"),
    ],
)
def test_cli_bad_batch_sizes_exit_2(argv, needle, capsys, tmp_path):
    assert main([*argv, "--out", str(tmp_path / "o")]) == 2
    assert needle in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_ddp_peer_trains_the_same_minibatches():
    """DDP ranks take equal shares of dask_rpm's mini-batches: the final weights equal fit_serial's."""
    pytest.importorskip("torch")
    from dask_rpm import fit_serial
    from dask_rpm.demo.train import demo_data

    x, d = demo_data(96, (6, 4, 2))
    lr = 0.5 / 32
    res = bench.run_ddp(
        x,
        d,
        hidden=4,
        speeds=[1.0, 0.5, 1.0],
        scale=1.0,
        iterations=7,
        learning_rate=lr,
        batch_size=32,
    )  # 3 batches per epoch, a new shuffled order in epochs 1 and 2
    assert len(res["times"]) == 7 and all(t > 0 for t in res["times"])
    W, V = fit_serial(x, d, hidden=4, iterations=7, learning_rate=lr, seed=0, batch_size=32).params
    assert bench.weights_difference(res["params"], (W, V)) < 1e-12
    Wf, Vf = fit_serial(x, d, hidden=4, iterations=7, learning_rate=lr, seed=0).params
    assert bench.weights_difference(res["params"], (Wf, Vf)) > 1e-6


def test_progress_lines_estimate_the_time_left(capsys):
    # cases of N = 2 and 4 workers, two methods each: 3 steps per case, weighted by N
    cases = bench.make_cases(["custom"], ["A"], [2, 4], step_at=2, custom=(12, 8, 3, 192))
    progress = bench.Progress(cases, ["srpm-assumed", "drpm"], quiet=False)
    assert progress.steps == 6 and progress.total == 3 * 2 + 3 * 4
    progress.t0 -= 30.0  # as if the first step had taken 30 s
    line = progress.step(cases[0], "custom-A-2 T_series")
    # 2 of 18 weight units in 30 s: 16 units left at that rate = 240 s = 4.0 min
    assert "1/6 steps (11%)" in line and "30 s elapsed" in line and "about 4.0 min left" in line
    for case, what in [
        (cases[0], "a"),
        (cases[0], "b"),
        (cases[1], "c"),
        (cases[1], "d"),
        (cases[1], "e"),
    ]:
        line = progress.step(case, what)
    assert "6/6 steps (100%)" in line and "about 0 s left" in line and "[" + "#" * 24 + "]" in line
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 6 and all("steps (" in ln and "left" in ln for ln in err)


def _fresh(code: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )


@pytest.mark.parametrize("module", ["dask_rpm.bench", "dask_rpm.bench.profiles"])
def test_profiles_load_neither_distributed_nor_torch(module):
    # simulate (pure) reads the profiles: they must not bring the harness or the DDP peer along
    out = _fresh(
        f"import sys, {module}; print(sorted(m for m in ('distributed', 'torch') if m in sys.modules))"
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", f"{module} loads {out.stdout.strip()}"
