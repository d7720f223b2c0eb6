"""Cost models: the paper's element count and the seconds prediction."""

from __future__ import annotations

import dask.config
import numpy as np
import pytest

from dask_rpm.comm import Interconnect, LinkClass, collective_seconds, engine_horizontal
from dask_rpm.cost import (
    CostModel,
    fit_network,
    predict_breakdown,
    predict_iteration_seconds,
    t_comm,
    t_comm_model,
    t_comm_partition,
)
from dask_rpm.plan.partition import Plan, RealPartition
from dask_rpm.planners import make_plan

SHAPE = (203, 80, 26)
PAPER = dict(
    vertical="gather", horizontal="bands"
)  # the paper-style model the by-hand values below use


@pytest.fixture(autouse=True)
def _no_message_overhead():
    # the by-hand formulas count latency and bandwidth only
    with dask.config.set({"rpm.cost.overhead": 0.0}):
        yield


def test_t_comm_model_worked_example_values():
    # C=2 with k=(3, 2), widths 0.35 / 0.65 (docs/method.md §5)
    assert t_comm_model([0.35, 0.65], [3, 2], SHAPE, 1024) == pytest.approx(73913.6)
    assert t_comm_model([1.0], [5], SHAPE, 1024) == pytest.approx(212992.0)
    assert t_comm_model([0.05, 0.10, 0.20, 0.30, 0.35], [1] * 5, SHAPE, 1024) == pytest.approx(
        146560.0
    )
    # widths are normalised
    assert t_comm_model([35, 65], [3, 2], SHAPE, 1024) == pytest.approx(73913.6)


def test_t_comm_partition_ignores_row_cuts():
    a = RealPartition(((0, 1), (2,)), (0.5, 0.5), ((0.5, 0.5), (1.0,)))
    b = RealPartition(((0, 1), (2,)), (0.5, 0.5), ((0.1, 0.9), (1.0,)))
    assert t_comm_partition(a, SHAPE, 100) == t_comm_partition(b, SHAPE, 100)
    assert t_comm_partition(a, SHAPE, 100) == 2 * 26 * 100 * 0.5 + 2 * 229 * 80


def test_t_comm_of_integer_plan():
    plan = Plan.from_columns([[0, 1, 2], [3, 4]], [358, 666], [[11, 23, 46], [37, 43]], shape=SHAPE)
    expected = 2 * 26 * 1024 * (358 / 1024 * 2) + 2 * 229 * 80
    assert t_comm(plan) == pytest.approx(expected)
    assert plan.t_comm == pytest.approx(expected)  # filled in by from_columns


# --------------------------------------------------------------- seconds
def _two_columns() -> Plan:
    # column 0: samples [0, 60), workers 0 (hidden [0, 4)) and 1 ([4, 10));
    # column 1: samples [60, 100), worker 2 (all 10 hidden units).
    return Plan.from_columns([[0, 1], [2]], [60, 40], [[4, 6], [10]], shape=(5, 10, 3))


def test_single_worker_is_pure_compute():
    plan = Plan.from_columns([[0]], [100], [[10]], shape=(5, 10, 3))
    assert predict_iteration_seconds(
        plan, [500.0], latency=1e-3, bandwidth=1e6, itemsize=8
    ) == pytest.approx(2.0)


def test_breakdown_by_hand():
    plan = _two_columns()
    lat, bw, isz = 0.01, 1000.0, 4
    out = predict_breakdown(
        plan, [10.0, 20.0, 50.0], latency=lat, bandwidth=bw, itemsize=isz, **PAPER
    )
    # compute: areas 240, 360, 400
    assert out["compute"] == pytest.approx({0: 24.0, 1: 18.0, 2: 8.0})
    assert out["column_compute"] == pytest.approx([24.0, 8.0])
    # vertical: column 0 has k=2 -> 2 messages of l*s_c = 3*60 elements
    v0 = 2 * 1 * (lat + 3 * 60 * isz / bw)
    assert out["vertical"] == pytest.approx([v0, 0.0])
    # bands (0,4) and (4,10), each reduced+broadcast between C=2 holders
    assert out["bands"] == [(0, 4), (4, 10)]
    h = [2 * 1 * (lat + (5 + 3) * r * isz / bw) for r in (4, 6)]
    assert out["horizontal_by_band"] == pytest.approx(h)
    assert out["bottleneck_column"] == 0
    assert out["total"] == pytest.approx(24.0 + v0 + sum(h))
    assert (
        predict_iteration_seconds(
            plan, [10.0, 20.0, 50.0], latency=lat, bandwidth=bw, itemsize=isz, **PAPER
        )
        == out["total"]
    )


def test_more_bands_cost_more_latency():
    # Same columns and widths; row cuts aligned (2 bands) or not (4 bands).
    ab = (0.05, 0.10, 0.20, 0.30, 0.35)
    snapped = make_plan(ab, SHAPE, 1024, small_group=0.06)
    plain = make_plan(ab, SHAPE, 1024, small_group=0)
    speeds = [a * 1e6 for a in ab]
    kw = dict(bandwidth=1e12, itemsize=8, **PAPER)
    gap_hi = (
        predict_breakdown(plain, speeds, latency=1.0, **kw)["horizontal"]
        - predict_breakdown(snapped, speeds, latency=1.0, **kw)["horizontal"]
    )
    # one band fewer, 2 (C - 1) = 2 messages of 1 s each saved
    assert gap_hi == pytest.approx(2.0, rel=1e-6)


def test_balanced_plan_beats_uniform_on_heterogeneous_workers():
    ab = [1, 1, 4, 4]
    speeds = [a * 1e5 for a in ab]
    srpm = make_plan(ab, SHAPE, 1024, "srpm", small_group=0)
    flat = make_plan(ab, SHAPE, 1024, "uniform", dp=srpm.n_columns)
    assert predict_iteration_seconds(srpm, speeds) < predict_iteration_seconds(flat, speeds)


def test_defaults_come_from_config():
    plan = _two_columns()
    speeds = [10.0, 20.0, 50.0]
    with dask.config.set(
        {
            "rpm.cost.latency": 0.0,
            "rpm.cost.bandwidth": 1e30,
            "rpm.cost.vertical": "gather",
            "rpm.cost.horizontal": "bands",
        }
    ):
        assert predict_iteration_seconds(plan, speeds) == pytest.approx(24.0)
    with dask.config.set(
        {
            "rpm.cost.latency": 1.0,
            "rpm.cost.bandwidth": 1e30,
            "rpm.cost.vertical": "gather",
            "rpm.cost.horizontal": "bands",
        }
    ):
        # vertical 2 messages in column 0, horizontal 2 bands x 2 messages
        assert predict_iteration_seconds(plan, speeds) == pytest.approx(24.0 + 2 + 4)


def test_a_cost_model_read_once_prices_later_predictions():
    plan = _two_columns()
    speeds = [10.0, 20.0, 50.0]
    paper = {"rpm.cost.bandwidth": 1e30, "rpm.cost.vertical": "gather"}
    with dask.config.set({**paper, "rpm.cost.latency": 1.0, "rpm.cost.horizontal": "bands"}):
        model = CostModel.from_config()
        by_config = predict_iteration_seconds(plan, speeds)
    assert model.vertical == "gather" and model.rule is None  # no "engine" mode: no rule read
    # the record read inside the block prices outside it, as the keywords did inside
    assert predict_iteration_seconds(plan, speeds, model=model) == by_config == 24.0 + 2 + 4
    assert predict_iteration_seconds(plan, speeds) != by_config
    assert CostModel.from_config(vertical="engine").rule is not None
    with pytest.raises(TypeError, match="not both"):
        predict_breakdown(plan, speeds, model=model, latency=0.0)
    with pytest.raises(ValueError, match="horizontal='nope'"):
        predict_breakdown(plan, speeds, model=model._replace(horizontal="nope"))


def test_speeds_by_mapping_and_names():
    plan = _two_columns().with_workers(["a", "b", "c"])
    by_index = predict_iteration_seconds(plan, [10.0, 20.0, 50.0])
    assert predict_iteration_seconds(plan, {0: 10.0, 1: 20.0, 2: 50.0}) == by_index
    assert predict_iteration_seconds(plan, {"a": 10.0, "b": 20.0, "c": 50.0}) == by_index


def test_excluded_workers_need_no_speed_value():
    plan = make_plan([1.0, 1.0, 0.001, 1.0], (10, 20, 2), 1000)
    assert plan.excluded == (2,)
    t = predict_iteration_seconds(plan, [1e4, 1e4, float("nan"), 1e4])
    assert t > 0


@pytest.mark.parametrize(
    "speeds,kw,match",
    [
        ([1.0, 2.0], {}, "2 speeds given for a plan of 3 workers"),
        ([1.0, 0.0, 1.0], {}, "speed of P2 is 0.0"),
        ([1.0, -1.0, 1.0], {}, "speed of P2 is -1.0"),
        ({0: 1.0, 1: 1.0}, {}, "no speed given for planned worker P3"),
        ([1.0, 1.0, 1.0], {"latency": -1.0}, "latency=-1.0"),
        ([1.0, 1.0, 1.0], {"bandwidth": 0.0}, "bandwidth=0.0"),
        ([1.0, 1.0, 1.0], {"itemsize": 0}, "itemsize=0"),
    ],
)
def test_bad_inputs(speeds, kw, match):
    with pytest.raises(ValueError, match=match):
        predict_iteration_seconds(_two_columns(), speeds, **kw)


# ------------------------------------------------------- the engine's exchanges
def test_engine_exchanges_by_hand():
    # column 0 (workers 0, 1) allgathers its partials; every worker sends its rows to each overlapping
    # worker of the other column: 0 -> 2 (rows 0-4), 1 -> 2 (4-10), 2 -> 0 and 2 -> 1.
    plan = _two_columns()
    net = Interconnect(latency=0.01, bandwidth=1000.0, overhead=0.001, itemsize=4)
    out = predict_breakdown(
        plan, [10.0, 20.0, 50.0], network=net, vertical="engine", horizontal="engine"
    )
    assert out["vertical_algorithm"] == ["allgather", "none"]
    # one round: each member sends and receives one message of l * s_c = 3 * 60 elements
    v0 = 0.01 + 2 * 0.001 + 3 * 60 * 4 / 1000.0
    assert out["vertical"] == pytest.approx([v0, 0.0])
    # worker 2 sends 2 and receives 2 messages, 10 rows x (n + l) = 8 elements each way
    h = 0.01 + 4 * 0.001 + 10 * 8 * 4 / 1000.0
    assert out["horizontal"] == pytest.approx(h)
    assert out["total"] == pytest.approx(24.0 + v0 + h)


def test_leader_vertical_is_two_rounds_through_the_fastest_member():
    plan = Plan.from_columns(
        [[0, 1, 2, 3, 4]], [10], [[2, 2, 2, 2, 2]], shape=(5, 10, 3), abilities=[1, 1, 5, 1, 1]
    )
    net = Interconnect(latency=0.5, bandwidth=1e30, overhead=0.0)
    with dask.config.set({"rpm.engine.vertical": "leader", "rpm.engine.allgather-max": 4}):
        out = predict_breakdown(
            plan, [1.0] * 5, network=net, vertical="engine", horizontal="engine"
        )
    assert out["vertical_algorithm"] == ["leader"]
    assert out["vertical"] == pytest.approx([1.0])  # two rounds of one latency
    with dask.config.set({"rpm.engine.allgather-max": 8}):
        out = predict_breakdown(
            plan, [1.0] * 5, network=net, vertical="engine", horizontal="engine"
        )
    assert out["vertical_algorithm"] == ["allgather"] and out["vertical"] == pytest.approx([0.5])


def test_engine_auto_is_one_hop_up_to_allgather_max_then_the_cheapest_by_rpm_cost():
    """The model charges what the engine runs: its choice is made with rpm.cost.* (what the
    engine knows), whatever network the prediction is priced at."""
    plan = Plan.from_columns(
        [[0, 1, 2, 3, 4, 5]], [400], [[2] * 6], shape=(5, 12, 30), abilities=[1] * 6
    )
    priced = Interconnect(latency=1e-3, bandwidth=1e9, overhead=0.0)

    def chosen(**cost):
        cfg = {f"rpm.cost.{k}": v for k, v in cost.items()}
        with dask.config.set({"rpm.engine.vertical": "auto", **cfg}):
            out = predict_breakdown(plan, [1.0] * 6, network=priced, vertical="engine")
        return out["vertical_algorithm"][0]

    # 6 members > allgather-max (4): the model decides; latency-bound -> still one hop (one
    # round); bandwidth-bound -> direct (each member sends 2 x 5/6 of the buffer, not 5 x)
    assert chosen(latency=1.0, bandwidth=1e12, overhead=1e-3) == "allgather"
    assert chosen(latency=1e-9, bandwidth=1e3, overhead=0.0) == "direct"
    assert chosen(latency=1e-3, bandwidth=1e12, overhead=1e-3) == "allgather"
    with dask.config.set({"rpm.engine.allgather-max": 6}):
        assert chosen(latency=1e-9, bandwidth=1e3, overhead=0.0) == "allgather"
    with dask.config.set({"rpm.engine.vertical": "nope"}):
        with pytest.raises(ValueError, match=r"rpm.engine.vertical='nope'; valid: auto, allgather"):
            predict_breakdown(plan, [1.0] * 6, network=priced, vertical="engine")


def test_one_host_shares_its_cores_and_bandwidth():
    plan = make_plan([1.0] * 8, (20, 64, 4), 800, "split-1d")
    free = Interconnect(latency=0.0, bandwidth=1e9, overhead=1e-3)
    shared = free._replace(hosts=("h",) * 8, host_cores=2.0)
    # pairwise: the one-hop messages (the engine's auto takes it up to rpm.engine.allgather-max columns)
    a = predict_breakdown(plan, [1e9] * 8, network=free, horizontal="pairwise")["horizontal"]
    b = predict_breakdown(plan, [1e9] * 8, network=shared, horizontal="pairwise")["horizontal"]
    assert a == pytest.approx(14 * 1e-3 + 7 * 64 * 24 * 8 / 1e9)  # 7 sends + 7 receives per worker
    assert b == pytest.approx(56 * 2 * 1e-3 / 2.0)  # 56 messages, both ends on the host, 2 cores
    assert b > a


def test_collective_modes_charge_the_band_groups_and_best_is_cheapest():
    plan = make_plan([0.05, 0.10, 0.20, 0.30, 0.35], SHAPE, 1024, small_group=0)
    net = Interconnect(latency=1e-4, bandwidth=1e8, overhead=1e-5)
    got = {
        h: predict_breakdown(plan, [1e6] * 5, network=net, vertical=v, horizontal=h)["total"]
        for v, h in [
            ("tree", "tree"),
            ("ring", "ring"),
            ("halving", "halving"),
            ("direct", "direct"),
            ("best", "best"),
        ]
    }
    assert got["best"] <= min(got.values()) + 1e-12
    out = predict_breakdown(plan, [1e6] * 5, network=net, vertical="best", horizontal="best")
    assert {g[2] for g in out["horizontal_groups"]} <= {"tree", "halving", "ring", "direct"}
    assert sum(g[1] for g in out["horizontal_groups"]) == 80  # every hidden row in one group


def test_link_classes_charge_each_message_by_its_link():
    plan = make_plan([1.0] * 4, (20, 64, 4), 800, "srpm", dp=2)
    fast, slow = LinkClass(1e-5, 1e10), LinkClass(1e-2, 1e7)
    classes = {"host": fast, "group": fast, "across": slow}
    together = Interconnect(
        classes=classes, groups=("a", "a", "b", "b")
    )  # columns (0, 1) and (2, 3) inside a group
    apart = Interconnect(classes=classes, groups=("a", "b", "a", "b"))
    assert together.link_class(0, 1) == "group" and together.link_class(0, 2) == "across"
    t1 = predict_breakdown(plan, [1e9] * 4, network=together, vertical="tree", horizontal="tree")
    t2 = predict_breakdown(plan, [1e9] * 4, network=apart, vertical="tree", horizontal="tree")
    assert t1["vertical"][0] < t2["vertical"][0]


def test_fit_network_recovers_the_parameters_of_synthetic_runs():
    truth = Interconnect(
        latency=2e-4,
        bandwidth=3e8,
        overhead=1e-4,
        host_bandwidth=5e8,
        fixed=1e-3,
        host_cores=2.0,
        duplex=False,
        reduce=2e-8,
        worker_cpu=1e-4,
    )
    # The one-hop exchanges: their explicit rounds charge the host terms (shared cores and
    # bandwidth) that the fit must recover; the per-group collectives do not model them.
    with dask.config.set({"rpm.engine.horizontal": "pairwise", "rpm.engine.vertical": "allgather"}):
        runs = []
        for n, shape, s, method in [
            (2, (8, 8, 1), 16, "split-1d"),
            (2, (8, 20000, 2), 16, "split-1d"),
            (8, (8, 8, 1), 64, "split-1d"),
            (8, (8, 2000, 2), 64, "split-1d"),
            (4, (4, 8, 8), 12800, "srpm"),
            (16, (8, 8, 1), 64, "split-1d"),
        ]:
            plan = make_plan([1.0] * n, shape, s, method, dp=1 if method == "srpm" else None)
            speeds = [1e9] * n
            t = predict_breakdown(
                plan,
                speeds,
                network=truth._replace(hosts=("h",) * n),
                vertical="engine",
                horizontal="engine",
            )["total"]
            runs.append((plan, speeds, t, "auto"))
        net = fit_network(runs, host_cores=2.0, duplex=False, rounds=200)
        for plan, speeds, t, _ in runs:
            got = predict_breakdown(
                plan,
                speeds,
                network=net._replace(hosts=("h",) * len(speeds)),
                vertical="engine",
                horizontal="engine",
            )["total"]
            assert got == pytest.approx(t, rel=0.05)


def test_bad_modes_and_network():
    with pytest.raises(ValueError, match="vertical='fast'; valid: engine"):
        predict_breakdown(_two_columns(), [1.0] * 3, vertical="fast")
    with pytest.raises(ValueError, match="horizontal='x'; valid: engine"):
        predict_breakdown(_two_columns(), [1.0] * 3, horizontal="x")
    with pytest.raises(ValueError, match="link class 'rack'"):
        predict_breakdown(
            _two_columns(), [1.0] * 3, network=Interconnect(classes={"rack": LinkClass(1, 1)})
        )
    with pytest.raises(ValueError, match="overhead=-1.0"):
        predict_breakdown(_two_columns(), [1.0] * 3, network=Interconnect(overhead=-1.0))
    with pytest.raises(ValueError, match="unknown exchange algorithm 'x'"):
        collective_seconds("x", 3, 10.0, LinkClass(1.0, 1.0))


def test_expected_max_normal_and_the_straggler_term():
    from dask_rpm.cost import expected_max_normal

    assert expected_max_normal(1) == 0.0
    assert expected_max_normal(2) == pytest.approx(1 / np.sqrt(np.pi), rel=1e-6)
    assert expected_max_normal(3) == pytest.approx(1.5 / np.sqrt(np.pi), rel=1e-6)
    rng = np.random.default_rng(0)
    assert expected_max_normal(16) == pytest.approx(
        rng.normal(size=(200000, 16)).max(axis=1).mean(), rel=0.01
    )
    plan = _two_columns()
    net = Interconnect(latency=0.0, bandwidth=1e30, overhead=0.0)
    base = predict_breakdown(plan, [10.0, 20.0, 50.0], network=net)
    noisy = predict_breakdown(plan, [10.0, 20.0, 50.0], network=net, spread=[0.3, 0.6, 0.0])
    assert base["straggler"] == 0.0
    assert noisy["straggler"] == pytest.approx(0.3 * expected_max_normal(3))
    assert noisy["total"] == pytest.approx(base["total"] + noisy["straggler"])
    with pytest.raises(ValueError, match="spread must be non-negative"):
        predict_breakdown(plan, [10.0, 20.0, 50.0], network=net, spread=[0.1, -1.0, 0.0])


def test_engine_horizontal_is_pairwise_or_a_schedule_per_group():
    link = LinkClass(1e-4, 1e9)
    # up to allgather-max columns, and for explicit "pairwise": the one-hop messages
    assert engine_horizontal("auto", 4, [1e6, 1e3], link, 1e-5, 4) is None
    assert engine_horizontal("pairwise", 64, [1e6], link, 1e-5, 4) is None
    # above it, the biggest group decides pairwise or not; then each group its own cheapest
    got = engine_horizontal("auto", 64, [8e6, 100.0], link, 1e-5, 4)
    assert got is not None and got[0] in ("ring", "halving", "direct") and got[1] == "tree"
    assert engine_horizontal("auto", 8, [100.0, 50.0], LinkClass(1e-2, 1e12), 0.0, 4) is None
    assert engine_horizontal("ring", 3, [10.0, 20.0], link, 1e-5, 4) == ["ring", "ring"]
    with pytest.raises(ValueError, match=r"rpm.engine.horizontal='rings'; valid: auto, pairwise"):
        engine_horizontal("rings", 3, [10.0], link, 1e-5, 4)


def test_scheduled_seconds_charge_the_shared_host_for_every_message():
    from dask_rpm.cost.predict import scheduled_seconds

    own = Interconnect(latency=1e-4, bandwidth=1e9, overhead=5e-5)
    holders = list(range(8))
    for alg in ("tree", "halving", "ring", "direct"):
        # on links of their own: the closed form
        assert scheduled_seconds(alg, holders, 10_000, own) == pytest.approx(
            collective_seconds(alg, 8, 80_000, LinkClass(1e-4, 1e9), 5e-5)
        )
    shared = own._replace(hosts=("h",) * 8, host_cores=2.0)
    t = {a: scheduled_seconds(a, holders, 100, shared) for a in ("tree", "ring", "direct")}
    # 8 workers on 2 cores: ring and direct send 2 x 8 x 7 = 112 messages, tree 14
    assert t["direct"] > t["tree"] and t["ring"] > t["tree"]
    assert t["direct"] > collective_seconds("direct", 8, 800, LinkClass(1e-4, 1e9), 5e-5)
