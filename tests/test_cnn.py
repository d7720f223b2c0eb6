"""Convolutional networks cut channel-wise (issue 32): kernels, PyTorch, and the engine's every plan.

* the two kernel sets (torch's ``conv2d`` / pooling, and numpy's im2col) compute the same forward
  and backward passes, max-pooling ties broken as PyTorch breaks them;
* ``fit_serial(network=...)`` equals the same ``torch.nn.Sequential`` trained by ``torch.optim`` from
  the same weights on the same batches (1e-9 relative);
* ``fit(network=...)`` equals ``fit_serial`` (float64, relative 1e-10) for a column that splits every
  stage's channels, pure data parallelism and mixed plans, full batch and shuffled mini-batches,
  through DRPM's remaps, a checkpoint store and a resume, and a SIGKILLed worker;
* bad networks get one clear error naming the layer.

Each problem is first shown to be well conditioned: a 1e-15 relative change of the first conv
layer's initial weights moves the serial result by less than 1e-12 relative (so agreeing to 1e-10
says the arithmetic is the same), and the weights are shown to move.
"""

from __future__ import annotations

import copy

import dask.array as da
import numpy as np
import pytest

torch = pytest.importorskip("torch")
from distributed import Client, LocalCluster  # noqa: E402

import dask_rpm  # noqa: E402
from dask_rpm.engine import fit, ordered_workers, store  # noqa: E402
from dask_rpm.nn import backend as xb  # noqa: E402
from dask_rpm.nn.cnn import NetworkSpecError  # noqa: E402
from dask_rpm.nn.cnn_kernels import ConvWorkspace  # noqa: E402
from dask_rpm.nn.cnn_records import conv_layers  # noqa: E402
from dask_rpm.nn.cnn_torch import params_from_torch, to_torch  # noqa: E402
from dask_rpm.nn.errors import DataError  # noqa: E402
from dask_rpm.nn.serial import fit_serial  # noqa: E402
from dask_rpm.plan.partition import Plan  # noqa: E402

tnn = torch.nn
RTOL = 1e-10
IMAGE = (2, 8, 8)
CLASSES = 3
S = 24


def lenet_like(seed: int = 0) -> tnn.Sequential:
    """Two conv stages (padding, max-pooling; a stride-2 conv with average pooling), a hidden
    dense stage and the output layer: every layer kind and both pooling kinds."""
    torch.manual_seed(seed)
    return tnn.Sequential(
        tnn.Conv2d(2, 4, 3, padding=1),
        tnn.ReLU(),
        tnn.MaxPool2d(2),
        tnn.Conv2d(4, 6, 3, stride=1, padding=1),
        tnn.Tanh(),
        tnn.AvgPool2d(2),
        tnn.Flatten(),
        tnn.Linear(6 * 2 * 2, 8),
        tnn.Sigmoid(),
        tnn.Linear(8, CLASSES),
    ).double()


def conv_head(seed: int = 0) -> tnn.Sequential:
    """The output layer right after a conv stage: ``V`` sees the last stage channel by channel."""
    torch.manual_seed(seed)
    return tnn.Sequential(
        tnn.Conv2d(2, 5, 3, stride=2),
        tnn.ReLU(),
        tnn.Flatten(),
        tnn.Linear(5 * 3 * 3, CLASSES),
    ).double()


def problem(seed: int = 0, s: int = S):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(s, *IMAGE))
    y = rng.integers(0, CLASSES, size=s)
    return x, y


def _rel(a, b) -> float:
    return max(float(np.abs(p - q).max() / max(np.abs(q).max(), 1e-300)) for p, q in zip(a, b))


def _perturbed(net: tnn.Sequential) -> tnn.Sequential:
    other = copy.deepcopy(net)
    with torch.no_grad():
        other[0].weight.mul_(1.0 + 1e-15)
    return other


KW = dict(
    loss="cross-entropy", learning_rate=0.05, iterations=12, optimizer="adam", reduction="mean"
)


def serial(x, y, net, kw, check=True):
    """fit_serial's result; with ``check``, the problem is well conditioned and the weights move."""
    ref = fit_serial(x, y, network=net, **kw)
    assert ref.stopped is None and ref.iterations == kw["iterations"]
    if check:
        other = fit_serial(x, y, network=_perturbed(net), **kw)
        change = _rel(other.params, ref.params)
        assert change < 1e-12, (
            f"ill-conditioned problem ({change:.2e}): the comparison means nothing"
        )
        start = params_from_torch(net, ref.recipe.layers)
        moved = _rel(ref.params, start)
        assert moved > 1e-3, f"the weights barely moved ({moved:.2e})"
    return ref


def assert_equal(r, ref, errors=None):
    assert len(r.params) == len(ref.params)
    for got, want in zip(r.params, ref.params):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=1e-14 * np.abs(want).max())
    want = ref.errors if errors is None else errors
    np.testing.assert_allclose(r.history["error"].values, want, rtol=RTOL, atol=0)


@pytest.fixture(scope="module")
def client4():
    with LocalCluster(
        n_workers=4, threads_per_worker=1, processes=False, dashboard_address=":0"
    ) as cluster:
        with Client(cluster) as client:
            yield client


# ---------------------------------------------------------------------------- the kernels


def _pass(kernels: str, net, x, y, units=None):
    layers = conv_layers(net, IMAGE, CLASSES)
    params = params_from_torch(net, layers)
    ws = ConvWorkspace.whole(len(x), params, layers=layers, kernels=kernels)
    d = np.eye(CLASSES)[y]
    xr = x.reshape(len(x), -1)
    u = ws.forward(xr, params).copy()
    delta2, err = ws.output_delta(u, d)
    grads = [g.copy() for g in ws.backward(xr, params, delta2)]
    return u, err, grads


@pytest.mark.parametrize("make", [lenet_like, conv_head])
def test_numpy_and_torch_kernels_compute_the_same_passes(make):
    x, y = problem(1)
    u1, e1, g1 = _pass("numpy", make(), x, y)
    u2, e2, g2 = _pass("torch", make(), x, y)
    np.testing.assert_allclose(u1, u2, rtol=1e-12, atol=1e-14)
    assert e1 == pytest.approx(e2, rel=1e-12)
    for a, b in zip(g1, g2):
        np.testing.assert_allclose(a, b, rtol=1e-11, atol=1e-13)


@pytest.mark.parametrize("kernels", ["numpy", "torch"])
def test_max_pooling_breaks_ties_as_pytorch_does(kernels):
    """A tie decides where the gradient goes: every 2x2 window holds the same maximum twice, first
    from input channel 0 (top left), then from channel 1 (top right). PyTorch sends the gradient
    to the first maximum in row-major order, so only channel 0's weights get one; so must we."""
    net = tnn.Sequential(
        tnn.Conv2d(2, 3, 1, bias=False),
        tnn.MaxPool2d(2),
        tnn.Flatten(),
        tnn.Linear(3 * 4 * 4, CLASSES),
    ).double()
    with torch.no_grad():
        net[0].weight.fill_(0.5)
    x = np.zeros((4, *IMAGE))
    x[:, 0, 0::2, 0::2] = 1.0
    x[:, 1, 0::2, 1::2] = 1.0
    y = np.array([0, 1, 2, 0])
    _, _, grads = _pass(kernels, net, x, y)
    xt = torch.from_numpy(x)
    loss = tnn.functional.cross_entropy(net(xt), torch.from_numpy(y), reduction="sum")
    loss.backward()
    want = net[0].weight.grad.numpy()
    assert np.abs(want[:, 0]).max() > 1e-3 and not want[:, 1].any()
    # (the last stage's extra row is the output bias channel: no weights, no gradient)
    np.testing.assert_allclose(grads[0][:3], want, rtol=1e-12, atol=1e-14)
    assert not grads[0][3:].any()


# ---------------------------------------------------------------------------- PyTorch


@pytest.mark.parametrize(
    "make,opt,reduction,batch",
    [
        (lenet_like, "sgd", "sum", None),
        (lenet_like, "adam", "mean", 8),
        (conv_head, "momentum", "mean", 8),
    ],
)
def test_fit_serial_equals_pytorch_training(make, opt, reduction, batch):
    """The same module trained by torch.optim from the same weights on the same batches (in order:
    shuffle=False gives consecutive row slices, as a DataLoader without shuffling)."""
    x, y = problem(2)
    net = make()
    steps = 10
    lr = 0.01 if reduction == "sum" else 0.05
    kw = dict(
        loss="cross-entropy",
        learning_rate=lr,
        iterations=steps,
        reduction=reduction,
        optimizer={"name": opt, **({"momentum": 0.9} if opt == "momentum" else {})},
        batch_size=batch,
        shuffle=False,
    )
    ref = serial(x, y, net, kw)
    model = copy.deepcopy(net)
    if opt == "adam":
        torch_opt = torch.optim.Adam(model.parameters(), lr=lr)
    else:
        torch_opt = torch.optim.SGD(
            model.parameters(), lr=lr, momentum=0.9 if opt == "momentum" else 0.0
        )
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    b = batch or len(x)
    for k in range(steps):
        lo = (k * b) % len(x)
        torch_opt.zero_grad()
        loss = tnn.functional.cross_entropy(
            model(xt[lo : lo + b]), yt[lo : lo + b], reduction=reduction
        )
        assert loss.item() * (b if reduction == "mean" else 1) == pytest.approx(
            ref.errors[k], rel=1e-9
        )
        loss.backward()
        torch_opt.step()
    want = params_from_torch(model, ref.recipe.layers)
    assert _rel(ref.params, want) < 1e-9
    # and back: the trained parameters as a module compute what the module trained by torch does
    back = to_torch(ref.recipe.layers, ref.params)
    np.testing.assert_allclose(back(xt).detach().numpy(), model(xt).detach().numpy(), rtol=1e-9)


# ---------------------------------------------------------------------------- the engine


def _plans(layers):
    m = layers.m  # plan rows: the narrowest stage (4 channels, or 5 and the bias channel)
    return {
        "one-column": Plan.from_columns([[0, 1, 2]], [S], [[1, 2, m - 3]], shape=layers.plan_shape),
        "data-parallel": Plan.from_columns(
            [[0], [1], [2], [3]], [6, 8, 5, 5], [[m]] * 4, shape=layers.plan_shape
        ),
        "mixed": Plan.from_columns(
            [[0, 1], [2, 3]], [10, 14], [[m - 1, 1], [1, m - 1]], shape=layers.plan_shape
        ),
    }


@pytest.mark.parametrize("layout", ["one-column", "data-parallel", "mixed"])
@pytest.mark.parametrize("make,batch", [(lenet_like, None), (conv_head, 8)])
def test_fit_equals_serial_for_every_plan_shape(client4, layout, make, batch):
    x, y = problem(4)
    net = make()
    kw = dict(KW, batch_size=batch, shuffle=bool(batch))
    ref = serial(x, y, net, kw)
    plan = _plans(ref.recipe.layers)[layout]
    r = fit(x, y, network=net, mapping=plan, client=client4, progress="none", **kw)
    assert_equal(r, ref)


@pytest.mark.parametrize(
    "backend,dtype", [("torch", "float64"), ("torch", "float32"), ("numpy", "float32")]
)
def test_every_backend_and_dtype_trains_the_same_network(client4, backend, dtype):
    """torch tensors as the workers' arrays, and float32 end to end: fit equals fit_serial on the
    same backend (float64 to 1e-10; float32 to its rounding), and the backends agree."""
    x, y = problem(11)
    net = lenet_like(11).to(getattr(torch, dtype))
    kw = dict(KW, dtype=dtype)
    ref = fit_serial(x, y, network=net, backend=backend, **kw)
    plan = _plans(ref.recipe.layers)["mixed"]
    r = fit(x, y, network=net, backend=backend, mapping=plan, client=client4, progress="none", **kw)
    assert r.params[0].dtype == np.dtype(dtype)
    if dtype == "float64":
        assert_equal(r, ref)
        assert _rel(ref.params, fit_serial(x, y, network=net, **kw).params) < 1e-12
    else:
        assert _rel(r.params, ref.params) < 1e-4
        assert _rel(ref.params, fit_serial(x, y, network=net, **kw).params) < 1e-4


def test_fit_on_emulated_workers_with_drpm_remaps_equals_serial():
    """Heterogeneous EMULATED workers: DRPM re-plans the channels while training, exactly."""
    x, y = problem(5, s=48)
    net = lenet_like(5)
    kw = dict(KW, iterations=30, learning_rate=0.02)
    ref = serial(x, y, net, kw)
    with Client(dask_rpm.local_cluster([1.0, 0.5, 0.25], processes=False)) as client:
        r = fit(
            x,
            y,
            network=net,
            mapping="drpm",
            interval=5,
            client=client,
            progress="none",
            abilities=[1.0, 1.0, 1.0],
            **kw,
        )
    assert r.remaps, "DRPM did not remap: the test shows nothing"
    assert_equal(r, ref)


def test_checkpoint_store_and_resume_equal_one_uninterrupted_run(client4, tmp_path):
    """Every worker writes its channels of every stage into the store; a resume on another plan
    reads them back (the manifest records the network) and ends where one run ends."""
    x, y = problem(6)
    net = lenet_like(6)
    kw = dict(KW, iterations=16)
    ref = serial(x, y, net, kw)
    layers = ref.recipe.layers
    plans = _plans(layers)
    seen: list[int] = []
    first = fit(
        x,
        y,
        network=net,
        mapping=plans["one-column"],
        client=client4,
        progress="none",
        interval=4,
        checkpoint_every=8,
        checkpoint_dir=tmp_path / "ck",
        callback=lambda info: seen.append(info["iteration"]),
        should_stop=lambda: bool(seen) and seen[-1] >= 8,
        **kw,
    )
    assert first.history.sizes["iteration"] == 8
    man = store.read_manifest(tmp_path / "ck")
    assert man["iteration"] == 8 and man["network"]["image"] == list(IMAGE)
    loaded = store.load(tmp_path / "ck")
    assert [p.shape for p in loaded["params"]] == [p.shape for p in ref.params]
    r = fit(
        x,
        y,
        network=net,
        mapping=plans["mixed"],
        client=client4,
        progress="none",
        resume=tmp_path / "ck",
        **kw,
    )
    assert r.stats["start"]["iteration"] == 8
    assert list(r.history["iteration"].values) == list(range(8, 16))
    assert_equal(r, ref, errors=ref.errors[8:])


@pytest.mark.slow
def test_fit_through_a_sigkilled_worker_equals_serial(sigkill_after):
    """A worker process killed mid-run: its channels of every stage (and their Adam moments) come
    from the other column, the iterations since computed again."""
    x, y = problem(7)
    net = lenet_like(7)
    kw = dict(KW, iterations=24)
    ref = serial(x, y, net, kw)
    plan = _plans(ref.recipe.layers)["mixed"]
    with (
        LocalCluster(
            n_workers=4, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        victim = ordered_workers(client.scheduler_info())[1]
        killer = sigkill_after(client, victim, at=10)
        r = fit(
            x,
            y,
            network=net,
            mapping=plan,
            client=client,
            interval=5,
            callback=killer,
            progress="none",
            **kw,
        )
    assert killer.fired == [10]
    (rec,) = [rec for rec in r.remaps if rec.get("lost")]
    assert rec["recovered_from"] == "columns"
    assert_equal(r, ref)


# ---------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "layers,match",
    [
        (
            [tnn.Conv2d(2, 4, 3), tnn.BatchNorm2d(4), tnn.Flatten(), tnn.Linear(144, 3)],
            "layer 1 \\(BatchNorm2d\\) is not supported",
        ),
        (
            [tnn.Conv2d(2, 4, 3), tnn.Dropout(), tnn.Flatten(), tnn.Linear(144, 3)],
            "layer 1 \\(Dropout\\)",
        ),
        ([tnn.Conv2d(2, 4, 3, groups=2), tnn.Flatten(), tnn.Linear(144, 3)], "groups=2"),
        (
            [tnn.Conv2d(2, 4, 11), tnn.Flatten(), tnn.Linear(144, 3)],
            "kernel 11 .* does not fit maps of 8x8",
        ),
        ([tnn.Conv2d(2, 4, 3), tnn.Linear(144, 3)], "put a Flatten"),
        (
            [tnn.Conv2d(2, 4, 3), tnn.Flatten(), tnn.Linear(100, 3)],
            "takes 100 input features; the layer before gives 144",
        ),
        (
            [tnn.Conv2d(2, 4, 3), tnn.Flatten(), tnn.Linear(144, 5)],
            "5 outputs but the targets have 3",
        ),
    ],
)
def test_bad_networks_get_one_clear_error(layers, match):
    x, y = problem(8)
    with pytest.raises(NetworkSpecError, match=match):
        fit_serial(x, y, network=tnn.Sequential(*layers), loss="cross-entropy", iterations=1)


def test_images_that_do_not_fit_the_network_are_refused():
    x, y = problem(9)
    with pytest.raises(DataError, match="images \\(samples, channels, height, width\\)"):
        fit_serial(x.reshape(S, -1), y, network=lenet_like(), loss="cross-entropy", iterations=1)
    with pytest.raises(DataError, match="hidden given with network="):
        fit_serial(x, y, network=lenet_like(), hidden=4, loss="cross-entropy", iterations=1)
    with pytest.raises(DataError, match="activation and bias given with network="):
        fit_serial(
            x,
            y,
            network=lenet_like(),
            activation="tanh",
            bias=True,
            loss="cross-entropy",
            iterations=1,
        )


def test_layer_records_train_the_network_a_module_describes():
    """A network given as records (no torch needed) is the module's architecture, seeded."""
    records = [
        {"conv": 4, "kernel": 3, "padding": 1},
        "relu",
        {"maxpool": 2},
        {"conv": 6, "kernel": 3, "padding": 1},
        "tanh",
        {"avgpool": 2},
        "flatten",
        {"linear": 8},
        "sigmoid",
        {"linear": CLASSES},
    ]
    x, y = problem(10)
    a = conv_layers(records, IMAGE, CLASSES)
    assert a == conv_layers(lenet_like(), IMAGE, CLASSES)
    r1 = fit_serial(x, y, network=records, seed=3, **dict(KW, iterations=3))
    r2 = fit_serial(x, y, network=records, seed=3, **dict(KW, iterations=3))
    assert _rel(r1.params, r2.params) == 0.0 and np.all(np.isfinite(r1.errors))
    assert xb.to_host(r1.params[0]).shape == (4, 2, 3, 3)


def test_a_backend_without_cnn_kernels_is_refused_before_any_work(client4):
    x, y = problem(12)
    with pytest.raises(xb.BackendError, match="backend='cupy' has no CNN kernels"):
        fit(
            x, y, network=lenet_like(), backend="cupy", loss="cross-entropy", iterations=1,
            client=client4, progress="none",
        )  # fmt: skip


def test_dask_images_train_where_their_chunks_are_and_equal_fit_serial(client4):
    """Images as a dask array chunked along samples (and width: joined, with a note) train on
    the cluster as rows of flattened images: full batch, and shuffled mini-batches with a
    held-out fraction computed on the workers."""
    x, y = problem()
    net = lenet_like()
    xd, yd = da.from_array(x, chunks=(8, 2, 8, 4)), da.from_array(y, chunks=8)
    r = fit(xd, yd, network=net, client=client4, progress="none", **KW)
    assert_equal(r, serial(x, y, net, KW))
    assert r.stats["dask"]["chunk_rows"] == [8, 8, 8]
    kw = {k: v for k, v in KW.items() if k != "iterations"}
    kw.update(batch_size=6, epochs=2, shuffle=True, validation=0.25)
    r = fit(xd, yd, network=net, client=client4, progress="none", **kw)
    assert_equal(r, fit_serial(x, y, network=net, **kw))
    with pytest.raises(DataError, match=r"x has shape \(24, 128\); a network with conv layers"):
        fit(xd.reshape(S, -1), yd, network=net, client=client4, progress="none", **KW)
