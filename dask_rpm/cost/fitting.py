"""Fitting the network model to measured runs of the engine (no SciPy)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..comm.network import Interconnect, network_from_config
from .predict import CostModel, predict_iteration_seconds

__all__ = ["fit_network"]


def fit_network(
    runs: Sequence[tuple[Any, ...]],
    *,
    host_cores: float = 1.0,
    hosts: str | None = "one",
    duplex: bool = True,
    rounds: int = 400,
) -> Interconnect:
    """Interconnect parameters that best predict measured runs of the engine.

    Fits ``latency``, ``overhead``, ``bandwidth``, ``host_bandwidth``,
    ``fixed``, ``reduce`` and ``worker_cpu`` by minimising the sum of absolute log errors of
    :func:`predict_iteration_seconds` (engine exchanges) over ``runs``, by a
    coordinate search on the logarithms (a handful of parameters and runs; no
    SciPy needed).

    Parameters
    ----------
    runs
        ``(plan, speeds in work units/s, measured seconds per iteration, vertical algorithm)``,
        optionally with a fifth item, each worker's compute spread (see :func:`predict_breakdown`).
    host_cores
        Cores the workers of one host share.
    hosts
        ``"one"``: every worker on one host (a local cluster); ``None``: a host each.
    rounds
        Passes of the coordinate search.
    """
    if not runs:
        raise ValueError("fit_network needs at least one measured run")
    names = ("latency", "overhead", "bandwidth", "host_bandwidth", "fixed", "reduce", "worker_cpu")
    x = np.log(np.array([1e-4, 1e-4, 1e9, 1e9, 1e-4, 1e-9, 1e-4]))

    def net_of(v: np.ndarray, n_workers: int) -> Interconnect:
        p = dict(zip(names, np.exp(v)))
        return Interconnect(
            latency=p["latency"],
            overhead=p["overhead"],
            bandwidth=p["bandwidth"],
            host_bandwidth=p["host_bandwidth"],
            fixed=p["fixed"],
            reduce=p["reduce"],
            worker_cpu=p["worker_cpu"],
            host_cores=host_cores,
            duplex=duplex,
            hosts=("localhost",) * n_workers if hosts == "one" else None,
        )

    rule = CostModel.from_config(vertical="engine", horizontal="engine").rule  # read once

    def loss(v: np.ndarray) -> float:
        err = 0.0
        for run in runs:
            plan, speeds, measured, vert = run[:4]
            model = CostModel(
                network_from_config(net_of(v, len(plan.abilities))),
                vert if vert != "auto" else "engine",
                "engine",
                rule,
            )
            t = predict_iteration_seconds(
                plan, speeds, model=model, spread=run[4] if len(run) > 4 else None
            )
            err += abs(math.log(t / measured))  # L1: one noisy run does not drag the rest
        return err

    # Coordinate search first (robust from a poor start), then Nelder-Mead restarts polish it
    # (the loss is piecewise smooth: max() terms switch between workers and hosts).
    best = loss(x)
    step = 2.0
    for _ in range(rounds):
        improved = False
        for i in range(len(x)):
            for d in (step, -step):
                y = x.copy()
                y[i] += d
                f = loss(y)
                if f < best:
                    x, best, improved = y, f, True
        if not improved:
            step /= 2
            if step < 0.05:
                break
    for size in (1.0, 0.3, 0.1):
        x, best = _nelder_mead(loss, x, best, size, iterations=40 * len(x))
    return net_of(x, 0)._replace(hosts=None)


def _nelder_mead(
    f: Any, x0: np.ndarray, f0: float, size: float, iterations: int
) -> tuple[np.ndarray, float]:
    """Minimise ``f`` from ``x0`` by the Nelder-Mead simplex (initial edge ``size``); returns (x, f(x))."""
    n = len(x0)
    pts = [x0] + [x0 + size * np.eye(n)[i] for i in range(n)]
    vals = [f0] + [f(p) for p in pts[1:]]
    for _ in range(iterations):
        order = np.argsort(vals)
        pts, vals = [pts[i] for i in order], [vals[i] for i in order]
        centroid = np.mean(pts[:-1], axis=0)
        refl = centroid + (centroid - pts[-1])
        fr = f(refl)
        if fr < vals[0]:
            exp = centroid + 2 * (centroid - pts[-1])
            fe = f(exp)
            pts[-1], vals[-1] = (exp, fe) if fe < fr else (refl, fr)
        elif fr < vals[-2]:
            pts[-1], vals[-1] = refl, fr
        else:
            con = centroid + 0.5 * (pts[-1] - centroid)
            fc = f(con)
            if fc < vals[-1]:
                pts[-1], vals[-1] = con, fc
            else:  # shrink towards the best point
                pts = [pts[0]] + [pts[0] + 0.5 * (p - pts[0]) for p in pts[1:]]
                vals = [vals[0]] + [f(p) for p in pts[1:]]
    i = int(np.argmin(vals))
    return pts[i], vals[i]
