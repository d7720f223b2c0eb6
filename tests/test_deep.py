"""Deep networks (several hidden layers) on a real cluster equal the serial reference, and the serial
reference equals PyTorch.

Every hidden layer is cut by the same rectangles of the plan (dask_rpm.nn.layers); inside a column the
workers gather activations between layers and sum the deltas (dask_rpm.engine.column). So a column of
several workers is where a deep network differs from the paper's one hidden layer, and every test
here has some.

* ``fit`` equals ``fit_serial`` (float64, relative 1e-10) for depths 1 to 4 x activation x optimizer x
  bias x full/mini batch x loss/output head x plan (1 to 4 columns, explicit and SRPM): a covering
  selection of that grid (every value of every axis, many pairs), not the full cross product;
* through a forced column remap and a whole remap, through DRPM's own remaps, through the loss of a
  worker (rows from another column, or from the last checkpoint) and through a resume from a
  checkpoint (``on_checkpoint``'s state, and the ``checkpoint_dir`` store the workers wrote);
* ``fit_serial`` of a deep network equals an ``nn.Sequential`` trained by ``torch.optim`` from the
  same weights on the same batches (1e-9 relative after 50 steps);
* ``FitResult.stats["memory"]``, less each worker's buddy copies: each column holds the whole
  network and its optimizer slots once, a faster worker of a column holds more of it.

Each problem is first shown to be well conditioned: a 1e-15 relative change of the first layer's
initial weights (of the learning rate by 1e-12, where the run starts from the seeded default weights)
moves the serial result by less than 1e-12 relative, so agreeing to 1e-10 says that the arithmetic is
the same, and is not luck; and the weights are shown to move.
"""

from __future__ import annotations

import itertools

import dask
import numpy as np
import pytest
from distributed import Client, LocalCluster

from dask_rpm.drpm.remap import column_remap, whole_remap
from dask_rpm.engine import fit, ordered_workers, store
from dask_rpm.engine.callbacks import TrainingCallback
from dask_rpm.nn.batches import BatchSchedule
from dask_rpm.nn.kernels import init_params
from dask_rpm.nn.layers import Layers
from dask_rpm.nn.serial import fit_serial
from dask_rpm.plan.partition import Plan

RTOL = 1e-10
S, N, L = 48, 5, 3
ITERATIONS = 20
SEED = 0  # fit's seed (the default initial weights, the mini-batch order)
BATCH = 16
HIDDEN = {1: (7,), 2: (7, 5), 3: (7, 5, 6), 4: (6, 7, 5, 6)}
LR = {"sgd": 2e-3, "momentum": 1e-3, "adam": 1e-3}
HEADS = {
    "sq-sigmoid": ("squared", "sigmoid"),
    "sq-linear": ("squared", "linear"),
    "ce-softmax": ("cross-entropy", "softmax"),
}
#: SRPM abilities of the four workers and what they give here: a column of three unequal workers
#: beside one of the fastest; a column of the two slow workers beside two single ones.
SRPM_ABILITIES = {"srpm-3+1": [50.0, 3.0, 2.0, 1.0], "srpm-2+1+1": [1.0, 1.0, 0.1, 0.1]}


# ----------------------------------------------------------------------------- problems and helpers
def _problem(head: str, depth: int, bias: bool, seed: int = 0):
    """Inputs, targets (class labels for cross-entropy), ``fit``'s ``init`` and the initial weights
    and biases (None without bias terms) it stands for, ``W_1 .. W_L, V``."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(S, N))
    if HEADS[head][0] == "cross-entropy":
        d = rng.integers(0, L, size=S)
        d[:L] = np.arange(L)  # every class occurs
    else:
        d = rng.uniform(0.1, 0.9, size=(S, L))
    dims = [N, *HIDDEN[depth], L]
    weights = [
        rng.uniform(-1.0, 1.0, (dims[k + 1], dims[k])) / np.sqrt(dims[k])
        for k in range(len(dims) - 1)
    ]
    biases = [rng.uniform(-0.1, 0.1, dims[k + 1]) for k in range(len(dims) - 1)]
    if not _init_works(depth, bias):
        weights = init_params(Layers(N, HIDDEN[depth], L), seed=SEED)
    biases = biases if bias else None
    return x, d, _init(weights, biases), (weights, biases)


def _init_works(depth: int, bias: bool) -> bool:
    """Whether ``init=[W_1, ..., W_L, V]`` can be passed. Not for three hidden layers without bias
    terms: four arrays are taken for ``(W0, V0, b0, c0)`` (test_init_of_three_hidden_layers_without_bias);
    those runs start from the seeded default weights (:func:`init_params` with ``seed``) instead."""
    return bias or depth != 3


def _init(weights, biases=None):
    """``fit``'s ``init``: ``[W_1, ..., W_L, V]``, or ``(weights, biases)`` with bias terms; or None
    (the seeded default weights, which ``weights`` then are: :func:`_problem`)."""
    if biases is None and not _init_works(len(weights) - 1, False):
        return None
    return list(weights) if biases is None else (list(weights), list(biases))


def _perturbed(init):
    """``init`` with the first layer's weights changed by 1e-15 relative."""
    weights, biases = init if isinstance(init, tuple) else (init, None)
    w1 = weights[0] * (1.0 + 1e-15 * np.sign(weights[0]))
    assert not np.array_equal(w1, weights[0])
    return _init([w1, *weights[1:]], biases)


def _kw(depth, head, act, opt, bias, batch, iterations=ITERATIONS):
    loss, output = HEADS[head]
    return dict(
        hidden=HIDDEN[depth],
        iterations=iterations,
        learning_rate=LR[opt],
        loss=loss,
        output=output,
        activation=act,
        optimizer=opt,
        bias=bias,
        batch_size=batch,
        seed=SEED,
    )


def _rel(a, b) -> float:
    """Largest difference over parameter lists, relative to each parameter's largest entry."""
    return max(float(np.abs(p - q).max() / np.abs(q).max()) for p, q in zip(a, b))


def _serial(x, d, init, kw, check=True):
    """fit_serial's result; with ``check`` also that the problem is well conditioned and that the
    weights moved (a comparison of two no-ops would mean nothing)."""
    ref = fit_serial(x, d, init=init, **kw)
    assert ref.stopped is None and ref.iterations == kw["iterations"]
    if check:
        if init is not None:
            other = fit_serial(x, d, init=_perturbed(init), **kw)
        else:  # the seeded default weights: change the learning rate by 1e-12 instead (still tiny)
            lr = kw["learning_rate"] * (1.0 + 1e-12)
            other = fit_serial(x, d, **dict(kw, learning_rate=lr))
        change = _rel(other.params, ref.params)
        assert change < 1e-12, (
            f"ill-conditioned problem ({change:.2e}): the comparison means nothing"
        )
        start = fit_serial(x, d, init=init, **dict(kw, iterations=1))
        moved = _rel(ref.params, start.params)
        assert moved > 1e-4, f"the weights barely moved ({moved:.2e})"
    return ref


def _assert_equal(r, ref, errors=None):
    """The distributed result ``r`` equals the serial ``ref`` (every parameter, every error)."""
    assert len(r.params) == len(ref.params)
    for got, want in zip(r.params, ref.params):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=1e-14 * np.abs(want).max())
    want_err = ref.errors if errors is None else errors
    np.testing.assert_allclose(r.history["error"].values, want_err, rtol=RTOL, atol=0)


def _m(depth: int, bias: bool) -> int:
    """Plan rows: the narrowest hidden layer as planned."""
    return min(HIDDEN[depth]) + bias


#: explicit layouts of the four workers: columns (top to bottom), sample widths, and the plan rows of
#: each worker as a function of m (the rows of every layer follow: dask_rpm.nn.layers)
LAYOUTS = {
    "1col": ([[0, 1, 2, 3]], [S], lambda m: [[1, 2, 1, m - 4]]),
    "2col": ([[0, 1], [2, 3]], [20, 28], lambda m: [[2, m - 2], [m - 3, 3]]),
    "3col": ([[0, 1], [2], [3]], [14, 20, 14], lambda m: [[m - 2, 2], [m], [m]]),
    "4col": ([[0], [1], [2], [3]], [10, 14, 12, 12], lambda m: [[m]] * 4),
}


def _plan(layout: str, depth: int, bias: bool) -> Plan:
    cols, widths, heights = LAYOUTS[layout]
    m = _m(depth, bias)
    return Plan.from_columns(cols, widths, heights(m), shape=(N + bias, m, L))


@pytest.fixture(scope="module")
def client4():
    """One 4-worker cluster for the module (in-process workers: starts in a second)."""
    with LocalCluster(
        n_workers=4, threads_per_worker=1, processes=False, dashboard_address=":0"
    ) as cluster:
        with Client(cluster) as client:
            yield client


# -------------------------------------------------------------------------- 1. fit equals fit_serial
# (depth, activation, optimizer, bias, batch, head, layout): every value of every axis, and every
# depth with a single column of four workers (the layer exchange at its widest) and with SRPM
GRID = [
    (1, "sigmoid", "sgd", False, None, "sq-sigmoid", "2col"),
    (1, "relu", "adam", True, BATCH, "ce-softmax", "1col"),
    (1, "tanh", "momentum", True, None, "sq-linear", "srpm-3+1"),
    (2, "sigmoid", "momentum", True, BATCH, "sq-sigmoid", "1col"),
    (2, "tanh", "adam", False, None, "ce-softmax", "3col"),
    (2, "relu", "sgd", True, None, "sq-linear", "4col"),
    (2, "tanh", "sgd", False, BATCH, "sq-sigmoid", "srpm-2+1+1"),
    (2, "sigmoid", "adam", True, BATCH, "ce-softmax", "2col"),
    (3, "sigmoid", "adam", True, None, "sq-linear", "2col"),
    (3, "tanh", "sgd", True, BATCH, "ce-softmax", "1col"),
    (3, "relu", "momentum", False, BATCH, "sq-sigmoid", "3col"),
    (3, "relu", "adam", True, BATCH, "sq-sigmoid", "srpm-3+1"),
    (3, "sigmoid", "momentum", False, None, "ce-softmax", "4col"),
    (4, "relu", "sgd", False, None, "ce-softmax", "2col"),
    (4, "sigmoid", "adam", False, BATCH, "sq-linear", "1col"),
    (4, "tanh", "momentum", True, BATCH, "ce-softmax", "srpm-2+1+1"),
    (4, "tanh", "adam", True, None, "sq-sigmoid", "1col"),
    (4, "relu", "momentum", True, None, "sq-linear", "4col"),
]
_AXES = [HIDDEN, ["sigmoid", "tanh", "relu"], LR, [False, True], [None, BATCH], HEADS]
assert all({case[i] for case in GRID} == set(axis) for i, axis in enumerate(_AXES))
assert {case[-1] for case in GRID} == set(LAYOUTS) | set(SRPM_ABILITIES)


def _grid_id(case) -> str:
    depth, act, opt, bias, batch, head, layout = case
    return f"d{depth}-{act}-{opt}-{'bias' if bias else 'nobias'}-{batch or 'full'}-{head}-{layout}"


@pytest.mark.parametrize("case", GRID, ids=[_grid_id(c) for c in GRID])
def test_deep_fit_equals_serial(client4, case):
    depth, act, opt, bias, batch, head, layout = case
    x, d, init, _ = _problem(head, depth, bias, seed=depth)
    kw = _kw(depth, head, act, opt, bias, batch)
    ref = _serial(x, d, init, kw)
    if layout in SRPM_ABILITIES:
        mapping = dict(mapping="srpm", abilities=SRPM_ABILITIES[layout])
    else:
        mapping = dict(mapping=_plan(layout, depth, bias))
    r = fit(x, d, init=init, client=client4, interval=7, progress="none", **mapping, **kw)
    _assert_equal(r, ref)
    plan = r.plan
    if layout in SRPM_ABILITIES:
        assert plan.method == "srpm"
        # the layer exchange runs: some column has several workers
        assert max(len(c) for c in plan.columns) >= 2, plan.columns
    else:
        assert [list(c) for c in plan.columns] == LAYOUTS[layout][0]
    # every layer is held: W_k (m_k (+1), ...) and V (l, m_L (+1)) as the serial run has them
    shapes = [p.shape for p in ref.params]
    assert len(shapes) == depth + 1 and shapes[-1] == (L, HIDDEN[depth][-1] + bias)
    if head == "ce-softmax":
        assert list(r.classes) == list(range(L))


def test_init_of_three_hidden_layers_without_bias():
    """``init=[W_1, ..., W_L, V]`` is the documented form; for L = 3 it is four arrays."""
    x, d, _, _ = _problem("sq-linear", 3, False)
    kw = _kw(3, "sq-linear", "tanh", "sgd", False, None, iterations=5)
    weights = init_params(Layers(N, HIDDEN[3], L), seed=SEED)
    given = fit_serial(x, d, init=list(weights), **kw)
    default = fit_serial(x, d, **kw)  # the same weights, from the seed
    assert _rel(given.params, default.params) == 0.0


# --------------------------------------------------------------------- 2. remaps, loss and resume
class _Remapper(TrainingCallback):
    """Remaps through the engine's own remap path at fixed iterations (tests/test_training.py)."""

    def __init__(self, at: dict[int, tuple[str, list[float]]]) -> None:
        self.at = at
        self.kinds: list[tuple[int, str]] = []

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


@pytest.mark.parametrize(
    "depth,act,opt,head",
    [(2, "relu", "adam", "ce-softmax"), (3, "tanh", "momentum", "sq-sigmoid")],
)
def test_deep_fit_through_a_column_and_a_whole_remap_equals_serial(client4, depth, act, opt, head):
    x, d, init, _ = _problem(head, depth, True, seed=10 + depth)
    kw = _kw(depth, head, act, opt, True, BATCH, iterations=24)
    ref = _serial(x, d, init, kw)
    plan = _plan("2col", depth, True)
    remapper = _Remapper({8: ("column", [0.5, 0.1, 0.1, 0.5]), 16: ("whole", [0.5, 0.2, 0.2, 0.1])})
    r = fit(
        x,
        d,
        init=init,
        mapping=plan,
        client=client4,
        interval=4,
        progress="none",
        callbacks=[remapper],
        **kw,
    )
    assert remapper.kinds == [(8, "column"), (16, "whole")]
    assert len(r.plans) == 3
    # the column remap kept the columns and moved rows inside them; the whole remap replanned
    assert r.plans[1].columns == r.plans[0].columns
    assert [r_.hidden for r_ in r.plans[1].rectangles] != [r_.hidden for r_ in plan.rectangles]
    assert r.plans[2].method == "srpm"
    _assert_equal(r, ref)


def test_deep_fit_through_drpm_remaps_equals_serial(client4):
    """DRPM without initial abilities remaps the whole plan at its first check; T_line 1.0 then remaps
    at every later check with any imbalance at all."""
    x, d, init, _ = _problem("sq-sigmoid", 3, True, seed=21)
    kw = _kw(3, "sq-sigmoid", "sigmoid", "adam", True, None, iterations=30)
    ref = _serial(x, d, init, kw)
    with dask.config.set({"rpm.drpm.t-line": 1.0}):
        r = fit(x, d, init=init, mapping="drpm", client=client4, interval=5, progress="none", **kw)
    assert r.remaps and r.remaps[0]["kind"] == "whole"
    assert all(rec["kind"] in ("whole", "column") for rec in r.remaps)
    assert len(r.plans) == len(r.remaps) + 1
    _assert_equal(r, ref)


@pytest.mark.parametrize(
    "layout",
    [
        "two-columns",
        "one-column",
        "one-column-store",
    ],
)
@pytest.mark.slow
def test_deep_fit_through_a_worker_loss_equals_serial(layout, sigkill_after, tmp_path):
    """A worker process killed mid-run: its rows of every layer (and their adam moments) come from the
    other column, or - one column - from the last checkpoint (gathered to the driver, or in the store
    the workers wrote), the iterations since computed again."""
    depth = 3
    x, d, init, _ = _problem("sq-linear", depth, True, seed=30)
    kw = _kw(depth, "sq-linear", "tanh", "adam", True, BATCH, iterations=30)
    ref = _serial(x, d, init, kw)
    m = _m(depth, True)
    if layout == "two-columns":
        plan = Plan.from_columns(
            [[0, 1], [2, 3]], [20, 28], [[2, m - 2], [m - 3, 3]], shape=(N + 1, m, L)
        )
    else:
        plan = Plan.from_columns([[0, 1, 2]], [S], [[2, 2, m - 4]], shape=(N + 1, m, L))
    with (
        LocalCluster(
            n_workers=4, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        victim = ordered_workers(client.scheduler_info())[1]
        killer = sigkill_after(client, victim, at=15)
        r = fit(
            x,
            d,
            init=init,
            mapping=plan,
            client=client,
            interval=5,
            checkpoint_every=10,
            checkpoint_dir=tmp_path / "ck" if layout.endswith("store") else None,
            callback=killer,
            progress="none",
            **kw,
        )
    assert killer.fired == [15]
    (rec,) = [rec for rec in r.remaps if rec.get("lost")]
    assert rec["lost"] == [victim]
    assert rec["recovered_from"] == ("columns" if layout == "two-columns" else "checkpoint")
    if layout.endswith("store"):
        assert r.stats["checkpoints"] and store.read_manifest(tmp_path / "ck")["iteration"] == 30
    assert victim not in [r.plan.workers[w] for w in r.plan.planned_workers]
    _assert_equal(r, ref)


def _stop_after(k: int):
    """``callback`` and ``should_stop`` for fit: stop at the first block boundary at or after ``k``."""
    seen: list[int] = []
    return (lambda info: seen.append(info["iteration"])), (lambda: bool(seen) and seen[-1] >= k)


def _resume_case():
    depth = 3
    x, d, init, _ = _problem("ce-softmax", depth, True, seed=40)
    kw = _kw(depth, "ce-softmax", "relu", "adam", True, BATCH, iterations=24)
    return depth, x, d, init, kw, _serial(x, d, init, kw)


def test_deep_fit_resumed_from_an_on_checkpoint_state_equals_serial(client4):
    """Stop after the checkpoint at 10, resume from what on_checkpoint received (every layer's weights
    and adam moments) on another plan: the weights and errors of one uninterrupted run."""
    depth, x, d, init, kw, ref = _resume_case()
    saved: list[dict] = []
    callback, stop = _stop_after(10)
    first = fit(
        x,
        d,
        init=init,
        mapping=_plan("2col", depth, True),
        client=client4,
        interval=5,
        checkpoint_every=10,
        on_checkpoint=saved.append,
        callback=callback,
        should_stop=stop,
        progress="none",
        **kw,
    )
    assert first.stopped and first.stopped.startswith("stop requested")
    (state,) = saved
    assert state["iteration"] == 10 and set(state["optimizer_state"]) == {"m", "v"}
    assert [p.shape for p in state["params"]] == [p.shape for p in ref.params]
    assert all(len(v) == depth + 1 for v in state["optimizer_state"].values())
    r = fit(
        x,
        d,
        init=init,
        mapping=_plan("1col", depth, True),
        client=client4,
        interval=5,
        resume=state,
        progress="none",
        **kw,
    )
    assert r.stats["start"]["iteration"] == 10
    assert list(r.history["iteration"].values) == list(range(10, 24))
    _assert_equal(r, ref, errors=ref.errors[10:])


def test_deep_fit_resumed_from_a_checkpoint_store_equals_serial(client4, tmp_path):
    """As above, from the store the workers wrote their rows of every layer into (checkpoint_dir)."""
    depth, x, d, init, kw, ref = _resume_case()
    ck = tmp_path / "ck"
    callback, stop = _stop_after(10)
    common = dict(init=init, client=client4, interval=5, checkpoint_every=10, progress="none")
    first = fit(
        x,
        d,
        mapping=_plan("2col", depth, True),
        checkpoint_dir=ck,
        callback=callback,
        should_stop=stop,
        **common,
        **kw,
    )
    assert first.stopped and first.stopped.startswith("stop requested")
    man = store.read_manifest(ck)
    assert man["iteration"] == 10 and sorted(man["optimizer_slots"]) == ["m", "v"]
    r = fit(
        x,
        d,
        mapping=_plan("1col", depth, True),
        checkpoint_dir=ck,
        resume=str(ck),
        **common,
        **kw,
    )
    assert r.stats["start"] == {**r.stats["start"], "iteration": 10, "from": "checkpoint store"}
    assert list(r.history["iteration"].values) == list(range(10, 24))
    _assert_equal(r, ref, errors=ref.errors[10:])
    # the manifest names the network trained, every hidden layer
    assert store.read_manifest(ck)["shape"] == [N + 1, *(h + 1 for h in HIDDEN[depth]), L]


# ----------------------------------------------------------------------------- 3. against PyTorch
torch_cases = list(
    itertools.product(
        [2, 3],
        ["sq-sigmoid", "ce-softmax"],
        ["sgd", "momentum", "adam"],
        ["sigmoid", "tanh", "relu"],
    )
)
STEPS = 50


def _torch(x, d, weights, biases, *, head, optimizer, activation, batch):
    """The same network as an ``nn.Sequential`` in float64, trained by torch.optim on the same batches."""
    torch = pytest.importorskip("torch")
    nn = torch.nn
    act = {"sigmoid": nn.Sigmoid, "tanh": nn.Tanh, "relu": nn.ReLU}[activation]
    layers = []
    for k, w in enumerate(weights):
        lin = nn.Linear(w.shape[1], w.shape[0], bias=biases is not None, dtype=torch.float64)
        with torch.no_grad():
            lin.weight.copy_(torch.from_numpy(w))
            if biases is not None:
                lin.bias.copy_(torch.from_numpy(biases[k]))
        layers.append(lin)
        if k < len(weights) - 1:
            layers.append(act())
    if head == "sq-sigmoid":
        layers.append(nn.Sigmoid())
    model = nn.Sequential(*layers)
    lr = LR[optimizer]
    params = list(model.parameters())
    opt = {
        "sgd": lambda: torch.optim.SGD(params, lr=lr),
        "momentum": lambda: torch.optim.SGD(params, lr=lr, momentum=0.9),
        "adam": lambda: torch.optim.Adam(params, lr=lr, betas=(0.9, 0.999), eps=1e-8),
    }[optimizer]()
    xt = torch.from_numpy(x)
    dt = torch.from_numpy(np.eye(L)[d] if head == "ce-softmax" else d)
    sched = BatchSchedule(S, batch, False, 0)
    for k in range(STEPS):
        idx = torch.from_numpy(sched.indices(k)) if batch else torch.arange(S)
        out = model(xt[idx])
        if head == "ce-softmax":  # d: class probabilities (one-hot), summed over samples
            err = nn.functional.cross_entropy(out, dt[idx], reduction="sum")
        else:
            err = 0.5 * nn.functional.mse_loss(out, dt[idx], reduction="sum")
        opt.zero_grad()
        err.backward()
        opt.step()
    lins = [m for m in model if isinstance(m, nn.Linear)]
    return (
        [m.weight.detach().numpy().copy() for m in lins],
        [m.bias.detach().numpy().copy() for m in lins] if biases is not None else None,
    )


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize(
    "depth,head,optimizer,activation", torch_cases, ids=["-".join(map(str, c)) for c in torch_cases]
)
def test_deep_fit_serial_equals_pytorch(depth, head, optimizer, activation, bias):
    pytest.importorskip("torch")
    x, d, init, (weights, biases) = _problem(head, depth, bias, seed=50 + depth)
    # full batch for two hidden layers; mini-batches in order (shuffle=False) for three
    batch = None if depth == 2 else BATCH
    kw = dict(_kw(depth, head, activation, optimizer, bias, batch, iterations=STEPS), shuffle=False)
    ours = _serial(x, d, init, kw)
    w_ours, b_ours = ours.recipe.net.split_params(ours.params)
    w_ref, b_ref = _torch(
        x, d, weights, biases, head=head, optimizer=optimizer, activation=activation, batch=batch
    )
    assert [w.shape for w in w_ours] == [w.shape for w in weights]
    diff = _rel(w_ours, w_ref)
    if bias:
        diff = max(diff, _rel(b_ours, b_ref))
    else:
        assert b_ours == [None] * (depth + 1)
    assert diff < 1e-9, f"dask_rpm and PyTorch differ by {diff:.2e} relative after {STEPS} steps"


# --------------------------------------------------------------------------------------- 4. memory
@pytest.mark.parametrize("opt,slots", [("sgd", 0), ("momentum", 1), ("adam", 2)])
def test_memory_of_each_worker_sums_to_the_network_per_column(client4, opt, slots):
    depth, bias = 3, True
    abilities = SRPM_ABILITIES["srpm-3+1"]
    x, d, init, _ = _problem("sq-sigmoid", depth, bias, seed=60)
    kw = _kw(depth, "sq-sigmoid", "tanh", opt, bias, None)
    r = fit(
        x, d, init=init, mapping="srpm", abilities=abilities, client=client4, progress="none", **kw
    )
    _assert_equal(r, _serial(x, d, init, kw, check=False))
    plan, total = r.plan, r.stats["memory"]
    # stats["memory"] counts each worker's buddy copies too (engine.buddies); the shards alone:
    copies = r.stats["buddies"]["memory"]
    assert copies and all(v > 0 for v in copies.values())
    memory = {a: total[a] - copies.get(a, 0) for a in total}
    address = {w: plan.workers[w] for w in plan.planned_workers}
    assert set(memory) == set(address.values())
    whole = sum(p.size for p in r.params) * np.dtype("float64").itemsize
    # W_1 (7+1, 5+1), W_2 (5+1, 7+1), W_3 (6+1, 5+1), V (3, 6+1): bias units and inputs included
    assert whole == 8 * (8 * 6 + 6 * 8 + 7 * 6 + 3 * 7)
    for col in plan.columns:
        assert sum(memory[address[w]] for w in col) == whole * (1 + slots)
    # a column of three unequal workers: the faster, the more rows of every layer and the more bytes
    (big,) = [c for c in plan.columns if len(c) >= 3]
    by_speed = sorted(big, key=lambda w: abilities[w], reverse=True)
    held = [memory[address[w]] for w in by_speed]
    assert held == sorted(held, reverse=True) and held[0] > held[-1], (by_speed, held)
    # the single fastest worker's column holds everything
    (alone,) = [c for c in plan.columns if len(c) == 1]
    assert memory[address[alone[0]]] == whole * (1 + slots)
    # the same total as the serial network's parameters and optimizer state
    assert sum(memory.values()) == plan.n_columns * whole * (1 + slots)
    if slots:
        assert len(r.optimizer_state) == slots


# ------------------------------------------------------------------------- 5. timing of a column
def test_a_layered_column_times_each_member_s_own_kernels_not_the_wait():
    """In a column of a fast and a slow worker, a deep network goes layer by layer and the fast
    worker waits on the slow one between layers; its timing record's compute (``tc``, what DRPM
    estimates speeds from) must be its own kernels, not that wait (before, both members showed
    the slow one's time, and DRPM could keep the slow worker and idle the fast one)."""
    import dask_rpm

    rng = np.random.default_rng(3)
    x, d = rng.standard_normal((256, 12)), rng.uniform(0.1, 0.9, (256, 3))
    plan = Plan.from_columns([[0, 1]], [256], [[16, 16]], shape=(12, 32, 3))
    with dask_rpm.local_cluster([1.0, 0.1]) as cluster, Client(cluster) as client:
        r = fit(
            x,
            d,
            hidden=(48, 32),
            iterations=12,
            learning_rate=1e-4,
            mapping=plan,
            client=client,
            progress="none",
        )
    tc = r.history["tc"].values[4:]  # (iteration, worker), after the first block's warm-up
    fast, slow = np.nanmedian(tc[:, 0]), np.nanmedian(tc[:, 1])
    # the EMULATED speeds are 10 : 1 and the rows equal: own kernels differ about tenfold,
    # a shared wait would make them equal
    assert slow > 4 * fast, (fast, slow)
    ref = fit_serial(x, d, hidden=(48, 32), iterations=12, learning_rate=1e-4)
    for a, b in zip(r.params, ref.params):
        np.testing.assert_allclose(a, b, rtol=RTOL, atol=0)
