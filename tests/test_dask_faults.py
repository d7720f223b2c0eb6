"""Training on Dask's own data through faults: a SIGKILLed worker, a checkpoint store and a
resume, DRPM's remaps on EMULATED heterogeneous workers.

The chunks are persisted on worker processes of real LocalClusters (``processes=True``). A
killed worker takes its chunks with it; Dask computes them again from the collection's graph
(``da.from_array`` here, a zarr store's reads alike), and training goes on: ``fit`` on the dask
array ends equal to ``fit_serial`` on the computed arrays (float64, relative 1e-10). Chunks
that Dask cannot compute again (scattered data, tasks pinned to the workers that left) end the
run with one clear error instead of a wait that never ends.

Each problem is first shown to be well conditioned (:func:`_serial`): a learning rate changed
by 1 part in 1e12 moves fit_serial's weights by less than 1e-11 relative (a change amplified
at most ten times, so rounding differences stay far below 1e-10 and an agreement to 1e-10
means something); and the weights move (a comparison of two no-ops would not).
"""

from __future__ import annotations

import os
import signal
from functools import partial

import dask
import dask.array as da
import dask.config
import numpy as np
import pytest
from distributed import Client, LocalCluster, futures_of
from problems import regression_problem

import dask_rpm
from dask_rpm.demo.train import demo_data
from dask_rpm.engine import store
from dask_rpm.nn.data import DataError
from dask_rpm.nn.serial import fit_serial
from dask_rpm.plan.partition import Plan

RTOL = 1e-10
S, N, M, L = 120, 6, 9, 3  # 120 samples in 3 chunks of 40; a 6-9-3 network
CHUNK = 40
LR = 0.05
_problem = partial(regression_problem, s=S, n=N, l=L, seed=1)


# ------------------------------------------------------------------ helpers


def _rel(a, b) -> float:
    """Largest difference over parameter lists, relative to each parameter's largest entry."""
    return max(float(np.abs(p - q).max() / np.abs(q).max()) for p, q in zip(a, b))


def _serial(x, d, **kw):
    """fit_serial's result, after showing the problem well conditioned and the weights moving."""
    ref = fit_serial(x, d, **kw)
    other = fit_serial(x, d, **dict(kw, learning_rate=kw["learning_rate"] * (1 + 1e-12)))
    change = _rel(other.params, ref.params)
    assert change < 1e-11, f"ill-conditioned problem ({change:.2e}): the comparison means nothing"
    one = {k: v for k, v in kw.items() if k not in ("epochs", "batch_size")}
    start = fit_serial(x, d, **dict(one, iterations=1))  # the same seed: the same first weights
    moved = _rel(ref.params, start.params)
    assert moved > 1e-3, f"the weights barely moved ({moved:.2e})"
    return ref


def _assert_equal(r, ref, first: int = 0):
    """``r`` has ``ref``'s weights and, from iteration ``first`` on, its errors."""
    assert len(r.params) == len(ref.params)
    for got, want in zip(r.params, ref.params):
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=0)
    np.testing.assert_allclose(r.history["error"].values, ref.errors[first:], rtol=RTOL, atol=0)


def _cluster(n: int = 3):
    """``n`` one-thread worker processes. The scheduler's active memory manager thins out
    replicas every 5 ms instead of every 2 s: a chunk copied to one worker for its rows may lose
    its replica on the worker it was put on at any moment of a placement, not once in a while."""
    with dask.config.set({"distributed.scheduler.active-memory-manager.interval": "5ms"}):
        return LocalCluster(
            n_workers=n, threads_per_worker=1, processes=True, dashboard_address=":0"
        )


def _placed(client, x, d, owners, *, strict=False):
    """``x`` and ``d`` in chunks of 40 rows, chunk ``i`` persisted on worker ``owners[i]``
    (``strict``: only there, ``allow_other_workers=False``); checked with ``who_has``."""
    with dask.annotate(workers=lambda key: [owners[key[1]]], allow_other_workers=not strict):
        xd = da.from_array(x, chunks=(CHUNK, N)) + 0  # a task per chunk: Dask can rerun it
        dd = da.from_array(d, chunks=(CHUNK, L)) + 0
    xd, dd = client.persist([xd, dd], optimize_graph=False)
    client.gather(futures_of(xd) + futures_of(dd))
    held = client.who_has([*futures_of(xd), *futures_of(dd)])
    for arr in (xd, dd):
        for i, (key,) in enumerate(arr.__dask_keys__()):  # one key per row chunk
            assert list(held[key]) == [owners[i]], (key, held[key])
    return xd, dd


def _holders(client, xd, dd, i):
    """The workers holding row chunk ``i`` of ``x`` and those holding it of ``d``, now."""
    (kx,), (kd,) = xd.__dask_keys__()[i], dd.__dask_keys__()[i]
    held = client.who_has([*futures_of(xd), *futures_of(dd)])
    return set(held[kx]), set(held[kd])


def _killer(client, victim, at):
    """A ``fit`` callback that SIGKILLs ``victim``'s process once ``at`` iterations are done."""
    pids = client.run(os.getpid)
    fired: list[int] = []

    def callback(info):
        if not fired and info["iteration"] >= at:
            fired.append(info["iteration"])
            os.kill(pids[victim], signal.SIGKILL)

    callback.fired = fired
    return callback


# ------------------------------------------------------------------ (a) a SIGKILLed worker


@pytest.mark.slow
@pytest.mark.parametrize(
    "layout",
    [
        "columns",  # split-1d: three columns of one worker; the lost rows come from another column
        "buddy",  # one column of three: the lost shard comes from its buddy's copy
        "mini-batches",  # mini-batches over all 120 rows, every worker reads every chunk
    ],
)
def test_a_killed_worker_and_its_chunks_equal_fit_serial(layout):
    """Worker 1 holds chunk 1 of x and d and is SIGKILLed at iteration 20: its shard is
    recovered, Dask computes chunk 1 again, and the run ends with fit_serial's weights."""
    x, d = _problem()
    kw = dict(hidden=M, learning_rate=LR, seed=0)
    kw.update(epochs=20, batch_size=30) if layout == "mini-batches" else kw.update(iterations=60)
    ref = _serial(x, d, **kw)
    with _cluster() as cluster, Client(cluster, set_as_default=False) as c:
        addrs = dask_rpm.ordered_workers(c.scheduler_info(n_workers=-1))
        victim = addrs[1]
        xd, dd = _placed(c, x, d, addrs)
        if layout == "buddy":
            mapping = Plan.from_columns([[0, 1, 2]], [S], [[3, 3, 3]], shape=(N, M, L))
            mapping = mapping.with_workers(addrs)
        else:
            mapping = "split-1d"
        killer = _killer(c, victim, at=20)
        r = dask_rpm.fit(
            xd,
            dd,
            mapping=mapping,
            client=c,
            interval=5,
            callback=killer,
            progress="none",
            **kw,
        )
        chunk1 = _holders(c, xd, dd, 1)
    assert killer.fired == [20]
    # chunk 1 of x and of d, lost with the victim, computed again: on survivors now
    assert all(held and victim not in held for held in chunk1), chunk1
    (rec,) = [rec for rec in r.remaps if rec.get("lost")]
    assert rec["lost"] == [victim]
    assert rec["recovered_from"] == {"columns": "columns", "buddy": "buddy"}.get(layout, "columns")
    assert victim not in [r.plan.workers[w] for w in r.plan.planned_workers]
    if layout != "mini-batches":
        # before the loss: each column's chunk on its worker moved nothing; the one column's
        # workers each fetched the two chunks they lacked
        first = [(m["worker"], m["chunk"]) for m in r.stats["dask"]["moved"] if m["version"] == 1]
        want = (
            []
            if layout == "columns"
            else [(a, i) for a in addrs for i in range(3) if a != addrs[i]]
        )
        # (at most those: a chunk Dask had already copied to a worker does not move again)
        assert set(first) <= set(want), r.stats["dask"]["moved"]
        assert len(first) == len(set(first))  # no chunk moved twice to one worker
    _assert_equal(r, ref)


# ------------------------------------------------------------------ (b) a checkpoint store


@pytest.mark.slow
def test_resume_from_a_checkpoint_store_equals_fit_serial(tmp_path):
    """Stopped at iteration 20 with a checkpoint store, resumed to 40 on a fresh cluster from
    the same zarr-like graph (da.from_array): the weights and the errors of fit_serial's 40."""
    x, d = _problem()
    kw = dict(hidden=M, learning_rate=LR, seed=0, optimizer={"name": "momentum", "momentum": 0.9})
    ref = _serial(x, d, iterations=40, **kw)
    ck = tmp_path / "ck"
    seen: list[int] = []
    with _cluster() as cluster, Client(cluster, set_as_default=False) as c:
        xd, dd = da.from_array(x, chunks=(CHUNK, N)), da.from_array(d, chunks=(CHUNK, L))
        first = dask_rpm.fit(
            xd,
            dd,
            iterations=40,
            mapping="split-1d",
            client=c,
            interval=5,
            checkpoint_every=10,
            checkpoint_dir=ck,
            callback=lambda info: seen.append(info["iteration"]),
            should_stop=lambda: bool(seen) and seen[-1] >= 20,
            progress="none",
            **kw,
        )
    assert first.stopped and first.stopped.startswith("stop requested")
    assert store.read_manifest(ck)["iteration"] == 20
    with _cluster(2) as cluster, Client(cluster, set_as_default=False) as c:
        resumed = dask_rpm.fit(
            da.from_array(x, chunks=(CHUNK, N)),
            da.from_array(d, chunks=(CHUNK, L)),
            iterations=40,
            mapping="split-1d",
            client=c,
            interval=5,
            checkpoint_every=10,
            checkpoint_dir=ck,
            resume=str(ck),
            progress="none",
            **kw,
        )
    start = resumed.stats["start"]
    assert start["iteration"] == 20 and start["from"] == "checkpoint store"
    assert start["client_bytes"] == 0  # the workers read their rows of the weights themselves
    _assert_equal(resumed, ref, first=20)
    np.testing.assert_allclose(store.load(ck)["errors"], ref.errors, rtol=RTOL, atol=0)


@pytest.mark.slow
def test_a_killed_worker_of_one_column_recovers_from_the_store(tmp_path):
    """Buddy copies off and one column: the loss goes back to the store's checkpoint at 20, the
    survivors read their weights from it and their rows from the chunks (chunk 1 recomputed)."""
    x, d = _problem()
    kw = dict(hidden=M, learning_rate=LR, seed=0, iterations=50)
    ref = _serial(x, d, **kw)
    with (
        _cluster() as cluster,
        Client(cluster, set_as_default=False) as c,
        dask.config.set({"rpm.resilience.buddies": False}),
    ):
        addrs = dask_rpm.ordered_workers(c.scheduler_info(n_workers=-1))
        xd, dd = _placed(c, x, d, addrs)
        plan = Plan.from_columns([[0, 1, 2]], [S], [[3, 3, 3]], shape=(N, M, L))
        killer = _killer(c, addrs[2], at=25)
        r = dask_rpm.fit(
            xd,
            dd,
            mapping=plan.with_workers(addrs),
            client=c,
            interval=5,
            checkpoint_every=20,
            checkpoint_dir=tmp_path / "ck",
            callback=killer,
            progress="none",
            **kw,
        )
        chunk2 = _holders(c, xd, dd, 2)
    (rec,) = [rec for rec in r.remaps if rec.get("lost")]
    assert rec["recovered_from"] == "checkpoint" and rec["iteration"] == 20
    assert all(held and addrs[2] not in held for held in chunk2), chunk2  # on survivors now
    assert rec["bytes"] == 0 and rec["store_bytes"] > 0  # weights from the store, not the driver
    _assert_equal(r, ref)


# ------------------------------------------------------------------ (c) DRPM, EMULATED speeds


@pytest.mark.slow
def test_drpm_remaps_on_emulated_heterogeneous_workers_equal_fit_serial():
    """EMULATED speeds 1.0, 0.3, 0.6 (paced worker processes): DRPM starts uniform, remaps at
    every check (t-line 1.0), and the columns' new sample ranges come from the chunks."""
    x, d = demo_data(512, (17, 24, 4))
    kw = dict(hidden=24, iterations=40, learning_rate=2e-3)
    ref = _serial(x, d, **kw)
    with (
        dask_rpm.local_cluster([1.0, 0.3, 0.6], scale=0.5, dashboard_address=":0") as cluster,
        Client(cluster, set_as_default=False) as c,
        dask.config.set({"rpm.drpm.t-line": 1.0}),
    ):
        r = dask_rpm.fit(
            da.from_array(x, chunks=(128, 17)),
            da.from_array(d, chunks=(128, 4)),
            mapping="drpm",
            interval=8,
            client=c,
            progress="none",
            **kw,
        )
    assert "EMULATED" in r.history.attrs["emulation"]
    assert len(r.remaps) == 4 and r.remaps[0]["kind"] == "whole"
    # the remaps changed the columns' samples: their workers cut them from the chunks again
    # (which chunks move depends on where Dask keeps replicas, so it is not asserted)
    assert sum(rec["samples_reloaded"] for rec in r.remaps) > 0
    _assert_equal(r, ref)


# ------------------------------------------------------------------ chunks Dask cannot recompute


@pytest.mark.slow
@pytest.mark.parametrize("how", ["scattered", "scattered, mini-batches", "pinned"])
def test_chunks_that_cannot_be_computed_again_are_one_clear_error(how):
    """Scattered chunks have no task; chunks pinned (allow_other_workers=False) to the killed
    worker have no worker left to run theirs: fit says so and how to fix it, at once (full
    batch and mini-batches: the workers' readers would ask for the chunk for 120 s)."""
    x, d = _problem()
    mini = how.endswith("mini-batches")
    schedule = dict(epochs=20, batch_size=30) if mini else dict(iterations=60)
    with _cluster() as cluster, Client(cluster, set_as_default=False) as c:
        addrs = dask_rpm.ordered_workers(c.scheduler_info(n_workers=-1))
        if how.startswith("scattered"):
            parts = [
                [c.scatter(a[i * CHUNK : (i + 1) * CHUNK], workers=[addrs[i]]) for i in range(3)]
                for a in (x, d)
            ]
            xd, dd = (
                da.concatenate(
                    [da.from_delayed(p, shape=(CHUNK, a.shape[1]), dtype=float) for p in ps]
                )
                for ps, a in zip(parts, (x, d))
            )
            want = "Dask cannot compute it again: no task makes it"
        else:
            xd, dd = _placed(c, x, d, addrs, strict=True)
            want = "no worker in the cluster may compute it again"
        killer = _killer(c, addrs[1], at=10)
        with pytest.raises(DataError, match=f"chunk 1 of the training data .*{want}") as err:
            dask_rpm.fit(
                xd,
                dd,
                hidden=M,
                learning_rate=LR,
                mapping="split-1d",
                client=c,
                interval=5,
                callback=killer,
                progress="none",
                **schedule,
            )
    assert killer.fired == [10]
    assert "call fit again" in str(err.value)
