"""dask_rpm.model.mlp: a trained network to use - predict, score, save/load, PyTorch export, bad input."""

from __future__ import annotations

import os
import re

import numpy as np
import pytest

from dask_rpm.model.mlp import FORMAT_VERSION, MLPModel, ModelError
from dask_rpm.nn.network import Network
from dask_rpm.nn.recipe import forward
from dask_rpm.nn.serial import fit_serial


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
        **kw,
    )
    return MLPModel.from_result(out), x, y, out


def test_from_fit_serial_classifier_predicts_like_forward():
    model, x, y, out = _classifier()
    assert model.is_classifier and list(model.classes) == [0, 1, 2]
    assert (model.n_inputs, model.n_hidden, model.n_outputs) == (5, 6, 3)
    h = forward(x, out.params, out.recipe.net)
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
    assert np.array_equal(w["b"], model.params[0][:6, 5])
    assert np.array_equal(w["c"], model.params[-1][:, 6])
    w["W"][0, 0] = 99.0  # copies: the model is untouched
    assert model.params[0][0, 0] != 99.0


@pytest.mark.parametrize(
    "labels", [None, ["cat", "dog", "emu"], [2.5, 7.0, 9.5]], ids=["int", "str", "float"]
)
def test_save_load_round_trip_is_exact(tmp_path, labels):
    model, x, _, _ = _classifier(labels=labels)
    path = model.save(tmp_path / "m.nc")
    assert os.listdir(tmp_path) == ["m.nc"]  # atomic write: no temporary file left
    back = MLPModel.load(path)
    assert all(np.array_equal(a, b) for a, b in zip(back.params, model.params))
    assert back.params[0].dtype == model.params[0].dtype and back.net == model.net
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
        dtype="float32",
    )
    model = MLPModel.from_result(out, target_shift=[1.0, -2.0], target_scale=[3.0, 0.5])
    assert not model.is_classifier and model.params[0].dtype == np.float32
    pred = model.predict(x)
    assert np.allclose(pred, model.outputs(x) * [3.0, 0.5] + [1.0, -2.0], rtol=1e-6)
    back = MLPModel.load(model.save(tmp_path / "r.nc"))
    assert back.params[0].dtype == np.float32
    assert all(np.array_equal(a, b) for a, b in zip(back.params, model.params))
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
    )
    model = MLPModel.from_result(out)
    r2 = model.score(x, d)
    assert r2 == pytest.approx(r2_score(d, model.predict(x)), rel=1e-12)
    assert r2 > 0.5
    one = MLPModel(
        out.params[0], out.params[-1][:1], out.recipe.net
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
    with pytest.raises(ModelError, match="must be a dask_rpm.nn.network.Network"):
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
    from dask_rpm.nn.data import write_dataset

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
        MLPModel.from_result({"params": [np.zeros((2, 2)), np.zeros((1, 2))]})


def test_save_honours_the_umask(tmp_path):
    model, *_ = _classifier()
    old = os.umask(0o027)
    try:
        path = model.save(tmp_path / "m.nc")
    finally:
        os.umask(old)
    assert os.stat(path).st_mode & 0o777 == 0o640  # not mkstemp's 0o600: collaborators can read it


# ---------------------------------------------------------------- deep networks

# activation -> (loss, output): each activation with another output layer
DEEP_LOSS = {
    "sigmoid": ("cross-entropy", "softmax"),
    "tanh": ("squared", "sigmoid"),
    "relu": ("squared", "linear"),
}


def _deep(hidden, activation, bias, **kw):
    """A fit_serial result of a network with hidden layers ``hidden`` on the 3-class task."""
    x, y = _data()
    loss, output = DEEP_LOSS[activation]
    d = y if loss == "cross-entropy" else np.eye(3)[y]
    out = fit_serial(
        x,
        d,
        hidden=hidden,
        iterations=60,
        learning_rate=0.01,
        loss=loss,
        output=output,
        activation=activation,
        bias=bias,
        optimizer="adam",
        batch_size=20,
        **kw,
    )
    return out, x


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("activation", ["sigmoid", "tanh", "relu"])
@pytest.mark.parametrize("hidden", [(7, 5), (7, 5, 4)], ids=["2-layers", "3-layers"])
def test_deep_model_predicts_like_fit_serial_and_round_trips_bit_for_bit(
    tmp_path, hidden, activation, bias
):
    import xarray as xr

    out, x = _deep(hidden, activation, bias)
    model = MLPModel.from_result(out)
    assert model.hidden_layer_sizes == hidden and model.n_inputs == 5 and model.n_outputs == 3
    assert len(model.params) == len(hidden) + 1
    assert all(p is q for p, q in zip(model.params, out.params))  # the result's own arrays
    assert np.array_equal(model.outputs(x), out.outputs(x))
    assert np.array_equal(model.predict(x), out.predict(x))
    assert model.is_classifier == (activation == "sigmoid")  # softmax: classes 0 .. 2
    shape = "-".join(map(str, (5, *hidden, 3)))
    assert f"<MLPModel {shape} " in repr(model)
    with pytest.raises(ModelError, match=rf"{len(hidden)} hidden layers .* use hidden_layer_sizes"):
        model.n_hidden  # noqa: B018
    path = model.save(tmp_path / "deep.nc")
    assert os.listdir(tmp_path) == ["deep.nc"]  # atomic write: no temporary file left
    back = MLPModel.load(path)
    assert back.hidden_layer_sizes == hidden and back.net == model.net and back.meta == model.meta
    assert all(
        np.array_equal(a, b) and a.dtype == b.dtype for a, b in zip(back.params, model.params)
    )
    assert len(back.params) == len(model.params)
    assert np.array_equal(back.outputs(x), model.outputs(x))
    assert np.array_equal(back.predict(x), model.predict(x))
    with xr.open_dataset(path, engine="h5netcdf") as ds:
        names = [f"W{k + 1}" for k in range(len(hidden))] + ["V"]
        assert ds.attrs["dask_rpm_model"] == FORMAT_VERSION == 2
        assert ds.attrs["parameters"] == " ".join(names)
        assert list(np.atleast_1d(ds.attrs["hidden_layer_sizes"])) == list(hidden)
        assert ds["W1"].dims == ("hidden1", "input") and ds["W2"].dims == ("hidden2", "hidden1")
        assert ds["V"].dims == ("output", f"hidden{len(hidden)}")
        assert "W" not in ds.variables


def test_deep_weights_and_to_torch_of_a_fitted_model():
    torch = pytest.importorskip("torch")
    out, x = _deep((7, 5, 4), "tanh", True)
    model = MLPModel.from_result(out)
    w = model.weights()
    assert list(w) == ["W1", "b1", "W2", "b2", "W3", "b3", "V", "c"]
    assert [w[k].shape for k in ("W1", "W2", "W3", "V")] == [(7, 5), (5, 7), (4, 5), (3, 4)]
    assert [w[k].shape for k in ("b1", "b2", "b3", "c")] == [(7,), (5,), (4,), (3,)]
    assert np.array_equal(w["b2"], model.params[1][:5, 7]) and np.array_equal(
        w["c"], model.params[-1][:, 4]
    )
    seq = model.to_torch()
    assert [type(m).__name__ for m in seq] == [
        "Linear", "Tanh", "Linear", "Tanh", "Linear", "Tanh", "Linear", "Sigmoid"
    ]  # fmt: skip
    with torch.no_grad():
        got = seq(torch.from_numpy(x)).numpy()
    assert np.max(np.abs(got - model.outputs(x))) <= 1e-12


@pytest.mark.parametrize(
    "net", NETS, ids=lambda n: f"{n.activation}-{n.output}-{'bias' if n.bias else 'nobias'}"
)
def test_to_torch_of_a_depth_3_model_outputs_equal_ours(net):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(11)
    sizes = (6, 9, 5, 7, 4)  # n, m_1, m_2, m_3, l
    weights = [rng.normal(size=(r, c)) for c, r in zip(sizes[:-1], sizes[1:])]
    params = net.join_params(weights, [rng.normal(size=w.shape[0]) for w in weights])
    if net.bias:
        for p in params[:-1]:  # the bias units' own weights are ignored, whatever they hold
            p[-1] = rng.normal(size=p.shape[1])
    model = MLPModel.from_params(params, net)
    assert model.hidden_layer_sizes == (9, 5, 7)
    x = rng.normal(size=(30, 6)) * 2.0
    with torch.no_grad():
        got = model.to_torch()(torch.from_numpy(x)).numpy()
        logits = model.to_torch(output_layer=False)(torch.from_numpy(x)).numpy()
    assert got.dtype == np.float64 and len(model.to_torch(output_layer=False)) == 7
    assert np.max(np.abs(got - model.outputs(x))) <= 1e-12 * max(1.0, np.max(np.abs(got)))
    assert np.max(np.abs(logits - model.decision_function(x))) <= 1e-12 * max(
        1.0, np.max(np.abs(logits))
    )


def _format_1_dataset(model):
    """The dataset format 1 (development builds before deep networks) wrote for a one-hidden-layer
    model, kept here as it was so the test does not follow the writer."""
    import json

    import xarray as xr

    net = model.net
    return xr.Dataset(
        {
            "W": (("hidden", "input"), model.params[0], {"description": "input-to-hidden weights"}),
            "V": (
                ("output", "hidden"),
                model.params[-1],
                {"description": "hidden-to-output weights"},
            ),
        },
        attrs={
            "title": "dask_rpm model",
            "dask_rpm_model": 1,
            "dask_rpm_version": "0.0.0",
            "activation": net.activation,
            "loss": net.loss,
            "output": net.output,
            "bias": int(net.bias),
            "inputs": model.n_inputs,
            "hidden_units": model.n_hidden,
            "outputs": model.n_outputs,
            "kind": "classifier" if model.is_classifier else "regressor",
            "emulation": "",
            "meta": json.dumps(model.meta),
        },
    )


def test_format_1_file_is_refused_and_format_2_names_one_layers_weights_w_and_v(tmp_path):
    model, *_ = _classifier()
    path = tmp_path / "v1.nc"
    _format_1_dataset(model).to_netcdf(path, engine="h5netcdf")
    with pytest.raises(ModelError) as err:
        MLPModel.load(path)
    # what was found (format, writer, variables) and what is expected (format 2, its parameters)
    assert re.search(
        r"is a model file of format 1, written by a development build of dask_rpm \(version "
        r"0\.0\.0, variables \['V', 'W'\]\); this dask_rpm reads format 2 only .*train the "
        r"model again and save it",
        str(err.value),
    )
    # a one-hidden-layer model of format 2 names its weights as the paper does
    ds = model.to_dataset()
    assert [(v, ds[v].dims) for v in ("W", "V")] == [
        ("W", ("hidden", "input")),
        ("V", ("output", "hidden")),
    ]
    assert ds.attrs["parameters"] == "W V" and "hidden_units" not in ds.attrs


def test_newer_and_damaged_files_are_refused_clearly(tmp_path):
    out, _ = _deep((7, 5), "sigmoid", True)
    model = MLPModel.from_result(out)

    def load(ds, name):
        ds.to_netcdf(tmp_path / name, engine="h5netcdf")
        return MLPModel.load(tmp_path / name)

    ds = model.to_dataset()
    ds.attrs["dask_rpm_model"] = 3
    with pytest.raises(ModelError, match=r"format 3, newer than this dask_rpm .* \(format 2\)"):
        load(ds, "future.nc")
    ds = model.to_dataset().drop_vars("W2")
    with pytest.raises(
        ModelError, match=r"damaged dask_rpm model file: variable\(s\) \['W2'\] missing"
    ):
        load(ds, "missing.nc")
    ds = model.to_dataset()
    ds.attrs["hidden_layer_sizes"] = np.array([7, 6])
    with pytest.raises(ModelError, match=r"hidden_layer_sizes=\[7, 6\] but .* \[7, 5\] units"):
        load(ds, "sizes.nc")
    ds = model.to_dataset()
    ds.attrs["parameters"] = "W1 V"
    with pytest.raises(ModelError, match="damaged .* do not fit together"):
        load(ds, "names.nc")


def test_from_params_refuses_bad_shapes_with_what_it_got():
    net = Network("tanh", "squared", "linear", False)
    W1, W2, V = np.zeros((7, 5)), np.zeros((4, 7)), np.zeros((3, 4))
    assert MLPModel.from_params([W1, W2, V], net).hidden_layer_sizes == (7, 4)
    with pytest.raises(
        ModelError,
        match=r"weights W1\(7, 5\), W2\(4, 6\), V\(3, 4\) do not fit together: give "
        r"W1\(units 1, inputs\), W2\(units 2, units 1\), \.\.\., V\(outputs, last units\)",
    ):
        MLPModel.from_params([W1, np.zeros((4, 6)), V], net)
    with pytest.raises(ModelError, match=r"weights W\(7, 5\) do not fit together"):
        MLPModel.from_params([W1], net)
    with pytest.raises(ModelError, match=r"weights W\(7, 5, 1\), V\(3, 7\) do not fit together"):
        MLPModel.from_params([W1[..., None], np.zeros((3, 7))], net)
    with pytest.raises(ModelError, match="params must be a list of weight matrices"):
        MLPModel.from_params(np.zeros((2, 3, 3)), net)
    with pytest.raises(ModelError, match="float arrays of one dtype; got W1: float64, W2: float32"):
        MLPModel.from_params([W1, W2.astype(np.float32), V], net)
    with pytest.raises(ModelError, match="bias input and each layer's bias unit"):
        MLPModel.from_params([W1, np.zeros((1, 7)), np.zeros((3, 1))], net._replace(bias=True))
    # the constructor of one hidden layer names its two matrices
    with pytest.raises(ModelError, match=r"weights W\(7, 5\), V\(3, 4\) do not fit together"):
        MLPModel(W1, V, net)


def test_from_result_reads_params_only():
    out, x = _deep((7, 5), "relu", False)
    deep = MLPModel.from_result({"recipe": out.recipe, "params": out.params})
    assert deep.hidden_layer_sizes == (7, 5)
    assert np.array_equal(deep.outputs(x), out.outputs(x))
    # a result of an earlier development build held one hidden layer's weights under two keys
    old = {"recipe": out.recipe, "W": out.params[0], "V": out.params[-1]}
    with pytest.raises(
        ModelError,
        match=r"a mapping with keys \['V', 'W', 'recipe'\], with no weights under 'params'",
    ):
        MLPModel.from_result(old)
    with pytest.raises(ModelError, match=r"a mapping with keys \['recipe'\], with no weights"):
        MLPModel.from_result({"recipe": out.recipe})
