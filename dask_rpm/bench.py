"""``dask-rpm bench``: every mapping method side by side on EMULATED heterogeneous workers.

Reproduces the paper's efficiency experiment (SPEC section 7) on
:func:`dask_rpm.local_cluster` and measures it against what users run today.
**All figures are EMULATED heterogeneity on one machine**: every worker runs on
the same cores and slow workers sleep in proportion to the CPU time they used
(docs/emulation.md). They show how each method copes with a speed profile;
they are not hardware measurements.

For every *case* (workload x condition x N) one cluster is started and, in one
run on that cluster:

1. ``T_series(i)``: the same job (same network, all samples) on worker ``i``
   alone, a one-rectangle plan, for every worker;
2. the methods, one after the other on the same workers:

   ================  ============================================================
   ``uniform``       method 1, equal work (heterogeneity ignored), best N_DP
   ``hrev``          method H_rev on the assumed abilities, best N_DP
   ``srpm-assumed``  SRPM on the paper's *assumed* abilities (clock and job
                     count: the SPEC profile), not the emulated truth
   ``srpm-probed``   SRPM on abilities measured by :func:`dask_rpm.probe.probe`
   ``drpm-init``     DRPM starting from SRPM on the assumed abilities
   ``drpm``          DRPM without initial abilities (starts uniform)
   ``split-1d``      proportional 1-D batch split on the probed abilities
   ``ddp``           plain PyTorch DistributedDataParallel (gloo, CPU), the same
                     MLP, equal sample shares, ranks paced to the same EMULATED
                     speeds; needs torch (``pip install .[bench]``), else skipped
   ================  ============================================================

Truth versus assumption: the SPEC profiles are what the paper *assumed*
(0.63 for a Pentium III 500 MHz against 800 MHz = 1.0); the paper then
*measured* about 0.5 for those machines (condition B estimates 0.49-0.52). The
emulated truth is therefore the profile with every 0.63 replaced by 0.5;
``srpm-assumed``, ``hrev`` and ``drpm-init`` get the profile as listed.

Best N_DP: the baselines are run at the N_DP (divisor of N) with the smallest
iteration time predicted by :func:`dask_rpm.cost.predict_iteration_seconds`
from the measured ``T_series`` speeds (``dp_search="model"``), or at every
N_DP keeping the fastest measured (``dp_search="measured"``, slower).

Metric: ``gamma = (1 / T_parallel) / sum_i (1 / T_series(i))`` with
``T_parallel`` the median iteration time over the second half of the run
(steady state, same rule for every method) and ``ratio_to_drpm`` that time
over DRPM's. ``ddp``'s gamma uses the same ``T_series`` (numpy kernels), so
gammas compare iteration times directly; torch's kernels are not numpy's.

Mini-batches (issue 11; workload ``minibatch``, 203-1024-26 with 16384
samples, at ``batch_sizes`` 256, 1024, 4096 by default): one case per batch
size; an iteration is one mini-batch step, ``T_series(i)`` is worker ``i``
alone on the same batches, and every method trains on the same mini-batch
sequence (:mod:`dask_rpm.batches`; the DDP peer's ranks take equal shares of
each batch and all-reduce every step). ``weights_vs_serial`` checks that:
every method's final weights against :func:`dask_rpm.fit_serial` with the
same batches. ``phase_seconds`` says where the engine's time goes.

Load step (conditions ``A-step``/``B-step``): the fastest worker slows to a
third of its speed from iteration ``step_at`` (an emulation schedule, every
run). Its ``T_series`` is measured at the slowed speed, so gamma refers to the
capacity after the step, and the steady-state window starts after it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import socket
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ._files import atomic_write, atomic_write_text

_atomic = atomic_write  # simulate.py writes through this name

__all__ = [
    "CONDITIONS",
    "WORKLOADS",
    "METHODS",
    "BenchCase",
    "run_bench",
    "summary_rows",
    "markdown_table",
    "plot_bench",
    "write_outputs",
    "add_bench_parser",
    "gamma",
]

#: SPEC section 7: the paper's assumed ability profiles (use the first N).
CONDITIONS: dict[str, tuple[float, ...]] = {
    "A": (0.25, 0.31, 0.63, 1.0, 1.0, 0.42, 0.67, 0.63),
    "B": (0.63, 0.63, 0.63, 1.0, 0.63, 1.0, 1.0, 0.63),
}
#: Assumed 0.63 (clock ratio 500/800 MHz), measured about 0.5 by the paper.
ASSUMED_TO_TRUE = {0.63: 0.5}
#: name -> (n, m, l, s)
WORKLOADS: dict[str, tuple[int, int, int, int]] = {
    # The paper's NETtalk size: about 5 ms of compute per iteration on one core
    # here, far below Dask's per-task latency, so it measures the engine.
    "paper": (203, 80, 26, 1024),
    # Same inputs/outputs, 1024 hidden units and 32768 samples: about 1.3 s of
    # float64 compute per iteration on one core (0.8 s per iteration on 8
    # EMULATED workers at auto scale), against ~0.05-0.13 s of Dask latency.
    "compute": (203, 1024, 26, 32768),
    # Issue 11: mini-batch SGD on the compute network. 16384 samples give 4 to
    # 64 batches per epoch at the batch sizes of MINIBATCH_SIZES; a batch of
    # 4096 costs an eighth of the compute workload's iteration, one of 256 a
    # 128th (a few ms per worker: latency-bound, like the paper's workload).
    "minibatch": (203, 1024, 26, 16384),
}
#: Batch sizes the ``minibatch`` workload runs at unless ``batch_sizes`` is given.
MINIBATCH_SIZES = (256, 1024, 4096)
#: Methods of the mini-batch comparison (issue 11), the ``--methods`` of its docs command.
MINIBATCH_METHODS = ("drpm", "split-1d", "uniform", "ddp")
METHODS = ("uniform", "hrev", "srpm-assumed", "srpm-probed", "drpm-init", "drpm", "split-1d", "ddp")
STEP_FACTOR = 3.0
MAX_N = len(CONDITIONS["A"])


class BenchError(ValueError):
    """Bad benchmark arguments."""


@dataclass
class BenchCase:
    """One cluster: a workload, a condition and a worker count."""

    workload: str
    condition: str
    n: int
    shape: tuple[int, int, int]
    samples: int
    speeds: tuple[float, ...]  # EMULATED truth
    assumed: tuple[float, ...]  # what the paper assumed
    step_worker: int | None = None
    step_at: int | None = None
    batch_size: int | None = None  # samples per iteration; None: full batch (the paper's)

    @property
    def name(self) -> str:
        base = f"{self.workload}/{self.condition}/N={self.n}"
        return base if self.batch_size is None else f"{base}/B={self.batch_size}"

    @property
    def batch(self) -> int:
        """Samples per iteration."""
        return self.samples if self.batch_size is None else min(self.batch_size, self.samples)

    def schedule(self) -> dict[int, list[tuple[int, float]]] | None:
        if self.step_worker is None:
            return None
        return {
            self.step_worker: [(int(self.step_at), self.speeds[self.step_worker] / STEP_FACTOR)]
        }


@dataclass
class MethodResult:
    """What one method measured on one case."""

    seconds_per_iteration: float = math.nan
    seconds_mean: float = math.nan
    iteration_time: np.ndarray = field(default_factory=lambda: np.zeros(0))
    iterations: int = 0
    remaps: int = 0
    n_columns: int = 0
    final_error: float = math.nan
    plan: str = ""
    skipped: str = ""
    wall: float = math.nan
    #: final (W, V), to check that every method trained the same batches (not written out)
    weights: tuple[np.ndarray, np.ndarray] | None = None
    #: relative max difference of the final weights to fit_serial's (same data, batches, lr); NaN: not checked
    weights_vs_serial: float = math.nan
    #: seconds per engine phase (PHASES), steady-state median, mean over workers; empty for ddp
    phases: dict[str, float] = field(default_factory=dict)


# ----------------------------------------------------------------- helpers
def gamma(seconds_parallel: float, series_seconds: Sequence[float]) -> float:
    """Parallel efficiency ``(1 / T_parallel) / sum_i (1 / T_series(i))`` (SPEC section 7)."""
    ts = np.asarray(series_seconds, dtype=float)
    if (
        not (np.isfinite(seconds_parallel) and seconds_parallel > 0)
        or ts.size == 0
        or not np.all(ts > 0)
    ):
        return math.nan
    return float((1.0 / seconds_parallel) / np.sum(1.0 / ts))


def steady_seconds(iteration_time: np.ndarray, start: int) -> float:
    """Median iteration time from iteration ``start`` on (NaNs ignored)."""
    t = np.asarray(iteration_time, dtype=float)[start:]
    t = t[np.isfinite(t)]
    return float(np.median(t)) if t.size else math.nan


def true_profile(condition: str, n: int) -> tuple[float, ...]:
    base = CONDITIONS[condition.split("-")[0]][:n]
    return tuple(ASSUMED_TO_TRUE.get(v, v) for v in base)


def workload_batch_sizes(
    workload: str, batch_sizes: Sequence[int] | None = None
) -> list[int | None]:
    """Batch sizes a workload runs at: ``minibatch`` at ``batch_sizes`` (default
    :data:`MINIBATCH_SIZES`), ``custom`` at ``batch_sizes`` when given, every
    other workload full batch (``[None]``: the paper's experiment)."""
    if workload == "minibatch":
        return list(batch_sizes) if batch_sizes else list(MINIBATCH_SIZES)
    if workload == "custom" and batch_sizes:
        return list(batch_sizes)
    return [None]


def make_cases(
    workloads: Sequence[str],
    conditions: Sequence[str],
    ns: Sequence[int],
    *,
    step_at: int,
    custom: tuple[int, int, int, int] | None = None,
    batch_sizes: Sequence[int] | None = None,
) -> list[BenchCase]:
    cases = []
    for wl in workloads:
        n_, m_, l_, s_ = custom if wl == "custom" and custom is not None else WORKLOADS[wl]
        for batch in workload_batch_sizes(wl, batch_sizes):
            for cond in conditions:
                base = cond.split("-")[0]
                for n in ns:
                    speeds = true_profile(cond, n)
                    assumed = CONDITIONS[base][:n]
                    step_worker = int(np.argmax(speeds)) if cond.endswith("-step") else None
                    cases.append(
                        BenchCase(
                            wl,
                            cond,
                            n,
                            (n_, m_, l_),
                            s_,
                            speeds,
                            assumed,
                            step_worker=step_worker,
                            step_at=step_at if step_worker is not None else None,
                            batch_size=batch,
                        )
                    )
    return cases


def _log(msg: str, quiet: bool = False) -> None:
    if not quiet:
        print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class _Progress:
    """Progress of a bench run with an estimate of the time left, one stderr line per finished step.

    A step is one method run of a case, or a case's ``T_series`` runs (and
    probe). Steps are weighted by the case's worker count N (a case's runs
    take about N times longer for N workers: N series runs, and iterations
    whose exchanges grow with N), so the estimate holds across a mix of N.
    """

    WIDTH = 24

    def __init__(self, cases: Sequence[BenchCase], methods: Sequence[str], quiet: bool) -> None:
        self.total = float(sum(c.n * (len(methods) + 1) for c in cases))
        self.steps = sum(len(methods) + 1 for _ in cases)
        self.done = 0.0
        self.count = 0
        self.quiet = quiet
        self.t0 = time.perf_counter()

    def step(self, case: BenchCase, what: str) -> str:
        """Record one finished step of ``case``; logs and returns the progress line."""
        self.done += case.n
        self.count += 1
        elapsed = time.perf_counter() - self.t0
        frac = self.done / self.total if self.total else 1.0
        left = elapsed / frac - elapsed if frac > 0 else math.nan
        bar = "#" * int(round(self.WIDTH * frac))
        line = (
            f"[{bar:<{self.WIDTH}}] {self.count}/{self.steps} steps ({frac:.0%}) after {what}: "
            f"{_minutes(elapsed)} elapsed, about {_minutes(left)} left"
        )
        _log(line, self.quiet)
        return line


def _minutes(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


def _pin_clock_offset(dask_worker: Any) -> bool:
    """Stamp task start/stop with the worker's own clock (offset 0).

    Dask shifts task times by ``scheduler_delay``, re-estimated at every
    heartbeat; on one host the true offset is 0 and the estimate only adds
    jumps of up to a few hundred ms to cross-task phases (docs/benchmarks.md,
    Engine, measurement notes). Every process here shares one clock.
    """
    cls = type(dask_worker)
    if getattr(cls, "_rpm_bench_clock", False):
        return True
    dask_worker.__dict__.pop("scheduler_delay", None)
    dask_worker.__class__ = type(
        cls.__name__,
        (cls,),
        {
            "scheduler_delay": property(lambda self: 0.0, lambda self, value: None),
            "_rpm_bench_clock": True,
        },
    )
    return True


def _loadavg() -> float:
    try:
        return float(os.getloadavg()[0])
    except OSError:  # pragma: no cover
        return math.nan


def bench_learning_rate(case: BenchCase) -> float:
    """``0.5 / (samples per iteration x hidden units)``: the same step at every batch size, and
    well-conditioned, so every method ends at the serial reference's weights to rounding (the
    bench checks that: ``weights_vs_serial``).

    Why the hidden units: a step of ``eps`` on the summed gradient moves each output's
    pre-activation by about ``eps B m / 16``. With ``eps = 0.5 / B`` (the rate before issue 11)
    that is ~30 at m = 1024: training overshoots and is chaotic, and at 203-1024-26, B = 1024 a
    1e-15 change of W0 grew to 2.3e-6 in 32 iterations (measured), so no check could tell a
    different summation order from different batches. At ``0.5 / (B m)`` it stays at 4e-15 while
    batches of 2048 instead of 1024 differ by 9e-3. Timing does not depend on the rate.
    """
    return 0.5 / (case.batch * case.shape[1])


def weights_difference(
    weights: tuple[np.ndarray, np.ndarray] | None, reference: tuple[np.ndarray, np.ndarray] | None
) -> float:
    """``max |W - W_ref|, |V - V_ref|`` over ``max |W_ref|, |V_ref|`` (NaN when either is missing)."""
    if weights is None or reference is None:
        return math.nan
    diff = max(
        float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) for a, b in zip(weights, reference)
    )
    size = max(float(np.max(np.abs(b))) for b in reference)
    return diff / size if size > 0 else diff


def _serial_reference(
    case: BenchCase, x: np.ndarray, d: np.ndarray, iterations: int, cache: dict[Any, Any]
) -> tuple[np.ndarray, np.ndarray]:
    """``fit_serial`` on the case's data, batches and learning rate (computed once per workload and batch
    size: condition and N do not change what is trained)."""
    from .serial import fit_serial

    key = (case.shape, case.samples, case.batch_size, iterations)
    if key not in cache:
        W, V, _ = fit_serial(
            x,
            d,
            hidden=case.shape[1],
            iterations=iterations,
            learning_rate=bench_learning_rate(case),
            seed=0,
            batch_size=case.batch_size,
        )
        cache[key] = (W, V)
    return cache[key]


def _single_plan(shape: tuple[int, int, int], samples: int, address: str) -> Any:
    from .partition import Plan

    return Plan.from_columns(
        [[0]], [samples], [[shape[1]]], abilities=[1.0], shape=shape, method="series"
    ).with_workers([address])


# ------------------------------------------------------------------ the run
def _phase_profile(history: Any, start: int) -> dict[str, float]:
    """Seconds per engine phase over the steady state: per worker the median over iterations
    from ``start`` on, then the mean over the workers that had a rectangle (where time goes)."""
    from .records import PHASES

    out = {}
    for p in PHASES:
        if p not in history:
            continue
        v = np.asarray(history[p].values, dtype=float)
        v = v[min(start, max(v.shape[0] - 1, 0)) :]
        with np.errstate(all="ignore"):
            per_worker = [float(np.median(c[np.isfinite(c)])) for c in v.T if np.isfinite(c).any()]
        out[p] = float(np.mean(per_worker)) if per_worker else math.nan
    return out


def _fit_record(
    client: Any,
    x: np.ndarray,
    d: np.ndarray,
    *,
    m: int,
    iterations: int,
    lr: float,
    mapping: Any,
    abilities: Any,
    interval: int,
    start: int,
    batch_size: int | None = None,
) -> MethodResult:
    from .engine import fit

    t0 = time.perf_counter()
    res = fit(
        x,
        d,
        hidden=m,
        iterations=iterations,
        learning_rate=lr,
        mapping=mapping,
        abilities=abilities,
        client=client,
        seed=0,
        interval=interval,
        batch_size=batch_size,
    )
    wall = time.perf_counter() - t0
    it = np.asarray(res.history["iteration_time"].values, dtype=float)
    first = min(start, max(it.size - 1, 0))
    return MethodResult(
        seconds_per_iteration=steady_seconds(it, first),
        seconds_mean=float(np.nanmean(it)) if it.size else math.nan,
        iteration_time=it,
        iterations=int(it.size),
        remaps=len(res.remaps),
        n_columns=res.plan.n_columns,
        final_error=res.error,
        plan=res.plan.to_json(),
        wall=wall,
        weights=(np.asarray(res.W), np.asarray(res.V)),
        phases=_phase_profile(res.history, first),
    )


def _series(
    client: Any,
    case: BenchCase,
    addresses: list[str],
    x: np.ndarray,
    d: np.ndarray,
    *,
    iterations: int,
    lr: float,
    quiet: bool,
) -> np.ndarray:
    from .emulation import set_speed

    out = np.full(case.n, np.nan)
    for i, addr in enumerate(addresses):
        stepped = case.step_worker == i
        if stepped:
            set_speed(client, i, case.speeds[i] / STEP_FACTOR)
        try:
            r = _fit_record(
                client,
                x,
                d,
                m=case.shape[1],
                iterations=iterations,
                lr=lr,
                mapping=_single_plan(case.shape, case.samples, addr),
                abilities=None,
                interval=iterations,
                start=0,
                batch_size=case.batch_size,
            )
        finally:
            if stepped:
                set_speed(client, i, None)
        out[i] = r.seconds_per_iteration
        _log(
            f"  T_series({i}) speed {case.speeds[i] / (STEP_FACTOR if stepped else 1):.3g}: "
            f"{out[i]:.3f} s/iteration",
            quiet,
        )
    return out


def _run_case(
    case: BenchCase,
    methods: Sequence[str],
    *,
    iterations: int,
    series_iterations: int,
    interval: int,
    dp_search: str,
    quiet: bool,
    references: dict[Any, Any] | None = None,
    progress: _Progress | None = None,
) -> dict[str, Any]:
    from distributed import Client

    from .emulation import emulation_report, local_cluster, worker_addresses
    from .planners import divisors, fastest_grid, make_plan
    from .train import demo_data

    n_, m, l_ = case.shape
    x, d = demo_data(case.samples, case.shape, seed=0)
    lr = bench_learning_rate(case)
    start = iterations // 2
    if case.step_at is not None:
        start = max(start, case.step_at + 1)
    # the serial reference every method's final weights are compared with (before the cluster
    # starts, so it takes no CPU from the timed runs); None: not checked
    reference = (
        None if references is None else _serial_reference(case, x, d, iterations, references)
    )
    load0 = _loadavg()
    out: dict[str, Any] = {"case": case, "methods": {}, "load_start": load0}
    with (
        local_cluster(
            case.speeds, schedule=case.schedule(), dashboard_address=None, silence_logs=50
        ) as cluster,
        Client(cluster) as client,
    ):
        client.run(_pin_clock_offset)
        addresses = worker_addresses(client)
        out["label"] = cluster.emulation_label
        out["scale"] = float(cluster.scale_factor)
        _log(f"{case.name}: {cluster.emulation_label}", quiet)
        series = _series(
            client, case, addresses, x, d, iterations=series_iterations, lr=lr, quiet=quiet
        )
        out["series"] = series
        # work units per second: hidden units x samples of one iteration (a mini-batch's, not the set's)
        rates = (m * case.batch) / series
        probed = None
        lat = bw = math.nan
        if {"srpm-probed", "split-1d"} & set(methods):
            from .probe import probe

            pr = probe(client, shape=case.shape, samples=case.batch, workers=addresses)
            probed = [float(v) for v in pr["throughput"].values]
            lat, bw = (
                float(pr.attrs.get("latency", math.nan)),
                float(pr.attrs.get("bandwidth", math.nan)),
            )
            _log(
                f"  probed abilities {', '.join(f'{v / max(probed):.2f}' for v in probed)}; "
                f"link latency {lat * 1e3:.2f} ms, bandwidth {bw / 1e6:.0f} MB/s",
                quiet,
            )
        out["probed"] = probed
        out["latency"], out["bandwidth"] = lat, bw
        if progress is not None:
            progress.step(case, f"{case.name} T_series")
        common = dict(
            m=m,
            iterations=iterations,
            lr=lr,
            interval=interval,
            start=start,
            batch_size=case.batch_size,
        )
        for method in methods:
            t0 = time.perf_counter()
            if method == "ddp":
                r = _run_ddp_method(
                    case,
                    x,
                    d,
                    iterations=iterations,
                    lr=lr,
                    scale=out["scale"],
                    start=start,
                    rate=float(cluster.rates["float64"]),
                )
            elif method in ("uniform", "hrev"):
                planner = "uniform" if method == "uniform" else "grid-hrev"
                ab = [1.0] * case.n if method == "uniform" else list(case.assumed)
                if dp_search == "measured":
                    r = MethodResult()
                    for dp in divisors(case.n):
                        try:
                            plan = make_plan(ab, case.shape, case.samples, method=planner, dp=dp)
                        except Exception:  # noqa: BLE001 - an infeasible N_DP is skipped
                            continue
                        cand = _fit_record(
                            client,
                            x,
                            d,
                            mapping=plan.with_workers(addresses),
                            abilities=None,
                            **common,
                        )
                        if not (cand.seconds_per_iteration >= r.seconds_per_iteration):
                            r = cand
                else:  # N_DP by the cost model with the measured T_series speeds
                    # (the model prices one iteration: a mini-batch's rows, not the training set's)
                    plan, _ = fastest_grid(ab, case.shape, case.batch, planner, list(rates))
                    if case.batch != case.samples:
                        plan = make_plan(
                            ab, case.shape, case.samples, method=planner, dp=plan.n_columns
                        )
                    r = _fit_record(
                        client, x, d, mapping=plan.with_workers(addresses), abilities=None, **common
                    )
            elif method == "srpm-assumed":
                r = _fit_record(
                    client, x, d, mapping="srpm", abilities=list(case.assumed), **common
                )
            elif method == "srpm-probed":
                r = _fit_record(client, x, d, mapping="srpm", abilities=probed, **common)
            elif method == "drpm-init":
                r = _fit_record(
                    client, x, d, mapping="drpm", abilities=list(case.assumed), **common
                )
            elif method == "drpm":
                r = _fit_record(client, x, d, mapping="drpm", abilities=None, **common)
            elif method == "split-1d":
                r = _fit_record(client, x, d, mapping="split-1d", abilities=probed, **common)
            else:  # pragma: no cover - validated before
                raise BenchError(f"unknown method {method!r}")
            if not math.isfinite(r.wall):
                r.wall = time.perf_counter() - t0
            r.weights_vs_serial = weights_difference(r.weights, reference)
            r.weights = None  # checked; do not keep (W, V) of every method of every case
            out["methods"][method] = r
            if r.skipped:
                _log(f"  {method}: skipped ({r.skipped})", quiet)
            else:
                _log(
                    f"  {method}: {r.seconds_per_iteration:.3f} s/iteration "
                    f"(gamma {gamma(r.seconds_per_iteration, series):.3f}, {r.n_columns} column(s), "
                    f"{r.remaps} remap(s), weights vs fit_serial {r.weights_vs_serial:.1e}, {r.wall:.1f} s)",
                    quiet,
                )
            if progress is not None:
                progress.step(case, f"{case.name} {method}")
        rows = emulation_report(client)
        blocks = sum(r["blocks"] for r in rows)
        out["overrun_fraction"] = (
            (sum(r["overruns"] for r in rows) / blocks) if blocks else math.nan
        )
    out["load_end"] = _loadavg()
    return out


# ---------------------------------------------------------------- DDP peer
def torch_available() -> tuple[bool, str]:
    """Whether the DDP peer can run; the reason when it cannot."""
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        return False, "torch is not installed (pip install '.[bench]' adds torch==2.13.0)"
    if not dist.is_available() or not dist.is_gloo_available():
        return False, f"torch {torch.__version__} has no gloo backend for torch.distributed"
    return True, ""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ddp_rank(rank: int, cfg: dict[str, Any], queue: Any) -> None:
    """One DDP rank: gloo on loopback, CPU, one thread, paced to its EMULATED speed."""
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = "1"
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    from .batches import Schedule
    from .kernels import block_work

    torch.set_num_threads(1)
    world = cfg["world"]
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{cfg['port']}", rank=rank, world_size=world
    )
    try:
        x_all = np.load(cfg["x"], mmap_mode="r")
        d_all = np.load(cfg["d"], mmap_mode="r")
        samples = int(x_all.shape[0])
        bounds = np.linspace(0, samples, world + 1).round().astype(int)  # equal shares
        cut = (int(bounds[rank]), int(bounds[rank + 1]))
        # The mini-batches of dask_rpm's schedule (same seed, same order): this rank takes the
        # share of every batch that a column with samples ``cut`` takes (DistributedSampler-like,
        # equal shares), so the ranks' gradients sum to the batch gradient. Full batch: ``cut``.
        sched = Schedule(
            samples, cfg.get("batch_size"), bool(cfg.get("shuffle", True)), int(cfg.get("seed", 0))
        )
        epoch_rows: dict[str, Any] = {"epoch": None}

        def rows_of(it: int) -> tuple[Any, Any]:
            # one gather per epoch (as ColumnData does); each iteration is then a view
            e = sched.epoch(it)
            if epoch_rows["epoch"] != e:
                idx, offsets = sched.epoch_plan(e, cut)
                epoch_rows.update(
                    epoch=e,
                    offsets=offsets,
                    first=e * sched.per_epoch,
                    x=torch.from_numpy(np.ascontiguousarray(x_all[idx])),
                    d=torch.from_numpy(np.ascontiguousarray(d_all[idx])),
                )
            j = it - epoch_rows["first"]
            lo, hi = epoch_rows["offsets"][j], epoch_rows["offsets"][j + 1]
            return epoch_rows["x"][lo:hi], epoch_rows["d"][lo:hi]

        W0 = torch.from_numpy(np.load(cfg["W0"]))
        V0 = torch.from_numpy(np.load(cfg["V0"]))

        class MLP(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.W = torch.nn.Parameter(W0.clone())
                self.V = torch.nn.Parameter(V0.clone())

            def forward(self, inp: Any) -> Any:
                return torch.sigmoid(torch.sigmoid(inp @ self.W.T) @ self.V.T)

        model = DDP(MLP())
        speed, scale = float(cfg["speeds"][rank]), float(cfg["scale"])
        step = cfg.get("step")  # (rank, iteration, factor)
        clock = {"cpu": 0.0, "wall": 0.0, "speed": speed}
        # The same work model and kernel rate as the Dask workers' pace():
        # forward + backward of this iteration's rows of this rank x all hidden units.
        n_in, m_h, l_out = W0.shape[1], W0.shape[0], V0.shape[0]
        rate = float(cfg["rate"])

        def paced_allreduce(state, bucket):  # no annotations: DDP checks them against GradBucket
            # Pad this rank's compute so far (forward + backward up to this
            # bucket) to max(cpu, work / rate) / (speed * scale) before its
            # gradients go out, as pace() does for a Dask worker's block.
            cpu = time.thread_time() - clock["cpu"]
            target = max(cpu, clock["work"] / rate) / (clock["speed"] * scale)
            late = target - (time.perf_counter() - clock["wall"])
            if late > 0:
                time.sleep(late)
            return default_hooks.allreduce_hook(dist.group.WORLD, bucket)

        model.register_comm_hook(None, paced_allreduce)
        opt = torch.optim.SGD(model.parameters(), lr=cfg["lr"])
        times, errors = [], []
        dist.barrier()
        last = time.perf_counter()
        for it in range(cfg["iterations"]):
            if step is not None and rank == step[0] and it >= step[1]:
                clock["speed"] = speed / step[2]
            x, d = rows_of(it)
            rows = int(x.shape[0])
            clock["work"] = block_work("forward", rows, m_h, n_in, l_out) + block_work(
                "backward", rows, m_h, n_in, l_out
            )
            clock["cpu"], clock["wall"] = time.thread_time(), time.perf_counter()
            opt.zero_grad(set_to_none=True)
            h = model(x)
            # DDP averages gradients over ranks; x world makes it the batch sum (SPEC section 1).
            loss = 0.5 * ((h - d) ** 2).sum()
            (loss * world).backward()
            opt.step()
            now = time.perf_counter()
            times.append(now - last)
            last = now
            errors.append(float(loss.detach()))
        if rank == 0:
            # the final weights too: the bench checks that the peer trained the same batches
            net = model.module
            queue.put(
                {
                    "times": times,
                    "error": errors[-1],
                    "W": net.W.detach().numpy().copy(),
                    "V": net.V.detach().numpy().copy(),
                }
            )
    finally:
        dist.destroy_process_group()


def run_ddp(
    x: np.ndarray,
    d: np.ndarray,
    *,
    hidden: int,
    speeds: Sequence[float],
    scale: float,
    iterations: int,
    learning_rate: float,
    step: tuple[int, int, float] | None = None,
    seed: int = 0,
    timeout: float = 1800.0,
    rate: float | None = None,
    batch_size: int | None = None,
    shuffle: bool | None = None,
) -> dict[str, Any]:
    """Train the same MLP with plain DDP, one process per EMULATED speed; rank 0's iteration times.

    ``batch_size`` / ``shuffle`` (defaults ``rpm.train.*``): the mini-batches of
    :mod:`dask_rpm.batches` with the same ``seed`` as :func:`dask_rpm.fit`,
    so DDP trains on exactly the batches dask_rpm does; every rank takes an
    equal share of each batch and DDP all-reduces the gradients every step.
    Returns ``{"times", "error", "W", "V"}``: rank 0's iteration times and
    last local loss, and the final weights.

    Each rank's forward + backward is paced like a Dask worker's kernel block
    (:func:`dask_rpm.emulation.pace`): to ``max(cpu, work / rate) / (speed *
    scale)`` with the flop model :func:`dask_rpm.kernels.block_work`, so both
    systems run at the same EMULATED speeds whatever their kernels cost.
    ``rate`` (flop equivalents per second at speed 1, scale 1) defaults to this
    process's calibrated rate x ``rpm.emulation.rate-fraction``, the rate
    :func:`dask_rpm.local_cluster` gives its workers.
    """
    import multiprocessing as mp

    from .kernels import init_weights

    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="rpm-ddp-") as tmp:
        W0, V0 = init_weights(x.shape[1], hidden, d.shape[1], seed=seed)
        paths = {k: os.path.join(tmp, f"{k}.npy") for k in ("x", "d", "W0", "V0")}
        for k, v in (("x", x), ("d", d), ("W0", W0), ("V0", V0)):
            np.save(paths[k], np.ascontiguousarray(v, dtype="float64"))
        if rate is None:
            from . import config
            from .emulation import process_rate

            rate = float(config.get("emulation.rate-fraction")) * process_rate("float64")
        from .batches import schedule

        sched = schedule(
            x.shape[0], batch_size, shuffle=shuffle, seed=seed
        )  # validated, config defaults
        cfg = {
            **paths,
            "world": len(speeds),
            "port": _free_port(),
            "speeds": list(speeds),
            "scale": scale,
            "lr": learning_rate,
            "iterations": iterations,
            "step": step,
            "rate": float(rate),
            "batch_size": sched.batch_size,
            "shuffle": sched.shuffle,
            "seed": sched.seed,
        }
        queue = ctx.Queue()
        procs = [
            ctx.Process(target=_ddp_rank, args=(r, cfg, queue), daemon=True)
            for r in range(len(speeds))
        ]
        for p in procs:
            p.start()
        import queue as queue_mod

        deadline = time.monotonic() + timeout
        try:
            while True:
                try:
                    result = queue.get(timeout=1.0)
                    break
                except queue_mod.Empty:
                    codes = [p.exitcode for p in procs]
                    if any(c not in (None, 0) for c in codes) or time.monotonic() > deadline:
                        raise RuntimeError(
                            f"the DDP peer produced no result (rank exit codes {codes}; see their stderr)"
                        ) from None
        finally:
            for p in procs:
                p.join(timeout=30)
                if p.is_alive():
                    p.terminate()
    return result


def _run_ddp_method(
    case: BenchCase,
    x: np.ndarray,
    d: np.ndarray,
    *,
    iterations: int,
    lr: float,
    scale: float,
    start: int,
    rate: float | None = None,
) -> MethodResult:
    ok, why = torch_available()
    if not ok:
        return MethodResult(skipped=why)
    step = None
    if case.step_worker is not None:
        step = (case.step_worker, int(case.step_at), STEP_FACTOR)
    t0 = time.perf_counter()
    res = run_ddp(
        x,
        d,
        hidden=case.shape[1],
        speeds=case.speeds,
        scale=scale,
        iterations=iterations,
        learning_rate=lr,
        step=step,
        rate=rate,
        batch_size=case.batch_size,
    )
    it = np.asarray(res["times"], dtype=float)
    return MethodResult(
        seconds_per_iteration=steady_seconds(it, min(start, it.size - 1)),
        seconds_mean=float(np.mean(it)),
        iteration_time=it,
        iterations=int(it.size),
        n_columns=case.n,
        final_error=float(res["error"]),
        plan=json.dumps(
            {
                "method": "ddp",
                "samples_per_rank": "equal",
                "ranks": case.n,
                "batch_size": case.batch_size,
            }
        ),
        wall=time.perf_counter() - t0,
        weights=(np.asarray(res["W"]), np.asarray(res["V"])),
    )


# ------------------------------------------------------------ the dataset
def run_bench(
    *,
    workloads: Sequence[str] = ("paper", "compute"),
    conditions: Sequence[str] = ("A", "B"),
    ns: Sequence[int] = (4, 5, 6, 7, 8),
    methods: Sequence[str] = METHODS,
    iterations: int = 40,
    series_iterations: int = 2,
    interval: int | None = None,
    step_at: int | None = None,
    dp_search: str = "model",
    custom: tuple[int, int, int, int] | None = None,
    quiet: bool = False,
    batch_sizes: Sequence[int] | None = None,
    check_weights: bool = True,
) -> Any:
    """Run the benchmark; returns an ``xarray.Dataset`` (see :func:`write_outputs`).

    Parameters
    ----------
    workloads
        Names in :data:`WORKLOADS`, or ``"custom"`` with ``custom=(n, m, l, s)``.
    conditions
        ``"A"``, ``"B"``, ``"A-step"``, ``"B-step"`` (SPEC section 7; ``-step``:
        the fastest worker slows 3x from iteration ``step_at``).
    ns
        Worker counts, 1..8 (the first N values of the profile).
    methods
        A subset of :data:`METHODS`, run in this order on every case.
    iterations
        BP iterations per method run; the steady-state time is the median over
        the second half.
    series_iterations
        Iterations of each ``T_series`` run.
    interval
        Iterations per submitted block and between DRPM checks (R); default
        ``max(2, iterations // 4)``.
    step_at
        Iteration of the load step; default ``iterations // 4`` (at least
        ``series_iterations + 1``, so series runs stay before it).
    dp_search
        ``"model"`` or ``"measured"`` (see the module docstring).
    batch_sizes
        Mini-batch sizes of the ``minibatch`` workload (default
        :data:`MINIBATCH_SIZES`) and of ``custom`` (default: full batch); the
        other workloads are full batch. One case per batch size, condition and
        N; every method (the DDP peer too) trains on the same mini-batches.
    check_weights
        Compare every method's final weights with :func:`dask_rpm.fit_serial`
        on the same data, batches and learning rate (``weights_vs_serial``;
        the reference is computed once per workload and batch size, before the
        cluster starts).
    """
    import xarray as xr

    workloads, conditions, ns, methods = list(workloads), list(conditions), list(ns), list(methods)
    _validate(
        workloads,
        conditions,
        ns,
        methods,
        iterations,
        series_iterations,
        interval,
        dp_search,
        custom,
    )
    batch_sizes = _validate_batch_sizes(workloads, batch_sizes, custom)
    interval = int(interval) if interval is not None else max(2, iterations // 4)
    step_at = int(step_at) if step_at is not None else max(series_iterations + 1, iterations // 4)
    if any(c.endswith("-step") for c in conditions) and not (
        series_iterations < step_at < iterations // 2 + 1
    ):
        raise BenchError(
            f"step_at={step_at} must lie after the series runs ({series_iterations} iterations) and in the "
            f"first half of the run ({iterations} iterations); give more iterations or another step_at"
        )
    cases = make_cases(
        workloads, conditions, ns, step_at=step_at, custom=custom, batch_sizes=batch_sizes
    )
    started = time.perf_counter()
    results = []
    references: dict[Any, Any] | None = {} if check_weights else None
    import dask

    progress = _Progress(cases, methods, quiet)
    with dask.config.set({"rpm.train.progress": "none"}):
        for case in cases:
            results.append(
                _run_case(
                    case,
                    methods,
                    iterations=iterations,
                    series_iterations=series_iterations,
                    interval=interval,
                    dp_search=dp_search,
                    quiet=quiet,
                    references=references,
                    progress=progress,
                )
            )
    wall = time.perf_counter() - started

    C, M, W = len(cases), len(methods), max(ns)

    def full(*shape: int, fill: Any = np.nan, dtype: Any = float) -> np.ndarray:
        return np.full(shape, fill, dtype=dtype)

    spi, mean, gam, ratio = full(C, M), full(C, M), full(C, M), full(C, M)
    its, remaps, cols = (
        full(C, M, fill=0, dtype=int),
        full(C, M, fill=0, dtype=int),
        full(C, M, fill=0, dtype=int),
    )
    err = full(C, M)
    plan = full(C, M, fill="", dtype=object)
    skipped = full(C, M, fill="", dtype=object)
    itime = full(C, M, iterations)
    series, speeds, assumed, probed = full(C, W), full(C, W), full(C, W), full(C, W)
    scale, overrun, lat, bw, load0, load1 = (full(C) for _ in range(6))
    labels = []
    for c, res in enumerate(results):
        case = res["case"]
        series[c, : case.n] = res["series"]
        speeds[c, : case.n] = case.speeds
        assumed[c, : case.n] = case.assumed
        if res["probed"] is not None:
            p = np.asarray(res["probed"], dtype=float)
            probed[c, : case.n] = p / p.max()
        scale[c], overrun[c], lat[c], bw[c] = (
            res["scale"],
            res["overrun_fraction"],
            res["latency"],
            res["bandwidth"],
        )
        load0[c], load1[c] = res["load_start"], res["load_end"]
        labels.append(res["label"])
        for k, method in enumerate(methods):
            r: MethodResult = res["methods"][method]
            spi[c, k], mean[c, k] = r.seconds_per_iteration, r.seconds_mean
            gam[c, k] = gamma(r.seconds_per_iteration, res["series"])
            its[c, k], remaps[c, k], cols[c, k], err[c, k] = (
                r.iterations,
                r.remaps,
                r.n_columns,
                r.final_error,
            )
            plan[c, k], skipped[c, k] = r.plan, r.skipped
            n_it = min(iterations, r.iteration_time.size)
            itime[c, k, :n_it] = r.iteration_time[:n_it]
        if "drpm" in methods:
            ratio[c] = spi[c] / spi[c, methods.index("drpm")]
    ds = xr.Dataset(
        {
            "seconds_per_iteration": (
                ("case", "method"),
                spi,
                {
                    "units": "s",
                    "description": "median iteration time over the second half of the run (steady state)",
                },
            ),
            "seconds_per_iteration_mean": (
                ("case", "method"),
                mean,
                {
                    "units": "s",
                    "description": "mean iteration time over the whole run (DRPM's learning included)",
                },
            ),
            "gamma": (
                ("case", "method"),
                gam,
                {
                    "units": "1",
                    "description": "parallel efficiency (1/T_parallel) / sum_i 1/T_series(i)",
                },
            ),
            "ratio_to_drpm": (
                ("case", "method"),
                ratio,
                {
                    "units": "1",
                    "description": "seconds_per_iteration / DRPM's (above 1: slower than DRPM)",
                },
            ),
            "iterations": (("case", "method"), its, {"units": "1"}),
            "remaps": (("case", "method"), remaps, {"units": "1"}),
            "n_columns": (
                ("case", "method"),
                cols,
                {"units": "1", "description": "columns of the final plan"},
            ),
            "final_error": (("case", "method"), err, {"units": "1"}),
            "plan": (("case", "method"), plan, {"description": "final plan as JSON"}),
            "skipped": (
                ("case", "method"),
                skipped,
                {"description": "why the method did not run, else empty"},
            ),
            "iteration_time": (("case", "method", "iteration"), itime, {"units": "s"}),
            "series_seconds": (
                ("case", "worker"),
                series,
                {
                    "units": "s",
                    "description": "T_series(i): the same job on worker i alone, s/iteration",
                },
            ),
            "speed": (
                ("case", "worker"),
                speeds,
                {"units": "1", "description": "EMULATED true relative speed"},
            ),
            "ability_assumed": (
                ("case", "worker"),
                assumed,
                {"units": "1", "description": "the paper's assumed ability profile"},
            ),
            "ability_probed": (
                ("case", "worker"),
                probed,
                {"units": "1", "description": "probed, max 1"},
            ),
            "scale": (
                ("case",),
                scale,
                {"units": "core", "description": "EMULATED: what speed 1.0 stands for"},
            ),
            "overrun_fraction": (
                ("case",),
                overrun,
                {
                    "units": "1",
                    "description": "paced blocks that overran their target (contention)",
                },
            ),
            "latency": (
                ("case",),
                lat,
                {"units": "s", "description": "probed worker-to-worker latency"},
            ),
            "bandwidth": (("case",), bw, {"units": "bytes/s", "description": "probed bandwidth"}),
            "load_start": (
                ("case",),
                load0,
                {"units": "1", "description": "1-minute load average"},
            ),
            "load_end": (("case",), load1, {"units": "1"}),
            "emulation_label": (("case",), np.asarray(labels, dtype=object)),
        },
        coords={
            "case": [c.name for c in cases],
            "workload": ("case", [c.workload for c in cases]),
            "condition": ("case", [c.condition for c in cases]),
            "N": ("case", [c.n for c in cases]),
            "shape": ("case", ["-".join(map(str, c.shape)) for c in cases]),
            "samples": ("case", [c.samples for c in cases]),
            "step_worker": (
                "case",
                [-1 if c.step_worker is None else c.step_worker for c in cases],
            ),
            "step_at": ("case", [-1 if c.step_at is None else c.step_at for c in cases]),
            "method": methods,
            "worker": np.arange(W),
            "iteration": np.arange(iterations),
        },
        attrs={
            "title": "dask-rpm bench: EMULATED heterogeneity on one machine (not hardware figures)",
            "emulation": "EMULATED heterogeneity on one machine: workers share the cores; slow workers sleep "
            "in proportion to their CPU time (docs/emulation.md)",
            "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_implementation()} "
            f"{platform.python_version()}",
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "cores": int(os.cpu_count() or 0),
            "iterations": iterations,
            "series_iterations": series_iterations,
            "interval": interval,
            "dp_search": dp_search,
            "wall_seconds": wall,
            "truth": "EMULATED speeds = the paper's assumed profile with 0.63 -> 0.5 (the paper measured ~0.5 where it assumed 0.63)",
        },
    )
    _add_batch_fields(ds, cases, results, methods)
    return ds


def _add_batch_fields(
    ds: Any, cases: list[BenchCase], results: list[dict[str, Any]], methods: list[str]
) -> None:
    """Mini-batch size per case, the weight check against ``fit_serial`` and the phase profile."""
    from .records import PHASES

    ds.coords["batch_size"] = (
        "case",
        np.array([c.batch for c in cases], dtype=int),
        {
            "units": "samples",
            "description": "samples per iteration: the mini-batch size (= samples for full-batch training)",
        },
    )
    ds.coords["full_batch"] = ("case", np.array([c.batch_size is None for c in cases], dtype=bool))
    check = np.full((len(cases), len(methods)), np.nan)
    phases = np.full((len(cases), len(methods), len(PHASES)), np.nan)
    for c, res in enumerate(results):
        for k, method in enumerate(methods):
            r: MethodResult = res["methods"][method]
            check[c, k] = r.weights_vs_serial
            for j, p in enumerate(PHASES):
                phases[c, k, j] = r.phases.get(p, np.nan)
    ds["weights_vs_serial"] = (
        ("case", "method"),
        check,
        {
            "units": "1",
            "description": "max |final weights - fit_serial's| / max |fit_serial's| (same data, "
            "mini-batches, learning rate): every method trained the same batches; "
            "NaN: not checked",
        },
    )
    ds.coords["phase"] = list(PHASES)
    ds["phase_seconds"] = (
        ("case", "method", "phase"),
        phases,
        {
            "units": "s",
            "description": "steady-state seconds per engine phase (median over the second half, mean "
            "over workers; forward/backward paced compute, *_wait/horizontal exchanges "
            "incl. waiting); NaN for the DDP peer",
        },
    )


def _validate_batch_sizes(
    workloads: list[str],
    batch_sizes: Sequence[int] | None,
    custom: tuple[int, int, int, int] | None,
) -> list[int] | None:
    """Check ``batch_sizes`` (whole numbers from 1 to the workload's samples); a list, or None."""
    if batch_sizes is None:
        return None
    sizes = list(batch_sizes)
    takers = [wl for wl in workloads if wl in ("minibatch", "custom")]
    if not sizes:
        raise BenchError(
            "batch_sizes is empty: give at least one mini-batch size, e.g. 256,1024,4096"
        )
    if not takers:
        raise BenchError(
            f"batch sizes {sizes} apply to the minibatch and custom workloads, and the run has "
            f"{', '.join(workloads)} (full batch: the paper's experiment); add --workloads minibatch"
        )
    for b in sizes:
        if isinstance(b, bool) or not isinstance(b, (int, np.integer)) or b < 1:
            raise BenchError(
                f"batch size {b!r}: give whole numbers of samples per mini-batch, e.g. 256,1024,4096"
            )
        for wl in takers:
            if wl == "custom" and custom is None:
                continue  # reported by _validate
            s_ = custom[3] if wl == "custom" else WORKLOADS[wl][3]
            if b > s_:
                raise BenchError(
                    f"batch size {b} is larger than the {wl} workload's {s_} samples; give at most "
                    f"{s_} (a batch of all samples is full-batch training)"
                )
    if len(set(sizes)) != len(sizes):
        raise BenchError(f"batch sizes {sizes} repeat a value; give each once")
    return [int(b) for b in sizes]


def _validate(
    workloads: list[str],
    conditions: list[str],
    ns: list[int],
    methods: list[str],
    iterations: int,
    series_iterations: int,
    interval: int | None,
    dp_search: str,
    custom: tuple[int, int, int, int] | None,
) -> None:
    valid_wl = [*WORKLOADS, "custom"]
    for wl in workloads:
        if wl not in valid_wl:
            raise BenchError(f"workload {wl!r} is not one of {', '.join(valid_wl)}")
        if wl == "custom" and custom is None:
            raise BenchError(
                "workload 'custom' needs a shape and samples (--shape N-M-L --samples S)"
            )
    valid_cond = [*CONDITIONS, *(f"{c}-step" for c in CONDITIONS)]
    for c in conditions:
        if c not in valid_cond:
            raise BenchError(f"condition {c!r} is not one of {', '.join(valid_cond)}")
    for n in ns:
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 1 <= n <= MAX_N:
            raise BenchError(
                f"N={n!r}: worker counts must be whole numbers from 1 to {MAX_N} "
                f"(the paper's ability profiles A and B have {MAX_N} values)"
            )
    for m in methods:
        if m not in METHODS:
            raise BenchError(f"method {m!r} is not one of {', '.join(METHODS)}")
    if len(set(methods)) != len(methods):
        raise BenchError(f"methods {methods} repeat a name; give each once")
    if not methods or not workloads or not conditions or not ns:
        raise BenchError("give at least one workload, condition, N and method")
    if iterations < 2:
        raise BenchError(
            f"iterations={iterations}: need at least 2 (the steady state is the second half)"
        )
    if series_iterations < 1:
        raise BenchError(f"series_iterations={series_iterations}: need at least 1")
    if interval is not None and interval < 1:
        raise BenchError(f"interval={interval}: must be a positive number of iterations")
    if dp_search not in ("model", "measured"):
        raise BenchError(f"dp_search={dp_search!r} is not one of model, measured")


# ---------------------------------------------------------------- outputs
def summary_rows(ds: Any) -> list[dict[str, Any]]:
    """One row per (case, method) that ran: the ``--json`` list."""

    def num(v: Any) -> float | None:
        v = float(v)
        return v if math.isfinite(v) else None

    rows = []
    for c in range(ds.sizes["case"]):
        for k, method in enumerate(ds["method"].values.tolist()):
            if str(ds["skipped"].values[c, k]):
                continue
            rows.append(
                {
                    "method": method,
                    "condition": str(ds["condition"].values[c]),
                    "N": int(ds["N"].values[c]),
                    "gamma": num(ds["gamma"].values[c, k]),
                    "seconds_per_iteration": num(ds["seconds_per_iteration"].values[c, k]),
                    "workload": str(ds["workload"].values[c]),
                    "ratio_to_drpm": num(ds["ratio_to_drpm"].values[c, k]),
                    "batch_size": _batch_of(ds, c),
                }
            )
    return rows


def _batch_of(ds: Any, c: int) -> int | None:
    """Mini-batch size of case ``c``; None for full batch (and for results written before issue 11)."""
    if "full_batch" not in ds.coords or bool(ds["full_batch"].values[c]):
        return None
    return int(ds["batch_size"].values[c])


def markdown_table(ds: Any) -> str:
    """The summary as a markdown table headed by the EMULATED label."""
    lines = [
        "**EMULATED heterogeneity on one machine** (not hardware figures): "
        f"{ds.attrs.get('machine', '')}, {ds.attrs.get('date', '')}, {ds.attrs.get('iterations')} iterations "
        f"per method (steady state: median of the second half), T_series over "
        f"{ds.attrs.get('series_iterations')} iteration(s), R = {ds.attrs.get('interval')}.",
        "",
        "| workload | condition | N | method | s/iteration | gamma | vs DRPM | columns | remaps |",
        "| --- | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    notes = []
    for c in range(ds.sizes["case"]):
        wl, cond, n = _workload_label(ds, c), str(ds["condition"].values[c]), int(ds["N"].values[c])
        for k, method in enumerate(ds["method"].values.tolist()):
            why = str(ds["skipped"].values[c, k])
            if why:
                lines.append(f"| {wl} | {cond} | {n} | {method} | skipped | | | | |")
                notes.append(f"{method} skipped: {why}")
                continue
            r = float(ds["ratio_to_drpm"].values[c, k])
            lines.append(
                f"| {wl} | {cond} | {n} | {method} | {float(ds['seconds_per_iteration'].values[c, k]):.3f} | "
                f"{float(ds['gamma'].values[c, k]):.3f} | {'' if not math.isfinite(r) else f'{r:.2f}x'} | "
                f"{int(ds['n_columns'].values[c, k])} | {int(ds['remaps'].values[c, k])} |"
            )
    lines.append("")
    for c in range(ds.sizes["case"]):
        n = int(ds["N"].values[c])
        ts = ", ".join(f"{v:.3g}" for v in ds["series_seconds"].values[c, :n])
        sp = ", ".join(f"{v:g}" for v in ds["speed"].values[c, :n])
        lines.append(
            f"* {ds['case'].values[c]} ({ds['shape'].values[c]}, s = {int(ds['samples'].values[c])}): "
            f"EMULATED speeds {sp} x scale {float(ds['scale'].values[c]):.3f} of a core; T_series {ts} s; "
            f"paced blocks overrun {100 * float(ds['overrun_fraction'].values[c]):.0f} %; "
            f"load {float(ds['load_start'].values[c]):.1f} -> {float(ds['load_end'].values[c]):.1f}"
            f"{_weights_note(ds, c)}"
        )
    for note in dict.fromkeys(notes):
        lines.append(f"* {note}")
    lines.extend(_phase_lines(ds))
    return "\n".join(lines) + "\n"


def _workload_label(ds: Any, c: int) -> str:
    wl, b = str(ds["workload"].values[c]), _batch_of(ds, c)
    return wl if b is None else f"{wl} B={b}"


def _weights_note(ds: Any, c: int) -> str:
    """``; final weights vs fit_serial ...`` for the markdown case line (empty when not checked)."""
    if "weights_vs_serial" not in ds:
        return ""
    v = np.asarray(ds["weights_vs_serial"].values[c], dtype=float)
    v = v[np.isfinite(v)]
    if not v.size:
        return ""
    b = _batch_of(ds, c)
    batches = (
        ""
        if b is None
        else f"mini-batches of {b} ({-(-int(ds['samples'].values[c]) // b)} per epoch); "
    )
    return f"; {batches}final weights of every method vs fit_serial: max relative difference {float(v.max()):.1e}"


def _phase_lines(ds: Any) -> list[str]:
    """Where the time goes (engine phases, steady state) for the mini-batch cases."""
    if "phase_seconds" not in ds:
        return []
    mini = [c for c in range(ds.sizes["case"]) if _batch_of(ds, c) is not None]
    phases = ds["phase"].values.tolist()
    rows = []
    for c in mini:
        for k, method in enumerate(ds["method"].values.tolist()):
            v = ds["phase_seconds"].values[c, k]
            if str(ds["skipped"].values[c, k]) or not np.isfinite(v).any():
                continue
            rows.append(
                f"| {ds['case'].values[c]} | {method} | "
                + " | ".join(f"{1e3 * float(t):.1f}" for t in v)
                + f" | {1e3 * float(ds['seconds_per_iteration'].values[c, k]):.1f} |"
            )
    if not rows:
        return []
    return [
        "",
        "Engine phases, ms per iteration (steady state, mean over workers; EMULATED):",
        "",
        "| case | method | " + " | ".join(phases) + " | iteration |",
        "| --- | --- |" + " ---: |" * (len(phases) + 1),
        *rows,
    ]


def plot_bench(ds: Any, path: str) -> str:
    """Bar charts of gamma and s/iteration per case and method (PNG); returns the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = ds["method"].values.tolist()
    cases = ds["case"].values.tolist()
    steps = [c for c in range(len(cases)) if int(ds["step_worker"].values[c]) >= 0]
    ncols = 3 if steps else 2
    fig, axes = plt.subplots(1, ncols, figsize=(6 * ncols, 4.8))
    xs = np.arange(len(cases))
    width = 0.8 / max(len(methods), 1)
    for k, method in enumerate(methods):
        for ax, var in zip(axes[:2], ("gamma", "seconds_per_iteration")):
            ax.bar(
                xs + (k - (len(methods) - 1) / 2) * width, ds[var].values[:, k], width, label=method
            )
    for ax, title in zip(
        axes[:2], ("parallel efficiency gamma", "seconds per iteration (steady state)")
    ):
        ax.set_xticks(xs, [c.replace("/", "\n") for c in cases], fontsize=8)
        ax.set_title(title)
        ax.grid(axis="y", alpha=0.3)
    axes[0].axhline(0.85, color="k", lw=0.8, ls="--")
    axes[0].legend(fontsize=7, ncol=2)
    if steps:
        c = steps[0]
        ax = axes[2]
        for k, method in enumerate(methods):
            ax.plot(
                ds["iteration"].values, ds["iteration_time"].values[c, k], marker=".", label=method
            )
        ax.axvline(int(ds["step_at"].values[c]), color="k", lw=0.8, ls="--")
        ax.set_title(f"load step: {cases[c]}")
        ax.set_xlabel("iteration")
        ax.set_ylabel("s")
        ax.legend(fontsize=7, ncol=2)
    fig.suptitle(
        f"EMULATED heterogeneity on one {ds.attrs.get('cores', os.cpu_count())}-core machine "
        f"(not hardware figures) - dask-rpm bench"
    )
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
    plt.close(fig)
    return path


def write_outputs(ds: Any, out_dir: str, *, plot: bool = True) -> dict[str, str]:
    """Write ``bench.nc`` (netCDF), ``bench.md`` and ``bench.png`` into ``out_dir`` atomically."""
    os.makedirs(out_dir, exist_ok=True)
    paths = {
        "netcdf": os.path.join(out_dir, "bench.nc"),
        "markdown": os.path.join(out_dir, "bench.md"),
    }
    atomic_write(paths["netcdf"], lambda tmp: ds.to_netcdf(tmp, engine="h5netcdf"))
    table = markdown_table(ds)
    atomic_write_text(paths["markdown"], table)
    if plot:
        paths["png"] = plot_bench(ds, os.path.join(out_dir, "bench.png"))
    return paths


# --------------------------------------------------------------------- CLI
_EPILOG = """\
examples:
  dask-rpm bench --quick                      # condition A, N = 4 and 8, compute workload (about 17 min on 2 cores)
  dask-rpm bench --quick --json               # the summary as a JSON list of rows
  dask-rpm bench --conditions A,B --n 4-8 --workloads paper,compute     # the full set (hours)
  dask-rpm bench --conditions A-step --n 8 --iterations 40             # one worker slows 3x mid-run
  dask-rpm bench --workloads custom --shape 20-16-4 --samples 512 --n 3 --methods srpm-assumed,drpm
  dask-rpm bench --workloads minibatch --conditions A --n 4,8 --methods drpm,split-1d,uniform,ddp \
      --batch-sizes 256,1024,4096           # mini-batch SGD, 203-1024-26, s = 16384 (issue 11)

All figures are EMULATED heterogeneity on one machine (docs/emulation.md).
"""


def add_bench_parser(subparsers: Any) -> None:
    """Register ``dask-rpm bench``."""
    p = subparsers.add_parser(
        "bench",
        help="every mapping method side by side on an EMULATED heterogeneous local cluster",
        description=(
            "Run uniform, H_rev, SRPM (assumed and probed abilities), DRPM (with and without initial "
            "abilities), the proportional 1-D split and a PyTorch DDP peer side by side on "
            "dask_rpm.local_cluster with EMULATED speeds; write bench.nc, bench.md and bench.png."
        ),
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="condition A, N = 4 and 8, compute workload, 16 iterations (about 17 min on 2 cores)",
    )
    p.add_argument("--conditions", help="comma-separated: A, B, A-step, B-step (default A,B)")
    p.add_argument(
        "--n", dest="ns", metavar="N", help="worker counts, e.g. 4,8 or 4-8 (default 4-8)"
    )
    p.add_argument(
        "--workloads",
        help="comma-separated: paper, compute, minibatch, custom (default paper,compute)",
    )
    p.add_argument(
        "--batch-sizes",
        metavar="B,B,...",
        help="mini-batch sizes of the minibatch workload (default 256,1024,4096) and of custom "
        "(default full batch); paper and compute are full batch",
    )
    p.add_argument("--methods", help=f"comma-separated subset of {','.join(METHODS)} (default all)")
    p.add_argument(
        "--iterations", type=int, help="iterations per method run (default 40; --quick 16)"
    )
    p.add_argument(
        "--series-iterations",
        type=int,
        default=None,
        help="iterations per T_series run (default 2)",
    )
    p.add_argument(
        "--interval",
        type=int,
        default=None,
        help="R: iterations between DRPM checks (default iterations/4)",
    )
    p.add_argument(
        "--step-at",
        type=int,
        default=None,
        help="iteration of the load step (default iterations/4)",
    )
    p.add_argument(
        "--dp-search",
        choices=("model", "measured"),
        default="model",
        help="how the baselines' best N_DP is found (default model)",
    )
    p.add_argument("--shape", help="custom workload network n-m-l")
    p.add_argument("--samples", type=int, help="custom workload samples")
    p.add_argument("--out", default="rpm-bench", help="output directory (default ./rpm-bench)")
    p.add_argument("--no-plot", action="store_true", help="skip the PNG")
    p.add_argument("--json", action="store_true", help="print the summary rows as JSON on stdout")
    p.add_argument(
        "--no-weight-check",
        action="store_true",
        help="skip comparing every method's final weights with fit_serial (weights_vs_serial)",
    )
    p.set_defaults(func=_cmd_bench)


def _split(text: str | None, default: Sequence[str]) -> list[str]:
    if text is None:
        return list(default)
    return [t.strip() for t in text.split(",") if t.strip()]


def _parse_ns(text: str | None, default: Sequence[int]) -> list[int]:
    from .cli import CLIError

    if text is None:
        return list(default)
    out: list[int] = []
    for tok in _split(text, ()):
        try:
            if "-" in tok:
                a, b = (int(v) for v in tok.split("-", 1))
                out.extend(range(a, b + 1))
            else:
                out.append(int(tok))
        except ValueError:
            raise CLIError(
                f"--n {text!r}: give whole numbers from 1 to {MAX_N}, e.g. 4,8 or 4-8"
            ) from None
    if not out:
        raise CLIError(
            f"--n {text!r} is empty: give whole numbers from 1 to {MAX_N}, e.g. 4,8 or 4-8"
        )
    return out


def _parse_batch_sizes(text: str | None) -> list[int] | None:
    from .cli import CLIError

    if text is None:
        return None
    try:
        sizes = [int(t) for t in _split(text, ())]
    except ValueError:
        raise CLIError(
            f"--batch-sizes {text!r}: give whole numbers of samples per mini-batch, "
            f"e.g. 256,1024,4096"
        ) from None
    if not sizes:
        raise CLIError(f"--batch-sizes {text!r} is empty: give e.g. 256,1024,4096")
    return sizes


def _cmd_bench(args: argparse.Namespace) -> int:
    from .cli import CLIError
    from .planners import parse_shape

    if args.quick:
        conditions, ns, workloads, iterations = ["A"], [4, 8], ["compute"], 16
    else:
        conditions, ns, workloads, iterations = (
            ["A", "B"],
            [4, 5, 6, 7, 8],
            ["paper", "compute"],
            40,
        )
    conditions = _split(args.conditions, conditions)
    ns = _parse_ns(args.ns, ns)
    workloads = _split(args.workloads, workloads)
    methods = _split(args.methods, METHODS)
    iterations = args.iterations if args.iterations is not None else iterations
    custom = None
    if (args.shape is None) != (args.samples is None):
        raise CLIError(
            "--shape and --samples go together (a custom workload); give both or neither"
        )
    if args.shape is not None:
        n, m, l = parse_shape(args.shape)
        if args.samples < 1:
            raise CLIError(f"--samples {args.samples}: must be a positive number of samples")
        custom = (n, m, l, int(args.samples))
        if args.workloads is None:
            workloads = ["custom"]
    if "ddp" in methods:
        ok, why = torch_available()
        if not ok:
            print(f"dask-rpm bench: ddp will be skipped: {why}", file=sys.stderr)
    out_dir = args.out
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise CLIError(f"--out {out_dir!r} exists and is not a directory; give a directory path")
    try:
        ds = run_bench(
            workloads=workloads,
            conditions=conditions,
            ns=ns,
            methods=methods,
            iterations=iterations,
            series_iterations=args.series_iterations if args.series_iterations is not None else 2,
            interval=args.interval,
            step_at=args.step_at,
            dp_search=args.dp_search,
            custom=custom,
            batch_sizes=_parse_batch_sizes(args.batch_sizes),
            check_weights=not args.no_weight_check,
        )
    except BenchError as e:
        raise CLIError(str(e)) from None
    paths = write_outputs(ds, out_dir, plot=not args.no_plot)
    if args.json:
        print(json.dumps(summary_rows(ds)))
    else:
        print(markdown_table(ds))
        print("wrote " + ", ".join(paths.values()) + "  (EMULATED heterogeneity on one machine)")
    return 0
