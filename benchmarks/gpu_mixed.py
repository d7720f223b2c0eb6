"""REAL: one GPU worker beside one-thread CPU workers, on one machine (issue #25).

The prepared script for a machine with a GPU and 16 cores (any CUDA machine with torch and
dask_rpm installed; on a machine without network, ``source tools/device_setup.sh`` first). Every worker is a Dask
nanny process, unpaced: worker 0 sees the GPU (``CUDA_VISIBLE_DEVICES=0``) and trains with
``backend="auto"`` on it (torch, CUDA), the others see none and train with numpy on one thread.
Every figure it prints is REAL.

1. Exactness on the GPU: ``fit(backend="auto")`` on the GPU worker with four CPU workers (a plan whose column mixes the GPU and CPUs, DRPM's own plans and a whole
   remap), against numpy ``fit_serial`` (float64, relative error; 1e-10 is the bar).
2. Per workload (paper: 203-80-26 on 1024 samples; compute: 203-1024-26 on 32768 samples, full
   batch; minibatch: the same network, B = 1024; deep: 784-1024-1024-1024-10, B = 1024): ``T_series`` of each worker kind
   (``fit_serial`` on that worker: the GPU with torch-CUDA, a CPU worker with numpy on its one
   thread), the serial reference and a PyTorch loop on the GPU in this process (a single GPU
   alone, what a user compares with), then ``fit`` with ``mapping="drpm"`` on the GPU alone and
   on the GPU with 1, 4 and 15 CPU workers: seconds per iteration (median after the first
   third), gamma ``(1 / T) / sum_i (1 / T_series(i))``, and the plan DRPM settled on.

Writes ``gpu_mixed.json`` into ``$OUT`` (or the current folder) and prints a Markdown table.
``--cpu-only`` runs the same on a machine without a GPU (worker 0 then trains with torch on its
CPU): the script's own test, not a measurement.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import time
from typing import Any

import numpy as np
from distributed import Client, Nanny, Scheduler, SpecCluster

import dask_rpm
from dask_rpm import fit, fit_serial
from dask_rpm.bench.ddp import run_ddp
from dask_rpm.bench.profiles import gamma, steady_seconds
from dask_rpm.bench.real import real_data
from dask_rpm.plan.partition import Plan

# name -> (n, hidden, l, samples, batch size or None, iterations of a fit)
WORKLOADS: dict[str, tuple[int, tuple[int, ...], int, int, int | None, int]] = {
    "paper": (203, (80,), 26, 1024, None, 120),
    "compute": (203, (1024,), 26, 32768, None, 30),
    "minibatch": (203, (1024,), 26, 32768, 1024, 90),
    "deep": (784, (1024, 1024, 1024), 10, 16384, 1024, 45),
}
LR = 1e-6  # per sample: every run trains the same stable trajectory


def cluster(n_cpu: int, gpu_env: dict[str, Any]) -> SpecCluster:
    """Worker ``r00-gpu`` (sees the GPU) and ``n_cpu`` one-thread workers that see none.

    ``gpu_env``: the GPU worker's environment, and under ``"config"`` its dask settings (a
    nanny hands its worker this process's configuration after the environment is read).
    """
    quiet = {"host": "127.0.0.1", "silence_logs": logging.ERROR}
    env = {k: v for k, v in gpu_env.items() if k != "config"}
    opts = {"nthreads": 1, "env": env, "config": gpu_env.get("config", {}), **quiet}
    workers: dict[str, Any] = {"r00-gpu": {"cls": Nanny, "options": opts}}
    for i in range(n_cpu):
        env = {"CUDA_VISIBLE_DEVICES": ""}
        workers[f"r{i + 1:02d}-cpu"] = {
            "cls": Nanny,
            "options": {"nthreads": 1, "env": env, **quiet},
        }
    sched = {"cls": Scheduler, "options": {"dashboard_address": None, "host": "127.0.0.1"}}
    return SpecCluster(workers=workers, scheduler=sched, silence_logs=logging.ERROR)


def rel(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    return max(float(np.max(np.abs(p - q)) / np.max(np.abs(p))) for p, q in zip(a, b))


def exactness(client: Client, backend: str, log: Any) -> dict[str, float]:
    """fit on the workers of ``client`` against numpy fit_serial on a small deep problem."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((96, 6))
    d = np.eye(3)[rng.integers(0, 3, 96)]
    kw: dict[str, Any] = dict(
        hidden=(7, 5),
        iterations=24,
        learning_rate=1e-3,
        bias=True,
        optimizer="adam",
        activation="tanh",
        loss="cross-entropy",
        batch_size=32,
    )
    ref = fit_serial(x, d, **kw)
    out: dict[str, float] = {}
    n = len(client.scheduler_info()["workers"])
    plans: dict[str, Any] = {"drpm": "drpm"}
    if n == 5:  # one column of the GPU and two CPU workers, beside two CPU workers
        # rows as planned: m = min(7, 5) + the bias unit
        cols, widths, heights = [[0, 1, 2], [3], [4]], [40, 28, 28], [[2, 2, 2], [6], [6]]
        plans["mixed-column"] = Plan.from_columns(cols, widths, heights, shape=(7, 6, 3))
    plans["uniform"] = "uniform"
    for name, mapping in plans.items():
        # DRPM checks every 4 iterations: its remaps happen inside the 24
        r = fit(
            x, d, mapping=mapping, interval=4, progress="none", backend=backend, client=client, **kw
        )
        out[name] = rel(ref.params, list(r.params))
        out[f"{name}-remaps"] = len(r.remaps)
        log(
            f"  exact {name:13s} rel {out[name]:.2e}  backends {sorted(set(r.stats['backend'].values()))}"
        )
    # a resume from the state on_checkpoint received at iteration 12
    saved: list[dict[str, Any]] = []
    fit(
        x,
        d,
        mapping="uniform",
        checkpoint_every=12,
        on_checkpoint=saved.append,
        progress="none",
        backend=backend,
        client=client,
        **{**kw, "iterations": 12},
    )
    r = fit(
        x,
        d,
        mapping="drpm",
        interval=4,
        resume=saved[-1],
        progress="none",
        backend=backend,
        client=client,
        **kw,
    )
    out["resume"] = rel(ref.params, list(r.params))
    log(f"  exact resume        rel {out['resume']:.2e}")
    return out


def per_iteration(x: np.ndarray, d: np.ndarray, kw: dict[str, Any], backend: str, it: int) -> float:
    """fit_serial's seconds per iteration where it runs (``backend`` resolved there, ``auto``
    included): the difference of a run of ``3 it`` and one of ``it`` iterations, so that what a
    call pays once (checking the data, moving it to the GPU) is not counted."""
    from dask_rpm.nn.backend import resolve

    be = resolve(backend, "auto")
    fit_serial(x, d, iterations=2, backend=be.name, device=be.device, **kw)  # warm
    seconds = []
    for n in (it, 3 * it):
        t0 = time.perf_counter()
        fit_serial(x, d, iterations=n, backend=be.name, device=be.device, **kw)
        seconds.append(time.perf_counter() - t0)
    return (seconds[1] - seconds[0]) / (2 * it)


def series_times(
    x: np.ndarray, d: np.ndarray, kw: dict[str, Any], gpu_env: dict[str, Any], backend: str, it: int
) -> tuple[float, float]:
    """``T_series`` of the GPU worker (its backend) and of a one-thread CPU worker (numpy)."""
    with cluster(1, gpu_env) as c, Client(c) as client:
        client.wait_for_workers(2)
        info = client.scheduler_info()["workers"]
        gw, cw = sorted(info, key=lambda a: info[a]["name"])
        xf, df = client.scatter([x, d], broadcast=True)
        t_gpu = client.submit(per_iteration, xf, df, kw, backend, it, workers=[gw], pure=False)
        t_cpu = client.submit(
            per_iteration, xf, df, kw, "numpy", max(1, it // 4), workers=[cw], pure=False
        )
        return float(t_gpu.result()), float(t_cpu.result())


def mixed_run(
    x: np.ndarray,
    d: np.ndarray,
    kw: dict[str, Any],
    k: int,
    gpu_env: dict[str, Any],
    it: int,
    backend: str,
) -> dict[str, Any]:
    """fit with DRPM on the GPU worker and ``k`` CPU workers: steady seconds per iteration and
    the plan it ended on."""
    with cluster(k, gpu_env) as c, Client(c) as client:
        client.wait_for_workers(k + 1)
        run_kw = dict(mapping="drpm", progress="none", backend=backend, client=client, **kw)
        fit(x, d, iterations=3, interval=3, **run_kw)  # warm: imports, CUDA, caches
        t0 = time.perf_counter()
        res = fit(x, d, iterations=it, interval=max(it // 6, 4), elastic=False, **run_kw)
        wall = time.perf_counter() - t0
    times = np.asarray(res.history["iteration_time"].values, dtype=float)
    plan = res.plan
    return {
        "seconds": steady_seconds(times, len(times) // 3),
        "wall": wall,
        "workers_used": len(plan.planned_workers),
        "idle": list(plan.excluded),
        "columns": [list(col) for col in plan.columns],
        "remaps": len(res.remaps),
        "backends": sorted(set(res.stats["backend"].values())),
    }


def workload_rows(
    name: str, cpus: list[int], gpu_env: dict[str, Any], backend: str, device: str, log: Any
) -> dict[str, Any]:
    n, hidden, l, samples, batch, it = WORKLOADS[name]
    x, d = real_data((n, 0, l), samples)
    kw: dict[str, Any] = dict(hidden=hidden, learning_rate=LR, batch_size=batch)
    row: dict[str, Any] = {
        "workload": name,
        "shape": "-".join(map(str, (n, *hidden, l))),
        "samples": samples,
        "batch": batch,
        "runs": {},
    }
    t_gpu, t_cpu = series_times(x, d, kw, gpu_env, backend, 8 if batch else 3)
    row["t_series"] = {"gpu": t_gpu, "cpu": t_cpu}
    log(
        f"[REAL] {name}: T_series GPU worker {t_gpu * 1e3:.2f} ms, CPU worker (1 thread) "
        f"{t_cpu * 1e3:.1f} ms (ratio {t_cpu / t_gpu:.0f})"
    )
    if device != "cpu":  # the peers on the GPU alone, in this process: what a user compares with
        row["serial_gpu"] = per_iteration(x, d, kw, "torch", 10)
        ddp = run_ddp(
            x,
            d,
            hidden=hidden,
            speeds=[1.0],
            scale=1.0,
            iterations=it,
            learning_rate=LR,
            batch_size=batch,
            device="cuda",
        )
        row["ddp_gpu"] = steady_seconds(np.asarray(ddp["times"]), it // 3)
        log(
            f"[REAL] {name}: on the GPU alone: fit_serial {row['serial_gpu'] * 1e3:.2f} ms, "
            f"PyTorch DDP (1 rank) {row['ddp_gpu'] * 1e3:.2f} ms"
        )
    for k in cpus:
        run = mixed_run(x, d, kw, k, gpu_env, it, backend)
        sec = run["seconds"]
        run["gamma"] = gamma(sec, [t_gpu] + [t_cpu] * k)
        alone = row["runs"].get(0, {}).get("seconds", math.nan)
        row["runs"][k] = run
        log(
            f"[REAL] {name}: GPU + {k:2d} CPU: {sec * 1e3:8.2f} ms/it, gamma {run['gamma']:.2f}, "
            f"GPU worker alone / this {alone / sec:.2f}; columns {run['columns']} idle "
            f"{run['idle']}, remaps {run['remaps']}, {run['backends']}"
        )
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--cpu-only", action="store_true", help="no GPU here: worker 0 uses torch on its CPU"
    )
    ap.add_argument("--workloads", default="paper,compute,minibatch,deep")
    ap.add_argument("--cpus", default="0,1,4,15", help="CPU workers beside the GPU worker, per run")
    ap.add_argument("--skip-exactness", action="store_true")
    args = ap.parse_args()
    out_dir = os.environ.get("OUT", ".")
    log = lambda s: print(s, flush=True)  # noqa: E731
    if args.cpu_only:
        torch_cpu = {"rpm.engine.cpu-backend": "torch"}  # dotted: set() keeps the rest of rpm.*
        gpu_env, backend, device = {"config": torch_cpu}, "auto", "cpu"
    else:
        gpu_env, backend, device = {"CUDA_VISIBLE_DEVICES": "0"}, "auto", "cuda"
    report: dict[str, Any] = {
        "label": "REAL",
        "version": dask_rpm.__version__,
        "cores": os.cpu_count(),
        "python": sys.version.split()[0],
        "rows": [],
        "exactness": {},
    }
    try:
        import torch

        report["torch"] = torch.__version__
        report["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except ImportError:
        pass
    log(f"[REAL] {report}")

    def save() -> None:
        with open(os.path.join(out_dir, "gpu_mixed.json"), "w") as f:
            json.dump(report, f, indent=1, default=str)

    if not args.skip_exactness:
        for k in (4,):  # the GPU worker beside four CPU workers
            with cluster(k, gpu_env) as c, Client(c) as client:
                client.wait_for_workers(k + 1)
                log(f"[REAL] exactness, GPU + {k} CPU workers:")
                report["exactness"][k] = exactness(client, backend, log)
        save()
    cpus = [int(v) for v in args.cpus.split(",")]
    for name in args.workloads.split(","):
        report["rows"].append(workload_rows(name, cpus, gpu_env, backend, device, log))
        save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
