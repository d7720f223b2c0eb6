"""Optimizers: validated specs, and updates that split by rows exactly."""

from __future__ import annotations

import numpy as np
import pytest

from dask_rpm.nn.optim import Optimizer, OptimizerError, optimizer, step


@pytest.mark.parametrize("name", ["sgd", "momentum", "adam"])
def test_row_split_updates_are_bit_identical(name):
    """Elementwise updates: stepping rows [0, 3) and [3, 7) apart gives the bits of stepping all 7."""
    rng = np.random.default_rng(0)
    opt = optimizer(name)
    W, V = rng.normal(size=(7, 5)), rng.normal(size=(2, 7))
    state = {s: [np.zeros_like(W), np.zeros_like(V)] for s in opt.slots}
    parts = [(slice(0, 3)), (slice(3, 7))]
    Wp = [W[p].copy() for p in parts]
    Vp = [V[:, p].copy() for p in parts]
    sp = [{s: [np.zeros_like(Wp[i]), np.zeros_like(Vp[i])] for s in opt.slots} for i in range(2)]
    for t in range(1, 6):
        gW, gV = rng.normal(size=W.shape), rng.normal(size=V.shape)
        for i, p in enumerate(parts):
            step(opt, 0.01, t, [Wp[i], Vp[i]], [gW[p].copy(), gV[:, p].copy()], sp[i])
        step(opt, 0.01, t, [W, V], [gW.copy(), gV.copy()], state)
    assert np.array_equal(np.concatenate(Wp), W)
    assert np.array_equal(np.concatenate(Vp, axis=1), V)


def test_adam_first_step_moves_every_weight_by_about_lr():
    opt = optimizer({"name": "adam"})
    p = np.zeros(4)
    g = np.array([1e-3, -2.0, 5.0, -1e4])
    state = {"m": [np.zeros(4)], "v": [np.zeros(4)]}
    step(opt, 0.1, 1, [p], [g.copy()], state)
    np.testing.assert_allclose(p, -0.1 * np.sign(g), rtol=1e-4)


def test_momentum_accumulates():
    opt = optimizer("momentum")
    p = np.zeros(1)
    buf = {"buf": [np.zeros(1)]}
    for t in range(1, 4):
        step(opt, 1.0, t, [p], [np.ones(1)], buf)
    # buf: 1, 1.9, 2.71 -> p = -(1 + 1.9 + 2.71)
    np.testing.assert_allclose(p, [-5.61])


@pytest.mark.parametrize(
    "spec,match",
    [
        ("rmsprop", "'rmsprop' is not known; valid: sgd, momentum, adam"),
        ({"name": "adam", "beta3": 0.5}, r"\['beta3'\] not known"),
        ({"name": "momentum", "momentum": 1.5}, "momentum=1.5; it must be in"),
        ({"name": "adam", "eps": 0.0}, "eps=0.0"),
        (3, "optimizer=3; give a name"),
    ],
)
def test_bad_optimizers_are_refused(spec, match):
    with pytest.raises(OptimizerError, match=match):
        optimizer(spec)


def test_optimizer_defaults_come_from_config():
    """A run's optimizer and its parameters default to rpm.train.*, read when its options are
    resolved; optimizer() alone reads no configuration."""
    import dask

    from dask_rpm.nn.options import TrainingOptions

    with dask.config.set(
        {"rpm.train.optimizer": "adam", "rpm.train.optimizer-parameters.beta2": 0.99}
    ):
        assert optimizer(TrainingOptions().resolved().optimizer) == Optimizer("adam", beta2=0.99)
        assert optimizer("adam") == Optimizer("adam")
