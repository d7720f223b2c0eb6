"""The model as a list of parameters (dask_rpm.nn.layers): every hidden layer cut by the plan's rows,
the cost model of a deep network, and where a user gives several hidden layers (CLI, job files)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dask_rpm.cli import main
from dask_rpm.nn.data import DataError, hidden_sizes
from dask_rpm.nn.layers import Layers, layers_of, layers_of_params
from dask_rpm.nn.network import Network
from dask_rpm.plan.real_partition import PlanError
from dask_rpm.planners import make_plan, parse_network_shape


@pytest.mark.parametrize("hidden", [(7,), (7, 5), (12, 7, 9), (64, 16, 16, 40), (1024, 1024, 1024)])
@pytest.mark.parametrize("workers", [1, 3, 7])
def test_the_plan_rows_tile_every_layer_and_every_worker_holds_a_unit_of_each(hidden, workers):
    layers = Layers(5, hidden, 3)
    rng = np.random.default_rng(len(hidden) * 10 + workers)
    m = layers.m
    assert m == min(hidden)
    workers = min(workers, m)  # at most one worker per plan row
    cuts = [0, *sorted(rng.choice(np.arange(1, m), workers - 1, replace=False)), m]
    for k, width in enumerate(hidden):
        rows = [layers.layer_rows((a, b))[k] for a, b in zip(cuts[:-1], cuts[1:])]
        assert rows[0][0] == 0 and rows[-1][1] == width  # every unit of the layer once
        assert all(p[1] == q[0] for p, q in zip(rows[:-1], rows[1:]))
        assert all(b - a >= 1 for a, b in rows)  # no worker without a unit
        # a worker's share of each layer is its share of the plan rows, to within one unit
        for (a, b), (lo, hi) in zip(zip(cuts[:-1], cuts[1:]), rows):
            assert abs((hi - lo) - (b - a) * width / m) < 1.0 + 1e-12


def test_one_hidden_layer_is_the_paper_network():
    layers = Layers(203, (80,), 26)
    assert layers.names == ("W", "V") and layers.plan_shape == (203, 80, 26)
    assert layers.cost_shape == (203, 80, 26)
    assert layers.layer_rows((17, 43)) == ((17, 43),)
    deep = Layers(784, (1024, 512, 256), 10)
    assert deep.names == ("W1", "W2", "W3", "V") and deep.shape == (784, 1024, 512, 256, 10)


def test_take_put_and_join_are_inverse_for_every_parameter():
    layers = Layers(6, (9, 5, 7), 4)
    rng = np.random.default_rng(0)
    params = [rng.normal(size=s) for s in layers.full_shapes()]
    cuts = [0, 2, 3, 5]
    shards = [layers.take(params, (a, b)) for a, b in zip(cuts[:-1], cuts[1:])]
    for got, want in zip(layers.join(shards), params):
        np.testing.assert_array_equal(got, want)
    # a piece of a shard, addressed by plan rows and the shard's first plan row
    mid = shards[1]  # plan rows [2, 3)
    again = layers.zeros((2, 3), "float64")
    layers.put(again, layers.take(mid, (2, 3), origin=2), (2, 3), origin=2)
    for a, b in zip(again, mid):
        np.testing.assert_array_equal(a, b)
    assert layers.nbytes((0, layers.m), 8) == sum(p.nbytes for p in params)
    assert layers_of_params(params) == layers


def test_bias_units_and_columns_of_each_layer():
    net = Network(bias=True)
    rng = np.random.default_rng(1)
    weights = [rng.normal(size=s) for s in Layers(3, (4, 2), 2).full_shapes()]
    biases = [rng.normal(size=w.shape[0]) for w in weights]
    params = net.join_params(weights, biases)
    layers = layers_of_params(params)
    assert layers == Layers(4, (5, 3), 2)  # the bias input and one bias unit per layer
    back_w, back_b = net.split_params(params)
    for a, b in zip([*back_w, *back_b], [*weights, *biases]):
        np.testing.assert_array_equal(a, b)
    # the bias unit is each layer's last row: its weights are zero, its output held at 1
    assert all(np.all(p[-1] == 0) for p in params[:-1])
    assert layers.bias_rows((0, layers.m), True) == (4, 2)
    assert layers.bias_columns((0, layers.m), True) == [3, 4, 2]
    # a rectangle without the last rows holds no bias unit, and no bias column of V
    assert layers.bias_rows((0, 1), True) == (None, None)
    assert layers.bias_columns((0, 1), True)[-1] is None


def test_the_cost_model_counts_a_deep_networks_exchanges():
    deep = Layers(784, (1024, 1024, 1024), 10)
    n, m, l = deep.cost_shape  # noqa: E741
    # a column exchanges two hidden layers' activations besides the outputs; the columns
    # sum every weight
    assert (m, l) == (1024, 10 + 2048)
    assert (n + l) * m == sum(r * c for r, c in deep.full_shapes())
    abilities = [1, 2, 3, 4, 5, 6, 7, 8]
    shallow = make_plan(abilities, deep.plan_shape, 1024, method="srpm")
    cut = make_plan(abilities, deep.plan_shape, 1024, method="srpm", cost_shape=deep.cost_shape)
    # counting every layer's activations makes a column's exchange dearer: more, shorter columns
    assert cut.n_columns > shallow.n_columns
    assert cut.shape == deep.plan_shape and cut.cost_shape == deep.cost_shape
    # the plan keeps its cost shape through JSON, and a whole remap plans with it again
    from dask_rpm.drpm.remap import whole_remap
    from dask_rpm.plan.partition import Plan

    again = Plan.from_dict(json.loads(cut.to_json()))
    assert again.cost_shape == deep.cost_shape
    assert whole_remap(again, abilities).n_columns == cut.n_columns


def test_the_papers_worked_example_still_gives_two_columns_of_three_and_two():
    plan = make_plan([0.05, 0.10, 0.20, 0.30, 0.35], (203, 80, 26), 1024, method="srpm")
    assert sorted(len(c) for c in plan.columns) == [2, 3] and plan.cost_shape is None


def test_shapes_of_several_hidden_layers_are_parsed_and_bad_ones_refused():
    assert parse_network_shape("784-512-256-10") == (784, 512, 256, 10)
    assert layers_of((784, 512, 256, 10)) == Layers(784, (512, 256), 10)
    with pytest.raises(PlanError, match=r"m2=0 in '784-512-0-10' must be at least 1"):
        parse_network_shape("784-512-0-10")
    with pytest.raises(PlanError, match="got '784-10' \\(2 values\\)"):
        parse_network_shape("784-10")
    assert hidden_sizes(32) == (32,) and hidden_sizes([512, 256]) == (512, 256)
    for bad in ([], [512, 0], [512, 2.5], True, "many"):
        with pytest.raises(DataError, match="a list of them, one per hidden layer"):
            hidden_sizes(bad)


def test_dask_rpm_plan_shows_each_workers_rows_of_every_layer(capsys):
    args = ["plan", "--abilities", "1,2,3,4", "--shape", "784-512-256-10", "--samples", "1024"]
    assert main([*args, "--no-draw"]) == 0
    out = capsys.readouterr().out
    assert "rows of each hidden layer (784-512-256-10):" in out
    assert "  P4     [308, 512)  [154, 256)" in out
    assert main([*args, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    layer_rows = [r["layers"] for r in d["rectangles"]]
    assert sorted(rows[1] for rows in layer_rows)[-1] == [154, 256]
    assert all(len(rows) == 2 for rows in layer_rows)


def test_a_job_file_takes_a_list_of_hidden_layers(tmp_path):
    from dask_rpm.job.load import load_job
    from dask_rpm.job.spec import JobError
    from dask_rpm.nn.data import write_dataset

    rng = np.random.default_rng(0)
    write_dataset(tmp_path / "d.nc", rng.normal(size=(40, 5)), rng.uniform(size=(40, 3)))
    text = (
        "data: d.nc\nhidden: {}\niterations: 3\nlearning-rate: 0.01\noutput: r.nc\n"
        "workers: {{local: {{speeds: [1.0, 0.5]}}}}\n"
    )
    (tmp_path / "job.yaml").write_text(text.format("[8, 6]"))
    job = load_job(tmp_path / "job.yaml")
    assert job.training.hidden == (8, 6) and job.network == "5-8-6-3"
    (tmp_path / "job.yaml").write_text(text.format("[8, 0]"))
    with pytest.raises(
        JobError, match=r"hidden=\[8, 0\] is invalid.*Write e.g. hidden: \[512, 256\]"
    ):
        load_job(tmp_path / "job.yaml")
