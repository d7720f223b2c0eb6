"""One plan as labelled data: :func:`plan_dataset` (``Plan.to_dataset()``).

Below :mod:`dask_rpm.plan.partition`, which calls it: this module works on any object with the
``Plan`` attributes and imports nothing of the package, so ``partition`` stays free of the
results layer. xarray is imported when a dataset is made.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["PLAN_VARS", "plan_dataset"]

#: ``attrs`` of the per-worker variables of a plan dataset.
PLAN_VARS: dict[str, dict[str, str]] = {
    "ability": {
        "units": "1",
        "description": "normalised ability the plan was made for (all workers sum to 1)",
    },
    "planned": {
        "units": "1",
        "description": "True when the worker has a rectangle (False: deliberately left out)",
    },
    "column": {"units": "1", "description": "column index, left to right (-1: not planned)"},
    "row": {"units": "1", "description": "position in its column, top to bottom (-1: not planned)"},
    "sample_start": {
        "units": "samples",
        "description": "first sample of the worker's column (-1: not planned)",
    },
    "sample_stop": {
        "units": "samples",
        "description": "one past the last sample of the worker's column (-1: not planned)",
    },
    "hidden_start": {
        "units": "hidden units",
        "description": "first hidden unit (row of W) the worker holds (-1: not planned)",
    },
    "hidden_stop": {
        "units": "hidden units",
        "description": "one past the last hidden unit the worker holds (-1: not planned)",
    },
    "work": {
        "units": "work units",
        "description": "rectangle area: samples x hidden units (one work unit is one hidden unit for one sample)",
    },
    "work_share": {
        "units": "1",
        "description": "rectangle area / (samples x hidden units of the whole iteration)",
    },
    "load": {
        "units": "1",
        "description": "work share / ability share among planned workers; 1 is perfect balance, the largest sets the pace",
    },
}

# --------------------------------------------------------------------------
# Plans as datasets
# --------------------------------------------------------------------------


def plan_dataset(plan: Any) -> Any:
    """One plan as an ``xarray.Dataset`` indexed by ``worker`` (``Plan.to_dataset()``).

    Parameters
    ----------
    plan : dask_rpm.Plan

    Returns
    -------
    xarray.Dataset
        Dimension ``worker`` (0..N-1, every worker the plan was made for,
        planned or not) with coordinates ``label`` (``P1``..``PN``) and
        ``address`` (empty when the plan is not bound to a cluster). Variables
        ``ability``, ``planned``, ``column``, ``row``, ``sample_start``,
        ``sample_stop``, ``hidden_start``, ``hidden_stop``, ``work``,
        ``work_share``, ``load``, each with ``units`` and ``description``.
        Attributes: ``method``, ``shape`` (``"n-m-l"``), ``n``, ``m``, ``l``,
        ``samples``, ``n_columns``, ``t_comm`` (elements, the paper's model),
        ``imbalance``, ``notes`` and ``plan_json`` (the exact plan, for
        :meth:`Plan.from_dataset <dask_rpm.plan.partition.Plan.from_dataset>`).
    """
    import xarray as xr

    n_all = len(plan.abilities)
    ints = {
        k: np.full(n_all, -1, dtype=np.int64)
        for k in ("column", "row", "sample_start", "sample_stop", "hidden_start", "hidden_stop")
    }
    work = np.zeros(n_all, dtype=np.int64)
    planned = np.zeros(n_all, dtype=bool)
    for c, col in enumerate(plan.columns):
        for k, w in enumerate(col):
            r = plan.rectangle(w)
            planned[w] = True
            ints["column"][w], ints["row"][w] = c, k
            ints["sample_start"][w], ints["sample_stop"][w] = r.samples
            ints["hidden_start"][w], ints["hidden_stop"][w] = r.hidden
            work[w] = r.area
    ability = np.asarray(plan.abilities, dtype=float)
    share = work / float(plan.samples * plan.m)
    p = np.where(planned, ability, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        load = np.where(planned, share / (p / p.sum()), np.nan)
    values: dict[str, Any] = {
        "ability": ability,
        "planned": planned,
        **ints,
        "work": work,
        "work_share": share,
        "load": load,
    }
    data_vars = {k: ("worker", v, dict(PLAN_VARS[k])) for k, v in values.items()}
    addresses = list(plan.workers) if plan.workers is not None else [""] * n_all
    coords = {
        "worker": (
            "worker",
            np.arange(n_all),
            {"description": "worker index in the order the abilities were given"},
        ),
        "label": (
            "worker",
            np.array([f"P{w + 1}" for w in range(n_all)], dtype=object),
            {"description": "the paper's processor name"},
        ),
        "address": (
            "worker",
            np.array([str(a) for a in addresses], dtype=object),
            {"description": "Dask worker address or name (empty: plan not bound to a cluster)"},
        ),
    }
    n, m, l = plan.shape
    attrs = {
        "title": f"dask_rpm {plan.method} plan: {len(plan.rectangles)} rectangles in {plan.n_columns} column(s)",
        "method": plan.method,
        "shape": f"{n}-{m}-{l}",
        "n": n,
        "m": m,
        "l": l,
        "samples": plan.samples,
        "n_columns": plan.n_columns,
        "t_comm": float(plan.t_comm),
        "t_comm_units": "elements (the paper's communication model)",
        "imbalance": plan.imbalance(),
        "imbalance_description": "largest load; 1 is perfect balance",
        "notes": "; ".join(plan.notes),
        "plan_json": plan.to_json(),
    }
    return xr.Dataset(data_vars, coords=coords, attrs=attrs)
