"""Results as labelled data and pictures: plans as ``xarray.Dataset``, ``result.plot()``.

* :func:`plan_dataset` (``Plan.to_dataset()``) - one plan, one entry per worker:
  its rectangle ``[sample_start, sample_stop) x [hidden_start, hidden_stop)``,
  column, ability, work and load, with units and descriptions in ``attrs``;
  ``Plan.from_dataset()`` reads it back exactly.
* :func:`plans_dataset` (``FitResult.plans_dataset()``) - every plan of a run
  along a ``plan`` dimension, with the iteration each one took over.
* :func:`describe_history` - units, descriptions and a title for the
  coordinates and attributes of ``FitResult.history``.
* :func:`plot_plan`, :func:`plot_result` (``FitResult.plot()``) - matplotlib
  figures: the error curve with the remaps marked, per-worker times, and the
  rectangles drawn to scale. matplotlib is an optional extra
  (``pip install 'dask-rpm[plot]'``).

Everything here works on finished results; nothing talks to a cluster.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from ._files import atomic_write
from .plan.dataset import PLAN_VARS, plan_dataset
from .records import RemapRecord

_NO_MATPLOTLIB = (
    "{what} needs matplotlib, an optional extra of dask-rpm that is not installed; "
    "install it with: pip install 'dask-rpm[plot]' (or: pip install matplotlib)"
)

__all__ = [
    "describe_history",
    "plan_dataset",
    "plans_dataset",
    "plot_plan",
    "plot_result",
    "save_figure",
    "validation_rows",
]


def plans_dataset(plans: Sequence[Any], remaps: Sequence[RemapRecord] = ()) -> Any:
    """Every plan of a run along a ``plan`` dimension (``FitResult.plans_dataset()``).

    Parameters
    ----------
    plans : sequence of Plan
        In the order they were used (``FitResult.plans``).
    remaps : sequence of dict
        ``FitResult.remaps``; remap ``i`` made plan ``i + 1``.

    Returns
    -------
    xarray.Dataset
        The per-worker variables of :func:`plan_dataset` with dimensions
        ``(plan, worker)`` (``address`` becomes a variable: remaps after a lost
        worker re-number workers), plus per plan: ``from_iteration`` (the
        first iteration run with it), ``kind`` (``initial``, ``column``,
        ``whole``, ...), ``method``, ``n_columns``, ``t_comm``, ``imbalance``.
    """
    import xarray as xr

    if not plans:
        raise ValueError("plans is empty; give at least one Plan (e.g. FitResult.plans)")
    remaps = list(remaps)
    per = []
    for i, plan in enumerate(plans):
        ds = plan_dataset(plan)
        ds = ds.reset_coords(["address", "label"]).drop_vars("label")
        if i == 0:
            start, kind = 0, "initial"
        elif len(remaps) == len(plans) - 1:
            start = int(remaps[i - 1].get("iteration", -1))
            kind = str(remaps[i - 1].get("kind", "remap"))
        else:  # cannot tell which remap made which plan
            start, kind = -1, "remap"
        ds = ds.assign({k: xr.Variable(*v) for k, v in _plan_scalars(plan, start, kind).items()})
        ds.attrs = {}
        per.append(ds)
    # a worker index missing from a plan: not planned, no address, no rectangle
    missing = ("column", "row", "sample_start", "sample_stop", "hidden_start", "hidden_stop")
    out = xr.concat(
        per,
        dim="plan",
        join="outer",
        data_vars="all",
        coords="minimal",
        fill_value={"planned": False, "address": "", **dict.fromkeys(missing, -1)},
    )
    out = out.assign_coords(
        plan=("plan", np.arange(len(plans)), {"description": "plan number, in the order used"})
    )
    for k, v in PLAN_VARS.items():  # concat keeps the first dataset's attrs; make sure
        if k in out:
            out[k].attrs = dict(v)
    out["address"].attrs = {
        "description": "Dask worker address or name of each worker index in each plan"
    }
    n, m, l = plans[0].shape
    out.attrs = {
        "title": f"dask_rpm plans of one run: {len(plans)} plan(s)",
        "shape": f"{n}-{m}-{l}",
        "samples": plans[0].samples,
    }
    return out


def _plan_scalars(plan: Any, start: int, kind: str) -> dict[str, tuple[Any, ...]]:
    """The per-plan variables of :func:`plans_dataset`: ``(dims, value, attrs)`` each."""
    return {
        "from_iteration": (
            (),
            start,
            {
                "units": "iterations",
                "description": "first iteration run with this plan (-1: unknown)",
            },
        ),
        "kind": ((), kind, {"description": "how the plan came about: initial, or the remap kind"}),
        "method": ((), plan.method, {"description": "planner that made the plan"}),
        "n_columns": (
            (),
            plan.n_columns,
            {"units": "1", "description": "number of columns (data-parallel groups)"},
        ),
        "t_comm": (
            (),
            float(plan.t_comm),
            {"units": "elements", "description": "the paper's communication cost model"},
        ),
        "imbalance": (
            (),
            plan.imbalance(),
            {"units": "1", "description": "largest load; 1 is perfect balance"},
        ),
    }


def validation_rows(hist: Any) -> list[list[float]]:
    """Validation rows ``(iteration, loss, accuracy)`` from a history Dataset, if it has them."""
    if hist is None:
        return []
    names = set(getattr(hist, "variables", ()))
    for var in ("validation_loss", "val_loss"):
        if var in names:
            v = hist[var]
            dim = v.dims[0]
            it = np.asarray(hist[dim].values, dtype=float)
            acc_name = var.replace("loss", "accuracy")
            acc = hist[acc_name].values if acc_name in names else np.full(len(it), math.nan)
            return [[float(i), float(x), float(a)] for i, x, a in zip(it, v.values, acc)]
    return []


# --------------------------------------------------------------------------
# History
# --------------------------------------------------------------------------


def describe_history(history: Any, plan: Any = None) -> Any:
    """Add descriptions to the coordinates of ``FitResult.history`` and a title; returns it."""
    coords = {
        "iteration": {
            "units": "iterations",
            "description": "BP iteration (0-based); the error is before its update",
        },
        "worker": {
            "description": "worker index in dask_rpm.ordered_workers order (the plan's worker index)"
        },
        "address": {"description": "Dask worker address"},
        "check": {"description": "DRPM check number"},
        "check_iteration": {
            "units": "iterations",
            "description": "iterations completed at the DRPM check",
        },
    }
    for name, attrs in coords.items():
        if name in history.coords:
            history[name].attrs.update(
                {k: v for k, v in attrs.items() if k not in history[name].attrs}
            )
    history.attrs.setdefault(
        "title", "dask_rpm training history: error and per-worker phase times per iteration"
    )
    if plan is not None:
        n, m, l = plan.shape
        history.attrs.setdefault("shape", f"{n}-{m}-{l}")
        history.attrs.setdefault("samples", plan.samples)
    return history


# --------------------------------------------------------------------------
# Pictures
# --------------------------------------------------------------------------


def _matplotlib(what: str) -> Any:
    try:
        import matplotlib
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise ImportError(_NO_MATPLOTLIB.format(what=what)) from exc
    return matplotlib, Figure


def _colour(worker: int) -> Any:
    from matplotlib import colormaps

    cmap = colormaps["tab10" if worker < 10 else "tab20"]
    return cmap(worker % cmap.N)


def plot_plan(plan: Any, ax: Any = None, *, title: str | None = None, labels: bool = True) -> Any:
    """Draw a plan's rectangles to scale: samples across, hidden units down.

    Each rectangle is coloured by worker and labelled ``P<i>`` with its share
    of the work (and its address's last part when the plan is bound to a
    cluster). Returns the matplotlib ``Axes`` (a new figure's when ``ax`` is None).
    """
    _, Figure = _matplotlib("plot_plan()")
    from matplotlib.patches import Rectangle as Box

    if ax is None:
        ax = Figure(figsize=(5, 4), layout="constrained").add_subplot()
    s, m = plan.samples, plan.m
    total = float(s * m)
    for col in plan.columns:
        for w in col:
            r = plan.rectangle(w)
            (s0, s1), (m0, m1) = r.samples, r.hidden
            ax.add_patch(
                Box(
                    (s0, m0),
                    s1 - s0,
                    m1 - m0,
                    facecolor=_colour(w),
                    edgecolor="black",
                    linewidth=1.0,
                    alpha=0.85,
                )
            )
            if labels:
                text = f"P{w + 1}\n{r.area / total:.0%}"
                size = max(5.0, min(10.0, 60.0 * min((s1 - s0) / s, (m1 - m0) / m) ** 0.5))
                ax.text((s0 + s1) / 2, (m0 + m1) / 2, text, ha="center", va="center", fontsize=size)
    ax.set_xlim(0, s)
    ax.set_ylim(m, 0)  # hidden unit 0 at the top, as the paper draws it
    ax.set_xlabel("samples")
    ax.set_ylabel("hidden units")
    if title is None:
        title = f"{plan.method}: {len(plan.rectangles)} workers, {plan.n_columns} column(s)"
    ax.set_title(title, fontsize=10)
    return ax


def save_figure(fig: Any, path: Any, **kwargs: Any) -> None:
    """Save a matplotlib figure ``fig`` to ``path`` via a temporary file in the same directory (no
    half-written file; the format from the extension, ``kwargs`` to ``savefig``)."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise FileNotFoundError(
            f"cannot save the figure to {path!r}: directory {directory!r} does not exist"
        )
    fmt = os.path.splitext(path)[1].lstrip(".").lower() or "png"
    try:
        atomic_write(path, lambda tmp: fig.savefig(tmp, format=fmt, **kwargs))
    except OSError as e:  # name the file the caller asked for, not the temporary one written first
        raise type(e)(
            e.errno,
            f"cannot save the figure to {path!r}: {e.strerror}; choose a writable directory",
        ) from None


def plot_result(
    result: Any, path: Any = None, *, figsize: tuple[float, float] = (11.0, 8.0), dpi: int = 100
) -> Any:
    """Draw a training run (``FitResult.plot()``).

    Four panels: the error per iteration (log scale) with remaps marked;
    each worker's compute time per iteration (forward + backward + modify)
    and the iteration time; the first plan's rectangles; the last plan's
    rectangles. EMULATED runs say so in the title.

    Parameters
    ----------
    result : FitResult
    path : str or path-like, optional
        Also save the figure there (format from the suffix, e.g. ``.png``,
        ``.svg``, ``.pdf``), written to a temporary file first and then
        renamed, so a failed save leaves no partial file.
    figsize : (float, float)
        Inches.
    dpi : int
        Resolution when saving raster formats.

    Returns
    -------
    matplotlib.figure.Figure

    Raises
    ------
    ImportError
        matplotlib is not installed (``pip install 'dask-rpm[plot]'``).
    """
    _, Figure = _matplotlib("FitResult.plot()")

    h = result.history
    fig = Figure(figsize=figsize, layout="constrained")
    grid = fig.add_gridspec(2, 2)
    ax_err = fig.add_subplot(grid[0, 0])
    ax_time = fig.add_subplot(grid[0, 1])
    plans = list(result.plans) or [result.plan]
    if len(plans) > 1:
        plan_axes = [fig.add_subplot(grid[1, 0]), fig.add_subplot(grid[1, 1])]
        shown = [(plans[0], "first plan"), (plans[-1], "last plan")]
    else:
        plan_axes = [fig.add_subplot(grid[1, :])]
        shown = [(plans[0], "plan")]

    its = np.asarray(h["iteration"].values)
    _draw_errors(ax_err, h, its, result.remaps)
    _draw_times(ax_time, h, its, [r.get("iteration") for r in result.remaps])

    starts = [0] + [r.get("iteration") for r in result.remaps]
    for k, (ax, (plan, what)) in enumerate(zip(plan_axes, shown)):
        idx = 0 if k == 0 else len(plans) - 1
        since = (
            f", from iteration {starts[idx]}"
            if idx < len(starts) and starts[idx] is not None
            else ""
        )
        plot_plan(plan, ax, title=f"{what}: {plan.method}, {plan.n_columns} column(s){since}")

    title = f"dask_rpm training: {its.size} iterations, {len(plans)} plan(s), {len(result.remaps)} remap(s)"
    if result.emulation:
        title += f"\n{result.emulation}"
    fig.suptitle(title, fontsize=11)
    if path is not None:
        save_figure(fig, path, dpi=dpi)
    return fig


def _draw_errors(ax_err: Any, h: Any, its: np.ndarray, remaps: Any) -> None:
    """The error per iteration (log scale when positive), remaps as dashed lines."""
    err = np.asarray(h["error"].values, dtype=float)
    ax_err.plot(its, err, color="black", linewidth=1.5, label="error")
    if err.size and np.all(err[np.isfinite(err)] > 0):
        ax_err.set_yscale("log")
    for r in remaps:
        colour = "tab:red" if r.get("kind") == "whole" else "tab:orange"
        ax_err.axvline(
            r.get("iteration", math.nan),
            color=colour,
            linestyle="--",
            linewidth=1.0,
            label=f"{r.get('kind', 'remap')} remap",
        )
    handles, names = ax_err.get_legend_handles_labels()
    unique = dict(zip(names, handles))
    ax_err.legend(unique.values(), unique.keys(), fontsize=8)
    ax_err.set_xlabel("iteration")
    ax_err.set_ylabel(f"error ({h['error'].attrs.get('units', '1')})")
    ax_err.set_title("error per iteration", fontsize=10)


def _draw_times(ax_time: Any, h: Any, its: np.ndarray, remap_its: list[Any]) -> None:
    """Each worker's compute time per iteration and the iteration time, in ms."""
    compute: Any = sum(
        np.asarray(h[p].values, dtype=float) for p in ("forward", "backward", "modify") if p in h
    )
    workers = np.asarray(h["worker"].values)
    if np.ndim(compute) == 2:
        for j, w in enumerate(workers):
            col = compute[:, j]
            if np.any(np.isfinite(col)):
                ax_time.plot(
                    its,
                    col * 1e3,
                    color=_colour(int(w)),
                    linewidth=1.0,
                    label=f"P{int(w) + 1} compute",
                )
    if "iteration_time" in h:
        ax_time.plot(
            its,
            np.asarray(h["iteration_time"].values, dtype=float) * 1e3,
            color="black",
            linewidth=1.5,
            label="iteration",
        )
    for it in remap_its:
        ax_time.axvline(
            it if it is not None else math.nan, color="grey", linestyle="--", linewidth=0.8
        )
    ax_time.set_xlabel("iteration")
    ax_time.set_ylabel("ms")
    ax_time.set_title("per-worker compute time and iteration time", fontsize=10)
    ax_time.legend(fontsize=7, ncol=2)
