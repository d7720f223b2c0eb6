"""How SRPM planning time grows with the number of workers.

Prints, for N = 64 ... 4096 random abilities, the seconds of

* ``srpm_dp``          - the vectorised O(N^2 log N) DP, all rows (what make_plan runs);
* ``early``            - the same with ``early_stop=True`` (rows stop at the t_comm lower bound);
* ``make_plan``        - the whole planner: DP + snapping + integer mapping + validation;
* ``reference``        - the plain O(N^3) DP (only up to ``--max-reference``), and the speedup.

Not a timed test; run it by hand and copy the table into docs/benchmarks.md::

    python benchmarks/plan_scaling.py [--sizes 64,256,1024,2048,4096] [--max-reference 256]
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
    ap.add_argument("--max-reference", type=int, default=256, help="largest N for the O(N^3) reference")
    ap.add_argument("--repeats", type=int, default=3, help="best of this many runs (1 for N > 1024)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    rng = np.random.default_rng(args.seed)
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cores, numpy {np.__version__}")
    print(f"# shape n-m-l = {'-'.join(map(str, SHAPE))}, abilities uniform in [0.1, 1]")
    print(f"# load average at start: {os.getloadavg()[0]:.1f} (wall-clock seconds suffer from other load; cpu s less so)")
    print(
        f"{'N':>6} {'srpm_dp s':>10} {'cpu s':>7} {'early s':>9} {'make_plan s':>12} "
        f"{'reference s':>12} {'speedup':>8}  C"
    )
    for n in sizes:
        p = rng.uniform(0.1, 1.0, n)
        samples = 100 * n
        reps = args.repeats if n <= 1024 else 1
        t_fast = _best_of(lambda: srpm_dp(p, SHAPE, samples), reps)
        t_cpu = _best_of(lambda: srpm_dp(p, SHAPE, samples), reps, time.process_time)
        t_early = _best_of(lambda: srpm_dp(p, SHAPE, samples, early_stop=True), reps)
        t_plan = _best_of(lambda: make_plan(p, SHAPE, samples, "srpm"), 1)
        res = srpm_dp(p, SHAPE, samples)
        if n <= args.max_reference:
            t_ref = _best_of(lambda: srpm_dp_reference(p, SHAPE, samples), 1)
            ref = srpm_dp_reference(p, SHAPE, samples)
            assert ref.sizes == res.sizes and ref.t_comm_by_columns == res.t_comm_by_columns
            ref_s, speed = f"{t_ref:12.3f}", f"{t_ref / t_fast:7.0f}x"
        else:
            ref_s, speed = f"{'-':>12}", f"{'-':>8}"
        print(
            f"{n:>6} {t_fast:10.3f} {t_cpu:7.3f} {t_early:9.3f} {t_plan:12.3f} {ref_s} {speed}  {res.n_columns}",
            flush=True,
        )


if __name__ == "__main__":
    main()
