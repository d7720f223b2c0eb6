"""Training on Dask's own data (issue 34): larger than memory, the client's memory, placement.

Three measurements, each labelled:

1. **REAL, larger than memory.** A zarr store (written by xarray, chunked along samples) of
   ``--gib`` GiB, at least 3x each worker's ``--memory-limit``, trains one epoch of mini-batches
   on ``--workers`` local worker processes (unpaced cores) with that memory limit: Dask spills
   the persisted chunks to the workers' disks, and each worker holds at most a window
   (``rpm.engine.sample-window``) of its column's rows. The goal: no worker fails (none lost,
   none restarted by its nanny), and the epoch takes at most 1.5x the same epoch from memory
   (numpy arrays: every worker holds the whole training set, on a cluster without a memory
   limit). The shuffles of ``--shuffles``: by default the chunk stream (``shuffle="stream"``,
   made for this: a window reads only the chunks it visits; the memory arm trains on the same
   batches through ``shuffle=ChunkOrder(chunks, stream=True)``); ``true`` and ``chunks`` read
   every chunk in every window, from the workers' disks once Dask spilled them. The arms
   alternate (zarr, memory, memory, zarr, ...); both arms' weights are compared.
2. **REAL, the client's memory.** During the zarr arm a thread samples the client process's
   resident memory every 5 ms: its peak growth over the value before ``fit`` must stay under
   5 % of the data's bytes (the rows never pass through the client).
3. **EMULATED, placement.** Two paced workers of speeds 1 : 0.5; the training set in chunks
   placed to match the speeds (the fast worker holds 2/3 of the rows) or 2 : 1 against them
   (the slow worker holds 2/3). The plan follows the speeds either way, so a column fetches
   the rows it lacks from the other worker. gamma = (seconds per iteration, matched) /
   (seconds per iteration, against), goal >= 0.9, for full batch and for mini-batches with
   the chunk-local shuffle; interleaved repeats, gamma the median of the pairs' ratios.
   Seconds per iteration count the whole run of ``fit`` (placing the rows included):
   ``stats["call"]``'s place + blocks over the iterations.
4. **EMULATED, DRPM's remaps on chunks.** Three paced workers of speeds 1 : 0.3 : 0.6, DRPM
   from a uniform start remapping at every check (t-line 1.0), full batch on chunks of
   ``--remap-chunk`` rows. Arms: the remaps' sample cuts snapped to chunk boundaries
   (``rpm.planner.chunk-imbalance`` 0.05, the default) against left where the speeds put them
   (0). Reported: remaps, the bytes of chunks moved to workers by the remaps (plan versions
   after the first), seconds per iteration; interleaved repeats, medians.

Usage::

    python benchmarks/dask_data.py --chunk-mb 4 --window "16 MiB" --hidden 256 --repeats 1
    python benchmarks/dask_data.py --skip-real --repeats 5           # the EMULATED parts alone
    python benchmarks/dask_data.py --gib 0.3 --memory-limit 1GB --repeats 1 --skip-emulated
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

N_IN, N_OUT = 64, 8  # inputs (the last a constant 1) and outputs
ROW = (N_IN + N_OUT) * 8  # bytes of one sample, float64


def _block(block_id: tuple[int, ...], rows: int, cols: int, kind: str) -> np.ndarray:
    """One chunk of the synthetic data, from its own seed: the same rows however they are made."""
    rng = np.random.default_rng((7, block_id[0], 0 if kind == "x" else 1))
    if kind == "x":
        a = rng.normal(size=(rows, cols))
        a[:, -1] = 1.0
        return a
    return rng.uniform(0.1, 0.9, size=(rows, cols))


def _lazy(samples: int, chunk: int) -> tuple[Any, Any]:
    """x and d as dask arrays of ``chunk``-row chunks, each made from its own seed."""
    import dask.array as da

    chunks = (tuple(min(chunk, samples - i) for i in range(0, samples, chunk)),)
    out = []
    for kind, cols in (("x", N_IN), ("d", N_OUT)):
        out.append(
            da.map_blocks(
                lambda block_id=None, kind=kind, cols=cols, chunks=chunks: _block(
                    block_id, chunks[0][block_id[0]], cols, kind
                ),
                chunks=(chunks[0], (cols,)),
                dtype=np.float64,
            )
        )
    return out[0], out[1]


def write_store(path: str, samples: int, chunk: int) -> tuple[int, ...]:
    """A zarr store of x(sample, input) and d(sample, output), written chunk by chunk."""
    import dask
    import xarray as xr

    x, d = _lazy(samples, chunk)
    ds = xr.Dataset({"x": (("sample", "input"), x), "d": (("sample", "output"), d)})
    with dask.config.set(scheduler="threads", num_workers=2):
        ds.to_zarr(path, mode="w")
    return tuple(int(c) for c in x.chunks[0])


class RssSampler:
    """The peak resident memory of this process while running (a thread reading /proc)."""

    def __init__(self, every: float = 0.005) -> None:
        import psutil

        self._proc, self.every = psutil.Process(), every
        self.base = self.peak = self._proc.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._proc.memory_info().rss)
            time.sleep(self.every)

    def __enter__(self) -> RssSampler:
        self.base = self.peak = self._proc.memory_info().rss
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()


def _rel(a: Any, b: Any) -> float:
    return max(
        float(np.max(np.abs(p - q)) / max(float(np.max(np.abs(q))), 1e-300))
        for p, q in zip(a.params, b.params)
    )


def _epoch(r: Any) -> dict[str, float]:
    call = r.stats.get("call", {})
    return {
        "place": float(call.get("place", float("nan"))),
        "blocks": float(call.get("blocks", float("nan"))),
        "total": float(call.get("total", float("nan"))),
    }


def larger_than_memory(args: argparse.Namespace, store: str, chunks: tuple[int, ...]) -> dict:
    """REAL: one epoch from the zarr store on memory-limited workers against one from memory."""
    import dask
    from dask.utils import parse_bytes
    from distributed import Client, LocalCluster

    import dask_rpm
    from dask_rpm.nn.batches import ChunkOrder

    samples = sum(chunks)
    data_bytes = samples * ROW
    limit = parse_bytes(args.memory_limit)
    kw = dict(
        hidden=args.hidden,
        epochs=1,
        batch_size=args.batch,
        learning_rate=1e-6,
        mapping="uniform",
        progress="none",
        elastic=False,
    )
    print(
        f"[REAL] store {data_bytes / 2**30:.2f} GiB = {data_bytes / limit:.1f}x the workers' "
        f"memory_limit {limit / 1e6:.0f} MB; {len(chunks)} chunks; {args.workers} workers",
        file=sys.stderr,
    )
    with dask.config.set(scheduler="threads"):
        x, d = (np.asarray(a) for a in dask.compute(*_lazy(samples, chunks[0])))
    cluster_kw = dict(
        n_workers=args.workers,
        threads_per_worker=1,
        processes=True,
        dashboard_address=None,
    )
    rows: list[dict] = []
    with (
        LocalCluster(memory_limit=args.memory_limit, **cluster_kw) as small,
        Client(small, set_as_default=False) as zc,
        LocalCluster(memory_limit=0, **cluster_kw) as big,
        Client(big, set_as_default=False) as mc,
        dask.config.set({"rpm.engine.sample-window": args.window}),
    ):
        workers0 = set(zc.scheduler_info(n_workers=-1)["workers"])
        for shuffle in [True if v == "true" else v for v in args.shuffles]:
            mem_shuffle = (
                ChunkOrder(chunks, stream=shuffle == "stream")
                if shuffle in ("chunks", "stream")
                else shuffle
            )
            for rep in range(args.repeats):
                order = ("zarr", "memory") if rep % 2 == 0 else ("memory", "zarr")
                if args.zarr_only:  # the larger-than-memory arm alone: does it hold up
                    order = ("zarr",)
                got: dict[str, Any] = {}
                for arm in order:
                    if arm == "zarr":
                        with RssSampler() as rss:
                            r = dask_rpm.fit(store, client=zc, shuffle=shuffle, **kw)
                        growth = (rss.peak - rss.base) / data_bytes
                    else:
                        r = dask_rpm.fit(x, d, client=mc, shuffle=mem_shuffle, **kw)
                        growth = float("nan")
                    got[arm] = r
                    e = _epoch(r)
                    st = r.stats.get("dask", {})
                    rows.append(
                        {
                            "shuffle": str(shuffle),
                            "repeat": rep,
                            "arm": arm,
                            **e,
                            "client_peak_growth": growth,
                            "bytes_moved": st.get("bytes_moved"),
                            "lost": sum(1 for rec in r.remaps if rec.get("lost")),
                        }
                    )
                    print(
                        f"  [REAL] shuffle={shuffle!s:6} {arm:6}: epoch blocks {e['blocks']:.2f} s, "
                        f"place {e['place']:.2f} s, fit {e['total']:.2f} s"
                        + (
                            f", client peak +{growth * 100:.2f} % of the data, moved "
                            f"{st.get('bytes_moved', 0) / 1e6:.0f} MB"
                            if arm == "zarr"
                            else ""
                        ),
                        file=sys.stderr,
                    )
                if "memory" in got:
                    rows[-1]["rel_diff"] = rows[-2]["rel_diff"] = _rel(got["zarr"], got["memory"])
        workers1 = set(zc.scheduler_info(n_workers=-1)["workers"])
    return {
        "data_bytes": data_bytes,
        "memory_limit": limit,
        "chunks": len(chunks),
        "workers": args.workers,
        "window": args.window,
        "same_workers_after": workers0 == workers1,
        "runs": rows,
    }


def placement(args: argparse.Namespace) -> dict:
    """EMULATED: chunks placed to match the speeds against placed 2 : 1 against them."""
    import dask
    import dask.array as da
    from distributed import Client

    import dask_rpm
    from dask_rpm.planners import make_plan

    s, shape = args.placement_samples, (N_IN, args.placement_hidden, N_OUT)
    rng = np.random.default_rng(5)
    x = rng.normal(size=(s, N_IN))
    x[:, -1] = 1.0
    d = rng.uniform(0.1, 0.9, size=(s, N_OUT))
    speeds = [1.0, 0.5]
    out: list[dict] = []
    with (
        dask_rpm.local_cluster(speeds, dashboard_address=None) as cluster,
        Client(cluster, set_as_default=False) as c,
    ):
        label = cluster.emulation_label
        fast, slow = dask_rpm.ordered_workers(c.scheduler_info(n_workers=-1))
        plan = make_plan(speeds, shape, s, "split-1d", workers=[fast, slow])
        cut = plan.column_samples(1)[0]  # the fast worker's column first: [0, cut)
        layouts = {  # chunk rows and the worker holding each chunk
            "matched": ((cut, s - cut), [fast, slow]),
            "against": ((cut, s - cut), [slow, fast]),  # the slow worker holds 2/3: 2 : 1 wrong
        }
        arms = {"full batch": dict(iterations=args.placement_iterations)}
        arms["mini-batches (chunks)"] = dict(epochs=args.placement_epochs, batch_size=s // 8)
        for arm, extra in arms.items():
            shuffle = "chunks" if "batch_size" in extra else True
            kw = dict(hidden=shape[1], learning_rate=1e-6, progress="none", elastic=False)
            kw.update(extra, shuffle=shuffle)
            per: dict[str, list[float]] = {k: [] for k in layouts}
            parts: dict[str, list[dict[str, float]]] = {k: [] for k in layouts}
            moved: dict[str, int] = {}
            for rep in range(args.repeats + 1):  # the first: warm-up
                names = list(layouts) if rep % 2 == 0 else list(layouts)[::-1]
                for name in names:
                    sizes, owners = layouts[name]
                    with dask.annotate(
                        workers=lambda key, o=owners: [o[key[1]]], allow_other_workers=False
                    ):
                        # names of their own: the same names would find the last layout's chunks
                        tag = f"{name}-{arm}-{rep}".replace(" ", "")
                        xd = da.from_array(x, chunks=(sizes, N_IN), name=f"x-{tag}") + 0
                        dd = da.from_array(d, chunks=(sizes, N_OUT), name=f"d-{tag}") + 0
                    xd, dd = c.persist([xd, dd], optimize_graph=False)
                    r = dask_rpm.fit(xd, dd, mapping=plan, client=c, **kw)
                    its = r.history.sizes["iteration"]
                    e = _epoch(r)
                    if rep:
                        per[name].append((e["place"] + e["blocks"]) / its)
                        parts[name].append(e)
                    moved[name] = int(r.stats["dask"]["bytes_moved"])
                    del xd, dd
            med = {k: float(np.median(v)) for k, v in per.items()}
            # the median of the interleaved pairs' ratios (the machine's load drifts between pairs)
            g = float(np.median([m / a for m, a in zip(per["matched"], per["against"])]))
            out.append(
                {
                    "arm": arm,
                    "seconds_per_iteration": med,
                    "gamma": g,
                    "bytes_moved": moved,
                    "per_repeat": per,
                    "parts": parts,
                }
            )
            print(
                f"  [EMULATED] {arm}: matched {med['matched'] * 1e3:.2f} ms/it, against "
                f"{med['against'] * 1e3:.2f} ms/it, gamma {g:.3f}; moved {moved}; place / "
                + ", ".join(
                    f"{k} {np.median([p['place'] for p in v]):.2f} s / "
                    f"{np.median([p['blocks'] for p in v]):.2f} s"
                    for k, v in parts.items()
                ),
                file=sys.stderr,
            )
    return {"label": label, "speeds": speeds, "samples": s, "shape": shape, "arms": out}


def remaps(args: argparse.Namespace) -> dict:
    """EMULATED: DRPM's remaps on chunks, their new sample cuts snapped to chunk boundaries
    (``rpm.planner.chunk-imbalance`` 0.05, the default) or left where the speeds put them (0:
    a cut moves only if the plan's imbalance does not grow)."""
    import dask
    import dask.array as da
    from distributed import Client

    import dask_rpm

    s, hidden, chunk = args.remap_samples, args.placement_hidden, args.remap_chunk
    rng = np.random.default_rng(6)
    x = rng.normal(size=(s, N_IN))
    x[:, -1] = 1.0
    d = rng.uniform(0.1, 0.9, size=(s, N_OUT))
    speeds = [1.0, 0.3, 0.6]
    arms = {"snapped": 0.05, "unsnapped": 0.0}
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in arms}
    with dask_rpm.local_cluster(speeds, scale=0.5, dashboard_address=None) as cluster:
        label = cluster.emulation_label
        with Client(cluster, set_as_default=False) as c:
            for rep in range(args.repeats):
                for arm in list(arms) if rep % 2 == 0 else list(arms)[::-1]:
                    cfg = {"rpm.drpm.t-line": 1.0, "rpm.planner.chunk-imbalance": arms[arm]}
                    tag = f"{arm}-{rep}"
                    xd = da.from_array(x, chunks=(chunk, N_IN), name=f"rx-{tag}")
                    dd = da.from_array(d, chunks=(chunk, N_OUT), name=f"rd-{tag}")
                    with dask.config.set(cfg):
                        r = dask_rpm.fit(
                            xd,
                            dd,
                            hidden=hidden,
                            iterations=args.remap_iterations,
                            learning_rate=1e-6,
                            mapping="drpm",
                            interval=8,
                            client=c,
                            progress="none",
                        )
                    moved = [m for m in r.stats["dask"]["moved"] if m["version"] > 1]
                    e = _epoch(r)
                    runs[arm].append(
                        {
                            "remaps": len(r.remaps),
                            "remap_bytes": int(sum(m["nbytes"] for m in moved)),
                            "ms_per_iteration": (e["place"] + e["blocks"])
                            / r.history.sizes["iteration"]
                            * 1e3,
                            "cuts_on_chunks": all(
                                p.column_samples(k)[0] % chunk == 0
                                for p in r.plans[1:]
                                for k in range(p.n_columns)
                            ),
                        }
                    )
    for arm, rs in runs.items():
        print(
            f"  [EMULATED] remaps, {arm}: "
            + "; ".join(
                f"{q['remaps']} remaps, {q['remap_bytes']} B, {q['ms_per_iteration']:.2f} ms/it"
                for q in rs
            ),
            file=sys.stderr,
        )
    return {"label": label, "samples": s, "chunk": chunk, "runs": runs}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--gib", type=float, default=1.2, help="size of the zarr store (GiB)")
    p.add_argument("--memory-limit", default="400MB", help="each worker's memory_limit")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--chunk-mb", type=float, default=4.0, help="rows per chunk, in MB of x")
    p.add_argument("--window", default="8 MiB", help="rpm.engine.sample-window")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--batch", type=int, default=4096)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--shuffles", nargs="+", default=["stream"], help="REAL arms' shuffles")
    p.add_argument("--placement-samples", type=int, default=24000)
    p.add_argument("--placement-hidden", type=int, default=128)
    p.add_argument("--placement-iterations", type=int, default=30)
    p.add_argument("--placement-epochs", type=int, default=4)
    p.add_argument("--remap-samples", type=int, default=8192)
    p.add_argument("--remap-chunk", type=int, default=128, help="rows per chunk (remaps)")
    p.add_argument("--remap-iterations", type=int, default=48)
    p.add_argument("--skip-remaps", action="store_true")
    p.add_argument("--skip-real", action="store_true")
    p.add_argument("--zarr-only", action="store_true", help="REAL: no memory arm")
    p.add_argument("--skip-emulated", action="store_true")
    p.add_argument("--json", default=None)
    p.add_argument("--dir", default=None, help="where the zarr store is written (a temp dir)")
    args = p.parse_args()
    result: dict[str, Any] = {"argv": sys.argv[1:]}
    if not args.skip_real:
        samples = int(args.gib * 2**30 / ROW)
        chunk = max(1, int(args.chunk_mb * 1e6 / (N_IN * 8)))
        where = tempfile.mkdtemp(prefix="rpm-dask-data-", dir=args.dir)
        try:
            store = os.path.join(where, "train.zarr")
            t0 = time.perf_counter()
            chunks = write_store(store, samples, chunk)
            print(f"wrote {store} in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
            result["real"] = larger_than_memory(args, store, chunks)
        finally:
            shutil.rmtree(where, ignore_errors=True)
    if not args.skip_emulated:
        result["emulated"] = placement(args)
    if not args.skip_remaps:
        result["remaps"] = remaps(args)
    _report(result)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1, default=str)


def _report_remaps(rem: dict[str, Any]) -> None:
    print(f"\n[EMULATED] DRPM remaps on chunks of {rem['chunk']} rows: {rem['label']}")
    print("| cuts | remaps | bytes moved by remaps (median) | ms/iteration | cuts on chunks |")
    print("|---|---|---|---|---|")
    for arm, rs in rem["runs"].items():
        print(
            f"| {arm} | {np.median([q['remaps'] for q in rs]):.0f} | "
            f"{np.median([q['remap_bytes'] for q in rs]):.0f} | "
            f"{np.median([q['ms_per_iteration'] for q in rs]):.2f} | "
            f"{sum(q['cuts_on_chunks'] for q in rs)}/{len(rs)} |"
        )


def _report(result: dict[str, Any]) -> None:
    real = result.get("real")
    if real is not None:
        print(
            f"\n[REAL] {real['data_bytes'] / 2**30:.2f} GiB zarr store, {real['workers']} workers "
            f"of memory_limit {real['memory_limit'] / 1e6:.0f} MB "
            f"({real['data_bytes'] / real['memory_limit']:.1f}x), window {real['window']}; "
            f"same workers after: {real['same_workers_after']}"
        )
        print("| shuffle | zarr epoch (s) | memory epoch (s) | ratio | client peak growth | lost |")
        print("|---|---|---|---|---|---|")
        for sh in dict.fromkeys(r["shuffle"] for r in real["runs"]):
            z = [r for r in real["runs"] if r["shuffle"] == sh and r["arm"] == "zarr"]
            m = [r for r in real["runs"] if r["shuffle"] == sh and r["arm"] == "memory"]
            ratio = [a["blocks"] / b["blocks"] for a, b in zip(z, m)] or [float("nan")]
            mem = np.median([r["blocks"] for r in m]) if m else float("nan")
            print(
                f"| {sh} | {np.median([r['blocks'] for r in z]):.2f} | "
                f"{mem:.2f} | {np.median(ratio):.2f} | "
                f"{max(r['client_peak_growth'] for r in z) * 100:.2f} % | "
                f"{sum(r['lost'] for r in z)} |"
            )
        diffs = [r["rel_diff"] for r in real["runs"] if "rel_diff" in r]
        if diffs:
            print(f"max rel. diff zarr vs memory: {max(diffs):.1e}")
    emu = result.get("emulated")
    if emu is not None:
        print(f"\n[EMULATED] {emu['label']}")
        print("| arm | matched (ms/it) | against 2:1 (ms/it) | gamma | bytes moved (against) |")
        print("|---|---|---|---|---|")
        for a in emu["arms"]:
            s = a["seconds_per_iteration"]
            print(
                f"| {a['arm']} | {s['matched'] * 1e3:.2f} | {s['against'] * 1e3:.2f} | "
                f"{a['gamma']:.3f} | {a['bytes_moved']['against']} |"
            )
    if result.get("remaps") is not None:
        _report_remaps(result["remaps"])


if __name__ == "__main__":
    main()
