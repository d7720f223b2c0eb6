"""How SRPM planning time grows with the number of workers.

Prints, for N = 64 ... 4096 random abilities, the seconds of

* ``srpm_dp``          - the vectorised O(N^2 log N) DP, all rows (what make_plan runs);
* ``early``            - the same with ``early_stop=True`` (rows stop at the t_comm lower bound);
* ``make_plan``        - the whole planner: DP + snapping + integer mapping + validation;
* ``reference``        - the plain O(N^3) DP (only up to ``--max-reference``), and the speedup.

With ``--time``: ``make_plan(..., "srpm-time")`` instead (condition-A-like rates, 0.9 ms latency,
1.3 GB/s, 10 us overhead, weak scaling s = 4096 N on 203-1024-26), for the engine's exchanges and
the scalable ones.

Not a timed test; run it by hand and copy the table into docs/benchmarks.md::

    python benchmarks/plan_scaling.py [--sizes 64,256,1024,2048,4096] [--max-reference 256]
    python benchmarks/plan_scaling.py --time [--sizes 256,1024,4096]
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import numpy as np

from dask_rpm.planners import make_plan, srpm_dp, srpm_dp_reference

SHAPE = (203, 80, 26)  # NETtalk, as in the paper


def _best_of(fn, repeats: int, clock=time.perf_counter) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = clock()
        fn()
        best = min(best, clock() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="64,256,1024,2048,4096")
    ap.add_argument(
        "--max-reference", type=int, default=256, help="largest N for the O(N^3) reference"
    )
    ap.add_argument(
        "--repeats", type=int, default=3, help="best of this many runs (1 for N > 1024)"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--time", action="store_true", help="time srpm-time instead")
    args = ap.parse_args()
    if args.time:
        time_planner([int(x) for x in args.sizes.split(",")])
        return
    sizes = [int(x) for x in args.sizes.split(",")]
    rng = np.random.default_rng(args.seed)
    print(
        f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cores, numpy {np.__version__}"
    )
    print(f"# shape n-m-l = {'-'.join(map(str, SHAPE))}, abilities uniform in [0.1, 1]")
    print(
        f"# load average at start: {os.getloadavg()[0]:.1f} (wall-clock seconds suffer from other load; cpu s less so)"
    )
    print(
        f"{'N':>6} {'srpm_dp s':>10} {'cpu s':>7} {'early s':>9} {'make_plan s':>12} "
        f"{'reference s':>12} {'speedup':>8}  C"
    )
    # The lambdas below are timed before the loop moves on (ruff B023 does not apply).
    for n in sizes:
        p = rng.uniform(0.1, 1.0, n)
        samples = 100 * n
        reps = args.repeats if n <= 1024 else 1
        t_fast = _best_of(lambda: srpm_dp(p, SHAPE, samples), reps)  # noqa: B023
        t_cpu = _best_of(lambda: srpm_dp(p, SHAPE, samples), reps, time.process_time)  # noqa: B023
        t_early = _best_of(lambda: srpm_dp(p, SHAPE, samples, early_stop=True), reps)  # noqa: B023
        t_plan = _best_of(lambda: make_plan(p, SHAPE, samples, "srpm"), 1)  # noqa: B023
        res = srpm_dp(p, SHAPE, samples)
        if n <= args.max_reference:
            t_ref = _best_of(lambda: srpm_dp_reference(p, SHAPE, samples), 1)  # noqa: B023
            ref = srpm_dp_reference(p, SHAPE, samples)
            assert ref.sizes == res.sizes and ref.t_comm_by_columns == res.t_comm_by_columns
            ref_s, speed = f"{t_ref:12.3f}", f"{t_ref / t_fast:7.0f}x"
        else:
            ref_s, speed = f"{'-':>12}", f"{'-':>8}"
        print(
            f"{n:>6} {t_fast:10.3f} {t_cpu:7.3f} {t_early:9.3f} {t_plan:12.3f} {ref_s} {speed}  {res.n_columns}",
            flush=True,
        )


def time_planner(sizes: list[int]) -> None:
    import dask.config

    from dask_rpm.comm import Interconnect

    a = np.array([0.25, 0.3125, 0.5, 1.0, 1.0, 0.4167, 0.6667, 0.5])
    net = Interconnect(latency=9e-4, bandwidth=1.3e9, overhead=1e-5)
    print(
        f"# srpm-time, 203-1024-26, s = 4096 N, condition-A-like rates x 1.25e7; load {os.getloadavg()[0]:.1f}"
    )
    print(f"{'N':>6} {'exchanges':>10} {'make_plan s':>12} {'cpu s':>7}  C  chosen")
    for n in sizes:
        sp = np.resize(a, n)
        for name, modes in (("engine", ("engine", "engine")), ("scalable", ("best", "best"))):
            with dask.config.set({"rpm.cost.vertical": modes[0], "rpm.cost.horizontal": modes[1]}):
                t0, c0 = time.perf_counter(), time.process_time()
                plan = make_plan(
                    sp, (203, 1024, 26), 4096 * n, "srpm-time", rates=list(sp * 1.25e7), network=net
                )
                t, c = time.perf_counter() - t0, time.process_time() - c0
            print(
                f"{n:>6} {name:>10} {t:12.2f} {c:7.2f} {plan.n_columns:>3}  {plan.notes[0].split(';')[0]}",
                flush=True,
            )


if __name__ == "__main__":
    main()
