"""Idle workers at extreme speed ratios (issue 25): the fastest worker alone against the mixed run.

EMULATION, not hardware: four workers on this 2-core machine, one fast and three slow,
EMULATED speeds 1 : 0.01 (a "GPU" beside three one-thread "CPUs", 1 : 100) and 1 : 0.25
(1 : 4), one cluster per mix, in one run. A slow worker is made slow by sleeping after each
kernel block, its small exchange kernels (summing received partial products and updates)
included, so at 1 : 100 its messages cost more here than on real hardware, where the
exchanges run on its host CPU at full speed.

Two workloads, 33-256-8 on 2048 samples (messages dominate) and on 32768 (compute
dominates); for each workload and mix:

1. **DRPM** (the default mapping) starts from the probe (``abilities="probe"``): its first
   plan leaves idle the workers whose messages cost more than their share saves
   (:mod:`dask_rpm.planners.idle`); its checks may remap (:mod:`dask_rpm.drpm.idle`). The
   plan it ends with is ``r.plan``; its in-run seconds per iteration are the median after
   its last remap.
2. The arms, timed in turns on the same cluster (interleaved repeats, the median of every
   iteration after the first two of each run): the **fastest worker alone** (a one-worker
   plan on the 4-worker cluster), **DRPM's plan**, and **every worker** (SRPM, areas
   proportional to the true speeds: what DRPM planned before idle workers existed).

Every run's weights are checked against :func:`dask_rpm.fit_serial` (float64, relative
1e-10). The mixed run should never be slower than the fastest worker alone by more than
noise, and faster where the slow workers' share pays (the 1 : 4 mix on the large workload).

Usage::

    flock -x /tmp/rpm-cpu.lock python benchmarks/idle_workers.py              # ~5 min
    python benchmarks/idle_workers.py --samples 2048 --repeats 5 --json idle.json
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

#: EMULATED speed mixes: one fast worker and three slow ones
MIXES = {"1:100": (1.0, 0.01, 0.01, 0.01), "1:4": (1.0, 0.25, 0.25, 0.25)}
SHAPE = (33, 256, 8)
SAMPLES = (2048, 32768)  # messages dominate / compute dominates
LEARNING_RATE = 1e-5


def _data(samples: int, shape: tuple[int, int, int]) -> tuple[np.ndarray, np.ndarray]:
    n, _, l = shape
    rng = np.random.default_rng(3)
    x = rng.normal(size=(samples, n))
    x[:, -1] = 1.0
    return x, rng.uniform(0.1, 0.9, size=(samples, l))


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), 1e-300))


def _after_last_remap(r: Any) -> float:
    """Median seconds per iteration of a DRPM run after its last remap (and two warm-ups)."""
    last = max([int(rec["iteration"]) for rec in r.remaps] or [0])
    t = r.history["iteration_time"].values[last + 2 :]
    t = t[np.isfinite(t)]
    return float(np.median(t)) if t.size else float("nan")


def one_mix(name: str, speeds: tuple[float, ...], args: argparse.Namespace) -> dict[str, Any]:
    """DRPM, then the interleaved arms, on one EMULATED cluster of ``speeds``."""
    from distributed import Client

    import dask_rpm
    from dask_rpm.planners import make_plan

    shape, samples = tuple(args.shape), args.samples_now
    x, d = _data(samples, shape)
    kw = dict(hidden=shape[1], learning_rate=LEARNING_RATE, progress="none", elastic=False)
    serial = {
        it: dask_rpm.fit_serial(x, d, hidden=shape[1], iterations=it, learning_rate=LEARNING_RATE)
        for it in {args.iterations, args.drpm_iterations}
    }
    exact: dict[str, float] = {}

    def check(arm: str, r: Any, iterations: int) -> None:
        W, V = serial[iterations].params
        exact[arm] = max(exact.get(arm, 0.0), _rel(r.params[0], W), _rel(r.params[-1], V))

    with (
        dask_rpm.local_cluster(list(speeds), dashboard_address=None) as cluster,
        Client(cluster) as client,
    ):
        label = cluster.emulation_label
        print(label, file=sys.stderr)
        addresses = dask_rpm.ordered_workers(client.scheduler_info())
        drpm = dask_rpm.fit(
            x,
            d,
            iterations=args.drpm_iterations,
            mapping="drpm",
            abilities="probe",
            interval=args.interval,
            client=client,
            **kw,
        )
        check("drpm (in run)", drpm, args.drpm_iterations)
        arms = {
            "fastest alone": make_plan([1.0], shape, samples, "srpm", workers=addresses[:1]),
            "DRPM's plan": drpm.plan,
            "every worker (SRPM)": make_plan(list(speeds), shape, samples, "srpm").with_workers(
                addresses
            ),
        }
        for plan in arms.values():  # warm-up: connections, caches
            dask_rpm.fit(x, d, iterations=3, mapping=plan, client=client, **kw)
        times: dict[str, list[float]] = {k: [] for k in arms}
        per_run: dict[str, list[float]] = {k: [] for k in arms}
        for rep in range(args.repeats):
            order = list(arms) if rep % 2 == 0 else list(arms)[::-1]
            for k in order:
                r = dask_rpm.fit(
                    x, d, iterations=args.iterations, mapping=arms[k], client=client, **kw
                )
                t = r.history["iteration_time"].values[2:]
                times[k].extend(float(v) for v in t[np.isfinite(t)])
                per_run[k].append(float(np.median(t)))
                check(k, r, args.iterations)
                print(
                    f"  {name} repeat {rep + 1} {k}: {np.median(t) * 1e3:.2f} ms", file=sys.stderr
                )
    return {
        "mix": name,
        "samples": samples,
        "speeds": list(speeds),
        "emulation": label,
        "drpm_plans": [
            {"planned": list(p.planned_workers), "excluded": list(p.excluded)} for p in drpm.plans
        ],
        "drpm_notes": [n for n in drpm.plan.notes if "idle" in n],
        "drpm_remaps": [
            {"iteration": rec["iteration"], "kind": rec["kind"], "reason": rec.get("reason")}
            for rec in drpm.remaps
        ],
        "drpm_in_run": _after_last_remap(drpm),
        "measured": {k: float(np.median(v)) for k, v in times.items()},
        "per_run": per_run,
        "max_rel_diff_vs_serial": exact,
    }


def report(res: dict[str, Any]) -> str:
    lines = [
        f"EMULATED (one 2-core machine, workers slowed by sleeping): shape "
        f"{'-'.join(map(str, res['shape']))}, {res['repeats']} interleaved "
        f"repeats of {res['iterations']} iterations per arm; DRPM {res['drpm_iterations']} "
        f"iterations from the probe (load {res['loadavg'][0]:.1f} -> {res['loadavg'][1]:.1f}, "
        f"{res['wall']:.0f} s)",
        "",
        "s/iteration: median of every timed iteration [range of the runs' medians]",
        "",
        "| s | mix (EMULATED) | fastest alone | DRPM's plan | DRPM in run | every worker (SRPM) "
        "| DRPM's plan vs alone | every worker vs alone | DRPM planned | max rel. diff vs "
        "fit_serial |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |",
    ]

    plan_key = "DRPM's plan"

    def cell(m: dict[str, Any], arm: str) -> str:
        runs = m.get("per_run", {}).get(arm, [])
        spread = f" [{min(runs):.3f}-{max(runs):.3f}]" if runs else ""
        return f"{m['measured'][arm]:.4f}{spread}"

    for m in res["mixes"]:
        t = m["measured"]
        alone, mixed, every = t["fastest alone"], t["DRPM's plan"], t["every worker (SRPM)"]
        planned = m["drpm_plans"][-1]["planned"]
        lines.append(
            f"| {m.get('samples', '')} | {m['mix']} | {cell(m, 'fastest alone')} | {cell(m, plan_key)} "
            f"| {m['drpm_in_run']:.4f} | {cell(m, 'every worker (SRPM)')} | "
            f"{mixed / alone:.2f}x | {every / alone:.2f}x | "
            f"P{', P'.join(str(w + 1) for w in sorted(planned))} | "
            f"{max(m['max_rel_diff_vs_serial'].values()):.1e} |"
        )
    for m in res["mixes"]:
        lines.append("")
        lines.append(f"s = {m.get('samples', '')}, {m['mix']}: {m['emulation']}")
        lines.extend(f"  note: {n}" for n in m["drpm_notes"])
        lines.extend(
            f"  remap at {r['iteration']} ({r['kind']}): {r['reason']}" for r in m["drpm_remaps"]
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--iterations", type=int, default=12, help="per arm and repeat")
    ap.add_argument("--drpm-iterations", type=int, default=30)
    ap.add_argument("--interval", type=int, default=10, help="DRPM's checks")
    ap.add_argument("--shape", type=int, nargs=3, default=list(SHAPE), metavar=("N", "M", "L"))
    ap.add_argument(
        "--samples", default=",".join(map(str, SAMPLES)), help="workloads: sample counts"
    )
    ap.add_argument("--mixes", default=",".join(MIXES), help=f"of {', '.join(MIXES)}")
    ap.add_argument("--json", help="write the result here")
    args = ap.parse_args(argv)
    t0, load0 = time.perf_counter(), os.getloadavg()[0]
    mixes = []
    for samples in [int(v) for v in str(args.samples).split(",")]:
        args.samples_now = samples
        mixes += [one_mix(k, MIXES[k], args) for k in args.mixes.split(",")]
    res = {
        "shape": list(args.shape),
        "samples": [int(v) for v in str(args.samples).split(",")],
        "repeats": args.repeats,
        "iterations": args.iterations,
        "drpm_iterations": args.drpm_iterations,
        "mixes": mixes,
        "loadavg": [load0, os.getloadavg()[0]],
        "wall": time.perf_counter() - t0,
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    print(report(res))
    worst = max(max(m["max_rel_diff_vs_serial"].values()) for m in mixes)
    if worst > 1e-10:
        raise SystemExit(f"a run differs from fit_serial by {worst:.2e} (> 1e-10)")


if __name__ == "__main__":
    main()
