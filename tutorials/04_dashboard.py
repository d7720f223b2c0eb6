"""Tutorial 4: watch rpm training live on the Dask dashboard.

Starts an EMULATED heterogeneous local cluster (three workers at speeds 1.0,
0.5 and 0.25 on this one machine), prints the URL of the ``/rpm`` dashboard
page, trains a 32-256-8 network on 4096 samples with DRPM (abilities
estimated while training, rectangles re-mapped; at this size an iteration is
mostly computation, so the estimates show the speeds), then reads
``/rpm/state.json`` - the page's data - prints a short summary and holds the
page's estimates and rectangles against the EMULATED speeds. Takes about 5
seconds on 2 cores (measured).

Run::

    python tutorials/04_dashboard.py            # train, summarise, exit
    python tutorials/04_dashboard.py --hold 120 # keep the cluster up 2 min to look at /rpm

Open the printed URL in a browser while it trains (or during ``--hold``): the
page refreshes itself every 500 ms. See docs/dashboard.md for what it shows.
"""

from __future__ import annotations

import argparse
import json
import time
import urllib.request

import numpy as np
from distributed import Client

import dask_rpm
from dask_rpm.demo.evidence import overrun_counts, speed_check
from dask_rpm.emulation import emulation_info

SPEEDS = [1.0, 0.5, 0.25]  # EMULATED relative speeds


def make_data(
    samples: int = 4096, inputs: int = 32, outputs: int = 8, seed: int = 4
) -> tuple[np.ndarray, np.ndarray]:
    """A fixed, learnable task: ``d_k = 1`` when a random linear form of ``x`` is positive."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(samples, inputs))
    d = (x @ rng.normal(size=(inputs, outputs)) > 0).astype(float)
    return x, d


def fetch_state(base: str) -> dict:
    """What the /rpm page shows, as JSON (the latest run)."""
    with urllib.request.urlopen(base + "/rpm/state.json", timeout=30) as f:
        return json.load(f)


def _fmt(value: float | None, spec: str, scale: float = 1.0) -> str:
    return "-" if value is None else format(scale * value, spec)  # JSON null: not measured


def summarise(state: dict) -> None:
    s = state["summary"]
    print(
        f"\nrun {state['run']}: {s['iterations_done']}/{s['iterations_total']} iterations, "
        f"error {_fmt(s['last_error'], '.1f')}, median iteration {_fmt(s['median_time'], '.0f', 1e3)} ms"
    )
    print(f"remaps: {s['remaps']['whole']} whole, {s['remaps']['column']} column")
    for r in state["remaps"]:
        print(f"  iteration {r['iteration']}: {r['kind']} remap ({r.get('reason', '')})")
    print(f"current plan ({s['method']}), samples x hidden units per worker:")
    for r in state["rectangles"]:
        print(
            f"  w{r['worker']} {r['address']}: samples {r['samples'][0]}-{r['samples'][1]}, "
            f"hidden {r['hidden'][0]}-{r['hidden'][1]}, area {_fmt(r['ability'], '.2f')}, "
            f"estimated ability {_fmt(r['estimate'], '.2f')}"
        )
    if state.get("emulation"):
        print(state["emulation"])  # every result from an emulated cluster carries this label


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--hold", type=float, default=0.0, help="seconds to keep the cluster up afterwards"
    )
    parser.add_argument("--iterations", type=int, default=60)
    args = parser.parse_args()

    x, d = make_data()
    # Loopback only: the dashboard has no authentication.
    with (
        dask_rpm.local_cluster(SPEEDS, dashboard_address="127.0.0.1:0") as cluster,
        Client(cluster) as client,
    ):
        base = f"http://127.0.0.1:{client.scheduler_info()['services']['dashboard']}"
        print(
            f"dashboard: {base}/rpm   (Dask's own pages: {base}/status; JSON: {base}/rpm/state.json)"
        )
        print(cluster.emulation_label)
        result = dask_rpm.fit(
            x,
            d,
            hidden=256,
            iterations=args.iterations,
            learning_rate=1e-4,
            mapping="drpm",
            seed=0,
            client=client,
        )
        print(result)
        state = fetch_state(base)
        summarise(state)
        blocks, overruns = overrun_counts(emulation_info(client))
        print("the run against the EMULATED speeds:")
        for line in speed_check(result, SPEEDS, blocks=blocks, overruns=overruns).lines():
            print("  " + line)
        if args.hold > 0:
            print(f"\nholding the cluster for {args.hold:.0f} s: open {base}/rpm")
            time.sleep(args.hold)


if __name__ == "__main__":  # worker processes re-import this module
    main()
