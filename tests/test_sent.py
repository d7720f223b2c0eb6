"""Samples already sent are not sent again (issue 33): a content key names what the driver
scattered, a second ``fit`` of the same arrays on the same client reuses the workers' copies, a
changed array (even changed in place) is sent again, and each worker keeps one generation.

The cluster tests train on a real LocalCluster (2 worker processes) and compare every run with
fit_serial (float64, rel 1e-10); the problem (tests/problems.py, 400 samples, learning rate
1e-3 per sample, 12 steps) takes its error from 32.57 to 32.46 (full batch) and from 5.22 to
5.09 (mini-batches of 64): steps far above the rel 1e-10 allowed, and the changed array's run
ends elsewhere (checked).
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import scipy.sparse

from dask_rpm.engine.sent import aligned, content_key, sent_samples

# ------------------------------------------------------------------------------ content keys


def test_equal_content_gives_one_key_and_any_change_another():
    rng = np.random.default_rng(0)
    x, d = rng.normal(size=(300, 7)), rng.uniform(size=(300, 2))
    key = content_key(x, d)
    assert len(key) == 40 and content_key(x.copy(), d.copy()) == key  # content, not identity
    y = x.copy()
    y[123, 4] = np.nextafter(y[123, 4], np.inf)  # one ulp of one value
    assert content_key(y, d) != key
    assert content_key(x.astype(np.float32), d) != key  # the dtype
    assert content_key(x.reshape(100, 21), d) != key  # the shape, same bytes
    assert content_key(d, x) != key  # the order
    assert content_key(np.asfortranarray(x), d) == key  # the values, whatever the layout


def test_a_large_array_is_hashed_in_pieces_with_the_same_result_every_time():
    """Above 16 MiB the pieces go to threads: the key must not depend on their timing."""
    x = np.arange(3_000_000, dtype=np.float64)  # 24 MB: two pieces
    assert content_key(x) == content_key(x.copy())
    y = x.copy()
    y[-1] += 1.0  # in the last piece
    assert content_key(y) != content_key(x)


def test_sparse_inputs_are_keyed_by_their_buffers():
    a = scipy.sparse.random(50, 20, density=0.1, format="csr", random_state=1)
    assert content_key(a) == content_key(a.copy())
    b = a.copy()
    b.data[0] += 1.0
    assert content_key(b) != content_key(a)
    assert content_key(a) != content_key(a.toarray())


def test_aligned_copies_only_an_unaligned_array():
    """What Dask can hand a worker: an array at an odd offset of a received buffer."""
    raw = bytearray(8 * 60 + 1)
    x = np.frombuffer(raw, dtype=np.float64, offset=1).reshape(20, 3)
    x[...] = np.arange(60.0).reshape(20, 3)
    d = np.ones((20, 2))
    assert not x.flags.aligned
    ax, ad = aligned((x, d))
    assert ax.flags.aligned and ax.flags.c_contiguous and np.array_equal(ax, x)
    assert ad is d  # aligned already: not copied
    csr = scipy.sparse.csr_matrix(d)
    assert aligned((csr, d))[0] is csr


def test_object_arrays_are_refused_with_what_to_do():
    with pytest.raises(TypeError, match=r"Python objects .* numpy.asarray"):
        content_key(np.array([1, "a"], dtype=object))


# ------------------------------------------------------------------------------ on a cluster


def _problem(s=400):
    from problems import regression_problem

    return regression_problem(s=s, n=8, l=3, seed=5)


def _exact(result, x, d, kw):
    from dask_rpm.nn.serial import fit_serial

    ref = fit_serial(x, d, **kw)
    for got, want in zip(result.params, ref.params):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=0)
    np.testing.assert_allclose(result.history["error"].values, ref.errors, rtol=1e-10, atol=0)


def _held(client):
    """Keys each worker holds now."""
    return {a: len(keys) for a, keys in client.has_what().items()}


@pytest.mark.slow
@pytest.mark.parametrize("batch_size", [64, None], ids=["mini-batches", "full-batch"])
def test_a_second_fit_of_the_same_arrays_sends_nothing_and_a_changed_one_is_resent(batch_size):
    from distributed import Client, LocalCluster

    from dask_rpm.engine import fit

    x, d = _problem()
    kw = dict(hidden=6, iterations=12, learning_rate=1e-3, batch_size=batch_size)
    run = dict(mapping="uniform", client=None, progress="none", elastic=False)
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0") as cluster,
        Client(cluster) as client,
    ):
        run["client"] = client
        first = fit(x, d, **kw, **run)
        sent = first.stats["samples"]["sent_bytes"]
        whole = x.nbytes + d.nbytes
        # mini-batches: the whole set to each of the 2 workers; full batch: each its column's rows
        per_row = whole // len(x)
        slices = sum(first.plan.rectangle(w).n_samples for w in first.plan.planned_workers)
        assert sent == (2 * whole if batch_size else slices * per_row)
        assert first.stats["samples"]["reused"] == 0
        _exact(first, x, d, kw)

        again = fit(x, d, **kw, **run)
        assert again.stats["samples"] == {"sent_bytes": 0, "reused": 2}
        _exact(again, x, d, kw)
        copy = fit(x.copy(), d.copy(), **kw, **run)  # equal content, other objects
        assert copy.stats["samples"]["sent_bytes"] == 0

        x[7, 3] += 0.25  # changed in place: the same object, other content
        changed = fit(x, d, **kw, **run)
        assert changed.stats["samples"]["sent_bytes"] == sent
        _exact(changed, x, d, kw)
        assert not np.allclose(changed.params[0], first.params[0], rtol=1e-12, atol=0)

        # one generation per worker: after three training sets, each holds one copy of the last
        for seed in (6, 7):
            other = _problem()[0] + seed
            fit(other, d, **kw, **run)
        deadline = time.monotonic() + 10  # the runs' own keys are released asynchronously
        while set(_held(client).values()) != {1} and time.monotonic() < deadline:
            time.sleep(0.1)
        assert set(_held(client).values()) == {1}, client.has_what()

        # a worker that leaves: Dask moves its copy to the other, and the next fit frees it there
        gone = sorted(_held(client))[1]
        client.retire_workers(workers=[gone], close_workers=True)
        last = fit(other, d, **kw, **run)
        _exact(last, other, d, kw)
        assert sent_samples(client).holds(gone) == 0
        deadline = time.monotonic() + 10
        while list(_held(client).values()) != [1] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert list(_held(client).values()) == [1], client.has_what()


@pytest.mark.slow
def test_copies_a_worker_lost_are_sent_again():
    """A restarted worker holds nothing: the next fit sends it the samples again, exactly."""
    from distributed import Client, LocalCluster

    from dask_rpm.engine import fit

    x, d = _problem()
    kw = dict(hidden=6, iterations=8, learning_rate=1e-3, batch_size=64)
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0") as cluster,
        Client(cluster) as client,
    ):
        run = dict(mapping="uniform", client=client, progress="none", elastic=False)
        fit(x, d, **kw, **run)
        client.restart()  # every worker process anew: their copies are gone
        client.wait_for_workers(2)
        r = fit(x, d, **kw, **run)
        assert r.stats["samples"]["sent_bytes"] == 2 * (x.nbytes + d.nbytes)
        _exact(r, x, d, kw)
