"""The demo training job: a seeded synthetic task on a local cluster of EMULATED heterogeneous workers.

:func:`run_demo` is what ``dask-rpm train`` runs without ``--config``: it
starts :func:`dask_rpm.local_cluster` with the speeds of ``rpm.demo.*``,
trains with DRPM, holds the estimates and the final plan against the EMULATED
speeds and compares, on the same cluster, with the fastest worker alone and a
uniform plan. :func:`demo_data` is the learnable synthetic task the tests,
benchmarks and tutorials train on.

The command line (options, checks, job files) is :mod:`dask_rpm.cli.train`.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from distributed import Client

from ..emulation import emulation_info, local_cluster
from ..engine import fit
from ..nn.network import Network
from ..nn.recipe import forward
from ..ordering import ordered_workers
from ..plan.partition import Plan
from ..plan.real_partition import count_noun
from .evidence import overrun_counts, speed_check
from .settings import DemoSettings, demo_settings

__all__ = ["demo_data", "run_demo"]


def demo_data(
    samples: int | None = None, shape: Sequence[int] | None = None, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """A learnable synthetic task: targets produced by a random 'teacher' network.

    Inputs are standard normal with a constant-1 last column (the bias);
    targets are the teacher's sigmoid outputs, so the error can approach zero.
    ``samples`` and ``shape`` default to ``rpm.demo.samples`` and ``rpm.demo.shape``.
    """
    if samples is None or shape is None:
        demo = demo_settings()
        samples = demo.samples if samples is None else samples
        shape = demo.shape if shape is None else shape
    n, m, l = shape
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(samples, n))
    x[:, -1] = 1.0
    Wt = rng.normal(scale=1.0 / np.sqrt(n), size=(m // 2, n))
    Vt = rng.normal(scale=2.0 / np.sqrt(m // 2), size=(l, m // 2))
    return x, forward(x, [Wt, Vt], Network())  # a random teacher net of the paper's form


def _compare(
    client: Any,
    x: np.ndarray,
    d: np.ndarray,
    m: int,
    lr: float,
    speeds: Sequence[float],
    iterations: int,
) -> dict[str, float]:
    """Seconds per iteration, on the same cluster and data, of the fastest worker alone and of a uniform plan."""
    addresses = ordered_workers(client.scheduler_info())
    fastest = int(np.argmax(speeds))
    n, l = x.shape[1], d.shape[1]
    alone = Plan.from_columns([[0]], [x.shape[0]], [[m]], shape=(n, m, l), method="single worker")
    alone = alone.with_workers([addresses[fastest]])
    kw = dict(
        hidden=m,
        iterations=iterations,
        learning_rate=lr,
        client=client,
        seed=0,
        progress="none",
        elastic=False,
    )
    t_alone = fit(x, d, mapping=alone, **kw).seconds_per_iteration
    t_uniform = fit(x, d, mapping="uniform", **kw).seconds_per_iteration
    return {"fastest_alone": t_alone, "uniform": t_uniform}


def run_demo(
    *,
    speeds: Sequence[float] | None = None,
    iterations: int | None = None,
    mapping: str | None = None,
    samples: int | None = None,
    as_json: bool = False,
    compare: bool = True,
    out: Any = None,
) -> Any:
    """Train the embedded default job on a local EMULATED heterogeneous cluster.

    Settings not given come from ``rpm.demo.*``. After the run the DRPM
    estimates and the final plan's areas are held against the EMULATED
    speeds (:func:`dask_rpm.demo.evidence.speed_check`); with ``compare`` the same
    cluster then runs a few iterations on the fastest worker alone and with a
    uniform plan, so the output shows what the mapping bought, measured in
    the same run.
    """
    out = out or sys.stdout
    demo = demo_settings(speeds, iterations, samples)
    x, d = demo_data(demo.samples, demo.shape)
    n, m, l = demo.shape
    lr = 1.0 / demo.samples  # stable for the synthetic task (2 / samples overshoots)
    t0 = time.perf_counter()
    with local_cluster(demo.speeds, dashboard_address=":0") as cluster, Client(cluster) as client:
        if not as_json:
            print(cluster.emulation_label, file=out)
            print(f"dashboard: {client.dashboard_link}", file=out, flush=True)
        result = fit(
            x,
            d,
            hidden=m,
            iterations=demo.iterations,
            learning_rate=lr,
            mapping=mapping,
            client=client,
            seed=0,
        )
        wall = time.perf_counter() - t0
        blocks, overruns = overrun_counts(emulation_info(client))
        others = (
            _compare(client, x, d, m, lr, demo.speeds, demo.compare_iterations) if compare else {}
        )
    check = speed_check(result, demo.speeds, blocks=blocks, overruns=overruns)
    summary = _summary(result, demo, wall, others, check)
    if as_json:
        print(json.dumps(summary), file=out)
    else:
        _print_summary(result, summary, check, out)
    return result


def _summary(
    result: Any, demo: DemoSettings, wall: float, others: dict[str, float], check: Any
) -> dict:
    n, m, l = demo.shape
    err = result.history["error"].values
    t = result.seconds_per_iteration
    summary: dict[str, Any] = {
        "emulation": result.emulation,
        "workers": len(demo.speeds),
        "speeds": list(demo.speeds),
        "network": f"{n}-{m}-{l}",
        "samples": demo.samples,
        "iterations": int(err.size),
        "initial_error": float(err[0]) if err.size else None,
        "final_error": result.error,
        "seconds_per_iteration": t,
        "wall_seconds": wall,
        "plan": result.plan.to_dict(),
        "remaps": result.remaps,
        "speed_shares": list(check.truth),
        "ability_estimates": None if check.estimates is None else list(check.estimates),
        "area_shares": list(check.areas),
        "estimate_error": check.estimate_error,
        "area_error": check.area_error,
        "paced_blocks": check.blocks,
        "overruns": check.overruns,
    }
    if others:
        alone = others["fastest_alone"]
        # gamma = (1 / T) / sum_i (1 / T_i alone); T_i from the fastest worker's and the EMULATED speed ratios
        summary.update(
            {
                "seconds_per_iteration_fastest_alone": alone,
                "seconds_per_iteration_uniform": others["uniform"],
                "speedup_vs_fastest_alone": alone / t,
                "speedup_vs_uniform": others["uniform"] / t,
                "gamma": (1.0 / t) / ((1.0 / alone) * sum(demo.speeds) / max(demo.speeds)),
            }
        )
    return summary


def _print_summary(result: Any, summary: dict[str, Any], check: Any, out: Any) -> None:
    for r in result.remaps:
        print(
            f"remap at iteration {r['iteration']}: {r['kind']}, {r['bytes']} weight bytes moved, "
            f"{r.get('sample_bytes', 0)} sample bytes re-read, {r['seconds']:.3f} s",
            file=out,
        )
    k = summary["workers"]
    print(
        f"trained {summary['network']} on {summary['samples']} samples for {summary['iterations']} iterations on "
        f"{count_noun(k, 'EMULATED worker')}: error {summary['initial_error']:.4f} -> "
        f"{summary['final_error']:.4f}, {summary['seconds_per_iteration'] * 1e3:.1f} ms/iteration "
        f"({summary['wall_seconds']:.1f} s wall incl. cluster start)",
        file=out,
    )
    print(
        f"final plan (after {count_noun(len(result.remaps), 'remap')}): {result.plan!r}", file=out
    )
    for line in check.lines():
        print(line, file=out)
    if "gamma" in summary:
        print(
            f"time per iteration, measured in this run: this plan {summary['seconds_per_iteration'] * 1e3:.1f} ms | "
            f"fastest worker alone {summary['seconds_per_iteration_fastest_alone'] * 1e3:.1f} ms "
            f"(speed-up {summary['speedup_vs_fastest_alone']:.2f}x) | uniform plan "
            f"{summary['seconds_per_iteration_uniform'] * 1e3:.1f} ms (speed-up {summary['speedup_vs_uniform']:.2f}x)",
            file=out,
        )
        ideal = sum(summary["speeds"]) / max(summary["speeds"])
        print(
            f"parallel efficiency gamma {summary['gamma']:.2f} (1 = every worker's speed used: "
            f"{ideal:.2f}x the fastest worker alone; the rest is the exchanges between workers)",
            file=out,
        )
