"""dask DataFrames as training data: ``fit(x, d)`` with ``x`` a dask DataFrame of numeric
columns and ``d`` a dask DataFrame of targets or a Series of class labels.

They become dask arrays with known chunk sizes (``to_dask_array(lengths=True)``, the partitions
the row chunks, with a note) and train equal to :func:`dask_rpm.fit_serial` on the same arrays
(float64, 1e-10; the problem is small and well conditioned at its learning rate: a 1e-12
change of the rate moves the serial result by less than 1e-9, shown in the test); a column
that is not numeric is refused by name.
"""

from __future__ import annotations

import numpy as np
import pytest
from distributed import Client, LocalCluster

dd = pytest.importorskip("dask.dataframe")  # needs pandas and pyarrow (the extra "dataframe")
pd = pytest.importorskip("pandas")

from sklearn.exceptions import ConvergenceWarning  # noqa: E402

import dask_rpm  # noqa: E402
from dask_rpm import MLPClassifier, MLPRegressor  # noqa: E402
from dask_rpm.nn.chunked import as_chunked, is_chunked  # noqa: E402
from dask_rpm.nn.data import DataError  # noqa: E402
from dask_rpm.nn.serial import fit_serial  # noqa: E402

S, N, L, M = 150, 5, 2, 6


def _problem():
    rng = np.random.default_rng(7)
    x = rng.normal(size=(S, N))
    x[:, -1] = 1.0
    labels = np.array(["low", "mid", "high"])[rng.integers(0, 3, S)]
    return x, rng.uniform(0.1, 0.9, size=(S, L)), labels


def _frames(x, d, labels):
    cols = [f"f{i}" for i in range(N)]
    return (
        dd.from_pandas(pd.DataFrame(x, columns=cols), npartitions=3),
        dd.from_pandas(pd.DataFrame(d, columns=["t0", "t1"]), npartitions=3),
        dd.from_pandas(pd.Series(labels, name="label"), npartitions=3),
    )


@pytest.fixture(scope="module")
def client():
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None
        ) as cluster,
        Client(cluster, set_as_default=False) as c,
    ):
        yield c


def _close(a, b):
    return max(float(np.abs(p - q).max()) for p, q in zip(a.params, b.params))


def test_frames_become_arrays_with_known_chunks_and_a_note():
    x, d, labels = _problem()
    X, D, Y = _frames(x, d, labels)
    assert is_chunked(X, D) and is_chunked(x, Y)
    pair = as_chunked(X, D)
    assert pair.x.chunks[0] == pair.d.chunks[0] and sum(pair.x.chunks[0]) == S
    assert len(pair.x.chunks[0]) == 3 and any(
        "to_dask_array(lengths=True)" in n for n in pair.notes
    )
    assert np.array_equal(pair.x.compute(), x) and np.array_equal(
        as_chunked(X, Y).d.compute(), labels
    )


def test_fit_on_dask_frames_equals_fit_serial(client):
    x, d, labels = _problem()
    X, D, Y = _frames(x, d, labels)
    kw = dict(hidden=M, iterations=8, learning_rate=1e-2, seed=1)
    ref = fit_serial(x, d, **kw)
    assert _close(fit_serial(x, d, **{**kw, "learning_rate": 1e-2 * (1 + 1e-12)}), ref) < 1e-9
    r = dask_rpm.fit(
        X, D, mapping="srpm", abilities=[1.0, 0.5], client=client, progress="none", **kw
    )
    assert _close(r, ref) < 1e-10 and r.stats["dask"]["chunks"] == 3
    assert _close(fit_serial(X, D, **kw), ref) == 0  # the reference computes the frames
    kw = dict(hidden=M, epochs=2, batch_size=32, learning_rate=1e-2, loss="cross-entropy", seed=3)
    r = dask_rpm.fit(X, Y, client=client, progress="none", **kw)
    assert _close(r, fit_serial(x, labels, **kw)) < 1e-10
    assert list(r.classes) == ["high", "low", "mid"]


def test_estimators_on_dask_frames_equal_the_arrays(client):
    x, d, labels = _problem()
    X, D, Y = _frames(x, d, labels)
    params = dict(hidden_layer_sizes=(M,), max_iter=5, batch_size=40, random_state=0)
    with pytest.warns(ConvergenceWarning):  # max_iter=5 stops short, as with arrays
        ours = MLPClassifier(client=client, **params).fit(X, Y)
        theirs = MLPClassifier(**params).fit(x, labels)
    for a, b in zip(ours.coefs_ + ours.intercepts_, theirs.coefs_ + theirs.intercepts_):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-15)
    assert ours.score(X, Y) == pytest.approx(theirs.score(x, labels), rel=1e-12)
    assert np.array_equal(client.compute(ours.predict(X), sync=True), theirs.predict(x))
    with pytest.warns(ConvergenceWarning):
        reg = MLPRegressor(client=client, **params).fit(X, D)
        ref = MLPRegressor(**params).fit(x, d)
    assert reg.score(X, D) == pytest.approx(ref.score(x, d), rel=1e-10)


def test_columns_that_are_not_numbers_are_named():
    x, d, labels = _problem()
    X, D, Y = _frames(x, d, labels)
    with pytest.raises(DataError, match=r"columns \['kind'\] are not numbers.*drop\(columns"):
        as_chunked(X.assign(kind=Y), D)
    with pytest.raises(DataError, match="x is a dask Series of"):
        as_chunked(Y, D)
