"""Network forms: activations, outputs, losses and bias terms in the kernels, against finite differences."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from dask_rpm.nn.kernels import Workspace, init_weights
from dask_rpm.nn.network import Network, NetworkError, network
from dask_rpm.nn.recipe import forward

FORMS = [
    Network(a, lo, o, b)
    for a, (lo, o), b in itertools.product(
        ["sigmoid", "tanh", "relu"],
        [("squared", "sigmoid"), ("squared", "linear"), ("cross-entropy", "softmax")],
        [False, True],
    )
]


def _loss(net, x, d, W, V):
    """The loss written out from its definition (an independent check of the kernels' one)."""
    h = forward(x, [W, V], net)
    if net.loss == "cross-entropy" and net.output == "sigmoid":
        return -float(np.sum(d * np.log(h) + (1 - d) * np.log(1 - h)))
    if net.loss == "cross-entropy":
        return -float(np.sum(d * np.log(h)))
    return 0.5 * float(np.sum((h - d) ** 2))


@pytest.mark.parametrize(
    "net", FORMS, ids=lambda n: f"{n.activation}-{n.output}-{'bias' if n.bias else 'nobias'}"
)
def test_gradients_match_finite_differences(net):
    rng = np.random.default_rng(0)
    s, n, m, l = 11, 4, 5, 3
    x = rng.normal(size=(s, n))
    d = (
        np.eye(l)[rng.integers(0, l, s)]
        if net.loss == "cross-entropy"
        else rng.uniform(0.1, 0.9, (s, l))
    )
    W, V = net.join(
        *init_weights(n, m, l, seed=1, scale=0.5),
        rng.normal(size=m) * 0.1,
        rng.normal(size=l) * 0.1,
    )
    xa = net.augment(x)
    ws = Workspace(s, W.shape[0], W.shape[1], l, "float64", net, net.bias_row(W.shape[0]))
    u = ws.forward(xa, [W, V])
    _, err = ws.output_delta(u.copy(), d)
    assert err == pytest.approx(_loss(net, x, d, W, V), rel=1e-12)
    dW, dV = (a.copy() for a in ws.backward(xa, [W, V], ws.delta2))
    h = 1e-6
    for i, j in [(0, 0), (2, 1), (W.shape[0] - 1, W.shape[1] - 1)]:
        Wp, Wm = W.copy(), W.copy()
        Wp[i, j] += h
        Wm[i, j] -= h
        num = (_loss(net, x, d, Wp, V) - _loss(net, x, d, Wm, V)) / (2 * h)
        assert dW[i, j] == pytest.approx(num, rel=1e-5, abs=1e-8)
    for i, j in [(0, 0), (l - 1, V.shape[1] - 1)]:
        Vp, Vm = V.copy(), V.copy()
        Vp[i, j] += h
        Vm[i, j] -= h
        num = (_loss(net, x, d, W, Vp) - _loss(net, x, d, W, Vm)) / (2 * h)
        assert dV[i, j] == pytest.approx(num, rel=1e-5, abs=1e-8)
    if net.bias:  # the bias unit has no inputs to learn: its delta is 0
        assert np.all(dW[-1] == 0.0)


def test_join_and_split_round_trip():
    net = Network(bias=True)
    W, V = np.arange(6.0).reshape(3, 2), np.arange(6.0).reshape(2, 3)
    b, c = np.array([7.0, 8, 9]), np.array([-1.0, -2])
    Wa, Va = net.join(W, V, b, c)
    assert Wa.shape == (4, 3) and Va.shape == (2, 4)
    got = net.split(Wa, Va)
    for k, v in dict(W=W, V=V, b=b, c=c).items():
        assert np.array_equal(got[k], v)


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(activation="gelu"), "activation='gelu'; valid: sigmoid, tanh, relu"),
        (dict(loss="hinge"), "loss='hinge'; valid: squared, cross-entropy"),
        (
            dict(loss="cross-entropy", output="linear"),
            "output='linear' with loss='cross-entropy'",
        ),
        (dict(loss="squared", output="softmax"), "output='softmax' with loss='squared'"),
        (dict(bias="yes"), "bias='yes'; give true or false"),
    ],
)
def test_bad_forms_are_refused(kw, match):
    with pytest.raises(NetworkError, match=match):
        network(**kw)


def test_defaults_are_the_papers_network():
    assert network().is_paper
    assert network(loss="cross-entropy").output == "softmax"
