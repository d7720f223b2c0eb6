"""EMULATED: a compute-bound CNN on workers of speeds 1 : 0.5 : 0.25 - gamma, speed-up, exactness.

Issue 32's goal: on EMULATED workers 1 : 0.5 : 0.25 training a compute-bound CNN, DRPM reaches
a parallel efficiency gamma >= 0.8 and runs >= 1.5x faster than the fastest worker alone.

The CNN: 3x32x32 inputs, conv 3->32 k3 p1, ReLU, max-pool 2, conv 32->64 k3 p1, ReLU, max-pool 2,
flatten, linear 4096->10 (61 k weights), float64, cross-entropy, plain SGD, full batch of
``--samples`` (24) images. Per iteration the conv stages are 99.9 % of the flop; the weight
exchange between data-parallel columns is 0.5 MB.

One ``dask_rpm.local_cluster([1.0, 0.5, 0.25])`` (Nanny processes, one thread each) runs, per
repeat and in this order:

* ``alone i``: the job on worker i alone (a one-worker plan): ``T_series(i)``;
* ``drpm``: ``mapping="drpm"`` from no abilities (it starts from the uniform plan and remaps at
  its checks, every ``--interval`` iterations);
* ``srpm (true)``: ``mapping="srpm"`` given the true speeds;
* ``split-1d (true)``: the speeds' data-parallel plan (one column per worker, samples in
  proportion to speed), the structure a compute-bound job wants;
* ``uniform``: equal rectangles, for contrast.

Seconds per iteration: the median over the second half of a run (after DRPM's remaps).
gamma = (1 / T_parallel) / sum_i (1 / T_series(i)) with the same repeat's ``T_series``
(docs/method.md §8). Every run's weights are compared with ``fit_serial`` of the same job
(float64; the largest relative difference over the parameters is printed, goal <= 1e-10).

The EMULATED rate: pacing makes a block last ``work / (rate x speed x scale)`` with ``work``
the CNN's flop equivalents (``dask_rpm.nn.cnn.cnn_work``) and ``rate`` =
``rpm.emulation.rate-fraction`` x one core's throughput on the MLP kernels (a GEMM). This
machine's float64 conv kernels (torch ``conv2d`` on one thread) run at about a sixth of that
GEMM rate per flop, so at the default fraction (0.5) every conv block would overrun its target
and the timings would measure two shared cores, not the profile. The script therefore sets
``rpm.emulation.rate-fraction`` to ``--rate-fraction`` (0.08): speed 1.0 is then about 4 G flop
equivalents per second, and the three workers together keep about 0.8 of a core busy. The
paced-block overruns of each repeat are printed.

Run::

    python3 benchmarks/cnn_emulated.py                 # 3 repeats, about 3 minutes on 2 cores
    python3 benchmarks/cnn_emulated.py --repeats 1 --json out.json

Every figure is EMULATED (paced workers on one machine), not a hardware measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import dask
import numpy as np

SPEEDS = [1.0, 0.5, 0.25]
IMAGE = (3, 32, 32)
CLASSES = 10
LR = 0.01


def network() -> Any:
    import torch

    tnn = torch.nn
    torch.manual_seed(0)
    return tnn.Sequential(
        tnn.Conv2d(3, 32, 3, padding=1),
        tnn.ReLU(),
        tnn.MaxPool2d(2),
        tnn.Conv2d(32, 64, 3, padding=1),
        tnn.ReLU(),
        tnn.MaxPool2d(2),
        tnn.Flatten(),
        tnn.Linear(64 * 8 * 8, CLASSES),
    ).double()


def data(samples: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    # every class present (the classes are counted from the labels)
    return rng.normal(size=(samples, *IMAGE)), rng.permutation(np.arange(samples) % CLASSES)


def rel_diff(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    return max(
        float(np.max(np.abs(np.asarray(p) - q)) / max(float(np.max(np.abs(q))), 1e-300))
        for p, q in zip(a, b)
    )


def steady(r: Any) -> float:
    t = np.asarray(r.history["iteration_time"].values, dtype=float)
    t = t[len(t) // 2 :]
    t = t[np.isfinite(t)]
    return float(np.median(t))


def overruns(client: Any) -> tuple[int, int]:
    from dask_rpm.emulation import emulation_report

    rows = emulation_report(client)
    return sum(r["overruns"] for r in rows), sum(r["blocks"] for r in rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=24, help="images per (full-batch) iteration")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--iterations", type=int, default=40, help="iterations of the DRPM run")
    ap.add_argument("--static-iterations", type=int, default=16, help="of srpm/split-1d/uniform")
    ap.add_argument("--series-iterations", type=int, default=6, help="of each worker alone")
    ap.add_argument("--interval", type=int, default=8, help="DRPM check interval R")
    ap.add_argument("--rate-fraction", type=float, default=0.08)
    ap.add_argument("--json", default=None, help="also write the numbers here")
    args = ap.parse_args(argv)

    from distributed import Client

    import dask_rpm
    from dask_rpm.nn.cnn_records import conv_layers
    from dask_rpm.plan.partition import Plan

    t_start = time.time()
    x, y = data(args.samples)
    layers = conv_layers(network(), IMAGE, CLASSES)
    kw: dict[str, Any] = dict(loss="cross-entropy", learning_rate=LR, seed=0)
    serial_cache: dict[int, list[np.ndarray]] = {}

    def serial(iterations: int) -> list[np.ndarray]:
        if iterations not in serial_cache:
            ref = dask_rpm.fit_serial(x, y, network=network(), iterations=iterations, **kw)
            serial_cache[iterations] = [np.asarray(p) for p in ref.params]
        return serial_cache[iterations]

    rows: list[dict[str, Any]] = []
    dask.config.set({"rpm.emulation.rate-fraction": args.rate_fraction})
    with (
        dask_rpm.local_cluster(SPEEDS, dashboard_address=None) as cluster,
        Client(cluster) as client,
    ):
        label = cluster.emulation_label
        addresses = cluster.worker_names()
        rate = cluster.rates["float64"] * cluster.scale_factor
        work = layers_work(layers, args.samples)
        print(f"# {label}")
        print(f"# CNN {' | '.join(layers.describe())}; {args.samples} images, float64, full batch")
        print(
            f"# speed 1.0 = {rate / 1e9:.2f} G flop equivalents/s (rate-fraction "
            f"{args.rate_fraction} x scale {cluster.scale_factor:.3f}); one iteration is "
            f"{work / 1e9:.3f} G: {work / rate * 1e3:.0f} ms on speed 1.0 alone (EMULATED)"
        )

        def run(arm: str, mapping: Any, iterations: int, abilities: Any = None) -> dict[str, Any]:
            r = dask_rpm.fit(
                x,
                y,
                network=network(),
                mapping=mapping,
                abilities=abilities,
                iterations=iterations,
                interval=args.interval if arm == "drpm" else iterations,
                client=client,
                progress="none",
                **kw,
            )
            return {
                "arm": arm,
                "seconds_per_iteration": steady(r),
                "iteration_time": [float(v) for v in r.history["iteration_time"].values],
                "plan": repr(r.plan),
                "remaps": len(r.remaps),
                "max_rel_diff_vs_serial": rel_diff(r.params, serial(iterations)),
            }

        for rep in range(args.repeats):
            o0, b0 = overruns(client)
            load0 = os.getloadavg()[0]
            arms = []
            for i, addr in enumerate(addresses):
                one = Plan.from_columns(
                    [[0]], [args.samples], [[layers.m]], abilities=[1.0], shape=layers.plan_shape
                ).with_workers([addr])
                arms.append(run(f"alone {i} (speed {SPEEDS[i]:g})", one, args.series_iterations))
            series = [a["seconds_per_iteration"] for a in arms]
            arms.append(run("drpm", "drpm", args.iterations))
            arms.append(run("srpm (true)", "srpm", args.static_iterations, SPEEDS))
            arms.append(run("split-1d (true)", "split-1d", args.static_iterations, SPEEDS))
            arms.append(run("uniform", "uniform", args.static_iterations))
            o1, b1 = overruns(client)
            for a in arms:
                t = a["seconds_per_iteration"]
                a["gamma"] = (1.0 / t) / sum(1.0 / s for s in series)
                a["speedup_vs_fastest"] = series[0] / t
            rows.append(
                {
                    "repeat": rep + 1,
                    "arms": arms,
                    "overruns": o1 - o0,
                    "blocks": b1 - b0,
                    "load": [load0, os.getloadavg()[0]],
                }
            )
            print(
                f"\n## repeat {rep + 1}: paced-block overruns {o1 - o0} of {b1 - b0}; "
                f"load average {load0:.1f} -> {os.getloadavg()[0]:.1f}"
            )
            print(
                "| arm (EMULATED) | s/iteration | gamma | vs fastest alone | remaps | max rel. diff vs fit_serial | final plan |"
            )
            print("|---|---:|---:|---:|---:|---:|---|")
            for a in arms:
                print(
                    f"| {a['arm']} | {a['seconds_per_iteration'] * 1e3:.1f} ms | {a['gamma']:.3f} | "
                    f"{a['speedup_vs_fastest']:.2f}x | {a['remaps']} | "
                    f"{a['max_rel_diff_vs_serial']:.1e} | {a['plan']} |"
                )
            sys.stdout.flush()

    print("\n## summary over repeats: best / median (EMULATED)")
    print("| arm | s/iteration | gamma | vs fastest alone | max rel. diff vs fit_serial |")
    print("|---|---|---|---|---:|")
    for j, a0 in enumerate(rows[0]["arms"]):
        t = np.array([r["arms"][j]["seconds_per_iteration"] for r in rows])
        g = np.array([r["arms"][j]["gamma"] for r in rows])
        s = np.array([r["arms"][j]["speedup_vs_fastest"] for r in rows])
        d = max(r["arms"][j]["max_rel_diff_vs_serial"] for r in rows)
        print(
            f"| {a0['arm']} | {t.min() * 1e3:.1f} / {np.median(t) * 1e3:.1f} ms | "
            f"{g.max():.3f} / {np.median(g):.3f} | {s.max():.2f}x / {np.median(s):.2f}x | {d:.1e} |"
        )
    worst = max(a["max_rel_diff_vs_serial"] for r in rows for a in r["arms"])
    drpm_g = [a["gamma"] for r in rows for a in r["arms"] if a["arm"] == "drpm"]
    drpm_s = [a["speedup_vs_fastest"] for r in rows for a in r["arms"] if a["arm"] == "drpm"]
    print(
        f"# goals: DRPM gamma >= 0.8: median {np.median(drpm_g):.3f} "
        f"({'met' if np.median(drpm_g) >= 0.8 else 'NOT met'}); DRPM >= 1.5x the fastest alone: "
        f"median {np.median(drpm_s):.2f}x ({'met' if np.median(drpm_s) >= 1.5 else 'NOT met'}); "
        f"every run equal to fit_serial to {worst:.1e} "
        f"({'met' if worst <= 1e-10 else 'NOT met'}, goal 1e-10)"
    )
    print(f"# wall {time.time() - t_start:.0f} s")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"label": label, "args": vars(args), "repeats": rows}, f, indent=1)
    return 0


def layers_work(layers: Any, samples: int) -> float:
    """Flop equivalents of one whole iteration (forward + backward, every stage)."""
    from dask_rpm.nn.cnn import cnn_work

    return sum(
        cnn_work(kind, k, samples, layers.hidden, layers)
        for k in range(layers.depth)
        for kind in ("forward", "backward")
    )


if __name__ == "__main__":
    sys.exit(main())
