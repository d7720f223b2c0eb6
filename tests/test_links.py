"""EMULATED link classes (dask_rpm.emulation.links): placement, delays, planning, exactness.

Cluster tests run real local clusters. No assertion is on a duration except
that a transfer between EMULATED nodes took at least (nearly) its configured
added delay - a sleep never ends early, so that bound holds however busy the
machine is - and that one within a node stays far below a large delay.
"""

from __future__ import annotations

import asyncio
import importlib.util
import math
from pathlib import Path

import dask
import numpy as np
import pytest
from distributed import Client

import dask_rpm
from dask_rpm.comm import Interconnect, LinkClass, network_from_config
from dask_rpm.emulation import (
    LINKS_PLUGIN_NAME,
    EmulatedLinks,
    LinkEmulationPlugin,
    emulated_links,
    local_cluster,
)
from dask_rpm.probe import probe

pytestmark = pytest.mark.timeout(180)

_BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "links.py"


# ----------------------------------------------------------------- validation (no cluster)
@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(nodes=[0, 0, 1]), ["3 labels for 4 workers", "one label per worker"]),
        (dict(nodes="0011"), ["one label per worker", "'0011'"]),
        (dict(nodes=[0, 0, 1, 1], groups=["a", "b"]), ["2 labels for 4 workers"]),
        (dict(nodes=[0, 0, 1, 1], groups=["a", "b", "b", "b"]), ["node 0", "'a'", "'b'"]),
        (
            dict(nodes=[0, 0, 1, 1], links={"cross": (0.001, 1e9)}),
            ["'cross'", "host, group, across"],
        ),
        (
            dict(nodes=[0, 0, 1, 1], links={"across": (-0.001, 1e9)}),
            ["'across'", "latency", "-0.001"],
        ),
        (dict(nodes=[0, 0, 1, 1], links={"across": (0.001, 0)}), ["'across'", "bandwidth", "> 0"]),
        (
            dict(nodes=[0, 0, 1, 1], links={"group": (0.001,)}),
            ["'group'", "(latency seconds, bandwidth"],
        ),
        (dict(nodes=[0, 0, 1, 1], links={"group": {"lat": 1}}), ["'group'", "unknown keys"]),
        (dict(links={"across": (0.001, 1e9)}), ["need nodes="]),
        (dict(groups=[0, 0, 1, 1]), ["need nodes="]),
    ],
)
def test_bad_link_arguments_say_what_was_given_and_what_is_valid(kwargs, words):
    with pytest.raises(ValueError) as err:
        emulated_links(4, **kwargs)
    for w in words:
        assert w in str(err.value)


def test_bad_links_refused_by_local_cluster_before_any_worker_starts():
    with pytest.raises(ValueError, match="3 labels for 4 workers"):
        local_cluster([1.0] * 4, nodes=[0, 0, 1], dashboard_address=None)


def test_classes_defaults_from_config_and_overrides():
    links = emulated_links(4, nodes=["a", "a", "b", "b"], links={"across": (0.02, 1e9)})
    assert links.classes["across"] == LinkClass(0.02, 1e9)
    assert links.classes["host"] == LinkClass(0.0, math.inf)  # rpm.yaml: nothing added on a node
    with dask.config.set({"rpm.emulation.links.group": {"latency": 0.003, "bandwidth": 5e7}}):
        assert emulated_links(2, nodes=[0, 1], groups=[0, 0]).classes["group"] == LinkClass(
            0.003, 5e7
        )
    with dask.config.set({"rpm.emulation.nodes": [0, 1, 1]}):  # read at call time
        assert emulated_links(3).nodes == (0, 1, 1)
    assert emulated_links(3) is None  # default: one node, nothing delayed
    # None: that class adds nothing
    assert emulated_links(2, nodes=[0, 1], links={"across": None}).classes["across"] == LinkClass(
        0.0, math.inf
    )


def test_link_class_and_seconds_follow_the_cost_models_classes():
    links = emulated_links(
        5,
        nodes=[0, 0, 1, 2, 2],
        groups=["g", "g", "g", "h", "h"],
        links={"group": (0.001, 1e8), "across": (0.01, 1e7)},
    )
    net = Interconnect(classes={"x": LinkClass(0, 1)}, hosts=links.nodes, groups=links.groups)
    for i in range(5):
        for j in range(5):
            if i != j:
                assert links.link_class(i, j) == net.link_class(i, j)
    assert links.link_class(0, 1) == "host" and links.link_class(0, 2) == "group"
    assert links.link_class(0, 3) == "across"
    assert links.link_class(0, None) == "across"  # a worker outside the placement
    assert links.seconds("host", 10**6) == 0.0
    assert links.seconds("across", 10**6) == pytest.approx(0.01 + 0.1)
    # without groups every node is a group of its own: between nodes is "across"
    assert emulated_links(2, nodes=[0, 1]).link_class(0, 1) == "across"


def test_network_adds_the_emulated_delay_to_the_base_link():
    links = emulated_links(4, nodes=[0, 0, 1, 1], links={"across": (0.004, 1e8)})
    base = network_from_config(None)._replace(latency=1e-4, bandwidth=1e9)
    net = links.network(base)
    assert net.hosts == (0, 0, 1, 1) and net.groups == (0, 0, 1, 1)
    assert net.classes["host"] == LinkClass(1e-4, 1e9)
    assert net.classes["across"].latency == pytest.approx(4.1e-3)
    assert net.classes["across"].bandwidth == pytest.approx(1 / (1 / 1e9 + 1 / 1e8))
    assert net.link(0, 2) == net.classes["across"] and net.link(2, 3) == net.classes["host"]
    text = links.describe()
    assert text.startswith("EMULATED links (nodes 0,0,1,1)") and "across +4 ms" in text


def test_messages_to_one_peer_leave_in_order():
    """A small message queued after a large one to the same peer never overtakes it."""
    links = emulated_links(3, nodes=[0, 1, 0], links={"across": (0.0, 1e8)})
    plugin = LinkEmulationPlugin(links)
    plugin.index = 0
    plugin._peers = {"tcp://b": 1, "tcp://c": 2}  # b on another node, c on this one
    done: list[str] = []

    async def send(peer: str, nbytes: int, tag: str) -> None:
        await plugin.delay(peer, nbytes)
        done.append(tag)

    async def main() -> None:
        await asyncio.gather(
            send("tcp://b", 5_000_000, "b-big"),  # 50 ms
            send("tcp://b", 0, "b-small"),  # 0 ms, but after b-big
            send("tcp://c", 0, "c-small"),  # same node: not delayed, not held by b's queue
        )

    asyncio.run(main())
    assert done.index("b-big") < done.index("b-small")
    assert done.index("c-small") < done.index("b-big")
    assert plugin.sent["across"] == 2 and plugin.sent["host"] == 1
    assert plugin.sent["seconds"] == pytest.approx(0.05)
    assert plugin._tail == {}  # nothing left queued


def test_bytes_to_other_nodes_share_one_outgoing_link():
    """Two 50 ms messages to two peers on another node: the second one's bytes wait for the first's."""
    links = emulated_links(3, nodes=[0, 1, 1], links={"across": (0.0, 1e8)})
    plugin = LinkEmulationPlugin(links)
    plugin.index = 0
    plugin._peers = {"tcp://b": 1, "tcp://c": 2}

    async def main() -> float:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await asyncio.gather(plugin.delay("tcp://b", 5_000_000), plugin.delay("tcp://c", 5_000_000))
        return plugin._nic_free - t0

    # the link is busy for both messages' bytes one after another (0.1 s), not side by side
    # (0.05 s): bookkeeping of loop times, a lower bound that holds however busy the machine is
    assert asyncio.run(main()) >= 0.1 - 1e-9


def test_plugin_travels_to_worker_processes_without_runtime_state():
    import pickle

    links = emulated_links(2, nodes=[0, 1])
    p = pickle.loads(pickle.dumps(LinkEmulationPlugin(links)))
    assert p.links == links and p._peers == {} and p.index is None


# ----------------------------------------------------------------- planner (no cluster)
def _bench():
    spec = importlib.util.spec_from_file_location("links_bench", _BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_link_aware_plan_differs_from_link_blind_in_the_benchmark_case():
    """benchmarks/links.py's case: the aware plan keeps each column on one EMULATED node."""
    b = _bench()
    rates = b.work_rates(2.0e10, 1.6 / sum(b.SPEEDS), b.SPEEDS, b.SHAPE)
    links = emulated_links(len(b.SPEEDS), nodes=list(b.NODES), links={"across": b.ACROSS})
    aware_net, blind_net = links.network(None), network_from_config(None)
    blind, aware = b.plans(rates, aware_net, blind_net)
    assert blind.columns != aware.columns
    for col in aware.columns:  # no aware column spans two nodes
        assert len({b.NODES[w] for w in col}) == 1
    assert len(blind.columns) > len(aware.columns)  # blind: more columns, so more holders per band
    from dask_rpm.cost import predict_breakdown

    t_aware = predict_breakdown(aware, rates, network=aware_net)["total"]
    t_blind = predict_breakdown(blind, rates, network=aware_net)["total"]
    assert t_aware < t_blind


# ----------------------------------------------------------------- real clusters
def _sent(dask_worker):
    return dict(dask_worker.plugins[LINKS_PLUGIN_NAME].sent)


@pytest.mark.slow
def test_probe_sees_the_delay_between_nodes_and_not_within():
    delay = 0.2  # large against this machine's noise (a tiny loopback transfer: ~1 ms)
    with (
        local_cluster(
            [1.0] * 4,
            nodes=[0, 0, 1, 1],
            links={"across": (delay, math.inf)},
            dashboard_address=None,
        ) as cluster,
        Client(cluster) as client,
    ):
        assert "EMULATED links (nodes 0,0,1,1)" in cluster.emulation_label
        assert cluster.emulation_metadata["links"]["nodes"] == [0, 0, 1, 1]
        addresses = dask_rpm.ordered_workers(client.scheduler_info())
        assert addresses == cluster.worker_names()
        with dask.config.set({"rpm.probe.link-repeats": 1, "rpm.probe.link-pairs": 2}):
            ds = probe(client, shape=(9, 8, 3), samples=64, repeats=2, groups=list(cluster.nodes))
        # a sleep never ends early: every cross-node transfer took at least the delay
        assert ds.attrs["latency_across"] >= 0.95 * delay
        assert ds.attrs["latency_host"] < 0.5 * delay
        sent = client.run(_sent)
        assert sum(s["across"] for s in sent.values()) > 0
        assert sum(s["host"] for s in sent.values()) > 0
        for s in sent.values():  # only cross-node messages carry delay: exactly delay each
            assert s["seconds"] == pytest.approx(s["across"] * delay)

        async def unknown(dask_worker):
            p = dask_worker.plugins[LINKS_PLUGIN_NAME]
            return await p.delay("tcp://192.0.2.1:1", 0), p._peers["tcp://192.0.2.1:1"]

        # an address that is no worker of the placement: across (the slowest class)
        assert client.run(unknown, workers=[addresses[0]])[addresses[0]] == (delay, None)


@pytest.mark.slow
def test_fit_with_emulated_links_equals_fit_serial():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(96, 7))
    x[:, -1] = 1.0
    d = rng.uniform(0.1, 0.9, size=(96, 3))
    W0, V0 = dask_rpm.fit_serial(x, d, hidden=10, iterations=6, learning_rate=1e-3).params
    with (
        local_cluster(
            [1.0, 0.5, 1.0, 0.5],
            nodes=["a", "a", "b", "b"],
            links={"across": (0.002, 5e7)},
            dashboard_address=None,
        ) as cluster,
        Client(cluster) as client,
    ):
        addresses = dask_rpm.ordered_workers(client.scheduler_info())
        # two columns that each span both nodes: vertical and horizontal messages cross
        plan = dask_rpm.make_plan([1.0, 0.5, 1.0, 0.5], (7, 10, 3), 96, method="srpm", dp=2)
        assert any(len({cluster.nodes[w] for w in col}) > 1 for col in plan.columns)
        r = dask_rpm.fit(
            x,
            d,
            hidden=10,
            iterations=6,
            learning_rate=1e-3,
            mapping=plan.with_workers(addresses),
            client=client,
            progress="none",
            elastic=False,
        )
        sent = client.run(_sent)
    np.testing.assert_allclose(r.params[0], W0, rtol=1e-10, atol=0)
    np.testing.assert_allclose(r.params[-1], V0, rtol=1e-10, atol=0)
    assert sum(s["across"] for s in sent.values()) > 0  # the engine's messages were delayed


def test_link_network_needs_nodes():
    c = EmulatedLinks((0, 1), (0, 1), emulated_links(2, nodes=[0, 1]).classes)
    assert c.network(None).classes["across"].latency > c.classes["across"].latency
    with pytest.raises(ValueError, match="no EMULATED links"):
        with local_cluster([1.0], processes=False, dashboard_address=None) as cluster:
            cluster.link_network()


def test_emulated_links_take_the_settings_their_caller_read():
    from dask_rpm.emulation.settings import EmulationSettings

    with dask.config.set(
        {"rpm.emulation.nodes": [0, 1], "rpm.emulation.links.across.latency": 0.5}
    ):
        settings = EmulationSettings.from_config()
    links = emulated_links(2, settings=settings)
    assert links is not None and links.nodes == (0, 1)
    assert links.classes["across"].latency == 0.5
    assert emulated_links(2) is None  # read now: one node, nothing delayed
