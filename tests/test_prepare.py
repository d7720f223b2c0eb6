"""Training options are validated before any work, with messages that say what is valid."""

from __future__ import annotations

import numpy as np
import pytest

from dask_rpm.nn.data import DataError
from dask_rpm.nn.options import TrainingOptions
from dask_rpm.nn.prepare import prepare
from dask_rpm.nn.serial import fit_serial

rng = np.random.default_rng(0)
X = rng.normal(size=(40, 3))
D = rng.uniform(0.1, 0.9, size=(40, 2))
Y = rng.integers(0, 3, size=40)
BASE = dict(hidden=4, iterations=3, learning_rate=0.01, seed=0, dtype="float64")


@pytest.mark.parametrize(
    "x,d,kw,match",
    [
        (X, Y, {}, r"d is 1-D \(shape \(40,\)\); class labels need loss='cross-entropy'"),
        (X, D, dict(loss="cross-entropy"), "every row of d must be >= 0 and sum to 1"),
        (
            X,
            D,
            dict(epochs=2, iterations=5),
            "both iterations=5 and epochs=2 given; give one of them",
        ),
        (X, D, dict(early_stopping=3), "early_stopping=3 needs validation data"),
        (X, D, dict(validation=1.5), r"validation=1.5; give a fraction in \(0, 1\)"),
        (X, D, dict(validation=0.001), "holds out 0"),
        (X, D, dict(validation=(X[:5], D[:5, :1])), r"validation data x\(5, 3\), d\(5, 1\)"),
        (X, D, dict(batch_size=0), "batch_size=0; give a positive integer"),
        (X, D, dict(optimizer="lbfgs"), "optimizer 'lbfgs' is not known"),
        (X, D, dict(activation="swish"), "activation='swish'"),
        (
            X,
            Y,
            dict(
                loss="cross-entropy",
                init=(np.zeros((4, 3)), np.zeros((3, 4)), np.zeros(4), np.zeros(3)),
            ),
            r"init has bias terms \(b0, c0\) but bias=False",
        ),
    ],
)
def test_bad_training_options_are_refused_before_any_work(x, d, kw, match):
    with pytest.raises(DataError, match=match):
        prepare(x, d, TrainingOptions(**{**BASE, **kw}))


def test_labels_become_one_hot_and_classes_are_kept():
    job = prepare(
        X, np.array(["b", "a", "c", "a"] * 10), TrainingOptions(**BASE, loss="cross-entropy")
    )
    assert list(job.classes) == ["a", "b", "c"]
    assert job.arrays[1].shape == (40, 3) and np.all(job.arrays[1].sum(axis=1) == 1)


def test_epochs_set_the_iterations_from_the_batch_size():
    job = prepare(X, D, TrainingOptions(**{**BASE, "iterations": None}, epochs=3, batch_size=16))
    assert job.recipe.iterations == 3 * 3  # ceil(40 / 16) = 3 per epoch


def test_validation_split_is_seeded_and_disjoint():
    a = prepare(X, D, TrainingOptions(**BASE, validation=0.25))
    b = prepare(X, D, TrainingOptions(**BASE, validation=0.25))
    assert a.samples == 30 and len(a.validation[0]) == 10
    assert np.array_equal(a.validation[0], b.validation[0])
    rows = {tuple(r) for r in a.arrays[0]}
    assert not rows & {tuple(r) for r in a.validation[0]}


def test_fit_serial_with_bias_returns_augmented_weights():
    ref = fit_serial(X, D, hidden=4, iterations=3, learning_rate=0.01, bias=True)
    (W, V), err = ref.params, ref.errors
    assert W.shape == (5, 4) and V.shape == (2, 5) and err.shape == (3,)
    assert np.all(W[-1] == 0.0)  # the bias unit has no input weights


def test_training_options_record_and_keywords_map_one_to_one():
    """fit_serial(options=...) equals the same keywords; a keyword may set a field the record
    leaves None, each option is given once, and an unknown name gets the closest valid one."""
    opts = TrainingOptions(**BASE, batch_size=8)
    ref = fit_serial(X, D, options=opts)
    (W1, V1), e1 = ref.params, ref.errors
    ref = fit_serial(X, D, **BASE, batch_size=8)
    (W2, V2), e2 = ref.params, ref.errors
    partial = TrainingOptions(hidden=4, seed=0, dtype="float64")
    ref = fit_serial(X, D, options=partial, iterations=3, learning_rate=0.01, batch_size=8)
    (W3, V3), e3 = ref.params, ref.errors
    for a, b, c in ((W1, W2, W3), (V1, V2, V3), (e1, e2, e3)):
        assert np.array_equal(a, b) and np.array_equal(a, c)
    with pytest.raises(TypeError, match="hidden given both in options= and as keyword"):
        fit_serial(X, D, options=opts, hidden=5)
    with pytest.raises(TypeError, match="did you mean 'batch_size'"):
        TrainingOptions.of(batchsize=8)
    assert TrainingOptions.of(opts, tol=0.5).tol == 0.5 and opts.tol is None  # frozen: a new record
