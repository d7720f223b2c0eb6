"""The estimators on Dask's own data: dask arrays, dask-backed xarray and zarr stores.

An estimator given Dask's data on a cluster trains on the chunks where they are (the fit path
of :func:`dask_rpm.fit`: ``result_.stats["dask"]`` says so) and equals the same estimator given
the computed numpy arrays, and scikit-learn's own, to 1e-9 relative (float64). Every problem is
first shown to be well conditioned: scikit-learn, started from a learning rate changed by 1 part
in 1e12, ends within 1e-7 of its own result, so the agreement says the arithmetic is the same.
``predict`` on a dask array is a dask array (one task per chunk, the model held once in the
graph); ``score`` is computed by reductions on the workers and equals scikit-learn's.
"""

from __future__ import annotations

import warnings

import dask.array as da
import numpy as np
import pytest
import xarray as xr
from distributed import Client, LocalCluster

pytest.importorskip("sklearn")

from sklearn.datasets import make_classification, make_regression  # noqa: E402
from sklearn.exceptions import ConvergenceWarning  # noqa: E402
from sklearn.neural_network import MLPClassifier as SKClassifier  # noqa: E402
from sklearn.neural_network import MLPRegressor as SKRegressor  # noqa: E402

from dask_rpm import CNNClassifier, MLPClassifier, MLPRegressor  # noqa: E402
from dask_rpm.estimators import EstimatorError  # noqa: E402
from dask_rpm.nn.data import DataError  # noqa: E402

CHUNK = 70  # rows per chunk: three chunks of 200 samples, the last shorter


@pytest.fixture(scope="module")
def client():
    with (
        LocalCluster(
            n_workers=3, threads_per_worker=1, processes=False, dashboard_address=None
        ) as cluster,
        Client(cluster, set_as_default=False) as c,
    ):
        yield c


def _classes(k=3, s=200, seed=0):
    x, y = make_classification(s, 8, n_informative=5, n_classes=k, random_state=seed)
    names = np.array(["ash", "birch", "cedar"])[:k]
    return x, names[y]  # string labels: the classes are found on the workers


def _regression(outputs=1, s=200, seed=0):
    x, y = make_regression(s, 6, n_targets=outputs, noise=0.1, random_state=seed)
    return x, y / 100.0


def _dask(*arrays):
    return [da.from_array(a, chunks=(CHUNK, *a.shape[1:])) for a in arrays]


def _quiet(est, method, *args, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return getattr(est, method)(*args, **kw)


def _relative(ours, theirs):
    pairs = zip(theirs.coefs_ + theirs.intercepts_, ours.coefs_ + ours.intercepts_)
    return max(float(np.max(np.abs(a - b)) / np.max(np.abs(a))) for a, b in pairs)


def _sensitivity(sk_class, params, x, y):
    a = _quiet(sk_class(**params), "fit", x, y)
    lr = params.get("learning_rate_init", 0.001) * (1 + 1e-12)
    b = _quiet(sk_class(**{**params, "learning_rate_init": lr}), "fit", x, y)
    return _relative(a, b)


#: (kind, classes or outputs, parameters): both kinds, every solver, the early-stopping split
#: (stratified for a binary classifier) and a learning-rate schedule
CASES = {
    "classifier-adam": ("classifier", 3, dict(max_iter=15)),
    "binary-early-stopping-stratified": ("classifier", 2, dict(max_iter=20, early_stopping=True)),
    "classifier-sgd-adaptive": (
        "classifier",
        3,
        dict(solver="sgd", learning_rate="adaptive", tol=1e-2, n_iter_no_change=2, max_iter=20),
    ),
    "classifier-lbfgs": ("classifier", 3, dict(solver="lbfgs", max_iter=15)),
    "regressor-sgd-early-stopping": (
        "regressor",
        1,
        dict(solver="sgd", early_stopping=True, learning_rate_init=0.01, tol=1e-2, max_iter=20),
    ),
    "regressor-two-outputs": ("regressor", 2, dict(activation="logistic", max_iter=15)),
}


def _case(name):
    kind, k, extra = CASES[name]
    params = dict(hidden_layer_sizes=(10,), batch_size=32, random_state=1, **extra)
    if kind == "classifier":
        return SKClassifier, MLPClassifier, params, *_classes(k)
    return SKRegressor, MLPRegressor, params, *_regression(k)


@pytest.mark.parametrize("name", list(CASES))
def test_dask_data_on_a_cluster_equal_numpy_arrays_and_scikit_learn(client, name):
    sk_class, our_class, params, x, y = _case(name)
    assert _sensitivity(sk_class, params, x, y) < 1e-7  # well conditioned (module docstring)
    theirs = _quiet(sk_class(**params), "fit", x, y)
    xd, yd = _dask(x, y)
    ours = _quiet(our_class(client=client, **params), "fit", xd, yd)
    arrays = _quiet(our_class(client=client, **params), "fit", x, y)
    assert _relative(ours, arrays) < 1e-10 and _relative(ours, theirs) < 1e-9
    assert ours.n_iter_ == theirs.n_iter_ and ours.n_features_in_ == x.shape[1]
    assert ours.out_activation_ == theirs.out_activation_
    if params.get("solver") != "lbfgs":
        np.testing.assert_allclose(ours.loss_curve_, theirs.loss_curve_, rtol=1e-9)
        assert ours.result_.stats["dask"]["chunks"] >= 1  # trained where the chunks are
    if params.get("early_stopping"):
        np.testing.assert_allclose(ours.validation_scores_, theirs.validation_scores_, rtol=1e-9)
    if our_class is MLPClassifier:
        assert list(ours.classes_) == list(theirs.classes_)
    # predictions: a dask array with X's row chunks, equal to the arrays' predictions
    pred = ours.predict(xd)
    assert isinstance(pred, da.Array) and pred.chunks[0] == xd.chunks[0]
    got = client.compute(pred, sync=True)
    if our_class is MLPClassifier:
        assert np.array_equal(got, theirs.predict(x))
    else:
        np.testing.assert_allclose(got, theirs.predict(x), rtol=1e-9, atol=1e-12)
    assert ours.score(xd, yd) == pytest.approx(theirs.score(x, y), rel=1e-9)


def test_without_a_cluster_dask_data_are_computed_and_train_serially():
    x, y = _classes(2)
    params = dict(hidden_layer_sizes=(10,), batch_size=32, random_state=1, max_iter=15)
    xd, yd = _dask(x, y)
    ours = _quiet(MLPClassifier(**params), "fit", xd, yd)  # no client, no default client
    theirs = _quiet(SKClassifier(**params), "fit", x, y)
    assert _relative(ours, theirs) < 1e-9 and not hasattr(ours.result_, "stats")
    w = np.random.default_rng(1).uniform(0.5, 2.0, len(x))
    weighted = _quiet(MLPClassifier(**params), "fit", xd, yd, sample_weight=da.from_array(w, 50))
    assert _relative(weighted, _quiet(SKClassifier(**params), "fit", x, y, sample_weight=w)) < 1e-9
    proba = ours.predict_proba(xd)
    assert isinstance(proba, da.Array)
    np.testing.assert_allclose(proba.compute(), theirs.predict_proba(x), rtol=1e-9, atol=1e-15)


def test_partial_fit_goes_on_with_dask_data_as_with_arrays(client):
    x, y = _classes(3)
    xd, yd = _dask(x, y)
    params = dict(hidden_layer_sizes=(8,), batch_size=40, random_state=2)
    classes = ["ash", "birch", "cedar"]
    ours = MLPClassifier(client=client, **params).partial_fit(xd[:140], yd[:140], classes=classes)
    ours.partial_fit(xd, yd)
    theirs = SKClassifier(**params).partial_fit(x[:140], y[:140], classes=classes)
    theirs.partial_fit(x, y)
    assert _relative(ours, theirs) < 1e-9 and ours.t_ == theirs.t_
    with pytest.raises(EstimatorError, match="has classes not in"):
        ours.partial_fit(xd, da.from_array(np.array(["oak"] * len(x)), chunks=CHUNK))


def test_predictions_hold_the_model_once_and_log_proba_and_scores_match(client):
    x, y = _classes(3)
    xd, yd = _dask(x, y)
    params = dict(hidden_layer_sizes=(10,), batch_size=32, random_state=1, max_iter=10)
    ours = _quiet(MLPClassifier(client=client, **params), "fit", xd, yd)
    theirs = _quiet(SKClassifier(**params), "fit", x, y)
    proba = ours.predict_proba(xd)
    keys = [k for k in dict(proba.__dask_graph__()) if "rpm-model" in str(k)]
    assert len(keys) == 1 and proba.numblocks == (3, 1)  # one model, one task per chunk
    log = client.compute(ours.predict_log_proba(xd), sync=True)
    np.testing.assert_allclose(log, theirs.predict_log_proba(x), rtol=1e-9)
    w = np.random.default_rng(0).uniform(0.5, 2.0, len(x))
    wd = da.from_array(w, chunks=50)  # chunked unlike X: aligned
    assert ours.score(xd, yd, sample_weight=wd) == pytest.approx(
        theirs.score(x, y, sample_weight=w), rel=1e-12
    )
    xr_, yr_ = _regression(2)
    reg = _quiet(MLPRegressor(client=client, **params), "fit", *_dask(xr_, yr_))
    sk = _quiet(SKRegressor(**params), "fit", xr_, yr_)
    assert _relative(reg, sk) < 1e-9
    assert reg.score(*_dask(xr_, yr_), sample_weight=w) == pytest.approx(
        sk.score(xr_, yr_, sample_weight=w), rel=1e-9
    )


def test_xarray_and_a_zarr_store_train_and_predict(client, tmp_path):
    x, y = _regression(2)
    params = dict(hidden_layer_sizes=(10,), batch_size=32, random_state=1, max_iter=10)
    theirs = _quiet(SKRegressor(**params), "fit", x, y)
    ds = xr.Dataset({"x": (("sample", "input"), x), "d": (("sample", "output"), y)})
    ds = ds.chunk({"sample": CHUNK})
    ours = _quiet(MLPRegressor(client=client, **params), "fit", ds["x"], ds["d"])
    assert _relative(ours, theirs) < 1e-9
    pytest.importorskip("zarr")
    store = str(tmp_path / "train.zarr")
    ds.to_zarr(store)
    ours = _quiet(MLPRegressor(client=client, **params), "fit", store)  # x and d of the store
    assert _relative(ours, theirs) < 1e-9 and ours.result_.stats["dask"]["chunks"] == 3
    pred = client.compute(ours.predict(store), sync=True)
    np.testing.assert_allclose(pred, theirs.predict(x), rtol=1e-9, atol=1e-12)


def test_cnn_trains_predicts_and_scores_dask_images_on_the_workers(client):
    rng = np.random.default_rng(0)
    images, labels = rng.normal(size=(60, 1, 6, 6)), rng.integers(0, 3, 60)
    net = [{"conv": 2, "kernel": 3}, "relu", "flatten", {"linear": 3}]
    kw = dict(network=net, max_iter=3, random_state=0, batch_size=16, progress=False)
    xd = da.from_array(images, chunks=(20, 1, 6, 6))
    yd = da.from_array(labels, chunks=20)
    ours = _quiet(CNNClassifier(client=client, **kw), "fit", xd, yd)
    assert ours.result_.stats["dask"]["chunks"] == 3  # trained where the chunks are
    with pytest.raises(EstimatorError, match="X has dtype <U32; the inputs must be numbers"):
        CNNClassifier(client=client, **kw).fit(xd.astype(str), yd)
    arrays = _quiet(CNNClassifier(client=client, **kw), "fit", images, labels)
    for a, b in zip(ours.model_.params, arrays.model_.params):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-14)
    proba = ours.predict_proba(xd)
    assert isinstance(proba, da.Array) and proba.chunks == ((20, 20, 20), (3,))
    np.testing.assert_allclose(
        client.compute(proba, sync=True), arrays.predict_proba(images), rtol=1e-10
    )
    assert ours.score(xd, yd) == pytest.approx(arrays.score(images, labels), rel=1e-12)


@pytest.mark.parametrize("name", ["classifier-adam", "regressor-sgd-early-stopping"])
def test_sample_weight_with_dask_data_on_a_cluster_equals_scikit_learn(client, name):
    sk_class, our_class, params, x, y = _case(name)
    w = np.random.default_rng(5).uniform(0.5, 2.0, len(x))
    theirs = _quiet(sk_class(**params), "fit", x, y, sample_weight=w)
    assert _relative(theirs, _quiet(sk_class(**params), "fit", x, y)) > 1e-4  # the weights matter
    xd, yd = _dask(x, y)
    wd = da.from_array(w, chunks=50)  # chunked unlike X: aligned
    ours = _quiet(our_class(client=client, **params), "fit", xd, yd, sample_weight=wd)
    assert _relative(ours, theirs) < 1e-9 and ours.result_.stats["dask"]["chunks"] == 3
    np.testing.assert_allclose(ours.loss_curve_, theirs.loss_curve_, rtol=1e-9)
    if params.get("early_stopping"):  # the held-out rows keep their weights, as scikit-learn's
        np.testing.assert_allclose(ours.validation_scores_, theirs.validation_scores_, rtol=1e-9)


def test_bad_dask_input_is_refused_with_what_is_valid(client):
    x, y = _classes(3)
    xd, yd = _dask(x, y)
    est = MLPClassifier(client=client, hidden_layer_sizes=(4,), max_iter=2)
    with pytest.raises(EstimatorError, match="1-D class labels from dask"):
        est.fit(xd, da.zeros((len(x), 3), chunks=CHUNK))
    with pytest.raises(EstimatorError, match="inputs must be numbers"):
        est.fit(xd.astype(str), yd)
    with pytest.raises(DataError, match="x has 200 samples and d 150"):
        est.fit(xd, yd[:150])
    _quiet(est, "fit", xd, yd)
    with pytest.raises(EstimatorError, match="X has 7 features, but MLPClassifier is expecting 8"):
        est.partial_fit(xd[:, :7], yd)
    with pytest.raises(ValueError, match="X has 7 features"):
        est.predict(xd[:, :7])
