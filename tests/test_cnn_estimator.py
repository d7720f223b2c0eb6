"""CNNClassifier and CNNModel: a CNN as a scikit-learn classifier, and the trained CNN to use.

Tiny problems (8x8 grey-scale images, tens of samples, a few epochs) so the file runs in
seconds: the same model serially and on a two-worker cluster (float64, relative 1e-10), the
model file's round trip and refusals, PyTorch export, scikit-learn's clone and parameter
checks, and the errors for images of the wrong shape.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

pytest.importorskip("sklearn")
torch = pytest.importorskip("torch")

from sklearn.base import clone  # noqa: E402
from sklearn.exceptions import ConvergenceWarning  # noqa: E402
from sklearn.utils._param_validation import InvalidParameterError  # noqa: E402

import dask_rpm  # noqa: E402
from dask_rpm import CNNClassifier, CNNModel, MLPModel  # noqa: E402
from dask_rpm.cli import main  # noqa: E402
from dask_rpm.estimators import EstimatorError  # noqa: E402
from dask_rpm.model.files import ModelError  # noqa: E402
from dask_rpm.nn.cnn import NetworkSpecError  # noqa: E402
from dask_rpm.nn.cnn_records import conv_layers  # noqa: E402

RECORDS = [{"conv": 3, "kernel": 3, "padding": 1}, "relu", {"maxpool": 2}, "flatten", {"linear": 3}]


def _images(s=36, seed=0):
    """``s`` 8x8 images of 3 classes: a bright quadrant (0: top left, 1: top right, 2: bottom)
    in noise, the labels as strings (their dtype must survive a model file)."""
    rng = np.random.default_rng(seed)
    labels = np.arange(s) % 3
    x = 0.3 * rng.standard_normal((s, 1, 8, 8))
    for i, k in enumerate(labels):
        rows, cols = (slice(0, 4), slice(0, 4)) if k == 0 else (slice(0, 4), slice(4, 8))
        if k == 2:
            rows, cols = slice(4, 8), slice(0, 8)
        x[i, 0, rows, cols] += 1.0
    return x, np.array(["left", "right", "bottom"])[labels]


def _module(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 3, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Flatten(),
        torch.nn.Linear(3 * 4 * 4, 3),
    )


def _fit(est, x, y):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return est.fit(x, y)


def _relative(a_params, b_params):
    return max(float(np.max(np.abs(a - b)) / np.max(np.abs(b))) for a, b in zip(a_params, b_params))


SETTINGS = dict(max_iter=4, batch_size=12, learning_rate_init=0.02, random_state=0)


@pytest.fixture(scope="module")
def fitted():
    x, y = _images()
    return _fit(CNNClassifier(_module(), **SETTINGS), x, y), x, y


@pytest.fixture(scope="module")
def client():
    """Two workers of EMULATED speeds 1.0 and 0.5, threads of this process; not the default
    client, so the estimators of the other tests (client=None) train serially."""
    from distributed import Client

    with (
        dask_rpm.local_cluster([1.0, 0.5], processes=False, dashboard_address=":0") as cluster,
        Client(cluster, set_as_default=False) as c,
    ):
        yield c


# ---------------------------------------------------------------------- the estimator


def test_fit_trains_a_copy_and_learns(fitted):
    clf, x, y = fitted
    assert list(clf.classes_) == ["bottom", "left", "right"]
    assert clf.image_shape_ == (1, 8, 8) and clf.n_features_in_ == 64
    assert clf.n_iter_ == 4 and len(clf.loss_curve_) == 4 and clf.loss_ == clf.loss_curve_[-1]
    assert clf.loss_curve_[-1] < clf.loss_curve_[0]
    assert clf.score(x, y) > 0.9
    assert isinstance(clf.model_, CNNModel) and clf.result_.recipe.layers is clf.model_.layers
    proba = clf.predict_proba(x)
    assert proba.shape == (36, 3) and np.allclose(proba.sum(axis=1), 1.0)
    assert np.array_equal(clf.predict(x), clf.classes_[np.argmax(proba, axis=1)])
    # the user's module keeps its initial weights: fit trained a copy
    untouched = _module()
    assert all(torch.equal(a, b) for a, b in zip(clf.network.parameters(), untouched.parameters()))


def test_to_torch_gives_predict_proba_and_the_logits(fitted):
    clf, x, _ = fitted
    t = torch.from_numpy(x)
    seq = clf.to_torch()
    assert isinstance(seq, torch.nn.Sequential) and next(seq.parameters()).dtype == torch.float64
    with torch.no_grad():
        proba, logits = seq(t).numpy(), clf.to_torch(output_layer=False)(t).numpy()
    assert np.allclose(proba, clf.predict_proba(x), rtol=0, atol=1e-12)
    assert np.allclose(logits, clf.model_.decision_function(x), rtol=0, atol=1e-12)


def test_the_same_model_serially_and_on_a_cluster(client):
    x, y = _images()
    serial = _fit(CNNClassifier(_module(), client=None, **SETTINGS), x, y)
    assert type(serial.result_).__name__ == "SerialResult"
    ours = _fit(
        CNNClassifier(_module(), client=client, mapping="uniform", progress="none", **SETTINGS),
        x,
        y,
    )
    assert len(ours.result_.plan.planned_workers) == 2  # trained on both workers
    assert "EMULATED" in ours.result_.emulation
    assert _relative(ours.model_.params, serial.model_.params) < 1e-10
    assert ours.n_iter_ == serial.n_iter_
    assert np.allclose(ours.loss_curve_, serial.loss_curve_, rtol=1e-10, atol=0)
    # FitResult gives a CNN's model, predictions and score
    assert isinstance(ours.result_.model, CNNModel)
    assert np.array_equal(ours.result_.predict(x), ours.result_.model.predict(x))
    assert ours.result_.score(x, ours.result_.model.predict(x)) == 1.0
    # warm start goes on from the fitted weights, on either
    for est in (serial, ours):
        est.set_params(warm_start=True, max_iter=2)
        _fit(est, x, y)
        assert est.n_iter_ == 6 and len(est.loss_curve_) == 6
    assert _relative(ours.model_.params, serial.model_.params) < 1e-10


def test_layer_records_are_seeded_by_random_state():
    x, y = _images(24)
    a = _fit(CNNClassifier(RECORDS, max_iter=2, random_state=3), x, y)
    b = _fit(CNNClassifier(RECORDS, max_iter=2, random_state=3), x, y)
    c = _fit(CNNClassifier(RECORDS, max_iter=2, random_state=4), x, y)
    assert all(np.array_equal(p, q) for p, q in zip(a.model_.params, b.model_.params))
    assert not np.array_equal(a.model_.params[0], c.model_.params[0])
    assert a.model_.layers.records() == conv_layers(RECORDS, (1, 8, 8), 3).records()


def test_image_shape_takes_rows_of_flattened_images():
    x, y = _images(24)
    images = _fit(CNNClassifier(RECORDS, max_iter=2, random_state=0), x, y)
    rows = _fit(
        CNNClassifier(RECORDS, max_iter=2, random_state=0, image_shape=(1, 8, 8)),
        x.reshape(24, -1),
        y,
    )
    assert all(np.array_equal(p, q) for p, q in zip(images.model_.params, rows.model_.params))
    assert np.array_equal(rows.predict(x.reshape(24, -1)), rows.predict(x))


def test_clone_and_get_params():
    est = CNNClassifier(_module(), max_iter=3, solver="sgd", momentum=0.5)
    params = est.get_params()
    assert set(params) == set(CNNClassifier._parameter_constraints)
    assert params["max_iter"] == 3 and params["solver"] == "sgd" and params["batch_size"] == "auto"
    twin = clone(est)
    assert twin.network is not est.network  # a deep copy: fitting one leaves the other's alone
    assert repr(twin.network) == repr(est.network)
    assert {k: v for k, v in twin.get_params().items() if k != "network"} == {
        k: v for k, v in params.items() if k != "network"
    }
    assert not hasattr(twin, "model_")


@pytest.mark.parametrize(
    "params,match",
    [
        (dict(solver="lbfgs"), "CNNClassifier does not support 'lbfgs'"),
        (dict(solver="newton"), "'solver' parameter"),
        (dict(max_iter=0), "'max_iter' parameter"),
        (dict(batch_size=0), "'batch_size' parameter"),
        (dict(learning_rate_init=-1.0), "'learning_rate_init' parameter"),
        (dict(image_shape=(1, 8)), "three positive integers"),
        (dict(network="conv"), "'network' parameter"),
    ],
)
def test_bad_parameters_are_scikit_learns_error(params, match):
    x, y = _images(12)
    est = CNNClassifier(**{"network": RECORDS, "max_iter": 1, **params})
    if "image_shape" in params:
        x = x.reshape(12, -1)
    with pytest.raises(InvalidParameterError, match=match):
        est.fit(x, y)


def test_a_network_that_does_not_fit_the_classes_is_refused():
    x, y = _images(12)
    with pytest.raises(NetworkSpecError, match="3 columns"):
        CNNClassifier(RECORDS[:-1] + [{"linear": 4}], max_iter=1).fit(x, y)


def test_images_of_the_wrong_shape_get_a_clear_error(fitted):
    clf, x, y = fitted
    with pytest.raises(EstimatorError, match=r"\(samples, channels, height, width\).*image_shape"):
        CNNClassifier(RECORDS).fit(x.reshape(36, -1), y)
    with pytest.raises(EstimatorError, match=r"has shape \(36, 8, 8\)"):
        CNNClassifier(RECORDS).fit(x[:, 0], y)
    with pytest.raises(EstimatorError, match=r"images of shape \(1, 6, 6\).*fitted on \(1, 8, 8\)"):
        clf.predict(x[:, :, :6, :6])
    with pytest.raises(EstimatorError, match="36 sample"):
        CNNClassifier(RECORDS).fit(x, y[:30])
    with pytest.raises(ModelError, match=r"x.reshape\(-1, 1, 8, 8\)"):
        clf.model_.predict(x.reshape(36, -1))
    with pytest.raises(ModelError, match=r"one image is x\[None\]"):
        clf.model_.predict(x[0])


# ---------------------------------------------------------------------- the model


def test_the_model_of_a_serial_result():
    x, y = _images(24)
    serial = dask_rpm.fit_serial(
        x,
        y,
        network=RECORDS,
        loss="cross-entropy",
        optimizer="adam",
        learning_rate=0.01,
        epochs=2,
        batch_size=8,
    )
    model = CNNModel.from_result(serial)
    assert np.array_equal(model.predict(x), serial.predict(x))
    assert model.score(x, y) == serial.score(x, y)
    assert model.meta["recipe"]["loss"] == "cross-entropy" and len(model.meta["loss_curve"]) == 6
    with pytest.raises(ValueError, match=r"this CNN takes images \(samples, 1, 8, 8\)"):
        serial.predict(x.reshape(24, -1))
    with pytest.raises(ModelError, match="MLPModel.from_result"):
        CNNModel.from_result(
            dask_rpm.fit_serial(x.reshape(24, -1), y, hidden=4, iterations=1, loss="cross-entropy")
        )


def test_save_and_load_give_the_same_predictions(fitted, tmp_path):
    clf, x, y = fitted
    path = clf.save(tmp_path / "cnn.nc")
    back = CNNModel.load(path)
    assert np.array_equal(back.predict(x), clf.predict(x))
    assert np.array_equal(back.predict_proba(x), clf.predict_proba(x))
    assert back.classes.dtype == clf.classes_.dtype and list(back.classes) == list(clf.classes_)
    assert back.records == clf.model_.records and back.image_shape == (1, 8, 8)
    assert all(np.array_equal(a, b) for a, b in zip(back.params, clf.model_.params))
    assert back.meta["estimator"] == "CNNClassifier" and back.meta["loss_curve"] == clf.loss_curve_
    assert isinstance(dask_rpm.model.cnn.load_model(path), CNNModel)
    with pytest.raises(ModelError, match="overwrite=True"):
        clf.save(path)
    assert clf.save(path, overwrite=True) == str(path)
    assert not [p.name for p in tmp_path.iterdir() if p.name != "cnn.nc"]  # no temporary left


def test_a_wrong_or_damaged_file_is_refused(fitted, tmp_path):
    clf, x, y = fitted
    cnn_file = clf.save(tmp_path / "cnn.nc")
    mlp = MLPModel.from_result(
        dask_rpm.fit_serial(x.reshape(36, -1), y, hidden=4, iterations=2, loss="cross-entropy")
    )
    mlp_file = mlp.save(tmp_path / "mlp.nc")
    with pytest.raises(ModelError, match="CNNModel.load"):
        MLPModel.load(cnn_file)
    with pytest.raises(ModelError, match="MLPModel.load"):
        CNNModel.load(mlp_file)
    assert isinstance(dask_rpm.model.cnn.load_model(mlp_file), MLPModel)
    ds = clf.model_.to_dataset()
    cases = {
        "missing": ds.drop_vars("V"),
        "shapes": ds.assign(W1=ds["W1"][:2].rename({"stage1": "short"})),
        "network": ds.assign_attrs(network='[{"conv": 3}]'),
        "json": ds.assign_attrs(network="not json"),
    }
    for name, bad in cases.items():
        with pytest.raises(ModelError, match="damaged dask_rpm model file"):
            CNNModel.from_dataset(bad, where=name)
    (tmp_path / "junk.nc").write_bytes(b"not netCDF")
    with pytest.raises(ModelError, match="not a dask_rpm model file"):
        CNNModel.load(tmp_path / "junk.nc")


def test_dask_rpm_predict_reads_a_cnn_model(fitted, tmp_path, capsys):
    clf, x, y = fitted
    model = clf.save(tmp_path / "cnn.nc")
    np.save(tmp_path / "images.npy", x)
    np.save(tmp_path / "rows.npy", x.reshape(36, -1))
    for data in ("images.npy", "rows.npy"):
        out = tmp_path / f"pred-{data}.nc"
        assert (
            main(
                ["predict", "--model", model, "--data", str(tmp_path / data), "--output", str(out)]
            )
            == 0
        )
        import xarray as xr

        with xr.open_dataset(out, engine="h5netcdf") as ds:
            assert list(ds["prediction"].values) == list(clf.predict(x))
            assert np.allclose(ds["probability"].values, clf.predict_proba(x), rtol=0, atol=0)
    np.save(tmp_path / "small.npy", x[:, :, :6, :6])
    assert (
        main(
            [
                "predict",
                "--model",
                model,
                "--data",
                str(tmp_path / "small.npy"),
                "--output",
                str(tmp_path / "p.nc"),
            ]
        )
        == 2
    )
    assert "(samples, 1, 8, 8)" in capsys.readouterr().err
