"""Exchange algorithms in the engine: measured seconds per iteration, and the model's prediction.

Issue 13: the engine runs the vertical (in-column) and horizontal (across
columns, one allreduce per group of bands) exchanges by one of several
algorithms (``rpm.engine.vertical`` / ``rpm.engine.horizontal``). This
script measures them side by side in one run, on one local cluster per
worker count (equal speeds, no emulation: the exchanges are what differs),
arms interleaved so the shared machine's noise hits them alike:

* **wide**: ``split-1d`` on N workers - N columns of one worker, every worker
  holding every row, so the horizontal exchange is one allreduce of all
  ``(n + l) m`` update elements among N holders (bandwidth-bound);
* **tall**: one column of N workers - the vertical exchange is an allreduce
  of the ``l x s`` partials among N members.

For each arm: the median seconds per iteration over ``--repeats`` fits, and
what :func:`dask_rpm.cost.predict_breakdown` predicts for it with a network
fitted on this machine's probed latency and bandwidth (``--latency``,
``--bandwidth``; defaults: the probed Dask links of docs/benchmarks.md).

Usage::

    python benchmarks/exchanges.py                 # N = 8 and 16 (~5 min)
    python benchmarks/exchanges.py --workers 8 --repeats 2 --json out.json
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
from typing import Any  # noqa: E402

import dask.config  # noqa: E402
import numpy as np  # noqa: E402
from distributed import Client, LocalCluster  # noqa: E402

import dask_rpm  # noqa: E402
from dask_rpm.comm import Interconnect  # noqa: E402
from dask_rpm.cost import predict_breakdown  # noqa: E402
from dask_rpm.plan.partition import Plan  # noqa: E402
from dask_rpm.planners import make_plan  # noqa: E402

#: (case, vertical, horizontal) arms; the first of each case is the one-hop baseline.
ARMS = {
    "wide": [("allgather", "pairwise"), ("allgather", "ring"), ("allgather", "halving"),
             ("allgather", "tree"), ("allgather", "direct")],
    "tall": [("allgather", "pairwise"), ("leader", "pairwise"), ("ring", "pairwise"),
             ("halving", "pairwise"), ("tree", "pairwise"), ("direct", "pairwise")],
}  # fmt: skip


def _data(n: int, l: int, s: int, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(s, n))
    x[:, -1] = 1.0
    return x, rng.uniform(0.1, 0.9, size=(s, l))


def _plan(case: str, k: int, shape: tuple[int, int, int], s: int, addresses: list[str]) -> Plan:
    if case == "wide":
        return make_plan([1.0] * k, shape, s, method="split-1d", workers=addresses)
    m = shape[1]
    hidden = [m // k + (1 if i < m % k else 0) for i in range(k)]
    return Plan.from_columns([list(range(k))], [s], [hidden], shape=shape).with_workers(addresses)


def _fit(client: Any, x: np.ndarray, d: np.ndarray, plan: Plan, iterations: int) -> Any:
    kw = dict(
        hidden=plan.shape[1],
        learning_rate=1e-4,
        mapping=plan,
        client=client,
        progress="none",
        elastic=False,
    )
    return dask_rpm.fit(x, d, iterations=iterations, interval=iterations, **kw)


def run(ks: list[int], iterations: int, repeats: int, net: Interconnect) -> list[dict[str, Any]]:
    shape, s = (64, 256, 8), 2048
    x, d = _data(shape[0], shape[2], s)
    rows = []
    for k in ks:
        with (
            LocalCluster(
                n_workers=k, threads_per_worker=1, processes=True, dashboard_address=":0"
            ) as cluster,
            Client(cluster) as client,
        ):
            addresses = dask_rpm.ordered_workers(client.scheduler_info())
            for case, arms in ARMS.items():
                plan = _plan(case, k, shape, s, addresses)
                times: dict[tuple[str, str], list[float]] = {a: [] for a in arms}
                ran: dict[tuple[str, str], str] = {}
                for rep in range(repeats + 1):  # the first pass warms up (discarded)
                    for arm in arms:
                        cfg = {"rpm.engine.vertical": arm[0], "rpm.engine.horizontal": arm[1]}
                        with dask.config.set(cfg):
                            r = _fit(client, x, d, plan, iterations)
                        if rep:
                            times[arm].append(r.seconds_per_iteration)
                        ran[arm] = r.history.attrs.get("exchanges", "")
                base = float(np.median(times[arms[0]]))
                for arm in arms:
                    t = float(np.median(times[arm]))
                    pred = predict_breakdown(
                        plan, [1.0] * k, network=net, vertical=arm[0], horizontal=arm[1]
                    )
                    rows.append(
                        {
                            "workers": k,
                            "case": case,
                            "vertical": arm[0],
                            "horizontal": arm[1],
                            "ran": ran[arm],
                            "seconds_per_iteration": t,
                            "runs": times[arm],
                            "vs_one_hop": t / base,
                            "predicted_exchange": float(max(pred["vertical"]) + pred["horizontal"]),
                        }
                    )
                    print(
                        f"  N={k:2d} {case:4s} {arm[0]:9s}/{arm[1]:8s}: {t * 1e3:7.2f} ms/it "
                        f"({t / base:4.2f} x one hop; model's exchange "
                        f"{rows[-1]['predicted_exchange'] * 1e3:6.2f} ms)",
                        file=sys.stderr,
                    )
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, nargs="+", default=[8, 16])
    p.add_argument("--iterations", type=int, default=20)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--latency", type=float, default=0.9e-3, help="seconds per message (probed)")
    p.add_argument("--bandwidth", type=float, default=1.3e9, help="bytes per second (probed)")
    p.add_argument("--json", help="write the rows here")
    a = p.parse_args(argv)
    # speeds are irrelevant to the exchange part of the prediction (compute is charged apart)
    net = Interconnect(latency=a.latency, bandwidth=a.bandwidth, overhead=1e-5)
    rows = run(a.workers, a.iterations, a.repeats, net)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
