"""The estimators on Dask's own data (issue 34): the client's memory, REAL.

``MLPClassifier(client=...)`` fits a zarr store (written by xarray, chunked along samples,
1-D class labels), scores it and writes its predictions to another zarr store, all with the
store's rows left on the workers: the classes are found and the labels binarized there,
``predict`` is one task per chunk, ``score`` reductions. A thread samples the client process's
resident memory every 5 ms; the figure is its peak growth over the value just before ``fit``,
as a fraction of the data's bytes. The contrast arm computes the same store into numpy arrays
on the client and fits, scores and predicts them (what a user had to do before). Each arm runs
in its own process (a fresh allocator: freed arrays kept by one arm cannot hide the other's
growth), on its own cluster of ``--workers`` local worker processes (unpaced cores: REAL);
the arms alternate over ``--repeats``. Both arms' fitted weights are compared (float64,
relative 1e-10).

Usage::

    flock -x /tmp/rpm-cpu.lock python benchmarks/dask_estimators.py            # ~2 min
    python benchmarks/dask_estimators.py --rows 50000 --repeats 1              # a quick look
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

FEATURES, CLASSES, HIDDEN = 64, 3, 32


def write_store(path: str, rows: int, chunks: int) -> int:
    """A zarr store of ``x(sample, input)`` and 1-D labels ``d(sample)``; its bytes."""
    import dask.array as da
    import xarray as xr

    rng = da.random.default_rng(0)
    x = rng.normal(size=(rows, FEATURES), chunks=(rows // chunks, FEATURES))
    w = np.random.default_rng(1).normal(size=(FEATURES, CLASSES))
    d = (x @ w).argmax(axis=1)
    xr.Dataset({"x": (("sample", "input"), x), "d": (("sample",), d)}).to_zarr(path)
    return int(rows * FEATURES * 8 + rows * 8)


class Sampler:
    """The client process's peak resident memory, sampled every 5 ms."""

    def __init__(self) -> None:
        import psutil

        self.proc = psutil.Process()
        self.base = self.proc.memory_info().rss
        self.peak = self.base
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(0.005)

    def done(self) -> int:
        self.stop.set()
        self.thread.join()
        self.peak = max(self.peak, self.proc.memory_info().rss)
        return int(self.peak - self.base)


def arm(kind: str, store: str, out: str, workers: int) -> dict[str, Any]:
    """One arm in this process: fit, score, predict; the client's peak growth."""
    import dask.array as da
    import xarray as xr
    from distributed import Client, LocalCluster

    from dask_rpm import MLPClassifier

    warnings.simplefilter("ignore")
    params = dict(
        hidden_layer_sizes=(HIDDEN,), max_iter=1, batch_size=1000, random_state=0, progress=False
    )
    with (
        LocalCluster(
            n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster,
        Client(cluster, set_as_default=False) as c,
    ):
        ds = xr.open_zarr(store)
        est = MLPClassifier(client=c, **params)
        est.fit(np.zeros((4, FEATURES)), np.arange(4) % CLASSES)  # warm: imports, plugins
        t0 = time.perf_counter()
        sampler = Sampler()
        if kind == "dask":
            est.fit(store)
            score = est.score(ds["x"], ds["d"])
            pred = est.predict(ds["x"])
            c.compute(da.to_zarr(pred, out, compute=False), sync=True)
        else:
            x, y = ds["x"].values, ds["d"].values  # the rows computed into the client
            est.fit(x, y)
            score = est.score(x, y)
            np.save(out + ".npy", est.predict(x))
        grown = sampler.done()
        seconds = time.perf_counter() - t0
        coefs = [np.asarray(a).tolist() for a in (*est.coefs_, *est.intercepts_)]
    return {"kind": kind, "grown": grown, "seconds": seconds, "score": score, "params": coefs}


def _rel(a: list[Any], b: list[Any]) -> float:
    return max(
        float(np.abs(np.asarray(p) - np.asarray(q)).max() / np.abs(np.asarray(q)).max())
        for p, q in zip(a, b)
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=400_000)
    p.add_argument("--chunks", type=int, default=8)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--arm", choices=("dask", "numpy"), help=argparse.SUPPRESS)
    p.add_argument("--store", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.arm:  # one arm, in its own process
        print(json.dumps(arm(args.arm, args.store, args.out, args.workers)))
        return 0
    tmp = tempfile.mkdtemp(prefix="rpm-dask-est-")
    try:
        store = os.path.join(tmp, "train.zarr")
        nbytes = write_store(store, args.rows, args.chunks)
        runs: list[dict[str, Any]] = []
        for r in range(args.repeats):
            for kind in ("dask", "numpy") if r % 2 == 0 else ("numpy", "dask"):
                out = os.path.join(tmp, f"pred-{kind}-{r}.zarr")
                cmd = [sys.executable, __file__, "--arm", kind, "--store", store, "--out", out]
                cmd += ["--workers", str(args.workers)]
                done = subprocess.run(cmd, capture_output=True, text=True, check=True)
                runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
                print(
                    f"{kind:5s} repeat {r}: client peak growth {runs[-1]['grown'] / 2**20:8.1f} "
                    f"MiB = {100 * runs[-1]['grown'] / nbytes:6.1f} % of the data; "
                    f"{runs[-1]['seconds']:.1f} s",
                    flush=True,
                )
        dask_runs = [r for r in runs if r["kind"] == "dask"]
        numpy_runs = [r for r in runs if r["kind"] == "numpy"]
        worst = max(r["grown"] for r in dask_runs)
        diff = max(_rel(a["params"], numpy_runs[0]["params"]) for a in dask_runs)
        print(
            f"REAL, {args.workers} local worker processes, data {nbytes / 2**20:.0f} MiB in "
            f"{args.chunks} chunks: client peak growth, dask arm (worst of {len(dask_runs)}) "
            f"{worst / 2**20:.1f} MiB = {100 * worst / nbytes:.1f} % of the data (goal < 5 %); "
            f"numpy arm (median) {np.median([r['grown'] for r in numpy_runs]) / 2**20:.1f} MiB; "
            f"weights equal to relative {diff:.1e}; accuracy "
            f"{dask_runs[0]['score']:.4f} vs {numpy_runs[0]['score']:.4f}"
        )
        return 0 if worst < 0.05 * nbytes and diff < 1e-10 else 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
