"""The one-pass optimizer step: blocks of rows, new weights into other arrays, and what it reports.

:func:`dask_rpm.nn.optim.step` runs every operation of an update on a block of rows before
the next block (the blocks stay in a core's cache), can write the new weights and state into
spare arrays (a worker's :class:`~dask_rpm.engine.worker.Shard` keeps the old ones for a
revert that way, without copying them), and reports whether the new weights are finite and
their sum of squares (the next iteration's L2 penalty). None of that may change a bit of the
result: the distributed engine equals the serial reference because both step alike.
"""

from __future__ import annotations

import numpy as np
import pytest

from dask_rpm.engine.worker import Shard
from dask_rpm.nn import optim
from dask_rpm.nn.layers import Layers
from dask_rpm.nn.optim import optimizer, penalty, step

SPECS = {
    "adam": {"name": "adam"},
    "adam-sklearn": {"name": "adam", "convention": "scikit-learn"},
    "sgd": {"name": "sgd"},
    "momentum": {"name": "momentum"},
    "sgd-sklearn": {"name": "sgd", "convention": "scikit-learn", "momentum": 0.9},
    "nesterov": {"name": "sgd", "convention": "scikit-learn", "momentum": 0.9, "nesterov": True},
}
#: a 2-hidden-layer network's augmented parameters (bias column last, V's in the middle of the
#: rows a worker might hold) and a CNN-style 1-D bias vector
SHAPES = [(33, 41), (17, 33), (5, 17), (6,)]
BIASES = [40, 32, 9, 0]


def _problem(spec, seed=0):
    rng = np.random.default_rng(seed)
    opt = optimizer(spec)
    params = [rng.normal(size=s) for s in SHAPES]
    state = {k: [rng.random(size=s) for s in SHAPES] for k in opt.slots}
    grads = [[rng.normal(size=s) for s in SHAPES] for _ in range(3)]
    return opt, params, state, grads


def _copy(arrays):
    return [a.copy() for a in arrays]


def _run(spec, block, monkeypatch, out=False, **kw):
    """Three steps with blocks of ``block`` elements; the parameters, state and each step's report."""
    monkeypatch.setattr(optim, "BLOCK", block)
    opt, params, state, grads = _problem(spec)
    reports = []
    for t, g in enumerate(grads, 1):
        if out:
            new_p = [np.empty_like(p) for p in params]
            new_s = {k: [np.empty_like(a) for a in v] for k, v in state.items()}
            before = _copy(params), {k: _copy(v) for k, v in state.items()}
            reports.append(step(opt, 0.01, t, params, _copy(g), state, out=(new_p, new_s), **kw))
            assert all(np.array_equal(a, b) for a, b in zip(before[0], params))
            assert all(np.array_equal(a, b) for k in state for a, b in zip(before[1][k], state[k]))
            params, state = new_p, new_s
        else:
            reports.append(step(opt, 0.01, t, params, _copy(g), state, **kw))
    return params, state, reports


@pytest.mark.parametrize("name", list(SPECS))
@pytest.mark.parametrize("mean", [None, dict(batch=37.0, alpha=1e-3, biases=BIASES)])
def test_blocks_and_spare_arrays_step_to_the_same_bits(name, mean, monkeypatch):
    kw = mean or {}
    whole, whole_state, _ = _run(SPECS[name], 10**9, monkeypatch, **kw)
    for block, out in [(64, False), (64, True), (1, True), (10**9, True)]:
        p, s, _ = _run(SPECS[name], block, monkeypatch, out=out, **kw)
        assert all(np.array_equal(a, b) for a, b in zip(whole, p)), (block, out)
        assert all(np.array_equal(a, b) for k in s for a, b in zip(whole_state[k], s[k]))


@pytest.mark.parametrize("name", list(SPECS))
def test_the_mean_gradient_inside_the_step_is_mean_gradients(name):
    """``batch=`` / ``alpha=`` in the step: the bits of :func:`mean_gradient` then a plain step."""
    opt, params, state, grads = _problem(SPECS[name])
    p2, s2 = _copy(params), {k: _copy(v) for k, v in state.items()}
    for t, g in enumerate(grads, 1):
        step(opt, 0.01, t, params, _copy(g), state, batch=37.0, alpha=1e-3, biases=BIASES)
        g2 = _copy(g)
        optim.mean_gradient(p2, g2, 37.0, 1e-3, BIASES)
        step(opt, 0.01, t, p2, g2, s2)
    assert all(np.array_equal(a, b) for a, b in zip(params, p2))


def test_the_step_reports_the_new_weights_sum_of_squares_and_finiteness(monkeypatch):
    monkeypatch.setattr(optim, "BLOCK", 64)
    opt, params, state, grads = _problem(SPECS["adam-sklearn"])
    got = step(opt, 0.01, 1, params, grads[0], state, biases=BIASES, sum_squares=True)
    assert got.finite
    want = penalty(params, BIASES)
    assert got.squares == pytest.approx(want, rel=1e-13)
    # the bias columns and the all-bias vector are left out
    assert want == pytest.approx(
        sum(
            float(np.sum(p[:, :c] ** 2) + np.sum(p[:, c + 1 :] ** 2))
            for p, c in zip(params[:3], BIASES)
        ),
        rel=1e-13,
    )
    assert np.isnan(step(opt, 0.01, 2, params, grads[1], state).squares)  # not asked
    g = _copy(grads[2])
    g[0][3, 4] = np.inf
    with np.errstate(invalid="ignore"):  # inf / inf in Adam's step: the NaN it is about
        assert not step(opt, 0.01, 3, params, g, state).finite


def test_a_shard_reverts_to_the_weights_before_its_last_step_without_copying_them():
    """The step writes into the spare arrays and swaps: revert gives back the old ones exactly,
    a rollback the block's snapshot."""
    layers = Layers(40, (32,), 5)  # W (33 x 41), V (5 x 33): augmented, bias last
    rng = np.random.default_rng(1)
    params = [rng.normal(size=s) for s in layers.full_shapes()]
    opt = optimizer({"name": "adam", "convention": "scikit-learn"})
    shard = Shard.fresh(layers, 0, params, opt)
    shard.snapshot(0)
    biases = layers.bias_columns((0, layers.m), True)
    assert shard.update([rng.normal(size=p.shape) for p in params], 0.1, opt, 1)
    before = _copy(shard.params), {k: _copy(v) for k, v in shard.state.items()}
    assert shard.update(
        [rng.normal(size=p.shape) for p in params], 0.1, opt, 2, batch=8, alpha=1e-2, biases=biases
    )
    assert shard.squares == pytest.approx(penalty(shard.params, biases), rel=1e-13)
    assert not all(np.array_equal(a, b) for a, b in zip(before[0], shard.params))
    shard.revert()
    assert all(np.array_equal(a, b) for a, b in zip(before[0], shard.params))
    assert all(
        np.array_equal(a, b) for k in before[1] for a, b in zip(before[1][k], shard.state[k])
    )
    assert np.isnan(shard.squares)  # not known for the weights reverted to
    assert shard.rollback() == 0
    assert all(np.array_equal(a, b) for a, b in zip(params, shard.params))
    assert all(not a.any() for v in shard.state.values() for a in v)
