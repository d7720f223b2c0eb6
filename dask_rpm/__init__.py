"""dask_rpm: heterogeneity-aware batch back-propagation on Dask by rectangular partitioning.

Public API
----------
fit, fit_serial       train on a Dask cluster / the serial reference
make_plan, Plan       plan rectangles (SRPM and the paper's baselines)
MLPModel              a trained network: predict, score, save/load, to_torch
MLPClassifier, MLPRegressor  scikit-learn estimators (need scikit-learn; imported on first use)
local_cluster         a local cluster with EMULATED heterogeneous worker speeds
RPMSchedulerPlugin    the scheduler plugin that records rpm-* task timings
"""

from . import (
    config,  # noqa: F401  (registers the rpm.yaml defaults)
    kernels,
    train,
)
from .cost import predict_iteration_seconds, t_comm
from .emulation import local_cluster
from .engine import FitResult, TrainingError, WorkerLostError, fit, ordered_workers
from .model import MLPModel
from .partition import Plan, PlanError, Rectangle
from .planners import PLANNERS, get_planner, make_plan, register_planner
from .plugin import RPMSchedulerPlugin
from .serial import fit_serial

__version__ = "0.1.0.dev0"


def __getattr__(name: str) -> object:
    # the estimators import scikit-learn: only when asked for, so `import dask_rpm` stays light
    if name in ("MLPClassifier", "MLPRegressor"):
        from . import estimators

        return getattr(estimators, name)
    raise AttributeError(f"module 'dask_rpm' has no attribute {name!r}")


__all__ = [
    "FitResult",
    "MLPClassifier",
    "MLPModel",
    "MLPRegressor",
    "PLANNERS",
    "Plan",
    "PlanError",
    "RPMSchedulerPlugin",
    "Rectangle",
    "TrainingError",
    "WorkerLostError",
    "__version__",
    "fit",
    "fit_serial",
    "get_planner",
    "predict_iteration_seconds",
    "t_comm",
    "kernels",
    "train",
    "local_cluster",
    "make_plan",
    "ordered_workers",
    "register_planner",
]
