"""SIMULATION to 4096 workers: SRPM-time against SRPM, split-1d and the best uniform grid.

Nothing here is measured: :func:`dask_rpm.bench.simulate.simulate` predicts seconds
per iteration with the cost model for the plans each method makes, and gamma
from them (weak scaling s = 4096 N on the compute workload 203-1024-26).

Two speed mixes: condition A of the paper's profile repeated (``A``) and a
bimodal CPU+GPU-like mix, half the workers 20x slower than the other half
(``two:0.5,0.05``). Exchanges: the scalable allreduces of
:mod:`dask_rpm.comm.exchange` (``--exchanges scalable``, default) or what the engine
sends today (``engine``).

Writes ``docs/img/simulate-scaling.png`` (or ``--plot``) and prints the
markdown tables; ``--json`` keeps the numbers::

    python benchmarks/simulate_scaling.py                     # ~5 minutes on 2 cores
    python benchmarks/simulate_scaling.py --exchanges engine --plot /tmp/x.png
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import numpy as np

from dask_rpm.bench.simulate import DEFAULT_NS, simulate

MIXES = {
    "A": "condition A (0.25 ... 1, repeated)",
    "two:0.5,0.05": "bimodal 1:20 (half at 0.05, half at 1)",
}
OUT = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), os.pardir, "docs", "img", "simulate-scaling.png"
)


def run(
    exchanges: str,
    ns: list[int],
    latency: float,
    bandwidth: float,
    overhead: float,
    unit_rate: float,
) -> dict[str, Any]:
    out = {}
    for mix in MIXES:
        t0 = time.perf_counter()
        out[mix] = simulate(
            ns=ns,
            distribution=mix,
            shape=(203, 1024, 26),
            samples_per_worker=4096,
            latency=latency,
            bandwidth=bandwidth,
            unit_rate=unit_rate,
            overhead=overhead,
            exchanges=exchanges,
        )
        print(f"  {mix}: {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return out


def table(ds: Any) -> str:
    methods = ds["method"].values.tolist()
    others = [m for m in methods if m != "srpm-time"]
    lines = [
        "| N | "
        + " | ".join(f"{m} s/it | {m} gamma" for m in methods)
        + " | SRPM-time vs best other |",
        "| ---: |" + " ---: | ---: |" * len(methods) + " ---: |",
    ]
    for j, n in enumerate(ds["N"].values):
        t = {m: ds["seconds_per_iteration"].values[k, j] for k, m in enumerate(methods)}
        g = {m: ds["gamma"].values[k, j] for k, m in enumerate(methods)}
        best = min(t[m] for m in others)
        cells = " | ".join(f"{t[m]:.4f} | {g[m]:.3f}" for m in methods)
        lines.append(f"| {n} | {cells} | {best / t['srpm-time']:.3f}x |")
    return "\n".join(lines) + "\n"


def plot(results: dict[str, Any], path: str, exchanges: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5), sharex=True)
    for row, (mix, ds) in enumerate(results.items()):
        a, b = axes[row]
        for k, m in enumerate(ds["method"].values.tolist()):
            style = dict(marker="o", lw=2.2 if m == "srpm-time" else 1.2, label=m)
            a.loglog(ds["N"].values, ds["seconds_per_iteration"].values[k], **style)
            b.semilogx(ds["N"].values, ds["gamma"].values[k], **style)
        a.set_ylabel("predicted s / iteration")
        b.set_ylabel("predicted gamma")
        b.set_ylim(0, 1.05)
        b.axhline(0.5, color="grey", lw=0.8, ls=":")
        a.set_title(MIXES[mix], fontsize=9)
        b.set_title(MIXES[mix], fontsize=9)
        for ax in (a, b):
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    for ax in axes[-1]:
        ax.set_xlabel("workers N (weak scaling, s = 4096 N)")
    ds = next(iter(results.values()))
    fig.suptitle(
        f"SIMULATION (cost model, not measured): 203-1024-26, latency {ds.attrs['latency'] * 1e3:g} ms, "
        f"{ds.attrs['bandwidth'] / 1e9:g} GB/s, overhead {ds.attrs['overhead'] * 1e6:g} us/message, "
        f"{exchanges} exchanges, {ds.attrs['unit_rate']:g} work units/s at speed 1",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--exchanges", default="scalable", choices=("scalable", "engine", "paper"))
    p.add_argument("--n", default=",".join(map(str, DEFAULT_NS)))
    p.add_argument("--latency", type=float, default=9e-4)
    p.add_argument("--bandwidth", type=float, default=1.3e9)
    p.add_argument("--overhead", type=float, default=1e-5)
    p.add_argument("--unit-rate", type=float, default=1.25e7)
    p.add_argument("--plot", default=OUT)
    p.add_argument("--json", help="write the numbers here")
    args = p.parse_args(argv)
    ns = [int(v) for v in args.n.split(",")]
    results = run(args.exchanges, ns, args.latency, args.bandwidth, args.overhead, args.unit_rate)
    for mix, ds in results.items():
        print(f"\nSIMULATION, {MIXES[mix]}, {args.exchanges} exchanges\n")
        print(table(ds))
    if args.plot:
        plot(results, args.plot, args.exchanges)
        print(f"wrote {args.plot}", file=sys.stderr)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    mix: {
                        "N": ds["N"].values.tolist(),
                        "method": ds["method"].values.tolist(),
                        "seconds_per_iteration": ds["seconds_per_iteration"].values.tolist(),
                        "gamma": ds["gamma"].values.tolist(),
                        "n_columns": np.asarray(ds["n_columns"].values).tolist(),
                    }
                    for mix, ds in results.items()
                },
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
