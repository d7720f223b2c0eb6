"""The link probe: latency and bandwidth from a chain of worker-to-worker transfers."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from distributed import get_worker

__all__ = [
    "t_payload",
    "t_receive",
    "t_round_trip",
    "host",
    "link_class_pairs",
    "measure_links",
]


def t_payload(nbytes: int, previous: Any = None) -> np.ndarray:
    """Array of about ``nbytes`` bytes to be fetched by the next hop."""
    return np.ones(max(1, nbytes // 8), dtype="float64")


def t_receive(payload: np.ndarray) -> tuple[float, int]:
    """Transfer seconds of ``payload`` into this worker, and its size in bytes.

    Reads the ``"transfer"`` start/stops Dask's worker attached to this task
    when it fetched the dependency (NaN if nothing was transferred).
    """
    worker = get_worker()
    ts = worker.state.tasks.get(worker.get_current_task())
    spans = [
        ss["stop"] - ss["start"]
        for ss in (ts.startstops if ts is not None else ())
        if ss.get("action") == "transfer"
    ]
    return (float(sum(spans)) if spans else float("nan")), int(payload.nbytes)


async def t_round_trip(peer: str, count: int, dask_worker: Any = None) -> float:
    """Seconds of one small message to ``peer`` and back, from this worker's event loop (the
    median of ``count`` after a warm-up): the path of the engine's own messages, which a task
    dependency's transfer (:func:`t_receive`, about 1 ms more) is not."""
    rpc = dask_worker.rpc(peer)
    await rpc.identity()
    times = []
    for _ in range(max(int(count), 1)):
        t0 = time.perf_counter()
        await rpc.identity()
        times.append(time.perf_counter() - t0)
    return float(statistics.median(times))


def host(address: str) -> str:
    """The host part of a worker address (``tcp://10.0.0.5:4321`` -> ``10.0.0.5``)."""
    rest = address.split("://", 1)[-1]
    return rest.rsplit(":", 1)[0] if ":" in rest else rest


def link_class_pairs(
    addresses: Sequence[str], groups: Sequence[Any], per_class: int
) -> dict[str, list[tuple[int, int]]]:
    """A few worker pairs per link class, by position in ``addresses``.

    ``"host"``: same host and same group; ``"group"``: same group, other
    host; ``"across"``: different groups (:meth:`dask_rpm.comm.Interconnect.link_class`).
    Pairs are taken in worker order, spreading over different first workers
    before reusing one, at most ``per_class`` per class; classes without a
    pair are left out.
    """
    if len(groups) != len(addresses):
        raise ValueError(
            f"{len(groups)} group labels given for {len(addresses)} workers; give one per worker"
        )
    hosts = [host(a) for a in addresses]
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


async def measure_links(
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
            t_payload,
            nbytes,
            previous,
            key=(name, k, a),
            workers=[addresses[a]],
            allow_other_workers=False,
            pure=False,
        )
        previous = client.submit(
            t_receive,
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
