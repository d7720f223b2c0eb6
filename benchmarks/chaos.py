"""Chaos soak (issue 14): train for minutes while workers are killed, retired and added at random.

A LocalCluster of worker processes (1 thread each, equal speeds: no emulated
heterogeneity; all processes share this machine's cores) trains a
well-conditioned 3-layer net with ``dask_rpm.fit`` (``checkpoint_every``
set). Meanwhile a seeded fault injector, every 3-8 s (uniform, seeded), does
one of:

* **kill**: SIGKILL a random worker process. Its nanny starts a fresh worker
  at a new address, which the run absorbs at a block boundary (elastic join).
* **retire**: retire a random worker gracefully (``client.retire_workers``,
  and the cluster forgets it).
* **add**: one more worker (``cluster.scale(n + 1)``).

The cluster keeps at least ``--min-workers`` (2) and at most
``--max-workers`` (5) workers; the kind of each fault is drawn from the seeded
generator among those the worker count allows (the count the cluster intends
to have, so the sequence of kinds depends on the seed only; victims and the
iteration a fault lands at depend on timing).

Training runs for ``--seconds`` (the run's length is set by time: ``fit``'s
``should_stop`` ends it at the first block boundary after the deadline, and
``iterations`` is only a maximum). Then the final weights and the error of
every iteration are compared with ``dask_rpm.fit_serial`` for the number of
iterations done (float64, rtol 1e-10), after checking that the problem is
well-conditioned for that length (adding 1e-15 to every element of W0 moves
the serial result by less than 1e-12, normwise relative: max|dW| / max|W|).

Reported: faults injected by kind, faults survived (the run completed equal to
serial; each kill/retire of a worker the run had is matched by the remap that
recovered from it), iterations recomputed (sum of ``replayed``), weight bytes
moved and sample bytes re-read in those remaps, time lost per fault (remap
seconds + recomputed iterations x median s/iteration, over the faults), bytes
lost (weights that differ from serial: must be 0), the final relative
difference and wall time.

Usage::

    python benchmarks/chaos.py                         # ~3 min, seed 0
    python benchmarks/chaos.py --seconds 60 --seed 7 --json chaos.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import threading
import time
from typing import Any, NamedTuple

import numpy as np

KINDS = ("kill", "retire", "add")


class Fault(NamedTuple):
    """One injected fault."""

    seconds: float  # since training started
    kind: str  # kill | retire | add
    worker: str | None  # the victim's address (kill, retire); None for add
    workers_before: int  # workers the cluster intended to have before the fault
    iteration: int  # last block boundary the run had reported


def draw_kind(rng: random.Random, n: int, min_workers: int, max_workers: int) -> str:
    """The next fault's kind among those that keep ``min_workers <= workers <= max_workers``."""
    allowed = [
        k for k in KINDS if (k == "add" and n < max_workers) or (k != "add" and n > min_workers)
    ]
    return rng.choice(allowed)


def planned_kinds(
    seed: int,
    count: int,
    workers: int = 3,
    min_workers: int = 2,
    max_workers: int = 5,
    interval: tuple[float, float] = (3.0, 8.0),
) -> list[str]:
    """The kinds of the first ``count`` faults the injector draws for ``seed`` (no cluster needed)."""
    rng, n, out = random.Random(seed), workers, []
    for _ in range(count):
        rng.uniform(*interval)  # the wait, drawn first as the injector does
        out.append(draw_kind(rng, n, min_workers, max_workers))
        n += {"kill": 0, "retire": -1, "add": 1}[out[-1]]
    return out


class Injector(threading.Thread):
    """Inject one seeded random fault every ``interval`` seconds until stopped.

    Runs in a thread of the client process while ``fit`` blocks the main
    thread; Dask's client and cluster calls are safe from another thread
    (they go through the event loop).
    """

    def __init__(
        self,
        cluster: Any,
        client: Any,
        seed: int,
        *,
        interval: tuple[float, float] = (3.0, 8.0),
        min_workers: int = 2,
        max_workers: int = 5,
        progress: Any = None,
    ) -> None:
        super().__init__(name="chaos-injector", daemon=True)
        self.cluster, self.client = cluster, client
        # two generators: the kinds and the waits depend on the seed only; the victims also on which
        # workers are up at the time (drawn from their own generator so they never shift the kinds)
        self.rng = random.Random(seed)
        self.victims = random.Random(seed + 1_000_003)
        self.interval, self.min_workers, self.max_workers = interval, min_workers, max_workers
        self.progress = progress or (lambda: 0)
        self.stop = threading.Event()
        self.faults: list[Fault] = []
        self.errors: list[str] = []
        self.t0 = time.monotonic()

    def run(self) -> None:
        while not self.stop.wait(self.rng.uniform(*self.interval)):
            try:
                self.inject()
            except Exception as exc:  # an injector failure is reported, never hidden
                self.errors.append(f"{type(exc).__name__}: {exc}")

    def _alive(self) -> dict[str, Any]:
        return dict(self.client.scheduler_info(n_workers=-1)["workers"])

    def inject(self) -> None:
        # The intended size (not the live count) decides which kinds are allowed: a killed worker is
        # being restarted by its nanny and still counts, so the kinds drawn depend on the seed only.
        n = len(self.cluster.worker_spec)
        kind = draw_kind(self.rng, n, self.min_workers, self.max_workers)
        alive = self._alive()
        victim = None
        if kind != "add":
            # victims are workers that are up and belong to the cluster's spec (not one already leaving)
            names = {str(k) for k in self.cluster.worker_spec}
            pool = sorted(a for a, w in alive.items() if str(w.get("name")) in names)
            if not pool:
                self.errors.append(
                    f"{kind}: no live worker to pick at {time.monotonic() - self.t0:.1f} s"
                )
                return
            victim = self.victims.choice(pool)
        fault = Fault(round(time.monotonic() - self.t0, 3), kind, victim, n, int(self.progress()))
        if kind == "kill":
            pid = self.client.run(os.getpid, workers=[victim])[victim]
            os.kill(pid, signal.SIGKILL)
        elif kind == "retire":
            name = alive[victim].get("name")
            # the cluster forgets it first (so it is neither restarted nor counted), then the scheduler
            # retires it gracefully; scale() at the same size lets the cluster drop its nanny handle at once
            # (a stale handle held back the next scale-up until another scale call in a first version)
            for key in (name, str(name)):
                self.cluster.worker_spec.pop(key, None)
            self.client.retire_workers(workers=[victim], close_workers=True)
            self.cluster.scale(len(self.cluster.worker_spec))
        else:
            before = set(alive)
            self.cluster.scale(n + 1)
            self.faults.append(fault)
            # wait until the new worker is up, so "at least min_workers" holds for the next fault too
            t_end = time.monotonic() + 60.0
            while not self.stop.is_set() and not set(self._alive()) - before:
                if time.monotonic() > t_end:
                    self.errors.append(f"add at {fault.seconds:.1f} s: no new worker within 60 s")
                    break
                time.sleep(0.1)
            return
        self.faults.append(fault)


def problem(
    samples: int, n: int, m: int, l: int, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Inputs (a column of ones as bias), teacher signals in (0.1, 0.9), and seeded initial weights."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(samples, n))
    x[:, -1] = 1.0
    d = rng.uniform(0.1, 0.9, size=(samples, l))
    W0 = rng.uniform(-0.1, 0.1, size=(m, n))
    V0 = rng.uniform(-0.1, 0.1, size=(l, m))
    return x, d, W0, V0


def norm_diff(a: np.ndarray, b: np.ndarray) -> float:
    """Normwise relative difference max|a - b| / max|b|."""
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b))) / np.max(np.abs(np.asarray(b))))


def rel_diff(a: np.ndarray, b: np.ndarray) -> float:
    """Largest elementwise relative difference |a - b| / |b|."""
    a, b = np.asarray(a), np.asarray(b)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.abs(a - b) / np.abs(b)
    r = np.where(a == b, 0.0, r)
    return float(np.max(r)) if r.size else 0.0


def _outcome(f: Fault, remaps: list[dict[str, Any]], members: set[str]) -> str:
    """What the run recorded for fault ``f``."""
    if f.kind == "add":
        return "added"
    for rec in remaps:
        if f.worker in (rec.get("lost") or []) or (
            rec.get("lost") and f.worker in str(rec.get("reason"))
        ):
            return f"recovered from the {rec.get('recovered_from')}"
        if f.worker in (rec.get("retired") or []):
            return "retired by the run"
    if f.worker not in members:
        return "left before the run took it in (held no rows)"
    return "UNACCOUNTED"


def soak(
    seconds: float = 180.0,
    seed: int = 0,
    *,
    workers: int = 3,
    min_workers: int = 2,
    max_workers: int = 5,
    interval: tuple[float, float] = (3.0, 8.0),
    samples: int = 128,
    n: int = 16,
    hidden: int = 64,
    outputs: int = 4,
    learning_rate: float = 1e-3,
    block: int = 20,
    checkpoint_every: int = 100,
    mapping: str = "drpm",
    max_iterations: int = 10_000_000,
    log: Any = None,
) -> dict[str, Any]:
    """Run the soak; returns the report (see the module docstring)."""
    from distributed import Client, LocalCluster

    from dask_rpm import fit, fit_serial

    x, d, W0, V0 = problem(samples, n, hidden, outputs, seed)
    wall0 = time.monotonic()
    seen = {"iteration": 0}
    with (
        LocalCluster(
            n_workers=workers,
            threads_per_worker=1,
            processes=True,
            dashboard_address=":0",
            silence_logs=50,
        ) as cluster,
        Client(cluster) as client,
    ):
        client.wait_for_workers(workers)
        injector = Injector(
            cluster,
            client,
            seed,
            interval=interval,
            min_workers=min_workers,
            max_workers=max_workers,
            progress=lambda: seen["iteration"],
        )
        deadline = time.monotonic() + seconds

        def should_stop() -> bool:
            if time.monotonic() >= deadline:
                injector.stop.set()  # no fault after the deadline: the run is ending
                return True
            return False

        ticks: list[tuple[float, int]] = []

        def callback(info: dict[str, Any]) -> None:
            seen["iteration"] = info["iteration"]
            ticks.append((time.monotonic(), info["iteration"]))

        t0 = time.monotonic()
        injector.start()
        error = None
        try:
            r = fit(
                x,
                d,
                hidden=hidden,
                iterations=max_iterations,
                learning_rate=learning_rate,
                init=(W0, V0),
                mapping=mapping,
                client=client,
                interval=block,
                checkpoint_every=checkpoint_every,
                should_stop=should_stop,
                callback=callback,
                progress="none",
            )
        except BaseException as exc:  # reported in full: a fault the engine did not survive
            import traceback

            error = "".join(traceback.format_exception(exc))
            r = None
        finally:
            injector.stop.set()
            injector.join()
        train_seconds = time.monotonic() - t0
    faults = injector.faults
    report: dict[str, Any] = {
        "setup": {
            "cluster": f"distributed.LocalCluster(processes=True), {workers} worker processes x 1 thread at start, "
            f"equal speeds (no emulated heterogeneity), {os.cpu_count()} cores shared",
            "network": f"{n}-{hidden}-{outputs}",
            "samples": samples,
            "learning_rate": learning_rate,
            "mapping": mapping,
            "block": block,
            "checkpoint_every": checkpoint_every,
            "seed": seed,
            "seconds": seconds,
            "fault_interval_s": list(interval),
            "min_workers": min_workers,
            "max_workers": max_workers,
        },
        "faults": [f._asdict() for f in faults],
        "faults_by_kind": {k: sum(f.kind == k for f in faults) for k in KINDS},
        "injector_errors": injector.errors,
        "error": error,
    }
    if r is None:
        report.update(
            completed=False, faults_survived=0, wall_seconds=round(time.monotonic() - wall0, 2)
        )
        return report
    iterations = int(r.history.sizes["iteration"])
    W, V, err = fit_serial(
        x, d, hidden=hidden, iterations=iterations, learning_rate=learning_rate, init=(W0, V0)
    )
    Wp, Vp, _ = fit_serial(
        x,
        d,
        hidden=hidden,
        iterations=iterations,
        learning_rate=learning_rate,
        init=(W0 + 1e-15, V0),
    )
    conditioning = max(norm_diff(Wp, W), norm_diff(Vp, V))
    diff = max(rel_diff(r.W, W), rel_diff(r.V, V))
    diff_err = rel_diff(r.history["error"].values, err)
    equal = diff <= 1e-10 and diff_err <= 1e-10
    itemsize = np.dtype("float64").itemsize
    differing = int(
        np.sum(~np.isclose(r.W, W, rtol=1e-10, atol=0))
        + np.sum(~np.isclose(r.V, V, rtol=1e-10, atol=0))
    )
    members = set(r.history["address"].values.tolist())
    for p in r.plans:
        members |= set(p.workers or ())
    outcomes = [_outcome(f, r.remaps, members) for f in faults]
    fault_remaps = [
        rec for rec in r.remaps if rec.get("lost") or rec.get("joined") or rec.get("retired")
    ]
    replayed = int(sum(rec.get("replayed", 0) or 0 for rec in r.remaps))
    spi = r.seconds_per_iteration
    remap_seconds = float(sum(rec.get("seconds", 0.0) for rec in fault_remaps))
    lost_seconds = remap_seconds + replayed * spi
    # stalls: gaps between block boundaries longer than 2 s (a block takes ~0.1 s here); the time lost
    # computed from the remap records misses them (detection time: the run waits until it sees a loss)
    gaps = [
        (b[0] - a[0], a[1], round(a[0] - t0, 1))
        for a, b in zip(ticks, ticks[1:])
        if b[0] - a[0] > 2.0
    ]
    survived = sum(1 for o in outcomes if o != "UNACCOUNTED") if equal else 0
    report.update(
        completed=True,
        stopped=r.stopped,
        iterations=iterations,
        faults_injected=len(faults),
        faults_survived=survived,
        outcomes=outcomes,
        recovered_from={
            src: sum(1 for rec in r.remaps if rec.get("lost") and rec.get("recovered_from") == src)
            for src in ("columns", "checkpoint", "initial weights")
        },
        remaps={
            "fault": len(fault_remaps),
            "all": len(r.remaps),
            "lost": sum(1 for rec in r.remaps if rec.get("lost")),
            "joined": sum(1 for rec in r.remaps if rec.get("joined")),
            "retired_by_lifetime": sum(1 for rec in r.remaps if rec.get("retired")),
        },
        iterations_recomputed=replayed,
        weight_bytes_moved=int(sum(rec.get("bytes", 0) or 0 for rec in fault_remaps)),
        sample_bytes_reread=int(sum(rec.get("sample_bytes", 0) or 0 for rec in fault_remaps)),
        remap_seconds=round(remap_seconds, 4),
        median_seconds_per_iteration=spi,
        time_lost_seconds=round(lost_seconds, 4),
        time_lost_per_fault_seconds=round(lost_seconds / len(faults), 4) if faults else 0.0,
        bytes_lost=differing * itemsize,
        relative_difference_vs_serial=diff,
        relative_difference_errors=diff_err,
        equal_to_serial=equal,
        conditioning_1e15_W0=conditioning,
        relative_difference_normwise=max(norm_diff(r.W, W), norm_diff(r.V, V)),
        well_conditioned=conditioning < 1e-12,
        train_seconds=round(train_seconds, 2),
        wall_seconds=round(time.monotonic() - wall0, 2),
        final_workers=len(r.plan.planned_workers),
        stalls=[{"seconds": round(g, 2), "at_iteration": it, "at_s": at} for g, it, at in gaps],
        stalled_seconds=round(sum(g for g, _, _ in gaps), 2),
        fault_remap_records=[
            {
                k: rec.get(k)
                for k in (
                    "iteration",
                    "kind",
                    "reason",
                    "lost",
                    "joined",
                    "retired",
                    "recovered_from",
                    "replayed",
                    "bytes",
                    "sample_bytes",
                    "seconds",
                )
            }
            for rec in fault_remaps
        ],
    )
    return report


def summary(rep: dict[str, Any]) -> str:
    """The human-readable summary."""
    s = rep["setup"]
    lines = [
        f"chaos soak, seed {s['seed']}: {s['cluster']}",
        f"  network {s['network']}, {s['samples']} samples, lr {s['learning_rate']}, mapping {s['mapping']}, "
        f"blocks of {s['block']}, checkpoint every {s['checkpoint_every']}, a fault every "
        f"{s['fault_interval_s'][0]:g}-{s['fault_interval_s'][1]:g} s, {s['min_workers']}-{s['max_workers']} "
        f"workers",
        f"  faults injected: {len(rep['faults'])} "
        + "("
        + ", ".join(f"{k} {v}" for k, v in rep["faults_by_kind"].items())
        + ")",
    ]
    for f, o in zip(rep["faults"], rep.get("outcomes") or ["-"] * len(rep["faults"])):
        lines.append(
            f"    {f['seconds']:7.1f} s  it {f['iteration']:6d}  {f['kind']:6s} "
            f"{f['worker'] or '':24s} -> {o}"
        )
    if rep["injector_errors"]:
        lines.append(f"  injector errors: {rep['injector_errors']}")
    if not rep["completed"]:
        lines.append("  TRAINING FAILED:\n" + rep["error"])
        return "\n".join(lines)
    lines += [
        f"  faults survived: {rep['faults_survived']} of {rep['faults_injected']}; remaps {rep['remaps']}; "
        f"recovered from {rep['recovered_from']}",
        f"  iterations: {rep['iterations']} ({rep['median_seconds_per_iteration'] * 1e3:.2f} ms median); "
        f"recomputed {rep['iterations_recomputed']}",
        f"  weight bytes moved {rep['weight_bytes_moved']}, sample bytes re-read {rep['sample_bytes_reread']}",
        f"  time lost: {rep['time_lost_seconds']:.2f} s in all, {rep['time_lost_per_fault_seconds']:.3f} s per fault "
        f"(remaps {rep['remap_seconds']:.2f} s + recomputed iterations)",
        f"  stalls (> 2 s between block boundaries): {len(rep['stalls'])}, {rep['stalled_seconds']:.1f} s in all"
        + "".join(
            f"\n    {g['seconds']:.1f} s at iteration {g['at_iteration']} ({g['at_s']:.1f} s)"
            for g in rep["stalls"]
        ),
        f"  bytes lost: {rep['bytes_lost']}; final relative difference vs fit_serial: weights "
        f"{rep['relative_difference_vs_serial']:.2e}, errors {rep['relative_difference_errors']:.2e} "
        f"({'EQUAL' if rep['equal_to_serial'] else 'NOT EQUAL'} at rtol 1e-10); conditioning "
        f"(1e-15 change of W0): {rep['conditioning_1e15_W0']:.2e}",
        f"  wall time {rep['wall_seconds']:.1f} s (training {rep['train_seconds']:.1f} s)",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--seconds", type=float, default=180.0, help="training time (default 180)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the faults and of the problem")
    ap.add_argument("--workers", type=int, default=3, help="workers at start (default 3)")
    ap.add_argument("--min-workers", type=int, default=2)
    ap.add_argument("--max-workers", type=int, default=5)
    ap.add_argument(
        "--every",
        type=float,
        nargs=2,
        default=(3.0, 8.0),
        metavar=("MIN", "MAX"),
        help="seconds between faults, uniform (default 3 8)",
    )
    ap.add_argument("--mapping", default="drpm")
    ap.add_argument("--block", type=int, default=20, help="iterations per block")
    ap.add_argument("--checkpoint-every", type=int, default=100)
    ap.add_argument("--json", metavar="PATH", help="write the report as JSON here")
    a = ap.parse_args(argv)
    if not a.min_workers >= 1 or a.workers < a.min_workers or a.max_workers < a.workers:
        ap.error(
            f"need 1 <= --min-workers ({a.min_workers}) <= --workers ({a.workers}) <= --max-workers "
            f"({a.max_workers})"
        )
    rep = soak(
        a.seconds,
        a.seed,
        workers=a.workers,
        min_workers=a.min_workers,
        max_workers=a.max_workers,
        interval=tuple(a.every),
        mapping=a.mapping,
        block=a.block,
        checkpoint_every=a.checkpoint_every,
    )
    print(summary(rep))
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(rep, fh, indent=1, default=str)
    ok = (
        rep["completed"]
        and rep["equal_to_serial"]
        and rep["faults_survived"] == rep["faults_injected"]
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
