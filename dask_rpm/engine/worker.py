"""Worker side of the data plane: a worker plugin that owns each run's state.

Modelled on distributed's P2P shuffle (``distributed/shuffle/_worker_plugin.py``):
:class:`RPMEnginePlugin` is registered on every worker by :func:`dask_rpm.fit`,
registers ``worker.handlers`` for messages from other workers, and keeps one
:class:`RunState` per training run: the worker's rows of every parameter and their
optimizer state (with the previous update's copy and the block's starting copy), its
column's samples, the kernel buffers and the run's mailbox (:mod:`dask_rpm.comm.mailbox`).

Messages travel worker to worker over Dask's own comm layer
(``worker.rpc(address).rpm_put(...)``: TCP, or UCX where the cluster is
configured for it), never through the scheduler or the client. The block
loop runs as an ``async`` Dask task on the worker's event loop, next to the
``rpm_put`` handler that fills its receive slots, so a message costs no thread
hand-off (measured on this 2-core machine: 0.2 ms of CPU per exchange less
than a block loop in a worker thread); large kernels go to a compute thread
so the event loop stays responsive. Every receive has a deadline, so a lost
peer never leaves anyone waiting forever.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import logging
import math
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from distributed.diagnostics.plugin import WorkerPlugin

from .._distributed import to_serialize
from ..comm.mailbox import Mailbox, unpack
from ..nn import backend as xb
from ..nn.backend import NUMPY, Backend
from ..nn.cnn import ConvLayers
from ..nn.kernels import Workspace, all_finite
from ..nn.layers import Layers
from ..nn.optim import Optimizer, step
from ..nn.workspaces import workspace
from ..runtime import threads
from ..runtime.hooks import worker_hooks
from .copies import CopyKeeper
from .records import Layout, RunSpec
from .samples import ColumnData

__all__ = [
    "RPMEnginePlugin",
    "RunState",
    "PLUGIN_NAME",
    "get_state",
    "lifetime_deadline",
    "rows_of",
]

logger = logging.getLogger("dask_rpm")

PLUGIN_NAME = "rpm-engine"


class Shard:
    """A worker's rows of every parameter and their optimizer state: current, before the last
    update, at the block start.

    ``params`` are the parameters' pieces its plan rows ``rows`` hold
    (:meth:`Layers.take <dask_rpm.nn.layers.Layers.take>`); ``state[slot]`` has one array per
    parameter for each of the optimizer's state slots (:mod:`dask_rpm.nn.optim`), cut the same
    way. Nothing here names a parameter: every operation loops over the list. The arrays live
    on ``backend`` (:mod:`~dask_rpm.nn.backend`); :meth:`rows` gives host copies.
    """

    __slots__ = (
        "layers",
        "origin",
        "params",
        "state",
        "prev",
        "state_prev",
        "prev_valid",
        "snap",
        "state_snap",
        "snap_iteration",
        "finite",
        "squares",
        "backend",
    )

    def __init__(
        self,
        layers: Layers | ConvLayers,
        origin: int,
        params: Sequence[np.ndarray],
        state: dict[str, Any] | None = None,
        backend: Backend = NUMPY,
    ) -> None:
        self.layers, self.origin, self.backend = layers, int(origin), backend
        self.params = [backend.copy_of(p) for p in params]
        self.state = {k: [backend.copy_of(a) for a in v] for k, v in (state or {}).items()}
        empty_like = backend.ns.empty_like
        self.prev = [empty_like(p) for p in self.params]
        self.state_prev = {k: [empty_like(a) for a in v] for k, v in self.state.items()}
        self.prev_valid = False
        self.snap = [empty_like(p) for p in self.params]
        self.state_snap = {k: [empty_like(a) for a in v] for k, v in self.state.items()}
        self.snap_iteration: int | None = None
        self.finite = self._all_finite()
        # sum W^2 of the weights held (the L2 penalty's), from the last step; NaN: not known
        self.squares = math.nan

    @classmethod
    def fresh(
        cls,
        layers: Layers | ConvLayers,
        origin: int,
        params: Sequence[np.ndarray],
        opt: Optimizer,
        backend: Backend = NUMPY,
    ) -> Shard:
        """A shard with zero optimizer state (the start of training)."""
        zeros = {slot: [np.zeros_like(p) for p in params] for slot in opt.slots}
        return cls(layers, origin, params, zeros, backend)

    def _all_finite(self) -> bool:
        return all(all_finite(p) for p in self.params)

    @staticmethod
    def _copy_all(dst: Sequence[np.ndarray], src: Sequence[np.ndarray]) -> None:
        for a, b in zip(dst, src):
            xb.copyto(a, b)

    def _copy_state(
        self, dst: dict[str, list[np.ndarray]], src: dict[str, list[np.ndarray]]
    ) -> None:
        for k, arrays in src.items():
            self._copy_all(dst[k], arrays)

    def snapshot(self, iteration: int) -> None:
        self._copy_all(self.snap, self.params)
        self._copy_state(self.state_snap, self.state)
        self.snap_iteration = iteration

    def update(
        self,
        sums: list[np.ndarray],
        eps: float,
        opt: Optimizer | None = None,
        t: int = 1,
        *,
        batch: Any = None,
        alpha: float = 0.0,
        biases: Sequence[int | None] = (),
    ) -> bool:
        """One optimizer step from the summed updates (scratch: overwritten); returns finiteness.

        The step writes the new weights and optimizer state into the spare buffers, which are
        then swapped in (:func:`dask_rpm.nn.optim.step`: one pass over each parameter, no
        copy), so on divergence the last finite weights and state are still there
        (:meth:`revert`). ``batch``, ``alpha`` and ``biases`` make the summed update the mean
        gradient first (scikit-learn's); with ``alpha`` the step also leaves ``squares``, the
        new weights' ``sum W^2``, for the next iteration's penalty.
        """
        got = step(
            opt or Optimizer(),
            eps,
            t,
            self.params,
            sums,
            self.state,
            out=(self.prev, self.state_prev),
            batch=batch,
            alpha=alpha,
            biases=biases,
            sum_squares=bool(alpha),
        )
        self.params, self.prev = self.prev, self.params
        self.state, self.state_prev = self.state_prev, self.state
        self.prev_valid = True
        self.finite, self.squares = got.finite, got.squares
        return self.finite

    def rollback(self) -> int:
        """Back to the block's starting weights; returns that iteration."""
        if self.snap_iteration is None:
            raise RuntimeError("no block snapshot to roll back to")
        self._copy_all(self.params, self.snap)
        self._copy_state(self.state, self.state_snap)
        self.prev_valid = False
        self.finite = True
        self.squares = math.nan
        return self.snap_iteration

    def revert(self) -> None:
        """Back to the weights before the last update (divergence)."""
        if not self.prev_valid:
            raise RuntimeError("no previous weights to revert to")
        self.params, self.prev = self.prev, self.params
        self.state, self.state_prev = self.state_prev, self.state
        self.prev_valid = False
        self.finite = self._all_finite()
        self.squares = math.nan

    def rows(self, a: int, b: int) -> dict[str, Any]:
        """Plan rows ``[a, b)`` (global numbering): weights and optimizer state, in host memory."""
        return rows_of(self.layers, self.params, self.state, a, b, self.origin)

    def nbytes(self) -> int:
        """Bytes of the weights and the optimizer state this shard holds (its spare copies not
        counted)."""
        return int(
            sum(p.nbytes for p in self.params)
            + sum(a.nbytes for v in self.state.values() for a in v)
        )


def rows_of(
    layers: Layers | ConvLayers,
    params: Sequence[np.ndarray],
    state: dict[str, Any] | None,
    a: int,
    b: int,
    origin: int = 0,
) -> dict[str, Any]:
    """Plan rows ``[a, b)`` of ``params`` and of the optimizer ``state`` (``{slot: [one array per
    parameter]}``) held from plan row ``origin`` on, as contiguous copies: what a worker holds of
    those rows, wherever they are cut from (:meth:`~dask_rpm.nn.layers.Layers.take`)."""
    return {
        "params": layers.take(params, (a, b), origin),
        "state": {k: layers.take(v, (a, b), origin) for k, v in (state or {}).items()},
    }


class RunState:
    """Everything one worker holds for one training run: its shard, its column's samples, the
    kernels' buffers and its :class:`~dask_rpm.comm.mailbox.Mailbox`, whose transport is
    Dask's worker-to-worker RPC."""

    def __init__(
        self, worker: Any, layout: Layout, shard: Shard, data: ColumnData, spec: RunSpec
    ) -> None:
        self.worker = worker
        self.run = layout.run
        self.layout = layout
        self.shard = shard
        self.data = data
        self.spec = spec
        self.recipe = spec.recipe
        self.iteration = 0
        self.staged: dict[int, tuple[Layout, Shard, ColumnData]] = {}
        self.workspace: Workspace | None = None
        # the summed gradient of the last evaluation (BlockSpec.step False: engine.objective)
        self.gradient: list[Any] | None = None
        # the messages of this run; the worker index of a run does not change
        self.mailbox = Mailbox(layout.run, layout.worker, layout.address, self._post)
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self.busy = asyncio.Lock()  # one block at a time
        # the run's buddy copies on this worker (the plugin's: they outlive this state)
        self.copies: CopyKeeper | None = None

    # ----------------------------------------------------------- compute
    def kernels(self) -> Workspace:
        layers, rows = self.shard.layers, self.layout.rows
        net = self.recipe.net
        kw: dict[str, Any] = dict(
            dtype=self.data.dtype,
            net=net,
            loss_scale=self.recipe.loss_scale(layers.l),
            layers=layers,
            units=layers.units(rows),
            # each layer's bias unit, if this worker holds it
            bias_rows=layers.bias_rows(rows, net.bias),
            backend=self.shard.backend,
        )
        s = self.data.capacity
        if self.workspace is None or not self.workspace.fits(s, **kw):
            self.workspace = workspace(s, **kw)
        return self.workspace

    async def compute(self, inline: bool, fn: Any, *args: Any) -> Any:
        """Run ``fn(*args)`` on the event loop (small work: no thread hand-off) or in this run's
        compute thread (large work: the worker's event loop stays responsive)."""
        if inline:
            return fn(*args)
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                1,
                thread_name_prefix="rpm-compute",
                initializer=xb.use_in_thread,
                initargs=(self.shard.backend,),
            )
        ctx = contextvars.copy_context()  # get_worker() (EMULATED pacing) works in the thread too
        return await asyncio.get_running_loop().run_in_executor(
            self._executor, ctx.run, threads.here, fn, *args
        )

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False)
            self._executor = None

    # ----------------------------------------------------------- messages
    async def _post(self, address: str, msg: dict[str, Any]) -> None:
        """The mailbox's transport: one message to a peer over Dask's worker-to-worker RPC."""
        # a hook (dask_rpm.runtime.hooks) only where one is set: EMULATED link classes
        # (local_cluster(nodes=...)) make the message wait its link's added delay first
        before_send = worker_hooks(self.worker).before_send
        if before_send is not None:
            nbytes = sum(
                len(p[1]) for p in msg["payload"] if isinstance(p, list) and p[:1] == ["nd"]
            )
            await before_send(address, nbytes)
        # one way (no reply): a lost peer shows as a failed write, a deadline, or the driver's abort
        await self.worker.rpc(address).rpm_put(reply=False, **msg)


class RPMEnginePlugin(WorkerPlugin):
    """Holds the per-run state of dask_rpm training on a worker and its message handlers.

    Registered by the scheduler plugin when it starts (:class:`~dask_rpm.engine.scheduler_plugin.RPMSchedulerPlugin`); idempotent,
    so every ``fit`` on the same cluster reuses the one installed.
    """

    name = PLUGIN_NAME
    idempotent = True

    def __init__(self) -> None:
        self.runs: dict[str, RunState] = {}
        # each run's buddy copies (dask_rpm.engine.copies): kept while the worker holds no rows too
        self.copies: dict[str, CopyKeeper] = {}
        self.worker: Any = None
        self.deadline: float | None = None  # when the worker's Dask lifetime ends (time.time())

    def setup(self, worker: Any) -> None:
        self.worker = worker
        self.runs = {}
        self.copies = {}
        self.deadline = lifetime_deadline(worker)
        worker.handlers["rpm_put"] = self.put
        worker.handlers["rpm_rows"] = self.rows
        worker.handlers["rpm_keep"] = self.keep
        worker.handlers["rpm_copy"] = self.copy

    def teardown(self, worker: Any) -> None:
        for state in self.runs.values():
            state.close()
        self.runs.clear()
        for keeper in self.copies.values():
            keeper.close()
        self.copies.clear()

    def keeper(self, run: str, layers: Any = None) -> CopyKeeper:
        """``run``'s :class:`~dask_rpm.engine.copies.CopyKeeper` here (made on first use), its
        transport Dask's worker-to-worker RPC."""
        keeper = self.copies.get(run)
        if keeper is None:
            worker = self.worker

            async def send(address: str, message: dict[str, Any]) -> None:
                wrapped = {
                    **message,
                    "params": [to_serialize(p) for p in message["params"]],
                    "state": {k: [to_serialize(a) for a in v] for k, v in message["state"].items()},
                    "layers": to_serialize(message["layers"]),
                }
                # EMULATED links hold a copy back by its link's added delay, as they do the
                # engine's messages (one queue per peer: the copy shares the link)
                before_send = worker_hooks(worker).before_send
                if before_send is not None:
                    nbytes = sum(np.asarray(p).nbytes for p in message["params"]) + sum(
                        np.asarray(a).nbytes for v in message["state"].values() for a in v
                    )
                    await before_send(address, nbytes)
                await worker.rpc(address).rpm_keep(run=run, **wrapped)

            keeper = self.copies[run] = CopyKeeper(worker.address, send)
        if layers is not None:
            keeper.layers = layers
        return keeper

    # ----------------------------------------------------------- handlers
    def put(
        self, run: str, epoch: int, iteration: int, phase: str, sender: int, payload: Any
    ) -> None:
        state = self.runs.get(run)
        if state is not None:
            state.mailbox.deliver(
                epoch, iteration, phase, sender, tuple(unpack(p) for p in payload)
            )

    def keep(
        self,
        run: str,
        sender: str,
        iteration: int,
        rows: Any,
        params: Any,
        state: Any,
        layers: Any = None,
    ) -> bool:
        """A buddy copy from ``sender`` (:meth:`CopyKeeper.receive <dask_rpm.engine.copies.CopyKeeper.receive>`)."""
        self.keeper(run).receive(
            sender,
            iteration,
            rows,
            [_unwrap(p) for p in params],
            {k: [_unwrap(a) for a in v] for k, v in state.items()},
            getattr(layers, "data", layers),  # inproc transport: still wrapped
        )
        return True

    def copy(self, run: str, iteration: int, a: int, b: int, kind: str) -> dict[str, Any]:
        """Rows ``[a, b)`` of iteration ``iteration`` for a recovery: of this worker's live shard
        (``current``), of its own copy (``own``) or of a copy it keeps for a buddy (``buddy``)."""
        out = held_rows(self, run, iteration, a, b, kind)
        return {
            "params": [to_serialize(p) for p in out["params"]],
            "state": {k: [to_serialize(p) for p in v] for k, v in out["state"].items()},
        }

    def rows(self, run: str, a: int, b: int) -> dict[str, Any]:
        """Hidden rows ``[a, b)`` (global numbering) of this worker's current shard, for a remap."""
        state = self.runs.get(run)
        if state is None:
            raise KeyError(f"run {run!r} has no state on this worker")
        m0, m1 = state.layout.rows
        if not (m0 <= a < b <= m1):
            raise ValueError(f"rows [{a}, {b}) are not within this worker's rows [{m0}, {m1})")
        out = state.shard.rows(a, b)
        return {
            "params": [to_serialize(p) for p in out["params"]],
            "state": {k: [to_serialize(p) for p in v] for k, v in out["state"].items()},
        }


def _unwrap(v: Any) -> np.ndarray:
    """An array as received: the inproc transport leaves it wrapped for serialisation."""
    return v if isinstance(v, np.ndarray) else np.asarray(getattr(v, "data", v))


def held_rows(
    plugin: RPMEnginePlugin, run: str, iteration: int, a: int, b: int, kind: str
) -> dict[str, Any]:
    """Rows ``[a, b)`` of iteration ``iteration`` this worker holds as ``kind`` (``current``: its
    live shard, at that iteration; ``own`` / ``buddy``: a copy), as :func:`rows_of` gives them."""
    if kind != "current":
        return plugin.keeper(run).rows(iteration, a, b, kind)
    state = plugin.runs.get(run)
    if state is None or state.iteration != iteration:
        at = None if state is None else state.iteration
        raise KeyError(f"run {run!r} is at iteration {at} on this worker, not {iteration}")
    m0, m1 = state.layout.rows
    if not (m0 <= a < b <= m1):
        raise ValueError(f"rows [{a}, {b}) are not within this worker's rows [{m0}, {m1})")
    return state.shard.rows(a, b)


def lifetime_deadline(worker: Any) -> float | None:
    """When this worker's Dask lifetime ends (``--lifetime``; wall-clock ``time.time()``), or None.

    Distributed schedules ``close_gracefully`` on the worker's event loop at
    start-up (with the random stagger already applied) but keeps the time in
    no public attribute or hook (``Worker.lifetime`` is the length before the
    stagger, and no API says when the timer fires); the timer itself has it,
    so the loop's scheduled handles are read. Without that timer (another
    event-loop implementation) the plugin's set-up time plus the lifetime is
    the estimate.
    """
    lifetime = getattr(worker, "lifetime", None)
    if not lifetime:
        return None
    loop = worker.io_loop.asyncio_loop
    for handle in list(getattr(loop, "_scheduled", ())):
        parts = (getattr(handle, "_callback", None), *(getattr(handle, "_args", None) or ()))
        if any("close_gracefully" in repr(p) for p in parts):
            return time.time() + (handle.when() - loop.time())
    return time.time() + float(lifetime)


def get_state(run: str, worker: Any = None) -> RunState:
    """The :class:`RunState` of ``run`` on the current worker."""
    if worker is None:
        from distributed import get_worker

        worker = get_worker()
    plugin = worker.plugins.get(PLUGIN_NAME)
    if plugin is None:
        raise RuntimeError("the dask_rpm engine plugin is not installed on this worker")
    state = plugin.runs.get(run)
    if state is None:
        raise KeyError(f"run {run!r} has no state on worker {worker.address}")
    return state
