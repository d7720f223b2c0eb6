"""Training on Dask's own data: dask.array, xarray and zarr, rows cut where the chunks live.

fit on dask data equals fit_serial on the computed arrays (float64, 1e-10); chunks on the
workers of their column move nothing; bad input is one clear error or a fix with a note.
"""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np
import pytest
import xarray as xr
from distributed import Client, LocalCluster, Worker

import dask_rpm
from dask_rpm.nn.batches import BatchError, ChunkOrder, schedule
from dask_rpm.nn.chunked import as_chunked, chunk_order, computed, is_chunked
from dask_rpm.nn.data import DataError
from dask_rpm.nn.serial import fit_serial
from dask_rpm.plan.partition import PlanError
from dask_rpm.planners import make_plan
from dask_rpm.planners.chunks import snap_to_chunks

S, N, M, L = 120, 5, 6, 2


def _data(s=S, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(s, N)), rng.uniform(0.1, 0.9, size=(s, L))


def _close(a, b):
    return max(float(np.abs(p - q).max()) for p, q in zip(a.params, b.params))


def _sensitivity(x, d, **kw):
    """How far fit_serial's result moves when the learning rate changes by 1 part in 1e12: a
    problem where this stays far below 1e-10 shows that agreeing to 1e-10 means the same
    arithmetic, not chaos lining up."""
    a = fit_serial(x, d, **kw)
    b = fit_serial(x, d, **{**kw, "learning_rate": kw["learning_rate"] * (1 + 1e-12)})
    return _close(a, b)


def _placed(client, x, d, chunks, owners):
    """``x`` and ``d`` persisted with row chunk ``i`` (of ``chunks`` rows) on worker
    ``owners[i]``. Names of their own (``name=False``): the same data and chunks placed by
    another test would otherwise be the same keys, still held wherever that test put them."""
    with dask.annotate(workers=lambda key: [owners[key[1]]], allow_other_workers=False):
        xd = da.from_array(x, chunks=(chunks, x.shape[1]), name=False) + 0
        dd = da.from_array(d, chunks=(chunks, d.shape[1]), name=False) + 0
    return client.persist([xd, dd], optimize_graph=False)


@pytest.fixture(scope="module")
def client():
    with (
        LocalCluster(
            n_workers=3, threads_per_worker=1, processes=False, dashboard_address=None
        ) as cluster,
        Client(cluster, set_as_default=False) as c,
    ):
        yield c


# ------------------------------------------------------------------ the pure parts


def test_snap_moves_cuts_onto_chunk_boundaries_within_the_tolerance():
    plan = make_plan([1.0, 0.5, 0.25], (10, 12, 3), 100)
    snapped = snap_to_chunks(plan, [25, 25, 25, 25], tolerance=0.5)
    cuts = {snapped.column_samples(c)[0] for c in range(snapped.n_columns)}
    assert cuts <= {0, 25, 50, 75}
    assert snapped.imbalance() <= plan.imbalance() * 1.5
    assert "chunk boundaries" in snapped.notes[-1]
    assert [r.hidden for r in snapped.rectangles] == [r.hidden for r in plan.rectangles]
    # too costly a move: the plan as it was
    assert snap_to_chunks(plan, [25, 25, 25, 25], tolerance=0.0) is plan


def test_snap_refuses_chunks_of_other_samples_and_a_bad_tolerance():
    plan = make_plan([1.0, 1.0], (10, 12, 3), 100)
    with pytest.raises(PlanError, match="chunks of 90 rows for a plan of 100"):
        snap_to_chunks(plan, [45, 45], 0.05)
    with pytest.raises(PlanError, match="chunk-imbalance=-1"):
        snap_to_chunks(plan, [50, 50], -1)


def test_forms_and_their_errors():
    x, d = _data()
    xd = da.from_array(x, chunks=(40, 2))  # chunked along inputs: rechunked, with a note
    pair = as_chunked(xd, da.from_array(d, chunks=(30, 2)))
    assert pair.x.chunks == ((40, 40, 40), (N,)) and pair.d.chunks[0] == pair.x.chunks[0]
    assert any("inputs" in n for n in pair.notes) and any("unlike x" in n for n in pair.notes)
    assert as_chunked(xd, d).d.chunks[0] == (40, 40, 40) and is_chunked(x, xd[:, :2])
    unknown = xd[da.from_array(x[:, 0] > 0, chunks=40)]
    with pytest.raises(DataError, match="compute_chunk_sizes"):
        as_chunked(unknown, d)
    with pytest.raises(DataError, match="x has 120 samples and d 100"):
        as_chunked(xd, d[:100])
    with pytest.raises(DataError, match="'sample' dimension"):
        as_chunked(xr.DataArray(xd, dims=("time", "input")), d)
    with pytest.raises(DataError, match="missing: \\['d'\\]"):
        as_chunked(xr.Dataset({"x": (("sample", "input"), xd)}))
    xc, dc = computed(xr.Dataset({"x": (("sample", "input"), xd), "d": (("sample", "o"), d)}))
    assert np.array_equal(xc, x) and np.array_equal(dc, d)


# ------------------------------------------------------------------ exactness


@pytest.mark.parametrize(
    "mapping, abilities", [("srpm", [1.0, 0.5, 0.25]), ("uniform", None), ("split-1d", None)]
)
def test_full_batch_equals_fit_serial(client, mapping, abilities):
    x, d = _data()
    kw = dict(hidden=M, iterations=6, learning_rate=1e-2, seed=1)
    r = dask_rpm.fit(
        da.from_array(x, chunks=(50, N)),
        da.from_array(d, chunks=(50, L)),
        mapping=mapping,
        abilities=abilities,
        client=client,
        progress="none",
        **kw,
    )
    assert _close(r, fit_serial(x, d, **kw)) < 1e-10
    assert r.stats["dask"]["chunk_rows"] == [50, 50, 20]


def test_mini_batches_labels_and_a_validation_fraction_equal_fit_serial(client):
    x, _ = _data()
    y = np.array(["a", "b", "c"])[np.random.default_rng(2).integers(0, 3, S)]
    kw = dict(hidden=M, epochs=2, batch_size=32, learning_rate=1e-2, loss="cross-entropy", seed=3)
    kw.update(validation=0.25)
    r = dask_rpm.fit(
        da.from_array(x, chunks=(40, N)),
        da.from_array(y, chunks=40),
        mapping="srpm",
        abilities=[1.0, 0.6, 0.3],
        client=client,
        progress="none",
        **kw,
    )
    s = fit_serial(x, y, **kw)
    assert _close(r, s) < 1e-10 and list(r.classes) == ["a", "b", "c"]


def test_xarray_dataset_and_zarr_store_equal_fit_serial(client, tmp_path):
    x, d = _data()
    ds = xr.Dataset({"x": (("sample", "input"), x), "d": (("sample", "output"), d)})
    kw = dict(hidden=M, iterations=4, learning_rate=1e-2, mapping="srpm")
    ref = fit_serial(x, d, hidden=M, iterations=4, learning_rate=1e-2)
    r = dask_rpm.fit(ds.chunk({"sample": 40}), client=client, progress="none", **kw)
    assert _close(r, ref) < 1e-10
    pytest.importorskip("zarr")
    store = tmp_path / "train.zarr"
    ds.chunk({"sample": 40}).to_zarr(store)
    r = dask_rpm.fit(str(store), client=client, progress="none", **kw)
    assert _close(r, ref) < 1e-10 and r.stats["dask"]["chunks"] == 3
    assert _close(fit_serial(str(store), hidden=M, iterations=4, learning_rate=1e-2), ref) == 0


# ------------------------------------------------------------------ locality


def test_chunks_on_their_columns_workers_move_nothing(client):
    x, d = _data()
    addresses = dask_rpm.ordered_workers(client.scheduler_info(n_workers=-1))
    plan = make_plan([1.0, 0.5, 0.25], (N, M, L), S, method="split-1d", workers=addresses)
    rows = [plan.column_samples(c) for c in range(plan.n_columns)]
    chunks = tuple(b - a for a, b in rows)
    owner = {c: [addresses[plan.columns[c][0]]] for c in range(plan.n_columns)}
    with dask.annotate(workers=lambda key: owner[key[1]], allow_other_workers=False):
        xd = da.from_array(x, chunks=(chunks, N)) + 0
        dd = da.from_array(d, chunks=(chunks, L)) + 0
    xd, dd = client.persist([xd, dd], optimize_graph=False)
    kw = dict(hidden=M, iterations=4, learning_rate=1e-2)
    r = dask_rpm.fit(xd, dd, mapping=plan, client=client, progress="none", **kw)
    assert r.stats["dask"]["bytes_moved"] == 0 and r.stats["dask"]["moved"] == []
    assert _close(r, fit_serial(x, d, **kw)) < 1e-10
    # the same chunks on the wrong workers: each column's chunk moves, and only it
    turned = plan.with_workers(addresses[1:] + addresses[:1])
    r = dask_rpm.fit(xd, dd, mapping=turned, client=client, progress="none", **kw)
    moved = r.stats["dask"]["moved"]
    assert sorted(m["chunk"] for m in moved) == [0, 1, 2]
    assert r.stats["dask"]["bytes_moved"] == S * (N + L) * 8


# ------------------------------------------------------------------ errors


def test_a_failing_chunk_names_its_key_and_cause(client):
    x, d = _data()

    def broken(block):
        raise ZeroDivisionError("no data here")

    bad = da.from_array(x, chunks=(40, N)).map_blocks(broken, dtype=float)
    with pytest.raises(DataError, match=r"chunk \('broken-.*ZeroDivisionError: no data here"):
        dask_rpm.fit(bad, d, hidden=M, iterations=2, client=client, progress="none")


@pytest.mark.parametrize(
    "schedule, form",
    [
        (dict(iterations=8), "numpy"),  # full batch, the weights sent from the client
        (dict(epochs=2, batch_size=24, shuffle=True, validation=0.2), "dask"),  # chunked unlike x
    ],
)
def test_sample_weights_ride_with_the_chunks_and_equal_fit_serial(client, schedule, form):
    x, d = _data()
    w = np.random.default_rng(4).uniform(0.2, 3.0, S)
    kw = dict(hidden=M, learning_rate=1e-2, seed=1, sample_weight=w, **schedule)
    assert _sensitivity(x, d, **kw) < 1e-12  # well conditioned
    ref = fit_serial(x, d, **kw)
    assert _close(fit_serial(x, d, **{**kw, "sample_weight": None}), ref) > 1e-4  # they matter
    given = da.from_array(w, chunks=35) if form == "dask" else w
    r = dask_rpm.fit(
        da.from_array(x, chunks=(40, N)),
        da.from_array(d, chunks=(40, L)),
        client=client,
        progress="none",
        **{**kw, "sample_weight": given},
    )
    assert _close(r, ref) < 1e-10 and r.stats["dask"]["chunks"] == 3
    np.testing.assert_allclose(r.history["error"].values, ref.errors, rtol=1e-10, atol=0)


def test_unsupported_options_say_so(client):
    x, d = _data()
    xd = da.from_array(x, chunks=(40, N))
    with pytest.raises(DataError, match=r"sample_weight has shape \(119,\); give one number"):
        dask_rpm.fit(xd, d, hidden=M, iterations=2, sample_weight=np.ones(S - 1), client=client)
    with pytest.raises(DataError, match="sample_weight must be finite and >= 0"):
        dask_rpm.fit(xd, d, hidden=M, iterations=2, sample_weight=-np.ones(S), client=client)
    images = da.zeros((S, 1, 2, 2), chunks=40)
    with pytest.raises(DataError, match=r"images \(samples, channels, height, width\) train a CNN"):
        dask_rpm.fit(images, d, hidden=M, iterations=2, client=client)
    with pytest.raises(DataError, match="class labels need loss='cross-entropy'"):
        dask_rpm.fit(xd, da.zeros(S, chunks=40), hidden=M, iterations=2, client=client)
    with pytest.raises(DataError, match="x contains NaN"):
        dask_rpm.fit(xd * np.nan, d, hidden=M, iterations=2, client=client, progress="none")


# ------------------------------------------------------------------ remaps and processes


@pytest.mark.slow
def test_a_remap_that_changes_the_columns_samples_fetches_their_rows():
    """A worker at the end of its Dask lifetime is retired: a whole remap onto the others,
    whose new sample ranges come from the chunks (wherever Dask keeps them). The run is long
    enough for any machine and stops a block after that remap, so how fast this machine trains
    does not decide whether the lifetime ends inside it."""
    x, d = _data(s=600)
    kw = dict(hidden=M, learning_rate=1e-4, seed=0)
    retired: list[int] = []
    done: list[int] = []

    def seen(info: dict) -> None:
        # a retirement (or, should the worker die first, a loss: then the assertion below says so)
        retired.extend(
            info["iteration"] for rec in info["remaps"] if rec.get("retired") or rec.get("lost")
        )
        done.append(info["iteration"])

    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None
        ) as cluster,
        Client(cluster, set_as_default=False) as c,
        dask.config.set({"rpm.train.retire-margin": 1.5}),
    ):

        async def mortal() -> Worker:
            return await Worker(cluster.scheduler_address, nthreads=1, lifetime="3s")

        w = c.sync(mortal)
        try:
            r = dask_rpm.fit(
                da.from_array(x, chunks=(200, N)),
                da.from_array(d, chunks=(200, L)),
                mapping="srpm",
                abilities=[1.0, 1.0, 1.0],
                interval=50,
                iterations=10**7,
                client=c,
                progress="none",
                callback=seen,
                should_stop=lambda: bool(retired) and done[-1] > retired[0],
                **kw,
            )
        finally:
            c.sync(w.close)
    (rec,) = [rec for rec in r.remaps if rec.get("retired")]
    assert rec["samples_reloaded"] > 0
    # (whether a chunk moves at the remap depends on where Dask put the retiring worker's chunks:
    # it hands them to a survivor of its choosing, sometimes the one whose new range needs them)
    assert {m["version"] for m in r.stats["dask"]["moved"]} <= set(range(1, 10))
    its = r.history.sizes["iteration"]
    assert its > rec["iteration"]  # trained on after the remap
    assert _close(r, fit_serial(x, d, iterations=its, **kw)) < 1e-10


def test_chunks_move_worker_to_worker_between_processes():
    x, d = _data()
    kw = dict(hidden=M, iterations=3, learning_rate=1e-2)
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster,
        Client(cluster, set_as_default=False) as c,
    ):
        a, b = dask_rpm.ordered_workers(c.scheduler_info(n_workers=-1))
        with dask.annotate(workers=[b], allow_other_workers=False):  # every chunk on b
            xd = da.from_array(x, chunks=(60, N)) + 0
            dd = da.from_array(d, chunks=(60, L)) + 0
        xd, dd = c.persist([xd, dd], optimize_graph=False)
        plan = make_plan([1.0, 1.0], (N, M, L), S, method="split-1d", workers=[a, b])
        # mini-batches first (a full-batch run leaves a copy of a's chunk on a): each window's
        # rows of a's column come from b, over TCP
        mb = dict(hidden=M, epochs=2, batch_size=30, learning_rate=1e-2)
        rb = dask_rpm.fit(xd, dd, mapping=plan, client=c, progress="none", **mb)
        r = dask_rpm.fit(xd, dd, mapping=plan, client=c, progress="none", **kw)
    moved = r.stats["dask"]["moved"]
    assert [(m["worker"], m["chunk"]) for m in moved] == [(a, 0)]  # a's column, from b
    assert r.stats["dask"]["bytes_moved"] == 60 * (N + L) * 8
    assert _close(r, fit_serial(x, d, **kw)) < 1e-10
    fetched = rb.stats["dask"]["fetched"]
    assert fetched[a]["rows"] == 2 * 60 and fetched[b]["rows"] == 0  # a's share of 2 epochs
    assert _close(rb, fit_serial(x, d, **mb)) < 1e-10


# ------------------------------------------------------------------ mini-batches, window by window


def test_chunk_local_order_is_a_stratified_permutation():
    chunks = (30, 50, 17, 23)
    sched = schedule(120, 16, shuffle=ChunkOrder(chunks), seed=4)
    bounds = np.cumsum((0,) + chunks)
    for e in range(3):
        order = sched.order(e)
        assert sorted(order.tolist()) == list(range(120))  # every sample once an epoch
        for k in range(sched.per_epoch):  # every batch draws from every chunk in proportion
            it = e * sched.per_epoch + k
            batch = sched.indices(it)
            got = np.histogram(batch, bounds)[0]
            assert np.all(np.abs(got - len(batch) * np.array(chunks) / 120) <= 1 + len(chunks))
    assert not np.array_equal(sched.order(0), sched.order(1))
    assert not np.array_equal(sched.order(0), schedule(120, 16, shuffle=True, seed=4).order(0))
    # a column takes the batch's samples in its range: columns tile every batch, for any cuts
    for cuts in ([0, 30, 80, 120], [0, 41, 77, 120], [0, 1, 119, 120]):
        cols = list(zip(cuts[:-1], cuts[1:]))
        for it in range(2 * sched.per_epoch):
            parts = [sched.indices(it, c) for c in cols]
            assert sorted(np.concatenate(parts).tolist()) == sorted(sched.indices(it).tolist())
            for (a, b), part in zip(cols, parts):
                assert ((part >= a) & (part < b)).all() and len(part) <= sched.capacity((a, b))
        # loaded in windows, a column gets what it gets loaded at once
        whole, offsets = sched.epoch_plan(1, cols[1])
        first = sched.per_epoch
        a, b = sched.epoch_plan(1, cols[1], first, first + 3)
        c, _ = sched.epoch_plan(1, cols[1], first + 3)
        assert np.array_equal(np.concatenate([a, c]), whole) and b == offsets[:4]


def test_chunk_stream_visits_the_chunks_one_after_another():
    chunks = (30, 50, 17, 23)
    sched = schedule(120, 16, shuffle=ChunkOrder(chunks, stream=True), seed=4)
    bounds = np.cumsum((0,) + chunks)
    assert not sched.local  # columns take position shares, as with shuffle=True
    seen = []
    for e in range(3):
        order = sched.order(e)
        assert sorted(order.tolist()) == list(range(120))
        which = np.searchsorted(bounds, order, side="right") - 1
        runs = [int(which[0])] + [int(b) for a, b in zip(which, which[1:]) if a != b]
        assert sorted(runs) == [0, 1, 2, 3]  # each chunk in one run, rows permuted within it
        seen.append(tuple(runs))
        for j, n in enumerate(chunks):
            assert not np.array_equal(order[which == j], np.arange(bounds[j], bounds[j] + n))
    assert len(set(seen)) > 1  # the chunks' order changes from epoch to epoch


def test_chunk_local_shuffle_needs_chunks():
    with pytest.raises(BatchError, match="shuffle='chunks'.*needs the data's chunks"):
        schedule(120, 16, shuffle="chunks")
    with pytest.raises(BatchError, match="chunks of 100 rows"):
        schedule(120, 16, shuffle=ChunkOrder((50, 50)))
    x, d = _data()
    with pytest.raises(BatchError, match="dask.array.from_array"):
        fit_serial(x, d, hidden=M, epochs=1, batch_size=16, shuffle="chunks")
    with pytest.raises(BatchError, match="shuffle='stream' needs the data's chunks"):
        fit_serial(x, d, hidden=M, epochs=1, batch_size=16, shuffle="stream")
    # a validation split's rows: each chunk's training samples, empty chunks dropped
    rows = np.array([0, 3, 4, 9, 10, 11])
    assert chunk_order((5, 3, 4), rows) == ChunkOrder((3, 3))
    assert chunk_order((5, 3, 4), np.array([0, 1, 9])) == ChunkOrder((2, 1))


@pytest.mark.parametrize("shuffle", [True, False, "chunks", "stream"])
def test_mini_batches_fetch_their_rows_window_by_window_and_equal_fit_serial(client, shuffle):
    """A window of 24 rows: each worker loads several windows an epoch, each fetching only the
    rows its column uses in them; global and chunk-local shuffles equal fit_serial."""
    x, d = _data()
    kw = dict(hidden=M, epochs=3, batch_size=20, learning_rate=1e-2, seed=1, shuffle=shuffle)
    xd, dd = da.from_array(x, chunks=(40, N)), da.from_array(d, chunks=(40, L))
    row = (N + L) * 8
    with dask.config.set({"rpm.engine.sample-window": 24 * row}):
        r = dask_rpm.fit(
            xd, dd, mapping="srpm", abilities=[1.0, 0.5, 0.25], client=client, progress="none", **kw
        )
    s = fit_serial(xd, dd, **kw)
    assert _sensitivity(xd, dd, **kw) < 1e-12
    assert _close(r, s) < 1e-10
    st = r.stats["dask"]
    assert st["window_rows"] == 24 and st["moved"] == []  # nothing whole moves with mini-batches
    loads = sum(f["loads"] for f in st["fetched"].values())
    assert loads > 3 * len(r.plan.planned_workers)  # more than one load an epoch per worker
    # rows_moved counts x's rows from others; bytes_moved x's and d's: a chunk of d that Dask
    # put on the fetching worker while x's chunk sits elsewhere adds x's bytes alone
    assert st["rows_moved"] > 0
    assert st["rows_moved"] * N * 8 <= st["bytes_moved"] <= st["rows_moved"] * row
    # a worker fetches its column's share of an epoch, never the training set
    per_worker = max(f["rows"] for f in st["fetched"].values())
    assert per_worker < 3 * S
    if shuffle in ("chunks", "stream"):  # different sampling from the global shuffle
        other = fit_serial(xd, dd, **{**kw, "shuffle": True})
        assert _close(s, other) > 1e-6


def test_chunk_local_shuffle_with_chunks_on_their_columns_moves_nothing(client):
    x, d = _data()
    addresses = dask_rpm.ordered_workers(client.scheduler_info(n_workers=-1))
    plan = make_plan([1.0, 0.5, 0.25], (N, M, L), S, method="split-1d", workers=addresses)
    rows = [plan.column_samples(c) for c in range(plan.n_columns)]
    chunks = tuple(b - a for a, b in rows)
    xd, dd = _placed(client, x, d, chunks, [addresses[col[0]] for col in plan.columns])
    kw = dict(hidden=M, epochs=2, batch_size=24, learning_rate=1e-2, seed=2, shuffle="chunks")
    with dask.config.set({"rpm.engine.sample-window": 16 * (N + L) * 8}):
        r = dask_rpm.fit(xd, dd, mapping=plan, client=client, progress="none", **kw)
    st = r.stats["dask"]
    assert st["bytes_moved"] == 0 and st["rows_moved"] == 0
    assert sum(f["loads"] for f in st["fetched"].values()) >= 2 * plan.n_columns
    # the serial reference given the same chunks (numpy data: the chunk sizes in ChunkOrder)
    assert _close(r, fit_serial(x, d, **{**kw, "shuffle": ChunkOrder(chunks)})) < 1e-10
    # the global shuffle on the same placement: every column draws from every chunk
    r = dask_rpm.fit(
        xd, dd, mapping=plan, client=client, progress="none", **{**kw, "shuffle": True}
    )
    assert r.stats["dask"]["rows_moved"] > 0
    assert _close(r, fit_serial(x, d, **{**kw, "shuffle": True})) < 1e-10


def test_drpm_remaps_put_the_columns_sample_cuts_on_chunk_boundaries(client):
    """DRPM remaps (every check, t-line 1.0) on chunks of 6 rows: each new plan's column cuts
    move onto chunk boundaries (a few rows each, within rpm.planner.chunk-imbalance), so a
    column reads whole chunks; a remap that lands back on the current plan is not made; the
    result is fit_serial's. (Without snapping, a remap's cuts land anywhere: [0, 193, 396].)"""
    x, d = _data(s=600)
    kw = dict(hidden=M, iterations=30, learning_rate=1e-3, seed=0)
    assert _sensitivity(x, d, **kw) < 1e-12
    # (all three workers kept: DRPM's idle rule could leave a plan of one column, no cut)
    with dask.config.set({"rpm.drpm.t-line": 1.0, "rpm.drpm.idle": False}):
        r = dask_rpm.fit(
            da.from_array(x, chunks=(6, N)),
            da.from_array(d, chunks=(6, L)),
            mapping="drpm",
            interval=5,
            client=client,
            progress="none",
            **kw,
        )
    assert r.remaps and len(r.plans) == len(r.remaps) + 1
    # a remap that snapping puts back on the current plan is no remap
    assert all(set(a.rectangles) != set(b.rectangles) for a, b in zip(r.plans, r.plans[1:]))
    for plan in r.plans:
        # every cut on a chunk boundary, but where moving it there would put the plan past the
        # imbalance tolerance (a column of a few dozen rows, for a worker measured very slow):
        # the plan is as snapping leaves it
        cuts = [plan.column_samples(c)[0] for c in range(plan.n_columns)]
        snapped = snap_to_chunks(plan, [6] * 100, 0.05)
        assert set(snapped.rectangles) == set(plan.rectangles), (cuts, plan.notes)
    assert _close(r, fit_serial(x, d, **kw)) < 1e-10


def test_chunk_local_shuffle_fetches_a_column_that_fits_its_window_once(client):
    """Chunks on another column's worker (turned by one): with the chunk-local shuffle each
    column's rows are its range's in every epoch, so a range within the sample window is
    fetched once for the run, not window by window each epoch."""
    x, d = _data()
    addresses = dask_rpm.ordered_workers(client.scheduler_info(n_workers=-1))
    plan = make_plan([1.0, 0.5, 0.25], (N, M, L), S, method="split-1d", workers=addresses)
    rows = [plan.column_samples(c) for c in range(plan.n_columns)]
    chunks = tuple(b - a for a, b in rows)
    owners = [addresses[plan.columns[(c + 1) % plan.n_columns][0]] for c in range(plan.n_columns)]
    xd, dd = _placed(client, x, d, chunks, owners)
    kw = dict(hidden=M, epochs=3, batch_size=24, learning_rate=1e-2, seed=2, shuffle="chunks")
    r = dask_rpm.fit(xd, dd, mapping=plan, client=client, progress="none", **kw)
    fetched = r.stats["dask"]["fetched"]
    for c, col in enumerate(plan.columns):
        got = fetched[addresses[col[0]]]
        assert got["loads"] == 1 and got["rows"] == chunks[c], (c, got)  # once, all from others
    assert _close(r, fit_serial(x, d, **{**kw, "shuffle": ChunkOrder(chunks)})) < 1e-10


def test_chunk_local_shuffle_with_labels_and_a_validation_fraction_equals_fit_serial(client):
    x, _ = _data()
    y = np.array(["a", "b", "c"])[np.random.default_rng(2).integers(0, 3, S)]
    kw = dict(hidden=M, epochs=2, batch_size=16, learning_rate=1e-2, loss="cross-entropy", seed=3)
    kw.update(validation=0.25, shuffle="chunks")
    xd, yd = da.from_array(x, chunks=(40, N)), da.from_array(y, chunks=40)
    r = dask_rpm.fit(
        xd, yd, mapping="srpm", abilities=[1.0, 0.6, 0.3], client=client, progress="none", **kw
    )
    s = fit_serial(xd, yd, **kw)
    assert _close(r, s) < 1e-10 and list(r.classes) == ["a", "b", "c"]
    assert len(r.validation) == len(s.validation) == 2


def test_fit_lets_go_of_the_chunks_it_persisted():
    """A lazy array's chunks that fit persisted leave the workers when fit returns, without
    waiting for Python's cyclic garbage collector (the driver holds them in a cycle; with it
    switched off here they would stay for good). A cluster of its own: nothing else holds them."""
    import gc
    import time

    x, d = _data(seed=4711)
    xd, dd = da.from_array(x, chunks=(40, N)), da.from_array(d, chunks=(40, L))
    names = {xd.name, dd.name}

    def held(dask_scheduler):
        return sorted(str(k) for k in dask_scheduler.tasks if any(n in str(k) for n in names))

    gc.collect()
    gc.disable()
    try:
        with (
            LocalCluster(n_workers=2, threads_per_worker=1, processes=False) as cluster,
            Client(cluster, set_as_default=False) as client,
        ):
            r = dask_rpm.fit(xd, dd, hidden=M, iterations=3, client=client, progress="none")
            # the client tells the scheduler of released keys in the background: wait for it
            deadline = time.monotonic() + 30
            while (left := client.run_on_scheduler(held)) and time.monotonic() < deadline:
                time.sleep(0.1)
    finally:
        gc.enable()
    assert r.stats["dask"]["chunks"] == 3
    assert not left, left
