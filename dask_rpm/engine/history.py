"""The run's history as an ``xarray.Dataset``, read from the :class:`~dask_rpm.engine.timing.TimingLog`."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..plan.partition import Plan
from ..records import PHASES, Validation
from .timing import TimingLog

__all__ = ["build_history", "add_validation"]

_DESCRIPTIONS = {
    "forward": "compute 1: hidden outputs and partial products",
    "vertical_wait": "from forward end to backward start: vertical exchange incl. waiting",
    "backward": "compute 2: deltas and weight-update sums",
    "horizontal": "from backward end to modify start: horizontal exchange incl. waiting",
    "modify": "compute 3: applying the summed update",
}


def build_history(log: TimingLog, plan: Plan, addresses: list[str], run: str) -> Any:
    """Error, iteration time and per-worker phase times (dims ``iteration``, ``worker``)."""
    import xarray as xr

    its = log.iterations()
    n_workers = max(len(plan.abilities), len(addresses))
    phases = log.phase_table(its, n_workers)
    data_vars: dict[str, Any] = {
        "error": (
            ("iteration",),
            np.array([log.error(it) for it in its], dtype=float),
            {
                "units": "1",
                "description": "0.5 * sum over samples of ||h - d||^2, before the iteration's update",
            },
        ),
        "iteration_time": (
            ("iteration",),
            log.iteration_times(its),
            {
                "units": "s",
                "description": "per worker (own clock), end of previous update to end of "
                "this one; slowest worker",
            },
        ),
    }
    for p in PHASES:
        data_vars[p] = (
            ("iteration", "worker"),
            phases[p],
            {"units": "s", "description": _DESCRIPTIONS[p]},
        )
    t1 = phases["forward"] + phases["vertical_wait"] + phases["backward"]
    data_vars["t1"] = (
        ("iteration", "worker"),
        t1,
        {"units": "s", "description": "DRPM t1: forward start to backward end"},
    )
    data_vars["t2"] = (
        ("iteration", "worker"),
        phases["backward"],
        {"units": "s", "description": "DRPM t2: backward compute"},
    )
    data_vars["tc"] = (
        ("iteration", "worker"),
        phases["forward"] + phases["backward"],
        {
            "units": "s",
            "description": "DRPM tc: forward + backward compute, without the vertical wait",
        },
    )
    names = list(addresses) + [""] * (n_workers - len(addresses))
    coords = {
        "iteration": ("iteration", np.array(its, dtype=int)),
        "worker": ("worker", np.arange(n_workers)),
        "address": ("worker", np.array(names[:n_workers], dtype=object)),
    }
    return xr.Dataset(data_vars, coords=coords, attrs={"run": run, "method": plan.method})


def add_validation(history: Any, rows: list[Validation]) -> None:
    """Validation loss and accuracy (dim ``validation``, coordinate ``validation_iteration``)."""
    if not rows:
        return
    its, losses, accs = (np.array(c) for c in zip(*rows))
    history.coords["validation_iteration"] = (
        "validation",
        its.astype(int),
        {"description": "iterations done when the validation set was evaluated"},
    )
    history["validation_loss"] = (
        "validation",
        losses.astype(float),
        {"units": "1", "description": "loss on the validation set (summed over its samples)"},
    )
    history["validation_accuracy"] = (
        "validation",
        accs.astype(float),
        {
            "units": "1",
            "description": "fraction of validation samples classified right "
            "(NaN for linear outputs)",
        },
    )
