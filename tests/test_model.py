"""dask_rpm.model: a trained network to use - predict, score, save/load, PyTorch export, bad input."""

from __future__ import annotations

import os

import numpy as np
import pytest

from dask_rpm.model import FORMAT_VERSION, MLPModel, ModelError
from dask_rpm.network import Network
from dask_rpm.recipe import forward
from dask_rpm.serial import fit_serial


def _data(s=80, n=5, k=3, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(s, n))
    y = (x[:, 0] > 0).astype(int) + (x[:, 1] > 0.5).astype(int)  # 3 classes, learnable
    return x, y[:s] if k == 3 else y % k


def _classifier(labels=None, **kw):
    x, y = _data()
    if labels is not None:
        y = np.asarray(labels)[y]
    out = fit_serial(
        x,
        y,
        hidden=6,
        iterations=200,
        learning_rate=0.03,
        loss="cross-entropy",
        bias=True,
        optimizer="adam",
        batch_size=20,
        full_output=True,
        **kw,
    )
    return MLPModel.from_result(out), x, y, out


def test_from_fit_serial_classifier_predicts_like_forward():
    model, x, y, out = _classifier()
    assert model.is_classifier and list(model.classes) == [0, 1, 2]
    assert (model.n_inputs, model.n_hidden, model.n_outputs) == (5, 6, 3)
    h = forward(x, out["W"], out["V"], out["recipe"].net)
    assert np.array_equal(model.outputs(x), h)
    assert np.array_equal(model.predict_proba(x), h)
    assert np.allclose(model.predict_proba(x).sum(axis=1), 1.0, rtol=0, atol=1e-12)
    assert np.array_equal(model.predict(x), np.argmax(h, axis=1))
    assert model.score(x, y) == np.mean(np.argmax(h, axis=1) == y)
    assert model.score(x, y) > 0.8  # the labels are learnable: training did something
    u = model.decision_function(x)
    e = np.exp(u - u.max(axis=1, keepdims=True))
    assert np.allclose(e / e.sum(axis=1, keepdims=True), h, rtol=0, atol=1e-14)
    # what the result says about itself
    assert (
        model.meta["recipe"]["optimizer"]["name"] == "adam"
        and model.meta["recipe"]["batch_size"] == 20
    )
    assert model.meta["iterations"] == 200 and len(model.meta["loss_curve"]) == 200
    assert model.meta["dask_rpm_version"]


def test_string_labels_predict_labels():
    model, x, y, _ = _classifier(labels=["cat", "dog", "emu"])
    assert list(model.classes) == ["cat", "dog", "emu"]
    p = model.predict(x)
    assert p.dtype.kind == "U" and set(p) <= {"cat", "dog", "emu"}
    assert model.score(x, y) > 0.8


def test_weights_split_the_augmented_matrices():
    model, *_ = _classifier()
    w = model.weights()
    assert (
        w["W"].shape == (6, 5)
        and w["b"].shape == (6,)
        and w["V"].shape == (3, 6)
        and w["c"].shape == (3,)
    )
    assert np.array_equal(w["b"], model.W[:6, 5]) and np.array_equal(w["c"], model.V[:, 6])
    w["W"][0, 0] = 99.0  # copies: the model is untouched
    assert model.W[0, 0] != 99.0


@pytest.mark.parametrize(
    "labels", [None, ["cat", "dog", "emu"], [2.5, 7.0, 9.5]], ids=["int", "str", "float"]
)
def test_save_load_round_trip_is_exact(tmp_path, labels):
    model, x, _, _ = _classifier(labels=labels)
    path = model.save(tmp_path / "m.nc")
    assert os.listdir(tmp_path) == ["m.nc"]  # atomic write: no temporary file left
    back = MLPModel.load(path)
    assert np.array_equal(back.W, model.W) and np.array_equal(back.V, model.V)
    assert back.W.dtype == model.W.dtype and back.net == model.net
    assert np.array_equal(back.classes, model.classes) and back.classes.dtype == model.classes.dtype
    assert back.meta == model.meta
    assert np.array_equal(back.predict_proba(x), model.predict_proba(x))
    assert np.array_equal(back.predict(x), model.predict(x))


def test_regression_model_round_trip_with_target_scale(tmp_path):
    rng = np.random.default_rng(3)
    x = rng.normal(size=(50, 4))
    d = np.stack([x @ [0.5, -1.0, 0.2, 0.0], x[:, 0] * x[:, 1]], axis=1)
    out = fit_serial(
        x,
        d,
        hidden=8,
        iterations=200,
        learning_rate=0.002,
        loss="squared",
        output="linear",
        activation="tanh",
        bias=True,
        optimizer="adam",
        full_output=True,
        dtype="float32",
    )
    model = MLPModel.from_result(out, target_shift=[1.0, -2.0], target_scale=[3.0, 0.5])
    assert not model.is_classifier and model.W.dtype == np.float32
    pred = model.predict(x)
    assert np.allclose(pred, model.outputs(x) * [3.0, 0.5] + [1.0, -2.0], rtol=1e-6)
    back = MLPModel.load(model.save(tmp_path / "r.nc"))
    assert back.W.dtype == np.float32 and np.array_equal(back.W, model.W)
    assert np.array_equal(back.target_scale, model.target_scale) and np.array_equal(
        back.predict(x), pred
    )
    with pytest.raises(ModelError, match="predict_proba needs a classifier"):
        model.predict_proba(x)


def test_r2_score_matches_scikit_learn():
    from sklearn.metrics import r2_score

    rng = np.random.default_rng(4)
    x = rng.normal(size=(40, 3))
    d = np.stack([np.tanh(x[:, 0]), x[:, 1] - x[:, 2]], axis=1)
    out = fit_serial(
        x,
        d,
        hidden=10,
        iterations=300,
        learning_rate=0.003,
        loss="squared",
        output="linear",
        bias=True,
        optimizer="adam",
        full_output=True,
    )
    model = MLPModel.from_result(out)
    r2 = model.score(x, d)
    assert r2 == pytest.approx(r2_score(d, model.predict(x)), rel=1e-12)
    assert r2 > 0.5
    one = MLPModel(
        out["W"], out["V"][:1], out["recipe"].net
    )  # one output: 1-D targets are accepted
    assert one.score(x, d[:, 0]) == pytest.approx(
        r2_score(d[:, 0], one.predict(x)[:, 0]), rel=1e-12
    )


NETS = [
    Network(a, loss, out, bias)
    for a in ("sigmoid", "tanh", "relu")
    for loss, out in (("squared", "sigmoid"), ("squared", "linear"), ("cross-entropy", "softmax"))
    for bias in (True, False)
]


@pytest.mark.parametrize(
    "net", NETS, ids=lambda n: f"{n.activation}-{n.output}-{'bias' if n.bias else 'nobias'}"
)
def test_to_torch_outputs_equal_ours(net):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(7)
    n, m, l = 6, 9, 4  # noqa: E741
    W, V = net.join(
        rng.normal(size=(m, n)), rng.normal(size=(l, m)), rng.normal(size=m), rng.normal(size=l)
    )
    if net.bias:
        W[-1] = rng.normal(
            size=n + 1
        )  # the bias unit's own weights are ignored, whatever they hold
    model = MLPModel(W, V, net)
    x = rng.normal(size=(30, n)) * 2.0
    seq = model.to_torch()
    assert isinstance(seq, torch.nn.Sequential)
    with torch.no_grad():
        got = seq(torch.from_numpy(x)).numpy()
        logits = model.to_torch(output_layer=False)(torch.from_numpy(x)).numpy()
    assert got.dtype == np.float64
    assert np.max(np.abs(got - model.outputs(x))) <= 1e-12 * max(1.0, np.max(np.abs(got)))
    assert np.max(np.abs(logits - model.decision_function(x))) <= 1e-12 * max(
        1.0, np.max(np.abs(logits))
    )
    if net.output == "softmax":
        assert np.max(np.abs(got - model.predict_proba(x))) <= 1e-12


# ------------------------------------------------------------------ bad input


def test_predict_refuses_bad_inputs():
    model, x, _, _ = _classifier()
    with pytest.raises(ModelError, match=r"shape \(80, 4\); this model takes \(samples, 5\)"):
        model.predict(x[:, :4])
    with pytest.raises(ModelError, match=r"1-D .* x.reshape\(1, -1\)"):
        model.predict(x[0])
    bad = x.copy()
    bad[7, 2] = np.nan
    with pytest.raises(ModelError, match="NaN or infinite values \\(first in sample 7\\)"):
        model.predict(bad)
    with pytest.raises(ModelError, match="give numbers"):
        model.predict(np.full((2, 5), "a"))
    with pytest.raises(ModelError, match=r"y has shape \(3,\); give one label per sample"):
        model.score(x, [0, 1, 2])


def test_constructor_refuses_inconsistent_parts():
    net = Network("tanh", "cross-entropy", "softmax", False)
    W, V = np.zeros((4, 3)), np.zeros((2, 4))
    with pytest.raises(ModelError, match="do not fit together"):
        MLPModel(W, np.zeros((2, 5)), net)
    with pytest.raises(ModelError, match="3 classes for 2 output"):
        MLPModel(W, V, net, classes=["a", "b", "c"])
    with pytest.raises(ModelError, match="must be a dask_rpm.network.Network"):
        MLPModel(W, V, ("tanh",))
    with pytest.raises(ModelError, match="float arrays of one dtype"):
        MLPModel(W.astype(int), V, net)
    reg = Network("tanh", "squared", "linear", False)
    with pytest.raises(ModelError, match="together, or neither"):
        MLPModel(W, V, reg, target_shift=[0.0, 0.0])
    with pytest.raises(ModelError, match="2 finite number"):
        MLPModel(W, V, reg, target_shift=[0.0], target_scale=[1.0])
    assert list(MLPModel(W, V, net).classes) == [0, 1]  # softmax without labels: classes 0 .. l-1


def test_load_refuses_what_is_not_a_model(tmp_path):
    from dask_rpm.data import write_dataset

    with pytest.raises(ModelError, match="does not exist"):
        MLPModel.load(tmp_path / "missing.nc")
    with pytest.raises(ModelError, match="is a directory"):
        MLPModel.load(tmp_path)
    text = tmp_path / "notes.nc"
    text.write_text("hello")
    with pytest.raises(ModelError, match="not a dask_rpm model file: it cannot be read as netCDF"):
        MLPModel.load(text)
    data = write_dataset(tmp_path / "data.nc", np.zeros((3, 2)), np.zeros((3, 1)))
    with pytest.raises(
        ModelError, match=r"not a dask_rpm model file: it has variables \['d', 'x'\]"
    ):
        MLPModel.load(data)
    model, *_ = _classifier()
    ds = model.to_dataset()
    ds.attrs["dask_rpm_model"] = FORMAT_VERSION + 1
    newer = tmp_path / "newer.nc"
    ds.to_netcdf(newer, engine="h5netcdf")
    with pytest.raises(ModelError, match="newer than this dask_rpm"):
        MLPModel.load(newer)
    ds = model.to_dataset()
    del ds.attrs["dask_rpm_model"]
    ds.attrs["title"] = "dask_rpm training result"
    result = tmp_path / "result.nc"
    ds.to_netcdf(result, engine="h5netcdf")
    with pytest.raises(
        ModelError, match=r"it is a dask_rpm training result .*<output stem>.model.nc"
    ):
        MLPModel.load(result)
    with pytest.raises(ModelError, match="is a directory"):
        model.save(tmp_path)
    # as the command line does: no silent replacement, no directory made from a typo
    first = model.save(tmp_path / "keep.nc")
    with pytest.raises(ModelError, match="exists; pass overwrite=True to replace it"):
        model.save(first)
    assert model.save(first, overwrite=True) == first
    with pytest.raises(ModelError, match="the directory .*typo.* does not exist"):
        model.save(tmp_path / "typo" / "m.nc")
    assert not (tmp_path / "typo").exists()


def test_from_result_without_recipe_is_refused():
    with pytest.raises(ModelError, match="no recipe"):
        MLPModel.from_result({"W": np.zeros((2, 2)), "V": np.zeros((1, 2))})


def test_save_honours_the_umask(tmp_path):
    model, *_ = _classifier()
    old = os.umask(0o027)
    try:
        path = model.save(tmp_path / "m.nc")
    finally:
        os.umask(old)
    assert os.stat(path).st_mode & 0o777 == 0o640  # not mkstemp's 0o600: collaborators can read it
