"""Probing stage: measure worker abilities and links before planning (issue #4).

:func:`probe` runs the real BP kernels (forward, output delta, backward; the
work of one rectangle) on every worker at once and returns each worker's
throughput in *work units per second*, a work unit being one (hidden unit x
sample) pair of a rectangle, the unit in which the planner measures area
(SPEC section 3). ``dask_rpm.fit(..., abilities="probe")`` uses these
throughputs as the initial abilities.

How the kernel probe is sized
-----------------------------
The probe block has the job's ``n`` inputs and ``l`` outputs and, at most,
the average rectangle of the job: ``ceil(m / N)`` hidden units by
``ceil(s / N)`` samples. Its shape matters (cache behaviour and the share of
the small ``l``-sized terms are those of training); its size does not, so it
is shrunk, keeping its aspect ratio, until one kernel pass takes at most an
eighth of ``rpm.probe.target-seconds`` on the client (a quick calibration
with BLAS limited to one thread, like the workers). A repetition runs the
pass ``loops`` times inside one :func:`dask_rpm.emulation.pace` block, so
tiny jobs still give repetitions long enough to time, and a worker many
times slower than the client still finishes a pass within a repetition.

Every worker first runs one warm-up repetition (discarded). Its time sets
each worker's ``loops`` so that one timed repetition takes about
``target-seconds`` on *every* worker: all workers are then busy for the same
wall time, as in a balanced training iteration, so they contend for the
machine as they will during training, and a change of the machine's load
hits them alike. Then ``repeats`` timed repetitions run, one at a time per
worker (even on multi-threaded workers) and concurrently across workers. A task times its own kernel block with ``time.perf_counter``
(scheduling and transfers are excluded) and the throughput is
``work / trimmed-mean(seconds)``: the mean of the repetitions left after
cutting an eighth at each end (see :func:`_robust_mean` for why not the
median). With the defaults (16 repetitions of 30 ms) the kernel probe took
about 0.9 s of wall time on the 2-core development machine (warm-up and
queueing included) and the link measurement about 0.3 s.

How links are measured
----------------------
On a few worker pairs ``a -> b`` (neighbours in worker order) a task on ``b``
depends on an array produced on ``a``: a tiny one (latency) and a larger one
(``rpm.probe.link-bytes``, bandwidth). The transfer time is the ``"transfer"``
start/stop entry that Dask's worker attaches to the consuming task (the same
entry it reports to the scheduler), read inside that task. It covers exactly
the fetch - request, serialisation, the wire, deserialisation - and none of
the scheduler hops around it, which timing from the producer's end to the
consumer's start would include; and unlike the worker's
``transfer_incoming_log`` it has no 1 ms floor. The hops run as one chain, so
no two transfers overlap. ``latency`` is the median tiny-transfer time (one
Dask fetch, i.e. what a message costs here) and ``bandwidth`` is
``(big - tiny bytes) / (median big - median tiny time)``.
"""

from __future__ import annotations

import math
import statistics
import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any

import numpy as np

from . import config
from .emulation import PLUGIN_NAME, emulation_label_async, pace
from .kernels import backward_partial, block_work, forward_partial, init_weights, output_delta

__all__ = ["probe", "probe_network", "link_class_pairs"]

#: Rough upper bound on the flops of one calibration pass, so that calibrating
#: a huge job never runs a huge block (about 0.1 s on a slow core).
_CALIBRATION_FLOPS = 1.0e8
#: Upper bound on kernel passes per repetition (keeps absurd configs finite).
_MAX_LOOPS = 100_000
#: One kernel pass takes at most target-seconds / this at full speed on the
#: client, so a worker many times slower still finishes a pass in about a
#: repetition's time, and fast workers average over many passes.
_PASSES_PER_TARGET = 8
#: CPU seconds of unpaced kernel passes before each timed block (see _t_probe).
_WARM_CPU_SECONDS = 0.002
#: Fraction of the repetitions cut at each end before averaging their times.
_TRIM = 0.125
#: Serialises probe repetitions within one worker process.
_REPETITION_LOCK = threading.Lock()


# --------------------------------------------------------------------------
# kernel block (runs on the workers and, once, in the client for calibration)
# --------------------------------------------------------------------------


def _block_data(n: int, m: int, l: int, s: int, dtype: str, seed: int) -> tuple[np.ndarray, ...]:
    """Synthetic inputs, teachers and weights of one probe block (values are irrelevant)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((s, n)).astype(dtype)
    d = rng.uniform(0.1, 0.9, size=(s, l)).astype(dtype)
    W, V = init_weights(n, m, l, seed=seed, dtype=dtype)
    return x, d, W, V


def _kernel_pass(x: np.ndarray, d: np.ndarray, W: np.ndarray, V: np.ndarray) -> None:
    """One rectangle's BP work: forward, output delta, backward (as in training)."""
    f, partial = forward_partial(x, W, V)
    delta2, _ = output_delta(partial, d)
    backward_partial(x, f, V, delta2)


def _t_probe(
    block: tuple[int, int, int, int], loops: int, dtype: str, seed: int
) -> tuple[float, int, float]:
    """One repetition on a worker: ``loops`` kernel passes in one paced block.

    Returns ``(seconds, overruns, cpu_seconds)``: the block's wall time, how
    many EMULATED paced blocks overran their target meanwhile (0 without
    emulation; an overrun means other load, not the emulated speed, set the
    time) and the block's CPU time. Repetitions on one worker process run one
    at a time (a lock), even on a worker with several threads, as one
    rectangle task would.
    """
    n, m, l, s = block
    x, d, W, V = _block_data(n, m, l, s, dtype, seed)
    with _REPETITION_LOCK:
        # Unpaced, untimed passes first: a thread that idled (a slow worker
        # sleeps most of the time) spends more CPU on its next millisecond or
        # so of work (cold caches). Measured here: 10-30 % more CPU per pass
        # for the slower workers, whose timed blocks are shorter, without
        # this; ~0 with it.
        c_start = time.thread_time()
        _kernel_pass(x, d, W, V)
        while time.thread_time() - c_start < _WARM_CPU_SECONDS:
            _kernel_pass(x, d, W, V)
        plugin = _worker_plugin(PLUGIN_NAME)
        overruns0 = getattr(plugin, "overruns", 0)
        t0, c0 = time.perf_counter(), time.thread_time()
        work = loops * (block_work("forward", s, m, n, l) + block_work("backward", s, m, n, l))
        # work-paced (no key): a tiny job's block, bound by per-call overhead,
        # falls back to its own CPU time, which the warm-up above keeps honest
        with pace(work=work, dtype=dtype):
            for _ in range(loops):
                _kernel_pass(x, d, W, V)
        seconds = time.perf_counter() - t0
        cpu = time.thread_time() - c0
    return seconds, int(getattr(plugin, "overruns", 0) - overruns0), cpu


def _robust_mean(seconds: np.ndarray, trim: float) -> np.ndarray:
    """Per column (worker): mean of the finite values after cutting ``trim`` at each end.

    Why not the median: on a shared host the CPU cost of a kernel pass is
    often *bimodal* (measured here: ~0.44 or ~0.65 ms per NETtalk pass, the
    mode switching every 50-100 ms, even with one worker alone). The median
    of a few such repetitions jumps between the modes: over 15 probes of 16
    repetitions (three job shapes, EMULATED speeds 1 : 0.5 : 0.25) it missed
    the speed ratios by 8.3 % on average and 22 % at worst, this trimmed mean
    by 6.2 % and 9 %. Like the median it drops outliers (a pause, a hiccup).
    """
    out = np.empty(seconds.shape[1])
    for i in range(seconds.shape[1]):
        col = np.sort(seconds[np.isfinite(seconds[:, i]), i])
        k = int(len(col) * trim)
        out[i] = col[k : len(col) - k].mean() if len(col) else np.nan
    return out


def _worker_plugin(name: str) -> Any:
    """The running worker's plugin ``name``, or None (not on a worker / not installed)."""
    from distributed import get_worker

    try:
        return get_worker().plugins.get(name)
    except ValueError:
        return None


def _calibrate(n: int, m: int, l: int, s: int, dtype: str, target: float) -> tuple[int, int, float]:
    """Shrink an ``m x s`` block until one pass takes at most ``target`` seconds here.

    Returns ``(m_p, s_p, seconds_per_pass)``. Timed on the client with BLAS
    limited to one thread, like the workers' (only the block *size* depends
    on it; the abilities come from the workers' own timings).
    """
    try:
        from threadpoolctl import threadpool_limits

        limiter: Any = threadpool_limits(limits=1)
    except ImportError:  # pragma: no cover - threadpoolctl is optional
        limiter = None
    try:
        # a cheap flop estimate first, so the first timed block is never huge
        flops = 4.0 * m * s * (n + 1.5 * l) + 1.0
        if flops > _CALIBRATION_FLOPS:
            m, s = _shrink(m, s, _CALIBRATION_FLOPS / flops)
        for _ in range(4):
            data = _block_data(n, m, l, s, dtype, 0)
            _kernel_pass(*data)  # warm
            t = math.inf
            for _ in range(3):
                t0 = time.perf_counter()
                _kernel_pass(*data)
                t = min(t, time.perf_counter() - t0)
            if t <= target or (m == 1 and s == 1):
                break
            # 0.8: aim a little under the target, passes do not scale exactly
            m, s = _shrink(m, s, 0.8 * target / t)
        return m, s, max(t, 1e-7)
    finally:
        if limiter is not None:
            limiter.restore_original_limits()


def _shrink(m: int, s: int, factor: float) -> tuple[int, int]:
    """Scale the block area by ``factor`` (< 1), keeping the aspect ratio."""
    r = math.sqrt(max(factor, 0.0))
    return max(1, int(m * r)), max(1, int(s * r))


# --------------------------------------------------------------------------
# links
# --------------------------------------------------------------------------


def _t_payload(nbytes: int, previous: Any = None) -> np.ndarray:
    """Array of about ``nbytes`` bytes to be fetched by the next hop."""
    return np.ones(max(1, nbytes // 8), dtype="float64")


def _t_receive(payload: np.ndarray) -> tuple[float, int]:
    """Transfer seconds of ``payload`` into this worker, and its size in bytes.

    Reads the ``"transfer"`` start/stops Dask's worker attached to this task
    when it fetched the dependency (NaN if nothing was transferred).
    """
    from distributed import get_worker

    worker = get_worker()
    ts = worker.state.tasks.get(worker.get_current_task())
    spans = [
        ss["stop"] - ss["start"]
        for ss in (ts.startstops if ts is not None else ())
        if ss.get("action") == "transfer"
    ]
    return (float(sum(spans)) if spans else float("nan")), int(payload.nbytes)


def _host(address: str) -> str:
    """The host part of a worker address (``tcp://10.0.0.5:4321`` -> ``10.0.0.5``)."""
    rest = address.split("://", 1)[-1]
    return rest.rsplit(":", 1)[0] if ":" in rest else rest


def link_class_pairs(
    addresses: Sequence[str], groups: Sequence[Any], per_class: int
) -> dict[str, list[tuple[int, int]]]:
    """A few worker pairs per link class, by position in ``addresses``.

    ``"host"``: same host and same group; ``"group"``: same group, other
    host; ``"across"``: different groups (:meth:`dask_rpm.cost.Network.link_class`).
    Pairs are taken in worker order, spreading over different first workers
    before reusing one, at most ``per_class`` per class; classes without a
    pair are left out.
    """
    if len(groups) != len(addresses):
        raise ValueError(
            f"{len(groups)} group labels given for {len(addresses)} workers; give one per worker"
        )
    hosts = [_host(a) for a in addresses]
    out: dict[str, list[tuple[int, int]]] = {}
    used: dict[str, set[int]] = {}
    candidates = [(i, j) for i in range(len(addresses)) for j in range(len(addresses)) if i != j]
    # first pass: pairs whose first worker is not used yet in that class; second pass: any
    for fresh in (True, False):
        for i, j in candidates:
            if groups[i] != groups[j]:
                cls = "across"
            elif hosts[i] == hosts[j]:
                cls = "host"
            else:
                cls = "group"
            got = out.setdefault(cls, [])
            seen = used.setdefault(cls, set())
            if len(got) >= per_class or (i, j) in got or (fresh and (i in seen or j in seen)):
                continue
            got.append((i, j))
            seen.update((i, j))
    return {c: v for c, v in out.items() if v}


async def _measure_links(
    client: Any,
    addresses: Sequence[str],
    token: str,
    *,
    repeats: int,
    big_bytes: int,
    pairs: int,
    links: Sequence[tuple[int, int]] | None = None,
) -> dict[str, Any]:
    """Latency and bandwidth from one chain of worker-to-worker transfers (``links``: the pairs to use)."""
    n_workers = len(addresses)
    if n_workers < 2:
        return {
            "latency": math.nan,
            "bandwidth": math.nan,
            "link_note": "one worker: no worker-to-worker transfer to measure",
        }
    if links is None:  # neighbours in worker order: 0->1, 1->2, ... (2 workers: 0->1 and 1->0)
        links = [(i, (i + 1) % n_workers) for i in range(min(pairs, n_workers))]
    # per link: a warm-up hop (opens the connection), then tiny and big hops alternating
    hops: list[tuple[int, int, int, bool]] = []
    for a, b in links:
        hops.append((a, b, 8, False))
        for _ in range(repeats):
            hops.append((a, b, 8, True))
            hops.append((a, b, big_bytes, True))
    name = f"rpm-link-{token}"
    previous = None
    receivers = []
    for k, (a, b, nbytes, _) in enumerate(hops):
        # the payload waits for the previous hop's receipt, so transfers never overlap
        payload = client.submit(
            _t_payload,
            nbytes,
            previous,
            key=(name, k, a),
            workers=[addresses[a]],
            allow_other_workers=False,
            pure=False,
        )
        previous = client.submit(
            _t_receive,
            payload,
            key=(name, k, b),
            workers=[addresses[b]],
            allow_other_workers=False,
            pure=False,
        )
        receivers.append(previous)
    results = await client.gather(receivers)
    del receivers, previous, payload
    tiny = [r[0] for r, h in zip(results, hops) if h[3] and h[2] == 8 and math.isfinite(r[0])]
    big = [r for r, h in zip(results, hops) if h[3] and h[2] != 8 and math.isfinite(r[0])]
    out: dict[str, Any] = {
        "links": ", ".join(f"{a}->{b}" for a, b in links),
        "link_repeats": int(repeats),
        "link_bytes": int(big[0][1]) if big else int(big_bytes),
    }
    if not tiny or not big:
        out.update(
            latency=math.nan,
            bandwidth=math.nan,
            link_note="no transfer was recorded (workers may share one process)",
        )
        return out
    latency = statistics.median(tiny)
    t_big = statistics.median(r[0] for r in big)
    nbytes = statistics.median(r[1] for r in big)
    # subtract the fixed cost of a fetch; if noise makes that meaningless, use the raw rate
    extra = t_big - latency
    bandwidth = (nbytes - 8) / extra if extra > 0.1 * t_big else nbytes / t_big
    out.update(latency=float(latency), bandwidth=float(bandwidth))
    return out


# --------------------------------------------------------------------------
# the probe
# --------------------------------------------------------------------------


def _check_args(
    shape: Any, samples: Any, repeats: Any, max_seconds: Any, target: Any
) -> tuple[tuple[int, int, int], int, int, float, float]:
    def whole(v: Any) -> bool:
        return isinstance(v, (int, np.integer)) and not isinstance(v, bool)

    try:
        dims = tuple(shape)
    except TypeError:
        dims = ()
    if len(dims) != 3 or not all(whole(v) and v >= 1 for v in dims):
        raise ValueError(
            f"shape={shape!r}; give (n, m, l): inputs, hidden units and outputs, "
            f"three whole numbers >= 1"
        )
    if not whole(samples) or samples < 1:
        raise ValueError(
            f"samples={samples!r}; give the number of training samples, a whole number >= 1"
        )
    if not whole(repeats) or repeats < 1:
        raise ValueError(f"repeats={repeats!r}; give a whole number of timed repetitions >= 1")
    for name, v in (("max_seconds", max_seconds), ("probe.target-seconds", target)):
        if not (
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0
        ):
            raise ValueError(f"{name}={v!r}; give a number of seconds > 0")
    n, m, l = (int(v) for v in dims)
    return (n, m, l), int(samples), int(repeats), float(max_seconds), float(target)


async def _probe_async(
    client: Any,
    *,
    shape: Sequence[int],
    samples: int,
    dtype: str | None = None,
    workers: Sequence[str] | None = None,
    repeats: int | None = None,
    max_seconds: float | None = None,
    groups: Sequence[Any] | None = None,
) -> Any:
    """Asynchronous :func:`probe` (the engine awaits it for ``abilities="probe"``)."""
    import xarray as xr

    from .engine import ordered_workers

    started = time.perf_counter()
    (n, m, l), s, repeats, max_seconds, target = _check_args(
        shape,
        samples,
        config.get("probe.repeats", repeats),
        config.get("probe.max-seconds", max_seconds),
        config.get("probe.target-seconds"),
    )
    dtype = str(np.dtype(config.get("train.dtype", dtype)))

    info = await client.scheduler.identity(n_workers=-1)
    known = ordered_workers(info)
    addresses = known if workers is None else list(workers)
    if not addresses:
        raise ValueError(
            "no workers to probe; start some (e.g. dask_rpm.local_cluster()) and retry"
        )
    unknown = [a for a in addresses if a not in info["workers"]]
    if unknown:
        raise ValueError(f"worker(s) {unknown} are not in the cluster; its workers are {known}")
    if len(set(addresses)) != len(addresses):
        raise ValueError(f"workers={addresses} lists a worker more than once")
    n_workers = len(addresses)
    if groups is not None:
        pairs_by_class = link_class_pairs(
            addresses, list(groups), int(config.get("probe.link-pairs"))
        )

    # Each worker's share of the budget: warm-up plus `repeats` repetitions.
    target = min(target, max_seconds / (repeats + 1))
    m_p, s_p, t_pass = _calibrate(
        n, -(-m // n_workers), l, -(-s // n_workers), dtype, target / _PASSES_PER_TARGET
    )
    loops0 = int(min(_MAX_LOOPS, max(1, round(target / t_pass))))
    block = (n, m_p, l, s_p)
    token = uuid.uuid4().hex[:10]
    name = f"rpm-probe-{token}"

    def submit(rep: int, i: int, loops: int) -> Any:
        return client.submit(
            _t_probe,
            block,
            loops,
            dtype,
            rep,
            key=(name, rep, i),
            workers=[addresses[i]],
            allow_other_workers=False,
            pure=False,
        )

    # Warm-up (repetition 0, discarded): about a quarter of a target at full speed.
    compute_start = time.perf_counter()
    warm_loops = max(1, loops0 // 4)
    warm_futures = [submit(0, i, warm_loops) for i in range(n_workers)]
    warm_seconds = np.asarray([r[0] for r in await client.gather(warm_futures)], dtype=float)

    # Size every worker's repetition to ~target wall seconds: all workers then
    # run their repetitions side by side, over the same wall-time windows, so
    # a change in the machine's load (which moves the CPU cost of a pass by
    # tens of percent on a shared host) hits them alike. (Equal passes per
    # worker instead spread a slow worker's repetitions over a longer window
    # and measured ratios worse here.)
    per_pass = np.maximum(warm_seconds / warm_loops, 1e-9)
    loops = np.clip(np.round(target / per_pass), 1, _MAX_LOOPS).astype(int)
    # A worker too slow for even one pass per target gets fewer repetitions (budget).
    rest = np.maximum(max_seconds - warm_seconds, 0.0)
    reps = np.clip(np.floor(rest / (loops * per_pass)), 1, repeats).astype(int)

    # All at once: each worker queues its repetitions and runs them back to
    # back (the lock in _t_probe), with no scheduler round trip between them.
    timed_futures = [
        [submit(r + 1, i, int(loops[i])) for r in range(int(reps[i]))] for i in range(n_workers)
    ]
    timed = await client.gather(timed_futures)
    compute_seconds = time.perf_counter() - compute_start
    del warm_futures, timed_futures

    seconds = np.full((repeats, n_workers), np.nan)
    cpu = np.full((repeats, n_workers), np.nan)
    overruns = np.zeros(n_workers, dtype=int)
    for i, col in enumerate(timed):
        seconds[: len(col), i] = [r[0] for r in col]
        cpu[: len(col), i] = [r[2] for r in col]
        overruns[i] = sum(r[1] for r in col)
    work = loops.astype(float) * m_p * s_p
    throughput = work / _robust_mean(seconds, _TRIM)

    link_start = time.perf_counter()
    links = await _measure_links(
        client,
        addresses,
        token,
        repeats=int(config.get("probe.link-repeats")),
        big_bytes=int(config.get("probe.link-bytes")),
        pairs=int(config.get("probe.link-pairs")),
    )
    if groups is not None:  # latency and bandwidth per link class, a few pairs each
        for cls, pairs in pairs_by_class.items():
            got = await _measure_links(
                client,
                addresses,
                f"{token}-{cls}",
                repeats=int(config.get("probe.link-repeats")),
                big_bytes=int(config.get("probe.link-bytes")),
                pairs=len(pairs),
                links=pairs,
            )
            links.update(
                {
                    f"latency_{cls}": got["latency"],
                    f"bandwidth_{cls}": got["bandwidth"],
                    f"links_{cls}": got.get("links", ""),
                }
            )
        links["groups"] = ",".join(map(str, groups))
    link_seconds = time.perf_counter() - link_start

    ds = xr.Dataset(
        {
            "throughput": (
                "worker",
                throughput,
                {
                    "units": "work units/s",
                    "long_name": "kernel throughput",
                    "description": "work of one repetition / trimmed mean of the repetition seconds "
                    "(1/8 cut at each end); one work unit "
                    "is one (hidden unit x sample) pair of forward, output delta and "
                    "backward - the unit of rectangle area",
                },
            ),
            "ability": (
                "worker",
                throughput / throughput.sum(),
                {"units": "1", "description": "throughput normalised to sum 1"},
            ),
            "seconds": (
                ("repeat", "worker"),
                seconds,
                {
                    "units": "s",
                    "description": "wall time of each timed repetition's paced kernel block, measured "
                    "inside the task (NaN: skipped to stay within max_seconds)",
                },
            ),
            "cpu_seconds": (
                ("repeat", "worker"),
                cpu,
                {
                    "units": "s",
                    "description": "CPU time of the task's thread in each timed repetition's kernel "
                    "block (with EMULATED speeds, seconds ~ cpu_seconds / speed)",
                },
            ),
            "warmup_seconds": (
                "worker",
                warm_seconds,
                {
                    "units": "s",
                    "description": f"discarded warm-up repetition ({warm_loops} passes)",
                },
            ),
            "loops": (
                "worker",
                loops,
                {"units": "1", "description": "kernel passes over the probe block per repetition"},
            ),
            "overruns": (
                "worker",
                overruns,
                {
                    "units": "1",
                    "description": "EMULATED clusters only: timed repetitions whose paced block "
                    "overran its target, i.e. other load set the time (0 elsewhere)",
                },
            ),
            "work": (
                "worker",
                work,
                {
                    "units": "work units",
                    "description": "loops x block hidden units x block samples",
                },
            ),
        },
        coords={
            "worker": np.arange(n_workers),
            "address": ("worker", np.asarray(addresses, dtype=object)),
            "repeat": np.arange(repeats),
        },
        attrs={
            "title": "dask_rpm probe: worker throughput and links",
            "token": token,
            "shape": f"{n}-{m}-{l}",
            "samples": s,
            "block_inputs": n,
            "block_hidden": m_p,
            "block_outputs": l,
            "block_samples": s_p,
            "dtype": dtype,
            "repeats": repeats,
            "target_seconds": target,
            "calibration_pass_seconds": t_pass,
            "compute_seconds": compute_seconds,
            "link_seconds": link_seconds,
            "latency_units": "s",
            "bandwidth_units": "bytes/s",
            **links,
        },
    )
    emulation = await emulation_label_async(client)
    if emulation:
        ds.attrs["emulation"] = emulation
    ds.attrs["probe_seconds"] = time.perf_counter() - started
    return ds


def probe(
    client: Any = None,
    *,
    shape: Sequence[int],
    samples: int,
    dtype: str | None = None,
    workers: Sequence[str] | None = None,
    repeats: int | None = None,
    max_seconds: float | None = None,
    groups: Sequence[Any] | None = None,
) -> Any:
    """Measure every worker's BP throughput and the worker-to-worker links.

    Runs the real kernels on a block shaped like the job's rectangles on all
    workers at once, then times a few transfers between workers (see the
    module docstring for how, and why that way).

    Parameters
    ----------
    client : distributed.Client, optional
        Default :func:`distributed.get_client`. With an asynchronous client
        the result is an awaitable.
    shape : (int, int, int)
        The job's network ``(n, m, l)``: inputs, hidden units, outputs.
    samples : int
        The job's number of training samples ``s``.
    dtype : str, optional
        Kernel dtype; default ``rpm.train.dtype``.
    workers : sequence of str, optional
        Addresses to probe, in plan order; default all workers in
        :func:`dask_rpm.ordered_workers` order.
    repeats : int, optional
        Timed repetitions after one warm-up; default ``rpm.probe.repeats``.
    max_seconds : float, optional
        Kernel-probe budget per worker; default ``rpm.probe.max-seconds``.
    groups : sequence, optional
        A group label per worker (a SLURM group/partition, or an emulated
        node): links are then also measured per class - same host, same
        group, across groups - on up to ``rpm.probe.link-pairs`` pairs each
        (:func:`link_class_pairs`), into attributes ``latency_<class>`` and
        ``bandwidth_<class>``; :func:`probe_network` turns them into a
        :class:`dask_rpm.cost.Network` for the model and ``srpm-time``.

    Returns
    -------
    xarray.Dataset
        Indexed by ``worker`` (0..N-1, with coordinate ``address``):
        ``throughput`` (work units/s; index-aligned abilities), ``ability``
        (normalised), ``seconds`` and ``cpu_seconds`` (repeat, worker),
        ``warmup_seconds``, ``loops``, ``work``, ``overruns`` (EMULATED
        blocks that other load made late). Attributes: the probe block (``block_hidden``,
        ``block_samples``, ...), ``probe_seconds`` (total wall time of the
        probe), ``latency`` (s) and ``bandwidth`` (bytes/s) with the ``links``
        measured (NaN and a ``link_note`` with one worker), and ``emulation``
        when the cluster emulates speeds.

    Raises
    ------
    ValueError
        Malformed ``shape``, ``samples`` < 1, bad ``repeats`` /
        ``max_seconds``, or unknown workers.

    Examples
    --------
    >>> from distributed import Client
    >>> import dask_rpm
    >>> client = Client(dask_rpm.local_cluster([1.0, 0.5, 0.25]))  # doctest: +SKIP
    >>> ds = probe(client, shape=(203, 80, 26), samples=1024)  # doctest: +SKIP
    >>> ds["throughput"] / ds["throughput"].max()  # doctest: +SKIP
    """
    # validate before looking for a client: bad input fails fast and clearly
    _check_args(
        shape,
        samples,
        config.get("probe.repeats", repeats),
        config.get("probe.max-seconds", max_seconds),
        config.get("probe.target-seconds"),
    )
    if client is None:
        from distributed import get_client

        client = get_client()
    if groups is not None and workers is not None and len(groups) != len(workers):
        raise ValueError(
            f"{len(groups)} group labels given for {len(workers)} workers; give one per worker"
        )
    return client.sync(
        _probe_async,
        client,
        shape=shape,
        samples=samples,
        dtype=dtype,
        workers=workers,
        repeats=repeats,
        max_seconds=max_seconds,
        groups=groups,
    )


def probe_network(ds: Any, *, overhead: float | None = None) -> Any:
    """A :class:`dask_rpm.cost.Network` from a probe result: latency, bandwidth and link classes.

    Hosts come from the worker addresses, groups from the probe's ``groups``
    (when it measured link classes). Classes the probe did not measure fall
    back to the overall latency and bandwidth. ``overhead`` (seconds per
    message end) defaults to ``rpm.cost.overhead``.
    """
    from .cost import LINK_CLASSES, LinkClass, network_from_config

    a = ds.attrs
    base = network_from_config()
    lat = float(a.get("latency", math.nan))
    bw = float(a.get("bandwidth", math.nan))
    classes = {}
    for cls in LINK_CLASSES:
        lc, bc = (
            float(a.get(f"latency_{cls}", math.nan)),
            float(a.get(f"bandwidth_{cls}", math.nan)),
        )
        if math.isfinite(lc) and math.isfinite(bc) and bc > 0:
            classes[cls] = LinkClass(lc, bc)
    addresses = [str(v) for v in ds["address"].values]
    groups = tuple(str(a["groups"]).split(",")) if a.get("groups") else None
    return base._replace(
        latency=lat if math.isfinite(lat) else base.latency,
        bandwidth=bw if math.isfinite(bw) and bw > 0 else base.bandwidth,
        overhead=base.overhead if overhead is None else float(overhead),
        classes=classes or None,
        hosts=tuple(_host(x) for x in addresses) if classes else None,
        groups=groups,
    )
