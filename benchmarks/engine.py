"""Engine benchmark (issue #3, speed part): what does running BP as Dask tasks cost?

Measured in one run on one (shared, noisy) machine:

1. **One worker, one rectangle vs serial.** A 1-worker, 1-thread cluster
   (``local_cluster([1.0], scale=1.0)``: speed 1.0 of a full core, so pacing
   never sleeps) trains the same network as :func:`dask_rpm.fit_serial` in
   this process, with BLAS pinned to one thread on both sides. The arms take
   turns, the order rotating every round (S D M, D M S, M S D, ...), so
   machine noise hits all of them; per round each distributed time is paired
   with that round's serial time and the median ratio is reported (target
   <= 1.25). Arm M is the same worker started without the
   ``MALLOC_TRIM_THRESHOLD_`` Dask's Nanny exports (``--no-malloc-variant``
   drops it). Load-robust CPU seconds per iteration are reported too.

2. **Four workers, SRPM plan, equal speeds.** Per iteration,
   ``overhead = iteration_time - max_w(forward + backward + modify)`` (the
   slowest worker's compute tasks, from ``FitResult.history``), as a fraction
   of the iteration time (goal <= 10 %). Four workers on two cores cannot all
   run at full speed, so the main figure uses EMULATED equal speeds whose
   scale keeps the sum of speeds under the cores (``local_cluster``'s
   ``auto_scale``: 0.4 of a core each); the raw, unpadded run (scale 1.0, i.e.
   4 cores of demand on 2) is reported too and measures contention.

Also measured, as evidence for the analysis: the latency floor (iteration
time of a tiny problem on the same clusters: pure scheduling and transfer),
peer-transfer seconds recorded by the scheduler plugin, pacing overruns, and
the spread of Dask's heartbeat clock-offset estimates.

Clock note: Dask shifts every task's start/stop by the worker's
``scheduler_delay``, re-estimated at each heartbeat. All processes here share
one clock, so the benchmark pins that offset to 0 on its workers (and records
the estimates Dask would have applied); ``--dask-clock`` keeps Dask's
behaviour, under which cross-task phase times can jump by its changes.

Usage::

    python benchmarks/engine.py                 # n,m,l,s = 1024,2048,64,16384, float32 (~5-6 min)
    python benchmarks/engine.py --quick         # 512,1024,32,8192: about 1-2 minutes
    python benchmarks/engine.py --size 256,512,16,4096 --iterations 6 --rounds 3
    python benchmarks/engine.py --wait-load 3   # first wait for the load average to drop below 3
    python benchmarks/engine.py --json          # JSON on stdout (table on stderr)
    python benchmarks/engine.py --json out.json # table on stdout, JSON to a file

Multi-worker figures on one machine are EMULATED heterogeneity, not hardware
figures.
"""

from __future__ import annotations

import os

# Pin BLAS of this process (serial reference, client) to one thread before
# numpy is imported; threadpoolctl below covers an already-loaded BLAS too.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

FULL_SIZE = (1024, 2048, 64, 16384)
QUICK_SIZE = (512, 1024, 32, 8192)
FLOOR_SIZE = (16, 32, 4, 256)  # tiny: iteration time is pure engine overhead
TARGET_RATIO = 1.25
GOAL_OVERHEAD = 0.10
QUIET = logging.CRITICAL  # worker log level (a heartbeat racing the shutdown logs a harmless error)

_T0 = time.perf_counter()


def log(msg: str) -> None:
    """Progress line on stderr with the elapsed time."""
    print(f"[{time.perf_counter() - _T0:7.1f} s] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------


def pin_blas() -> dict[str, Any]:
    """Limit this process's BLAS to one thread; return what threadpoolctl reports."""
    try:
        from threadpoolctl import threadpool_info, threadpool_limits
    except ImportError:  # pragma: no cover - env vars above still apply
        return {"threadpoolctl": False}
    threadpool_limits(limits=1)
    blas = [p for p in threadpool_info() if p.get("user_api") == "blas"]
    return {
        "threadpoolctl": True,
        "blas": [
            {k: p.get(k) for k in ("internal_api", "version", "architecture", "num_threads")}
            for p in blas
        ],
    }


def make_data(n: int, l: int, s: int, dtype: str, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Random inputs in [0, 1) and random teacher signals in [0, 1)."""
    rng = np.random.default_rng(seed)
    x = rng.random((s, n), dtype=np.float64).astype(dtype)
    d = rng.random((s, l), dtype=np.float64).astype(dtype)
    return x, d


def med(values: Any) -> float:
    """Median ignoring NaNs (NaN when empty)."""
    a = np.asarray(values, dtype=float)
    a = a[np.isfinite(a)]
    return float(np.median(a)) if a.size else float("nan")


def machine_info() -> dict[str, Any]:
    """CPU model, core count, load and library versions."""
    import dask
    import distributed

    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:  # pragma: no cover - not Linux
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "loadavg_start": list(os.getloadavg()),
        # the serial reference runs in this process: its malloc tuning as started
        "MALLOC_TRIM_THRESHOLD_": os.environ.get("MALLOC_TRIM_THRESHOLD_"),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "dask": dask.__version__,
        "distributed": distributed.__version__,
    }


def history_stats(res: Any, skip: int = 0) -> dict[str, Any]:
    """Iteration time, slowest worker's compute and overhead from a FitResult history.

    ``skip`` leading iterations are dropped (warm-up).
    """
    h = res.history.isel(iteration=slice(skip, None))
    it_time = h["iteration_time"].values
    compute_w = (h["forward"] + h["backward"] + h["modify"]).values  # (iteration, worker)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN rows (unplanned workers)
        compute = np.nanmax(compute_w, axis=1)
        phases = {
            p: med(np.nanmax(h[p].values, axis=1))
            for p in ("forward", "vertical_wait", "backward", "horizontal", "modify")
        }
        # Phase by phase, the slowest worker: what the iteration would take if the
        # vertical and horizontal exchanges were free barriers. The excess of the
        # slowest worker's own compute over this is load imbalance (noise), not engine.
        barrier = sum(np.nanmax(h[p].values, axis=1) for p in ("forward", "backward", "modify"))
    overhead = it_time - compute
    frac = overhead / it_time
    ok = np.isfinite(frac)
    frac_b = (it_time - barrier) / it_time
    # Cross-task phases can come out negative when a worker's scheduler_delay
    # (heartbeat clock-offset estimate) jumps between two tasks.
    negative = int(sum((h[p].values < 0).sum() for p in ("vertical_wait", "horizontal")))
    return {
        "iterations_used": int(ok.sum()),
        "iteration_time_median": med(it_time),
        "iteration_time_mean": float(np.nanmean(it_time)) if ok.any() else float("nan"),
        "max_compute_median": med(compute),
        "overhead_median": med(overhead),
        "overhead_fraction_median": med(frac),
        "phase_barrier_compute_median": med(barrier),
        "overhead_vs_barrier_fraction_median": med(frac_b),
        "overhead_vs_barrier_fraction_total": float(
            np.nansum(it_time - barrier) / np.nansum(it_time)
        ),
        "overhead_fraction_p10": float(np.nanpercentile(frac, 10)) if ok.any() else float("nan"),
        "overhead_s_min": float(np.nanmin(overhead)) if ok.any() else float("nan"),
        # aggregate over the run: total overhead / total time
        "overhead_fraction_total": float(overhead[ok].sum() / it_time[ok].sum())
        if ok.any()
        else float("nan"),
        "phase_max_over_workers_median": phases,
        "negative_phase_values": negative,
    }


def _pin_clock_offset(dask_worker: Any) -> bool:
    """Make a worker stamp task start/stop with its own clock (offset 0), recording Dask's estimates.

    Dask adds ``worker.scheduler_delay`` (re-estimated from each heartbeat
    round trip) to every task's start/stop. On one host every process reads
    the same clock, so the true offset is 0 and the estimate is pure noise,
    which moves cross-task phases (and iteration times) by its jumps. The
    attribute becomes a property that reads 0 and keeps what Dask would have
    used in ``_rpm_delay_estimates``.
    """
    cls = type(dask_worker)
    if getattr(cls, "_rpm_clock_pinned", False):
        return True

    def _get(self: Any) -> float:
        return 0.0

    def _set(self: Any, value: float) -> None:
        self.__dict__.setdefault("_rpm_delay_estimates", []).append(float(value))

    dask_worker.__dict__.setdefault("_rpm_delay_estimates", []).append(
        float(dask_worker.__dict__.pop("scheduler_delay", 0.0))
    )
    dask_worker.__class__ = type(
        cls.__name__, (cls,), {"scheduler_delay": property(_get, _set), "_rpm_clock_pinned": True}
    )
    return True


def pin_clock_offsets(client: Any) -> None:
    """Apply :func:`_pin_clock_offset` on every worker of ``client`` (all on this host)."""
    client.run(_pin_clock_offset)


def scheduler_delays(client: Any) -> list[list[float]]:
    """Per worker, the clock offsets Dask estimated (pinned workers) or its current one."""

    def _get(dask_worker: Any) -> list[float]:
        est = dask_worker.__dict__.get("_rpm_delay_estimates")
        return list(est) if est is not None else [float(dask_worker.scheduler_delay)]

    got = client.run(_get)
    return [v for _, v in sorted(got.items())]


def delay_spread(per_worker: list[list[float]], pinned: bool) -> dict[str, Any]:
    """Largest change of any worker's heartbeat clock-offset estimate, and the largest |estimate|."""
    vals = [np.asarray(v, dtype=float) for v in per_worker if len(v)]
    if not vals:
        return {
            "pinned": pinned,
            "spread_s": float("nan"),
            "max_abs_s": float("nan"),
            "estimates": 0,
        }
    return {
        "pinned": pinned,
        "spread_s": float(max(v.max() - v.min() for v in vals)),
        "max_abs_s": float(max(np.abs(v).max() for v in vals)),
        "estimates": int(sum(v.size for v in vals)),
    }


def emulation_counters(client: Any) -> list[dict[str, Any]]:
    """Per-worker pacing counters (cpu, wall, slept, overruns)."""
    from dask_rpm.emulation import emulation_report

    keep = (
        "index",
        "speed",
        "scale",
        "blocks",
        "cpu_s",
        "wall_s",
        "sleep_s",
        "overruns",
        "overrun_s",
    )
    return [{k: r.get(k) for k in keep} for r in emulation_report(client)]


def counters_delta(
    before: list[dict[str, Any]], after: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Counters accumulated between two :func:`emulation_counters` snapshots."""
    out = []
    for b, a in zip(before, after):
        row = {k: a[k] for k in ("index", "speed", "scale")}
        for k in ("blocks", "cpu_s", "wall_s", "sleep_s", "overruns", "overrun_s"):
            row[k] = a[k] - b[k]
        row["wall_over_cpu"] = row["wall_s"] / row["cpu_s"] if row["cpu_s"] else float("nan")
        out.append(row)
    return out


# --------------------------------------------------------------------------
# measurements
# --------------------------------------------------------------------------


def _malloc_default_cluster() -> Any:
    """A 1-worker cluster like part 1's, but whose worker keeps glibc's default malloc tuning.

    Dask's Nanny exports ``MALLOC_TRIM_THRESHOLD_=65536`` (config
    ``distributed.nanny.pre-spawn-environ``) to its workers, and also into this
    process's ``os.environ`` before spawning. Setting it turns off glibc's
    dynamic mmap threshold, so every array above 128 KiB is a fresh mmap that
    page-faults on first touch, each iteration.
    """
    import dask

    import dask_rpm

    env = {
        k: v
        for k, v in dask.config.get("distributed.nanny.pre-spawn-environ").items()
        if k != "MALLOC_TRIM_THRESHOLD_"
    }
    saved = os.environ.pop("MALLOC_TRIM_THRESHOLD_", None)
    try:
        with dask.config.set({"distributed.nanny.pre-spawn-environ": env}):
            return dask_rpm.local_cluster(
                [1.0], scale=1.0, threads_per_worker=1, silence_logs=QUIET
            )
    finally:
        if saved is not None:
            os.environ["MALLOC_TRIM_THRESHOLD_"] = saved


def bench_single(
    x: np.ndarray,
    d: np.ndarray,
    *,
    m: int,
    iterations: int,
    rounds: int,
    lr: float,
    dtype: str,
    floor_iterations: int,
    pin_clock: bool,
    malloc_variant: bool,
) -> dict[str, Any]:
    """Part 1: one worker, one rectangle vs fit_serial, measurements interleaved round by round."""
    import contextlib

    from distributed import Client

    import dask_rpm

    kw = dict(hidden=m, learning_rate=lr, dtype=dtype)

    def serial(k: int) -> dict[str, Any]:
        c, t = time.thread_time(), time.perf_counter()
        ref = dask_rpm.fit_serial(x, d, iterations=k, **kw)
        (W, V), err = ref.params, ref.errors
        return {
            "s": (time.perf_counter() - t) / k,
            "cpu_s": (time.thread_time() - c) / k,
            "result": (W, V, err),
        }

    def dist(client: Any, k: int) -> dict[str, Any]:
        c0 = emulation_counters(client)
        t = time.perf_counter()
        # as_current: the engine waits with distributed.wait(), which uses the
        # *default* client, and two clients are open here
        with client.as_current():
            res = dask_rpm.fit(
                x, d, iterations=k, mapping="uniform", client=client, interval=k, **kw
            )
        wall = (time.perf_counter() - t) / k
        # CPU seconds the worker thread spent in the paced task bodies (all rpm compute)
        cpu = sum(c["cpu_s"] for c in counters_delta(c0, emulation_counters(client))) / k
        h = res.history
        compute = float(np.nansum((h["forward"] + h["backward"] + h["modify"]).values)) / k
        # mean of iteration_time = first forward start .. last modify end, / k
        it_s = float(np.nanmean(h["iteration_time"].values))
        return {
            "s": it_s,
            "wall_s": wall,
            "compute_s": compute,
            "gap_s": it_s - compute,
            "cpu_s": cpu,
            "result": res,
        }

    with contextlib.ExitStack() as stack:
        log("part 1: starting a 1-worker, 1-thread cluster (speed 1.0 x scale 1.0: no padding)")
        cluster = stack.enter_context(
            dask_rpm.local_cluster([1.0], scale=1.0, threads_per_worker=1, silence_logs=QUIET)
        )
        clients = {"D": stack.enter_context(Client(cluster))}
        if malloc_variant:
            log(
                "part 1: starting the same without Dask's MALLOC_TRIM_THRESHOLD_ (glibc default malloc)"
            )
            clients["M"] = stack.enter_context(
                Client(stack.enter_context(_malloc_default_cluster()))
            )
        arms = ["S", *clients]
        log("part 1: warm-up (1 iteration each)")
        serial(1)
        for c in clients.values():
            dist(c, 1)
            if pin_clock:
                pin_clock_offsets(c)
        before = {a: emulation_counters(c) for a, c in clients.items()}
        delays = {a: scheduler_delays(c) for a, c in clients.items()}
        rows = []
        last: dict[str, Any] = {}
        for r in range(rounds):
            # rotate the order each round (S D M, D M S, M S D, ...; reversed on odd rounds for 2 arms)
            order = arms[r % len(arms) :] + arms[: r % len(arms)]
            row: dict[str, Any] = {
                "round": r,
                "order": "".join(order),
                "loadavg": os.getloadavg()[0],
            }
            for arm in order:
                got = serial(iterations) if arm == "S" else dist(clients[arm], iterations)
                last[arm] = got.pop("result")
                prefix = {"S": "serial", "D": "dist", "M": "dist_malloc"}[arm]
                for k, v in got.items():
                    row[prefix + "_" + k] = v
            if not pin_clock:
                for a, c in clients.items():
                    for w, v in enumerate(scheduler_delays(c)):
                        delays[a][w].extend(v)
            row["ratio"] = row["dist_s"] / row["serial_s"]
            row["ratio_wall"] = row["dist_wall_s"] / row["serial_s"]
            row["compute_ratio"] = row["dist_compute_s"] / row["serial_s"]
            row["cpu_ratio"] = row["dist_cpu_s"] / row["serial_cpu_s"]
            if "M" in clients:
                row["ratio_malloc"] = row["dist_malloc_s"] / row["serial_s"]
            log(
                f"part 1: round {r} {row['order']}: serial {row['serial_s']:.3f} s/it, "
                f"distributed {row['dist_s']:.3f} s/it (compute {row['dist_compute_s']:.3f}, "
                f"end-to-end {row['dist_wall_s']:.3f}), ratio {row['ratio']:.3f}"
                + (
                    f"; default-malloc worker {row['dist_malloc_s']:.3f} s/it, ratio {row['ratio_malloc']:.3f}"
                    if "M" in clients
                    else ""
                )
            )
            rows.append(row)
        counters = counters_delta(before["D"], emulation_counters(clients["D"]))
        delay = delay_spread(
            scheduler_delays(clients["D"]) if pin_clock else delays["D"], pin_clock
        )
        label = cluster.emulation_label
        floor = None
        if floor_iterations:
            floor = bench_floor(clients["D"], iterations=floor_iterations, dtype=dtype, workers=1)
            log(f"part 1: latency floor {1e3 * floor['iteration_time_median']:.1f} ms/it")
    # Correctness guard: the last fits used the same init, data and iterations.
    W_s, V_s, err_s = last["S"]
    res = last["D"]
    diff = float(max(np.max(np.abs(res.params[0] - W_s)), np.max(np.abs(res.params[-1] - V_s))))
    err_d = res.history["error"].values
    phases = {
        p: med(res.history[p].values)
        for p in ("forward", "vertical_wait", "backward", "horizontal", "modify")
    }
    col = {k: [r[k] for r in rows] for k in rows[0]}
    out = {
        "cluster": "local_cluster([1.0], scale=1.0, threads_per_worker=1): one worker, full core, no padding",
        "label": label,
        "iterations_per_fit": iterations,
        "rounds": rows,
        "serial_s_median": med(col["serial_s"]),
        "dist_s_median": med(col["dist_s"]),
        "dist_wall_s_median": med(col["dist_wall_s"]),
        "dist_compute_s_median": med(col["dist_compute_s"]),
        "dist_gap_s_median": med(col["dist_gap_s"]),
        "ratio_median": med(col["ratio"]),
        "ratio_wall_median": med(col["ratio_wall"]),
        "compute_ratio_median": med(col["compute_ratio"]),
        "serial_cpu_s_median": med(col["serial_cpu_s"]),
        "dist_cpu_s_median": med(col["dist_cpu_s"]),
        "cpu_ratio_median": med(col["cpu_ratio"]),
        "ratio_of_medians": med(col["dist_s"]) / med(col["serial_s"]),
        # least-disturbed estimate on a shared machine: fastest distributed vs fastest serial
        "ratio_of_minima": min(col["dist_s"]) / min(col["serial_s"]),
        "last_fit_phase_medians": phases,
        "max_abs_weight_diff_vs_serial": diff,
        "max_abs_error_diff_vs_serial": float(np.max(np.abs(err_d - err_s))),
        "pacing": counters,
        "scheduler_delay": delay,
        "floor": floor,
    }
    if "M" in clients:
        out.update(
            {
                "dist_malloc_s_median": med(col["dist_malloc_s"]),
                "ratio_malloc_median": med(col["ratio_malloc"]),
                "ratio_malloc_of_minima": min(col["dist_malloc_s"]) / min(col["serial_s"]),
            }
        )
    return out


def bench_floor(client: Any, *, iterations: int, dtype: str, workers: int) -> dict[str, Any]:
    """Latency floor: a tiny problem where an iteration is almost only engine overhead."""
    import dask_rpm

    n, m, l, s = FLOOR_SIZE
    x, d = make_data(n, l, s, dtype, seed=2)
    mapping = "uniform" if workers == 1 else "srpm"
    with client.as_current():
        dask_rpm.fit(
            x,
            d,
            hidden=m,
            iterations=3,
            learning_rate=0.01,
            mapping=mapping,
            dtype=dtype,
            client=client,
            interval=3,
        )  # warm-up
        res = dask_rpm.fit(
            x,
            d,
            hidden=m,
            iterations=iterations,
            learning_rate=0.01,
            mapping=mapping,
            dtype=dtype,
            client=client,
            interval=iterations,
        )
    st = history_stats(res, skip=1)
    st.update(
        {
            "size": [n, m, l, s],
            "iterations": iterations,
            "plan": repr(res.plan),
            "tasks_per_iteration": res.stats["tasks"] / iterations,
        }
    )
    return st


def exchange_bytes(plan: Any, itemsize: int) -> dict[str, int]:
    """Bytes that cross between workers per iteration (the paper's gather-then-broadcast count)."""
    n, m, l = plan.shape
    vertical = sum(
        2 * (len(col) - 1) * (plan.column_samples(c)[1] - plan.column_samples(c)[0]) * l
        for c, col in enumerate(plan.columns)
    )
    horizontal = (
        sum(2 * (len(plan.holders(b)) - 1) * (b[1] - b[0]) * (n + l) for b in plan.bands())
        if plan.n_columns > 1
        else 0
    )
    return {"vertical": vertical * itemsize, "horizontal": horizontal * itemsize}


def bench_multi(
    x: np.ndarray,
    d: np.ndarray,
    *,
    m: int,
    iterations: int,
    lr: float,
    dtype: str,
    padded: bool,
    serial_s: float,
    floor_iterations: int,
    pin_clock: bool,
    scale: float | None = None,
) -> dict[str, Any]:
    """Part 2: four equal workers, SRPM plan; overhead = iteration time - slowest worker's compute."""
    from distributed import Client

    import dask_rpm

    if not padded:
        scale = 1.0
    kind = (
        "EMULATED (padded, " + ("auto scale)" if scale is None else f"scale {scale:g})")
        if padded
        else "RAW (unpadded, scale 1.0: contention)"
    )
    log(f"part 2 {kind}: starting 4 workers")
    with (
        dask_rpm.local_cluster(
            [1.0] * 4, scale=scale, threads_per_worker=1, silence_logs=QUIET
        ) as cluster,
        Client(cluster) as client,
    ):
        log(f"part 2: {cluster.emulation_label}")
        kw = dict(hidden=m, learning_rate=lr, dtype=dtype, mapping="srpm", client=client)
        if pin_clock:
            pin_clock_offsets(client)
        dask_rpm.fit(x, d, iterations=2, interval=2, **kw)  # warm-up
        before = emulation_counters(client)
        delays = scheduler_delays(client)
        t = time.perf_counter()
        res = dask_rpm.fit(x, d, iterations=iterations, interval=iterations, **kw)
        wall = time.perf_counter() - t
        if pin_clock:
            delays = scheduler_delays(client)
        else:
            for w, v in enumerate(scheduler_delays(client)):
                delays[w].extend(v)
        counters = counters_delta(before, emulation_counters(client))
        st = history_stats(res, skip=1)
        log(
            f"part 2 {kind}: {st['iteration_time_median']:.3f} s/it, slowest compute "
            f"{st['max_compute_median']:.3f} s, overhead {100 * st['overhead_fraction_median']:.1f} %"
        )
        floor = None
        if floor_iterations:
            floor = bench_floor(client, iterations=floor_iterations, dtype=dtype, workers=4)
            log(f"part 2 {kind}: latency floor {1e3 * floor['iteration_time_median']:.1f} ms/it")
        st.update(
            {
                "kind": kind,
                "padded": padded,
                "label": cluster.emulation_label,
                "scale": cluster.scale_factor,
                "cores_demanded": cluster.scale_factor * 4,
                "plan": repr(res.plan),
                "tasks_per_iteration": res.stats["tasks"]
                / iterations,  # one per worker per block (+ setup, gather)
                "exchange_bytes_per_iteration": exchange_bytes(res.plan, np.dtype(dtype).itemsize),
                "iterations": iterations,
                "loadavg_after": os.getloadavg()[0],
                "wall_s_per_iteration": wall / iterations,
                "pacing": counters,
                "cpu_s_per_worker_iteration": med([c["cpu_s"] for c in counters]) / iterations,
                "scheduler_delay": delay_spread(delays, pin_clock),
                "floor": floor,
            }
        )
    # Context against the serial run (one full core): the ideal iteration time of
    # 4 equal workers at `scale` of a core each is serial / (4 * scale), capped by
    # the 2 real cores.
    ideal = serial_s / min(4 * st["scale"], float(os.cpu_count() or 1))
    st["serial_s"] = serial_s
    st["speedup_vs_serial"] = serial_s / st["iteration_time_median"]
    st["ideal_s"] = ideal
    st["efficiency_vs_ideal"] = ideal / st["iteration_time_median"]
    return st


# --------------------------------------------------------------------------
# report
# --------------------------------------------------------------------------


def format_report(out: dict[str, Any]) -> str:
    """Human-readable tables of the results."""
    n, m, l, s = out["size"]
    p1 = out["single"]
    lines = [
        f"dask_rpm engine benchmark: n-m-l = {n}-{m}-{l}, s = {s}, {out['dtype']}, "
        f"{out['machine']['cores']} cores ({out['machine']['cpu']}), shared machine",
        f"load average at start {out['machine']['loadavg_start'][0]:.2f}, at end {out['loadavg_end'][0]:.2f}; "
        f"total {out['elapsed_s']:.0f} s",
        "",
        f"1. One worker, one rectangle vs fit_serial (1 BLAS thread each; {p1['iterations_per_fit']} "
        f"iterations per fit, {len(p1['rounds'])} interleaved rounds)",
        f"   {'round':>5} {'order':>5} {'load':>5} {'serial s/it':>11} {'dist s/it':>9} {'compute':>8} "
        f"{'e2e':>7} {'ratio':>6}"
        + (f" {'dist(M) s/it':>12} {'ratio(M)':>8}" if "ratio_malloc_median" in p1 else ""),
    ]
    for r in p1["rounds"]:
        lines.append(
            f"   {r['round']:>5} {r['order']:>5} {r['loadavg']:>5.1f} {r['serial_s']:>11.4f} "
            f"{r['dist_s']:>9.4f} {r['dist_compute_s']:>8.4f} {r['dist_wall_s']:>7.4f} {r['ratio']:>6.3f}"
            + (
                f" {r['dist_malloc_s']:>12.4f} {r['ratio_malloc']:>8.3f}"
                if "ratio_malloc" in r
                else ""
            )
        )
    ok1 = "MET" if p1["ratio_median"] <= TARGET_RATIO else "MISSED"
    lines += [
        f"   median {'':>11} {p1['serial_s_median']:>11.4f} {p1['dist_s_median']:>9.4f} "
        f"{p1['dist_compute_s_median']:>8.4f} {p1['dist_wall_s_median']:>7.4f} {p1['ratio_median']:>6.3f}"
        + (
            f" {p1['dist_malloc_s_median']:>12.4f} {p1['ratio_malloc_median']:>8.3f}"
            if "ratio_malloc_median" in p1
            else ""
        ),
        f"   ratio distributed/serial, median of paired rounds: {p1['ratio_median']:.3f} "
        f"(target <= {TARGET_RATIO}: {ok1}); fastest/fastest: {p1['ratio_of_minima']:.3f}; "
        f"end-to-end incl. scatter/setup: {p1['ratio_wall_median']:.3f}",
        f"   of which worker compute (forward+backward+modify)/serial: {p1['compute_ratio_median']:.3f}; "
        f"non-compute per iteration: {1e3 * p1['dist_gap_s_median']:.1f} ms",
        f"   CPU seconds per iteration (load-robust): serial {p1['serial_cpu_s_median']:.4f}, worker "
        f"{p1['dist_cpu_s_median']:.4f}, ratio {p1['cpu_ratio_median']:.3f}",
    ]
    if "ratio_malloc_median" in p1:
        lines.append(
            f"   (M) same worker without Dask's MALLOC_TRIM_THRESHOLD_=65536: "
            f"ratio {p1['ratio_malloc_median']:.3f} "
            f"median, {p1['ratio_malloc_of_minima']:.3f} fastest/fastest"
        )
    lines += [
        "   distributed phases (median s): "
        + ", ".join(f"{k} {v:.4f}" for k, v in p1["last_fit_phase_medians"].items()),
        f"   same result as serial: max |dW,dV| {p1['max_abs_weight_diff_vs_serial']:.2e}, "
        f"max |d error| {p1['max_abs_error_diff_vs_serial']:.2e}",
    ]
    if p1.get("floor"):
        f = p1["floor"]
        lines.append(
            f"   latency floor (n-m-l-s {'-'.join(map(str, f['size']))}, {f['tasks_per_iteration']} "
            f"tasks/it): {1e3 * f['iteration_time_median']:.1f} ms/iteration"
        )
    lines += [
        "",
        "2. Four workers, SRPM plan on equal speeds: overhead = iteration time - slowest worker's "
        "(forward + backward + modify)",
        f"   {'run':<38} {'scale':>5} {'it s':>6} {'comp s':>6} {'ovh s':>6} {'ovh %':>5} {'p10 %':>5} "
        f"{'tot %':>5} {'bar %':>5} {'floor ms':>8} {'wall/cpu':>8} {'overrun':>7} {'vs serial':>9}",
    ]
    for key in ("padded", "raw"):
        r = out.get(key)
        if not r:
            continue
        wc = med([c["wall_over_cpu"] for c in r["pacing"]])
        over = sum(c["overruns"] for c in r["pacing"]) / max(
            1, sum(c["blocks"] for c in r["pacing"])
        )
        fl = f"{1e3 * r['floor']['iteration_time_median']:.1f}" if r.get("floor") else "-"
        lines.append(
            f"   {r['kind']:<38} {r['scale']:>5.2f} {r['iteration_time_median']:>6.3f} "
            f"{r['max_compute_median']:>6.3f} {r['overhead_median']:>6.3f} "
            f"{100 * r['overhead_fraction_median']:>5.1f} {100 * r['overhead_fraction_p10']:>5.1f} "
            f"{100 * r['overhead_fraction_total']:>5.1f} {100 * r['overhead_vs_barrier_fraction_median']:>5.1f} "
            f"{fl:>8} {wc:>8.2f} {100 * over:>6.0f}% {r['speedup_vs_serial']:>8.2f}x"
        )
    lines += [
        "   (ovh = iteration - slowest worker's compute: median, 10th percentile, share of total time; bar % = "
        "iteration - sum over phases of the slowest worker's phase, i.e. imbalance excluded; wall/cpu of paced "
        "blocks, 1/scale if the emulation holds; overrun = paced blocks slower than their target)",
    ]
    for key in ("padded", "raw"):
        r = out.get(key)
        if not r:
            continue
        ex = r["exchange_bytes_per_iteration"]
        lines += [
            f"   {r['kind']}: {r['iterations_used']} iterations used (first dropped); "
            f"load after {r['loadavg_after']:.1f}; "
            f"scheduler_delay spread {1e3 * r['scheduler_delay']['spread_s']:.1f} ms; "
            f"negative cross-task phases {r['negative_phase_values']}",
            "     phases (slowest worker, median s): "
            + ", ".join(f"{k} {v:.3f}" for k, v in r["phase_max_over_workers_median"].items())
            + f"; CPU per worker-iteration {r['cpu_s_per_worker_iteration']:.3f} s",
        ]
    r = out.get("padded")
    if r:
        ok2 = "MET" if r["overhead_fraction_median"] <= GOAL_OVERHEAD else "MISSED"
        ex = r["exchange_bytes_per_iteration"]
        lines += [
            f"   plan: {r['plan']}; {r['tasks_per_iteration']:.2f} tasks/iteration; exchanged per iteration: "
            f"vertical {ex['vertical'] / 1e6:.1f} MB, horizontal {ex['horizontal'] / 1e6:.1f} MB",
            f"   EMULATED overhead fraction: {100 * r['overhead_fraction_median']:.1f} % median "
            f"({100 * r['overhead_fraction_total']:.1f} % of total time; goal <= {100 * GOAL_OVERHEAD:.0f} %: {ok2})",
            f"   {r['label']}",
        ]
    if out.get("raw"):
        r = out["raw"]
        lines.append(
            f"   RAW (unpadded) overhead fraction: {100 * r['overhead_fraction_median']:.1f} %: 4 x 1.0 core "
            f"demanded on {out['machine']['cores']} cores, so task times include waiting for a core ('compute' is "
            f"inflated); speed-up vs 1-core serial {r['speedup_vs_serial']:.2f}x (at most {out['machine']['cores']})"
        )
    lines += [
        "",
        "Multi-worker figures on one machine are EMULATED heterogeneity, not hardware figures.",
    ]
    return "\n".join(lines)


def _jsonable(obj: Any) -> Any:
    """Plain JSON: numpy scalars to Python numbers, NaN/inf to null, tuples to lists."""
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, (np.integer, int)) and not isinstance(obj, bool):
        return int(obj)
    if isinstance(obj, (np.floating, float)):
        return float(obj) if np.isfinite(obj) else None
    return obj


def wait_for_load(limit: float, longest: float) -> None:
    """Sleep until the 1-minute load average drops below ``limit`` or ``longest`` seconds pass."""
    t = time.perf_counter()
    while os.getloadavg()[0] >= limit and time.perf_counter() - t < longest:
        log(f"load average {os.getloadavg()[0]:.2f} >= {limit}: waiting")
        time.sleep(15)


def parse_size(text: str) -> tuple[int, int, int, int]:
    """``"n,m,l,s"`` -> four positive ints."""
    parts = [int(p) for p in text.replace("x", ",").split(",") if p.strip()]
    if len(parts) != 4 or min(parts) < 1:
        raise argparse.ArgumentTypeError(f"--size wants n,m,l,s (four positive ints), got {text!r}")
    return parts[0], parts[1], parts[2], parts[3]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--size", type=parse_size, default=None, help="n,m,l,s (default 1024,2048,64,16384)"
    )
    ap.add_argument(
        "--quick",
        action="store_true",
        help=f"smaller size {','.join(map(str, QUICK_SIZE))}, ~1-2 min",
    )
    ap.add_argument(
        "--iterations",
        type=int,
        default=None,
        help="iterations per fit in part 1 (default 4; 8 with --quick)",
    )
    ap.add_argument(
        "--rounds", type=int, default=None, help="interleaved serial/distributed rounds (default 5)"
    )
    ap.add_argument(
        "--multi-iterations",
        type=int,
        default=None,
        help="iterations of each 4-worker run; the first is dropped (default 16; 30 with --quick)",
    )
    ap.add_argument(
        "--floor-iterations",
        type=int,
        default=30,
        help="iterations of the latency-floor runs (0: skip)",
    )
    ap.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    ap.add_argument(
        "--scale",
        type=float,
        default=None,
        help="EMULATED 4-worker run: fraction of a core per unit speed "
        "(default: local_cluster's auto scale)",
    )
    ap.add_argument(
        "--no-raw", action="store_true", help="skip the raw (unpadded, contended) 4-worker run"
    )
    ap.add_argument(
        "--no-malloc-variant",
        action="store_true",
        help="part 1 without the extra arm: a worker without Dask's MALLOC_TRIM_THRESHOLD_",
    )
    ap.add_argument(
        "--dask-clock",
        action="store_true",
        help="keep Dask's heartbeat clock-offset correction of task times (default: pin it to 0, "
        "since every process runs on this host)",
    )
    ap.add_argument(
        "--wait-load",
        type=float,
        default=None,
        metavar="L",
        help="before starting, wait (up to --wait-max s) until the 1-minute load average is below L",
    )
    ap.add_argument(
        "--wait-max", type=float, default=600.0, help="longest wait for --wait-load (s)"
    )
    ap.add_argument(
        "--json",
        nargs="?",
        const="-",
        default=None,
        metavar="PATH",
        help="write the numbers as JSON to PATH, or to stdout (table then goes to stderr)",
    )
    args = ap.parse_args(argv)

    size = args.size or (QUICK_SIZE if args.quick else FULL_SIZE)
    iterations = args.iterations or (8 if args.quick else 4)
    rounds = args.rounds or 5
    multi_its = args.multi_iterations or (30 if args.quick else 16)
    n, m, l, s = size
    lr = 0.1 / s  # updates are sums over s samples; keep the step size-independent
    logging.getLogger("dask_rpm").setLevel(logging.ERROR)
    logging.getLogger("distributed").setLevel(logging.ERROR)

    if args.wait_load is not None:
        wait_for_load(args.wait_load, args.wait_max)
    out: dict[str, Any] = {
        "benchmark": "dask_rpm engine (issue #3)",
        "command": " ".join(
            ["python", "benchmarks/engine.py", *(sys.argv[1:] if argv is None else argv)]
        ),
        "size": list(size),
        "dtype": args.dtype,
        "learning_rate": lr,
        "machine": machine_info(),
        "blas_client": pin_blas(),
        "targets": {"ratio": TARGET_RATIO, "overhead_fraction": GOAL_OVERHEAD},
    }
    log(
        f"size n-m-l-s {n}-{m}-{l}-{s} {args.dtype}; {rounds} rounds x {iterations} iterations; "
        f"4-worker runs {multi_its} iterations"
    )
    x, d = make_data(n, l, s, args.dtype)

    single = bench_single(
        x,
        d,
        m=m,
        iterations=iterations,
        rounds=rounds,
        lr=lr,
        dtype=args.dtype,
        floor_iterations=args.floor_iterations,
        pin_clock=not args.dask_clock,
        malloc_variant=not args.no_malloc_variant,
    )
    out["single"] = single

    serial_s = single["serial_s_median"]
    out["padded"] = bench_multi(
        x,
        d,
        m=m,
        iterations=multi_its,
        lr=lr,
        dtype=args.dtype,
        padded=True,
        scale=args.scale,
        serial_s=serial_s,
        floor_iterations=args.floor_iterations,
        pin_clock=not args.dask_clock,
    )
    if not args.no_raw:
        out["raw"] = bench_multi(
            x,
            d,
            m=m,
            iterations=multi_its,
            lr=lr,
            dtype=args.dtype,
            padded=False,
            serial_s=serial_s,
            floor_iterations=args.floor_iterations,
            pin_clock=not args.dask_clock,
        )
    out["loadavg_end"] = list(os.getloadavg())
    out["elapsed_s"] = time.perf_counter() - _T0

    text = format_report(out)
    to_stdout_json = args.json == "-"
    print(text, file=sys.stderr if to_stdout_json else sys.stdout, flush=True)
    if args.json:
        doc = json.dumps(_jsonable(out), indent=2, allow_nan=False)
        if to_stdout_json:
            print(doc)
        else:
            with open(args.json, "w") as fh:
                fh.write(doc + "\n")
    return out


if __name__ == "__main__":
    main()
