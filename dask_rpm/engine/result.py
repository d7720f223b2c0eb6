"""What :func:`dask_rpm.fit` returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..model.cnn import CNNModel
from ..model.mlp import MLPModel
from ..nn.cnn import is_conv
from ..plan.partition import Plan
from ..records import RemapRecord, Validation
from ..results import plans_dataset, plot_result

__all__ = ["FitResult"]


@dataclass
class FitResult:
    """Outcome of :func:`dask_rpm.fit`.

    Attributes
    ----------
    params : list of numpy.ndarray
        Final parameters ``W_1 .. W_L, V`` (:mod:`dask_rpm.nn.layers`): ``W_k`` is
        ``(m_k, m_(k-1))``, ``V`` is ``(l, m_L)``; with bias terms one more row and
        column each (:mod:`dask_rpm.nn.network`). One hidden layer: ``params[0]`` and
        ``params[-1]`` are the paper's ``W`` and ``V``.
    history : xarray.Dataset
        Error per iteration and per-worker phase times (dims ``iteration``, ``worker``).
    plan : Plan
        The plan in use at the end.
    plans : list of Plan
        Every plan used, in order (more than one after remaps).
    remaps : list of dict
        One entry per remap (iteration, kind, bytes moved, seconds).
    stopped : str or None
        Why training stopped early (e.g. divergence), else None.
    emulation : str or None
        The emulation label when the cluster emulated heterogeneity.
    probe : xarray.Dataset or None
        The probe's measurements when ``abilities="probe"``.
    stats : dict
        Engine counters: ``tasks`` (Dask tasks submitted), ``blocks``,
        ``checkpoints`` (``(iteration, seconds)`` of each checkpoint) and
        ``start``: the iteration training started at, ``from`` (``"initial
        weights"``, ``"checkpoint"`` or ``"checkpoint store"``), the weight
        bytes the client scattered (``client_bytes``) and those the workers
        read from a checkpoint store themselves (``store_bytes``), and the
        ``seconds`` placing the first shards took; ``memory``: bytes of weights
        and optimizer state each worker of the final plan holds, by address (its
        rows of every layer: the rectangle model shards the model, a data-parallel
        peer holds all of it on every worker).
    recipe : dask_rpm.nn.recipe.Recipe
        Network, optimizer, mini-batch schedule, iterations and learning rate used.
    classes : numpy.ndarray or None
        Class labels when ``d`` was given as 1-D labels (cross-entropy).
    validation : list of (iteration, loss, accuracy)
        Validation-set evaluations (also in ``history``).
    optimizer_state : dict
        The optimizer's state at the end, ``{slot: [one array per parameter]}``
        (empty for plain gradient descent): with ``params`` a checkpoint that
        ``fit(resume=...)`` continues from.
    drpm_state : dict or None
        DRPM's state at the end (``mapping="drpm"``): the plan, the checks
        and the estimator windows, JSON-able. A checkpoint holding it (as
        ``fit(on_checkpoint=...)`` checkpoints do, key ``"drpm"``) makes
        ``fit(resume=...)`` continue on that plan with those estimates.
    """

    params: list[np.ndarray]
    history: Any
    plan: Plan
    plans: list[Plan] = field(default_factory=list)
    remaps: list[RemapRecord] = field(default_factory=list)
    stopped: str | None = None
    emulation: str | None = None
    probe: Any = None
    stats: dict[str, Any] = field(default_factory=dict)
    recipe: Any = None
    classes: Any = None
    validation: list[Validation] = field(default_factory=list)
    optimizer_state: dict[str, list[np.ndarray]] = field(default_factory=dict)
    drpm_state: dict[str, Any] | None = None

    @property
    def error(self) -> float:
        """Error of the last completed iteration."""
        err = self.history["error"].values
        return float(err[-1]) if err.size else float("nan")

    @property
    def seconds_per_iteration(self) -> float:
        """Median measured iteration time (seconds)."""
        t = self.history["iteration_time"].values
        t = t[np.isfinite(t)]
        return float(np.median(t)) if t.size else float("nan")

    @property
    def model(self) -> Any:
        """The trained network: a :class:`dask_rpm.MLPModel`, or a :class:`dask_rpm.CNNModel` for
        ``fit(network=...)``; predict, score, save, to_torch."""
        if is_conv(getattr(self.recipe, "layers", None)):
            return CNNModel.from_result(self)
        return MLPModel.from_result(self)

    def predict(self, x: Any) -> np.ndarray:
        """Predictions of the trained network for inputs ``x``, images ``(samples, channels,
        height, width)`` for a CNN (:meth:`dask_rpm.MLPModel.predict`, :meth:`dask_rpm.CNNModel.predict`)."""
        return self.model.predict(x)

    def score(self, x: Any, y: Any) -> float:
        """Accuracy (classifier) or R^2 (regression) on ``x, y`` (:meth:`dask_rpm.MLPModel.score`)."""
        return self.model.score(x, y)

    def plans_dataset(self) -> Any:
        """Every plan used, as one ``xarray.Dataset`` along ``plan`` (:func:`dask_rpm.results.plans_dataset`)."""
        return plans_dataset(self.plans or [self.plan], self.remaps)

    def plot(self, path: Any = None, **kwargs: Any) -> Any:
        """Error curve, per-worker times and rectangles as a matplotlib Figure (:func:`dask_rpm.results.plot_result`)."""
        return plot_result(self, path, **kwargs)

    def __repr__(self) -> str:
        return (
            f"<FitResult {self.history.sizes.get('iteration', 0)} iterations, error {self.error:.6g}, "
            f"{self.seconds_per_iteration * 1e3:.1f} ms/iteration, {len(self.plans)} plan(s), "
            f"{len(self.remaps)} remap(s)>"
        )
