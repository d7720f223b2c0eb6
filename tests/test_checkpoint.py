"""Checkpoints the workers write (dask_rpm.engine.checkpoint): real LocalClusters, real files.

``fit(checkpoint_dir=...)``: each worker writes its rows into the store, the
driver only the manifest; resuming from the store ends with the weights of an
uninterrupted run and of serial BP; the weights never reach the driver for a
checkpoint (the task stream shows no gather until the end); an interrupted
checkpoint leaves the previous one valid; a worker lost with every holder of
its rows recovers from the store.
"""

from __future__ import annotations

import os
from functools import partial

import dask.config
import numpy as np
import pytest
from distributed import Client, LocalCluster, get_task_stream
from problems import regression_problem

from dask_rpm.engine import fit, ordered_workers, store
from dask_rpm.nn.data import DataError
from dask_rpm.nn.serial import fit_serial
from dask_rpm.plan.partition import Plan

RTOL = 1e-10
M = 9
# two columns whose row cuts differ: every worker writes, some rows come from each column
PLAN = Plan.from_columns([[0, 1], [2, 3]], [20, 28], [[4, 5], [6, 3]], shape=(6, M, 3))
OPT = {"name": "momentum", "momentum": 0.9}


_problem = partial(regression_problem, seed=1)


@pytest.fixture(scope="module")
def client():
    with LocalCluster(
        n_workers=4, threads_per_worker=1, processes=True, dashboard_address=":0"
    ) as cluster:
        with Client(cluster) as c:
            yield c


def _fit(client, x, d, iterations, **kw):
    return fit(
        x,
        d,
        hidden=M,
        iterations=iterations,
        learning_rate=0.02,
        optimizer=OPT,
        mapping=PLAN,
        client=client,
        interval=5,
        progress="none",
        **kw,
    )


def _stop_at(k):
    seen = []

    def callback(info):
        seen.append(info["iteration"])

    return callback, (lambda: bool(seen) and seen[-1] >= k)


def _assert_equal(r, ref):
    np.testing.assert_allclose(r.params[0], ref[0], rtol=RTOL, atol=0)
    np.testing.assert_allclose(r.params[-1], ref[1], rtol=RTOL, atol=0)


@pytest.mark.slow
def test_resume_from_a_worker_written_store_equals_uninterrupted_and_serial(client, tmp_path):
    x, d = _problem()
    ck = tmp_path / "ck"
    cb, stop = _stop_at(20)
    first = _fit(
        client, x, d, 40, checkpoint_every=10, checkpoint_dir=ck, callback=cb, should_stop=stop
    )
    assert first.stopped and first.stopped.startswith("stop requested")
    man = store.read_manifest(ck)
    assert (
        man["iteration"] == 20 and man["shape"] == [6, M, 3] and man["optimizer_slots"] == ["buf"]
    )
    # one file per row range of store.writers(plan): written by several workers, each row once
    assert len(man["files"]) == sum(len(r) for r in store.writers(PLAN).values()) >= 3
    assert sorted(os.listdir(ck)) == sorted([store.MANIFEST, *(f["name"] for f in man["files"])])
    assert [t[0] for t in first.stats["checkpoints"]] == [10, 20]

    resumed = _fit(client, x, d, 40, checkpoint_every=10, checkpoint_dir=ck, resume=str(ck))
    # every worker read its own rows from the store: no weight byte went through the driver
    want = sum(
        f.bytes
        for w in PLAN.planned_workers
        for f in store.rows_to_read(str(ck), man, *PLAN.rectangle(w).hidden).files
    )
    start = dict(resumed.stats["start"])
    assert start.pop("seconds") > 0
    assert start == {
        "iteration": 20,
        "from": "checkpoint store",
        "client_bytes": 0,
        "store_bytes": want,
    }
    whole = _fit(client, x, d, 40)
    assert (
        whole.stats["start"]["from"] == "initial weights"
        and whole.stats["start"]["client_bytes"] > 0
    )
    ref = fit_serial(x, d, hidden=M, iterations=40, learning_rate=0.02, optimizer=OPT, seed=0)
    (W, V), err = ref.params, ref.errors
    _assert_equal(resumed, whole.params)
    _assert_equal(resumed, (W, V))
    np.testing.assert_allclose(resumed.history["error"].values, err[20:], rtol=RTOL, atol=0)
    # the store's last checkpoint (iteration 40) holds the errors of the whole run, before the resume too
    last = store.load(ck)
    assert last["iteration"] == 40
    np.testing.assert_allclose(last["errors"], err, rtol=RTOL, atol=0)


def _gathers(ts):
    """Iterations at which weights were gathered (task keys ``("rpm-gather-<run>", iteration, worker)``)."""
    return sorted({t["key"][1] for t in ts.data if "rpm-gather" in str(t["key"][0])})


def test_the_driver_never_gathers_weights_for_a_store_checkpoint(client, tmp_path):
    x, d = _problem()
    with get_task_stream(client) as ts:
        r = _fit(client, x, d, 30, checkpoint_every=10, checkpoint_dir=tmp_path / "ck")
    assert [t[0] for t in r.stats["checkpoints"]] == [10, 20, 30]
    assert _gathers(ts) == [30]  # the final weights only
    assert store.read_manifest(tmp_path / "ck")["iteration"] == 30
    # the driver path, for contrast: a gather at every checkpoint
    with get_task_stream(client) as ts:
        _fit(client, x, d, 30, checkpoint_every=10)
    assert _gathers(ts) == [10, 20, 30]


def test_an_interrupted_checkpoint_leaves_the_previous_one_valid(client, tmp_path):
    x, d = _problem()
    ck = tmp_path / "ck"
    # One writer of the checkpoint at 20 fails for real: a directory sits where its row file goes.
    (w, ranges), *_ = store.writers(PLAN).items()
    blocker = ck / store.row_file_name(20, *ranges[0])
    blocker.mkdir(parents=True)
    cb, stop = _stop_at(20)
    r = _fit(
        client, x, d, 40, checkpoint_every=10, checkpoint_dir=ck, callback=cb, should_stop=stop
    )
    assert r.history.sizes["iteration"] == 20
    assert store.read_manifest(ck)["iteration"] == 10  # 20 failed: 10 is still the valid one
    assert [t[0] for t in r.stats["checkpoints"]] == [10, 20]
    # also a half-written file of a writer killed mid-write
    (ck / f".tmp-x1-{store.row_file_name(20, 0, M)}").write_bytes(b"PK\x03\x04 cut off")
    blocker.rmdir()  # the file system is fixed; resume continues from the valid checkpoint
    resumed = _fit(client, x, d, 40, checkpoint_every=10, checkpoint_dir=ck, resume=ck)
    assert int(resumed.history["iteration"].values[0]) == 10
    W, V = fit_serial(
        x, d, hidden=M, iterations=40, learning_rate=0.02, optimizer=OPT, seed=0
    ).params
    _assert_equal(resumed, (W, V))
    # the stale files went once a newer checkpoint was valid
    man = store.read_manifest(ck)
    assert man["iteration"] == 40
    assert sorted(os.listdir(ck)) == sorted([store.MANIFEST, *(f["name"] for f in man["files"])])


def test_a_damaged_row_file_stops_the_resume_with_its_name(client, tmp_path):
    x, d = _problem()
    ck = tmp_path / "ck"
    _fit(client, x, d, 10, checkpoint_every=10, checkpoint_dir=ck)
    victim = store.read_manifest(ck)["files"][-1]["name"]
    data = (ck / victim).read_bytes()
    (ck / victim).write_bytes(data[: len(data) // 2])
    # the worker holding those rows finds it, before the first iteration: a DataError naming the file
    # (StoreError, kept across the worker-to-driver hop: not a DataError rebuilt on the driver)
    with pytest.raises(store.StoreError, match=f"row file '{victim}' does not match manifest.json"):
        _fit(client, x, d, 20, checkpoint_every=10, checkpoint_dir=ck, resume=ck)
    assert store.read_manifest(ck)["iteration"] == 10  # nothing was written over the checkpoint


def test_resume_refuses_a_store_of_another_network_and_a_reused_directory(client, tmp_path):
    x, d = _problem()
    ck = tmp_path / "ck"
    _fit(client, x, d, 10, checkpoint_every=10, checkpoint_dir=ck)
    with pytest.raises(DataError) as err:
        fit(x, d, hidden=8, iterations=20, client=client, resume=ck, progress="none")
    msg = str(err.value)
    assert f"6-{M}-3 network" in msg and "trains 6-8-3" in msg and "start without resume" in msg
    with pytest.raises(DataError, match="already holds a checkpoint of another run"):
        _fit(client, x, d, 20, checkpoint_every=10, checkpoint_dir=ck)
    with pytest.raises(DataError, match="checkpoint_every=0: no checkpoint would be written"):
        _fit(client, x, d, 20, checkpoint_dir=tmp_path / "other")
    assert not (tmp_path / "other").exists()  # refused before anything was written


def test_a_checkpoint_dict_holds_params_and_one_without_them_is_refused(client):
    x, d = _problem()
    states = []
    _fit(client, x, d, 10, checkpoint_every=5, on_checkpoint=states.append)
    state = states[0]
    # the weights as one list W_1 .. W_L, V, under no other name
    assert set(state) == {"iteration", "params", "optimizer_state", "plan", "errors"}
    assert [p.shape for p in state["params"]] == [(M, 6), (3, M)]
    # an earlier development build's dict: the first and the last layer under keys of their own
    old = {
        "iteration": state["iteration"],
        "W": state["params"][0],
        "V": state["params"][-1],
        "optimizer_state": state["optimizer_state"],
    }
    with pytest.raises(DataError) as err:
        _fit(client, x, d, 20, resume=old)
    assert (
        "resume: the checkpoint dict has keys ['V', 'W', 'iteration', 'optimizer_state']; it needs "
        "'iteration' and 'params' (the list W_1 .. W_L, V;" in str(err.value)
    )
    with pytest.raises(DataError, match=r"resume=list; it must be a checkpoint store directory"):
        _fit(client, x, d, 20, resume=[state["params"]])


@pytest.mark.slow
def test_every_holder_lost_recovers_from_the_store(tmp_path, sigkill_after):
    x, d = _problem()
    with (
        LocalCluster(
            n_workers=3, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as c,
    ):
        addrs = ordered_workers(c.scheduler_info())
        plan = Plan.from_columns([[0, 1, 2]], [48], [[3, 3, 3]], shape=(6, M, 3))
        killer = sigkill_after(c, addrs[2], at=25)
        # buddy copies off: this is the store's recovery, the one a run without them takes
        with get_task_stream(c) as ts, dask.config.set({"rpm.resilience.buddies": False}):
            r = fit(
                x,
                d,
                hidden=M,
                iterations=50,
                learning_rate=0.02,
                optimizer=OPT,
                mapping=plan,
                client=c,
                interval=5,
                checkpoint_every=20,
                checkpoint_dir=tmp_path / "ck",
                callback=killer,
                progress="none",
            )
    (rec,) = [rec for rec in r.remaps if rec.get("lost")]
    assert rec["recovered_from"] == "checkpoint" and rec["iteration"] == 20
    assert _gathers(ts) == [50]
    # the survivors read the checkpoint's rows from the store themselves, none went through the driver:
    # together they hold every row, so they read at least all of W, V and the momentum buffers
    weight_bytes = 2 * (M * 6 + 3 * M) * 8
    assert rec["bytes"] == 0 and rec["store_bytes"] >= weight_bytes
    W, V = fit_serial(
        x, d, hidden=M, iterations=50, learning_rate=0.02, optimizer=OPT, seed=0
    ).params
    _assert_equal(r, (W, V))
