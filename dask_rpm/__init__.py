"""dask_rpm: heterogeneity-aware batch back-propagation on Dask by rectangular partitioning.

Public API
----------
fit, fit_serial       train on a Dask cluster / the serial reference
make_plan, Plan       plan rectangles (SRPM and the paper's baselines)
MLPModel              a trained network: predict, score, save/load, to_torch
local_cluster         a local cluster with EMULATED heterogeneous worker speeds
RPMSchedulerPlugin    the scheduler plugin that records rpm-* task timings
"""

from . import config  # noqa: F401  (registers the rpm.yaml defaults)
from . import kernels, train
from .emulation import local_cluster
from .engine import FitResult, TrainingError, WorkerLostError, fit, ordered_workers
from .serial import fit_serial
from .model import MLPModel
from .partition import Plan, PlanError, Rectangle
from .cost import predict_iteration_seconds, t_comm
from .planners import PLANNERS, get_planner, make_plan, register_planner
from .plugin import RPMSchedulerPlugin

__version__ = "0.1.0.dev0"

__all__ = [
    "FitResult",
    "MLPModel",
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
