"""CUDA: the torch backend on a GPU, alone and beside CPU workers, equals numpy's serial result.

These need a GPU that torch sees and skip cleanly without one (CI has none: tests/test_backend.py
runs the same paths on torch-CPU there). On a GPU machine they are the checks of issue 25's
"exactness on every backend": float64 ``fit_serial`` on the GPU, and ``fit(backend="auto")`` on
``local_cluster(gpus=1)`` - worker 0 on the GPU, the others with numpy on their CPUs - through
DRPM's remaps and a resume, equal numpy ``fit_serial`` to 1e-10 relative. The problem is well
conditioned (tests/test_deep.py shows it for the same sizes and learning rates) and moves.
benchmarks/gpu_mixed.py measured the same on an H200 (docs/benchmarks.md).
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU here")

RTOL = 1e-10


def _problem():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((96, 6))
    d = np.eye(3)[rng.integers(0, 3, 96)]
    kw = dict(
        hidden=(7, 5),
        iterations=24,
        learning_rate=1e-3,
        bias=True,
        optimizer="adam",
        activation="tanh",
        loss="cross-entropy",
        batch_size=32,
    )
    return x, d, kw


def _close(a, b):
    for p, q in zip(a, b):
        np.testing.assert_allclose(p, q, rtol=RTOL, atol=0)


def test_fit_serial_on_the_gpu_equals_numpy():
    from dask_rpm import fit_serial

    x, d, kw = _problem()
    ref = fit_serial(x, d, **kw)
    got = fit_serial(x, d, backend="torch", device="cuda", **kw)
    assert all(isinstance(p, np.ndarray) for p in got.params)  # host results
    _close(ref.params, got.params)
    np.testing.assert_allclose(ref.errors, got.errors, rtol=RTOL)


def test_fit_on_a_gpu_beside_cpu_workers_equals_serial():
    from distributed import Client

    import dask_rpm
    from dask_rpm import fit, fit_serial

    x, d, kw = _problem()
    ref = fit_serial(x, d, **kw)
    with dask_rpm.local_cluster([1.0, 1.0, 1.0], gpus=1) as cluster, Client(cluster) as client:
        for mapping in ("uniform", "drpm"):
            r = fit(
                x,
                d,
                mapping=mapping,
                interval=4,
                backend="auto",
                client=client,
                progress="none",
                **kw,
            )
            assert sorted(set(r.stats["backend"].values()))[-1] == "torch-cuda"
            _close(ref.params, r.params)
        saved: list = []
        fit(
            x,
            d,
            mapping="uniform",
            checkpoint_every=12,
            on_checkpoint=saved.append,
            backend="auto",
            client=client,
            progress="none",
            **{**kw, "iterations": 12},
        )
        r = fit(
            x,
            d,
            mapping="drpm",
            interval=4,
            resume=saved[-1],
            backend="auto",
            client=client,
            progress="none",
            **kw,
        )
        _close(ref.params, r.params)


def _cnn():
    tnn = torch.nn
    torch.manual_seed(3)
    net = tnn.Sequential(
        tnn.Conv2d(2, 4, 3, padding=1), tnn.ReLU(), tnn.MaxPool2d(2),
        tnn.Conv2d(4, 6, 3, padding=1), tnn.Tanh(), tnn.Flatten(),
        tnn.Linear(6 * 4 * 4, 3),
    ).double()  # fmt: skip
    rng = np.random.default_rng(6)
    x = rng.standard_normal((48, 2, 8, 8))
    y = rng.integers(0, 3, 48)
    kw = dict(
        network=net, iterations=12, learning_rate=0.02, optimizer="adam", loss="cross-entropy",
        reduction="mean", batch_size=16,
    )  # fmt: skip
    return x, y, kw


def test_cnn_on_the_gpu_equals_numpy_serially_and_beside_cpu_workers():
    """A CNN (issue 32): torch's conv2d on the GPU, serially and as one worker of a column that
    splits every stage's channels with CPU workers, equals numpy's serial result (tests/test_cnn.py
    shows the problem well conditioned on the CPU)."""
    from distributed import Client

    import dask_rpm
    from dask_rpm import fit, fit_serial
    from dask_rpm.plan.partition import Plan

    x, y, kw = _cnn()
    ref = fit_serial(x, y, **kw)
    got = fit_serial(x, y, backend="torch", device="cuda", **kw)
    _close(ref.params, got.params)
    layers = ref.recipe.layers
    plan = Plan.from_columns([[0, 1, 2]], [48], [[1, 2, layers.m - 3]], shape=layers.plan_shape)
    with dask_rpm.local_cluster([1.0, 1.0, 1.0], gpus=1) as cluster, Client(cluster) as client:
        r = fit(x, y, mapping=plan, backend="auto", client=client, progress="none", **kw)
    assert "torch-cuda" in set(r.stats["backend"].values())
    _close(ref.params, r.params)
