"""Tutorial 2: train on a local EMULATED heterogeneous cluster and read the history with xarray.

Everything runs on this one machine. ``dask_rpm.local_cluster`` starts three
Dask workers whose BP kernels are slowed to relative speeds 1.0, 0.5 and 0.25
(EMULATED heterogeneity: same cores, slow workers sleep after each block). We

1. train a 32-256-8 network on 4096 samples with DRPM (the default mapping):
   it starts from a uniform plan, estimates each worker's ability from the
   workers' own kernel timings, and remaps the rectangles. The size matters:
   an iteration must be mostly computation (here about 15 ms per worker
   against a few ms of exchanges), or the timings measure latency and say
   nothing about speed;
2. check the result equals serial back-propagation (``dask_rpm.fit_serial``);
3. read ``result.history`` - an ``xarray.Dataset`` with units and
   descriptions - for the error curve, per-worker phase times and the
   ability estimates, and ``result.plans_dataset()`` for the rectangles;
4. hold the estimates and the final plan against the EMULATED speeds
   (``dask_rpm.demo.evidence.speed_check``): both within 10 %, or the reason not;
5. save the history as netCDF (and, with ``--png``, a picture of the run).

Run::

    python tutorials/02_local_training.py
    python tutorials/02_local_training.py --png run.png --netcdf history.nc

Takes about 6 seconds on 2 cores (measured; longer on a busy machine). Progress goes to stderr (a bar on a terminal, plain
lines otherwise); pass ``progress=False`` to ``fit`` to silence it.
"""

from __future__ import annotations

import argparse
import os
import tempfile

import numpy as np
import xarray as xr
from distributed import Client

import dask_rpm
from dask_rpm.demo.evidence import overrun_counts, speed_check
from dask_rpm.emulation import emulation_info

SPEEDS = [1.0, 0.5, 0.25]  # EMULATED relative speeds


def make_data(
    samples: int = 4096, inputs: int = 32, outputs: int = 8, seed: int = 2
) -> tuple[np.ndarray, np.ndarray]:
    """A learnable task: ``d_k = 1`` when a random linear form of ``x`` is positive (last input = bias)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(samples, inputs))
    x[:, -1] = 1.0
    d = (x @ rng.normal(size=(inputs, outputs)) > 0).astype(float)
    return x, d


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=60)
    parser.add_argument("--png", help="save a picture of the run here (needs matplotlib)")
    parser.add_argument("--netcdf", help="save the history here (default: a temporary file)")
    args = parser.parse_args()

    x, d = make_data()
    hidden, lr = 256, 1e-4
    with (
        dask_rpm.local_cluster(SPEEDS, dashboard_address=":0") as cluster,
        Client(cluster) as client,
    ):
        print(cluster.emulation_label)  # results from an emulated cluster always say so
        # 1. Train. mapping="drpm" is the default; abilities=None: DRPM measures them.
        result = dask_rpm.fit(
            x, d, hidden=hidden, iterations=args.iterations, learning_rate=lr, client=client
        )
        # paced kernel blocks that ran late: the machine was too busy for the emulated speeds
        blocks, overruns = overrun_counts(emulation_info(client))
    print(result)

    # 2. Exactly serial BP: the rectangles change where the arithmetic runs, not its result.
    ref = dask_rpm.fit_serial(x, d, hidden=hidden, iterations=args.iterations, learning_rate=lr)
    (W, V), err = ref.params, ref.errors
    dev_w = max(
        np.abs(result.params[0] - W).max() / np.abs(W).max(),
        np.abs(result.params[-1] - V).max() / np.abs(V).max(),
    )
    dev_e = np.abs(result.history["error"].values - err).max() / np.abs(err).max()
    print(
        f"equal to serial BP up to float64 rounding: {dev_w < 1e-10 and dev_e < 1e-10} "
        f"(largest difference {dev_w:.1e} of the largest weight, {dev_e:.1e} of the largest error)"
    )

    # 3. The history.
    h = result.history
    print("\nhistory variables:")
    for name, var in h.data_vars.items():
        print(
            f"  {name:<15} {str(var.dims):<25} [{var.attrs.get('units', '')}] {var.attrs.get('description', '')}"
        )
    e = h["error"]
    print(
        f"\nerror: {float(e[0]):.1f} at iteration 0 -> {float(e[-1]):.1f} at iteration {int(h.iteration[-1])}"
    )
    print(f"median iteration time: {float(h['iteration_time'].median()) * 1e3:.1f} ms")

    print("\nmean compute time per iteration (forward + backward + modify), by worker and plan:")
    compute = (h["forward"] + h["backward"] + h["modify"]) * 1e3
    starts = [0] + [r["iteration"] for r in result.remaps] + [int(h.iteration[-1]) + 1]
    for k, (a, b) in enumerate(zip(starts[:-1], starts[1:])):
        part = compute.sel(iteration=slice(a, b - 1)).mean("iteration")
        cells = "  ".join(
            f"w{int(w)} (speed {SPEEDS[int(w)]:.2f}): {float(v):5.1f} ms"
            for w, v in zip(part.worker, part)
        )
        print(f"  plan {k} (iterations {a}-{b - 1}): {cells}")

    if "ability" in h:
        print(
            "\nability estimates at the DRPM checks (normalised; EMULATED speeds are "
            f"{', '.join(f'{s / sum(SPEEDS):.2f}' for s in SPEEDS)}):"
        )
        for i, it in enumerate(h["check_iteration"].values):
            print(
                f"  after iteration {int(it):>3}: "
                + ", ".join(f"{v:.2f}" for v in h["ability"].values[i])
            )
    for r in result.remaps:
        print(
            f"remap at iteration {r['iteration']}: {r['kind']} ({r.get('reason', '')}), "
            f"{r['bytes']} weight bytes moved, {r.get('sample_bytes', 0)} sample bytes re-read"
        )

    plans = result.plans_dataset()
    print("\nrectangles (samples x hidden units) of each plan:")
    for p in plans.plan.values:
        sel = plans.sel(plan=p)
        rects = "; ".join(
            f"w{w}: {int(sel.sample_stop[w] - sel.sample_start[w])} x {int(sel.hidden_stop[w] - sel.hidden_start[w])}"
            for w in range(plans.sizes["worker"])
            if bool(sel.planned[w])
        )
        print(
            f"  plan {int(p)} ({str(sel.kind.values)}, {str(sel.method.values)}, from iteration "
            f"{int(sel.from_iteration)}): {rects}"
        )

    # 4. Did the run show the method? Estimates and areas against the speeds we chose.
    print("\nthe run against the EMULATED speeds:")
    for line in speed_check(result, SPEEDS, blocks=blocks, overruns=overruns).lines():
        print("  " + line)

    # 5. Save and read back (into a temporary directory removed at the end, unless --netcdf).
    with tempfile.TemporaryDirectory(prefix="rpm-tutorial-") as tmp:
        path = args.netcdf or os.path.join(tmp, "history.nc")
        h.to_netcdf(path)
        with xr.open_dataset(path) as back:
            print(
                f"\nsaved the history to {path if args.netcdf else 'a temporary file'} "
                f"({back.sizes['iteration']} iterations; error units {back['error'].attrs['units']!r}; "
                f"emulation: {back.attrs.get('emulation', 'no')})"
            )
    if args.png:
        result.plot(args.png)
        print(f"saved a picture of the run to {args.png}")


if __name__ == "__main__":  # worker processes re-import this module
    main()
