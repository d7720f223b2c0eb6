"""Array backends (dask_rpm.nn.backend): torch on the CPU trains the network numpy trains, to rounding,
serially and on real clusters, and one cluster may mix the two.

A worker's kernels, weights and optimizer state live on its backend; everything that leaves it
(messages, checkpoints, the gathered weights) goes through host memory as numpy arrays. So what can
differ from numpy is where an array is placed, copied or staged, and the few operations the
libraries spell differently; every test here runs torch-cpu against numpy:

* the backend itself: ``resolve`` (``backend="auto"`` reads ``rpm.engine.cpu-backend`` where it
  runs), and the round trips between torch and numpy (``asarray``, ``copy_of``, ``to_host``,
  ``host_copy``, ``copyto``: a copy shares no memory with its source, a read-only source works);
* the kernels and optimizers: ``Workspace`` forward, output deltas and backward for every
  activation x output head x bias at depths 1 and 2, ``optim.step`` in both conventions,
  ``penalty`` / ``mean_gradient`` with bias columns, ``all_finite``, the probe's kernel pass:
  equal to numpy (1e-12);
* ``fit_serial(backend="torch", device="cpu")`` equals numpy ``fit_serial`` (float64, relative
  1e-10: weights and every iteration's error) over a covering selection of depth x activation x
  optimizer x bias x full/mini batch x head, with an L2 penalty on the batch mean and with early
  stopping; ``dask_rpm.MLPClassifier(backend="torch", device="cpu")`` equals the numpy one;
* ``fit(backend="torch", device="cpu")`` on a cluster of four in-process workers (the driver's
  arrays reach them by reference: what catches a torch tensor that shares its source's memory)
  equals numpy ``fit_serial`` for explicit plans of 1 to 4 columns and SRPM plans, with the
  one-hop and the scheduled exchanges (``rpm.engine.vertical`` / ``horizontal``, staged through
  host buffers), through a forced column and whole remap, DRPM's own remaps, the SIGKILL of a
  worker process (a cluster of processes: rows from the other column, or from the checkpoint
  store), and a resume from ``on_checkpoint``'s state and from a checkpoint store;
  ``stats["backend"]`` says torch-cpu; ``backend="auto"`` follows a changed
  ``rpm.engine.cpu-backend`` from one run to the next in the same workers;
* a MIXED cluster of four Nanny worker processes, two set to ``rpm.engine.cpu-backend: torch``:
  ``fit(backend="auto")`` runs numpy on two and torch-cpu on the others (``stats["backend"]``), in
  columns of one of each, and equals numpy ``fit_serial``, from the kernel probe's plan (each
  worker probed on its own backend) and through remaps of both kinds.

Each training problem is first shown to be well conditioned: a 1e-15 relative change of the first
layer's initial weights (of the learning rate by 1e-12, where the run starts from the seeded default
weights) moves the numpy serial result by less than 1e-12 relative, so agreeing to 1e-10 says that
the arithmetic is the same, and is not luck; and the weights are shown to move.
"""

from __future__ import annotations

import logging
import warnings

import dask
import dask.config
import numpy as np
import pytest
from distributed import Client, LocalCluster, Nanny, Scheduler, SpecCluster

torch = pytest.importorskip("torch")

from dask_rpm.drpm.remap import column_remap, whole_remap  # noqa: E402
from dask_rpm.engine import fit, ordered_workers, store  # noqa: E402
from dask_rpm.engine.callbacks import TrainingCallback  # noqa: E402
from dask_rpm.nn import backend as xb  # noqa: E402
from dask_rpm.nn import optim  # noqa: E402
from dask_rpm.nn.backend import NUMPY, Backend, BackendError  # noqa: E402
from dask_rpm.nn.kernels import Workspace, all_finite, init_params  # noqa: E402
from dask_rpm.nn.layers import Layers  # noqa: E402
from dask_rpm.nn.network import Network  # noqa: E402
from dask_rpm.nn.serial import SerialResult, fit_serial  # noqa: E402
from dask_rpm.plan.partition import Plan  # noqa: E402

TORCH = Backend("torch", "cpu")
ON_TORCH = dict(backend="torch", device="cpu")
ON_NUMPY = dict(backend="numpy", device="cpu")
RTOL = 1e-10
S, N, L = 48, 5, 3
ITERATIONS = 20
SEED = 0  # fit's seed (the default initial weights, the mini-batch order)
BATCH = 16
HIDDEN = {1: (7,), 2: (7, 5), 3: (7, 5, 6)}
LR = {"sgd": 2e-3, "momentum": 1e-3, "adam": 1e-3}
HEADS = {
    "sq-sigmoid": ("squared", "sigmoid"),
    "sq-linear": ("squared", "linear"),
    "ce-softmax": ("cross-entropy", "softmax"),
    "ce-sigmoid": ("cross-entropy", "sigmoid"),  # the binary / multi-label log loss
}
#: SRPM abilities of the four workers and what they give here: a column of three unequal workers
#: beside one of the fastest; a column of the two slow workers beside two single ones.
SRPM_ABILITIES = {"srpm-3+1": [50.0, 3.0, 2.0, 1.0], "srpm-2+1+1": [1.0, 1.0, 0.1, 0.1]}
QUIET = {"host": "127.0.0.1", "silence_logs": logging.ERROR}


def _rel_close(got, want, rtol, what=""):
    """``got`` equals ``want`` to ``rtol`` relative to ``want``'s largest entry (elementwise)."""
    got, want = xb.to_host(got), xb.to_host(want)
    assert got.shape == want.shape, what
    scale = float(np.abs(want).max()) or 1.0
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * scale, err_msg=what)


# ------------------------------------------------------------------------------ 1. the backend
def test_torch_resolves_to_torch_cpu_without_a_gpu():
    gpu = torch.cuda.is_available()
    assert xb.resolve("torch", "cpu") == TORCH and TORCH.label == "torch-cpu"
    assert xb.resolve("torch", "auto").label == ("torch-cuda" if gpu else "torch-cpu")
    assert xb.resolve("numpy", "auto") is NUMPY and NUMPY.label == "numpy"
    assert TORCH.ns is torch and NUMPY.ns is np
    t = TORCH.empty((2, 3), "float64")
    assert isinstance(t, torch.Tensor) and t.dtype == torch.float64 and t.device.type == "cpu"
    assert xb.namespace(t) is torch and xb.namespace(np.zeros(1)) is np
    assert xb.is_array(t) and xb.is_array(np.zeros(1)) and not xb.is_array([1.0])
    z = TORCH.zeros((2, 3), "float32")
    assert z.dtype == torch.float32 and not z.any()


def test_auto_is_the_cpu_backend_read_where_it_resolves():
    """``backend="auto"`` on a device without a GPU is ``rpm.engine.cpu-backend`` (numpy by
    default), read when it resolves; with ``device="auto"`` too where no GPU is seen."""
    with dask.config.set({"rpm.engine.cpu-backend": "torch"}):
        assert xb.resolve("auto", "cpu") == TORCH
        if not torch.cuda.is_available():
            assert xb.resolve("auto", "auto") == TORCH
    with dask.config.set({"rpm.engine.cpu-backend": "numpy"}):
        assert xb.resolve("auto", "cpu") is NUMPY
        if not torch.cuda.is_available():
            assert xb.resolve("auto", "auto") is NUMPY


@pytest.mark.parametrize("value", ["cupy", "jax", "auto", None])
def test_a_bad_cpu_backend_is_refused_with_the_valid_values(value):
    with dask.config.set({"rpm.engine.cpu-backend": value}):
        with pytest.raises(BackendError, match=r"rpm\.engine\.cpu-backend=.*valid: numpy, torch"):
            xb.resolve("auto", "cpu")
        # a named backend does not read it
        assert xb.resolve("torch", "cpu") == TORCH


def test_asarray_places_host_arrays_on_torch_and_keeps_its_own():
    a = np.arange(12.0).reshape(3, 4)
    t = TORCH.asarray(a)
    assert isinstance(t, torch.Tensor) and t.dtype == torch.float64 and t.is_contiguous()
    assert np.array_equal(t.numpy(), a)
    assert TORCH.asarray(t) is t  # nothing to change
    # a strided host array arrives C-contiguous
    tt = TORCH.asarray(a.T)
    assert tt.is_contiguous() and np.array_equal(tt.numpy(), a.T)
    # a dtype: converted on the way, from the host or from a tensor
    f = TORCH.asarray(a, dtype=np.float32)
    assert f.dtype == torch.float32 and np.array_equal(f.numpy(), a.astype(np.float32))
    f = TORCH.asarray(t, dtype=np.float32)
    assert f.dtype == torch.float32 and np.array_equal(f.numpy(), a.astype(np.float32))
    assert TORCH.asarray(t, dtype=np.float64) is t
    # a tensor of another layout comes back C-contiguous, as the docstring promises
    assert TORCH.asarray(t.T).is_contiguous() and np.array_equal(TORCH.asarray(t.T).numpy(), a.T)
    # numpy: host arrays as they are, tensors through the host
    assert NUMPY.asarray(a) is a
    back = NUMPY.asarray(t)
    assert isinstance(back, np.ndarray) and np.array_equal(back, a)
    assert NUMPY.asarray(t.T).flags.c_contiguous


def test_a_read_only_host_array_is_placed_without_a_warning_and_left_alone():
    """A received message is a read-only buffer: placing it copies (torch tensors are writable)."""
    a = np.arange(6.0).reshape(2, 3)
    ro = np.frombuffer(a.tobytes(), dtype=a.dtype).reshape(a.shape)
    assert not ro.flags.writeable
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch warns on a non-writable numpy array
        t = TORCH.asarray(ro)
        c = TORCH.copy_of(ro)
        dst = TORCH.zeros((2, 3), "float64")
        xb.copyto(dst, ro)
    for x in (t, c, dst):
        x += 1.0
        assert np.array_equal(x.numpy(), a + 1.0)
    assert np.array_equal(ro, a)


def test_copy_of_shares_no_memory_with_its_source():
    a = np.arange(12.0).reshape(3, 4)
    keep = a.copy()
    t = TORCH.copy_of(a)
    assert isinstance(t, torch.Tensor) and np.array_equal(t.numpy(), a)
    t += 100.0  # a copy: the host array stays as it was
    assert np.array_equal(a, keep)
    t2 = TORCH.copy_of(t)
    assert t2 is not t and t2.data_ptr() != t.data_ptr()
    t2 += 1.0
    assert np.array_equal(t.numpy(), keep + 100.0)
    f = TORCH.copy_of(a, dtype=np.float32)
    assert f.dtype == torch.float32 and np.array_equal(f.numpy(), keep.astype(np.float32))
    n = NUMPY.copy_of(a)
    assert n is not a and not np.shares_memory(n, a) and np.array_equal(n, a)
    n = NUMPY.copy_of(t)
    assert isinstance(n, np.ndarray) and not np.shares_memory(n, t.numpy())
    # a view of a larger array (a column's rows) is copied too
    v = TORCH.copy_of(a[1:])
    v += 1.0
    assert np.array_equal(a, keep)


def test_to_host_and_host_copy_give_numpy():
    a = np.arange(12.0).reshape(3, 4)
    t = torch.from_numpy(a.copy())
    h = xb.to_host(t)
    assert isinstance(h, np.ndarray) and h.dtype == np.float64 and np.array_equal(h, a)
    assert xb.to_host(a) is a
    c = xb.host_copy(t)
    assert isinstance(c, np.ndarray) and c.flags.c_contiguous and c.flags.writeable
    t += 1.0  # a copy does not follow the tensor
    assert np.array_equal(c, a)
    c = xb.host_copy(t.T)
    assert c.flags.c_contiguous and np.array_equal(c, (a + 1.0).T)
    c = xb.host_copy(a)
    assert c is not a and not np.shares_memory(c, a) and np.array_equal(c, a)
    # requires_grad tensors too (detached)
    g = torch.ones(2, dtype=torch.float64, requires_grad=True)
    assert np.array_equal(xb.host_copy(g), np.ones(2))


def test_copyto_between_torch_and_numpy():
    a = np.arange(12.0).reshape(3, 4)
    t = TORCH.zeros((3, 4), "float64")
    xb.copyto(t, a)  # host -> tensor
    assert np.array_equal(t.numpy(), a)
    a += 1.0  # no shared memory afterwards
    assert np.array_equal(t.numpy(), a - 1.0)
    h = np.zeros((3, 4))
    xb.copyto(h, t)  # tensor -> host
    assert np.array_equal(h, a - 1.0)
    u = TORCH.zeros((3, 4), "float64")
    xb.copyto(u, t)  # tensor -> tensor
    assert torch.equal(u, t)
    # into a strided view (a column's slice of the gathered activations), from a strided source
    full = TORCH.zeros((3, 6), "float64")
    xb.copyto(full[:, 2:5], a[:, 1:])
    assert np.array_equal(full[:, 2:5].numpy(), a[:, 1:]) and not full[:, :2].any()
    xb.copyto(full[:, :3], t.T[:3, :3].T)
    assert np.array_equal(full[:, :3].numpy(), (a - 1.0)[:, :3])


def test_dtype_of_and_the_other_spelled_operations():
    for dt in ("float64", "float32", "int64"):
        assert xb.dtype_of(TORCH.empty((1,), dt)) == np.dtype(dt)
        assert xb.dtype_of(np.empty(1, dt)) == np.dtype(dt)
    assert xb.dtype_of(torch.zeros(1, dtype=torch.bool)) == np.dtype(bool)
    assert xb.eps_of(TORCH.empty((1,), "float32")) == float(np.finfo(np.float32).eps)
    assert xb.eps_of(TORCH.empty((1,), "float64")) == float(np.finfo(np.float64).eps)
    rng = np.random.default_rng(1)
    a, b = rng.normal(size=(5, 4)), rng.normal(size=(5, 4))
    ta, tb = TORCH.asarray(a.copy()), TORCH.asarray(b.copy())
    assert xb.vdot(ta, tb) == pytest.approx(xb.vdot(a, b), rel=1e-14)
    assert isinstance(xb.vdot(ta, tb), float)
    assert np.array_equal(xb.row_max(ta).numpy(), xb.row_max(a))
    _rel_close(xb.row_sum(ta), xb.row_sum(a), 1e-14)
    assert xb.row_max(ta).shape == (5, 1)
    assert np.array_equal(xb.relu_(ta.clone()).numpy(), xb.relu_(a.copy()))
    assert np.array_equal(xb.positive_(ta.clone()).numpy(), xb.positive_(a.copy()))
    assert set(np.unique(xb.positive_(ta.clone()).numpy())) == {0.0, 1.0}
    xb.synchronize(ta)  # a no-op on the CPU
    xb.use_in_thread(TORCH)
    with xb.on_device(TORCH), xb.errstate(ta):
        pass


# ------------------------------------------------------------------------------- 2. the kernels
def _net_problem(depth, head, act, bias, seed):
    loss, output = HEADS[head]
    net = Network(activation=act, loss=loss, output=output, bias=bias)
    rng = np.random.default_rng(seed)
    layers = Layers(N + bias, tuple(h + bias for h in HIDDEN[depth]), L)
    params = init_params(layers, seed=seed, scale=0.8)
    x = net.augment(rng.normal(size=(S, N)))
    if head == "ce-softmax":
        d = np.eye(L)[rng.integers(0, L, S)]
    elif head == "ce-sigmoid":
        d = rng.integers(0, 2, (S, L)).astype(np.float64)
    else:
        d = rng.uniform(0.1, 0.9, (S, L))
    return net, params, x, d


def _kernel_pass(be, net, params, x, d, rows):
    """Forward, output deltas and backward on ``be`` over the first ``rows`` samples of a workspace
    of ``S`` (as a mini-batch uses it); everything it computed, in host memory."""
    ws = Workspace.whole(S, [be.copy_of(p) for p in params], net, 1.0 / L, backend=be)
    p = [be.copy_of(q) for q in params]
    xs, ds = be.asarray(x[:rows].copy()), be.asarray(d[:rows].copy())
    out = {}
    for _ in range(2):  # twice: the buffers are reused, the second pass must not see the first
        partial = ws.forward(xs, p)
        out["partial"] = xb.host_copy(partial)
        out["outputs"] = xb.host_copy(ws.outputs(partial))
        out["hidden"] = [xb.host_copy(ws.local(j)) for j in range(len(p) - 1)]
        delta2, err = ws.output_delta(partial, ds)
        out["delta2"], out["err"] = xb.host_copy(delta2), err
        grads = ws.backward(xs, p, delta2)
        out["grads"] = [xb.host_copy(g) for g in grads]
        out["deltas"] = [xb.host_copy(ws.delta(j)) for j in range(len(p) - 1)]
    assert isinstance(out["err"], float)
    return out


@pytest.mark.parametrize("depth", [1, 2])
@pytest.mark.parametrize("head", list(HEADS))
def test_workspace_on_torch_equals_numpy(head, depth):
    """Every activation x bias of one head and depth: forward (hidden outputs, partial product,
    outputs), output deltas and loss, backward (update sums, deltas), on all samples and on fewer
    (a mini-batch's leading rows), equal to numpy's to 1e-12."""
    for act in ("sigmoid", "tanh", "relu"):
        for bias in (False, True):
            net, params, x, d = _net_problem(depth, head, act, bias, seed=depth * 10 + bias)
            for rows in (S, 29):
                want = _kernel_pass(NUMPY, net, params, x, d, rows)
                got = _kernel_pass(TORCH, net, params, x, d, rows)
                case = f"{act} bias={bias} rows={rows}"
                assert got["err"] == pytest.approx(want["err"], rel=1e-12), case
                assert want["err"] > 0, case
                for key in ("partial", "outputs", "delta2"):
                    _rel_close(got[key], want[key], 1e-12, f"{key} {case}")
                for key in ("hidden", "grads", "deltas"):
                    assert len(got[key]) == len(want[key])
                    for i, (g, w) in enumerate(zip(got[key], want[key])):
                        _rel_close(g, w, 1e-12, f"{key}[{i}] {case}")
                # the update sums are not trivial: every layer gets a gradient
                assert all(np.abs(g).max() > 0 for g in want["grads"]), case
                if bias:  # the bias unit's output is held at 1 and its delta at 0
                    for h, dl in zip(got["hidden"], got["deltas"]):
                        assert np.all(h[:, -1] == 1.0)
                        assert np.all(dl[:, -1] == 0.0)


@pytest.mark.parametrize("head", ["sq-sigmoid", "ce-softmax", "ce-sigmoid"])
def test_output_deltas_of_extreme_pre_activations_are_finite_and_equal(head):
    """``exp`` overflows inside a sigmoid of a large negative pre-activation (numpy silenced, torch
    silent); softmax subtracts the row maximum: both stay finite, and equal."""
    loss, output = HEADS[head]
    net = Network(loss=loss, output=output)
    u = np.array([[-1000.0, 0.0, 1000.0], [800.0, -800.0, 3.0]])
    d = np.array([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    got, want = {}, {}
    for be, out in ((NUMPY, want), (TORCH, got)):
        ws = Workspace(2, layers=Layers(4, (5,), 3), net=net, backend=be)
        ws.use(2)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            delta2, err = ws.output_delta(be.asarray(u), be.asarray(d))
            h = ws.outputs(be.asarray(u))
        out.update(delta2=xb.host_copy(delta2), err=err, h=xb.host_copy(h))
    assert np.isfinite(want["err"]) and np.all(np.isfinite(want["delta2"]))
    assert got["err"] == pytest.approx(want["err"], rel=1e-12)
    _rel_close(got["delta2"], want["delta2"], 1e-12)
    _rel_close(got["h"], want["h"], 1e-12)


def test_the_probe_s_kernels_on_torch_equal_numpy():
    """The probe times the training kernels on the worker's backend (probe.kernel.block_data)."""
    from dask_rpm.nn.kernels import kernel_pass
    from dask_rpm.probe.kernel import block_data

    out = {}
    for be in (NUMPY, TORCH):
        ws, *arrays = block_data(6, 9, 3, 40, "float64", 2, be)
        assert all(xb.namespace(a) is be.ns for a in arrays)
        err = kernel_pass(ws, *arrays)
        out[be.label] = (err, [xb.host_copy(g) for g in ws.grads])
    (e_np, g_np), (e_t, g_t) = out["numpy"], out["torch-cpu"]
    assert e_t == pytest.approx(e_np, rel=1e-12)
    for a, b in zip(g_t, g_np):
        _rel_close(a, b, 1e-12)


#: (name, parameters): every optimizer in PyTorch's convention and in scikit-learn's, Nesterov or
#: not, and an Adam whose step count goes on from earlier steps (a continued partial_fit)
OPTIMIZERS = {
    "sgd": {"name": "sgd"},
    "momentum": {"name": "momentum", "momentum": 0.8},
    "adam": {"name": "adam"},
    "adam-continued": {"name": "adam", "steps": 7},
    "sklearn-sgd": {"name": "sgd", "convention": "scikit-learn", "momentum": 0.9},
    "sklearn-nesterov": {
        "name": "sgd",
        "convention": "scikit-learn",
        "momentum": 0.9,
        "nesterov": True,
    },
    "sklearn-adam": {"name": "adam", "convention": "scikit-learn", "beta2": 0.99},
}


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_optimizer_steps_on_torch_equal_numpy(name):
    opt = optim.optimizer(OPTIMIZERS[name])
    rng = np.random.default_rng(3)
    p0 = [rng.normal(size=(6, 4)), rng.normal(size=(3, 6))]
    grads = [[rng.normal(size=p.shape) for p in p0] for _ in range(5)]
    runs = {}
    for be in (NUMPY, TORCH):
        params = [be.copy_of(p) for p in p0]
        state = {s: [be.ns.zeros_like(p) for p in params] for s in opt.slots}
        for t, g in enumerate(grads, start=1):
            optim.step(opt, 0.01, t, params, [be.copy_of(a) for a in g], state)
        runs[be.label] = (params, state)
    (pn, sn), (pt, st) = runs["numpy"], runs["torch-cpu"]
    assert isinstance(pt[0], torch.Tensor)
    for a, b in zip(pt, pn):
        _rel_close(a, b, 1e-12)
    assert max(float(np.abs(a - b).max()) for a, b in zip(pn, p0)) > 1e-3  # they moved
    assert set(st) == set(sn) == set(opt.slots)
    for slot in sn:
        for a, b in zip(st[slot], sn[slot]):
            _rel_close(a, b, 1e-12)


def test_penalty_and_mean_gradient_on_torch_equal_numpy_without_the_bias_columns():
    rng = np.random.default_rng(4)
    p0 = [rng.normal(size=(6, 5)), rng.normal(size=(4, 6)), rng.normal(size=(3, 4))]
    g0 = [rng.normal(size=p.shape) for p in p0]
    biases = [4, 5, None]  # the bias input's column of W_1, the bias unit's of W_2; none in V
    want = optim.penalty(p0, biases)
    manual = sum(
        float((p**2).sum() - (0 if b is None else (p[:, b] ** 2).sum())) for p, b in zip(p0, biases)
    )
    assert want == pytest.approx(manual, rel=1e-13)
    assert optim.penalty([TORCH.copy_of(p) for p in p0], biases) == pytest.approx(want, rel=1e-12)
    gn = [g.copy() for g in g0]
    optim.mean_gradient(p0, gn, 16, 0.3, biases)
    pt, gt = [TORCH.copy_of(p) for p in p0], [TORCH.copy_of(g) for g in g0]
    optim.mean_gradient(pt, gt, 16, 0.3, biases)
    for a, b in zip(gt, gn):
        _rel_close(a, b, 1e-12)
    # the bias columns got no penalty: the plain mean there
    assert np.array_equal(gn[0][:, 4], g0[0][:, 4] / 16)
    assert not np.allclose(gn[0][:, 0], g0[0][:, 0] / 16)


@pytest.mark.parametrize("be", [NUMPY, TORCH], ids=lambda b: b.label)
def test_all_finite_sees_inf_and_nan(be):
    a = np.random.default_rng(5).normal(size=(4, 3))
    assert all_finite(be.asarray(a.copy()))
    for bad in (np.inf, -np.inf, np.nan):
        b = a.copy()
        b[2, 1] = bad
        assert not all_finite(be.asarray(b))
    # finite, but the sum overflows: the exact check decides
    big = np.full((2, 2), 1e308)
    with np.errstate(over="ignore"):
        assert all_finite(be.asarray(big))
        big[1, 1] = np.inf
        assert not all_finite(be.asarray(big))


# --------------------------------------------------------------------- problems of the training tests
def _problem(head: str, depth: int, bias: bool, seed: int = 0):
    """Inputs, targets (class labels for cross-entropy with softmax, 0/1 per output with a
    sigmoid) and ``fit``'s ``init``."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(S, N))
    if head == "ce-softmax":
        d = rng.integers(0, L, size=S)
        d[:L] = np.arange(L)  # every class occurs
    elif head == "ce-sigmoid":
        d = rng.integers(0, 2, size=(S, L)).astype(np.float64)
    else:
        d = rng.uniform(0.1, 0.9, size=(S, L))
    dims = [N, *HIDDEN[depth], L]
    weights = [
        rng.uniform(-1.0, 1.0, (dims[k + 1], dims[k])) / np.sqrt(dims[k])
        for k in range(len(dims) - 1)
    ]
    biases = [rng.uniform(-0.1, 0.1, dims[k + 1]) for k in range(len(dims) - 1)]
    return x, d, _init(weights, biases if bias else None)


def _init(weights, biases=None):
    """``fit``'s ``init``: ``[W_1, ..., W_L, V]``, or ``(weights, biases)`` with bias terms; None for
    three hidden layers without bias terms (four arrays would be taken for ``(W0, V0, b0, c0)``:
    those runs start from the seeded default weights)."""
    if biases is None:
        return None if len(weights) == 4 else list(weights)
    return list(weights), list(biases)


def _perturbed(init):
    """``init`` with the first layer's weights changed by 1e-15 relative."""
    weights, biases = init if isinstance(init, tuple) else (init, None)
    w1 = weights[0] * (1.0 + 1e-15 * np.sign(weights[0]))
    assert not np.array_equal(w1, weights[0])
    return _init([w1, *weights[1:]], biases)


def _kw(depth, head, act, opt, bias, batch, iterations=ITERATIONS, **extra):
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
        **extra,
    )


def _rel(a, b) -> float:
    """Largest difference over parameter lists, relative to each parameter's largest entry."""
    return max(float(np.abs(p - q).max() / np.abs(q).max()) for p, q in zip(a, b))


def _serial(x, d, init, kw, check=True, stops=False):
    """numpy fit_serial's result; with ``check`` also that the problem is well conditioned and that
    the weights moved (a comparison of two no-ops would mean nothing)."""
    ref = fit_serial(x, d, init=init, **ON_NUMPY, **kw)
    if not stops:
        assert ref.stopped is None and ref.iterations == kw["iterations"]
    if check:
        if init is not None:
            other = fit_serial(x, d, init=_perturbed(init), **ON_NUMPY, **kw)
        else:  # the seeded default weights: change the learning rate by 1e-12 instead (still tiny)
            lr = kw["learning_rate"] * (1.0 + 1e-12)
            other = fit_serial(x, d, **ON_NUMPY, **dict(kw, learning_rate=lr))
        assert other.iterations == ref.iterations
        change = _rel(other.params, ref.params)
        assert change < 1e-12, (
            f"ill-conditioned problem ({change:.2e}): the comparison means nothing"
        )
        start = fit_serial(x, d, init=init, **ON_NUMPY, **dict(kw, iterations=1))
        moved = _rel(ref.params, start.params)
        assert moved > 1e-4, f"the weights barely moved ({moved:.2e})"
    return ref


def _assert_equal(r, ref, errors=None):
    """The result ``r`` (a FitResult or a serial result) equals the serial ``ref``."""
    params = r.params
    got_err = r.errors if isinstance(r, SerialResult) else r.history["error"].values
    assert len(params) == len(ref.params)
    for got, want in zip(params, ref.params):
        assert isinstance(got, np.ndarray) and got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=1e-14 * np.abs(want).max())
    want_err = ref.errors if errors is None else errors
    np.testing.assert_allclose(got_err, want_err, rtol=RTOL, atol=0)


# --------------------------------------------------------------------------- 3. fit_serial on torch
# (depth, activation, optimizer, bias, batch, head): every value of every axis, many pairs
SERIAL_GRID = [
    (1, "sigmoid", "sgd", False, None, "sq-sigmoid"),
    (1, "relu", "adam", True, BATCH, "ce-softmax"),
    (1, "tanh", "momentum", True, None, "ce-sigmoid"),
    (2, "tanh", "adam", False, BATCH, "sq-linear"),
    (2, "relu", "momentum", True, BATCH, "sq-sigmoid"),
    (2, "sigmoid", "sgd", True, None, "ce-softmax"),
    (3, "relu", "sgd", False, None, "sq-linear"),
    (3, "sigmoid", "adam", True, BATCH, "ce-sigmoid"),
    (3, "tanh", "momentum", False, BATCH, "ce-softmax"),
]
_AXES = [HIDDEN, ["sigmoid", "tanh", "relu"], LR, [False, True], [None, BATCH], HEADS]
assert all({case[i] for case in SERIAL_GRID} == set(axis) for i, axis in enumerate(_AXES))


def _serial_id(case) -> str:
    depth, act, opt, bias, batch, head = case
    return f"d{depth}-{act}-{opt}-{'bias' if bias else 'nobias'}-{batch or 'full'}-{head}"


@pytest.mark.parametrize("case", SERIAL_GRID, ids=[_serial_id(c) for c in SERIAL_GRID])
def test_fit_serial_on_torch_equals_numpy(case):
    depth, act, opt, bias, batch, head = case
    x, d, init = _problem(head, depth, bias, seed=depth)
    kw = _kw(depth, head, act, opt, bias, batch)
    ref = _serial(x, d, init, kw)
    got = fit_serial(x, d, init=init, **ON_TORCH, **kw)
    _assert_equal(got, ref)
    assert got.iterations == ref.iterations and got.stopped is None
    assert set(got.optimizer_state) == set(ref.optimizer_state)
    for slot, arrays in ref.optimizer_state.items():
        for a, b in zip(got.optimizer_state[slot], arrays):
            assert isinstance(a, np.ndarray)
            _rel_close(a, b, RTOL)


def test_fit_serial_on_torch_with_a_penalty_on_the_batch_mean_equals_numpy():
    """scikit-learn's arithmetic: ``alpha`` > 0 (the penalty in every error, its gradient on the
    weights, not the biases), the batch mean, Nesterov's momentum in scikit-learn's convention."""
    x, d, init = _problem("ce-softmax", 2, True, seed=7)
    nesterov = {"name": "sgd", "convention": "scikit-learn", "momentum": 0.9, "nesterov": True}
    for opt, lr in (("adam", 1e-3), (nesterov, 2e-2)):
        kw = dict(
            _kw(2, "ce-softmax", "relu", "adam", True, BATCH),
            optimizer=opt,
            learning_rate=lr,
            alpha=0.5,
            reduction="mean",
        )
        ref = _serial(x, d, init, kw)
        no_penalty = fit_serial(x, d, init=init, **ON_NUMPY, **dict(kw, alpha=0.0))
        assert _rel(no_penalty.params, ref.params) > 1e-6  # the penalty matters here
        _assert_equal(fit_serial(x, d, init=init, **ON_TORCH, **kw), ref)


def test_fit_serial_on_torch_with_early_stopping_equals_numpy():
    """A validation set evaluated from the tensors' host views; early stopping fires at the same
    iteration, with the same validation rows."""
    x, d, init = _problem("ce-sigmoid", 2, True, seed=8)
    rng = np.random.default_rng(9)
    xv, dv = rng.normal(size=(20, N)), rng.integers(0, 2, (20, L)).astype(np.float64)
    kw = dict(
        _kw(2, "ce-sigmoid", "tanh", "adam", True, BATCH, iterations=200),
        learning_rate=2e-2,
        validation=(xv, dv),
        validate_every=3,
        early_stopping=2,
        tol=1e-2,
    )
    ref = _serial(x, d, init, kw, stops=True)
    assert ref.stopped.startswith("early stopping") and ref.iterations < 200
    got = fit_serial(x, d, init=init, **ON_TORCH, **kw)
    assert got.stopped == ref.stopped and got.iterations == ref.iterations
    _assert_equal(got, ref)
    assert len(got.validation) == len(ref.validation) >= 3
    for a, b in zip(got.validation, ref.validation):
        assert a.iteration == b.iteration and a.accuracy == b.accuracy
        assert a.loss == pytest.approx(b.loss, rel=RTOL)


@pytest.mark.parametrize(
    "params",
    [
        dict(hidden_layer_sizes=(10, 6), activation="relu", early_stopping=True, max_iter=25),
        dict(hidden_layer_sizes=(8,), solver="sgd", activation="tanh", max_iter=12),
    ],
    ids=["adam-relu-early-stopping", "sgd-nesterov-tanh"],
)
def test_mlp_classifier_on_torch_equals_numpy(params):
    """The estimator's serial path (no client): fit (with early stopping: the best epoch's weights
    kept), or fit then partial_fit going on from the velocities it kept, on torch-cpu as on
    numpy."""
    pytest.importorskip("sklearn")
    from dask_rpm import MLPClassifier

    rng = np.random.default_rng(11)
    x = rng.normal(size=(120, 6))
    y = (x[:, 0] + 0.5 * x[:, 1] - x[:, 2] > 0).astype(int) + (x[:, 3] > 0.8)
    common = dict(params, batch_size=32, random_state=1, learning_rate_init=1e-3)

    def trained(**kw):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # ConvergenceWarning
            est = MLPClassifier(**common, **kw).fit(x, y)
            if not params.get("early_stopping"):
                est.partial_fit(x[:64], y[:64])
        return est

    def rel(a, b):
        return _rel(a.coefs_ + a.intercepts_, b.coefs_ + b.intercepts_)

    want = trained(**ON_NUMPY)
    lr = common["learning_rate_init"] * (1.0 + 1e-12)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        other = MLPClassifier(**dict(common, learning_rate_init=lr), **ON_NUMPY).fit(x, y)
        if not params.get("early_stopping"):
            other.partial_fit(x[:64], y[:64])
    assert other.n_iter_ == want.n_iter_ and rel(other, want) < 1e-12  # well conditioned
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        one = MLPClassifier(**dict(common, max_iter=1), **ON_NUMPY).fit(x, y)
    assert rel(want, one) > 1e-3  # and the weights moved
    got = trained(**ON_TORCH)
    assert rel(got, want) < RTOL
    assert all(isinstance(c, np.ndarray) for c in got.coefs_ + got.intercepts_)
    assert got.n_iter_ == want.n_iter_ and got.t_ == want.t_
    np.testing.assert_allclose(got.loss_curve_, want.loss_curve_, rtol=RTOL)
    if params.get("early_stopping"):
        np.testing.assert_allclose(got.validation_scores_, want.validation_scores_, rtol=RTOL)
    np.testing.assert_allclose(got.predict_proba(x), want.predict_proba(x), rtol=RTOL)


# ------------------------------------------------------------------ 4. the engine on torch-cpu
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


def _mapping(layout: str, depth: int, bias: bool) -> dict:
    if layout in SRPM_ABILITIES:
        return dict(mapping="srpm", abilities=SRPM_ABILITIES[layout])
    return dict(mapping=_plan(layout, depth, bias))


def _labels(r, client) -> dict[str, str]:
    """``stats["backend"]`` by worker index (ordered_workers), for the workers the plans used."""
    order = ordered_workers(client.scheduler_info())
    return {order.index(a): label for a, label in r.stats["backend"].items()}


@pytest.fixture(scope="module")
def client4():
    """Four one-thread workers in this process (as tests/test_deep.py's): what the driver sends
    them arrives by reference, so a worker that trained in place in its source's memory would
    change the driver's arrays and its peers'. Not the default client (the estimator tests train
    serially)."""
    with LocalCluster(
        n_workers=4, threads_per_worker=1, processes=False, dashboard_address=":0"
    ) as cluster:
        with Client(cluster, set_as_default=False) as client:
            yield client


#: the exchanges the engine can run: the one-hop ones (auto with four workers: allgather, pairwise)
#: send each array as a message; the scheduled ones stage them through host buffers
EXCHANGES = {
    "one-hop": {},
    "tree": {"rpm.engine.vertical": "tree", "rpm.engine.horizontal": "tree"},
    "ring-halving": {"rpm.engine.vertical": "ring", "rpm.engine.horizontal": "halving"},
    "leader-direct": {"rpm.engine.vertical": "leader", "rpm.engine.horizontal": "direct"},
}
# (depth, activation, optimizer, bias, batch, head, layout, exchange)
ENGINE_GRID = [
    (1, "sigmoid", "sgd", False, None, "sq-sigmoid", "2col", "one-hop"),
    (1, "relu", "adam", True, BATCH, "ce-softmax", "srpm-3+1", "leader-direct"),
    (1, "tanh", "momentum", True, None, "ce-sigmoid", "4col", "one-hop"),
    (2, "tanh", "adam", True, BATCH, "sq-linear", "3col", "ring-halving"),
    (2, "relu", "momentum", False, None, "ce-softmax", "1col", "one-hop"),
    (2, "sigmoid", "adam", True, BATCH, "ce-sigmoid", "2col", "tree"),
    (3, "relu", "sgd", True, BATCH, "sq-sigmoid", "srpm-2+1+1", "tree"),
    (3, "tanh", "adam", False, None, "ce-softmax", "1col", "ring-halving"),
]
assert {c[-2] for c in ENGINE_GRID} == set(LAYOUTS) | set(SRPM_ABILITIES)
assert {c[-1] for c in ENGINE_GRID} == set(EXCHANGES)
assert {c[0] for c in ENGINE_GRID} == {1, 2, 3} and {c[4] for c in ENGINE_GRID} == {None, BATCH}


@pytest.mark.parametrize(
    "case", ENGINE_GRID, ids=[f"{_serial_id(c[:6])}-{c[6]}-{c[7]}" for c in ENGINE_GRID]
)
def test_fit_on_torch_equals_serial(client4, case):
    depth, act, opt, bias, batch, head, layout, exchange = case
    x, d, init = _problem(head, depth, bias, seed=20 + depth)
    kw = _kw(depth, head, act, opt, bias, batch)
    ref = _serial(x, d, init, kw)
    with dask.config.set(EXCHANGES[exchange]):
        r = fit(
            x,
            d,
            init=init,
            client=client4,
            interval=7,
            progress="none",
            **_mapping(layout, depth, bias),
            **ON_TORCH,
            **kw,
        )
    _assert_equal(r, ref)
    plan = r.plan
    if layout in SRPM_ABILITIES:
        assert plan.method == "srpm" and max(len(c) for c in plan.columns) >= 2, plan.columns
    else:
        assert [list(c) for c in plan.columns] == LAYOUTS[layout][0]
    # every worker of the plan ran its kernels on torch-cpu
    assert set(r.stats["backend"]) == {plan.workers[w] for w in plan.planned_workers}
    assert set(r.stats["backend"].values()) == {"torch-cpu"}


def test_backend_auto_follows_the_workers_cpu_backend(client4):
    """``backend="auto"`` resolves on each worker from ``rpm.engine.cpu-backend`` as it is when the
    run starts (these in-process workers read this process's configuration): numpy, then torch,
    then numpy again in the same worker processes; the same result every time. A value that is
    not a backend fails the run with the setting's name."""
    x, d, init = _problem("sq-sigmoid", 2, True, seed=31)
    kw = _kw(2, "sq-sigmoid", "tanh", "adam", True, BATCH, iterations=8)
    ref = _serial(x, d, init, kw, check=False)
    plan = _plan("2col", 2, True)
    # a GPU of this process would win over the setting (the in-process workers would see it)
    auto = dict(backend="auto", device="cpu" if torch.cuda.is_available() else "auto")
    for cpu in ("numpy", "torch", "numpy"):
        with dask.config.set({"rpm.engine.cpu-backend": cpu}):
            r = fit(x, d, init=init, mapping=plan, client=client4, progress="none", **auto, **kw)
        want = "torch-cpu" if cpu == "torch" else "numpy"
        assert set(_labels(r, client4).values()) == {want}, cpu
        _assert_equal(r, ref)
    with dask.config.set({"rpm.engine.cpu-backend": "jax"}):
        with pytest.raises(BackendError, match=r"rpm\.engine\.cpu-backend='jax'"):
            fit(x, d, init=init, mapping=plan, client=client4, progress="none", **auto, **kw)


# ------------------------------------------------------------- 5. remaps, loss and resume on torch
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


def _through_remaps(client, backend: dict, seed: int):
    """A forced column remap at 8 and a whole remap at 16 of the 2col plan, against serial."""
    depth = 2
    x, d, init = _problem("ce-softmax", depth, True, seed=seed)
    kw = _kw(depth, "ce-softmax", "relu", "adam", True, BATCH, iterations=24)
    ref = _serial(x, d, init, kw)
    plan = _plan("2col", depth, True)
    remapper = _Remapper({8: ("column", [0.5, 0.1, 0.1, 0.5]), 16: ("whole", [0.5, 0.2, 0.2, 0.1])})
    r = fit(
        x,
        d,
        init=init,
        mapping=plan,
        client=client,
        interval=4,
        progress="none",
        callbacks=[remapper],
        **backend,
        **kw,
    )
    assert remapper.kinds == [(8, "column"), (16, "whole")]
    assert len(r.plans) == 3
    assert r.plans[1].columns == r.plans[0].columns
    assert [q.hidden for q in r.plans[1].rectangles] != [q.hidden for q in plan.rectangles]
    assert r.plans[2].method == "srpm" and r.plans[2].columns != plan.columns
    _assert_equal(r, ref)
    return r


def _through_drpm(client, backend: dict, seed: int):
    """DRPM without initial abilities remaps the whole plan at its first check; T_line 1.0 then at
    every later check with any imbalance at all."""
    x, d, init = _problem("sq-sigmoid", 2, True, seed=seed)
    kw = _kw(2, "sq-sigmoid", "sigmoid", "adam", True, None, iterations=30)
    ref = _serial(x, d, init, kw)
    with dask.config.set({"rpm.drpm.t-line": 1.0}):
        r = fit(
            x,
            d,
            init=init,
            mapping="drpm",
            client=client,
            interval=5,
            progress="none",
            **backend,
            **kw,
        )
    assert r.remaps and r.remaps[0]["kind"] == "whole"
    assert all(rec["kind"] in ("whole", "column") for rec in r.remaps)
    assert len(r.plans) == len(r.remaps) + 1
    _assert_equal(r, ref)
    return r


def test_fit_on_torch_through_a_column_and_a_whole_remap_equals_serial(client4):
    r = _through_remaps(client4, ON_TORCH, seed=40)
    assert set(r.stats["backend"].values()) == {"torch-cpu"}


def test_fit_on_torch_through_drpm_remaps_equals_serial(client4):
    r = _through_drpm(client4, ON_TORCH, seed=41)
    assert set(r.stats["backend"].values()) == {"torch-cpu"}


@pytest.mark.parametrize("layout", ["two-columns", "one-column-store"])
@pytest.mark.slow
def test_fit_on_torch_through_a_worker_loss_equals_serial(layout, sigkill_after, tmp_path):
    """A worker process killed mid-run: its rows of every layer (and their adam moments) come from
    the other column's torch tensors, or - one column - from the checkpoint store the torch workers
    wrote; the iterations since computed again."""
    depth = 2
    x, d, init = _problem("sq-linear", depth, True, seed=42)
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
            n_workers=4, threads_per_worker=1, processes=True, dashboard_address=":0", **QUIET
        ) as cluster,
        Client(cluster, set_as_default=False) as client,
    ):
        victim = ordered_workers(client.scheduler_info())[1]
        killer = sigkill_after(client, victim, at=15)
        # one column: the checkpoint path a run without buddy copies takes (tests/test_buddies.py has them)
        with dask.config.set({"rpm.resilience.buddies": layout == "two-columns"}):
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
                **ON_TORCH,
                **kw,
            )
    assert killer.fired == [15]
    (rec,) = [rec for rec in r.remaps if rec.get("lost")]
    assert rec["lost"] == [victim]
    assert rec["recovered_from"] == ("columns" if layout == "two-columns" else "checkpoint")
    if layout.endswith("store"):
        assert r.stats["checkpoints"] and store.read_manifest(tmp_path / "ck")["iteration"] == 30
    assert victim not in [r.plan.workers[w] for w in r.plan.planned_workers]
    assert set(r.stats["backend"].values()) == {"torch-cpu"}
    _assert_equal(r, ref)


def _stop_after(k: int):
    """``callback`` and ``should_stop`` for fit: stop at the first block boundary at or after ``k``."""
    seen: list[int] = []
    return (lambda info: seen.append(info["iteration"])), (lambda: bool(seen) and seen[-1] >= k)


def _resume_case():
    depth = 3
    x, d, init = _problem("ce-softmax", depth, True, seed=43)
    kw = _kw(depth, "ce-softmax", "relu", "adam", True, BATCH, iterations=24)
    return depth, x, d, init, kw, _serial(x, d, init, kw)


def test_fit_on_torch_resumed_from_an_on_checkpoint_state_equals_serial(client4):
    """Stop after the checkpoint at 10, resume from what on_checkpoint received (host copies of
    every layer's weights and adam moments) on another plan; the state is left as it was."""
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
        **ON_TORCH,
        **kw,
    )
    assert first.stopped and first.stopped.startswith("stop requested")
    (state,) = saved
    assert state["iteration"] == 10 and set(state["optimizer_state"]) == {"m", "v"}
    arrays = [*state["params"], *(a for v in state["optimizer_state"].values() for a in v)]
    assert all(isinstance(a, np.ndarray) for a in arrays)
    before = [a.copy() for a in arrays]
    r = fit(
        x,
        d,
        init=init,
        mapping=_plan("1col", depth, True),
        client=client4,
        interval=5,
        resume=state,
        progress="none",
        **ON_TORCH,
        **kw,
    )
    assert r.stats["start"]["iteration"] == 10
    assert list(r.history["iteration"].values) == list(range(10, 24))
    _assert_equal(r, ref, errors=ref.errors[10:])
    assert all(np.array_equal(a, b) for a, b in zip(arrays, before))  # the workers trained copies


def test_fit_on_torch_resumed_from_a_checkpoint_store_equals_serial(client4, tmp_path):
    """As above, from the store the torch workers wrote their rows of every layer into."""
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
        **ON_TORCH,
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
        **ON_TORCH,
        **kw,
    )
    assert r.stats["start"] == {**r.stats["start"], "iteration": 10, "from": "checkpoint store"}
    assert list(r.history["iteration"].values) == list(range(10, 24))
    _assert_equal(r, ref, errors=ref.errors[10:])


# ------------------------------------------------------------------------------- 6. MIXED cluster
TORCH_WORKERS = (1, 2)  # of w0 .. w3: each 2col column has one numpy and one torch worker


@pytest.fixture(scope="module")
def mixed():
    """Four one-thread Nanny workers ``w0 .. w3`` that see no GPU; ``w1`` and ``w2`` set
    ``rpm.engine.cpu-backend: torch`` (the Nanny's ``config``, a dotted key: a nanny hands its
    worker this process's whole configuration, so an environment variable would be overridden)."""
    workers = {}
    for i in range(4):
        opts = {"nthreads": 1, "env": {"CUDA_VISIBLE_DEVICES": ""}, **QUIET}
        if i in TORCH_WORKERS:
            opts["config"] = {"rpm.engine.cpu-backend": "torch"}
        workers[f"w{i}"] = {"cls": Nanny, "options": opts}
    sched = {"cls": Scheduler, "options": {"dashboard_address": ":0", "host": "127.0.0.1"}}
    with SpecCluster(workers=workers, scheduler=sched, silence_logs=logging.ERROR) as cluster:
        with Client(cluster, set_as_default=False) as client:
            client.wait_for_workers(4)
            yield client


def _mixed_labels(r, client) -> dict[int, str]:
    labels = _labels(r, client)
    for w, label in labels.items():
        assert label == ("torch-cpu" if w in TORCH_WORKERS else "numpy"), labels
    return labels


@pytest.mark.parametrize(
    "case",
    [
        (1, "sigmoid", "sgd", False, None, "sq-sigmoid", "one-hop"),
        (3, "tanh", "adam", True, BATCH, "ce-softmax", "tree"),
    ],
    ids=["d1-sigmoid-sgd-full-one-hop", "d3-tanh-adam-bias-batch-tree"],
)
@pytest.mark.slow
def test_mixed_cluster_auto_runs_numpy_and_torch_in_one_column(mixed, case):
    depth, act, opt, bias, batch, head, exchange = case
    x, d, init = _problem(head, depth, bias, seed=50 + depth)
    kw = _kw(depth, head, act, opt, bias, batch)
    ref = _serial(x, d, init, kw)
    plan = _plan("2col", depth, bias)
    with dask.config.set(EXCHANGES[exchange]):
        r = fit(x, d, init=init, mapping=plan, client=mixed, progress="none", backend="auto", **kw)
    labels = _mixed_labels(r, mixed)
    assert set(labels) == {0, 1, 2, 3}
    # both columns mix the two
    assert all({labels[w] for w in col} == {"numpy", "torch-cpu"} for col in r.plan.columns)
    _assert_equal(r, ref)
    # named backends ignore the workers' cpu-backend
    r = fit(x, d, init=init, mapping=plan, client=mixed, progress="none", **ON_NUMPY, **kw)
    assert set(_labels(r, mixed).values()) == {"numpy"}
    _assert_equal(r, ref)


def test_mixed_cluster_probes_each_worker_on_its_backend_and_equals_serial(mixed):
    """``abilities="probe"``: the kernel probe runs on the backend each worker will train with
    (numpy on two, torch-cpu on two); the SRPM plan from its rates trains as serial does."""
    x, d, init = _problem("sq-linear", 2, True, seed=55)
    kw = _kw(2, "sq-linear", "relu", "momentum", True, BATCH)
    ref = _serial(x, d, init, kw)
    r = fit(
        x,
        d,
        init=init,
        mapping="srpm",
        abilities="probe",
        client=mixed,
        progress="none",
        backend="auto",
        **kw,
    )
    assert r.plan.method == "srpm"
    _mixed_labels(r, mixed)
    _assert_equal(r, ref)


def test_mixed_cluster_through_a_column_and_a_whole_remap_equals_serial(mixed):
    r = _through_remaps(mixed, dict(backend="auto"), seed=53)
    assert set(_mixed_labels(r, mixed).values()) == {"numpy", "torch-cpu"}


def test_mixed_cluster_through_drpm_remaps_equals_serial(mixed):
    r = _through_drpm(mixed, dict(backend="auto"), seed=54)
    assert set(_mixed_labels(r, mixed).values()) == {"numpy", "torch-cpu"}
