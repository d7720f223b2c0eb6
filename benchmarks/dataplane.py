"""Data-plane benchmark: what does an iteration cost now that workers talk directly?

Measured in one run on one (shared, noisy) 2-core machine; every figure is
labelled with the conditions it was measured under.

1. **Growth with N** (latency-bound size 64-64-8, s = 2048, equal speeds, no
   emulation): median iteration time for N = 1, 4, 8, 16, 32 workers, the
   SRPM plan for equal abilities, and the Dask tasks the scheduler handled per
   iteration (one per worker per block now; five levels per iteration before).
2. **Latency floor** (tiny network 4-4-1, s = 8, a 2-column plan on 2
   workers): iteration time against a raw worker-to-worker round trip
   (``worker.rpc(peer).identity()`` from the worker's event loop) measured on
   the same cluster in the same run.
3. **One worker vs serial** at a compute-bound size: ``fit`` on a 1-worker
   cluster against :func:`dask_rpm.fit_serial` in this process, BLAS pinned to
   one thread on both sides, arms alternating.
4. **Overhead at the compute-dominated size** (EMULATED equal speeds on 4
   workers, so the sum of speeds fits the cores): per iteration,
   ``iteration time - slowest worker's compute (forward + backward + modify)``.

Usage::

    python benchmarks/dataplane.py            # everything (~6 min)
    python benchmarks/dataplane.py --quick    # N up to 16, fewer iterations (~2 min)
    python benchmarks/dataplane.py --json out.json
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
from distributed import Client, LocalCluster  # noqa: E402

import dask_rpm  # noqa: E402
from dask_rpm.plan.partition import Plan  # noqa: E402
from dask_rpm.planners import make_plan  # noqa: E402


def _data(n: int, l: int, s: int, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(s, n))
    x[:, -1] = 1.0
    return x, rng.uniform(0.1, 0.9, size=(s, l))


def _fit(client: Any, x: np.ndarray, d: np.ndarray, m: int, plan: Plan, iterations: int) -> Any:
    kw = dict(
        hidden=m, learning_rate=1e-4, mapping=plan, client=client, progress="none", elastic=False
    )
    dask_rpm.fit(x, d, iterations=3, interval=3, **kw)  # warm-up (imports, connections, BLAS)
    return dask_rpm.fit(x, d, iterations=iterations, interval=iterations, **kw)


async def _round_trip(other: str, n: int = 200, dask_worker: Any = None) -> float:
    await dask_worker.rpc(other).identity()
    t0 = time.perf_counter()
    for _ in range(n):
        await dask_worker.rpc(other).identity()
    return (time.perf_counter() - t0) / n


def growth(ns: list[int], iterations: int) -> list[dict[str, Any]]:
    n, m, l, s = 64, 64, 8, 2048
    x, d = _data(n, l, s)
    rows = []
    for k in ns:
        with (
            LocalCluster(
                n_workers=k, threads_per_worker=1, processes=True, dashboard_address=":0"
            ) as cluster,
            Client(cluster) as client,
        ):
            addresses = dask_rpm.ordered_workers(client.scheduler_info())
            plan = make_plan([1.0] * k, (n, m, l), s, method="srpm", workers=addresses)
            r = _fit(client, x, d, m, plan, iterations)
        rows.append(
            {
                "workers": k,
                "columns": plan.n_columns,
                "seconds_per_iteration": r.seconds_per_iteration,
                "tasks_per_iteration": r.stats["tasks"] / iterations,
                "blocks": r.stats["blocks"],
            }
        )
        print(
            f"  N={k:3d}: {r.seconds_per_iteration * 1e3:7.2f} ms/iteration, {plan.n_columns} column(s), "
            f"{r.stats['tasks'] / iterations:.3f} tasks/iteration",
            file=sys.stderr,
        )
    return rows


def floor(iterations: int) -> dict[str, Any]:
    x, d = _data(4, 1, 8)
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        a = dask_rpm.ordered_workers(client.scheduler_info())
        plan = Plan.from_columns([[0], [1]], [4, 4], [[4], [4]], shape=(4, 4, 1)).with_workers(a)
        rts, its = [], []
        for _ in range(3):  # alternate the arms: the machine's noise hits both
            rts.append(client.run(_round_trip, a[1], workers=[a[0]])[a[0]])
            its.append(_fit(client, x, d, 4, plan, iterations).seconds_per_iteration)
    rt, it = float(np.median(rts)), float(np.median(its))
    print(
        f"  floor: {it * 1e3:.3f} ms/iteration, raw round trip {rt * 1e3:.3f} ms -> {it / rt:.2f} round trips",
        file=sys.stderr,
    )
    return {
        "seconds_per_iteration": it,
        "round_trip_seconds": rt,
        "round_trips_per_iteration": it / rt,
    }


def single_vs_serial(rounds: int, iterations: int) -> dict[str, Any]:
    from threadpoolctl import threadpool_limits

    n, m, l, s = 512, 1024, 32, 8192
    x, d = _data(n, l, s)
    x, d = x.astype("float32"), d.astype("float32")
    ratios, serial_t, dist_t = [], [], []
    with (
        LocalCluster(
            n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
        threadpool_limits(1),
    ):
        a = dask_rpm.ordered_workers(client.scheduler_info())
        plan = Plan.from_columns([[0]], [s], [[m]], shape=(n, m, l)).with_workers(a)
        kw = dict(
            hidden=m,
            learning_rate=1e-6,
            mapping=plan,
            client=client,
            progress="none",
            dtype="float32",
            elastic=False,
        )
        dask_rpm.fit(x, d, iterations=2, interval=2, **kw)
        for _ in range(rounds):
            t0 = time.perf_counter()
            dask_rpm.fit_serial(
                x, d, hidden=m, iterations=iterations, learning_rate=1e-6, dtype="float32"
            )
            ts = (time.perf_counter() - t0) / iterations
            td = dask_rpm.fit(
                x, d, iterations=iterations, interval=iterations, **kw
            ).seconds_per_iteration
            serial_t.append(ts)
            dist_t.append(td)
            ratios.append(td / ts)
    print(
        f"  one worker vs serial ({n}-{m}-{l}, s={s}, float32): serial {np.median(serial_t):.3f} s, "
        f"fit {np.median(dist_t):.3f} s -> {np.median(ratios):.3f}x",
        file=sys.stderr,
    )
    return {
        "size": [n, m, l, s],
        "serial_seconds": float(np.median(serial_t)),
        "fit_seconds": float(np.median(dist_t)),
        "ratio": float(np.median(ratios)),
        "ratios": ratios,
    }


def overhead(iterations: int) -> dict[str, Any]:
    n, m, l, s = 512, 1024, 32, 8192
    x, d = _data(n, l, s)
    with (
        dask_rpm.local_cluster([1.0] * 4, dashboard_address=":0") as cluster,
        Client(cluster) as client,
    ):
        a = dask_rpm.ordered_workers(client.scheduler_info())
        plan = make_plan([1.0] * 4, (n, m, l), s, method="srpm", workers=a)
        r = _fit(client, x, d, m, plan, iterations)
        label = cluster.emulation_label
    h = r.history.isel(iteration=slice(1, None))
    compute = (h["forward"] + h["backward"] + h["modify"]).max("worker").values
    it = h["iteration_time"].values
    frac = (it - compute) / it
    print(
        f"  overhead (EMULATED equal speeds, 4 workers, {n}-{m}-{l}, s={s}): median "
        f"{100 * float(np.median(frac)):.1f} % of {float(np.median(it)):.3f} s",
        file=sys.stderr,
    )
    return {
        "size": [n, m, l, s],
        "plan": repr(r.plan),
        "emulation": label,
        "seconds_per_iteration": float(np.median(it)),
        "overhead_fraction": float(np.median(frac)),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument(
        "--json", nargs="?", const="-", help="write JSON (to a file, or stdout with no name)"
    )
    args = p.parse_args(argv)
    ns = [1, 4, 8, 16] if args.quick else [1, 4, 8, 16, 32]
    its = 100 if args.quick else 300
    print(
        f"dataplane benchmark on {os.cpu_count()} cores (heterogeneity, where any, is EMULATED)",
        file=sys.stderr,
    )
    out = {
        "machine": {"cores": os.cpu_count(), "loadavg": os.getloadavg()},
        "growth": growth(ns, its),
        "floor": floor(200 if args.quick else 500),
        "single_vs_serial": single_vs_serial(3 if args.quick else 5, 3),
        "overhead": overhead(6 if args.quick else 10),
    }
    if args.json:
        text = json.dumps(out, indent=1)
        if args.json == "-":
            print(text)
        else:
            with open(args.json, "w") as f:
                f.write(text + "\n")
    return out


if __name__ == "__main__":
    main()
