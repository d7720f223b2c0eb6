"""Plans for CNNs: ``make_plan`` on a :class:`~dask_rpm.nn.cnn.ConvLayers`, and ``dask-rpm plan --network``.

* a CNN is planned for its ``plan_shape`` (the narrowest stage's rows) and counted with its
  ``cost_shape``, and every stage of every worker gets a channel range that covers the stage;
* ``dp`` columns that cannot each hold a worker per channel leave the slowest workers idle, with a
  note, for every planner that takes ``dp`` (an MLP's plan still refuses it: the tests of
  tests/test_planners.py);
* the command line prints each worker's channels of every stage, ``--json`` includes them, and a
  bad network, image or spec file is one line and exit code 2.

Only the planner's pure functions run here (no cluster, no torch).
"""

from __future__ import annotations

import json

import pytest

from dask_rpm.cli import main
from dask_rpm.nn.cnn_records import conv_layers
from dask_rpm.plan.partition import PlanError
from dask_rpm.planners import make_plan

#: a conv stage of 4 channels with pooling, a dense stage of 6 units, the output layer of 3
SPEC = [
    {"conv": 4, "kernel": 3, "padding": 1},
    "relu",
    {"maxpool": 2},
    "flatten",
    {"linear": 6},
    "tanh",
    {"linear": 3},
]
IMAGE = (2, 8, 8)


def _layers(spec=SPEC, image=IMAGE):
    return conv_layers(spec, image)


def _covers(plan, layers) -> None:
    """In every column, the workers' channel ranges of every stage tile the stage exactly."""
    for col in plan.columns:
        for k, units in enumerate(layers.hidden):
            ranges = sorted(layers.layer_rows(plan.rectangle(w).hidden)[k] for w in col)
            assert ranges[0][0] == 0 and ranges[-1][1] == units
            assert all(a < b for a, b in ranges), ranges  # every worker at least one channel
            assert all(ranges[i][1] == ranges[i + 1][0] for i in range(len(ranges) - 1))


def test_a_cnn_is_planned_for_its_narrowest_stage_and_counted_with_its_exchanges():
    layers = _layers()
    assert layers.hidden == (4, 7) and layers.m == 4  # the dense stage's bias channel: 6 + 1
    plan = make_plan([1.0, 2.0, 3.0, 4.0], layers, 64, "srpm", dp=2)
    assert plan.shape == layers.plan_shape and plan.cost_shape == layers.cost_shape
    assert plan.n_columns == 2 and not plan.excluded
    _covers(plan, layers)
    # the same plan as the tuple form with the cost shape given by hand
    same = make_plan(
        [1.0, 2.0, 3.0, 4.0], layers.plan_shape, 64, "srpm", dp=2, cost_shape=layers.cost_shape
    )
    assert same.to_dict() == plan.to_dict()


def test_without_dp_the_planner_chooses_columns_that_fit_the_channels():
    layers = _layers([{"conv": 2, "kernel": 3}, "relu", "flatten", {"linear": 3}], (1, 8, 8))
    assert layers.m == 3  # 2 channels and the output bias channel
    plan = make_plan([1.0] * 7, layers, 64, "srpm")
    assert max(len(c) for c in plan.columns) <= layers.m and not plan.excluded
    _covers(plan, layers)


def test_cost_shape_is_the_networks_own():
    with pytest.raises(PlanError, match=r"cost_shape=\(1, 2, 3\) given with a CNN's ConvLayers"):
        make_plan([1.0, 1.0], _layers(), 64, "srpm", cost_shape=(1, 2, 3))


@pytest.mark.parametrize("method", ["srpm", "uniform", "grid-h", "grid-hrev", "srpm-time"])
def test_fewer_channels_than_a_columns_members_leaves_the_slowest_idle_with_a_note(method):
    layers = _layers()  # m = 4
    abilities = [1.0, 5.0, 2.0, 6.0, 3.0, 7.0, 4.0, 8.0, 0.5, 9.0]
    # dp=2 holds 8 of the 10 workers: the two slowest (P9 at 0.5, P1 at 1.0) stay idle
    plan = make_plan(abilities, layers, 64, method, dp=2)
    assert plan.excluded == (0, 8)
    assert sorted(w for c in plan.columns for w in c) == [1, 2, 3, 4, 5, 6, 7, 9]
    assert all(len(c) == 4 for c in plan.columns) and plan.n_columns == 2
    note = next(n for n in plan.notes if n.startswith("left P1, P9 idle"))
    assert "dp=2 columns hold at most 4 workers each" in note
    assert "stage 1: 4 rows" in note and "so 8 of the 10 workers" in note
    _covers(plan, layers)


def test_the_bias_channel_counts_and_ties_idle_the_later_worker():
    # the narrowest stage is the last: 2 units and the output bias channel
    layers = _layers([{"conv": 4, "kernel": 3}, "relu", "flatten", {"linear": 2}, {"linear": 3}])
    assert layers.hidden == (4, 3) and layers.m == 3
    plan = make_plan([1.0] * 4, layers, 64, "srpm", dp=1)
    assert plan.excluded == (3,)
    assert "(stage 2: 3 rows, its output bias channel included)" in plan.notes[-1]
    _covers(plan, layers)


def test_when_every_worker_fits_nothing_is_left_idle():
    layers = _layers()
    plan = make_plan([1.0] * 8, layers, 64, "uniform", dp=2)
    assert not plan.excluded and not any("idle" in n for n in plan.notes)


def test_an_mlp_with_too_few_hidden_units_for_dp_is_still_refused():
    with pytest.raises(PlanError, match=r"dp=1 columns would put more than m=2 workers"):
        make_plan([1.0] * 4, (10, 2, 3), 64, "srpm", dp=1)


# ---------------------------------------------------------------------------- the command line

NET = json.dumps(SPEC)
ARGS = ["plan", "--abilities", "1,2,3,4", "--samples", "64", "--dp", "2", "--image", "2,8,8"]


def _run(argv, capsys):
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_prints_each_workers_channels_of_every_stage(capsys):
    code, out, err = _run([*ARGS, "--network", NET, "--no-draw"], capsys)
    assert code == 0 and err == ""
    assert "n-m-l=128-4-3" in out
    assert "network on 2x8x8 images:" in out
    assert "stage 1: conv 2->4 k3 s1 p1 relu maxpool2 -> 4 x 4x4" in out
    assert "channels of each stage (stage 2's last row, 6, is the output bias channel):" in out
    plan = make_plan([1, 2, 3, 4], _layers(), 64, dp=2)
    layers = _layers()
    table = out.split("channels of each stage")[1].splitlines()
    assert table[1].split() == ["worker", "stage", "1", "stage", "2"]
    for col in plan.columns:
        for w in col:
            (a0, b0), (a1, b1) = layers.layer_rows(plan.rectangle(w).hidden)
            line = next(ln for ln in table if ln.startswith(f"  P{w + 1} "))
            assert line.split() == [f"P{w + 1}", f"[{a0},", f"{b0})", f"[{a1},", f"{b1})"]


def test_cli_json_has_the_channels_and_the_network(capsys):
    code, out, _ = _run([*ARGS, "--network", NET, "--json"], capsys)
    assert code == 0
    d = json.loads(out)
    layers = _layers()
    assert d["shape"] == list(layers.plan_shape)
    assert d["network"] == {
        "layers": layers.spec(),
        "image": [2, 8, 8],
        "stages": [4, 7],
        "cost_shape": list(layers.cost_shape),
    }
    for r in d["rectangles"]:
        assert r["channels"] == [list(v) for v in layers.layer_rows(tuple(r["hidden"]))]


def test_cli_reads_the_network_from_a_file_or_a_job_file(tmp_path, capsys):
    _, want, _ = _run([*ARGS, "--network", NET, "--json"], capsys)
    (tmp_path / "net.yaml").write_text(
        "- {conv: 4, kernel: 3, padding: 1}\n- relu\n- {maxpool: 2}\n"
        "- flatten\n- {linear: 6}\n- tanh\n- {linear: 3}\n"
    )
    (tmp_path / "job.yaml").write_text(f"data: x.nc\nnetwork: {NET}\n")
    for name in ("net.yaml", "job.yaml"):
        code, out, _ = _run([*ARGS, "--network", str(tmp_path / name), "--json"], capsys)
        assert code == 0 and json.loads(out) == json.loads(want)


def test_cli_note_says_which_workers_stay_idle(capsys):
    code, out, _ = _run(
        [
            "plan",
            "--abilities",
            "1,1,2,2,3",
            "--samples",
            "64",
            "--dp",
            "1",
            "--image",
            "1,8,8",
            "--network",
            '[{"conv": 3}, "relu", "flatten", {"linear": 2}]',
            "--no-draw",
        ],
        capsys,
    )
    assert code == 0
    assert (
        "excluded: P2" in out and "left P2 idle (the slowest): dp=1 columns hold at most 4" in out
    )


BAD = [
    (["--network", NET], "--network needs --image C,H,W"),
    (["--network", NET, "--image", "2,8"], "--image='2,8'; give three whole numbers >= 1"),
    (["--network", NET, "--image", "0,8,8"], "--image='0,8,8'; give three whole numbers >= 1"),
    (["--shape", "3-4-5", "--image", "2,8,8"], "--image describes a CNN's input"),
    (["--network", "[{conv: 4", "--image", "2,8,8"], "--network is not valid JSON or YAML"),
    (["--network", "{conv: 4}", "--image", "2,8,8"], "must be a non-empty list of layer records"),
    (["--network", "missing.yaml", "--image", "2,8,8"], "--network file 'missing.yaml' not found"),
    (
        ["--network", '[{"conv": 4, "kernel": 9}, "flatten", {"linear": 3}]', "--image", "2,8,8"],
        "--network: layer 0 (conv): kernel 9 (padding 0) does not fit maps of 8x8",
    ),
    (
        ["--network", '[{"conv": 4}, "flatten"]', "--image", "2,8,8"],
        "--network: the network must end with a Linear layer",
    ),
    (
        ["--network", '[{"conv": 4, "dilation": 2}, "flatten", {"linear": 3}]', "--image", "2,8,8"],
        "--network: layer 0 (conv) has unknown key(s) ['dilation']",
    ),
    (["--network", NET, "--shape", "3-4-5"], "not allowed with argument"),
]


@pytest.mark.parametrize("extra,message", BAD)
def test_cli_bad_network_is_one_line_and_exit_2(extra, message, capsys):
    argv = ["plan", "--abilities", "1,2", "--samples", "64", *extra]
    code, out, err = _run(argv, capsys)
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert message in lines[0], lines[0]
    assert lines[0].startswith("dask-rpm plan: error:")
