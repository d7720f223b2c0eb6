"""Link-aware vs link-blind plans on EMULATED link classes, measured side by side.

EMULATION, not hardware: eight workers on this 2-core machine, EMULATED
speeds 1 : 0.5 alternating, placed on two EMULATED nodes of four workers
(``local_cluster(..., nodes=[0, 0, 0, 0, 1, 1, 1, 1])``). A message between
the nodes waits ``latency + bytes / bandwidth`` more before it is written
(:mod:`dask_rpm.emulation.links`, 5 ms and 2 MB/s by default here, the bytes of
one worker's messages to the other node one after another); within a node
nothing is added. Network 33-256-8, s = 2048: the link-blind plan has four
columns of two workers, so every band of hidden units has holders in four
columns, two of them on the other node; the link-aware plan has one column
per node (its vertical exchange stays on the node) and every band one holder
on the other node.

Two plans of the same planner (``srpm-time``) from the same speeds:

* **link-blind**: the network of ``rpm.cost.*``, one link class for every pair;
* **link-aware**: the same network plus the EMULATED classes and the nodes
  (``cluster.link_network()``), so columns whose members share a node are
  cheaper.

Both are trained with ``dask_rpm.fit(..., mapping=plan)`` on the same cluster,
arms interleaved (blind, aware, blind, ...), several repeats; the result is
the median seconds per iteration of each arm (iterations after the first two
of each run, pooled), their ratio, and what the model
(:func:`dask_rpm.cost.predict_breakdown` on the link-aware network) predicts for
each plan. Each arm's weights are checked against :func:`dask_rpm.fit_serial`
(float64, relative 1e-10).

Usage::

    flock -x /tmp/rpm-cpu.lock python benchmarks/links.py            # ~2 min
    flock -x /tmp/rpm-cpu.lock python benchmarks/links.py --repeats 3 --json links.json
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

#: The case: EMULATED speeds, nodes and the added cross-node delay.
SPEEDS = (1.0, 0.5, 1.0, 0.5, 1.0, 0.5, 1.0, 0.5)
NODES = (0, 0, 0, 0, 1, 1, 1, 1)
SHAPE = (33, 256, 8)
SAMPLES = 2048
ACROSS = (0.005, 2.0e6)  # seconds, bytes per second added between the two nodes


def work_rates(rate: float, scale: float, speeds: Any, shape: tuple[int, int, int]) -> list[float]:
    """Work units (hidden unit x sample) per second of each EMULATED worker: its paced kernel rate."""
    from dask_rpm.nn.kernels import block_work

    n, _, l = shape
    per_unit = block_work("forward", 1, 1, n, l) + block_work("backward", 1, 1, n, l)
    return [rate * v * scale / per_unit for v in speeds]


def plans(
    rates: list[float], aware_net: Any, blind_net: Any, workers: list[str] | None = None
) -> tuple[Any, Any]:
    """The link-blind and link-aware ``srpm-time`` plans of the case (pure planning)."""
    from dask_rpm.planners import make_plan

    kw = dict(method="srpm-time", rates=rates, workers=workers)
    blind = make_plan(list(SPEEDS), SHAPE, SAMPLES, network=blind_net, **kw)
    aware = make_plan(list(SPEEDS), SHAPE, SAMPLES, network=aware_net, **kw)
    return blind, aware


def _data() -> tuple[np.ndarray, np.ndarray]:
    n, _, l = SHAPE
    rng = np.random.default_rng(1)
    x = rng.normal(size=(SAMPLES, n))
    x[:, -1] = 1.0
    return x, rng.uniform(0.1, 0.9, size=(SAMPLES, l))


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), 1e-300))


def run(repeats: int, iterations: int, across: tuple[float, float]) -> dict[str, Any]:
    from distributed import Client

    import dask_rpm
    from dask_rpm.comm import network_from_config
    from dask_rpm.cost import predict_breakdown

    x, d = _data()
    m = SHAPE[1]
    lr = 1e-5
    W0, V0 = dask_rpm.fit_serial(x, d, hidden=m, iterations=iterations, learning_rate=lr).params
    t0 = time.perf_counter()
    with (
        dask_rpm.local_cluster(
            list(SPEEDS), nodes=list(NODES), links={"across": across}, dashboard_address=None
        ) as cluster,
        Client(cluster) as client,
    ):
        label = cluster.emulation_label
        print(label, file=sys.stderr)
        addresses = dask_rpm.ordered_workers(client.scheduler_info())
        rates = work_rates(cluster.rates["float64"], cluster.scale_factor, SPEEDS, SHAPE)
        aware_net, blind_net = cluster.link_network(), network_from_config(None)
        blind, aware = plans(rates, aware_net, blind_net, addresses)
        if blind.columns == aware.columns:
            raise SystemExit("the link-aware and link-blind plans are the same: no case to compare")
        arms = {"blind": blind, "aware": aware}
        predicted = {
            k: predict_breakdown(p, rates, network=aware_net)["total"] for k, p in arms.items()
        }
        believed = predict_breakdown(blind, rates, network=blind_net)["total"]
        kw = dict(hidden=m, learning_rate=lr, client=client, progress="none", elastic=False)
        for p in arms.values():  # warm-up: connections, imports, caches, the peer lookup
            dask_rpm.fit(x, d, iterations=3, interval=3, mapping=p, **kw)
        times: dict[str, list[float]] = {k: [] for k in arms}
        per_run: dict[str, list[float]] = {k: [] for k in arms}
        exact: dict[str, float] = {}
        for rep in range(repeats):
            for k, p in arms.items():
                r = dask_rpm.fit(x, d, iterations=iterations, interval=iterations, mapping=p, **kw)
                t = r.history["iteration_time"].values[2:]
                t = t[np.isfinite(t)]
                times[k].extend(float(v) for v in t)
                per_run[k].append(float(np.median(t)))
                exact[k] = max(exact.get(k, 0.0), _rel(r.params[0], W0), _rel(r.params[-1], V0))
                print(
                    f"  repeat {rep + 1}/{repeats} {k}: {per_run[k][-1] * 1e3:.2f} ms/iteration",
                    file=sys.stderr,
                )
        delayed = client.run(lambda dask_worker: dict(dask_worker.plugins["rpm-links"].sent))
    med = {k: float(np.median(v)) for k, v in times.items()}
    return {
        "emulation": label,
        "speeds": list(SPEEDS),
        "nodes": list(NODES),
        "across": list(across),
        "shape": list(SHAPE),
        "samples": SAMPLES,
        "iterations": iterations,
        "repeats": repeats,
        "plans": {k: [list(c) for c in p.columns] for k, p in arms.items()},
        "measured": med,
        "per_run": per_run,
        "ratio_blind_over_aware": med["blind"] / med["aware"],
        "predicted": predicted,
        "predicted_ratio": predicted["blind"] / predicted["aware"],
        "blind_believed": believed,
        "max_rel_diff_vs_serial": exact,
        "messages_delayed": {
            c: int(sum(v[c] for v in delayed.values())) for c in ("host", "group", "across")
        },
        "loadavg": os.getloadavg()[0],
        "wall": time.perf_counter() - t0,
    }


def report(res: dict[str, Any]) -> str:
    lines = [
        res["emulation"],
        f"EMULATED link classes, {len(res['speeds'])} workers on 2 EMULATED nodes, shape "
        f"{'-'.join(map(str, res['shape']))}, s = {res['samples']}, {res['repeats']} interleaved repeats "
        f"of {res['iterations']} iterations per arm (load {res['loadavg']:.1f})",
        "",
        "| plan (srpm-time) | columns (worker ids) | measured s/iteration | predicted s/iteration | max rel. diff vs fit_serial |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for k, name in (
        ("blind", "link-blind (one link class)"),
        ("aware", "link-aware (EMULATED classes)"),
    ):
        cols = " ".join("{" + ",".join(map(str, c)) + "}" for c in res["plans"][k])
        lines.append(
            f"| {name} | {cols} | {res['measured'][k]:.4f} | {res['predicted'][k]:.4f} | "
            f"{res['max_rel_diff_vs_serial'][k]:.1e} |"
        )
    lines += [
        "",
        f"blind / aware: measured {res['ratio_blind_over_aware']:.2f}x, predicted "
        f"{res['predicted_ratio']:.2f}x (the blind planner believed {res['blind_believed']:.4f} s "
        f"for its plan); messages delayed across nodes {res['messages_delayed']['across']}, "
        f"within nodes (not delayed) {res['messages_delayed']['host']}",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--latency", type=float, default=ACROSS[0], help="added cross-node latency, s")
    ap.add_argument(
        "--bandwidth", type=float, default=ACROSS[1], help="cross-node bandwidth, bytes/s"
    )
    ap.add_argument("--json", help="write the result here")
    args = ap.parse_args(argv)
    res = run(args.repeats, args.iterations, (args.latency, args.bandwidth))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    print(report(res))
    worst = max(res["max_rel_diff_vs_serial"].values())
    if worst > 1e-10:
        raise SystemExit(f"a run differs from fit_serial by {worst:.2e} (> 1e-10)")


if __name__ == "__main__":
    main()
