"""REAL: the estimator path's cost per iteration against a PyTorch loop and scikit-learn, one thread each.

The workload scikit-learn users run (issue 33): a 784-256-128-10 network, ReLU, softmax and
cross-entropy, Adam, mini-batches of 512 from 20,000 synthetic images (float64), ``tol=0`` and
no early stop, so every arm takes the same ``epochs x 40`` iterations. Arms, each timed as a
whole call and divided by its iterations:

* ``torch``: a plain PyTorch loop (the same network, ``torch.optim.Adam``, the same batch
  sizes from a fresh permutation every epoch), ``torch.set_num_threads(1)``;
* ``sklearn``: scikit-learn's ``MLPClassifier``, BLAS at one thread (threadpoolctl);
* ``serial``: ``dask_rpm.MLPClassifier(client=None)`` in this process, BLAS at one thread;
* ``cluster``: ``dask_rpm.MLPClassifier`` on a ``LocalCluster`` of one worker process with one
  thread (the whole call, data sent included, after a warm-up call on the same cluster);

the last three with ``alpha=0`` and with scikit-learn's default ``alpha=1e-4``. The first
three run each time in a fresh Python process of their own (the data made there with the same
seed; imports and data outside the timing), with the environment this one had before its
cluster started: in the process that holds a ``LocalCluster`` and its client, a serial fit
was measured at several times its CPU time in wall time on this machine, waiting rather than
computing, which says nothing about the fit. Every round runs every arm once, in an order that rotates from round to round, so that a
busy spell of this shared machine weighs on all arms; the figures are medians over rounds,
and the ratios medians of the rounds' ratios. Each arm's CPU seconds are reported beside its
wall time (this process's; on the cluster, the worker's added), a steadier figure than wall
time while other work shares the cores. For the cluster arm the engine's own phase
times (the history's means over the iterations after the first epoch: forward,
vertical_wait, backward, horizontal, modify, iteration_time) are reported too, and what the
call spends outside the iterations. Every figure is REAL: unpaced cores.

Usage::

    python benchmarks/estimator_speed.py                       # 5 rounds of 6 epochs: about 5 min
    python benchmarks/estimator_speed.py --rounds 3 --epochs 3 --json estimator_speed.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
import warnings
from typing import Any

import numpy as np

SHAPE = (784, (256, 128), 10)
#: the environment before any cluster: a LocalCluster's nanny leaves its workers' settings in
#: this process's environment (MALLOC_TRIM_THRESHOLD_=65536 among them), and a child started
#: with those maps every temporary over 128 KiB anew (scikit-learn's: +60 % CPU measured)
_ENVIRON = dict(os.environ)
ALPHA = 1e-4  # scikit-learn's default


def problem(samples: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Synthetic images: pixels in [0, 1), labels from a fixed linear rule (learnable)."""
    rng = np.random.default_rng(seed)
    x = rng.random((samples, SHAPE[0]))
    w = rng.normal(size=(SHAPE[0], SHAPE[2]))
    y = np.argmax((x - 0.5) @ w, axis=1)
    return x, y


def _params(epochs: int, batch: int, alpha: float) -> dict[str, Any]:
    return dict(
        hidden_layer_sizes=SHAPE[1],
        activation="relu",
        solver="adam",
        batch_size=batch,
        max_iter=epochs,
        tol=0.0,
        n_iter_no_change=10**6,
        alpha=alpha,
        random_state=0,
    )


def torch_loop(x: np.ndarray, y: np.ndarray, epochs: int, batch: int) -> tuple[float, float, int]:
    """A plain PyTorch training loop, one thread: wall and CPU seconds, and iterations."""
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Linear(SHAPE[0], SHAPE[1][0]),
        torch.nn.ReLU(),
        torch.nn.Linear(SHAPE[1][0], SHAPE[1][1]),
        torch.nn.ReLU(),
        torch.nn.Linear(SHAPE[1][1], SHAPE[2]),
    ).double()
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    loss_fn = torch.nn.CrossEntropyLoss()
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    gen = torch.Generator().manual_seed(0)
    t0, c0, its = time.perf_counter(), time.process_time(), 0
    for _ in range(epochs):
        perm = torch.randperm(x.shape[0], generator=gen)
        for lo in range(0, x.shape[0], batch):
            idx = perm[lo : lo + batch]
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(net(xt[idx]), yt[idx])
            loss.backward()
            opt.step()
            its += 1
    float(loss.detach())
    return time.perf_counter() - t0, time.process_time() - c0, its


def _cpu() -> float:
    return time.process_time()


def estimator(kind: str, x: np.ndarray, y: np.ndarray, params: dict[str, Any], client: Any) -> Any:
    """One timed ``fit``: wall seconds, CPU seconds (this process's, and the workers' on a
    cluster), iterations and the fitted estimator."""
    from sklearn.exceptions import ConvergenceWarning
    from threadpoolctl import threadpool_limits

    if kind == "sklearn":
        from sklearn.neural_network import MLPClassifier as Estimator
    else:
        from dask_rpm import MLPClassifier as Estimator
    extra = {} if kind == "sklearn" else {"client": client}
    if kind == "cluster":
        extra["progress"] = "none"
    est = Estimator(**params, **extra)
    with warnings.catch_warnings(), threadpool_limits(1):
        warnings.simplefilter("ignore", ConvergenceWarning)
        w0 = sum(client.run(_cpu).values()) if kind == "cluster" else 0.0
        t0, c0 = time.perf_counter(), time.process_time()
        est.fit(x, y)
        seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
        if kind == "cluster":
            cpu += sum(client.run(_cpu).values()) - w0
    return seconds, cpu, int(est.n_iter_) * math.ceil(x.shape[0] / params["batch_size"]), est


def phases(est: Any, skip: int) -> dict[str, float]:
    """The cluster run's history means in ms (iterations from ``skip`` on, every worker)."""
    h = est.result_.history
    h = h.isel(iteration=slice(skip, None))
    out = {
        p: 1e3 * float(np.nanmean(h[p].values))
        for p in ("forward", "vertical_wait", "backward", "horizontal", "modify")
    }
    out["iteration_time"] = 1e3 * float(np.nanmean(h["iteration_time"].values))
    out["iteration_time_median"] = 1e3 * float(np.nanmedian(h["iteration_time"].values))
    return out


def _in_child(kind: str, alpha: float | None, a: argparse.Namespace) -> tuple[float, float, int]:
    """One in-process arm in a fresh Python process (no cluster, no client threads beside it):
    wall and CPU seconds and iterations, as :func:`child` prints them."""
    cmd = [sys.executable, __file__, "--child", kind, str(alpha or 0.0)]
    cmd += ["--epochs", str(a.epochs), "--batch", str(a.batch), "--samples", str(a.samples)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=_ENVIRON).stdout
    got = json.loads(out.strip().splitlines()[-1])
    return got["seconds"], got["cpu"], got["iterations"]


def child(kind: str, alpha: float, a: argparse.Namespace) -> None:
    """The ``--child`` process: one timed arm, its figures as one JSON line."""
    x, y = problem(a.samples)
    if kind == "torch":
        seconds, cpu, its = torch_loop(x, y, a.epochs, a.batch)
    else:
        seconds, cpu, its, _ = estimator(kind, x, y, _params(a.epochs, a.batch, alpha), None)
    print(json.dumps({"seconds": seconds, "cpu": cpu, "iterations": its}))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--samples", type=int, default=20000)
    ap.add_argument("--arms", default="torch,sklearn,serial,cluster", help="comma-separated")
    ap.add_argument("--json", metavar="PATH")
    ap.add_argument("--child", nargs=2, metavar=("ARM", "ALPHA"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        child(a.child[0], float(a.child[1]), a)
        return 0
    from distributed import Client, LocalCluster

    x, y = problem(a.samples)
    per_epoch = math.ceil(a.samples / a.batch)
    kinds = [k for k in a.arms.split(",") if k]
    arms = [("torch", None)] if "torch" in kinds else []
    arms += [
        (k, alpha) for k in ("sklearn", "serial", "cluster") if k in kinds for alpha in (0.0, ALPHA)
    ]
    times: dict[str, list[float]] = {}
    cpus: dict[str, list[float]] = {}
    breakdown: dict[str, list[dict[str, float]]] = {}
    rows: list[dict[str, Any]] = []
    with (
        LocalCluster(
            n_workers=1,
            threads_per_worker=1,
            processes=True,
            dashboard_address=":0",
            silence_logs=50,
        ) as cluster,
        Client(cluster, set_as_default=False) as client,
    ):
        client.wait_for_workers(1)
        if "cluster" in kinds:  # warm-up: the worker's imports, the plugin, the first plan
            estimator("cluster", x[:4096], y[:4096], _params(1, a.batch, 0.0), client)
        for r in range(a.rounds):
            order = arms[r % len(arms) :] + arms[: r % len(arms)]
            for kind, alpha in order:
                name = kind if alpha is None else f"{kind} alpha={alpha:g}"
                if kind == "cluster":
                    seconds, cpu, its, est = estimator(
                        kind, x, y, _params(a.epochs, a.batch, alpha), client
                    )
                    breakdown.setdefault(name, []).append(phases(est, per_epoch))
                else:
                    seconds, cpu, its = _in_child(kind, alpha, a)
                assert its == a.epochs * per_epoch, (name, its)
                ms, cpu_ms = 1e3 * seconds / its, 1e3 * cpu / its
                times.setdefault(name, []).append(ms)
                cpus.setdefault(name, []).append(cpu_ms)
                rows.append(
                    {
                        "round": r,
                        "arm": name,
                        "ms_per_iteration": ms,
                        "cpu_ms_per_iteration": cpu_ms,
                    }
                )
                print(
                    f"round {r + 1}: {name:<22} {ms:7.2f} ms per iteration ({cpu_ms:.2f} ms CPU)",
                    flush=True,
                )

    def ratio(num: str, den: str, of: dict[str, list[float]] = times) -> float | None:
        if num not in of or den not in of:
            return None
        return statistics.median(p / q for p, q in zip(of[num], of[den]))

    medians = {k: statistics.median(v) for k, v in times.items()}
    a0, a1 = "alpha=0", f"alpha={ALPHA:g}"
    cpu_medians = {k: statistics.median(v) for k, v in cpus.items()}
    pairs = {
        "cluster / torch": (f"cluster {a0}", "torch"),
        "serial / sklearn": (f"serial {a0}", f"sklearn {a0}"),
        "serial / sklearn, alpha": (f"serial {a1}", f"sklearn {a1}"),
        "cluster alpha / cluster": (f"cluster {a1}", f"cluster {a0}"),
        "serial alpha / serial": (f"serial {a1}", f"serial {a0}"),
        "sklearn alpha / sklearn": (f"sklearn {a1}", f"sklearn {a0}"),
    }
    ratios = {k: ratio(*v) for k, v in pairs.items()}
    cpu_ratios = {k: ratio(*v, of=cpus) for k, v in pairs.items()}
    print("\n| arm | ms per iteration (median) | CPU ms (median) | rounds (wall) |")
    print("|---|---:|---:|---|")
    for k, v in times.items():
        print(
            f"| {k} | {medians[k]:.2f} | {cpu_medians[k]:.2f} | {', '.join(f'{t:.2f}' for t in v)} |"
        )
    print("\n| ratio (median of the rounds') | wall | CPU |")
    print("|---|---:|---:|")
    for k, v in ratios.items():
        if v is not None:
            print(f"| {k} | {v:.3f} | {cpu_ratios[k]:.3f} |")
    means: dict[str, dict[str, float]] = {}
    if breakdown:
        print("\n| cluster, history means (ms) | " + " | ".join(breakdown) + " |")
        print("|---|" + "---:|" * len(breakdown))
        keys = list(next(iter(breakdown.values()))[0])
        for name, runs in breakdown.items():
            means[name] = {p: statistics.median(b[p] for b in runs) for p in keys}
            means[name]["whole call"] = medians[name]
            means[name]["outside the iterations"] = medians[name] - means[name]["iteration_time"]
        for p in [*keys, "whole call", "outside the iterations"]:
            print(f"| {p} | " + " | ".join(f"{means[n][p]:.2f}" for n in breakdown) + " |")
    if a.json:
        report = {
            "setup": {
                "network": "784-256-128-10 (relu, softmax, cross-entropy), Adam, float64",
                "batch": a.batch,
                "samples": a.samples,
                "epochs": a.epochs,
                "iterations": a.epochs * per_epoch,
                "cluster": "LocalCluster(processes=True), 1 worker x 1 thread, REAL (unpaced), "
                f"{os.cpu_count()} cores shared",
            },
            "runs": rows,
            "medians_ms": medians,
            "cpu_medians_ms": cpu_medians,
            "ratios": ratios,
            "cpu_ratios": cpu_ratios,
            "cluster_phases_ms": means,
        }
        with open(a.json, "w") as fh:
            json.dump(report, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
