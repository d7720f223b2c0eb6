"""A CNN's costs, plans and probe: the seed's Table 1 per layer, the planners' choice between
channel splits and data parallelism, and a probe timed on the CNN's own kernels.

* :meth:`ConvLayers.layer_costs` reproduces the seed's Table 1 (its conv rows) from the network
  alone, and the communication model's ``cost_shape`` counts the same activations and weights;
* SRPM and ``srpm-time`` (on ``rpm.cost.*``, this machine's defaults) cut every column into
  channel slices when an iteration has few samples and the weights are heavy, and go data
  parallel when it has many: the seed's trade of the weight exchange (falling as ``1/k``)
  against the all-gathers of activations (growing with the samples);
* ``srpm-time`` without measured rates prices a CNN's rows by its flop (a LeNet row x sample
  is ~1,000 times an MLP's), and so keeps every worker where compute dominates;
* the probe times each worker on the CNN's own kernels at the share of channels it will
  train, in work units (plan rows x samples) per second, and recovers EMULATED speed ratios;
* ``fit`` plans a CNN of one conv stage with its ``cost_shape``.

Tiny networks; no torch needed (the numpy kernels run where torch is missing).
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from distributed import Client

import dask_rpm
from dask_rpm.cost import cnn_model
from dask_rpm.nn.cnn import LayerCost, cnn_work
from dask_rpm.nn.cnn_records import conv_layers
from dask_rpm.nn.kernels import block_work, kernel_pass
from dask_rpm.planners import make_plan
from dask_rpm.planners.settings import RATE_UNIT_WORK
from dask_rpm.probe import probe
from dask_rpm.probe.driver import conv_share
from dask_rpm.probe.kernel import conv_block_data, conv_pass, conv_units

#: the seed's simplified VGG16 (Table 1): four 3x3 conv layers, each pooled, and fc1
VGG = (
    [
        *(
            x
            for c in (128, 256, 512, 512)
            for x in ({"conv": c, "kernel": 3, "padding": 1}, "relu", {"maxpool": 2})
        ),
        "flatten",
        {"linear": 4096},
    ],
    (64, 224, 224),
)
#: LeNet on 28x28: light weights, activations of ~1,600 values per sample to gather
LENET = (
    [
        {"conv": 6, "kernel": 5, "padding": 2},
        "relu",
        {"maxpool": 2},
        {"conv": 16, "kernel": 5},
        "relu",
        {"maxpool": 2},
        "flatten",
        {"linear": 120},
        "relu",
        {"linear": 10},
    ],
    (1, 28, 28),
)
#: heavy weights: a 512-unit dense stage on 8,192 features (4.2 M weights)
HEAVY = (
    [
        {"conv": 32, "kernel": 3, "padding": 1},
        "relu",
        {"maxpool": 2},
        "flatten",
        {"linear": 512},
        "relu",
        {"linear": 10},
    ],
    (3, 32, 32),
)
#: small enough for the probe's EMULATED runs
SMALL = (
    [
        {"conv": 8, "kernel": 3, "padding": 1},
        "relu",
        {"maxpool": 2},
        {"conv": 8, "kernel": 3, "padding": 1},
        "relu",
        "flatten",
        {"linear": 16},
        "relu",
        {"linear": 4},
    ],
    (1, 12, 12),
)


def _layers(net):
    return conv_layers(*net)


# ---------------------------------------------------------------- Table 1


def test_layer_costs_reproduce_the_seeds_table_1():
    costs = _layers(VGG).layer_costs(itemsize=4)  # the seed counts 4-byte values
    assert [c.name for c in costs] == ["stage 1", "stage 2", "stage 3", "stage 4", "output"]
    assert LayerCost._fields == cnn_model.Layer._fields  # the seed model takes the list
    for ours, seed in zip(costs[:4], cnn_model.TABLE1[:4]):
        assert ours.kind == seed.kind == "conv"
        for f in ("flop", "param_bytes", "input_bytes", "output_bytes"):
            # the seed prints 2-3 significant figures (cv1's 0.29 MB: 0.2954 with its biases)
            assert getattr(ours, f) == pytest.approx(getattr(seed, f), rel=0.02), (ours.name, f)
    out = costs[-1]
    # fc1 as the network holds it: 100,352 x 4,096 weights and biases (the seed prints the count
    # of weights under "bytes" and half the flop; docs/method.md §12's reading notes)
    assert out.kind == "fc" and out.input_bytes == 512 * 14 * 14 * 4
    assert out.param_bytes == (100_352 * 4096 + 4096) * 4 and out.flop == 2.0 * 100_352 * 4096
    # the seed's model runs on the network's own table: data parallel, one sample per node
    ours = cnn_model.data_parallel(1, [cnn_model.Layer(*c) for c in costs[:4]])
    seed = cnn_model.data_parallel(1, cnn_model.TABLE1[:4])
    assert ours.total == pytest.approx(seed.total, rel=0.01)


def test_cost_shape_counts_the_tables_activations_and_weights():
    for net in (LENET, HEAVY, SMALL):
        layers = _layers(net)
        costs = layers.layer_costs(itemsize=1)  # bytes = elements
        n_eff, m, l_eff = layers.cost_shape
        # the column gathers every stage's output but the last's, and sums the partial products
        assert l_eff == layers.l + sum(c.output_bytes for c in costs[:-2])
        # the columns sum every weight: the table's, plus the planner's bias channel's rows
        last = layers.stages[-1]
        bias_channel = (last.fan_in + (1 if last.bias else 0) + layers.l * last.positions) * (
            last.units - last.channels
        ) - (layers.l if layers.out_bias else 0)  # the output bias rides in V's bias channel
        weights = sum(c.param_bytes for c in costs) + bias_channel
        assert sum(int(np.prod(s)) for s in layers.full_shapes()) == weights
        if weights >= l_eff * m:  # else cost_shape clamps n' at 1 (see the report in the docs)
            assert abs((n_eff + l_eff) * m - weights) <= m / 2


def test_unit_work_is_one_plan_row_of_the_paced_work():
    layers = _layers(LENET)
    whole = sum(
        cnn_work(kind, k, 7, layers.hidden, layers)
        for k in range(layers.depth)
        for kind in ("forward", "backward")
    )
    assert layers.unit_work() == pytest.approx(whole / 7 / layers.m)
    # rpm.planner.rate's work unit: one hidden unit x sample of the n-l = 203-26 MLP
    assert RATE_UNIT_WORK == block_work("forward", 1, 1, 203, 26) + block_work(
        "backward", 1, 1, 203, 26
    )
    assert layers.unit_work() > 100 * RATE_UNIT_WORK


# ---------------------------------------------------------------- planners


def _columns(plan) -> list[int]:
    return [len(col) for col in plan.columns]


@pytest.mark.parametrize("method", ["srpm", "srpm-time"])
@pytest.mark.parametrize(
    "net,samples,want",
    [
        (HEAVY, 8, [4]),  # heavy weights, few samples: one column cut into channel slices
        (HEAVY, 64, [4]),
        (HEAVY, 4096, [1, 1, 1, 1]),  # many samples: data parallel
        (LENET, 4096, [1, 1, 1, 1]),
    ],
    ids=["heavy-8", "heavy-64", "heavy-4096", "lenet-4096"],
)
def test_planners_split_channels_for_few_samples_and_go_data_parallel_for_many(
    method, net, samples, want
):
    plan = make_plan([1.0] * 4, _layers(net), samples, method)
    assert _columns(plan) == want and not plan.excluded, plan.notes


@pytest.mark.parametrize("method", ["srpm", "srpm-time"])
def test_columns_grow_with_the_samples(method):
    """Between the two ends the columns shorten as the samples grow, and a network with
    heavier weights per gathered activation keeps its columns tall to more samples."""
    counts = {}
    for name, net in (("heavy", HEAVY), ("lenet", LENET)):
        counts[name] = [
            make_plan([1.0] * 4, _layers(net), s, method).n_columns for s in (8, 64, 512, 4096)
        ]
        assert counts[name] == sorted(counts[name]), counts
    assert all(h <= le for h, le in zip(counts["heavy"], counts["lenet"])), counts
    assert counts["heavy"][1] == 1 < counts["lenet"][1]  # 64 samples: only heavy stays one column


def test_srpm_time_prices_a_cnns_rows_by_its_flop():
    layers = _layers(LENET)
    plan = make_plan([1.0] * 4, layers, 4096, "srpm-time")
    assert len(plan.planned_workers) == 4 and not plan.excluded
    # taken at an MLP's rate per row, the compute looks ~1,000 times cheaper than it is and
    # srpm-time keeps one worker: what rpm.planner.rate alone did for a CNN
    mlp_rate = float(dask_rpm.config.get("planner.rate"))
    wrong = make_plan([1.0] * 4, layers, 4096, "srpm-time", rates=[mlp_rate] * 4)
    assert len(wrong.planned_workers) == 1


# ---------------------------------------------------------------- probe


def test_conv_share_is_a_column_of_the_plan_srpm_would_make():
    layers = _layers(HEAVY)
    assert conv_share(layers, 4, 8) == (8, 8)  # one column of 4: a quarter of the 32 channels
    assert conv_share(layers, 4, 4096) == (32, 1024)  # data parallel: every channel
    assert conv_units(layers, 8) == (8, 128)  # the same quarter of every stage (513 rows)


def test_conv_pass_runs_a_rectangle_that_holds_part_of_the_channels():
    layers = _layers(SMALL)
    full = conv_block_data(layers, layers.m, 6, "float64", 0)
    assert conv_pass(*full) == kernel_pass(*conv_block_data(layers, layers.m, 6, "float64", 0))
    part = conv_block_data(layers, 3, 6, "float64", 0)
    assert np.isfinite(conv_pass(*part))
    ws = part[0]
    assert ws.units == conv_units(layers, 3) and all(np.isfinite(g).all() for g in ws.grads)


def test_probe_times_a_cnn_on_its_share_and_recovers_emulated_speeds():
    """EMULATED 1 : 0.5 workers; the ratio within 10 %, as tests/test_probe.py asks of an MLP
    (a few tries: other load on the shared machine can spoil one)."""
    layers = _layers(SMALL)
    speeds = (1.0, 0.5)
    got = []
    with (
        dask_rpm.local_cluster(
            list(speeds), scale=0.1, processes=False, dashboard_address=None
        ) as cluster,
        Client(cluster) as client,
    ):
        for batch in (8, None, 8):
            ds = probe(client, shape=layers.plan_shape, samples=256, layers=layers, batch=batch)
            rows, _ = conv_share(layers, 2, 256 if batch is None else batch)
            assert ds.attrs["network"] == "cnn" and ds.attrs["block_hidden"] == rows
            assert ds.attrs["block_channels"] == ",".join(map(str, conv_units(layers, rows)))
            th = ds["throughput"].values
            # work units: plan rows x samples per second, what the planners and DRPM count
            assert np.allclose(
                ds["work"].values, ds["loops"].values * rows * ds.attrs["block_samples"]
            )
            got.append(float(th[0] / th[1]))
            if abs(got[-1] / 2.0 - 1.0) < 0.10:
                break
    assert abs(got[-1] / 2.0 - 1.0) < 0.10, (
        f"measured ratios {got} vs 2 (load average {os.getloadavg()[0]:.1f})"
    )


def test_fit_plans_a_one_stage_cnn_with_its_cost_shape_and_probes_it():
    layers = conv_layers([{"conv": 4, "kernel": 3}, "relu", "flatten", {"linear": 3}], (2, 6, 6))
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(32, 2, 6, 6)), rng.integers(0, 3, size=32)
    with (
        dask_rpm.local_cluster(
            [1.0, 0.5], scale=0.1, processes=False, dashboard_address=None
        ) as cluster,
        Client(cluster) as client,
    ):
        r = dask_rpm.fit(
            x,
            y,
            network=layers.spec(),
            loss="cross-entropy",
            iterations=2,
            mapping="srpm",
            abilities="probe",
            client=client,
            progress="none",
        )
    assert layers.depth == 1 and r.plan.cost_shape == layers.cost_shape
    assert r.probe.attrs["network"] == "cnn"
