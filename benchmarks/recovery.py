"""What does losing a worker cost? (issue #5)

On a LocalCluster of 4 worker processes (1 thread each, no emulated pacing),
a 3-layer net is trained twice with the same plan and iterations: once
undisturbed, once with one worker SIGKILLed (from fit's per-block callback,
so at a known iteration). Two plans:

* **columns**: 2 columns of 2 workers. The lost worker's rows are still held
  by the other column; the survivors go on after a whole remap from the state
  after the last completed block (that block's iterations since are redone).
* **checkpoint**: 1 column of 4 workers. Nobody else holds the rows; training
  restarts from the last checkpoint (``checkpoint_every``) on the survivors
  and recomputes the iterations since.

Reported per case: the recovery remap (seconds; weight bytes moved between
workers or sent from the client; sample bytes re-read from the dataset by
workers whose sample range changed), iterations recomputed, and the extra
wall time of the disturbed run over the undisturbed one (detection +
recovery + recomputation + running on fewer workers). Final weights are
checked against serial BP (rtol 1e-10) in both runs.

Usage::

    python benchmarks/recovery.py                # 65-24-10 on 1797 samples (scikit-learn digits), 200 iterations
    python benchmarks/recovery.py --hidden 256 --iterations 100
"""

from __future__ import annotations

import argparse
import os
import signal
import time

import numpy as np


def digits() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = np.column_stack([x / 16.0, np.ones(len(x))])
    d = np.full((len(x), 10), 0.1)
    d[np.arange(len(x)), y] = 0.9
    return x, d


def run(client, x, d, plan, m, iterations, kill_at, every, interval):
    from dask_rpm import fit, ordered_workers

    pids = client.run(os.getpid)
    victim = ordered_workers(client.scheduler_info())[1]
    fired = []

    def callback(info):
        if kill_at is not None and not fired and info["iteration"] >= kill_at:
            fired.append(time.perf_counter())
            os.kill(pids[victim], signal.SIGKILL)

    t0 = time.perf_counter()
    r = fit(
        x,
        d,
        hidden=m,
        iterations=iterations,
        learning_rate=0.005,
        mapping=plan,
        client=client,
        interval=interval,
        checkpoint_every=every,
        callback=callback,
        progress="none",
    )
    return r, time.perf_counter() - t0


def main() -> None:
    from distributed import Client, LocalCluster

    from dask_rpm import Plan, fit_serial

    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--hidden", type=int, default=24)
    ap.add_argument("--iterations", type=int, default=200)
    ap.add_argument("--kill-at", type=int, default=60)
    ap.add_argument("--every", type=int, default=50, help="checkpoint interval")
    ap.add_argument("--interval", type=int, default=10, help="iterations per block")
    a = ap.parse_args()
    x, d = digits()
    s, n, l, m = x.shape[0], x.shape[1], d.shape[1], a.hidden
    W, V = fit_serial(x, d, hidden=m, iterations=a.iterations, learning_rate=0.005, seed=0).params
    h = m // 4
    plans = {
        "columns": Plan.from_columns(
            [[0, 1], [2, 3]], [s // 2, s - s // 2], [[2 * h, m - 2 * h]] * 2, shape=(n, m, l)
        ),
        "checkpoint": Plan.from_columns(
            [[0, 1, 2, 3]], [s], [[h, h, h, m - 3 * h]], shape=(n, m, l)
        ),
    }
    print(
        f"network {n}-{m}-{l}, {s} samples, {a.iterations} iterations, blocks of {a.interval}, "
        f"checkpoint every {a.every}, worker killed after iteration {a.kill_at}; LocalCluster, 4 processes"
    )
    for name, plan in plans.items():
        with LocalCluster(
            n_workers=4, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster:
            with Client(cluster) as client:
                base, t_base = run(client, x, d, plan, m, a.iterations, None, a.every, a.interval)
                hit, t_hit = run(
                    client, x, d, plan, m, a.iterations, a.kill_at, a.every, a.interval
                )
        for r in (base, hit):
            np.testing.assert_allclose(r.params[0], W, rtol=1e-10, atol=0)
            np.testing.assert_allclose(r.params[-1], V, rtol=1e-10, atol=0)
        (rec,) = [r for r in hit.remaps if r.get("lost")]
        print(
            f"{name:>10}: recovered from the {rec['recovered_from']}; remap {rec['seconds']:.3f} s, "
            f"{rec['bytes']} weight bytes, {rec['sample_bytes']} sample bytes re-read, "
            f"{rec['replayed']} iterations recomputed; run {t_hit:.2f} s vs {t_base:.2f} s undisturbed "
            f"({t_hit - t_base:+.2f} s); {base.seconds_per_iteration * 1e3:.1f} ms/iteration on 4 workers, "
            f"{hit.seconds_per_iteration * 1e3:.1f} ms/iteration overall with the loss; weights equal serial"
        )


if __name__ == "__main__":
    main()
