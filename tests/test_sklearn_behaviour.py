"""scikit-learn's MLP behaviour beyond the solvers (issue 35): sample weights, sparse and float32
input, identity units, the Poisson loss, the class checks, divergence with early stopping and
scikit-learn's printed lines - each exact on a cluster.

Every new option of :func:`dask_rpm.fit` equals :func:`dask_rpm.fit_serial` on a one-column and a
two-column plan of a heterogeneous cluster, and through a whole remap: to 1e-10 in float64, to
1e-4 (relative) in float32. The estimators equal scikit-learn's own, fitted in the same test,
serially and on the cluster. Each problem is first shown to be well conditioned (a 1e-15 change of
the initial weights moves the serial result by less than 1e-12), so 1e-10 is a meaningful check.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

pytest.importorskip("sklearn")
sparse = pytest.importorskip("scipy.sparse")

from distributed import Client  # noqa: E402
from sklearn.datasets import (  # noqa: E402
    make_classification,
    make_multilabel_classification,
    make_regression,  # noqa: E402
)
from sklearn.exceptions import ConvergenceWarning  # noqa: E402
from sklearn.neural_network import MLPClassifier as SKClassifier  # noqa: E402
from sklearn.neural_network import MLPRegressor as SKRegressor  # noqa: E402

import dask_rpm  # noqa: E402
from dask_rpm import MLPClassifier, MLPRegressor  # noqa: E402
from dask_rpm.drpm.remap import whole_remap  # noqa: E402
from dask_rpm.engine import fit  # noqa: E402
from dask_rpm.engine.callbacks import TrainingCallback  # noqa: E402
from dask_rpm.engine.samples import ColumnData, SampleSource  # noqa: E402
from dask_rpm.nn.data import DataError  # noqa: E402
from dask_rpm.nn.kernels import init_weights  # noqa: E402
from dask_rpm.nn.serial import fit_serial  # noqa: E402
from dask_rpm.plan.partition import Plan  # noqa: E402

S, N, M, L = 60, 7, 9, 3
RTOL = 1e-10


@pytest.fixture(scope="module")
def client():
    """Two EMULATED workers of speeds 1 and 0.5, in this process; not the default client."""
    with dask_rpm.local_cluster([1.0, 0.5], processes=False) as cluster:
        with Client(cluster, set_as_default=False) as c:
            yield c


def _plan(layout: str, bias: bool) -> Plan:
    """One column of both workers (hidden rows split), or two columns (samples split)."""
    n, m = N + bias, M + bias
    if layout == "1col":
        return Plan.from_columns([[0, 1]], [S], [[4, m - 4]], shape=(n, m, L))
    return Plan.from_columns([[0], [1]], [23, S - 23], [[m], [m]], shape=(n, m, L))


class _WholeRemap(TrainingCallback):
    """A whole remap onto other abilities after iteration ``at`` (the engine's own remap path)."""

    def __init__(self, at: int) -> None:
        self.at, self.done = at, False

    def boundary(self, done: int) -> int | None:
        return self.at - done if done < self.at else None

    async def after_block(self, info):
        if info.iteration == self.at and not self.done:
            self.done = True
            await info.driver.remap(whole_remap(info.driver.plan, [0.3, 1.0]), "whole")
        return None


def _data(case: str):
    rng = np.random.default_rng(3)
    x = rng.normal(size=(S, N))
    if case == "sparse":
        x[rng.random(x.shape) < 0.7] = 0.0
        x = sparse.csr_matrix(x)
    if case == "poisson":
        return x, rng.poisson(np.exp(0.3 * x[:, :L]) + 0.5).astype(float)
    if case == "float32":
        return x.astype(np.float32), rng.integers(0, L, size=S)
    return x, rng.integers(0, L, size=S)


#: one new option each (with the options that go with it: scikit-learn's mean reduction, L2)
CASES = {
    "sample_weight": dict(
        loss="cross-entropy",
        sample_weight=np.random.default_rng(4).integers(0, 4, size=S).astype(float),
        reduction="mean",
        alpha=0.01,
        optimizer="adam",
        learning_rate=1e-2,
    ),
    "sparse": dict(loss="cross-entropy", activation="relu", optimizer="adam", learning_rate=1e-2),
    "identity": dict(
        loss="cross-entropy", activation="identity", optimizer="momentum", learning_rate=1e-3
    ),
    "poisson": dict(loss="poisson", activation="tanh", optimizer="adam", learning_rate=1e-2),
    "float32": dict(loss="cross-entropy", dtype="float32", optimizer="adam", learning_rate=1e-2),
}


def _kw(case: str, batch: int | None) -> dict:
    return dict(
        hidden=M, iterations=12, batch_size=batch, bias=True, seed=0, shuffle=True, **CASES[case]
    )


def _assert_well_conditioned(x, d, kw):
    """A 1e-15 relative change of the initial weights must not grow beyond 1e-12 serially."""
    W0, V0 = init_weights(N, M, L, seed=0, scale=0.1)
    base = fit_serial(x, d, **dict(kw, init=(W0, V0))).params
    moved = fit_serial(x, d, **dict(kw, init=(W0 * (1 + 1e-15), V0))).params
    change = max(float(np.abs(p - q).max() / np.abs(p).max()) for p, q in zip(base, moved))
    assert change < 1e-12, f"ill-conditioned ({change:.1e}): the comparison would mean nothing"


@pytest.mark.parametrize("layout", ["1col", "2col"])
@pytest.mark.parametrize("batch", [None, 16])
@pytest.mark.parametrize("case", list(CASES))
def test_new_options_equal_fit_serial_on_every_plan(client, case, batch, layout):
    x, d = _data(case)
    kw = _kw(case, batch)
    if kw.get("dtype") != "float32":
        _assert_well_conditioned(x, d, kw)
    ref = fit_serial(x, d, **kw)
    r = fit(x, d, mapping=_plan(layout, True), client=client, interval=5, progress="none", **kw)
    rtol = 1e-4 if kw.get("dtype") == "float32" else RTOL
    assert r.params[0].dtype == ref.params[0].dtype == np.dtype(kw.get("dtype", "float64"))
    for ours, theirs in zip(r.params, ref.params):
        np.testing.assert_allclose(ours, theirs, rtol=rtol, atol=rtol * np.abs(theirs).max())
    np.testing.assert_allclose(r.history["error"].values, ref.errors, rtol=rtol)


@pytest.mark.parametrize("case", ["sample_weight", "sparse", "poisson"])
def test_new_options_equal_fit_serial_through_a_whole_remap_two_layers(client, case):
    x, d = _data(case)
    kw = dict(_kw(case, 16), hidden=(M, 5), iterations=14)
    ref = fit_serial(x, d, **kw)
    remap = _WholeRemap(6)
    r = fit(x, d, mapping="srpm", client=client, interval=3, callbacks=[remap], **kw)
    assert remap.done
    for ours, theirs in zip(r.params, ref.params):
        np.testing.assert_allclose(ours, theirs, rtol=RTOL, atol=RTOL * np.abs(theirs).max())


def test_weighted_sparse_run_resumes_from_a_checkpoint_as_if_uninterrupted(client):
    """Stop at a checkpoint, resume on another plan: the weights of fit_serial's run (the
    batches' weight sums come from the recipe, the same after a resume)."""
    x, d = _data("sparse")
    w = np.random.default_rng(5).integers(0, 4, size=S).astype(float)
    kw = dict(_kw("sparse", 16), sample_weight=w, reduction="mean", alpha=0.01, iterations=16)
    saved: list = []
    first = fit(
        x,
        d,
        mapping=_plan("1col", True),
        client=client,
        interval=4,
        checkpoint_every=8,
        on_checkpoint=saved.append,
        should_stop=lambda: len(saved) >= 1,
        progress="none",
        **kw,
    )
    assert first.stopped and saved[-1]["iteration"] == 8
    r = fit(x, d, mapping=_plan("2col", True), client=client, resume=saved[-1], **kw)
    ref = fit_serial(x, d, **kw)
    for ours, theirs in zip(r.params, ref.params):
        np.testing.assert_allclose(ours, theirs, rtol=RTOL, atol=RTOL * np.abs(theirs).max())


def test_sample_weight_is_refused_with_what_is_valid():
    x, d = _data("identity")
    kw = dict(hidden=3, iterations=1, loss="cross-entropy")
    for bad, match in [
        (np.ones(S - 1), r"sample_weight has shape \(59,\)"),
        (-np.ones(S), "finite and >= 0"),
        (np.zeros(S), "zero for every sample"),
    ]:
        with pytest.raises(DataError, match=match):
            fit_serial(x, d, sample_weight=bad, **kw)
    with pytest.raises(DataError, match="Poisson loss needs targets >= 0"):
        fit_serial(x, -np.ones((S, 2)), hidden=3, iterations=1, loss="poisson")


# ------------------------------------------------------------------ the estimators: scikit-learn's
def _quiet(est, *args, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return est.fit(*args, **kw)


def _relative(a, b):
    pairs = zip(a.coefs_ + a.intercepts_, b.coefs_ + b.intercepts_)
    return max(float(np.max(np.abs(p - q)) / np.max(np.abs(p))) for p, q in pairs)


def _estimator_cases():
    xc, yc = make_classification(120, 10, n_informative=5, n_classes=3, random_state=0)
    xr, yr = make_regression(120, 6, n_targets=2, noise=0.1, random_state=0)
    sw = np.random.RandomState(0).randint(0, 4, 120).astype(float)
    xs = sparse.random(120, 30, density=0.2, random_state=0, format="csr")
    ys = (np.asarray(xs.sum(axis=1)).ravel() > 3).astype(int)
    counts = np.random.RandomState(1).poisson(np.exp(0.3 * xr[:, 0] + 1)).astype(float)
    base = dict(hidden_layer_sizes=(8,), max_iter=12, random_state=0, batch_size=32)
    return {
        "weights-early-stopping": (
            "classifier",
            dict(base, early_stopping=True, alpha=0.01),
            xc,
            yc,
            sw,
        ),
        "weights-sgd-two-layers": (
            "regressor",
            dict(base, hidden_layer_sizes=(8, 5), solver="sgd", alpha=0.1),
            xr,
            yr / 100,
            sw,
        ),
        "sparse-csc": ("classifier", dict(base, early_stopping=True), xs.tocsc(), ys, None),
        "identity": ("regressor", dict(base, activation="identity"), xr, yr / 100, None),
        "poisson": (
            "regressor",
            dict(base, loss="poisson", learning_rate_init=0.01),
            xr,
            counts,
            sw,
        ),
    }


ESTIMATOR_CASES = _estimator_cases()


@pytest.mark.parametrize("name", list(ESTIMATOR_CASES))
def test_estimators_equal_scikit_learns_serially_and_on_the_cluster(client, name):
    kind, params, x, y, sw = ESTIMATOR_CASES[name]
    sk, ours = (
        (SKClassifier, MLPClassifier) if kind == "classifier" else (SKRegressor, MLPRegressor)
    )
    theirs = _quiet(sk(**params), x, y, sample_weight=sw)
    serial = _quiet(ours(**params), x, y, sample_weight=sw)
    on_cluster = _quiet(ours(client=client, **params), x, y, sample_weight=sw)
    assert _relative(theirs, serial) < 1e-9
    assert _relative(serial, on_cluster) < 1e-10
    for est in (serial, on_cluster):
        assert est.n_iter_ == theirs.n_iter_
        np.testing.assert_allclose(est.loss_curve_, theirs.loss_curve_, rtol=1e-9)
        if theirs.validation_scores_ is not None:
            np.testing.assert_allclose(est.validation_scores_, theirs.validation_scores_)


def test_float32_trains_in_float32_on_the_cluster(client):
    x, y = make_classification(100, 8, n_classes=3, n_informative=4, random_state=1)
    x = x.astype(np.float32)
    params = dict(hidden_layer_sizes=(6, 4), max_iter=8, random_state=0, batch_size=25)
    theirs = _quiet(SKClassifier(**params), x, y)
    serial = _quiet(MLPClassifier(**params), x, y)
    on_cluster = _quiet(MLPClassifier(client=client, **params), x, y)
    for est in (serial, on_cluster):
        assert all(c.dtype == np.float32 for c in est.coefs_ + est.intercepts_)
        assert est.predict_proba(x).dtype == np.float32
        assert _relative(theirs, est) < 1e-4
    reg = _quiet(MLPRegressor(client=client, **params), x, x[:, 0] * 2)
    assert reg.predict(x).dtype == np.float32


def test_a_column_keeps_its_sparse_rows_sparse():
    """What a worker does with the CSR rows the driver scatters (a column's slice, or the whole
    training set for mini-batches): it keeps them CSR, bias input appended, batch after batch."""
    x, d = _data("sparse")
    for source, cut, batch in [
        (SampleSource("slice", x=x[23:], d=np.ones((S - 23, L))), (23, S), None),
        (SampleSource("arrays", x=x, d=np.ones((S, L))), (0, 23), 16),
    ]:
        rec = fit_serial(x, d, **_kw("sparse", batch)).recipe
        data = ColumnData(source, cut, rec.schedule, rec.net, "float64")
        xb, db = data.batch(1)
        assert sparse.issparse(xb) and xb.format == "csr" and xb.shape[1] == N + 1
        assert np.all(xb[:, -1].toarray() == 1.0) and xb.shape[0] == db.shape[0]


# ------------------------------------------------------------------ the class checks
def test_partial_fit_checks_classes_as_scikit_learn():
    x, y = make_classification(40, 4, n_informative=3, n_redundant=0, n_classes=3, random_state=0)
    clf = MLPClassifier(solver="sgd", max_iter=1)
    clf.partial_fit(
        x[:1], y[:1], None, [0, 1, 2]
    )  # scikit-learn's order: X, y, sample_weight, classes
    with pytest.raises(ValueError, match=r"`classes=\[1, 2, 3\]` is not the same as on last call"):
        clf.partial_fit(x, y, classes=[1, 2, 3])
    with pytest.raises(ValueError, match=r"`y` has classes not in `self.classes_`"):
        clf.partial_fit(x, y + 5)
    with pytest.raises(ValueError, match="classes must be passed on the first call"):
        MLPClassifier().partial_fit(x, y)
    assert not hasattr(MLPClassifier(solver="lbfgs"), "partial_fit")


def test_warm_start_with_other_classes_is_refused():
    x, y = make_classification(60, 4, n_informative=3, n_redundant=0, n_classes=3, random_state=0)
    clf = _quiet(MLPClassifier(hidden_layer_sizes=3, warm_start=True, max_iter=2), x, y)
    with pytest.raises(ValueError, match=r"warm_start can only be used where `y` has the same"):
        clf.fit(x, np.minimum(y, 1))


def test_multilabel_partial_fit_equals_scikit_learn():
    x, y = make_multilabel_classification(n_samples=50, random_state=0, return_indicator=True)
    params = dict(solver="sgd", hidden_layer_sizes=20, activation="logistic", random_state=0)
    theirs, ours = SKClassifier(**params), MLPClassifier(**params)
    for _ in range(5):
        theirs.partial_fit(x, y, classes=[0, 1, 2, 3, 4])
        ours.partial_fit(x, y, classes=[0, 1, 2, 3, 4])
    assert _relative(theirs, ours) < 1e-9
    assert np.array_equal(ours.predict(x), theirs.predict(x))


def test_one_class_is_accepted_as_scikit_learn_accepts_it():
    x = np.random.default_rng(0).normal(size=(12, 3))
    clf = _quiet(MLPClassifier(hidden_layer_sizes=3, max_iter=3), x, np.full(12, 7))
    assert list(clf.classes_) == [7] and set(clf.predict(x)) == {7}


def test_validation_messages_are_scikit_learns():
    with pytest.raises(ValueError, match=r"Classes with too few members are: \['True'\]"):
        MLPClassifier(early_stopping=True).fit([[1, 2], [2, 3], [3, 4], [4, 5]], [0, 0, 0, 1])
    with pytest.raises(ValueError, match="The validation set is too small"):
        MLPRegressor(early_stopping=True).fit([[1.0], [2.0]], [1.0, 2.0])


def test_divergence_with_early_stopping_ends_on_the_best_weights(client):
    x, y = make_regression(80, 4, random_state=0)
    params = dict(
        hidden_layer_sizes=20,
        activation="identity",
        solver="sgd",
        learning_rate_init=1.0,
        max_iter=8,
        early_stopping=True,
        random_state=0,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = SKRegressor(**params).fit(x, y)
        serial = MLPRegressor(**params).fit(x, y)
        on_cluster = MLPRegressor(client=client, **params).fit(x, y)
    for est in (serial, on_cluster):
        assert np.isnan(est.validation_scores_[-1]) and est.n_iter_ == theirs.n_iter_
        assert all(np.isfinite(c).all() for c in est.coefs_)
        assert _relative(theirs, est) < 1e-9


# ------------------------------------------------------------------ printed lines
def test_verbose_prints_scikit_learns_lines_and_nothing_else(client, capsys):
    x, y = make_classification(60, 4, n_informative=3, n_redundant=0, random_state=0)
    _quiet(MLPClassifier(hidden_layer_sizes=3, max_iter=2, client=client), x, y)
    out, err = capsys.readouterr()
    assert out == "" and err == ""
    _quiet(MLPClassifier(hidden_layer_sizes=3, max_iter=2, client=client, verbose=True), x, y)
    out, _ = capsys.readouterr()
    assert "Iteration 1, loss = " in out and "Iteration 2, loss = " in out
    est = MLPClassifier(hidden_layer_sizes=3, max_iter=50, tol=10.0, n_iter_no_change=1)
    _quiet(est.set_params(verbose=True), x, y)
    out, _ = capsys.readouterr()
    assert "for 1 consecutive epochs. Stopping." in out


def test_identity_and_poisson_models_save_and_export(tmp_path):
    torch = pytest.importorskip("torch")
    x, y = make_regression(60, 4, random_state=0)
    for params, target in [
        (dict(activation="identity"), y),
        (dict(loss="poisson"), np.abs(y) / 50),
    ]:
        est = _quiet(MLPRegressor(hidden_layer_sizes=(5,), max_iter=3, **params), x, target)
        back = dask_rpm.MLPModel.load(est.save(tmp_path / "m.nc", overwrite=True))
        np.testing.assert_allclose(back.predict(x).ravel(), est.predict(x), rtol=1e-12)
        out = est.model_.to_torch()(torch.from_numpy(x)).detach().numpy().ravel()
        np.testing.assert_allclose(out, est.predict(x), rtol=1e-12)
