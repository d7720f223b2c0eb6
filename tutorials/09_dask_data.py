"""Tutorial 9: train on a zarr store where Dask keeps its chunks, and see which rows move.

Everything runs on this one machine, in a temporary directory removed at the end. We

1. write a multi-file netCDF dataset with xarray: four files of 150 samples each,
   ``x(sample, input)`` and ``d(sample, output)``, as an instrument or a simulation writes
   its output piece by piece;
2. open the four files as one dataset with ``xarray.open_mfdataset``: a Dataset backed by
   dask, one chunk per file along ``sample``;
3. write it to a zarr store (``Dataset.to_zarr``), chunks of 150 samples;
4. start a ``LocalCluster`` of three Dask workers, P1, P2 and P3, and make a plan
   of three columns from abilities 1.0, 0.5, 0.5 (given, as SRPM would measure them on a
   cluster where P1 is twice as fast as the others; this machine's three workers are alike):
   P1's column takes samples [0, 300), chunks 0 and 1; P2's [300, 450), chunk 2; P3's
   [450, 600), chunk 3;
5. train ``dask_rpm.fit`` on the zarr store three times on that plan and print, for each
   worker, the chunks its column reads and which of them came from another worker
   (``FitResult.stats["dask"]``):

   a. the store's path as it is: ``fit`` persists the chunks wherever Dask puts them, so
      some move (how many depends on where Dask put them);
   b. on a fresh cluster (Dask names a store's chunks after the store: on the same cluster
      the first run's chunks would still be where they were), the chunks persisted first on
      the workers of their columns (``dask.annotate``): 0 bytes move;
   c. the same chunks, the plan's workers turned (P2 takes P1's column, P3 P2's, P1 P3's):
      every chunk moves once, worker to worker, never through the client;

   and check each run equals ``dask_rpm.fit_serial`` on the same store (float64, 1e-10).

Needs the zarr package: ``pip install '.[zarr]'``.

Run::

    python tutorials/09_dask_data.py

Takes 10-15 seconds on 2 cores (measured; longer on a busy machine).
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

import dask
import numpy as np
import xarray as xr
from distributed import Client, LocalCluster, futures_of

try:
    import zarr  # noqa: F401 - xarray's zarr backend needs it
except ImportError:
    print("SKIPPED: this tutorial needs zarr: pip install '.[zarr]'")
    sys.exit(0)

import dask_rpm
from dask_rpm.planners import make_plan

FILES, PER_FILE = 4, 150  # four netCDF files of 150 samples: one chunk each
INPUTS, OUTPUTS, HIDDEN = 8, 3, 16
ABILITIES = [1.0, 0.5, 0.5]
TRAIN = dict(hidden=HIDDEN, iterations=30, learning_rate=1e-3)


def make_data(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A learnable task: targets from a random teacher network (the last input is a bias)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(FILES * PER_FILE, INPUTS))
    x[:, -1] = 1.0
    hidden = np.tanh(x @ rng.normal(size=(INPUTS, 5)))
    d = 1.0 / (1.0 + np.exp(-hidden @ rng.normal(size=(5, OUTPUTS))))
    return x, d


def write_files(directory: str) -> list[str]:
    """Step 1: the dataset as four netCDF files, a global ``sample`` coordinate in each."""
    x, d = make_data()
    paths = []
    for i in range(FILES):
        rows = slice(i * PER_FILE, (i + 1) * PER_FILE)
        part = xr.Dataset(
            {"x": (("sample", "input"), x[rows]), "d": (("sample", "output"), d[rows])},
            coords={"sample": np.arange(FILES * PER_FILE)[rows]},
        )
        paths.append(os.path.join(directory, f"part-{i}.nc"))
        part.to_netcdf(paths[-1])
    return paths


def to_zarr(paths: list[str], store: str) -> None:
    """Steps 2 and 3: the files as one dask-backed Dataset, written to a zarr store."""
    with xr.open_mfdataset(paths, combine="nested", concat_dim="sample") as ds:
        print(
            f"xarray.open_mfdataset: {ds.sizes['sample']} samples, x {ds['x'].dims} chunked "
            f"along samples {ds['x'].chunks[0]} - one chunk per file"
        )
        for var in ds.variables.values():
            var.encoding.clear()  # netCDF's storage settings mean nothing to zarr
        ds.to_zarr(store, zarr_format=2)  # zarr 2's consolidated metadata: no format warning
    with xr.open_zarr(store) as z:
        rows = z["x"].chunks[0]
        nbytes = rows[0] * (INPUTS + OUTPUTS) * 8
        print(
            f"wrote the zarr store {os.path.basename(store)}: {len(rows)} chunks of "
            f"{rows[0]} samples ({nbytes} bytes of x and d each)"
        )


def chunks_of(rows: tuple[int, int]) -> list[int]:
    """The chunks holding samples ``[a, b)``."""
    return list(range(rows[0] // PER_FILE, -(-rows[1] // PER_FILE)))


def report(title: str, result: Any, plan: Any, names: dict[str, str], ref: Any) -> None:
    """Which chunks each worker's column read, which came from another worker, the bytes."""
    stats = result.stats["dask"]
    moved: dict[str, list[int]] = {}
    for m in stats["moved"]:
        moved.setdefault(m["worker"], []).append(m["chunk"])
    print(f"\n{title}")
    for c in range(plan.n_columns):
        (w,) = plan.columns[c]
        address = plan.workers[w]
        need = chunks_of(plan.column_samples(c))
        came = sorted(moved.get(address, []))
        held = [j for j in need if j not in came]
        print(
            f"  {names[address]} reads chunks {', '.join(map(str, need)):<5} "
            f"held there: {', '.join(map(str, held)) or '-':<5} "
            f"moved in from another worker: {', '.join(map(str, came)) or '-'}"
        )
    diff = max(
        float(np.abs(p - q).max() / np.abs(q).max()) for p, q in zip(result.params, ref.params)
    )
    print(
        f"  bytes moved: {stats['bytes_moved']}; equal to fit_serial on the same store: "
        f"{diff <= 1e-10} (largest difference {diff:.1e} of the largest weight)"
    )


@contextlib.contextmanager
def cluster(say: bool = False) -> Iterator[tuple[Client, Any, dict[str, str]]]:
    """A LocalCluster of three workers, a client, the plan on them and the workers' names.

    Each part of step 5 that reads the store afresh gets its own cluster: Dask names a store's
    chunks after the store, so on one cluster a second read may find the first run's chunks
    still in the workers' memory, where Dask had put them.
    """
    with (
        LocalCluster(
            n_workers=3, threads_per_worker=1, processes=False, dashboard_address=":0"
        ) as local,
        Client(local) as client,
    ):
        addresses = dask_rpm.ordered_workers(client.scheduler_info(n_workers=-1))
        names = {a: f"P{i + 1}" for i, a in enumerate(addresses)}
        plan = make_plan(
            ABILITIES,
            (INPUTS, HIDDEN, OUTPUTS),
            FILES * PER_FILE,
            method="split-1d",
            workers=addresses,
        )
        if say:
            print(f"\na LocalCluster of {len(addresses)} workers: P1, P2, P3")
            print(f"plan ({plan.method}, abilities {', '.join(map(str, ABILITIES))}):")
            for c in range(plan.n_columns):
                a, b = plan.column_samples(c)
                (w,) = plan.columns[c]
                print(
                    f"  {names[plan.workers[w]]}: samples [{a}, {b}), "
                    f"chunks {', '.join(map(str, chunks_of((a, b))))}"
                )
        yield client, plan, names


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="rpm-tutorial-") as tmp:
        paths = write_files(tmp)
        print(
            f"wrote {len(paths)} netCDF files of {PER_FILE} samples each: "
            f"{', '.join(os.path.basename(p) for p in paths)} "
            f"(x: {INPUTS} inputs, d: {OUTPUTS} outputs)"
        )
        store = os.path.join(tmp, "train.zarr")
        to_zarr(paths, store)
        ref = dask_rpm.fit_serial(store, **TRAIN)  # one process, the store read whole

        # a. the store's path as it is: fit persists the chunks where Dask puts them
        with cluster(say=True) as (client, plan, names):
            r = dask_rpm.fit(store, mapping=plan, client=client, progress="none", **TRAIN)
            report(
                "a. fit on the zarr store's path (chunks where Dask put them):", r, plan, names, ref
            )

        with cluster() as (client, plan, names):
            # b. each chunk persisted on the worker of the column that reads it
            owner = {
                j: plan.workers[plan.columns[c][0]]
                for c in range(plan.n_columns)
                for j in chunks_of(plan.column_samples(c))
            }

            def where(key: Any) -> list[str]:
                # the chunk tasks' keys are (name, row chunk, column chunk); the store's handle
                # (a key of its own) may be on any worker
                return [owner[key[1]]] if isinstance(key, tuple) else list(plan.workers)

            with dask.annotate(workers=where), xr.open_zarr(store) as z:
                x, d = client.persist([z["x"].data, z["d"].data], optimize_graph=False)
                client.gather(futures_of(x) + futures_of(d))  # read, each on its worker
            r = dask_rpm.fit(x, d, mapping=plan, client=client, progress="none", **TRAIN)
            report("b. the chunks persisted on their columns' workers first:", r, plan, names, ref)

            # c. the same chunks; the plan's columns on other workers
            turned = plan.with_workers(plan.workers[1:] + plan.workers[:1])
            r = dask_rpm.fit(x, d, mapping=turned, client=client, progress="none", **TRAIN)
            report("c. the same chunks, the plan's workers turned:", r, turned, names, ref)
            every = FILES * PER_FILE * (INPUTS + OUTPUTS) * 8
            print(f"  every chunk moved once: {r.stats['dask']['bytes_moved'] == every}")


if __name__ == "__main__":
    main()
