"""dask_rpm.estimators: drop-ins for scikit-learn's MLPs - its checks, its parameters, and its model.

The same-model tests compare against scikit-learn's own ``MLPClassifier`` / ``MLPRegressor``
fitted in the same test with the same parameters: ``coefs_`` and ``intercepts_`` must agree to
1e-9 relative (float64), serially and on a 3-worker EMULATED cluster for every plan. Every
problem is first shown to be well conditioned: scikit-learn itself, started from a learning
rate changed by 1 part in 1e12, ends within 1e-7 of its own result (:func:`_sensitivity`), so
an agreement to 1e-9 says the arithmetic is the same, not that chaos happened to line up.
"""

from __future__ import annotations

import pickle
import warnings

import numpy as np
import pytest

pytest.importorskip("sklearn")

from sklearn.datasets import make_classification, make_regression  # noqa: E402
from sklearn.exceptions import ConvergenceWarning  # noqa: E402
from sklearn.neural_network import MLPClassifier as SKClassifier  # noqa: E402
from sklearn.neural_network import MLPRegressor as SKRegressor  # noqa: E402
from sklearn.utils._param_validation import InvalidParameterError  # noqa: E402
from sklearn.utils.estimator_checks import (  # noqa: E402
    check_param_validation,
    parametrize_with_checks,
)

from dask_rpm import MLPClassifier, MLPModel, MLPRegressor  # noqa: E402
from dask_rpm.estimators import EstimatorError  # noqa: E402


# scikit-learn's own estimator checks (fit/predict contracts, input validation, pickling, clone, ...)
@parametrize_with_checks(
    [
        MLPClassifier(hidden_layer_sizes=(16,), max_iter=100, learning_rate_init=0.01),
        MLPRegressor(hidden_layer_sizes=(16,), max_iter=100, learning_rate_init=0.01),
    ]
)
def test_scikit_learn_estimator_checks(estimator, check):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        check(estimator)


@pytest.mark.parametrize("estimator_class", [MLPClassifier, MLPRegressor])
def test_every_parameter_is_declared_and_checked_as_scikit_learn_does(estimator_class):
    """scikit-learn's check_param_validation (its own estimators' test, not in check_estimator):
    every parameter has a constraint in _parameter_constraints, and fit and partial_fit refuse a
    value of the wrong type or range with scikit-learn's InvalidParameterError."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        check_param_validation(estimator_class.__name__, estimator_class(max_iter=2))
    assert set(estimator_class._parameter_constraints) == set(estimator_class().get_params())


def _classes(k=3, s=240, seed=0):
    return make_classification(s, 8, n_informative=5, n_classes=k, random_state=seed)


def _regression(s=200, outputs=1, seed=0):
    x, y = make_regression(s, 6, n_targets=outputs, noise=0.1, random_state=seed)
    return x, y / 100.0


def _relative(ours, theirs):
    """Largest relative difference over coefs_ and intercepts_ (each array by its largest entry)."""
    pairs = zip(theirs.coefs_ + theirs.intercepts_, ours.coefs_ + ours.intercepts_)
    return max(float(np.max(np.abs(a - b)) / np.max(np.abs(a))) for a, b in pairs)


def _fit_quiet(est, x, y):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return est.fit(x, y)


def _sensitivity(sk_class, params, x, y):
    """How far scikit-learn's own fit moves when its learning rate changes by 1e-12 (relative)."""
    a = _fit_quiet(sk_class(**params), x, y)
    lr = params.get("learning_rate_init", 0.001) * (1 + 1e-12)
    b = _fit_quiet(sk_class(**{**params, "learning_rate_init": lr}), x, y)
    return _relative(a, b)


def _assert_same_model(ours, theirs):
    assert _relative(ours, theirs) < 1e-9
    assert ours.n_iter_ == theirs.n_iter_ and ours.t_ == theirs.t_
    np.testing.assert_allclose(ours.loss_curve_, theirs.loss_curve_, rtol=1e-9)
    assert ours.loss_ == pytest.approx(theirs.loss_, rel=1e-9)
    assert (ours.best_loss_ is None) == (theirs.best_loss_ is None)
    if theirs.best_loss_ is not None:
        assert ours.best_loss_ == pytest.approx(theirs.best_loss_, rel=1e-9)
    if theirs.validation_scores_ is not None:
        np.testing.assert_allclose(ours.validation_scores_, theirs.validation_scores_, rtol=1e-9)
    for name in ("n_layers_", "n_outputs_", "out_activation_"):
        assert getattr(ours, name) == getattr(theirs, name), name


#: (estimator kind, data, parameters) - every solver, schedule and stopping rule, both kinds
CASES = {
    "classifier-adam": ("classifier", 3, dict(max_iter=30)),
    "classifier-adam-early-stopping": ("classifier", 3, dict(max_iter=40, early_stopping=True)),
    "classifier-sgd-nesterov": ("classifier", 3, dict(solver="sgd", max_iter=30)),
    "classifier-sgd-invscaling": (
        "classifier",
        3,
        dict(solver="sgd", learning_rate="invscaling", nesterovs_momentum=False, max_iter=20),
    ),
    "classifier-sgd-adaptive-tol": (
        "classifier",
        3,
        dict(solver="sgd", learning_rate="adaptive", tol=1e-2, n_iter_no_change=2, max_iter=60),
    ),
    "binary-logistic-tanh": ("classifier", 2, dict(activation="tanh", max_iter=25)),
    "regressor-adam": ("regressor", 1, dict(max_iter=40)),
    "regressor-sgd-early-stopping": (
        "regressor",
        1,
        dict(solver="sgd", early_stopping=True, learning_rate_init=0.01, tol=1e-2, max_iter=40),
    ),
    "regressor-logistic-two-outputs": ("regressor", 2, dict(activation="logistic", max_iter=25)),
}


def _case(name):
    kind, k, extra = CASES[name]
    params = dict(hidden_layer_sizes=(10,), batch_size=32, random_state=1, **extra)
    if kind == "classifier":
        x, y = _classes(k)
        return SKClassifier, MLPClassifier, params, x, y
    x, y = _regression(outputs=k)
    return SKRegressor, MLPRegressor, params, x, y


@pytest.mark.parametrize("name", list(CASES))
def test_the_same_model_as_scikit_learn_serially(name):
    sk_class, our_class, params, x, y = _case(name)
    assert _sensitivity(sk_class, params, x, y) < 1e-7  # well conditioned (module docstring)
    theirs = _fit_quiet(sk_class(**params), x, y)
    ours = _fit_quiet(our_class(**params), x, y)
    _assert_same_model(ours, theirs)
    if params.get("early_stopping") or "tol" in params:
        assert ours.n_iter_ < params["max_iter"]  # the stopping rule fired, at the same epoch
    assert np.array_equal(ours.predict(x[:50]), theirs.predict(x[:50])) or np.allclose(
        ours.predict(x[:50]), theirs.predict(x[:50]), rtol=1e-9
    )
    if sk_class is SKClassifier:
        np.testing.assert_allclose(ours.predict_proba(x), theirs.predict_proba(x), rtol=1e-9)
    assert ours.score(x, y) == pytest.approx(theirs.score(x, y), rel=1e-9)


#: several hidden layers: (kind, data, hidden_layer_sizes, parameters) - depths 2 and 3, both
#: kinds, adam and sgd, every activation, early stopping (the best weights of every layer)
DEEP_CASES = {
    "classifier-2-adam-relu": ("classifier", 3, (10, 6), dict(max_iter=25)),
    "classifier-3-sgd-tanh": ("classifier", 3, (10, 8, 6), dict(solver="sgd", activation="tanh")),
    "binary-2-sgd-logistic": (
        "classifier",
        2,
        (8, 5),
        dict(solver="sgd", activation="logistic", learning_rate_init=0.05),
    ),
    "classifier-3-adam-logistic-early-stopping": (
        "classifier",
        3,
        (10, 8, 6),
        dict(activation="logistic", early_stopping=True, learning_rate_init=0.01, max_iter=40),
    ),
    "regressor-2-sgd-relu": ("regressor", 1, (10, 6), dict(solver="sgd", learning_rate_init=0.01)),
    "regressor-3-adam-tanh": ("regressor", 2, (10, 8, 6), dict(activation="tanh")),
    "regressor-2-adam-logistic": ("regressor", 1, (8, 5), dict(activation="logistic")),
}


def _deep_case(name):
    kind, k, hidden, extra = DEEP_CASES[name]
    params = dict(hidden_layer_sizes=hidden, batch_size=32, random_state=1, max_iter=20)
    params.update(extra)
    if kind == "classifier":
        x, y = _classes(k)
        return SKClassifier, MLPClassifier, params, x, y
    x, y = _regression(outputs=k)
    return SKRegressor, MLPRegressor, params, x, y


@pytest.mark.parametrize("name", list(DEEP_CASES))
def test_several_hidden_layers_are_scikit_learns_model_serially(name):
    sk_class, our_class, params, x, y = _deep_case(name)
    assert _sensitivity(sk_class, params, x, y) < 1e-7  # well conditioned (module docstring)
    theirs = _fit_quiet(sk_class(**params), x, y)
    ours = _fit_quiet(our_class(**params), x, y)
    assert [c.shape for c in ours.coefs_] == [c.shape for c in theirs.coefs_]
    assert [b.shape for b in ours.intercepts_] == [b.shape for b in theirs.intercepts_]
    assert ours.n_layers_ == len(params["hidden_layer_sizes"]) + 2
    assert _relative(ours, theirs) < 1e-12
    _assert_same_model(ours, theirs)
    if params.get("early_stopping"):
        assert ours.n_iter_ < params["max_iter"]  # stopped early: the best epoch's weights kept
    np.testing.assert_allclose(
        np.asarray(ours.predict(x), dtype=float), np.asarray(theirs.predict(x), dtype=float), 1e-9
    )
    if sk_class is SKClassifier:
        np.testing.assert_allclose(ours.predict_proba(x), theirs.predict_proba(x), rtol=1e-9)
    assert ours.score(x, y) == pytest.approx(theirs.score(x, y), rel=1e-9)
    back = pickle.loads(pickle.dumps(ours))
    assert np.array_equal(back.predict(x), ours.predict(x)) and back.model_ is None


def test_several_hidden_layers_warm_start_and_partial_fit_equal_scikit_learn(tmp_path):
    x, y = _classes()
    params = dict(hidden_layer_sizes=(7, 5, 4), random_state=3, batch_size=40, max_iter=4)
    theirs, ours = SKClassifier(warm_start=True, **params), MLPClassifier(warm_start=True, **params)
    for _ in range(3):
        _fit_quiet(theirs, x, y)
        _fit_quiet(ours, x, y)
    _assert_same_model(ours, theirs)
    theirs, ours = SKRegressor(**params), MLPRegressor(**params)
    xr, yr = _regression()
    for part in np.array_split(np.arange(len(xr)), 4):  # the optimizer goes on, every layer's
        theirs.partial_fit(xr[part], yr[part])
        ours.partial_fit(xr[part], yr[part])
    _assert_same_model(ours, theirs)
    with pytest.raises(EstimatorError, match="holds one hidden layer; this network has 3"):
        ours.save(tmp_path / "deep.nc")
    with pytest.raises(EstimatorError, match=r"goes on with the fitted network's hidden layers"):
        ours.partial_fit(xr, yr).set_params(hidden_layer_sizes=(7, 5)).partial_fit(xr, yr)


def test_the_same_warning_and_stop_message_as_scikit_learn():
    x, y = _classes()
    with pytest.warns(ConvergenceWarning, match=r"Maximum iterations \(3\) reached"):
        MLPClassifier(hidden_layer_sizes=(4,), max_iter=3, random_state=0).fit(x, y)
    est = MLPClassifier(
        hidden_layer_sizes=(4,), solver="sgd", tol=1.0, n_iter_no_change=1, random_state=0
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)  # it converged: no warning
        est.fit(x, y)
    # epoch 1 sets the best loss; epochs 2 and 3 do not beat it by tol: 2 > n_iter_no_change
    assert est.n_iter_ == 3 and "did not improve more than tol=1.000000" in est.stopped_


def test_warm_start_and_partial_fit_equal_scikit_learn():
    x, y = _classes()
    params = dict(hidden_layer_sizes=(6,), random_state=3, batch_size=40, max_iter=5)
    theirs, ours = SKClassifier(warm_start=True, **params), MLPClassifier(warm_start=True, **params)
    for _ in range(3):  # each fit goes on from the last one's weights with a new optimizer
        _fit_quiet(theirs, x, y)
        _fit_quiet(ours, x, y)
    _assert_same_model(ours, theirs)
    assert len(ours.loss_curve_) == 15
    theirs, ours = SKRegressor(**params), MLPRegressor(**params)
    xr, yr = _regression()
    for part in np.array_split(np.arange(len(xr)), 4):  # one epoch per call, the optimizer goes on
        theirs.partial_fit(xr[part], yr[part])
        ours.partial_fit(xr[part], yr[part])
    _assert_same_model(ours, theirs)
    theirs, ours = SKClassifier(**params), MLPClassifier(**params)
    for part in np.array_split(np.arange(len(x)), 3):
        theirs.partial_fit(x[part], y[part], classes=[0, 1, 2])
        ours.partial_fit(x[part], y[part], classes=[0, 1, 2])
    _assert_same_model(ours, theirs)
    with pytest.raises(ValueError, match="classes must be passed on the first call"):
        MLPClassifier().partial_fit(x, y)


def test_only_scikit_learns_and_dask_rpms_own_parameters():
    """dask_rpm's older names are gone; a float learning_rate or an int early_stopping is
    refused with scikit-learn's own error, as scikit-learn refuses it."""
    x, y = _classes(s=40)
    for name in ("hidden_units", "epochs", "seed", "optimizer"):
        with pytest.raises(TypeError, match=f"unexpected keyword argument '{name}'"):
            MLPClassifier(**{name: 5})
    for params, must in [
        (
            dict(learning_rate=0.01),
            r"learning_rate' parameter of MLPClassifier must be a str among",
        ),
        (dict(early_stopping=2), r"early_stopping' parameter of MLPClassifier must be an instance"),
    ]:
        for estimator in (SKClassifier, MLPClassifier):
            with pytest.raises(InvalidParameterError, match=must + r".* Got (0.01|2) instead\.$"):
                estimator(max_iter=1, **params).fit(x, y)
    ours = MLPClassifier(client=None, mapping="srpm", abilities=[1.0, 2.0], progress=False)
    assert set(ours.get_params()) == set(SKClassifier().get_params()) | {
        "client",
        "mapping",
        "abilities",
        "progress",
        "backend",
        "device",
    }
    assert set(MLPRegressor().get_params()) == set(SKRegressor().get_params()) | {
        "client",
        "mapping",
        "abilities",
        "progress",
        "backend",
        "device",
    }


def test_bad_input_is_refused_with_what_is_valid():
    x, y = _classes(s=40)
    must = "The '{}' parameter of MLPClassifier must be {}. Got {} instead"
    cases = [
        (dict(activation="softsign"), must.format("activation", "a str among .*", "'softsign'")),
        (dict(hidden_layer_sizes=()), r"hidden_layer_sizes must be > 0, .*got \(\)"),
        (dict(hidden_layer_sizes=(8, 0)), r"hidden_layer_sizes must be > 0, .*got \(8, 0\)"),
        (dict(hidden_layer_sizes=(0,)), r"hidden_layer_sizes must be > 0, .*got \(0,\)"),
        (dict(hidden_layer_sizes=(8, 2.5)), r"one positive integer per hidden layer"),
        (dict(learning_rate="cyclic"), must.format("learning_rate", "a str among .*", "'cyclic'")),
        (dict(alpha=-1.0), must.format("alpha", r"a float in the range \[0.0, inf\)", "-1.0")),
        (dict(batch_size=0), must.format("batch_size", r".*an int in the range \[1, inf\)", "0")),
        (
            dict(client="tcp://x"),
            must.format(
                "client", "None or an object implementing 'submit' and 'gather'", "'tcp://x'"
            ),
        ),
        (
            dict(mapping=3),
            must.format("mapping", "None, an instance of 'str' or an instance of '.*Plan'", "3"),
        ),
        (
            dict(progress="loud"),
            must.format("progress", "None, an instance of 'bool' .* or a str among .*", "'loud'"),
        ),
        (
            dict(abilities="fast"),
            must.format("abilities", "None, a str among {'probe'} or an array-like", "'fast'"),
        ),
        (dict(backend=1), must.format("backend", "None or an instance of 'str'", "1")),
    ]
    for params, message in cases:
        with pytest.raises(InvalidParameterError, match=message):
            MLPClassifier(max_iter=1, **params).fit(x, y)
    with pytest.raises(InvalidParameterError, match="The 'loss' parameter of MLPRegressor"):
        MLPRegressor(loss="absolute_error", max_iter=1).fit(x, x[:, 0])
    with pytest.raises(EstimatorError, match="partial_fit does not support early_stopping=True"):
        MLPClassifier(early_stopping=True).partial_fit(x, y, classes=[0, 1, 2])
    with pytest.warns(UserWarning, match="It is going to be clipped"):
        _fit_quiet(MLPClassifier(max_iter=1, batch_size=1000), x, y)
    est = _fit_quiet(MLPClassifier(hidden_layer_sizes=(2,), max_iter=2), x, y)
    with pytest.raises(ValueError, match="X has 3 features, but MLPClassifier is expecting 8"):
        est.predict(x[:, :3])
    with pytest.raises(EstimatorError, match="non-finite parameter weights"):
        _fit_quiet(
            MLPRegressor(solver="sgd", learning_rate_init=1e3, max_iter=20, random_state=0),
            x,
            x[:, 0] * 1e6,
        )


def test_n_iter_no_change_inf_never_stops_as_in_scikit_learn():
    x, y = _classes()
    params = dict(hidden_layer_sizes=(6,), solver="sgd", tol=1.0, n_iter_no_change=np.inf)
    params.update(max_iter=6, random_state=0)
    theirs = _fit_quiet(SKClassifier(**params), x, y)
    ours = _fit_quiet(MLPClassifier(**params), x, y)
    assert ours.n_iter_ == 6 and ours.stopped_ is None
    _assert_same_model(ours, theirs)


def test_saved_estimator_model_predicts_the_same(tmp_path):
    x, y = _classes(s=80)
    est = _fit_quiet(MLPClassifier(hidden_layer_sizes=(6,), max_iter=5, batch_size=16), x, y)
    back = MLPModel.load(est.save(tmp_path / "clf.nc"))
    np.testing.assert_allclose(back.predict_proba(x), est.predict_proba(x), rtol=1e-12)
    assert np.array_equal(back.predict(x), est.predict(x))
    xr, yr = _regression(s=80)
    reg = _fit_quiet(MLPRegressor(hidden_layer_sizes=(6,), max_iter=5, batch_size=16), xr, yr)
    back = MLPModel.load(reg.save(tmp_path / "reg.nc"))
    np.testing.assert_allclose(back.predict(xr)[:, 0], reg.predict(xr), rtol=1e-12)


def test_digits_with_two_hidden_layers_is_scikit_learns_model(capsys):
    """Digits (25 % stratified hold-out, standardized), hidden layers of 32 and 16 units, serially:
    the held-out accuracy is scikit-learn's own, because the model is."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    from sklearn.preprocessing import StandardScaler

    X, y = load_digits(return_X_y=True)
    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.25, random_state=0, stratify=y)
    scaler = StandardScaler().fit(Xtr)
    Xtr, Xte = scaler.transform(Xtr), scaler.transform(Xte)
    params = dict(hidden_layer_sizes=(32, 16), max_iter=30, random_state=0)
    theirs = _fit_quiet(SKClassifier(**params), Xtr, ytr)
    ours = _fit_quiet(MLPClassifier(**params), Xtr, ytr)
    acc = ours.score(Xte, yte)
    with capsys.disabled():
        print(
            f"\ndigits (32, 16): dask_rpm {acc:.3f} held out (serial), scikit-learn "
            f"{theirs.score(Xte, yte):.3f}; coefs_ differ by {_relative(ours, theirs):.1e} relative"
        )
    assert _relative(ours, theirs) < 1e-9
    assert acc == theirs.score(Xte, yte) and acc > 0.9


# ---------------------------------------------------------------------------
# On a local EMULATED heterogeneous cluster
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def emulated_client():
    """Three workers with EMULATED speeds 1.0, 0.7 and 0.5 (one machine; docs/emulation.md)."""
    from distributed import Client

    from dask_rpm import local_cluster

    with (
        local_cluster(speeds=[1.0, 0.7, 0.5], dashboard_address=":0") as cluster,
        Client(cluster) as client,
    ):
        yield client


@pytest.mark.parametrize(
    "name,mapping",
    [
        ("classifier-adam-early-stopping", "srpm"),  # one column: the hidden units split 3 ways
        ("classifier-sgd-adaptive-tol", "uniform"),  # three columns: the samples split 3 ways
        ("binary-logistic-tanh", "split-1d"),
        ("regressor-sgd-early-stopping", "uniform"),
    ],
)
def test_the_same_model_as_scikit_learn_on_a_cluster(name, mapping, emulated_client):
    sk_class, our_class, params, x, y = _case(name)
    theirs = _fit_quiet(sk_class(**params), x, y)
    ours = _fit_quiet(
        our_class(client=emulated_client, mapping=mapping, progress="none", **params), x, y
    )
    assert ours.result_.emulation and "EMULATED" in ours.result_.emulation  # trained on the cluster
    assert len(ours.result_.plan.planned_workers) == 3
    _assert_same_model(ours, theirs)


@pytest.mark.parametrize(
    "name,mapping",
    [("classifier-3-adam-logistic-early-stopping", "srpm"), ("regressor-2-sgd-relu", "uniform")],
)
def test_several_hidden_layers_on_a_cluster_are_scikit_learns_model(name, mapping, emulated_client):
    sk_class, our_class, params, x, y = _deep_case(name)
    theirs = _fit_quiet(sk_class(**params), x, y)
    ours = _fit_quiet(
        our_class(client=emulated_client, mapping=mapping, progress="none", **params), x, y
    )
    assert ours.result_.emulation and "EMULATED" in ours.result_.emulation  # trained on the cluster
    assert len(ours.result_.params) == len(params["hidden_layer_sizes"]) + 1
    _assert_same_model(ours, theirs)


def test_partial_fit_on_a_cluster_equals_scikit_learn(emulated_client):
    x, y = _classes()
    params = dict(hidden_layer_sizes=(6,), random_state=0, batch_size=30)
    theirs = SKClassifier(**params)
    ours = MLPClassifier(client=emulated_client, mapping="uniform", progress="none", **params)
    for part in np.array_split(np.arange(len(x)), 3):
        theirs.partial_fit(x[part], y[part], classes=[0, 1, 2])
        ours.partial_fit(x[part], y[part], classes=[0, 1, 2])
    _assert_same_model(ours, theirs)


def test_estimator_with_a_client_pickles_and_grid_searches_in_two_processes(emulated_client):
    from sklearn.model_selection import GridSearchCV

    x, y = _classes(s=120)
    est = MLPClassifier(
        hidden_layer_sizes=(4,), max_iter=5, random_state=0, client=emulated_client, progress="none"
    )
    back = pickle.loads(pickle.dumps(est))
    assert back.client is None and back.get_params()["max_iter"] == 5  # re-found when it trains
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        search = GridSearchCV(est, {"alpha": [1e-4, 1e-2]}, cv=2, n_jobs=2).fit(x, y)
        serial = GridSearchCV(
            SKClassifier(hidden_layer_sizes=(4,), max_iter=5, random_state=0),
            {"alpha": [1e-4, 1e-2]},
            cv=2,
        ).fit(x, y)
    # the same models, so the same scores as scikit-learn's own search
    np.testing.assert_allclose(
        search.cv_results_["mean_test_score"], serial.cv_results_["mean_test_score"], rtol=1e-12
    )


def test_digits_on_an_emulated_cluster_is_scikit_learns_model(emulated_client, capsys):
    """Digits (25 % stratified hold-out, standardized, 64 hidden units, 30 epochs): the held-out
    accuracy is scikit-learn's own (measured 0.964), because the model is."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    from sklearn.preprocessing import StandardScaler

    X, y = load_digits(return_X_y=True)
    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.25, random_state=0, stratify=y)
    scaler = StandardScaler().fit(Xtr)
    Xtr, Xte = scaler.transform(Xtr), scaler.transform(Xte)
    params = dict(hidden_layer_sizes=(64,), max_iter=30, random_state=0)
    theirs = _fit_quiet(SKClassifier(**params), Xtr, ytr)
    ours = _fit_quiet(
        MLPClassifier(client=emulated_client, mapping="srpm", progress="none", **params), Xtr, ytr
    )
    acc = ours.score(Xte, yte)
    with capsys.disabled():
        print(
            f"\ndigits: dask_rpm {acc:.3f} held out (EMULATED 3 workers), scikit-learn "
            f"{theirs.score(Xte, yte):.3f}; coefs_ differ by {_relative(ours, theirs):.1e} relative"
        )
    assert _relative(ours, theirs) < 1e-9
    assert acc == theirs.score(Xte, yte) and acc > 0.95


def test_verbose_prints_scikit_learns_lines(capsys):
    x, y = _classes()
    params = dict(hidden_layer_sizes=(4,), max_iter=3, random_state=0, verbose=True)
    _fit_quiet(SKClassifier(**params), x, y)
    theirs = capsys.readouterr().out
    _fit_quiet(MLPClassifier(**params), x, y)
    ours = capsys.readouterr().out
    assert ours == theirs and ours.startswith("Iteration 1, loss = ")
