"""Batch back-propagation as Dask tasks, one rectangle per worker.

Each worker holds its weight shard ``W[m0:m1]``, ``V[:, m0:m1]`` and its
column's samples as futures pinned to it (hard worker restrictions); per
iteration the graph is::

    rpm-forward (i)     f_i = sigma(x_c W_i^T), partial p_i = f_i V_i^T   [f_i stays on the worker]
    rpm-vertical (c)    sum the partials of column c, output deltas        [l x s_c in, l x s_c out]
    rpm-backward (i)    dW_i, dV_i over the column's samples
    rpm-horizontal      per band of rows held by several columns: slices
                        from the other columns are summed on one holder,
                        the sum goes back                                   [(n + l) x band rows]
    rpm-modify (i)      W_i -= eps * sum dW, V_i -= eps * sum dV

so exactly what the paper's communication model counts crosses the network.

Keys are ``("rpm-<phase>-<run>", iteration, index)``. The backward phase is
keyed ``rpm-backwards``: Dask's ``key_split`` (which names task groups and
colours the task stream) drops any 8-letter word that starts with hex letters,
and "backward" is one, so ``rpm-backward-...`` would show up as plain ``rpm``.
Iterations are submitted in blocks (up to the next DRPM check); the client
never touches weights until the end.

The sync :func:`fit` wraps the async core :meth:`Trainer.run` with
``client.sync``, as Dask-native libraries do.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from dataclasses import dataclass, field, replace
from typing import Any, Sequence

import numpy as np

from . import config
from .data import DataError, as_arrays, check_training_args, data_shape, load_slice
from .kernels import backward_partial, block_work, forward_partial, output_delta
from .partition import Plan, PlanError
from .plugin import PLUGIN_NAME, TOPIC, RPMSchedulerPlugin

__all__ = ["fit", "FitResult", "TrainingError", "WorkerLostError", "ordered_workers"]

logger = logging.getLogger("dask_rpm")

PHASES = ("forward", "vertical_wait", "backward", "horizontal", "modify")


class TrainingError(RuntimeError):
    """Training cannot go on (e.g. divergence, a failed task)."""


class WorkerLostError(TrainingError):
    """A worker holding a weight shard left the cluster during training."""

    def __init__(self, workers: Sequence[str], iteration: int) -> None:
        self.workers = list(workers)
        self.iteration = iteration
        super().__init__(
            f"worker(s) {', '.join(self.workers)} left the cluster during iteration {iteration}; "
            f"their weight shards are gone from this run"
        )


# --------------------------------------------------------------------------
# Task functions (run on the workers)
# --------------------------------------------------------------------------

# Hidden activations f_i live from a forward task to the backward task of the
# same iteration on the same worker. They are the largest intermediate
# (s_c x m_i) and must not travel, but a Dask task result travels whole, so
# they are kept in worker-process memory keyed by (run, iteration, worker).
_ACTIVATIONS: dict[tuple[str, int, int], np.ndarray] = {}


def _pace(iteration: int, key: Any = None, work: float | None = None, dtype: Any = "float64"):
    """Emulated-speed padding if this worker emulates a speed, else a no-op.

    ``key`` names the block's work (kernel and shapes) and ``work`` counts it
    (:func:`~dask_rpm.kernels.block_work`), so that emulation paces on the
    work rather than on the noisy CPU time (see :mod:`dask_rpm.emulation`).
    """
    try:
        from .emulation import pace
    except ImportError:  # pragma: no cover - emulation ships with the package
        import contextlib

        return contextlib.nullcontext()
    return pace(iteration, key, work, dtype)


def _t_load(path: str, s0: int, s1: int, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    return load_slice(path, s0, s1, dtype)


def _t_forward(run: str, it: int, w: int, weights: tuple, data: tuple) -> np.ndarray:
    W, V = weights
    (s, n), (m, l) = data[0].shape, (W.shape[0], V.shape[0])
    with _pace(it, ("forward", s, m, n, l), block_work("forward", s, m, n, l), W.dtype):
        f, partial = forward_partial(data[0], W, V)
    _ACTIVATIONS[(run, it, w)] = f
    return partial


def _t_vertical(run: str, it: int, c: int, data: tuple, *partials: np.ndarray) -> np.ndarray:
    with _pace(it, ("vertical", len(partials), partials[0].shape)):
        u = partials[0].copy()
        for p in partials[1:]:
            u += p
        delta2, err = output_delta(u, data[1])
    _log({"kind": "error", "run": run, "iteration": it, "column": c, "error": err})
    return delta2


def _t_backward(run: str, it: int, w: int, weights: tuple, data: tuple, delta2: np.ndarray) -> tuple:
    f = _ACTIVATIONS.pop((run, it, w))
    (s, n), (l, m) = data[0].shape, weights[1].shape
    with _pace(it, ("backward", s, m, n, l), block_work("backward", s, m, n, l), f.dtype):
        return backward_partial(data[0], f, weights[1], delta2)


def _t_slice(grad: tuple, a: int, b: int) -> tuple[np.ndarray, np.ndarray]:
    dW, dV = grad
    return dW[a:b].copy(), np.ascontiguousarray(dV[:, a:b])


def _t_reduce(it: int, offsets: list, *grads: tuple) -> tuple[np.ndarray, np.ndarray]:
    """Sum one band over the columns, in column order (so every holder gets identical bits)."""
    with _pace(it, ("reduce", tuple(None if o is None else o[1] - o[0] for o in offsets),
                    tuple(g[0].shape for g in grads))):
        acc_w = acc_v = None
        for off, (dW, dV) in zip(offsets, grads):
            if off is not None:
                dW, dV = dW[off[0] : off[1]], dV[:, off[0] : off[1]]
            if acc_w is None:
                acc_w, acc_v = dW.copy(), dV.copy()
            else:
                acc_w += dW
                acc_v += dV
    return acc_w, acc_v


def _t_modify(run: str, it: int, weights: tuple, eps: float, offsets: list, *grads: tuple) -> tuple[np.ndarray, np.ndarray]:
    W, V = weights
    with _pace(it, ("modify", W.shape, tuple(offsets))):
        W, V = W.copy(), V.copy()
        for (a, b), (dW, dV) in zip(offsets, grads):
            W[a:b] -= eps * dW
            V[:, a:b] -= eps * dV
        finite = bool(np.isfinite(W).all() and np.isfinite(V).all())
    if not finite:
        _log({"kind": "nonfinite", "run": run, "iteration": it})
    return W, V


def _log(msg: dict) -> None:
    try:
        from distributed import get_worker

        get_worker().log_event(TOPIC, msg)
    except ValueError:  # pragma: no cover - not on a worker
        pass


def _t_assemble(pieces: list, *blocks: tuple) -> tuple[np.ndarray, np.ndarray]:
    """Build a weight shard from row blocks ``(W_rows, V_cols)`` of old shards."""
    Ws, Vs = [], []
    for (a, b), (W, V) in zip(pieces, blocks):
        Ws.append(W[a:b])
        Vs.append(V[:, a:b])
    return np.concatenate(Ws, axis=0), np.concatenate(Vs, axis=1)


def _t_clear(run: str) -> int:
    # Also the run's generations after a worker loss ("<run>g<n>") and replays ("<run>r<k>").
    stale = [k for k in _ACTIVATIONS if k[0].startswith(run)]
    for k in stale:
        del _ACTIVATIONS[k]
    return len(stale)


# --------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------


@dataclass
class FitResult:
    """Outcome of :func:`fit`.

    Attributes
    ----------
    W, V : numpy.ndarray
        Final weights, ``(m, n)`` and ``(l, m)``.
    history : xarray.Dataset
        Error per iteration and per-worker phase times (dims ``iteration``, ``worker``).
    plan : Plan
        The plan in use at the end.
    plans : list of Plan
        Every plan used, in order (more than one after remaps).
    remaps : list of dict
        One entry per remap (iteration, kind, bytes moved, seconds).
    stopped : str or None
        Why training stopped early (e.g. divergence), else None.
    emulation : str or None
        The emulation label when the cluster emulated heterogeneity.
    """

    W: np.ndarray
    V: np.ndarray
    history: Any
    plan: Plan
    plans: list[Plan] = field(default_factory=list)
    remaps: list[dict[str, Any]] = field(default_factory=list)
    stopped: str | None = None
    emulation: str | None = None
    probe: Any = None

    @property
    def error(self) -> float:
        """Error of the last completed iteration."""
        err = self.history["error"].values
        return float(err[-1]) if err.size else float("nan")

    @property
    def seconds_per_iteration(self) -> float:
        """Median measured iteration time (seconds)."""
        t = self.history["iteration_time"].values
        t = t[np.isfinite(t)]
        return float(np.median(t)) if t.size else float("nan")

    def plans_dataset(self) -> Any:
        """Every plan used, as one ``xarray.Dataset`` along ``plan`` (:func:`dask_rpm.results.plans_dataset`)."""
        from .results import plans_dataset

        return plans_dataset(self.plans or [self.plan], self.remaps)

    def plot(self, path: Any = None, **kwargs: Any) -> Any:
        """Error curve, per-worker times and rectangles as a matplotlib Figure (:func:`dask_rpm.results.plot_result`)."""
        from .results import plot_result

        return plot_result(self, path, **kwargs)

    def __repr__(self) -> str:
        return (
            f"<FitResult {self.history.sizes.get('iteration', 0)} iterations, error {self.error:.6g}, "
            f"{self.seconds_per_iteration * 1e3:.1f} ms/iteration, {len(self.plans)} plan(s), "
            f"{len(self.remaps)} remap(s)>"
        )


# --------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------


def ordered_workers(info: dict[str, Any]) -> list[str]:
    """Worker addresses in a stable order: by group/name, numbers compared as numbers.

    Index ``i`` in this order is worker ``i`` of a plan (and ``speeds[i]`` of
    :func:`dask_rpm.local_cluster`).
    """
    ws = info["workers"]
    return sorted(ws, key=lambda a: _sort_key(ws[a].get("name", a)))


def _sort_key(name: Any) -> tuple:
    s = str(name)
    head = s.rstrip("0123456789")
    tail = s[len(head) :]
    return (head, int(tail) if tail else -1, s)


class Trainer:
    """State of one distributed training run (async; driven by :func:`fit`)."""

    def __init__(
        self,
        client: Any,
        *,
        run: str,
        plan: Plan,
        source: Any,
        arrays: tuple[np.ndarray, np.ndarray] | None,
        W0: np.ndarray,
        V0: np.ndarray,
        learning_rate: float,
        dtype: str,
    ) -> None:
        self.client = client
        self.run = run
        self.plan = plan
        self.source = source  # path to a netCDF file, or None when arrays are given
        self.arrays = arrays
        self.W0, self.V0 = W0, V0
        self.eps = learning_rate
        self.dtype = dtype
        self.version = 0
        self.weights: dict[int, Any] = {}
        self.data: dict[int, Any] = {}
        self.iteration = 0
        self.seq = 0
        self.errors: dict[int, dict[int, float]] = {}
        self.nonfinite: set[int] = set()
        self.timings: dict[tuple[int, int], dict[str, tuple[float, float]]] = {}
        self.addresses: list[str] = list(plan.workers or ())
        # Worker indices are positions in ``addresses``, which only grows: a
        # worker that joins is appended, one that is lost stays (in ``gone``)
        # but is never planned again, so indices in timings, estimates and
        # history stay valid across changes of the worker set.
        self.gone: set[int] = set()
        self.base_run = run
        self.generation = 0

    # ---------------------------------------------------------------- setup
    def _key(self, phase: str, it: int, idx: Any) -> tuple[str, int, Any]:
        return (f"rpm-{phase}-{self.run}", it, idx)

    def _submit(self, fn: Any, *args: Any, key: tuple, worker: int) -> Any:
        return self.client.submit(
            fn, *args, key=key, workers=[self.addresses[worker]], allow_other_workers=False, pure=False
        )

    async def _load_data(self, plan: Plan, workers: Sequence[int] | None = None) -> None:
        """Give each worker its column's samples (read by the worker itself from a file)."""
        todo = plan.planned_workers if workers is None else workers
        for w in todo:
            s0, s1 = plan.rectangle(w).samples
            if self.source is not None:
                self.data[w] = self._submit(
                    _t_load, self.source, s0, s1, self.dtype, key=self._key("data", self.version, w), worker=w
                )
            else:
                x, d = self.arrays  # type: ignore[misc]
                [self.data[w]] = await self.client.scatter(
                    [(x[s0:s1], d[s0:s1])], workers=[self.addresses[w]], hash=False
                )

    async def _scatter_weights(self, plan: Plan, W: np.ndarray, V: np.ndarray) -> None:
        for w in plan.planned_workers:
            m0, m1 = plan.rectangle(w).hidden
            [self.weights[w]] = await self.client.scatter(
                [(np.ascontiguousarray(W[m0:m1]), np.ascontiguousarray(V[:, m0:m1]))],
                workers=[self.addresses[w]],
                hash=False,
            )

    async def start(self) -> None:
        await self._load_data(self.plan)
        await self._scatter_weights(self.plan, self.W0, self.V0)

    # ------------------------------------------------------------ iterations
    def submit_iteration(self, it: int) -> None:
        """Submit the tasks of one iteration; weight futures advance to the modify outputs."""
        plan = self.plan
        fw = {
            w: self._submit(_t_forward, self.run, it, w, self.weights[w], self.data[w], key=self._key("forward", it, w), worker=w)
            for w in plan.planned_workers
        }
        vt = {}
        for c, col in enumerate(plan.columns):
            leader = self._leader(col)
            vt[c] = self._submit(
                _t_vertical, self.run, it, c, self.data[leader], *[fw[w] for w in col],
                key=self._key("vertical", it, c), worker=leader,
            )
        bw = {
            w: self._submit(
                _t_backward, self.run, it, w, self.weights[w], self.data[w], vt[plan.column_of(w)],
                key=self._key("backwards", it, w), worker=w,
            )
            for w in plan.planned_workers
        }
        if plan.n_columns == 1:
            for w in plan.planned_workers:
                r = plan.rectangle(w)
                self.weights[w] = self._submit(
                    _t_modify, self.run, it, self.weights[w], self.eps, [(0, r.n_hidden)], bw[w],
                    key=self._key("modify", it, w), worker=w,
                )
            return
        # Horizontal exchange, band by band: gather on one holder, sum, send back.
        sums: dict[int, list[tuple[tuple[int, int], Any]]] = {w: [] for w in plan.planned_workers}
        for b, band in enumerate(plan.bands()):
            holders = plan.holders(band)
            reducer = holders[b % len(holders)]
            offsets, grads = [], []
            for c, h in enumerate(holders):
                r = plan.rectangle(h)
                off = (band[0] - r.hidden[0], band[1] - r.hidden[0])
                if h == reducer or off == (0, r.n_hidden):
                    # local to the reducer, or the whole shard is the band: no slicing task
                    offsets.append(None if off == (0, r.n_hidden) else off)
                    grads.append(bw[h])
                else:
                    offsets.append(None)
                    grads.append(
                        self._submit(_t_slice, bw[h], off[0], off[1], key=self._key("horizontal", it, f"s{b}c{c}"), worker=h)
                    )
            total = self._submit(_t_reduce, it, offsets, *grads, key=self._key("horizontal", it, f"b{b}"), worker=reducer)
            for h in holders:
                r = plan.rectangle(h)
                sums[h].append(((band[0] - r.hidden[0], band[1] - r.hidden[0]), total))
        for w in plan.planned_workers:
            offs = [o for o, _ in sums[w]]
            self.weights[w] = self._submit(
                _t_modify, self.run, it, self.weights[w], self.eps, offs, *[t for _, t in sums[w]],
                key=self._key("modify", it, w), worker=w,
            )

    def _leader(self, column: Sequence[int]) -> int:
        """Column worker that sums the partial products: the one with the largest ability."""
        return max(column, key=lambda w: (self.plan.abilities[w], -w))

    async def _wait(self, futures: list[Any], iteration: int) -> None:
        """Wait for ``futures``; raise clearly if a plan worker leaves or a task fails."""
        # The coroutine, not distributed.wait: that one routes through the
        # *default* client and breaks when several clients are open.
        from distributed.client import _wait

        while True:
            try:
                await _wait(futures, timeout=0.5)
                break
            except TimeoutError:
                await self._check_workers(iteration)
            except Exception as exc:  # cancelled because a dependency's worker died
                await self._check_workers(iteration, grace=2.0)
                raise TrainingError(f"training failed in iteration <= {iteration}: {exc}") from exc
        for f in futures:
            if f.status == "error":
                exc = await f.exception()
                raise TrainingError(f"task {f.key} failed: {exc!r}") from exc

    async def _check_workers(self, iteration: int, grace: float = 0.0) -> None:
        """Raise :class:`WorkerLostError` if a worker of the plan has left the cluster."""
        needed = {self.addresses[w] for w in self.plan.planned_workers}
        deadline = time.monotonic() + grace
        while True:
            lost = sorted(needed - set(await self.client.scheduler.ncores()))
            if lost:
                raise WorkerLostError(lost, iteration)
            if time.monotonic() >= deadline:
                return
            await asyncio.sleep(0.1)

    async def run_block(self, n_iterations: int) -> int | None:
        """Run ``n_iterations`` iterations.

        Returns the number of updates after which the weights were last
        usable if this block diverged (a non-finite error or weights), else None.
        """
        first = self.iteration
        for it in range(first, first + n_iterations):
            self.submit_iteration(it)
        self.iteration = first + n_iterations
        await self._wait(list(self.weights.values()), self.iteration - 1)
        await self._pull(first, self.iteration)
        # Error of iteration k is computed from the weights after k updates;
        # a non-finite update in iteration k spoils the weights after k + 1.
        bad = [it for it in range(first, self.iteration) if not math.isfinite(self.error(it))]
        keep = [it - 1 for it in bad] + [it for it in self.nonfinite if it >= first]
        return max(min(keep), 0) if keep else None

    async def _pull(self, first: int, stop: int) -> None:
        """Fetch timings and errors for iterations ``[first, stop)`` from the scheduler plugin."""
        n_cols = self.plan.n_columns
        for attempt in range(100):
            got = await self.client.scheduler.rpm_pull(run=self.run, since=self.seq)
            self.seq = got["seq"]
            for _, phase, it, idx, worker, t0, t1, transfer in got["timings"]:
                self.timings.setdefault((it, idx), {})[phase] = (t0, t1)
            for _, it, c, err in got["errors"]:
                if c is None:  # an update made the weights non-finite
                    self.nonfinite.add(it)
                else:
                    self.errors.setdefault(it, {})[c] = err
            if all(len(self.errors.get(it, ())) >= n_cols for it in range(first, stop)):
                return
            await asyncio.sleep(0.01 * (attempt + 1))
        raise TrainingError(f"scheduler plugin did not report errors for iterations {first}..{stop - 1}")

    def error(self, it: int) -> float:
        return float(sum(self.errors[it].values()))

    async def gather(self) -> tuple[np.ndarray, np.ndarray]:
        """Full weights from the first column (every column holds a full, identical copy)."""
        col = self.plan.columns[0]
        # Wait first: it notices a lost worker (WorkerLostError) instead of waiting forever.
        await self._wait([self.weights[w] for w in col], self.iteration)
        shards = await self.client.gather([self.weights[w] for w in col])
        return np.concatenate([s[0] for s in shards], axis=0), np.concatenate([s[1] for s in shards], axis=1)

    def snapshot(self) -> tuple[int, Plan, dict[int, Any], dict[int, Any]]:
        """What is needed to recompute from here: iteration, plan, weight and data futures."""
        return (self.iteration, self.plan, dict(self.weights), dict(self.data))

    async def replay(self, snap: tuple, stop: int) -> None:
        """Recompute from snapshot ``snap`` up to iteration ``stop`` (deterministic)."""
        first, self.plan, weights, data = snap
        self.weights, self.data = dict(weights), dict(data)
        saved_run = self.run
        self.run = f"{saved_run}r{first}"
        try:
            for it in range(first, stop):
                self.submit_iteration(it)
            if stop > first:
                await self._wait(list(self.weights.values()), stop - 1)
        finally:
            self.run = saved_run

    async def remap(self, new: Plan, kind: str, lost: Sequence[str] = ()) -> dict[str, Any]:
        """Switch to plan ``new`` between iterations, moving only the weight rows that change owner.

        Each worker keeps the rows it already holds; the others come from the
        holder chosen by :func:`dask_rpm.remap.migration` (every column holds a
        full copy of the weights), sliced on the source so only those rows
        travel. Workers whose sample range changed read their new samples
        themselves (from the dataset file; from the client for in-memory arrays).
        """
        from .remap import migration, sample_changes

        t0 = time.perf_counter()
        old = self.plan
        if new.workers is None:  # keep the plan bound to addresses (dashboard, results)
            new = new.with_workers(self.addresses)
        transfers = migration(old, new, itemsize=np.dtype(self.dtype).itemsize, lost=lost)
        index = {a: i for i, a in enumerate(self.addresses)}

        def idx(ident: Any) -> int:
            return index[ident] if isinstance(ident, str) else int(ident)

        self.version += 1
        incoming: dict[int, list[tuple[int, int, int]]] = {w: [] for w in new.planned_workers}
        for t in transfers:
            incoming[idx(t.dst)].append((t.rows[0], t.rows[1], idx(t.src)))
        old_rows = {w: old.rectangle(w).hidden for w in old.planned_workers}
        weights: dict[int, Any] = {}
        for w in new.planned_workers:
            m0, m1 = new.rectangle(w).hidden
            pieces = list(incoming[w])
            if w in old_rows and self.addresses[w] not in lost:
                a, b = max(m0, old_rows[w][0]), min(m1, old_rows[w][1])
                if a < b:
                    pieces.append((a, b, w))
            pieces.sort()
            edges = [(a, b) for a, b, _ in pieces]
            if not edges or edges[0][0] != m0 or edges[-1][1] != m1 or any(
                p[1] != q[0] for p, q in zip(edges[:-1], edges[1:])
            ):
                raise TrainingError(f"internal error: migration does not cover rows [{m0}, {m1}) of worker {w}: {edges}")
            if len(pieces) == 1 and pieces[0][2] == w and old_rows[w] == (m0, m1):
                weights[w] = self.weights[w]  # unchanged shard: nothing to do
                continue
            offsets, blocks = [], []
            for a, b, src in pieces:
                o0, o1 = old_rows[src]
                rel = (a - o0, b - o0)
                if src == w or (a, b) == (o0, o1):
                    offsets.append(rel)
                    blocks.append(self.weights[src])
                else:  # slice on the source so only these rows travel
                    offsets.append((0, b - a))
                    blocks.append(
                        self._submit(_t_slice, self.weights[src], rel[0], rel[1],
                                     key=self._key("remap", self.version, f"s{src}-{w}-{a}"), worker=src)
                    )
            weights[w] = self._submit(_t_assemble, offsets, *blocks, key=self._key("remap", self.version, w), worker=w)
        changed = [idx(c.worker) for c in sample_changes(old, new)]
        self.plan = new
        for w in list(self.data):
            if w not in new.planned_workers:
                del self.data[w]
        await self._load_data(new, changed)
        self.weights = weights
        await self._wait(list(weights.values()) + [self.data[w] for w in new.planned_workers], self.iteration)
        return {
            "iteration": self.iteration,
            "kind": kind,
            "bytes": int(sum(t.nbytes for t in transfers)),
            "seconds": time.perf_counter() - t0,
            "transfers": len(transfers),
            "samples_reloaded": len(changed),
            # each of those workers re-reads its column's samples (x and d rows) from the dataset
            "sample_bytes": int(sum(new.rectangle(w).n_samples for w in changed)
                                * (new.n + new.l) * np.dtype(self.dtype).itemsize),
        }

    def observations(self, first: int, stop: int) -> list[tuple[int, int, float, float, float]]:
        """``(worker, work, t1, t2, tc)`` for iterations ``[first, stop)`` of the current plan.

        ``tc`` is the forward plus backward compute, without the wait at the
        vertical exchange (see :mod:`dask_rpm.estimator`).
        """
        out = []
        for it in range(first, stop):
            for w in self.plan.planned_workers:
                t = self.timings.get((it, w), {})
                if "forward" in t and "backward" in t:
                    f0, f1 = t["forward"]
                    b0, b1 = t["backward"]
                    # Timestamps of two tasks carry the worker's jittering clock
                    # offset to the scheduler; never let t1 drop below the
                    # compute it contains (or go negative).
                    tc = max(f1 - f0, 0.0) + max(b1 - b0, 0.0)
                    t1 = max(b1 - f0, tc)
                    out.append((w, self.plan.rectangle(w).area, t1, max(b1 - b0, 0.0), tc))
        return out

    # ------------------------------------------------- elastic / fault tolerant
    def restore(self, snap: tuple) -> None:
        """Go back to snapshot ``snap`` (from :meth:`snapshot`), forgetting later records.

        Starts a new *generation*: tasks get a fresh run name, so results and
        log events of the abandoned iterations still in flight cannot mix
        with the recomputed ones.
        """
        first, self.plan, weights, data = snap
        self.iteration = first
        self.weights, self.data = dict(weights), dict(data)
        self._forget_from(first)

    def _forget_from(self, first: int) -> None:
        for it in [k for k in self.errors if k >= first]:
            del self.errors[it]
        for key in [k for k in self.timings if k[0] >= first]:
            del self.timings[key]
        self.nonfinite = {it for it in self.nonfinite if it < first}
        self.generation += 1
        self.run = f"{self.base_run}g{self.generation}"
        self.seq = 0

    def whole_plan(self, abilities: dict[int, float] | None = None, note: str = "whole remap") -> Plan:
        """SRPM over every worker not lost (joined ones included), indexed like ``addresses``.

        ``abilities`` maps worker index to ability; workers without one get the
        ability they have in the current plan, workers new to the run the mean
        of the planned workers' abilities.
        """
        from .planners import make_plan

        active = [i for i in range(len(self.addresses)) if i not in self.gone]
        if not active:
            raise TrainingError("no workers left to train on: every worker of the run was lost")
        abilities = dict(abilities or {})
        cur = np.asarray(self.plan.abilities, dtype=float)
        known = [w for w in abilities if w < cur.size and cur[w] > 0]
        if known:  # measured abilities (work per second): bring the plan's shares to their scale
            cur = cur * (sum(abilities[w] for w in known) / cur[known].sum())
        planned = [cur[w] for w in self.plan.planned_workers if w not in self.gone] or [1.0]
        fill = float(np.mean(planned))
        vec = []
        for i in active:
            v = abilities.get(i, cur[i] if i < len(cur) and cur[i] > 0 else fill)
            vec.append(float(v) if np.isfinite(v) and v > 0 else fill)
        compact = make_plan(vec, self.plan.shape, self.plan.samples, method="srpm")
        full = np.zeros(len(self.addresses))
        full[active] = np.asarray(vec) / np.sum(vec)
        lift = dict(enumerate(active))
        new = replace(
            compact,
            abilities=tuple(float(v) for v in full),
            columns=tuple(tuple(lift[w] for w in col) for col in compact.columns),
            rectangles=tuple(replace(r, worker=lift[r.worker]) for r in compact.rectangles),
            excluded=tuple(lift[w] for w in compact.excluded),
            notes=(*compact.notes, note),
            workers=tuple(self.addresses),
        )
        return new.validate()

    async def rebalance(self, alive: Sequence[str], fallback: tuple[int, np.ndarray, np.ndarray], reason: str) -> dict[str, Any]:
        """Whole remap onto the workers ``alive`` now: absorb new ones, drop lost ones.

        Rows a lost worker held come from another column holding the same rows
        (every column holds a full copy of W and V). When no column does (a
        single column, or every holder lost), training restarts from
        ``fallback`` = ``(iteration, W, V)``, the last checkpoint, and the
        iterations since are computed again.
        """
        from .remap import MigrationError

        t0 = time.perf_counter()
        alive_set = set(alive)
        lost = [a for i, a in enumerate(self.addresses) if i not in self.gone and a not in alive_set]
        self.gone |= {self.addresses.index(a) for a in lost}
        known = set(self.addresses)
        joined = [a for a in alive if a not in known]
        self.addresses.extend(joined)
        new = self.whole_plan(note=reason)
        source = "columns"
        at = self.iteration
        try:
            rec = await self.remap(new, "whole", lost=lost)
        except MigrationError:
            k, W, V = fallback
            self.iteration = k
            self._forget_from(k)
            self.version += 1
            self.plan, self.weights, self.data = new, {}, {}
            await self._load_data(new)
            await self._scatter_weights(new, W, V)
            await self._wait(list(self.weights.values()) + list(self.data.values()), k)
            source = "checkpoint"
            rec = {
                "iteration": k, "kind": "whole",  # every shard is sent from the client
                "bytes": int(sum(new.rectangle(w).n_hidden for w in new.planned_workers) * (new.n + new.l) * W.itemsize),
                "transfers": len(new.planned_workers), "samples_reloaded": len(new.planned_workers),
                "sample_bytes": int(sum(new.rectangle(w).n_samples for w in new.planned_workers)
                                    * (new.n + new.l) * np.dtype(self.dtype).itemsize),
            }
        rec.update(
            seconds=time.perf_counter() - t0, reason=reason, lost=lost, joined=joined,
            recovered_from=source if lost else None, replayed=at - self.iteration,
        )
        return rec

    async def close(self) -> None:
        try:
            await self.client.run(_t_clear, self.base_run)
        except Exception:  # pragma: no cover - best effort on shutdown
            logger.debug("could not clear worker caches", exc_info=True)


# --------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------


def _resolve_plan(
    mapping: Any,
    abilities: Any,
    *,
    addresses: list[str],
    shape: tuple[int, int, int],
    samples: int,
) -> Plan:
    """Turn ``mapping`` (a method name or a Plan) into a plan bound to worker addresses."""
    if isinstance(mapping, Plan):
        plan = mapping
        n_plan = len(plan.abilities)
        if plan.workers is not None:
            missing = [a for a in plan.workers if a not in addresses]
            if missing:
                raise PlanError(
                    f"the plan names worker(s) {missing} that the cluster does not have; "
                    f"cluster workers are {addresses}"
                )
        elif n_plan > len(addresses):
            raise PlanError(
                f"the plan needs {n_plan} workers but the cluster has {len(addresses)}; "
                f"start more workers or plan for fewer"
            )
        else:
            plan = plan.with_workers(addresses[:n_plan])
        if plan.shape != shape or plan.samples != samples:
            raise PlanError(
                f"the plan is for n-m-l {'-'.join(map(str, plan.shape))} and {plan.samples} samples; "
                f"the data and network are {'-'.join(map(str, shape))} with {samples} samples"
            )
        return plan.validate()
    from .planners import make_plan

    method = str(mapping)
    if abilities is None:
        abilities = [1.0] * len(addresses)
    abilities = list(abilities)
    if len(abilities) != len(addresses):
        raise PlanError(
            f"{len(abilities)} abilities given for {len(addresses)} workers; give one per worker "
            f"(in the order of dask_rpm.ordered_workers)"
        )
    if method == "grid":
        method = "grid-hrev"
    return make_plan(abilities, shape, samples, method=method, workers=addresses)


def fit(
    x: Any,
    d: Any = None,
    *,
    hidden: int | None = None,
    iterations: int | None = None,
    learning_rate: float | None = None,
    mapping: Any = None,
    abilities: Any = None,
    init: tuple[np.ndarray, np.ndarray] | None = None,
    seed: int | None = None,
    dtype: str | None = None,
    client: Any = None,
    interval: int | None = None,
    progress: Any = None,
    on_worker_loss: str | None = None,
    min_workers: int | None = None,
    elastic: bool | None = None,
    target_error: float | None = None,
    checkpoint_every: int | None = None,
    on_checkpoint: Any = None,
    should_stop: Any = None,
    callback: Any = None,
) -> FitResult:
    """Train a 3-layer perceptron by batch BP on the workers of a Dask cluster.

    Parameters
    ----------
    x : numpy.ndarray, xarray.Dataset or path
        Inputs ``(s, n)``; or a Dataset with ``x(sample, input)`` and
        ``d(sample, output)``; or the path of such a dataset as a netCDF file
        the workers can read (each worker then reads only its samples).
    d : numpy.ndarray, optional
        Teacher signals ``(s, l)`` when ``x`` is an array.
    hidden : int
        Hidden units ``m`` (taken from ``init`` when given).
    iterations : int, default ``rpm.train.iterations``
    learning_rate : float, default ``rpm.train.learning-rate``
    mapping : {"drpm", "srpm", "uniform", "grid", "grid-h", "grid-hrev"} or Plan
        How work is mapped to workers; default ``rpm.train.mapping``.
    abilities : sequence of float, "probe" or None
        Relative worker abilities in :func:`ordered_workers` order. ``None``
        means equal abilities for static mappings.
    init : (W0, V0), optional
        Initial weights; default a seeded uniform init (:func:`dask_rpm.kernels.init_weights`).
    seed : int, default ``rpm.train.seed``
    dtype : {"float64", "float32"}, default ``rpm.train.dtype``
    client : distributed.Client, optional
        Defaults to the current client (:func:`distributed.get_client`).
    interval : int, optional
        Iterations submitted per block (and between DRPM checks); default ``rpm.drpm.interval``.
    progress : {"auto", "bar", "log", "none"} or bool, default ``rpm.train.progress``
        A progress bar on stderr in an interactive session, plain lines in
        logs (``"auto"``); ``"none"`` / ``False`` is silent (:mod:`dask_rpm.progress`).
    on_worker_loss : {"recover", "raise"}, default ``rpm.train.on-worker-loss``
        ``"recover"``: when a worker holding a weight shard leaves, go on with
        a whole remap onto the workers left; its rows come from another column
        holding them, or (single column) from the last checkpoint with the
        iterations since computed again. Final weights are those of an
        uninterrupted run. ``"raise"``: raise :class:`WorkerLostError`.
    min_workers : int, default ``rpm.train.min-workers``
        Start once this many workers are connected (waiting at most
        ``rpm.train.wait-workers`` seconds).
    elastic : bool, default ``rpm.train.elastic``
        Take in workers that connect during training with a whole remap at the
        next block boundary. Ignored when ``mapping`` is a Plan.
    target_error : float, optional
        Stop after the block in which the error falls below this; ``iterations``
        is then the maximum.
    checkpoint_every : int, default ``rpm.checkpoint.every``
        Gather the weights to the client every this many iterations (0: never).
        They are the recovery point when no column holds a lost worker's rows.
    on_checkpoint : callable, optional
        ``on_checkpoint(state)`` with a dict ``iteration``, ``W``, ``V``,
        ``errors`` (per iteration so far), ``plan``; called in a thread at each
        checkpoint (e.g. to write it to disk).
    should_stop : callable, optional
        ``should_stop() -> bool`` polled after every block (e.g. a walltime
        signal); when true training stops there and ``FitResult.stopped`` says so.
    callback : callable, optional
        ``callback(info)`` after every block with a dict: ``iteration``,
        ``iterations``, ``error``, ``seconds_per_iteration``, ``workers``
        (addresses planned), ``plan`` and ``remaps`` (remaps at this boundary).

    Returns
    -------
    FitResult
    """
    from distributed import get_client

    client = client if client is not None else get_client()
    return client.sync(
        _fit_async,
        client,
        x,
        d,
        hidden=hidden,
        iterations=iterations,
        learning_rate=learning_rate,
        mapping=mapping,
        abilities=abilities,
        init=init,
        seed=seed,
        dtype=dtype,
        interval=interval,
        progress=progress,
        on_worker_loss=on_worker_loss,
        min_workers=min_workers,
        elastic=elastic,
        target_error=target_error,
        checkpoint_every=checkpoint_every,
        on_checkpoint=on_checkpoint,
        should_stop=should_stop,
        callback=callback,
    )


async def _ensure_plugin(client: Any) -> None:
    plugins = await client.run_on_scheduler(lambda dask_scheduler: list(dask_scheduler.plugins))
    if PLUGIN_NAME not in plugins:
        await client.register_plugin(RPMSchedulerPlugin())


async def _fit_async(
    client: Any,
    x: Any,
    d: Any,
    *,
    hidden: int | None,
    iterations: int | None,
    learning_rate: float | None,
    mapping: Any,
    abilities: Any,
    init: Any,
    seed: int | None,
    dtype: str | None,
    interval: int | None,
    progress: Any = None,
    on_worker_loss: str | None = None,
    min_workers: int | None = None,
    elastic: bool | None = None,
    target_error: float | None = None,
    checkpoint_every: int | None = None,
    on_checkpoint: Any = None,
    should_stop: Any = None,
    callback: Any = None,
) -> FitResult:
    from .progress import Progress

    reporter = Progress(progress)  # validates progress= before any work
    dtype = config.get("train.dtype", dtype)
    iterations = config.get("train.iterations", iterations)
    learning_rate = float(config.get("train.learning-rate", learning_rate))
    seed = int(config.get("train.seed", seed))
    mapping = config.get("train.mapping", mapping)
    interval = config.get("drpm.interval", interval)
    auto_interval = interval == "auto"
    # With R="auto" the first check comes after one estimation window.
    interval = max(int(config.get("drpm.window")), 2) if auto_interval else int(interval)
    if interval < 1:
        raise DataError(f"interval={interval}; it must be a positive number of iterations or 'auto'")
    on_worker_loss = config.get("train.on-worker-loss", on_worker_loss)
    if on_worker_loss not in ("recover", "raise"):
        raise DataError(f"on_worker_loss={on_worker_loss!r}; use 'recover' (go on without the worker) or 'raise'")
    min_workers = config.get("train.min-workers", min_workers)
    if isinstance(min_workers, bool) or not isinstance(min_workers, (int, np.integer)) or min_workers < 1:
        raise DataError(f"min_workers={min_workers!r}; it must be a positive integer")
    elastic = bool(config.get("train.elastic", elastic)) and not isinstance(mapping, Plan)
    every = config.get("checkpoint.every", checkpoint_every)
    if isinstance(every, bool) or not isinstance(every, (int, np.integer)) or every < 0:
        raise DataError(f"checkpoint_every={every!r}; it must be an integer >= 0 (0: no checkpoints)")
    if target_error is not None and not (np.isfinite(target_error) and target_error >= 0):
        raise DataError(f"target_error={target_error!r}; it must be a finite number >= 0, or None")

    # ---- validate everything before any work starts
    if isinstance(x, (str,)) or hasattr(x, "__fspath__"):
        import os

        source: str | None = os.path.abspath(os.fspath(x))
        s, n, l = data_shape(source)
        arrays = None
        W0, V0 = check_training_args(
            None, None, hidden=hidden, iterations=iterations, learning_rate=learning_rate,
            init=init, seed=seed, dtype=dtype, shape=(s, n, l),
        )
    else:
        source = None
        xa, da = as_arrays(x, d)
        W0, V0 = check_training_args(
            xa, da, hidden=hidden, iterations=iterations, learning_rate=learning_rate,
            init=init, seed=seed, dtype=dtype,
        )
        arrays = (np.ascontiguousarray(xa, dtype=dtype), np.ascontiguousarray(da, dtype=dtype))
        s, n, l = xa.shape[0], xa.shape[1], da.shape[1]
    m = W0.shape[0]
    info = await _wait_for_workers(client, int(min_workers))
    addresses = ordered_workers(info)
    if not addresses:
        raise TrainingError("the cluster has no workers; start some (e.g. dask_rpm.local_cluster()) and retry")
    drpm = mapping == "drpm"
    probe_result = None
    if isinstance(abilities, str):
        if abilities != "probe":
            raise PlanError(f"abilities={abilities!r}; give a sequence of numbers, None, or 'probe'")
        from .probe import _probe_async

        probe_result = await _probe_async(client, shape=(n, m, l), samples=s, dtype=dtype, workers=addresses)
        abilities = [float(v) for v in probe_result["throughput"].values]
    initial_abilities = abilities is not None
    # Without initial abilities DRPM starts from a uniform mapping (SPEC section 6).
    first_mapping = ("srpm" if initial_abilities else "uniform") if drpm else mapping
    plan = _resolve_plan(first_mapping, abilities, addresses=addresses, shape=(n, m, l), samples=s)

    await _ensure_plugin(client)
    run = uuid.uuid4().hex[:10]
    trainer = Trainer(
        client, run=run, plan=plan, source=source, arrays=arrays, W0=W0, V0=V0,
        learning_rate=learning_rate, dtype=dtype,
    )
    names = {a: w.get("name", a) for a, w in info["workers"].items()}  # worker names (SLURM: <group>-<n>)
    drpm_state = _DRPMState(initial_abilities=initial_abilities, auto=auto_interval) if drpm else None
    remaps: list[dict[str, Any]] = drpm_state.remaps if drpm_state is not None else []
    stopped = None
    plans = [plan]
    try:
        await trainer.start()
        await client.scheduler.rpm_update(
            run=run,
            info={"plan": plan.to_dict(), "iterations_total": iterations, "emulation": await _emulation_label(client)},
        )
        done = 0
        # Snapshots (iteration, plan, weights, data) at the start of the current
        # and the previous block, to return the last finite weights on divergence;
        # ``safe``: the last consistent state (after a block or a remap), to go
        # back to when a worker is lost; ``ckpt``: the last weights on the client.
        prev_start = cur_start = safe = trainer.snapshot()
        ckpt = (0, W0, V0)
        while done < iterations:
            block = min(interval, iterations - done)
            if every:
                block = min(block, every - done % every)
            prev_start, cur_start = cur_start, trainer.snapshot()
            n_remaps = len(remaps)
            try:
                keep = await trainer.run_block(block)
                if keep is not None:
                    stopped = await _stop_diverged(trainer, keep, cur_start, prev_start, learning_rate)
                    break
                done += block
                safe = trainer.snapshot()
                await _push_progress(trainer, done - block, done)
                if every and done % every == 0:
                    ckpt = await _checkpoint(trainer, done, on_checkpoint)
                ident = await client.scheduler.identity(n_workers=-1) if elastic else {"workers": {}}
                names.update({a: w.get("name", a) for a, w in ident["workers"].items()})
                alive = ordered_workers(ident) if elastic else []
                joined = [a for a in alive if a not in trainer.addresses]
                if joined and done < iterations:
                    rec = await trainer.rebalance(alive, ckpt, f"{len(joined)} worker(s) joined")
                    remaps.append(rec)
                    safe = trainer.snapshot()
                    logger.info(f"iteration {done}: worker(s) {', '.join(joined)} joined -> whole remap, "
                                f"{rec['bytes']} bytes in {rec['seconds']:.3f} s")
                elif drpm_state is not None and done < iterations:
                    interval = await drpm_state.check(trainer, done - block, done, iterations - done, interval)
                    safe = trainer.snapshot()
            except WorkerLostError as exc:
                if on_worker_loss == "raise":
                    raise
                rec = await _recover(trainer, exc, safe, ckpt)
                remaps.append(rec)
                done = trainer.iteration
                prev_start = cur_start = safe = trainer.snapshot()
                stopped = None
            if trainer.plan is not plans[-1]:
                plans.append(trainer.plan)
            for rec in remaps[n_remaps:]:
                if "lost" in rec:  # membership remaps (DRPM's own are pushed by its check)
                    await client.scheduler.rpm_update(
                        run=trainer.run, info={"plan": trainer.plan.to_dict(), "remaps": [_jsonable(rec)]}
                    )
            if trainer.iteration > cur_start[0]:
                reporter.block(trainer, cur_start[0], trainer.iteration, iterations, remaps)
            if callback is not None:
                callback(_block_info(trainer, cur_start[0], iterations, remaps[n_remaps:]))
            reached = [] if target_error is None else [
                it for it in range(cur_start[0], trainer.iteration) if trainer.error(it) <= target_error
            ]
            if reached:
                stopped = f"target error {target_error:g} reached at iteration {reached[0]}"
                logger.info(stopped)
                break
            if should_stop is not None and done < iterations and should_stop():
                stopped = f"stop requested after iteration {done}"
                logger.info(stopped)
                break
        W, V = await _final_weights(trainer, None if stopped and "diverged" in stopped else safe, ckpt,
                                    on_worker_loss, remaps)
    finally:
        reporter.close(stopped)
        await trainer.close()
    history = _history(trainer, trainer.plan)
    if drpm_state is not None:
        drpm_state.add_to_history(history)
    from .results import describe_history

    describe_history(history, trainer.plan)
    history.coords["name"] = ("worker", np.array([str(names.get(a, a)) for a in history["address"].values], dtype=object),
                              {"description": "Dask worker name (on SLURM <group>-<n>)"})
    emulation = await _emulation_label(client)
    if emulation:
        history.attrs["emulation"] = emulation
    return FitResult(
        W=W, V=V, history=history, plan=trainer.plan, plans=plans, stopped=stopped, emulation=emulation,
        remaps=remaps, probe=probe_result,
    )


async def _wait_for_workers(client: Any, min_workers: int) -> dict[str, Any]:
    """Scheduler identity once ``min_workers`` workers are connected (``rpm.train.wait-workers`` s at most)."""
    timeout = float(config.get("train.wait-workers"))
    deadline = time.monotonic() + timeout
    while True:
        info = await client.scheduler.identity(n_workers=-1)
        have = len(info.get("workers", {}))
        if have >= min_workers:
            return info
        if time.monotonic() > deadline:
            raise TrainingError(
                f"only {have} of min_workers={min_workers} workers connected within {timeout:g} s "
                f"(rpm.train.wait-workers); start more workers, lower min_workers, or wait longer"
            )
        await asyncio.sleep(0.25)


async def _checkpoint(trainer: Trainer, done: int, on_checkpoint: Any) -> tuple[int, np.ndarray, np.ndarray]:
    """Gather the weights after ``done`` iterations; hand them to ``on_checkpoint`` (in a thread)."""
    W, V = await trainer.gather()
    if on_checkpoint is not None:
        state = {
            "iteration": done, "W": W, "V": V, "plan": trainer.plan,
            "errors": np.array([trainer.error(it) for it in range(done)]),
        }
        await asyncio.get_running_loop().run_in_executor(None, on_checkpoint, state)
    return done, W, V


async def _recover(trainer: Trainer, exc: WorkerLostError, safe: tuple, ckpt: tuple) -> dict[str, Any]:
    """Go back to the last consistent state and remap onto the workers left (see Trainer.rebalance)."""
    failed_at = trainer.iteration
    for attempt in range(len(trainer.addresses) + 1):
        trainer.restore(safe)
        await asyncio.sleep(0.5 if attempt else 0.0)
        alive = ordered_workers(await trainer.client.scheduler.identity(n_workers=-1))
        # A worker named lost is gone even if its address is still listed (closing).
        alive = [a for a in alive if a not in exc.workers]
        try:
            rec = await trainer.rebalance(alive, ckpt, f"worker(s) {', '.join(exc.workers)} lost")
            break
        except WorkerLostError as again:  # another worker left during recovery
            exc = WorkerLostError([*exc.workers, *again.workers], again.iteration)
    else:  # pragma: no cover - every attempt lost a worker
        raise exc
    rec["replayed"] = failed_at - trainer.iteration
    logger.warning(
        f"iteration {failed_at}: {exc}; recovered from the {rec['recovered_from']} -> whole remap onto "
        f"{len(trainer.plan.planned_workers)} worker(s), {rec['bytes']} bytes in {rec['seconds']:.3f} s, "
        f"continuing from iteration {trainer.iteration}"
    )
    return rec


async def _final_weights(
    trainer: Trainer, safe: tuple | None, ckpt: tuple, on_worker_loss: str, remaps: list[dict[str, Any]]
) -> tuple[np.ndarray, np.ndarray]:
    """Gather the final weights; a worker lost now is recovered from like one lost mid-run."""
    target = trainer.iteration
    for _ in range(len(trainer.addresses) + 1):
        try:
            try:
                if trainer.iteration < target:  # recovered from a checkpoint: compute up to where we were
                    await trainer.run_block(target - trainer.iteration)
                return await trainer.gather()
            except WorkerLostError:
                raise
            except Exception:  # e.g. a shard cancelled because its worker just died
                await trainer._check_workers(trainer.iteration, grace=2.0)
                raise
        except WorkerLostError as exc:
            if on_worker_loss == "raise" or safe is None:
                raise
            remaps.append(await _recover(trainer, exc, safe, ckpt))
    raise TrainingError("could not gather the final weights: workers kept leaving")  # pragma: no cover


def _block_info(trainer: Trainer, first: int, iterations: int, remaps: list[dict[str, Any]]) -> dict[str, Any]:
    stop = trainer.iteration
    ends = []
    for it in range(first, stop):
        e = [trainer.timings.get((it, w), {}).get("modify", (np.nan, np.nan))[1] for w in trainer.plan.planned_workers]
        ends.append(np.nanmax(e) if e and np.isfinite(e).any() else np.nan)
    d = np.diff(np.asarray(ends, dtype=float))
    d = d[np.isfinite(d)]
    return {
        "iteration": stop,
        "iterations": iterations,
        "error": trainer.error(stop - 1) if stop > 0 and (stop - 1) in trainer.errors else float("nan"),
        "seconds_per_iteration": float(np.median(d)) if d.size else float("nan"),
        "workers": [trainer.addresses[w] for w in trainer.plan.planned_workers],
        "plan": trainer.plan,
        "remaps": list(remaps),
    }


async def _push_progress(trainer: Trainer, first: int, stop: int) -> None:
    """Send the block's errors and iteration times to the scheduler plugin (dashboard)."""
    rows = []
    for it in range(first, stop):
        ends = [trainer.timings.get((it, w), {}).get("modify", (np.nan, np.nan))[1] for w in trainer.plan.planned_workers]
        rows.append({"iteration": it, "error": trainer.error(it), "end": float(np.nanmax(ends)) if ends else None})
    for prev, row in zip([None, *rows[:-1]], rows):
        row["time"] = (row["end"] - prev["end"]) if prev is not None and prev["end"] and row["end"] else None
    await trainer.client.scheduler.rpm_update(run=trainer.run, info={"iterations": rows})


class _DRPMState:
    """DRPM between blocks: estimate abilities from task timings, decide, remap (SPEC section 6)."""

    def __init__(self, *, initial_abilities: bool, auto: bool) -> None:
        from .estimator import AbilityEstimator

        self.estimator = AbilityEstimator(window=config.get("drpm.window"))
        # Validated here, before any iteration runs, not at the first check.
        self.column_times = str(config.get("drpm.column-times"))
        if self.column_times not in ("tc", "t1"):
            raise ValueError(
                f"rpm.drpm.column-times must be 'tc' (compute without the wait) or 't1' (the paper's), "
                f"got {self.column_times!r}"
            )
        self.initial_abilities = initial_abilities
        self.auto = auto
        self.checks: list[tuple[int, np.ndarray]] = []
        self.remaps: list[dict[str, Any]] = []

    async def check(self, trainer: Trainer, first: int, stop: int, remaining: int, interval: int) -> int:
        from .policy import auto_interval, decide
        from .remap import column_remap, whole_remap

        from .estimator import EstimatorError

        for w, work, t1, t2, tc in trainer.observations(first, stop):
            self.estimator.observe(w, work, t1, t2, tc)
        planned = trainer.plan.planned_workers
        try:
            times = self.estimator.recent_times("t1", workers=planned)
            speeds_col = self.estimator.estimate(self.column_times, workers=planned)  # type: ignore[arg-type]
            speeds_t2 = self.estimator.estimate("t2", workers=planned)
        except EstimatorError as exc:  # e.g. a worker that just joined has no times yet
            logger.info(f"check at iteration {stop}: skipped ({exc})")
            return interval
        policy = config.get("drpm.policy")
        kw: dict[str, Any] = {}
        if policy == "cost":
            kw = {"plan": trainer.plan, "speeds": speeds_col, "whole_speeds": speeds_t2, "remaining": remaining}
        decision = decide(times, policy=policy, first_check=not self.checks, initial_abilities=self.initial_abilities, **kw)
        vec = np.full(len(trainer.plan.abilities), np.nan)
        for w, v in speeds_t2.items():
            vec[w] = v
        self.checks.append((stop, vec))
        new = getattr(decision, "plan", None)
        if trainer.gone and new is not None and set(new.planned_workers) & trainer.gone:
            new = None  # planned from abilities that still count lost workers: plan again below
        if decision.kind == "whole" and new is None:
            # After a worker loss, plan only the workers still there.
            new = trainer.whole_plan(speeds_t2) if trainer.gone else whole_remap(trainer.plan, speeds_t2)
        elif decision.kind == "column" and new is None:
            new = column_remap(trainer.plan, speeds_col)
        line = f"check at iteration {stop}: t_min/t_max = {decision.ratio:.2f}; {decision.reason}"
        if new is not None and decision.kind:
            rec = await trainer.remap(new, decision.kind)
            rec["reason"] = decision.reason
            self.remaps.append(rec)
            line += f" -> {decision.kind} remap, {rec['bytes']} bytes in {rec['seconds']:.3f} s"
            await trainer.client.scheduler.rpm_update(
                run=trainer.run, info={"plan": new.to_dict(), "remaps": [_jsonable(rec)]}
            )
        logger.info(line)
        total = float(np.nansum(vec))
        await trainer.client.scheduler.rpm_update(
            run=trainer.run,
            info={"abilities": [{"check": len(self.checks) - 1, "iteration": stop,
                                 "abilities": [None if not np.isfinite(v) else float(v / total) for v in vec]}]},
        )
        if self.auto:
            secs = self._iteration_seconds(trainer, first, stop)
            if np.isfinite(secs) and secs > 0:
                interval = auto_interval(secs)
        return interval

    @staticmethod
    def _iteration_seconds(trainer: Trainer, first: int, stop: int) -> float:
        ends = []
        for it in range(first, stop):
            e = [trainer.timings.get((it, w), {}).get("modify", (np.nan, np.nan))[1] for w in trainer.plan.planned_workers]
            ends.append(np.nanmax(e) if e else np.nan)
        d = np.diff(np.asarray(ends, dtype=float))
        d = d[np.isfinite(d)]
        return float(np.median(d)) if d.size else float("nan")

    def add_to_history(self, history: Any) -> None:
        if not self.checks:
            return
        # Workers that joined during the run make later vectors longer: pad with NaN.
        width = max(max(v.size for _, v in self.checks), int(history.sizes.get("worker", 0)))
        ab = np.array([np.pad(v, (0, width - v.size), constant_values=np.nan) for _, v in self.checks])
        with np.errstate(invalid="ignore"):
            ab = ab / np.nansum(ab, axis=1, keepdims=True)
        history["ability"] = (
            ("check", "worker"), ab,
            {"units": "1", "description": "estimated ability (t2 least squares), normalised to sum 1 at each check"},
        )
        history.coords["check_iteration"] = ("check", np.array([it for it, _ in self.checks]))


def _jsonable(rec: dict[str, Any]) -> dict[str, Any]:
    return {k: (float(v) if isinstance(v, (np.floating,)) else v) for k, v in rec.items()}


async def _stop_diverged(
    trainer: Trainer, keep: int, cur_start: tuple, prev_start: tuple, learning_rate: float
) -> str:
    """Roll back to the last finite weights, those after ``keep`` updates.

    They are recomputed (deterministically) from the start of the block that
    contains them; the history keeps the errors of the ``keep`` iterations.
    """
    snap = cur_start if keep >= cur_start[0] else prev_start
    await trainer.replay(snap, keep)
    trainer.iteration = keep
    for it in [k for k in trainer.errors if k >= keep]:
        del trainer.errors[it]
    msg = (
        f"training diverged: iteration {keep} produced a non-finite error or non-finite weights "
        f"(learning_rate={learning_rate} is probably too large); returning the last finite weights, "
        f"after {keep} iteration(s)"
    )
    logger.warning(msg)
    return msg


async def _emulation_label(client: Any) -> str | None:
    cluster = getattr(client, "cluster", None)
    return getattr(cluster, "emulation_label", None)


def _history(trainer: Trainer, plan: Plan) -> Any:
    """Assemble the per-iteration, per-worker history as an xarray Dataset."""
    import xarray as xr

    its = sorted(it for it in trainer.errors)
    n_workers = len(plan.abilities)
    shape = (len(its), n_workers)
    phases = {p: np.full(shape, np.nan) for p in PHASES}
    # Per worker: when it started iteration 0, and when each modify ended.
    ends = np.full((len(its) + 1, n_workers), np.nan)
    for i, it in enumerate(its):
        for w in range(n_workers):
            t = trainer.timings.get((it, w))
            if not t or "forward" not in t or "backward" not in t:
                continue
            f0, f1 = t["forward"]
            b0, b1 = t["backward"]
            phases["forward"][i, w] = f1 - f0
            phases["vertical_wait"][i, w] = b0 - f1
            phases["backward"][i, w] = b1 - b0
            if i == 0:
                ends[0, w] = f0
            if "modify" in t:
                m0, m1 = t["modify"]
                phases["horizontal"][i, w] = m0 - b1
                phases["modify"][i, w] = m1 - m0
                ends[i + 1, w] = m1
    # Iterations overlap a little (a worker may start iteration k+1 before
    # another finishes k), so an iteration is timed per worker, from the end
    # of its previous modify to the end of this one; the slowest worker counts.
    cycle = np.diff(ends, axis=0)
    iteration_time = np.full(len(its), np.nan)
    for i in range(len(its)):
        row = cycle[i][np.isfinite(cycle[i])]
        if row.size:
            iteration_time[i] = row.max()
    desc = {
        "forward": "compute 1: hidden outputs and partial products",
        "vertical_wait": "from forward end to backward start: vertical exchange incl. waiting",
        "backward": "compute 2: deltas and weight-update sums",
        "horizontal": "from backward end to modify start: horizontal exchange incl. waiting",
        "modify": "compute 3: applying the summed update",
    }
    data_vars = {
        "error": (("iteration",), np.array([trainer.error(it) for it in its]),
                  {"units": "1", "description": "0.5 * sum over samples of ||h - d||^2, before the iteration's update"}),
        "iteration_time": (("iteration",), iteration_time,
                           {"units": "s", "description": "per worker, end of previous modify to end of this one; slowest worker"}),
    }
    for p in PHASES:
        data_vars[p] = (("iteration", "worker"), phases[p], {"units": "s", "description": desc[p]})
    t1 = phases["forward"] + phases["vertical_wait"] + phases["backward"]
    data_vars["t1"] = (("iteration", "worker"), t1, {"units": "s", "description": "DRPM t1: forward start to backward end"})
    data_vars["t2"] = (("iteration", "worker"), phases["backward"], {"units": "s", "description": "DRPM t2: backward compute"})
    data_vars["tc"] = (("iteration", "worker"), phases["forward"] + phases["backward"],
                       {"units": "s", "description": "DRPM tc: forward + backward compute, without the vertical wait"})
    coords = {
        "iteration": ("iteration", np.array(its, dtype=int)),
        "worker": ("worker", np.arange(n_workers)),
        "address": ("worker", np.array(list(plan.workers or [""] * n_workers), dtype=object)),
    }
    return xr.Dataset(data_vars, coords=coords, attrs={"run": trainer.run, "method": plan.method})
