"""``solver="lbfgs"``: scikit-learn's model, serially and on a cluster; the cluster's objective.

The estimators' lbfgs runs scipy's L-BFGS-B with scikit-learn's options on the client
(:mod:`dask_rpm.estimators.lbfgs`); the objective is evaluated serially
(:class:`dask_rpm.nn.objective.SerialObjective`) or on the cluster by rectangles
(:class:`dask_rpm.engine.objective.ClusterObjective`). Checked here: the fitted
``coefs_`` / ``intercepts_`` equal scikit-learn's own lbfgs to rounding on small
well-conditioned problems (and that they are: a rounding-sized change of the start stays
rounding-sized), the cluster's objective equals the serial one on plans of one column, of
several columns and of both, and ``max_iter``, ``max_fun`` and ``tol`` stop where
scikit-learn's do.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

pytest.importorskip("sklearn")

from distributed import Client
from sklearn.datasets import load_iris, make_regression
from sklearn.exceptions import ConvergenceWarning
from sklearn.neural_network import MLPClassifier as SKClassifier
from sklearn.neural_network import MLPRegressor as SKRegressor
from sklearn.preprocessing import LabelBinarizer, StandardScaler

import dask_rpm
from dask_rpm.engine.objective import ClusterObjective
from dask_rpm.estimators import lbfgs
from dask_rpm.nn.network import Network
from dask_rpm.nn.objective import SerialObjective
from dask_rpm.nn.options import TrainingOptions

SPEEDS = [1.0, 0.5, 0.25]


@pytest.fixture(scope="module")
def client():
    # not the default client: the other tests of this process keep training serially
    with (
        dask_rpm.local_cluster(SPEEDS, processes=False) as cluster,
        Client(cluster, set_as_default=False) as c,
    ):
        yield c


def _iris():
    X, y = load_iris(return_X_y=True)
    return StandardScaler().fit_transform(X), y


def _regression(targets: int = 2):
    X, y = make_regression(80, 4, n_targets=targets, noise=1.0, random_state=0)
    return X, y / y.std()


def _fit_both(sk_cls, ours_cls, X, y, client=None, **params):
    # on a cluster, planned by the workers' EMULATED speeds
    where = {} if client is None else {"client": client, "abilities": SPEEDS}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        theirs = sk_cls(solver="lbfgs", random_state=0, **params).fit(X, y)
        ours = ours_cls(solver="lbfgs", random_state=0, **where, **params).fit(X, y)
    return theirs, ours


def _assert_same_model(theirs, ours, rtol=1e-8):
    assert ours.n_iter_ == theirs.n_iter_
    assert ours.loss_ == pytest.approx(theirs.loss_, rel=1e-10)
    for a, b in zip(theirs.coefs_ + theirs.intercepts_, ours.coefs_ + ours.intercepts_):
        np.testing.assert_allclose(b, a, rtol=rtol, atol=rtol * np.abs(a).max())


CASES = [
    (SKClassifier, dask_rpm.MLPClassifier, _iris, dict(hidden_layer_sizes=(5,), activation="logistic", alpha=1e-3)),
    (SKClassifier, dask_rpm.MLPClassifier, _iris, dict(hidden_layer_sizes=(6, 4), activation="tanh")),
    (SKRegressor, dask_rpm.MLPRegressor, _regression, dict(hidden_layer_sizes=(8,), activation="relu", alpha=1e-2)),
]  # fmt: skip


def _start(X, Y, hidden, activation):
    """scikit-learn's initial weights for ``random_state=0``: Glorot uniform, every layer's
    coefficients then its intercepts (``_init_coef``)."""
    rs, factor = np.random.RandomState(0), 2.0 if activation == "logistic" else 6.0
    units = [X.shape[1], *hidden, Y.shape[1]]
    coefs, intercepts = [], []
    for fan_in, fan_out in zip(units[:-1], units[1:]):
        bound = np.sqrt(factor / (fan_in + fan_out))
        coefs.append(rs.uniform(-bound, bound, (fan_in, fan_out)))
        intercepts.append(rs.uniform(-bound, bound, fan_out))
    return coefs, intercepts


def test_a_rounding_sized_change_of_the_start_stays_rounding_sized():
    # the problems below are well conditioned for lbfgs's 30 iterations: starting 1e-13 away
    # (relative) ends at most 1e-9 away (an amplification of at most 1e4: rounding's 1e-16 stays
    # below 1e-12), so rtol 1e-8 against scikit-learn means the same model
    for _, ours_cls, data, params in CASES:
        X, y = data()
        classifier = ours_cls is dask_rpm.MLPClassifier
        Y = LabelBinarizer().fit_transform(y).astype(float) if classifier else y
        act = {"logistic": "sigmoid"}.get(params["activation"], params["activation"])
        net = (
            Network(act, "cross-entropy", "softmax", True)
            if classifier
            else Network(act, "squared", "linear", True)
        )
        coefs, intercepts = _start(X, Y, params["hidden_layer_sizes"], params["activation"])
        noise = np.random.default_rng(1)
        ends = []
        for eps in (0.0, 1e-13):
            start = [c * (1 + eps * noise.standard_normal(c.shape)) for c in coefs]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ConvergenceWarning)
                out = lbfgs.fit(
                    X,
                    Y,
                    start,
                    intercepts,
                    net,
                    params.get("alpha", 1e-4),
                    client=None,
                    cluster={},
                    max_iter=30,
                    max_fun=15000,
                    tol=1e-4,
                    verbose=0,
                )
            ends.append(np.concatenate([a.ravel() for a in (*out.coefs, *out.intercepts)]))
        assert np.abs(ends[1] - ends[0]).max() <= 1e-9 * np.abs(ends[0]).max()


@pytest.mark.parametrize("case", range(len(CASES)))
def test_serial_lbfgs_is_scikit_learns_model(case):
    sk_cls, ours_cls, data, params = CASES[case]
    theirs, ours = _fit_both(sk_cls, ours_cls, *data(), max_iter=30, **params)
    _assert_same_model(theirs, ours)


@pytest.mark.parametrize("case", range(len(CASES)))
def test_cluster_lbfgs_is_scikit_learns_model(client, case):
    sk_cls, ours_cls, data, params = CASES[case]
    theirs, ours = _fit_both(sk_cls, ours_cls, *data(), client=client, max_iter=30, **params)
    _assert_same_model(theirs, ours)
    assert ours.result_.evaluations >= ours.n_iter_


def test_lbfgs_sets_scikit_learns_attributes():
    X, y = _iris()
    theirs, ours = _fit_both(
        SKClassifier, dask_rpm.MLPClassifier, X, y, hidden_layer_sizes=(5,), max_iter=20
    )
    for name in ("loss_curve_", "best_loss_", "validation_scores_", "best_validation_score_"):
        assert hasattr(ours, name) == hasattr(theirs, name)
    assert ours.t_ == theirs.t_ == 0
    assert not hasattr(ours, "partial_fit") and not hasattr(theirs, "partial_fit")
    assert hasattr(dask_rpm.MLPClassifier(solver="adam"), "partial_fit")
    assert ours.model_ is not None and ours.stopped_  # scipy's reason, e.g. the iteration limit
    # warm_start goes on from the fitted weights, as scikit-learn's
    for est in (theirs, ours):
        est.set_params(warm_start=True, max_iter=10)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            est.fit(X, y)
    _assert_same_model(theirs, ours)


def _objective_options(net: Network, params, alpha: float) -> TrainingOptions:
    weights, biases = net.split_params(params)
    return TrainingOptions(
        hidden=tuple(w.shape[0] for w in weights[:-1]),
        init=(weights, biases),
        activation=net.activation,
        loss=net.loss,
        output=net.output,
        bias=True,
        optimizer="sgd",
        alpha=alpha,
        reduction="mean",
    )


@pytest.mark.parametrize(
    "samples,hidden,mapping,columns,net,outputs",
    [
        (150, (40,), "srpm", [2, 1], Network("sigmoid", "cross-entropy", "softmax", True), 3),
        (30, (40,), "srpm", [3], Network("relu", "cross-entropy", "softmax", True), 3),
        (150, (40,), "split-1d", [1, 1, 1], Network("tanh", "cross-entropy", "sigmoid", True), 1),
        (10, (40, 20), "srpm", [3], Network("tanh", "squared", "linear", True), 2),
        (30, (40, 20), "srpm", [2, 1], Network("relu", "squared", "linear", True), 2),
    ],
)
def test_the_clusters_objective_is_the_serial_one(
    client, samples, hidden, mapping, columns, net, outputs
):
    rng = np.random.default_rng(samples + len(hidden))
    X = rng.standard_normal((samples, 4))
    if net.loss == "squared":
        Y = rng.standard_normal((samples, outputs))
    elif outputs == 1:
        Y = (rng.random((samples, 1)) < 0.5).astype(float)
    else:
        Y = np.eye(outputs)[rng.integers(0, outputs, samples)]
    units = [4, *hidden, outputs]
    weights = [rng.uniform(-0.5, 0.5, (o, i)) for i, o in zip(units[:-1], units[1:])]
    params = net.join_params(weights, [rng.uniform(-0.5, 0.5, o) for o in units[1:]])
    alpha = 0.1
    scale = 1.0 / outputs if net.loss == "squared" else 1.0
    serial = SerialObjective(net.augment(X), Y, params, net, alpha, scale)
    options = _objective_options(net, params, alpha)
    with ClusterObjective(client, X, Y, options, mapping=mapping, abilities=SPEEDS) as cluster:
        assert sorted(len(c) for c in cluster.plan.columns) == sorted(columns)
        for k in range(3):  # new weights every evaluation: only they travel
            trial = [p * (1.0 + 0.1 * k) for p in params]
            loss, grads = cluster(trial)
            want_loss, want_grads = serial(trial)
            assert loss == pytest.approx(want_loss, rel=1e-12)
            for g, w in zip(grads, want_grads):
                np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12 * np.abs(w).max())


def _warned(est, X, y) -> bool:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        est.fit(X, y)
    return any(issubclass(w.category, ConvergenceWarning) for w in caught)


@pytest.mark.parametrize(
    "params",
    [
        dict(max_iter=5),  # stops at the iteration limit: warned
        dict(max_iter=200, max_fun=10),  # stops at the evaluation limit: warned
        dict(max_iter=200, tol=1e-2),  # converges first: not warned
    ],
)
def test_max_iter_max_fun_and_tol_stop_where_scikit_learns_do(params):
    X, y = _iris()
    theirs = SKClassifier(solver="lbfgs", hidden_layer_sizes=(5,), random_state=0, **params)
    ours = dask_rpm.MLPClassifier(solver="lbfgs", hidden_layer_sizes=(5,), random_state=0, **params)
    assert _warned(ours, X, y) == _warned(theirs, X, y) == ("tol" not in params)
    _assert_same_model(theirs, ours)
    if "max_fun" in params:
        assert ours.result_.evaluations <= params["max_fun"] + 1  # scipy's count: one may overrun
        assert ours.n_iter_ <= params["max_fun"]
    if "tol" in params:
        assert ours.n_iter_ < params["max_iter"]


def test_a_worker_lost_between_evaluations_costs_a_remap_and_the_same_value():
    # its own cluster: the module's keeps its three workers
    rng = np.random.default_rng(0)
    X, Y = rng.standard_normal((150, 4)), np.eye(3)[rng.integers(0, 3, 150)]
    net = Network("tanh", "cross-entropy", "softmax", True)
    weights = [rng.uniform(-0.5, 0.5, (40, 4)), rng.uniform(-0.5, 0.5, (3, 40))]
    biases = [rng.uniform(-0.5, 0.5, 40), rng.uniform(-0.5, 0.5, 3)]
    params = net.join_params(weights, biases)
    serial = SerialObjective(net.augment(X), Y, params, net, 0.1)
    with (
        dask_rpm.local_cluster(SPEEDS, processes=False) as cluster,
        Client(cluster, set_as_default=False) as c,
        ClusterObjective(
            c, X, Y, _objective_options(net, params, 0.1), mapping="srpm", abilities=SPEEDS
        ) as objective,
    ):
        assert sorted(len(col) for col in objective.plan.columns) == [1, 2]
        victim = objective.driver.addresses[objective.plan.columns[0][0]]
        c.retire_workers([victim])
        loss, grads = objective(params)  # on the two workers left
        assert len(objective.plan.planned_workers) == 2
    want_loss, want_grads = serial(params)
    assert loss == pytest.approx(want_loss, rel=1e-12)
    for g, w in zip(grads, want_grads):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12 * np.abs(w).max())
