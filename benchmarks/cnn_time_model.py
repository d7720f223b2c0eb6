"""EMULATED: the seed's CNN time model against measured runs of a scaled-down VGG-like network.

Issue 32: "validate the seed's time model against measured EMULATED runs of a scaled-down VGG-like
network on this machine; predicted against measured seconds per iteration within 15 %".

The network has Table 1's form - conv stages, then one fully connected layer that holds most of
the weights - at a size this machine trains in seconds: 3x32x32 inputs, cv1 conv 3->32, cv2 conv
32->64, cv3 conv 64->64 (each k3 p1, ReLU, max-pool 2), fc1 linear 1024->512 (ReLU; 90 % of the
weights), and the 512->10 output layer (counted with fc1, as the engine's work model does).
float64, cross-entropy, plain SGD.

Four EMULATED workers of equal speed (``dask_rpm.local_cluster([1, 1, 1, 1])``) train it with two
plans at a few global mini-batches B (one iteration = one step on B images):

* ``data``: data parallel, 4 columns of 1 (the seed's "data"; local mini-batch N = B / 4);
* ``split-2``: 2 columns of 2 workers, each column cutting every stage's channels in halves (the
  rectangle model's hv3-like plan: the seed's ``channel_split`` with k = 2; N = B / 2).

Predicted seconds per iteration come from ``dask_rpm.cost.cnn_model`` (``data_parallel``,
``channel_split``) fed with this network and this machine:

* ``P``: the EMULATED rate of a speed-1.0 worker in flop equivalents per second, the unit pacing
  uses (``rate x scale``, ``dask_rpm.nn.cnn.cnn_work`` counts the work);
* ``NW``: this machine's link bandwidth between two workers, measured by ``dask_rpm`` 's link probe
  on the same cluster (Dask transfers of 8 MB over loopback);
* "seed as written": ``T_L = forward flop / P`` for conv layers and ``T_L = param bytes / M`` for
  fc1 (memory-bound), with ``M = P / 10`` (Table 2's balance, 4 TFLOP/s to 400 GB/s), backward =
  forward;
* "seed, pacing's work": the same formulas (``T1 = 2 N sum T_L``, ``T2``, ``T3``), every layer's
  ``T_L`` = half its forward + backward work per sample (``cnn_work``) over ``P``, so that ``2 T_L``
  is what pacing charges for a sample (backward is 2x forward beyond the first stage), fc1
  included.

Measured: the median iteration time over the second half of each run, and the engine's phases
(compute = forward + backward, the column's exchanges, the horizontal exchange, the update)
against ``T1``, ``T2``, ``T3``. Runs are interleaved over ``--repeats`` repeats; the table gives
the median of the repeats' medians (and their range). Each configuration's weights are compared
with ``fit_serial`` (float64). The EMULATED rate fraction is lowered to ``--rate-fraction`` (0.08)
for the reason ``benchmarks/cnn_emulated.py`` gives (the float64 conv kernels are slower per flop
than the GEMM the rate is calibrated on).

Run::

    python3 benchmarks/cnn_time_model.py              # about 3 minutes on 2 cores
    python3 benchmarks/cnn_time_model.py --repeats 1 --batches 8,32 --json out.json

Every measured figure is EMULATED (paced workers on one machine); the predictions are a MODEL.
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

IMAGE = (3, 32, 32)
CLASSES = 10
WORKERS = 4
LR = 0.01
ITEMSIZE = 8  # float64


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
        tnn.Conv2d(64, 64, 3, padding=1),
        tnn.ReLU(),
        tnn.MaxPool2d(2),
        tnn.Flatten(),
        tnn.Linear(64 * 4 * 4, 512),
        tnn.ReLU(),
        tnn.Linear(512, CLASSES),
    ).double()


def data(samples: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    labels = rng.permutation(np.arange(samples) % CLASSES)
    # one-hot targets: a batch of 8 holds only 8 of the 10 classes
    return rng.normal(size=(samples, *IMAGE)), np.eye(CLASSES)[labels]


def seed_layers(layers: Any) -> tuple[list[Any], list[Any], dict[str, Any]]:
    """The network as the seed's Table 1 rows, twice: as written (forward flop; fc1 memory-bound)
    and with pacing's work (every layer ``flop`` = (forward + backward work) / 2 per sample)."""
    from dask_rpm.cost.cnn_model import Layer
    from dask_rpm.nn.cnn import cnn_work

    shapes = layers.full_shapes()
    names = layers.names
    written, paced, rows = [], [], []
    for k, st in enumerate(layers.stages):
        last = k == layers.depth - 1
        params = sum(
            int(np.prod(s)) for s, p, n in zip(shapes, layers.params, names) if p.layer == k
        )
        flop = st.flop() * st.channels + (2.0 * layers.l * st.units * st.positions if last else 0)
        fwd = cnn_work("forward", k, 1, layers.hidden, layers)
        bwd = cnn_work("backward", k, 1, layers.hidden, layers)
        inp = layers.inputs(k) * ITEMSIZE
        out = (layers.l if last else st.units * st.positions) * ITEMSIZE
        same = sum(1 for s in layers.stages[: k + 1] if s.kind == st.kind)
        name = f"{'cv' if st.kind == 'conv' else 'fc'}{same}" + ("+out" if last else "")
        kind = "conv" if st.kind == "conv" else "fc"
        written.append(Layer(name, kind, flop, params * ITEMSIZE, inp, out))
        paced.append(Layer(name, "conv", 0.5 * (fwd + bwd), params * ITEMSIZE, inp, out))
        rows.append(
            dict(
                layer=name,
                forward_flop=flop,
                forward_work=fwd,
                backward_work=bwd,
                params=params,
                input_bytes=inp,
                output_bytes=out,
            )
        )
    return written, paced, {"rows": rows}


def plans(layers: Any, batch: int) -> dict[str, Any]:
    from dask_rpm.plan.partition import Plan

    m = layers.m
    return {
        "data": Plan.from_columns(
            [[i] for i in range(WORKERS)],
            [batch // WORKERS] * WORKERS,
            [[m]] * WORKERS,
            shape=layers.plan_shape,
        ),
        "split-2": Plan.from_columns(
            [[0, 1], [2, 3]],
            [batch // 2] * 2,
            [[m // 2, m - m // 2]] * 2,
            shape=layers.plan_shape,
        ),
    }


def predict(plan: str, batch: int, network: list[Any], machine: Any) -> Any:
    from dask_rpm.cost.cnn_model import channel_split, data_parallel

    if plan == "data":
        return data_parallel(batch / WORKERS, network, machine)
    return channel_split(batch / 2, 2, network, machine)


def phases(r: Any) -> dict[str, float]:
    """Median seconds per phase over the second half of a run, averaged over the workers."""
    h = r.history
    n = h.sizes["iteration"]
    out = {}
    for p in ("forward", "backward", "vertical_wait", "horizontal", "modify"):
        if p in h:
            v = np.asarray(h[p].values, dtype=float)[n // 2 :]
            out[p] = float(np.nanmean(np.nanmedian(v, axis=0)))
    t = np.asarray(h["iteration_time"].values, dtype=float)[n // 2 :]
    out["iteration"] = float(np.nanmedian(t))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="8,16,32,64", help="global mini-batches B")
    ap.add_argument("--iterations", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rate-fraction", type=float, default=0.08)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    if any(b % WORKERS for b in batches):
        ap.error(f"every batch must be a multiple of {WORKERS}")

    from distributed import Client

    import dask_rpm
    from dask_rpm.cost.cnn_model import Machine
    from dask_rpm.emulation import emulation_report
    from dask_rpm.nn.cnn_records import conv_layers
    from dask_rpm.probe import probe

    t_start = time.time()
    layers = conv_layers(network(), IMAGE, CLASSES)
    written, paced, table = seed_layers(layers)
    kw: dict[str, Any] = dict(loss="cross-entropy", learning_rate=LR, seed=0)
    dask.config.set({"rpm.emulation.rate-fraction": args.rate_fraction})
    results: dict[tuple[str, int], list[dict[str, Any]]] = {}
    diffs: dict[tuple[str, int], float] = {}
    with (
        dask_rpm.local_cluster([1.0] * WORKERS, dashboard_address=None) as cluster,
        Client(cluster) as client,
    ):
        label = cluster.emulation_label
        rate = cluster.rates["float64"] * cluster.scale_factor
        links = probe(client, shape=(33, 8, 2), samples=64)
        nw = float(links.attrs["bandwidth"])
        msg = float(links.attrs["message_latency"])
        print(f"# {label}")
        print(f"# network: {' | '.join(layers.describe())}")
        print(
            f"# P = {rate / 1e9:.3f} G flop equivalents/s per worker (rate-fraction "
            f"{args.rate_fraction} x scale {cluster.scale_factor:.3f}); NW = {nw / 1e9:.2f} GB/s "
            f"(link probe, 8 MB transfers); message latency {msg * 1e3:.2f} ms (not in the seed's "
            f"model); seed as written: M = P / 10 = {rate / 10 / 1e9:.3f} GB/s"
        )
        print(
            "| layer | forward flop/sample | forward + backward work/sample | params | input B | output B |"
        )
        print("|---|---:|---:|---:|---:|---:|")
        for row in table["rows"]:
            print(
                f"| {row['layer']} | {row['forward_flop'] / 1e6:.2f} M | "
                f"{(row['forward_work'] + row['backward_work']) / 1e6:.2f} M | {row['params']:,} | "
                f"{row['input_bytes']:,} | {row['output_bytes']:,} |"
            )
        o0 = sum(r["overruns"] for r in emulation_report(client))
        b0 = sum(r["blocks"] for r in emulation_report(client))
        for rep in range(args.repeats):
            for batch in batches:
                x, y = data(batch)
                for name, plan in plans(layers, batch).items():
                    r = dask_rpm.fit(
                        x,
                        y,
                        network=network(),
                        mapping=plan.with_workers(cluster.worker_names()),
                        iterations=args.iterations,
                        interval=args.iterations,
                        client=client,
                        progress="none",
                        **kw,
                    )
                    ph = phases(r)
                    ph["exchanges"] = str(r.history.attrs.get("exchanges", ""))
                    results.setdefault((name, batch), []).append(ph)
                    if (name, batch) not in diffs:
                        ref = dask_rpm.fit_serial(
                            x, y, network=network(), iterations=args.iterations, **kw
                        )
                        diffs[(name, batch)] = max(
                            float(np.max(np.abs(np.asarray(a) - b)) / np.max(np.abs(b)))
                            for a, b in zip(r.params, ref.params)
                        )
                    print(
                        f"#   repeat {rep + 1}: {name} B={batch}: {ph['iteration'] * 1e3:.1f} ms "
                        f"(load {os.getloadavg()[0]:.1f})",
                        flush=True,
                    )
        o1 = sum(r["overruns"] for r in emulation_report(client))
        b1 = sum(r["blocks"] for r in emulation_report(client))

    m_written = Machine(flops=rate, memory_bandwidth=rate / 10, network_bandwidth=nw)
    m_paced = Machine(flops=rate, memory_bandwidth=rate / 10, network_bandwidth=nw)
    out_rows = []
    print(
        f"\n# paced-block overruns {o1 - o0} of {b1 - b0}; max relative difference of the weights "
        f"vs fit_serial {max(diffs.values()):.1e}"
    )
    print(
        "| plan | B | N per set | measured ms (range) | seed as written ms | error | "
        "seed, pacing's work ms (T1 + T2 + T3) | error | measured compute / exchanges / update ms | "
        "T1 vs measured compute |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for (name, batch), reps in sorted(results.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        meas = np.array([p["iteration"] for p in reps])
        med = float(np.median(meas))
        pw = predict(name, batch, written, m_written)
        pp = predict(name, batch, paced, m_paced)
        comp = float(np.median([p["forward"] + p["backward"] for p in reps]))
        exch = float(
            np.median([p.get("vertical_wait", 0.0) + p.get("horizontal", 0.0) for p in reps])
        )
        upd = float(np.median([p["modify"] for p in reps]))
        err_w = (pw.total - med) / med
        err_p = (pp.total - med) / med
        out_rows.append(
            dict(
                plan=name,
                batch=batch,
                local_batch=pp.local_batch,
                measured=meas.tolist(),
                measured_median=med,
                seed_written=pw._asdict(),
                seed_paced=pp._asdict(),
                error_written=err_w,
                error_paced=err_p,
                compute=comp,
                exchanges=exch,
                update=upd,
                phases=reps,
                max_rel_diff_vs_serial=diffs[(name, batch)],
            )
        )
        print(
            f"| {name} | {batch} | {pp.local_batch:g} | {med * 1e3:.1f} ({meas.min() * 1e3:.1f}-"
            f"{meas.max() * 1e3:.1f}) | {pw.total * 1e3:.1f} | {err_w:+.1%} | {pp.total * 1e3:.1f} "
            f"({pp.t1 * 1e3:.1f} + {pp.t2 * 1e3:.1f} + {pp.t3 * 1e3:.1f}) | {err_p:+.1%} | "
            f"{comp * 1e3:.1f} / {exch * 1e3:.1f} / {upd * 1e3:.1f} | {(pp.t1 - comp) / comp:+.1%} |"
        )
    within = sum(abs(r["error_paced"]) <= 0.15 for r in out_rows)
    print(
        f"# goal: predicted within 15 % of measured: seed with pacing's work {within} of "
        f"{len(out_rows)}; seed as written "
        f"{sum(abs(r['error_written']) <= 0.15 for r in out_rows)} of {len(out_rows)}"
    )
    print(f"# exchanges: {sorted({p['exchanges'] for reps in results.values() for p in reps})}")
    print(f"# wall {time.time() - t_start:.0f} s")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(
                dict(
                    label=label,
                    args=vars(args),
                    P=rate,
                    NW=nw,
                    message_latency=msg,
                    layers=table["rows"],
                    rows=out_rows,
                    overruns=o1 - o0,
                    blocks=b1 - b0,
                ),
                f,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
