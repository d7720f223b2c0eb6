"""Training options on a real cluster equal the serial reference: every loss x activation x optimizer x
bias x batch size, through a column remap and a whole remap, for 1..N columns, through worker loss.

Every problem here is well conditioned (small learning rate, few iterations): each test first checks
that a 1e-15 relative change of the initial weights moves the serial result by less than 1e-12, so a
1e-10 agreement between summation orders is a meaningful check and not luck.
"""

from __future__ import annotations

import itertools

import dask.config
import numpy as np
import pytest
from distributed import Client, LocalCluster

from dask_rpm.drpm.remap import column_remap, whole_remap
from dask_rpm.engine import fit, ordered_workers
from dask_rpm.engine.callbacks import TrainingCallback
from dask_rpm.nn.data import write_dataset
from dask_rpm.nn.kernels import init_weights
from dask_rpm.nn.serial import fit_serial
from dask_rpm.plan.partition import Plan
from dask_rpm.planners import make_plan

RTOL = 1e-10
S, N, M, L = 90, 7, 9, 3
ITERATIONS = 12
LR = 2e-3

OUTPUTS = [("squared", "sigmoid"), ("squared", "linear"), ("cross-entropy", "softmax")]
ACTIVATIONS = ["sigmoid", "tanh", "relu"]
OPTIMIZERS = ["sgd", "momentum", "adam"]
GRID = list(itertools.product(OUTPUTS, ACTIVATIONS, OPTIMIZERS, [False, True], [None, 16]))


def _problem(loss: str, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(S, N))
    if loss == "cross-entropy":
        return x, rng.integers(0, L, size=S)  # class labels, one-hot encoded by fit
    return x, rng.uniform(0.1, 0.9, size=(S, L))


def _kw(out, act, opt, bias, batch):
    loss, output = out
    lr = LR if opt != "adam" else 1e-3  # adam's steps are lr-sized whatever the gradient
    return dict(
        hidden=M,
        iterations=ITERATIONS,
        learning_rate=lr,
        loss=loss,
        output=output,
        activation=act,
        optimizer=opt,
        bias=bias,
        batch_size=batch,
        seed=0,
    )


def _assert_well_conditioned(x, d, kw):
    """A 1e-15 relative change of W0 must not grow beyond 1e-12 in the serial run."""
    W0, V0 = init_weights(N, M, L, seed=0, scale=0.1)
    W_a, V_a = fit_serial(
        x, d, init=(W0, V0), **{k: v for k, v in kw.items() if k != "hidden"}
    ).params
    W_b, V_b = fit_serial(
        x, d, init=(W0 * (1 + 1e-15), V0), **{k: v for k, v in kw.items() if k != "hidden"}
    ).params
    change = max(
        np.abs(W_a - W_b).max() / np.abs(W_a).max(), np.abs(V_a - V_b).max() / np.abs(V_a).max()
    )
    assert change < 1e-12, (
        f"problem is ill-conditioned ({change:.2e}); the comparison would mean nothing"
    )


def _assert_serial(r, x, d, kw, iterations=None):
    kw = dict(kw, iterations=iterations or kw["iterations"])
    ref = fit_serial(x, d, **kw)
    (W, V), err = ref.params, ref.errors
    np.testing.assert_allclose(r.params[0], W, rtol=RTOL, atol=1e-14 * np.abs(W).max())
    np.testing.assert_allclose(r.params[-1], V, rtol=RTOL, atol=1e-14 * np.abs(V).max())
    np.testing.assert_allclose(r.history["error"].values, err, rtol=RTOL, atol=0)


class _Remapper(TrainingCallback):
    """Remaps through the engine's own remap path at fixed iterations: a column remap, then a whole one."""

    def __init__(self, at: dict[int, tuple[str, list[float]]]) -> None:
        self.at = at
        self.kinds: list[str] = []

    def boundary(self, done: int) -> int | None:
        later = [k for k in self.at if k > done]
        return min(later) - done if later else None

    async def after_block(self, info):
        job = self.at.get(info.iteration)
        if job is None or info.iteration in [k for k, _ in self.kinds]:
            return None
        kind, abilities = job
        d = info.driver
        new = (
            column_remap(d.plan, abilities) if kind == "column" else whole_remap(d.plan, abilities)
        )
        await d.remap(new, kind)
        self.kinds.append((info.iteration, kind))
        return None


@pytest.fixture(scope="module")
def client3():
    with LocalCluster(
        n_workers=3, threads_per_worker=1, processes=True, dashboard_address=":0"
    ) as cluster:
        with Client(cluster) as client:
            yield client


@pytest.mark.parametrize(
    "out,act,opt,bias,batch",
    GRID,
    ids=[
        f"{o[0]}-{o[1]}-{a}-{p}-{'bias' if b else 'nobias'}-{bs or 'full'}"
        for o, a, p, b, bs in GRID
    ],
)
def test_every_option_equals_serial_through_column_and_whole_remaps(
    client3, out, act, opt, bias, batch
):
    x, d = _problem(out[0])
    kw = _kw(out, act, opt, bias, batch)
    _assert_well_conditioned(x, d, kw)
    n_eff, m_eff = N + bias, M + bias
    plan = make_plan([0.5, 0.3, 0.2], (n_eff, m_eff, L), S, method="grid-h")  # 3 workers, 2 columns
    assert plan.n_columns >= 2
    remapper = _Remapper({4: ("column", [0.2, 0.3, 0.5]), 8: ("whole", [0.45, 0.35, 0.2])})
    r = fit(
        x, d, mapping=plan, client=client3, interval=5, progress="none", callbacks=[remapper], **kw
    )
    assert [k for _, k in remapper.kinds] == ["column", "whole"]
    assert len(r.plans) == 3
    _assert_serial(r, x, d, kw)
    if out[0] == "cross-entropy":
        assert list(r.classes) == [0, 1, 2]


@pytest.mark.parametrize("columns", [1, 2, 3, 4])
def test_one_to_n_columns_equal_serial_with_adam_minibatches_and_bias(columns):
    x, d = _problem("cross-entropy", seed=3)
    kw = _kw(("cross-entropy", "softmax"), "tanh", "adam", True, 20)
    _assert_well_conditioned(x, d, kw)
    shape = (N + 1, M + 1, L)
    cols = np.array_split(np.arange(4), columns)
    hidden = [list(np.diff(np.linspace(0, M + 1, len(c) + 1).astype(int))) for c in cols]
    widths = list(np.diff(np.linspace(0, S, columns + 1).astype(int)))
    plan = Plan.from_columns([list(map(int, c)) for c in cols], widths, hidden, shape=shape)
    with (
        LocalCluster(
            n_workers=4, threads_per_worker=1, processes=False, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        r = fit(x, d, mapping=plan, client=client, interval=5, progress="none", **kw)
    assert r.plan.n_columns == columns
    _assert_serial(r, x, d, kw)


def test_dataset_file_with_minibatches_and_a_validation_split_equals_serial(client3, tmp_path):
    x, d = _problem("squared", seed=5)
    path = write_dataset(tmp_path / "train.nc", x, d)
    kw = _kw(("squared", "sigmoid"), "sigmoid", "momentum", False, 16)
    kw.update(validation=0.2, validate_every=3)
    plan_kw = dict(mapping="srpm", abilities=[1.0, 0.6, 0.3])
    r = fit(str(path), client=client3, interval=4, progress="none", **plan_kw, **kw)
    out = fit_serial(x, d, **kw)
    np.testing.assert_allclose(r.params[0], out.params[0], rtol=RTOL)
    np.testing.assert_allclose(r.history["error"].values, out.errors, rtol=RTOL)
    # validation every 3 iterations, the same numbers as the serial run's
    assert list(r.history["validation_iteration"].values) == [3, 6, 9, 12]
    np.testing.assert_allclose(
        r.history["validation_loss"].values, [v for _, v, _ in out.validation], rtol=RTOL
    )


def test_early_stopping_stops_where_the_serial_run_stops(client3, capsys):
    rng = np.random.default_rng(9)
    x = rng.normal(size=(120, 5))
    y = (x[:, 0] + 0.3 * rng.normal(size=120) > 0).astype(int)
    kw = dict(
        hidden=6,
        epochs=200,
        batch_size=24,
        learning_rate=0.05,
        loss="cross-entropy",
        optimizer="adam",
        validation=0.25,
        early_stopping=3,
        bias=True,
        seed=1,
    )
    out = fit_serial(x, y, **kw)
    assert out.stopped and "early stopping" in out.stopped, "the problem must stop early to test it"
    import dask

    with dask.config.set({"rpm.train.progress-interval": 0}):  # a log line after every block
        r = fit(x, y, mapping="srpm", abilities=[1, 1, 1], client=client3, progress="log", **kw)
    assert r.stopped == out.stopped
    # the progress lines and the /rpm page show the validation numbers
    lines = capsys.readouterr().err
    v_it, v_loss, v_acc = out.validation[-1]
    assert f"val loss {v_loss:.4g} acc {100 * v_acc:.1f}%" in lines
    from dask_rpm import dashboard

    summary = client3.run_on_scheduler(
        lambda dask_scheduler: dashboard.snapshot(dask_scheduler.plugins["rpm"])["summary"]
    )
    assert summary["validation"][0] == v_it and summary["validation"][1] == pytest.approx(
        v_loss, rel=1e-9
    )
    assert r.history.sizes["iteration"] == out.iterations
    np.testing.assert_allclose(r.params[0], out.params[0], rtol=1e-9)
    assert 0.5 < r.history["validation_accuracy"].values[-1] <= 1.0


@pytest.mark.parametrize("layout", ["two-columns", "one-column"])
def test_optimizer_state_survives_a_worker_loss(layout, sigkill_after):
    """Adam's moments move with their rows: from another column, or from the checkpoint (one column)."""
    x, d = _problem("squared", seed=2)
    kw = _kw(("squared", "sigmoid"), "sigmoid", "adam", True, 30)
    kw["iterations"] = 40
    _assert_well_conditioned(x, d, kw)
    shape = (N + 1, M + 1, L)
    if layout == "two-columns":
        plan = Plan.from_columns([[0, 1], [2, 3]], [40, 50], [[4, 6], [5, 5]], shape=shape)
    else:
        plan = Plan.from_columns([[0, 1, 2]], [S], [[3, 3, 4]], shape=shape)
    with (
        LocalCluster(
            n_workers=4, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        victim = ordered_workers(client.scheduler_info())[1]
        killer = sigkill_after(client, victim, at=15)
        # one column: the checkpoint path a run without buddy copies takes (tests/test_buddies.py has them)
        with dask.config.set({"rpm.resilience.buddies": layout == "two-columns"}):
            r = fit(
                x,
                d,
                mapping=plan,
                client=client,
                interval=5,
                checkpoint_every=10,
                callback=killer,
                progress="none",
                **kw,
            )
    assert killer.fired
    (rec,) = [rec for rec in r.remaps if rec.get("lost")]
    assert rec["recovered_from"] == ("columns" if layout == "two-columns" else "checkpoint")
    _assert_serial(r, x, d, kw)


def test_resume_from_a_checkpoint_continues_batches_and_optimizer_state(client3):
    """Stop at a checkpoint, resume with fit(resume=...): the weights of an uninterrupted run."""
    x, d = _problem("cross-entropy", seed=4)
    kw = _kw(("cross-entropy", "softmax"), "relu", "adam", True, 16)
    kw["iterations"] = 24
    _assert_well_conditioned(x, d, kw)
    saved = []
    first = fit(
        x,
        d,
        mapping="srpm",
        abilities=[1.0, 0.5, 0.3],
        client=client3,
        interval=4,
        checkpoint_every=10,
        on_checkpoint=saved.append,
        should_stop=lambda: len(saved) >= 1,
        progress="none",
        **kw,
    )
    assert (
        first.stopped
        and saved[-1]["iteration"] == 10
        and set(saved[-1]["optimizer_state"]) == {"m", "v"}
    )
    r = fit(
        x, d, mapping="uniform", client=client3, interval=5, resume=saved[-1], progress="none", **kw
    )
    assert list(r.history["iteration"].values) == list(range(10, 24))
    ref = fit_serial(x, d, **kw)
    (W, V), err = ref.params, ref.errors
    np.testing.assert_allclose(r.params[0], W, rtol=RTOL, atol=1e-14 * np.abs(W).max())
    np.testing.assert_allclose(r.params[-1], V, rtol=RTOL, atol=1e-14 * np.abs(V).max())
    np.testing.assert_allclose(r.history["error"].values, err[10:], rtol=RTOL)
    with pytest.raises(Exception, match="optimizer 'sgd' needs"):
        fit(x, d, client=client3, resume=saved[-1], progress="none", **dict(kw, optimizer="sgd"))


# scikit-learn's objective (tests/test_estimators.py compares it with scikit-learn itself): the
# batch-mean gradient with an L2 penalty in every iteration's error, scikit-learn's optimizer
# arithmetic, its epoch order and its binary log loss - on every vertical exchange, since the
# penalty rides with the column's partial sums, and through a column and a whole remap
SKLEARN_CASES = [
    ("allgather", "adam", ("cross-entropy", "sigmoid")),
    ("leader", "sgd", ("cross-entropy", "softmax")),
    ("tree", "adam", ("squared", "linear")),
    ("direct", "sgd", ("cross-entropy", "sigmoid")),
]


@pytest.mark.parametrize(
    "vertical,opt,out", SKLEARN_CASES, ids=[f"{v}-{o}-{out[1]}" for v, o, out in SKLEARN_CASES]
)
def test_scikit_learn_objective_equals_serial_on_every_vertical_exchange(
    client3, vertical, opt, out
):
    import dask.config

    x, d = _problem(out[0], seed=7)
    if out[1] == "sigmoid":  # binary / multi-label: independent 0/1 targets
        d = (np.random.default_rng(7).uniform(size=(S, L)) > 0.5).astype(float)
    spec = {"name": opt, "convention": "scikit-learn"}
    if opt == "sgd":
        spec.update(momentum=0.9, nesterov=True)
    kw = dict(
        hidden=M,
        epochs=3,
        learning_rate=1e-2 if opt == "sgd" else 1e-3,
        loss=out[0],
        output=out[1],
        activation="relu",
        optimizer=spec,
        bias=True,
        batch_size=16,
        alpha=1e-2,
        reduction="mean",
        seed=0,
    )
    kw_serial = dict(kw, shuffle=np.random.RandomState(11))
    _assert_well_conditioned(x, d, kw_serial)
    plan = make_plan([0.2, 0.3, 0.5], (N + 1, M + 1, L), S, method="grid-h")
    remapper = _Remapper({7: ("column", [0.5, 0.3, 0.2]), 13: ("whole", [0.2, 0.3, 0.5])})
    with dask.config.set({"rpm.engine.vertical": vertical}):
        r = fit(
            x,
            d,
            mapping=plan,
            client=client3,
            interval=5,
            progress="none",
            callbacks=[remapper],
            shuffle=np.random.RandomState(11),
            **kw,
        )
    assert [k for _, k in remapper.kinds] == ["column", "whole"]
    ref = fit_serial(x, d, **kw_serial)
    (W, V), err = ref.params, ref.errors
    np.testing.assert_allclose(r.params[0], W, rtol=RTOL, atol=1e-14 * np.abs(W).max())
    np.testing.assert_allclose(r.params[-1], V, rtol=RTOL, atol=1e-14 * np.abs(V).max())
    np.testing.assert_allclose(r.history["error"].values, err, rtol=RTOL, atol=0)
    # the penalty is part of every iteration's error: without it the first error is lower
    plain = fit_serial(x, d, **dict(kw_serial, alpha=0.0, shuffle=np.random.RandomState(11))).errors
    assert err[0] > plain[0]
