"""Buddy copies (issue 36): in-memory copies of every shard, so a lost worker costs a few iterations.

First the pure decisions of :mod:`dask_rpm.engine.buddies` (which buddy, how often, where a
recovery's rows come from) and the worker's store of :mod:`dask_rpm.engine.copies`, without a
cluster; then real LocalClusters of worker processes, one of them SIGKILLed mid-run
(``sigkill_after``): the loss costs at most ``R`` iterations plus those of a copy still in
flight, and the result equals ``fit_serial``'s.
"""

from __future__ import annotations

import asyncio
import os
import signal
from functools import partial

import dask.config
import numpy as np
import pytest
from distributed import Client, LocalCluster
from problems import regression_problem

from dask_rpm.engine import fit, ordered_workers
from dask_rpm.engine.buddies import (
    BuddyBook,
    Holding,
    ResilienceSettings,
    auto_every,
    choose_buddies,
    keep_from,
    pieces_for,
    restore_point,
    rows_source,
)
from dask_rpm.engine.callbacks import TrainingCallback
from dask_rpm.engine.copies import MAX_OWN, CopyKeeper
from dask_rpm.engine.records import CopyReport
from dask_rpm.nn.data import DataError
from dask_rpm.nn.layers import Layers
from dask_rpm.nn.serial import fit_serial
from dask_rpm.plan.partition import Plan

RTOL = 1e-10
_problem = partial(regression_problem, seed=1)


# ------------------------------------------------------------------------------ which buddy
def test_a_buddy_is_on_another_host_where_there_is_one():
    hosts = {"a1": "A", "a2": "A", "a3": "A", "b1": "B"}
    got = choose_buddies(["a1", "a2", "a3", "b1"], hosts)
    assert set(got) == set(hosts)
    assert got["b1"] in ("a1", "a2", "a3")
    for w in ("a1", "a2", "a3"):
        assert got[w] == "b1"  # the only other host
    # two hosts of two: every buddy across
    got = choose_buddies(["a1", "a2", "b1", "b2"], {"a1": "A", "a2": "A", "b1": "B", "b2": "B"})
    assert all(got[w][0] != w[0] for w in got)
    assert sorted(got.values()) == ["a1", "a2", "b1", "b2"]  # each keeps one copy


def test_one_host_gives_the_next_worker_and_one_worker_none():
    got = choose_buddies(["w0", "w1", "w2"], {"w0": "h", "w1": "h", "w2": "h"})
    assert got == {"w0": "w1", "w1": "w2", "w2": "w0"}
    assert all(got[w] != w for w in got)
    assert choose_buddies(["w0"], {"w0": "h"}) == {}
    assert choose_buddies([], {}) == {}


def test_idle_workers_keep_copies():
    """A plan of one worker takes an idle worker as its buddy (else its loss restarts the run); a
    ring on one host takes an idle worker on another host; spares are taken in turn."""
    hosts = {"w0": "A", "s1": "A", "s2": "B"}
    assert choose_buddies(["w0"], hosts, spare=["s1", "s2"]) == {"w0": "s2"}  # another host
    assert choose_buddies(["w0"], {"w0": "A", "s1": "A"}, spare=["s1"]) == {"w0": "s1"}
    one_host = {"a1": "A", "a2": "A", "b1": "B", "b2": "B"}
    got = choose_buddies(["a1", "a2"], one_host, spare=["b1", "b2"])
    assert got == {"a1": "b1", "a2": "b2"}  # across hosts, one spare each
    # planned workers on two hosts keep each other's copies; the spare is not needed
    got = choose_buddies(["a1", "b1"], one_host, spare=["a2"])
    assert got == {"a1": "b1", "b1": "a1"}
    # a planned worker is never a spare of itself
    assert choose_buddies(["w0"], {"w0": "A"}, spare=["w0"]) == {}
    book = BuddyBook(ResilienceSettings())
    book.assign(["w0"], hosts, version=3, spare=["s2"])
    every, buddies, _ = book.block(["w0", "s2"], None)
    assert every == 50 and buddies == ("s2", None)  # the spare keeps, it does not send
    book.held({"s2": 700, "w0": 0})
    assert book.stats()["memory"] == {"s2": 700, "w0": 0}


# ------------------------------------------------------------------------------ how often
def test_every_is_chosen_from_measured_costs_and_bounded():
    s = ResilienceSettings()
    assert auto_every(None, None, s) == 50  # nothing measured yet: the most allowed
    assert auto_every(float("nan"), 1e-3, s) == 50
    # a copy and its send of 3 ms in all; at 10 ms per iteration and 3 %: every 10
    assert auto_every(0.010, 3e-3, s) == 10
    assert auto_every(1.0, 1e-4, s) == 1  # a cheap copy beside a long iteration: every iteration
    assert auto_every(1e-4, 1e-2, s) == 50  # never further apart than max-every
    assert auto_every(0.01, 1e-3, ResilienceSettings(every=7)) == 7  # set: taken as it is
    assert auto_every(0.010, 3e-3, ResilienceSettings(max_every=5)) == 5


def test_settings_refuse_bad_values():
    ok = {"buddies": True, "every": "auto", "target_overhead": 0.03, "max_every": 50}
    assert ResilienceSettings.of(ok) == ResilienceSettings()
    assert ResilienceSettings.of({**ok, "every": 5}).every == 5
    for key, bad in [("every", 0), ("every", "often"), ("target_overhead", 1.5), ("max_every", 0)]:
        with pytest.raises(DataError, match=key.replace("_", "-")):
            ResilienceSettings.of({**ok, key: bad})


def test_keep_from_is_the_oldest_latest_copy():
    assert keep_from({"a": 40, "b": 20}, ["a", "b"]) == 20
    assert keep_from({"a": 40}, ["a", "b"]) == 0  # b's buddy holds nothing yet
    assert keep_from({}, []) == 0


def test_the_book_chooses_buddies_per_plan_and_reports():
    book = BuddyBook(ResilienceSettings())
    book.assign(["w0", "w1"], {"w0": "A", "w1": "B"}, version=1)
    every, buddies, keep = book.block(["w0", "w1", "gone"], None)
    assert every == 50 and buddies == ("w1", "w0", None) and keep == 0
    book.observe("w0", CopyReport(40, 1000, 3, 3, 0, 1e-3, 1e-3))
    book.observe("w1", CopyReport(20, 800, 3, 2, 1, 2e-3, 1e-3))
    every, _, keep = book.block(["w0", "w1"], 0.010)
    assert keep == 20 and every == auto_every(0.010, 3e-3, book.settings)  # the slowest copy
    book.rolled_back(10)
    assert book.acked == {"w0": 10, "w1": 10}
    stats = book.stats()
    assert stats["memory"] == {"w0": 1000, "w1": 800}
    assert (stats["copies_taken"], stats["copies_sent"], stats["sends_skipped"]) == (6, 5, 1)
    # one planned worker: no buddy, no copies
    book.assign(["w0"], {"w0": "A"}, version=2)
    assert book.block(["w0", "w1"], 0.01) == (0, (), 0)


# ------------------------------------------------------------------------------ what to recover from
def _h(k, a, b, holder, kind):
    return Holding(k, (a, b), holder, kind)


def test_restore_point_is_the_latest_complete_iteration():
    m = 9
    held = [
        # a single column of three; w2 lost. Live shards at 20 miss w2's rows [6, 9)
        _h(20, 0, 3, "w0", "current"),
        _h(20, 3, 6, "w1", "current"),
        # own copies at 16 and 20, w2's copy of 16 arrived at w0, its copy of 20 did not
        _h(16, 0, 3, "w0", "own"),
        _h(16, 3, 6, "w1", "own"),
        _h(20, 0, 3, "w0", "own"),
        _h(20, 3, 6, "w1", "own"),
        _h(16, 6, 9, "w0", "buddy"),
    ]
    point = restore_point(held, m)
    assert point.iteration == 16
    assert [(s.a, s.b) for s in point.segments] == [(0, 3), (3, 6), (6, 9)]
    assert rows_source(point, (6, 9)) == "buddy"
    assert rows_source(point, (0, 3)) == "other column"
    # the new plan: w0 takes [0, 5), w1 takes [5, 9); rows w0 holds come from itself
    assert pieces_for(point, (0, 5), "w0") == [(0, 3, "w0", "own"), (3, 5, "w1", "own")]
    assert pieces_for(point, (5, 9), "w1") == [(5, 6, "w1", "own"), (6, 9, "w0", "buddy")]
    # a floor above 16 (a learning rate changed at 18): nothing to go back to
    assert restore_point(held, m, floor=18) is None
    # nothing after the ceiling (iterations whose errors are not recorded)
    held.append(_h(20, 6, 9, "w0", "buddy"))
    assert restore_point(held, m).iteration == 20
    assert restore_point(held, m, ceiling=19).iteration == 16


def test_live_shards_are_preferred_and_a_lost_pair_leaves_nothing():
    held = [
        _h(20, 0, 9, "w0", "current"),  # another column holds everything now
        _h(20, 0, 9, "w1", "own"),
        _h(16, 0, 5, "w0", "buddy"),
    ]
    point = restore_point(held, 9)
    assert point.iteration == 20 and point.kinds == {"current"}
    # w1 and w2 lost together, w2 kept w1's copy: rows [5, 9) are nowhere
    held = [_h(20, 0, 5, "w0", "current"), _h(16, 0, 5, "w0", "own")]
    assert restore_point(held, 9) is None


def test_adjacent_rows_of_one_holding_are_one_piece():
    held = [_h(8, 0, 4, "a", "own"), _h(8, 4, 9, "b", "buddy"), _h(8, 2, 9, "b", "own")]
    point = restore_point(held, 9)
    # [0, 2) a own, [2, 4) a own (preferred to b's), [4, 9) b own (preferred to buddy)
    assert pieces_for(point, (0, 9), "x") == [(0, 4, "a", "own"), (4, 9, "b", "own")]
    assert pieces_for(point, (0, 9), "b") == [(0, 2, "a", "own"), (2, 9, "b", "own")]


# ------------------------------------------------------------------------------ the worker's copies
class _Shard:
    def __init__(self, layers, rows, value):
        self.layers, self.origin = layers, rows[0]
        self.params = [np.full(s, value) for s in layers.shapes(layers.layer_rows(rows))]
        self.state = {"m": [p * 2 for p in self.params]}

    def rows(self, a, b):
        lay = self.layers
        return {
            "params": lay.take(self.params, (a, b), self.origin),
            "state": {k: lay.take(v, (a, b), self.origin) for k, v in self.state.items()},
        }


def test_the_keeper_copies_sends_keeps_and_serves():
    layers = Layers(4, (6,), 2)
    sent = []

    async def send(address, msg):
        sent.append((address, msg["iteration"]))

    async def go():
        me = CopyKeeper("me", send, layers)
        shard = _Shard(layers, (0, 3), 1.0)
        assert me.due(0, 5, version=1) and me.due(3, 5, 1) is not None
        me.take(0, 1, (0, 3), shard, "buddy")
        shard.params[0][:] = 99.0  # training goes on: the copy must not change
        await asyncio.sleep(0)
        assert me.own[0].params[0].max() == 1.0 and me.acked == 0
        assert not me.due(3, 5, 1) and me.due(5, 5, 1) and me.due(3, 5, 2)  # new plan: at once
        me.receive("other", 0, (3, 6), *(_Shard(layers, (3, 6), 7.0).rows(3, 6).values()))
        got = me.rows(0, 4, 6, "buddy")
        assert all((p == 7.0).all() for p in got["params"])
        assert sorted(me.holdings()) == [(0, (0, 3), "own"), (0, (3, 6), "buddy")]
        for k in range(5, 5 * (MAX_OWN + 3), 5):
            me.take(k, 1, (0, 3), shard, "buddy")
            await asyncio.sleep(0)
        assert len(me.own) == MAX_OWN
        me.keep_from(10**6)  # never drops the latest
        assert len(me.own) == 1
        me.drop_after(0)
        assert me.own == {} and me.acked == 0 and me.report().nbytes == me.nbytes()

    asyncio.run(go())
    assert sent[0] == ("buddy", 0)


def test_a_copy_still_on_its_way_is_not_followed_by_another():
    layers = Layers(4, (6,), 2)
    gate = asyncio.Event

    async def go():
        release = gate()

        async def send(address, msg):
            await release.wait()

        me = CopyKeeper("me", send, layers)
        shard = _Shard(layers, (0, 6), 1.0)
        me.take(0, 1, (0, 6), shard, "b")
        me.take(5, 1, (0, 6), shard, "b")  # the first is still on its way
        assert (me.taken, me.skipped, me.sent) == (2, 1, 0) and me.acked == -1
        release.set()
        await asyncio.sleep(0.01)
        assert me.sent == 1 and me.acked == 0 and set(me.own) == {0, 5}

    asyncio.run(go())


# ------------------------------------------------------------------------------ real workers killed
def _assert_serial(r, x, d, m, lr, iterations, **kw):
    ref = fit_serial(x, d, hidden=m, iterations=iterations, learning_rate=lr, seed=0, **kw)
    for a, b in zip(r.params, ref.params):
        np.testing.assert_allclose(a, b, rtol=RTOL, atol=0)
    np.testing.assert_allclose(r.history["error"].values, ref.errors, rtol=RTOL, atol=0)


@pytest.fixture
def cluster3():
    with LocalCluster(
        n_workers=3, threads_per_worker=1, processes=True, dashboard_address=":0"
    ) as cluster:
        with Client(cluster) as client:
            yield cluster, client


@pytest.mark.parametrize("at", [13, 27])
def test_a_killed_worker_of_a_single_column_costs_at_most_r_iterations(cluster3, sigkill_after, at):
    """One column of three (each row on one worker only): without buddies the loss restarts from
    a checkpoint; with them it goes back at most R iterations (plus one copy in flight)."""
    _, client = cluster3
    x, d = _problem()
    victim = ordered_workers(client.scheduler_info())[1]
    plan = Plan.from_columns([[0, 1, 2]], [48], [[3, 3, 3]], shape=(6, 9, 3))
    cb = sigkill_after(client, victim, at=at)
    every = 5
    with dask.config.set({"rpm.resilience.every": every}):
        r = fit(
            x, d, hidden=9, iterations=45, learning_rate=0.05, mapping=plan, client=client,
            interval=4, callback=cb, progress="none",
        )  # fmt: skip
    (rec,) = [rec for rec in r.remaps if rec.get("lost")]
    assert rec["recovered_from"] == "buddy" and rec["rows_from"] == {victim: "buddy"}
    assert rec["lost"] == [victim]
    assert 0 <= rec["replayed"] <= 2 * every  # R, plus a copy still on its way
    assert r.stats["recomputed_iterations"] == rec["replayed"]
    assert cb.fired[0] - rec["iteration"] == rec["replayed"]
    stats = r.stats["buddies"]
    assert stats["on"] and stats["every"] == every and stats["copies_sent"] > 0
    assert all(v > 0 for v in stats["memory"].values())
    _assert_serial(r, x, d, 9, 0.05, 45)


class _KillAfter(TrainingCallback):
    """SIGKILL the workers ``victims(driver)`` names once ``at`` iterations are done."""

    def __init__(self, client, at, victims):
        self.pids, self.at, self.victims, self.fired = client.run(os.getpid), at, victims, []

    def after_block(self, info):
        if not self.fired and info.iteration >= self.at:
            self.fired.append(info.iteration)
            for victim in self.victims(info.driver):
                os.kill(self.pids[victim], signal.SIGKILL)


def test_an_estimator_survives_a_kill_with_buddies_exactly(cluster3, monkeypatch):
    """MLPClassifier (Adam, mini-batches, constant learning rate: no checkpoint) on a single column
    of three workers, one SIGKILLed mid-run: the model equals scikit-learn's."""
    from sklearn.datasets import load_digits
    from sklearn.neural_network import MLPClassifier as SkMLP

    import dask_rpm
    import dask_rpm.engine

    _, client = cluster3
    X, y = load_digits(return_X_y=True)
    X, y = X[:600] / 16, y[:600]
    kw = dict(hidden_layer_sizes=(24,), max_iter=6, batch_size=100, random_state=0)
    victim = ordered_workers(client.scheduler_info())[1]
    kill = _KillAfter(client, 20, lambda driver: [victim])
    real = dask_rpm.engine.fit

    def fit_with_kill(*args, **kwargs):  # the estimator's own fit, with the killer added
        return real(*args, **{**kwargs, "callbacks": [*kwargs["callbacks"], kill]})

    monkeypatch.setattr(dask_rpm.engine, "fit", fit_with_kill)
    plan = Plan.from_columns([[0, 1, 2]], [600], [[8, 8, 9]], shape=(65, 25, 10))  # bias unit
    clf = dask_rpm.MLPClassifier(**kw, client=client, mapping=plan, progress="none")
    with dask.config.set({"rpm.resilience.every": 4}):
        clf.fit(X, y)
    assert kill.fired
    lost = [rec for rec in clf.result_.remaps if rec.get("lost")]
    assert len(lost) == 1 and lost[0]["recovered_from"] == "buddy"
    assert 0 <= lost[0]["replayed"] <= 8
    assert clf.result_.stats["recomputed_iterations"] == lost[0]["replayed"]
    with pytest.warns(Warning):  # max_iter=6: scikit-learn warns that it did not converge
        ref = SkMLP(**kw).fit(X, y)
    for a, b in zip([*clf.coefs_, *clf.intercepts_], [*ref.coefs_, *ref.intercepts_]):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)


def test_a_worker_and_its_buddy_lost_together_fall_back_with_a_clear_message(cluster3, caplog):
    """Two workers of a single column of three killed at once, one the other's buddy: no copy of
    their rows survives; with no checkpoint the run restarts from iteration 0 and says so."""
    _, client = cluster3
    x, d = _problem()
    plan = Plan.from_columns([[0, 1, 2]], [48], [[3, 3, 3]], shape=(6, 9, 3))
    first = ordered_workers(client.scheduler_info())[0]
    kill = _KillAfter(client, 12, lambda driver: [first, driver.book.buddies[first]])
    with dask.config.set({"rpm.resilience.every": 4}), caplog.at_level("WARNING", "dask_rpm"):
        r = fit(
            x, d, hidden=9, iterations=30, learning_rate=0.05, mapping=plan, client=client,
            interval=4, callbacks=[kill], progress="none",
        )  # fmt: skip
    lost = [rec for rec in r.remaps if rec.get("lost")]
    assert lost and lost[0]["recovered_from"] == "checkpoint" and lost[0]["iteration"] == 0
    assert set(lost[0]["rows_from"].values()) == {"initial"}
    assert "restarted from iteration 0" in caplog.text and "buddy" in caplog.text
    assert r.stats["recomputed_iterations"] >= 12
    _assert_serial(r, x, d, 9, 0.05, 30)


class _KillInBlock(TrainingCallback):
    """SIGKILL ``victim`` while a block runs, once the streamed progress passed iteration ``at``."""

    def __init__(self, client, victim, at):
        self.pid, self.at, self.fired = client.run(os.getpid)[victim], at, []

    def on_progress(self, driver):
        last = driver.log.last_iteration()
        if not self.fired and last is not None and last >= self.at:
            self.fired.append(last)
            os.kill(self.pid, signal.SIGKILL)


def test_a_kill_inside_a_block_goes_back_to_a_copy_after_the_block_start(cluster3):
    """A loss in the middle of a long block: the copies of an iteration after the block's start
    are newer than anything the rollback to that start holds; training goes on from there, and
    the iterations between the block's start and the copy stay in the history."""
    _, client = cluster3
    x, d = _problem()
    plan = Plan.from_columns([[0, 1, 2]], [48], [[3, 3, 3]], shape=(6, 9, 3))
    kill = _KillInBlock(client, ordered_workers(client.scheduler_info())[0], at=300)
    with dask.config.set({"rpm.resilience.every": 25, "rpm.engine.report-seconds": 0.01}):
        r = fit(
            x, d, hidden=9, iterations=900, learning_rate=0.05, mapping=plan, client=client,
            interval=450, callbacks=[kill], progress="none",
        )  # fmt: skip
    assert kill.fired
    (rec,) = [rec for rec in r.remaps if rec.get("lost")]
    assert rec["recovered_from"] == "buddy" and rec["iteration"] > 0  # not the block start
    assert rec["iteration"] % 25 == 0 and rec["replayed"] <= 2 * 25 + 50  # (progress lags)
    assert r.history.sizes["iteration"] == 900
    _assert_serial(r, x, d, 9, 0.05, 900)


def test_a_lone_planned_worker_comes_back_from_an_idle_buddy(cluster3, sigkill_after):
    """A plan that leaves two of three workers idle: the one that trains sends its copies to an
    idle worker, so its loss costs at most R iterations (plus a copy in flight), not the run;
    the copies' bytes are in ``stats["memory"]``, the idle buddy's included."""
    _, client = cluster3
    x, d = _problem()
    workers = ordered_workers(client.scheduler_info())
    plan = Plan.from_columns([[1]], [48], [[9]], shape=(6, 9, 3), abilities=[1, 1, 1])
    cb = sigkill_after(client, workers[1], at=17)
    every = 5
    with dask.config.set({"rpm.resilience.every": every}):
        r = fit(
            x, d, hidden=9, iterations=40, learning_rate=0.05, mapping=plan, client=client,
            interval=4, callback=cb, progress="none",
        )  # fmt: skip
    (rec,) = [rec for rec in r.remaps if rec.get("lost")]
    assert rec["recovered_from"] == "buddy" and rec["rows_from"] == {workers[1]: "buddy"}
    assert (
        0 <= rec["replayed"] <= 2 * every
    )  # (the survivors trained nothing: the copy was a spare's)
    # the idle buddy's copy of 9 rows of weights (6 + 3 + bias) is in both memory figures
    copies = r.stats["buddies"]["memory"]
    assert len([a for a, v in copies.items() if v > 0]) >= 2  # the buddy and the sender
    assert all(r.stats["memory"][a] >= v for a, v in copies.items())
    _assert_serial(r, x, d, 9, 0.05, 40)


@pytest.mark.slow
def test_a_cnn_s_channels_come_back_from_the_buddy(cluster3, sigkill_after):
    """A CNN whose every stage's channels are cut by one column of three (Adam): a killed worker's
    channels and their moments come from its buddy's copy; the result equals fit_serial's."""
    pytest.importorskip("torch")
    from test_cnn import KW, S, _plans, assert_equal, lenet_like, problem, serial

    _, client = cluster3
    x, y = problem(7)
    net = lenet_like(7)
    kw = dict(KW, iterations=24)
    ref = serial(x, y, net, kw)
    plan = _plans(ref.recipe.layers)["one-column"]
    assert plan.n_columns == 1 and plan.samples == S
    victim = ordered_workers(client.scheduler_info())[2]
    killer = sigkill_after(client, victim, at=10)
    with dask.config.set({"rpm.resilience.every": 3}):
        r = fit(
            x, y, network=net, mapping=plan, client=client, interval=5, callback=killer,
            progress="none", **kw,
        )  # fmt: skip
    (rec,) = [rec for rec in r.remaps if rec.get("lost")]
    assert rec["recovered_from"] == "buddy" and rec["rows_from"] == {victim: "buddy"}
    assert rec["replayed"] <= 6 and r.stats["buddies"]["every"] == 3
    assert_equal(r, ref)


@pytest.mark.slow
def test_emulated_links_hold_buddy_copies_back():
    """Between EMULATED nodes a buddy copy waits its link's added delay, as the engine's messages
    do (a sleep never ends early, so the bound holds however busy the machine is)."""
    from dask_rpm.emulation import local_cluster

    x, d = _problem()
    latency = 0.05
    with (
        local_cluster(
            [1.0, 1.0], nodes=["a", "b"], links={"across": (latency, 1e9)}, dashboard_address=None
        ) as cluster,
        Client(cluster) as client,
    ):
        plan = Plan.from_columns([[0, 1]], [48], [[5, 4]], shape=(6, 9, 3))
        with dask.config.set({"rpm.resilience.every": 2}):
            r = fit(
                x, d, hidden=9, iterations=16, learning_rate=0.05, client=client, interval=4,
                mapping=plan.with_workers(ordered_workers(client.scheduler_info())),
                progress="none",
            )  # fmt: skip
    seconds = r.stats["buddies"]["copy_seconds"]
    assert len(seconds) == 2 and min(seconds.values()) >= latency * 0.99
    _assert_serial(r, x, d, 9, 0.05, 16)


@pytest.fixture
def cluster4():
    with LocalCluster(
        n_workers=4, threads_per_worker=1, processes=True, dashboard_address=":0"
    ) as cluster:
        with Client(cluster) as client:
            yield client


@pytest.mark.slow
@pytest.mark.parametrize("second", ["another worker", "the buddy"])
def test_a_worker_killed_during_a_recovery_from_copies(cluster4, second, caplog):
    """One column of four on one host (buddies: the ring w0 -> w1 -> w2 -> w3 -> w0). w1 is killed
    in a block; while the survivors restore from the copies a second worker dies the moment its
    restore task starts. ``another worker`` (w3, whose copy w0 keeps): the recovery starts again
    and still comes from the buddies' copies. ``the buddy`` (w2, which kept w1's copy): w1's rows
    are nowhere, so the run restarts from iteration 0 (no checkpoint configured) and says why.
    Either way the result equals fit_serial's."""
    from test_failure_points import _KillOnTask

    client = cluster4
    x, d = _problem()
    w = ordered_workers(client.scheduler_info())
    victim = w[3] if second == "another worker" else w[2]
    client.register_plugin(_KillOnTask([w[1]], "rpm-block", from_index=4), name="kill-first")
    client.register_plugin(_KillOnTask([victim], "rpm-restore"), name="kill-second")
    plan = Plan.from_columns([[0, 1, 2, 3]], [48], [[3, 2, 2, 2]], shape=(6, 9, 3))
    every = 3
    with dask.config.set({"rpm.resilience.every": every}), caplog.at_level("WARNING", "dask_rpm"):
        r = fit(
            x, d, hidden=9, iterations=36, learning_rate=0.05, mapping=plan, client=client,
            interval=4, progress="none",
        )  # fmt: skip
    lost = [rec for rec in r.remaps if rec.get("lost")]
    assert {a for rec in lost for a in rec["lost"]} == {w[1], victim}, r.remaps
    assert not {w[1], victim} & {r.plan.workers[i] for i in r.plan.planned_workers}
    last = lost[-1]
    if second == "another worker":
        assert last["recovered_from"] == "buddy" and last["iteration"] >= 12 - 2 * every
        assert r.stats["recomputed_iterations"] <= 4 + 2 * every  # the block, R, a copy in flight
    else:
        assert last["recovered_from"] == "checkpoint" and last["iteration"] == 0
        assert "restarted from iteration 0" in caplog.text
    assert r.history.sizes["iteration"] == 36
    _assert_serial(r, x, d, 9, 0.05, 36)
