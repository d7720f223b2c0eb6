"""What a bench run is made of: the paper's ability profiles, the workloads, the methods, the cases.

Pure (numpy only; no ``distributed``, no torch): :mod:`dask_rpm.bench.simulate`
draws its speed distributions ``A`` and ``B`` from here, and the harness
(:mod:`dask_rpm.bench.harness`) builds its cases here. Also the metric
(:func:`gamma`, :func:`steady_seconds`) and the checks of a run's arguments,
so bad input is refused before any cluster starts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..nn.layers import Layers, layers_of

__all__ = [
    "CONDITIONS",
    "ASSUMED_TO_TRUE",
    "Workload",
    "WORKLOADS",
    "MINIBATCH_SIZES",
    "MINIBATCH_METHODS",
    "METHODS",
    "STEP_FACTOR",
    "MAX_N",
    "BenchError",
    "BenchCase",
    "gamma",
    "steady_seconds",
    "true_profile",
    "takes_batch_sizes",
    "workload_batch_sizes",
    "workload_of",
    "make_cases",
    "bench_learning_rate",
    "weights_difference",
    "check_arguments",
    "check_batch_sizes",
    "check_step",
]


#: docs/method.md §8: the paper's assumed ability profiles (use the first N).
CONDITIONS: dict[str, tuple[float, ...]] = {
    "A": (0.25, 0.31, 0.63, 1.0, 1.0, 0.42, 0.67, 0.63),
    "B": (0.63, 0.63, 0.63, 1.0, 0.63, 1.0, 1.0, 0.63),
}
#: Assumed 0.63 (clock ratio 500/800 MHz), measured about 0.5 by the paper.
ASSUMED_TO_TRUE = {0.63: 0.5}
#: Batch sizes the ``minibatch`` and ``deep`` workloads run at unless ``batch_sizes`` is given.
MINIBATCH_SIZES = (256, 1024, 4096)


@dataclass(frozen=True)
class Workload:
    """A bench workload: the network, the training set and the batch sizes it runs at.

    Attributes
    ----------
    n : int
        Inputs.
    hidden : tuple of int
        Units of each hidden layer, first to last (one entry: the paper's 3-layer network).
    l : int
        Outputs.
    samples : int
        Training samples.
    batch_sizes : tuple of int, optional
        Mini-batch sizes it runs at by default; None: full batch (the paper's experiment).
    """

    n: int
    hidden: tuple[int, ...]
    l: int  # noqa: E741 - the paper's name for the output size
    samples: int
    batch_sizes: tuple[int, ...] | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        """``(n, m_1, ..., m_L, l)``."""
        return (self.n, *self.hidden, self.l)

    @classmethod
    def of(cls, dims: Sequence[int]) -> Workload:
        """The full-batch workload of ``(n, m_1, ..., m_L, l, s)`` (the ``custom`` tuple)."""
        d = [int(v) for v in dims]
        return cls(d[0], tuple(d[1:-2]), d[-2], d[-1])


WORKLOADS: dict[str, Workload] = {
    # The paper's NETtalk size: about 5 ms of compute per iteration on one core
    # here, far below Dask's per-task latency, so it measures the engine.
    "paper": Workload(203, (80,), 26, 1024),
    # Same inputs/outputs, 1024 hidden units and 32768 samples: about 1.3 s of
    # float64 compute per iteration on one core (0.8 s per iteration on 8
    # EMULATED workers at auto scale), against ~0.05-0.13 s of Dask latency.
    "compute": Workload(203, (1024,), 26, 32768),
    # Issue 11: mini-batch SGD on the compute network. 16384 samples give 4 to
    # 64 batches per epoch at the batch sizes of MINIBATCH_SIZES; a batch of
    # 4096 costs an eighth of the compute workload's iteration, one of 256 a
    # 128th (a few ms per worker: latency-bound, like the paper's workload).
    "minibatch": Workload(203, (1024,), 26, 16384, MINIBATCH_SIZES),
    # A deep MNIST-sized network (784-1024-1024-1024-10), mini-batch SGD at the same batch
    # sizes: about 16x the minibatch workload's work per sample (rectangle_work) and 12x its
    # weights, and every iteration also gathers two layers' activations and sums their
    # deltas inside a column.
    "deep": Workload(784, (1024, 1024, 1024), 10, 16384, MINIBATCH_SIZES),
}
#: Methods of the mini-batch comparison, the ``--methods`` of its docs command.
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
    shape: tuple[int, ...]  # (n, m_1, ..., m_L, l): one hidden layer or several
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
    def layers(self) -> Layers:
        """The network's :class:`~dask_rpm.nn.layers.Layers`."""
        return layers_of(self.shape)

    @property
    def plan_shape(self) -> tuple[int, int, int]:
        """``(n, m, l)`` the plans are made for (``m``: the narrowest hidden layer)."""
        return self.layers.plan_shape

    @property
    def cost_shape(self) -> tuple[int, int, int] | None:
        """What the communication model counts for a network of several hidden layers
        (:attr:`Layers.cost_shape <dask_rpm.nn.layers.Layers.cost_shape>`); None for one."""
        return self.layers.cost_shape if self.layers.depth > 1 else None

    @property
    def batch(self) -> int:
        """Samples per iteration."""
        return self.samples if self.batch_size is None else min(self.batch_size, self.samples)

    def schedule(self) -> dict[int, list[tuple[int, float]]] | None:
        if self.step_worker is None or self.step_at is None:
            return None
        return {
            self.step_worker: [(int(self.step_at), self.speeds[self.step_worker] / STEP_FACTOR)]
        }


def gamma(seconds_parallel: float, series_seconds: Sequence[float] | np.ndarray) -> float:
    """Parallel efficiency ``(1 / T_parallel) / sum_i (1 / T_series(i))`` (docs/method.md §8)."""
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
    """The EMULATED truth of ``condition`` for ``n`` workers: the assumed profile with 0.63 -> 0.5."""
    base = CONDITIONS[condition.split("-")[0]][:n]
    return tuple(ASSUMED_TO_TRUE.get(v, v) for v in base)


def takes_batch_sizes(workload: str) -> bool:
    """Whether ``batch_sizes`` apply to ``workload``: the mini-batch workloads and ``custom``."""
    return workload == "custom" or WORKLOADS[workload].batch_sizes is not None


def workload_batch_sizes(
    workload: str, batch_sizes: Sequence[int] | None = None
) -> list[int | None]:
    """Batch sizes a workload runs at: a mini-batch workload (``minibatch``, ``deep``) at
    ``batch_sizes`` (default its own, :data:`MINIBATCH_SIZES`), ``custom`` at ``batch_sizes``
    when given, every other workload full batch (``[None]``: the paper's experiment)."""
    if workload == "custom":
        return list(batch_sizes) if batch_sizes else [None]
    own = WORKLOADS[workload].batch_sizes
    if own is None:
        return [None]
    return list(batch_sizes) if batch_sizes else list(own)


def workload_of(name: str, custom: Sequence[int] | None = None) -> Workload:
    """The :class:`Workload` named ``name``; ``custom`` is ``(n, m_1, ..., m_L, l, s)``."""
    if name == "custom" and custom is not None:
        return Workload.of(custom)
    return WORKLOADS[name]


def make_cases(
    workloads: Sequence[str],
    conditions: Sequence[str],
    ns: Sequence[int],
    *,
    step_at: int,
    custom: Sequence[int] | None = None,
    batch_sizes: Sequence[int] | None = None,
) -> list[BenchCase]:
    """One case per workload, batch size, condition and N, in that nesting order
    (``custom``: ``(n, m_1, ..., m_L, l, s)``, one hidden layer or several)."""
    cases = []
    for wl in workloads:
        work = workload_of(wl, custom)
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
                            work.shape,
                            work.samples,
                            speeds,
                            assumed,
                            step_worker=step_worker,
                            step_at=step_at if step_worker is not None else None,
                            batch_size=batch,
                        )
                    )
    return cases


def bench_learning_rate(case: BenchCase) -> float:
    """``0.5 / (samples per iteration x hidden units)`` (the narrowest hidden layer's, the plan's
    ``m``, for a deep network): the same step at every batch size, and
    well-conditioned, so every method ends at the serial reference's weights to rounding (the
    bench checks that: ``weights_vs_serial``).

    Why the hidden units: a step of ``eps`` on the summed gradient moves each output's
    pre-activation by about ``eps B m / 16``. With ``eps = 0.5 / B`` (an earlier default)
    that is ~30 at m = 1024: training overshoots and is chaotic, and at 203-1024-26, B = 1024 a
    1e-15 change of W0 grew to 2.3e-6 in 32 iterations (measured), so no check could tell a
    different summation order from different batches. At ``0.5 / (B m)`` it stays at 4e-15 while
    batches of 2048 instead of 1024 differ by 9e-3. Timing does not depend on the rate.
    """
    return 0.5 / (case.batch * case.layers.m)


def weights_difference(
    weights: Sequence[np.ndarray] | None, reference: Sequence[np.ndarray] | None
) -> float:
    """``max |P - P_ref|`` over ``max |P_ref|``, over the parameters ``W_1 .. W_L, V`` (one hidden
    layer: ``W, V``); NaN when either is missing."""
    if weights is None or reference is None:
        return math.nan
    diff = max(
        float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) for a, b in zip(weights, reference)
    )
    size = max(float(np.max(np.abs(b))) for b in reference)
    return diff / size if size > 0 else diff


def check_batch_sizes(
    workloads: list[str],
    batch_sizes: Sequence[int] | None,
    custom: Sequence[int] | None,
) -> list[int] | None:
    """Check ``batch_sizes`` (whole numbers from 1 to the workload's samples); a list, or None."""
    if batch_sizes is None:
        return None
    sizes = list(batch_sizes)
    takers = [wl for wl in workloads if wl in ("custom", *WORKLOADS) and takes_batch_sizes(wl)]
    if not sizes:
        raise BenchError(
            "batch_sizes is empty: give at least one mini-batch size, e.g. 256,1024,4096"
        )
    if not takers:
        raise BenchError(
            f"batch sizes {sizes} apply to the minibatch, deep and custom workloads, and the run has "
            f"{', '.join(workloads)} (full batch: the paper's experiment); add --workloads minibatch"
        )
    for b in sizes:
        if isinstance(b, bool) or not isinstance(b, (int, np.integer)) or b < 1:
            raise BenchError(
                f"batch size {b!r}: give whole numbers of samples per mini-batch, e.g. 256,1024,4096"
            )
        for wl in takers:
            if wl == "custom" and custom is None:
                continue  # reported by check_arguments
            s_ = workload_of(wl, custom).samples
            if b > s_:
                raise BenchError(
                    f"batch size {b} is larger than the {wl} workload's {s_} samples; give at most "
                    f"{s_} (a batch of all samples is full-batch training)"
                )
    if len(set(sizes)) != len(sizes):
        raise BenchError(f"batch sizes {sizes} repeat a value; give each once")
    return [int(b) for b in sizes]


def check_arguments(
    workloads: list[str],
    conditions: list[str],
    ns: list[int],
    methods: list[str],
    iterations: int,
    series_iterations: int,
    interval: int | None,
    dp_search: str,
    custom: Sequence[int] | None,
) -> None:
    """Refuse (:class:`BenchError`) names, worker counts and iteration counts a run cannot use."""
    valid_wl = [*WORKLOADS, "custom"]
    for wl in workloads:
        if wl not in valid_wl:
            raise BenchError(f"workload {wl!r} is not one of {', '.join(valid_wl)}")
        if wl == "custom" and custom is None:
            raise BenchError(
                "workload 'custom' needs a shape and samples (--shape N-M-L --samples S)"
            )
        if wl == "custom" and custom is not None and (len(custom) < 4 or min(custom) < 1):
            raise BenchError(
                f"custom={tuple(custom)}: give (n, m_1, ..., m_L, l, samples), every size "
                f"at least 1"
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


def check_step(
    conditions: Sequence[str], step_at: int, iterations: int, series_iterations: int
) -> None:
    """A load step (``-step`` conditions) must come after the series runs and in the run's first half."""
    if any(c.endswith("-step") for c in conditions) and not (
        series_iterations < step_at < iterations // 2 + 1
    ):
        raise BenchError(
            f"step_at={step_at} must lie after the series runs ({series_iterations} iterations) and in the "
            f"first half of the run ({iterations} iterations); give more iterations or another step_at"
        )
