"""The seed's CNN time model (dask_rpm.cost.cnn_model) against hand-computed figures, and its CLI mode.

Expected values are worked out here from the formulas of the seed's §4 (docs/method.md,
"The seed's CNN time model"), not taken from the implementation.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dask_rpm.cli import main
from dask_rpm.cost.cnn_model import (
    BATCHES,
    SCENARIOS,
    TABLE1,
    TABLE2,
    Layer,
    Machine,
    best_channel_split,
    channel_split,
    crossovers,
    data_parallel,
    hybrid_pipeline,
    iteration,
    sweep,
)

ROOT = Path(__file__).resolve().parents[1]
MS = 1e-3

# A two-layer toy: 1 TFLOP/s, 100 GB/s memory, 1 GB/s network.
TOY_MACHINE = Machine(flops=1e12, memory_bandwidth=1e11, network_bandwidth=1e9)
TOY = (
    Layer("c", "conv", flop=2e9, param_bytes=1e6, input_bytes=3e6, output_bytes=2e6),  # 2 ms
    Layer("f", "fc", flop=1e6, param_bytes=4e8, input_bytes=2e6, output_bytes=1e3),  # 4 ms
)


# -- Table 1 and Table 2 ----------------------------------------------------------------------


def test_table1_is_the_seeds_network():
    assert [layer.name for layer in TABLE1] == ["cv1", "cv2", "cv3", "cv4", "fc1"]
    assert [layer.kind for layer in TABLE1] == ["conv"] * 4 + ["fc"]
    flop = [layer.flop for layer in TABLE1]
    assert flop[0] == flop[1] == flop[2] == 7.40e9 and flop[3] == 3.70e9  # cv4: half
    total = sum(layer.param_bytes for layer in TABLE1)
    assert total == pytest.approx(426.62e6)
    assert TABLE1[-1].param_bytes / total == pytest.approx(0.97, abs=0.01)  # "97 %" in fc1
    # each layer's output is the next one's input
    for a, b in zip(TABLE1, TABLE1[1:]):
        assert a.output_bytes == b.input_bytes
    # the conv rows are fp32 weights of 3x3 filters: 64->128, 128->256, 256->512, 512->512
    for layer, (cin, cout) in zip(TABLE1, [(64, 128), (128, 256), (256, 512), (512, 512)]):
        assert layer.param_bytes == pytest.approx(cin * cout * 9 * 4, rel=0.02)  # as rounded
    assert TABLE1[0].input_bytes == pytest.approx(64 * 224 * 224 * 4, rel=0.01)
    assert TABLE2 == Machine(4e12, 400e9, 4e9)


def test_scenarios_have_the_seeds_set_sizes():
    assert {s.name: s.nodes for s in SCENARIOS} == {"data": 1, "hv1": 5, "hv2": 6, "hv3": 9}


# -- the formulas on a toy --------------------------------------------------------------------


def test_data_parallel_by_hand():
    b = data_parallel(3, TOY, TOY_MACHINE)
    assert b.t1 == pytest.approx(2 * 3 * (2 + 4) * MS)  # 2 N sum T_L
    assert b.t2 == pytest.approx((1e6 + 4e8) / 1e9)  # all parameters over the network
    assert b.t3 == pytest.approx(6 * MS)
    assert b.total == pytest.approx(0.036 + 0.401 + 0.006)


def test_hybrid_pipeline_by_hand():
    # fc split in 2: T = 2 ms and 4/2 = 2 ms; U = 2e6 B / 1 GB/s = 2 ms
    b = hybrid_pipeline(3, (1, 2), TOY, TOY_MACHINE)
    interval, latency = 2 * MS, (2 + 2 + 2) * MS
    assert b.t1 == pytest.approx(2 * (interval * (3 - 1) + latency))  # 20 ms
    assert b.t2 == pytest.approx(2e8 / 1e9)  # fc's half of its parameters is the largest share
    assert b.t3 == pytest.approx(2 * MS)
    whole = hybrid_pipeline(3, (1, 1), TOY, TOY_MACHINE)  # layer-wise only: fc is the bottleneck
    assert whole.t1 == pytest.approx(2 * (4 * MS * 2 + 8 * MS))
    assert whole.t2 == pytest.approx(0.4)


def test_channel_split_by_hand():
    b = channel_split(3, 2, TOY, TOY_MACHINE)
    compute = 2 * 3 * (1 + 2) * MS  # every layer halved
    moved = 3 * 0.5 * (2e6 + 1e3 + 2e6)  # all-gather of both outputs, reduce-scatter of fc's input
    assert b.t1 == pytest.approx(compute + moved / 1e9)
    assert b.t2 == pytest.approx(401e6 / 2 / 1e9)
    assert b.t3 == pytest.approx(3 * MS)
    assert channel_split(3, 1, TOY, TOY_MACHINE) == data_parallel(3, TOY, TOY_MACHINE)


def test_bad_arguments_are_rejected():
    with pytest.raises(ValueError, match="2 splits for 5 layers"):
        hybrid_pipeline(4, (1, 2))
    with pytest.raises(ValueError, match="whole number >= 1"):
        channel_split(4, 0)
    with pytest.raises(ValueError, match="> 0"):
        data_parallel(0)
    with pytest.raises(ValueError, match="batches must be"):
        sweep([1, -2])


# -- Table 1 on Table 2: the seed's scenarios ---------------------------------------------------

# per-sample layer times (ms): conv flop / 4 TFLOP/s, fc1 411 MB / 400 GB/s
T = np.array([1.85, 1.85, 1.85, 0.925, 1.0275]) * MS
U = np.array([6.42, 3.21, 1.60, 0.40]) * 1e6 / 4e9  # outputs of cv1..cv4 over 4 GB/s
PARAMS = 426.62e6


def _data(b: float) -> float:
    return 2 * b * T.sum() + PARAMS / 4e9 + T.sum()


def _hybrid(b: float, splits: list[int], max_param: float) -> float:
    t = T / np.array(splits)
    n = sum(splits) * b
    return 2 * (t.max() * (n - 1) + t.sum() + U.sum()) + max_param / 4e9 + t.max()


def test_the_seeds_scenarios_by_hand():
    for b in (1, 8, 256):
        assert iteration(SCENARIOS[0], b).total == pytest.approx(_data(b))
        assert iteration(SCENARIOS[1], b).total == pytest.approx(_hybrid(b, [1] * 5, 411e6))
        assert iteration(SCENARIOS[2], b).total == pytest.approx(
            _hybrid(b, [1, 1, 1, 1, 2], 205.5e6)
        )
        assert iteration(SCENARIOS[3], b).total == pytest.approx(
            _hybrid(b, [2, 2, 2, 1, 2], 205.5e6)
        )
    assert iteration(SCENARIOS[3], 1).local_batch == 9  # nine nodes: 9 x b samples per set


def test_fig10_orderings_the_model_gives():
    s = sweep(BATCHES)
    t = dict(zip(s.names, s.seconds))
    assert np.all(t["hv1"] > t["data"])  # the seed's first claim holds everywhere
    b = s.batches
    # the second holds only below the crossover: hv3 - data = 1.645 b - 49.47 ms
    assert np.all(t["hv3"][b <= 16] < t["data"][b <= 16])
    assert np.all(t["hv3"][b >= 32] > t["data"][b >= 32])
    ratio = t["hv3"] / t["data"]
    assert np.all(np.diff(ratio) > 0)  # hv3's lead is largest at the smallest batch per node
    found = {frozenset((c.below, c.above)): c for c in crossovers(1, 256)}

    def meet(f, g):  # where two affine functions of b are equal
        return (g(0) - f(0)) / ((f(1) - f(0)) - (g(1) - g(0)))

    hv3 = found[frozenset(("hv3", "data"))]  # 16.65 b + 64.69 ms against 15.005 b + 114.16 ms
    at = meet(_data, lambda b: _hybrid(b, [2, 2, 2, 1, 2], 205.5e6))
    assert hv3.below == "hv3" and hv3.batch == pytest.approx(at, rel=1e-9)
    assert at == pytest.approx(30.07, abs=0.01)
    hv2 = found[frozenset(("hv2", "data"))]  # 22.2 b + 69.32 ms
    at = meet(_data, lambda b: _hybrid(b, [1, 1, 1, 1, 2], 205.5e6))
    assert hv2.below == "hv2" and hv2.batch == pytest.approx(at, rel=1e-9)
    assert frozenset(("hv1", "data")) not in found


def test_rpm_plan():
    s = sweep(BATCHES)
    t = dict(zip(s.names, s.seconds))
    assert np.all(t["rpm"] <= t["data"] * (1 + 1e-12))  # k = 1 is data parallelism
    assert dict(zip(BATCHES, s.rpm_k.tolist()))[1] == 4 and s.rpm_k[-1] == 1
    # at b = 1, k = 4: compute 2 x 7.5025 ms, three quarters of 23.26 MB per sample for 4
    # samples at 4 GB/s, a quarter of the exchange and of the update
    moved = 4 * 0.75 * (11.634096e6 + 11.63e6) / 4e9
    expected = 2 * T.sum() + moved + PARAMS / 4 / 4e9 + T.sum() / 4
    k, b = best_channel_split(1)
    assert k == 4 and b.total == pytest.approx(expected)
    assert t["rpm"][0] < t["hv3"][0]  # at b = 1 the channel split beats the seed's best hybrid


def test_model_modules_are_pure():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    code = (
        "import sys, dask_rpm.cost.cnn_model, dask_rpm.bench.cnn_seed; "
        "print(sorted(m for m in ('distributed', 'torch', 'matplotlib') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout


# -- the command line ---------------------------------------------------------------------------


def test_cli_cnn_seed_writes_table_and_figure(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run(
        [sys.executable, "-m", "dask_rpm.cli", "simulate", "--cnn-seed", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("MODEL (seed §4, Table 1/2)")
    for b in BATCHES:
        assert f"\n| {b} | " in r.stdout
    assert "hv3 / data at b = 30.07" in r.stdout
    assert "NOT reproduced" in r.stdout  # hv3 against data above b = 30
    assert (tmp_path / "cnn_seed.md").read_text() == r.stdout[:-1]  # print adds a newline
    png = (tmp_path / "cnn_seed.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000


def test_cli_cnn_seed_json(capsys):
    assert main(["simulate", "--cnn-seed", "--batches", "1,64", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["label"] == "MODEL (seed §4, Table 1/2)"
    assert [r["batch_per_node"] for r in out["rows"]] == [1.0, 64.0]
    assert out["rows"][0]["hv3"] == pytest.approx(_hybrid(1, [2, 2, 2, 1, 2], 205.5e6))
    assert {(c["below"], c["above"]) for c in out["crossovers"]} >= {("hv3", "data")}


@pytest.mark.parametrize(
    "argv, message",
    [
        (["simulate", "--cnn-seed", "--n", "4"], "drop --n"),
        (["simulate", "--cnn-seed", "--distribution", "A"], "drop --distribution"),
        (["simulate", "--cnn-seed", "--batches", "0,4"], "numbers > 0"),
        (["simulate", "--cnn-seed", "--batches", "a"], "numbers > 0"),
        (["simulate", "--cnn-seed", "--batches", ""], "numbers > 0"),
        (["simulate", "--batches", "4"], "--batches goes with --cnn-seed"),
    ],
)
def test_cli_cnn_seed_bad_input_exits_2(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "error" in err and message in err and len(err.strip().splitlines()) == 1


def test_method_doc_table_is_the_models():
    """docs/method.md §12 shows the model's seconds per iteration and rpm's set sizes."""
    text = (ROOT / "docs" / "method.md").read_text(encoding="utf-8")
    section = text.split('<a id="cnn-seed-model"></a>', 1)[1]
    lines = section.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| b | data |"))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip("|").split("|")])
    s = sweep(BATCHES)
    assert [float(r[0]) for r in rows] == list(s.batches)
    for j, row in enumerate(rows):
        assert [float(v) for v in row[1:6]] == pytest.approx(s.seconds[:, j], abs=5e-5)
        assert int(row[6]) == s.rpm_k[j]
