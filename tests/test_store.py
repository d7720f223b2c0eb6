"""The checkpoint store's files (dask_rpm.engine.store): row files, the manifest, checks, clean-up.

Real files in a temporary directory; the cluster side (workers writing, resume,
recovery) is tests/test_checkpoint.py.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from dask_rpm.engine import store
from dask_rpm.engine.worker import rows_of as _rows_of
from dask_rpm.nn.layers import Layers
from dask_rpm.plan.partition import Plan


def _weights(n=6, m=9, l=3, slots=("velocity",), seed=0):
    rng = np.random.default_rng(seed)
    W, V = rng.normal(size=(m, n)), rng.normal(size=(l, m))
    state = {s: [rng.normal(size=(m, n)), rng.normal(size=(l, m))] for s in slots}
    return W, V, state


def _layers(W, V):
    return Layers(W.shape[1], (W.shape[0],), V.shape[0])


def rows_of(W, V, state, a, b):
    """The rows of one hidden layer's W, V (and state) as a shard holds them."""
    return _rows_of(_layers(W, V), [W, V], state, a, b)


def write_rows(directory, iteration, W, V, state, a, b):
    """Rows ``[a, b)`` of one hidden layer's W, V (and state) into a row file, as a worker writes them."""
    rows = rows_of(W, V, state, a, b)
    return store.write_rows(str(directory), iteration, a, b, rows, _layers(W, V).names)


def _write(directory, iteration, W, V, state, cuts, extra=None):
    files = [
        write_rows(directory, iteration, W, V, state, a, b) for a, b in zip(cuts[:-1], cuts[1:])
    ]
    n, m, l = W.shape[1], W.shape[0], V.shape[0]
    return files, store.commit(
        str(directory),
        iteration=iteration,
        shape=(n, m, l),
        dtype=str(W.dtype),
        files=files,
        slots=list(state),
        extra=extra,
    )


def test_writers_write_each_row_once_spread_over_every_worker():
    plan = Plan.from_columns([[0, 1], [2, 3]], [20, 28], [[4, 5], [6, 3]], shape=(6, 9, 3))
    jobs = store.writers(plan)
    rows = sorted(r for ranges in jobs.values() for r in ranges)
    # every hidden row exactly once
    assert rows[0][0] == 0 and rows[-1][1] == 9
    assert all(p[1] == q[0] for p, q in zip(rows[:-1], rows[1:]))
    # each worker writes rows it holds
    for w, ranges in jobs.items():
        h0, h1 = plan.rectangle(w).hidden
        assert all(h0 <= a < b <= h1 for a, b in ranges)
    # spread: more than one column writes, and no worker writes more than half of the rows
    assert {0, 1} & set(jobs) and {2, 3} & set(jobs)
    assert max(sum(b - a for a, b in r) for r in jobs.values()) <= 3  # ceil(9 / 4)
    # one worker per column, every worker holding all rows: they still share the writing
    two = Plan.from_columns([[0], [1]], [20, 28], [[9], [9]], shape=(6, 9, 3))
    assert store.writers(two) == {0: [(0, 5)], 1: [(5, 9)]}


def test_round_trip_with_optimizer_state_and_extra(tmp_path):
    W, V, state = _weights()
    _write(
        tmp_path,
        40,
        W,
        V,
        state,
        [0, 4, 9],
        extra={"errors": [1.5, float("nan")], "drpm": {"a": 1}},
    )
    got = store.load(tmp_path)
    assert got["iteration"] == 40 and got["shape"] == (6, 9, 3) and got["dtype"] == "float64"
    np.testing.assert_array_equal(got["params"][0], W)
    np.testing.assert_array_equal(got["params"][-1], V)
    np.testing.assert_array_equal(got["optimizer_state"]["velocity"][0], state["velocity"][0])
    np.testing.assert_array_equal(got["optimizer_state"]["velocity"][1], state["velocity"][1])
    assert got["errors"][0] == 1.5 and np.isnan(got["errors"][1]) and got["drpm"] == {"a": 1}


def test_a_manifest_must_cover_every_row_once(tmp_path):
    W, V, state = _weights()
    files = [write_rows(tmp_path, 5, W, V, state, 0, 4)]
    with pytest.raises(store.StoreError, match=r"do not cover the hidden rows \[0, 9\)"):
        store.write_manifest(
            str(tmp_path),
            iteration=5,
            shape=(6, 9, 3),
            dtype="float64",
            files=files,
            slots=["velocity"],
        )
    assert not (tmp_path / store.MANIFEST).exists()


def test_a_new_checkpoint_without_its_manifest_leaves_the_previous_one_valid(tmp_path):
    W, V, state = _weights()
    _write(tmp_path, 10, W, V, state, [0, 4, 9])
    # the next checkpoint was interrupted: one row file complete, one writer killed mid-write
    W2, V2, state2 = _weights(seed=1)
    write_rows(tmp_path, 20, W2, V2, state2, 0, 4)
    (tmp_path / ".tmp-abc123-it000000020-rows0000004-0000009.npz").write_bytes(b"PK\x03\x04 half")
    got = store.load(tmp_path)
    assert got["iteration"] == 10
    np.testing.assert_array_equal(got["params"][0], W)
    # the next complete checkpoint removes the stale files, and only them
    (tmp_path / "notes.txt").write_text("the user's own file")
    files, _ = _write(tmp_path, 30, W2, V2, state2, [0, 5, 9])
    left = sorted(os.listdir(tmp_path))
    assert left == sorted([store.MANIFEST, "notes.txt", *(f.name for f in files)])
    assert store.load(tmp_path)["iteration"] == 30


@pytest.mark.parametrize("damage", ["truncate", "flip", "remove"])
def test_a_damaged_row_file_is_reported_not_loaded(tmp_path, damage):
    W, V, state = _weights()
    files, _ = _write(tmp_path, 10, W, V, state, [0, 4, 9])
    path = tmp_path / files[1].name
    data = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "flip":
        path.write_bytes(data[:-9] + bytes([data[-9] ^ 1]) + data[-8:])
    else:
        path.unlink()
    with pytest.raises(store.StoreError, match=files[1].name) as err:
        store.load(tmp_path)
    assert "start without resume" in str(err.value)


@pytest.mark.parametrize("a, b", [(0, 9), (0, 4), (2, 7), (4, 9), (6, 7), (3, 4)])
def test_a_worker_reads_only_the_files_of_its_rows(tmp_path, a, b):
    W, V, state = _weights()
    files, man = _write(tmp_path, 10, W, V, state, [0, 4, 6, 9])
    part = store.rows_to_read(str(tmp_path), man, a, b)
    # exactly the files overlapping [a, b), with the manifest's sizes and checksums
    want = [f for f in files if f.rows[0] < b and a < f.rows[1]]
    assert list(part.files) == want and part.rows == (a, b) and part.shape == (6, 9, 3)
    # the other files are not read: removing them changes nothing
    for f in files:
        if f not in want:
            (tmp_path / f.name).unlink()
    got = store.read_rows(part, "float64")
    expect = rows_of(W, V, state, a, b)
    np.testing.assert_array_equal(got["params"][0], expect["params"][0])
    np.testing.assert_array_equal(got["params"][1], expect["params"][1])
    for i in (0, 1):
        np.testing.assert_array_equal(got["state"]["velocity"][i], expect["state"]["velocity"][i])
    assert got["bytes"] == sum(f.bytes for f in want)
    # a float32 run reads the same rows in its own dtype
    assert store.read_rows(part, "float32")["params"][0].dtype == np.float32


def test_a_whole_checkpoint_is_cut_at_the_plans_rows_and_not_rewritten(tmp_path):
    W, V, state = _weights()
    plan = Plan.from_columns([[0, 1], [2, 3]], [20, 28], [[4, 5], [6, 3]], shape=(6, 9, 3))
    man = store.write_whole(str(tmp_path), 7, [W, V], state, extra={"errors": [1.0]}, plan=plan)
    # every row boundary of the plan's rectangles (4 | 5 and 6 | 3): a worker reads only its rows
    assert [f["rows"] for f in man["files"]] == [[0, 4], [4, 6], [6, 9]]
    got = store.load(tmp_path)
    np.testing.assert_array_equal(got["params"][0], W)
    np.testing.assert_array_equal(got["optimizer_state"]["velocity"][1], state["velocity"][1])
    # the store already holds iteration 7 (the workers' checkpoint at that boundary): kept as it is
    files = sorted(os.listdir(tmp_path))
    again = store.write_whole(str(tmp_path), 7, [W * 0, V * 0], state, plan=None)
    assert again["files"] == man["files"] and sorted(os.listdir(tmp_path)) == files
    # the driver checks the files writers reported before naming them in a manifest
    reported = store.manifest_files(man)
    assert store.unseen_files(str(tmp_path), reported) == []
    (tmp_path / reported[1].name).write_bytes(b"short")
    assert store.unseen_files(str(tmp_path), reported) == [reported[1].name]


def test_describe_reads_the_manifest_only(tmp_path):
    W, V, state = _weights()
    files, _ = _write(tmp_path, 10, W, V, state, [0, 4, 9], extra={"errors": [2.0, 1.0]})
    for f in files:
        (tmp_path / f.name).unlink()  # no row file is needed to describe the checkpoint
    got = store.describe(tmp_path)
    assert got["iteration"] == 10 and got["shape"] == (6, 9, 3)
    assert got["optimizer_slots"] == ["velocity"] and "params" not in got
    np.testing.assert_array_equal(got["errors"], [2.0, 1.0])


def test_marks_tell_a_shared_directory_from_per_node_disks(tmp_path):
    shared, elsewhere = tmp_path / "shared", tmp_path / "other-disk"
    shared.mkdir(), elsewhere.mkdir()
    a, b = f"{store.MARK}t-0", f"{store.MARK}t-1"
    store.write_mark(str(shared), a, "tcp://w0")
    # worker 1 wrote "the same path" on its own disk: the driver does not see it in its directory
    store.write_mark(str(elsewhere), b, "tcp://w1")
    assert store.unseen_marks(str(shared), {a: "tcp://w0", b: "tcp://w1"}) == [b]
    # a file of that name with other content is another writer's, not this check's
    (shared / b).write_text("tcp://someone-else")
    assert store.unseen_marks(str(shared), {a: "tcp://w0", b: "tcp://w1"}) == [b]
    # marks left by a driver that died during the check go with the next clean-up
    assert sorted(store.remove_stale(str(shared), [])) == [a, b]


def test_missing_or_foreign_manifest(tmp_path):
    with pytest.raises(store.StoreError, match="holds no checkpoint"):
        store.load(tmp_path)
    (tmp_path / store.MANIFEST).write_text(json.dumps({"format": "something else"}))
    with pytest.raises(store.StoreError, match="not a dask_rpm checkpoint manifest"):
        store.load(tmp_path)


def test_open_resume_refuses_another_network_shape_before_reading_rows(tmp_path):
    W, V, state = _weights()
    files, _ = _write(tmp_path, 10, W, V, state, [0, 4, 9])
    (tmp_path / files[0].name).unlink()  # not read: the shape is checked from the manifest first
    with pytest.raises(store.StoreError) as err:
        store.open_resume(tmp_path, (6, 8, 3))
    msg = str(err.value)
    assert "6-9-3 network" in msg and "trains 6-8-3" in msg and "start without resume" in msg
    with pytest.raises(store.StoreError, match="no such directory"):
        store.open_resume(tmp_path / "nope", (6, 9, 3))


def test_prepare_directory(tmp_path):
    path = store.prepare_directory(tmp_path / "a" / "ck", None)
    assert os.path.isdir(path) and os.path.isabs(path)
    (tmp_path / "file").write_text("x")
    with pytest.raises(store.StoreError, match="is not a directory"):
        store.prepare_directory(tmp_path / "file", None)
    W, V, state = _weights()
    _write(path, 10, W, V, state, [0, 9])
    with pytest.raises(store.StoreError, match="already holds a checkpoint of another run"):
        store.prepare_directory(path, None)
    assert store.prepare_directory(path, path) == path  # resuming that store into itself
