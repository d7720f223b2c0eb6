"""dask_rpm: heterogeneity-aware batch back-propagation on Dask by rectangular partitioning.

Public API
----------
fit, fit_serial       train on a Dask cluster / the serial reference
TrainingOptions       what they train, as one record (their keywords, one to one)
make_plan, Plan       plan rectangles (SRPM and the paper's baselines)
MLPModel, CNNModel    a trained network (an MLP, a CNN): predict, score, save/load, to_torch
MLPClassifier, MLPRegressor, CNNClassifier  scikit-learn estimators (need scikit-learn)
local_cluster         a local cluster with EMULATED heterogeneous worker speeds
RPMSchedulerPlugin    the scheduler plugin that records rpm-* task timings

Every name is imported on first use (PEP 562), so ``import dask_rpm.planners`` (the pure
layer: planning, cost model, kernels) loads neither ``distributed`` nor scikit-learn.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import config  # noqa: F401  (registers the rpm.yaml defaults with dask.config)
from ._lazy import lazy_attributes
from ._version import __version__

#: public name -> the module that defines it (imported when the name is first asked for)
_LAZY = {
    "predict_iteration_seconds": "cost",
    "t_comm": "cost",
    "local_cluster": "emulation",
    "FitResult": "engine",
    "TrainingError": "engine",
    "WorkerLostError": "engine",
    "fit": "engine",
    "ordered_workers": "ordering",
    "MLPModel": "model.mlp",
    "CNNModel": "model.cnn",
    "Plan": "plan.partition",
    "PlanError": "plan.partition",
    "Rectangle": "plan.partition",
    "PLANNERS": "planners",
    "get_planner": "planners",
    "make_plan": "planners",
    "register_planner": "planners",
    "RPMSchedulerPlugin": "plugin",
    "fit_serial": "nn.serial",
    "TrainingOptions": "nn.options",
    "MLPClassifier": "estimators",
    "MLPRegressor": "estimators",
    "CNNClassifier": "estimators",
}

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time __getattr__ imports these
    from .cost import predict_iteration_seconds, t_comm
    from .emulation import local_cluster
    from .engine import FitResult, TrainingError, WorkerLostError
    from .engine.fit import fit
    from .estimators import CNNClassifier, MLPClassifier, MLPRegressor
    from .model.cnn import CNNModel
    from .model.mlp import MLPModel
    from .nn.options import TrainingOptions
    from .nn.serial import fit_serial
    from .ordering import ordered_workers
    from .plan.partition import Plan, PlanError, Rectangle
    from .planners import PLANNERS, get_planner, make_plan, register_planner
    from .plugin import RPMSchedulerPlugin
else:  # at run time: the names above and every submodule, imported on first use
    __getattr__, __dir__ = lazy_attributes(__name__, __path__, _LAZY)

__all__ = [  # the lazy names above, spelled out for linters and `from dask_rpm import *`
    "CNNClassifier",
    "CNNModel",
    "FitResult",
    "MLPClassifier",
    "MLPModel",
    "MLPRegressor",
    "PLANNERS",
    "Plan",
    "PlanError",
    "RPMSchedulerPlugin",
    "Rectangle",
    "TrainingOptions",
    "TrainingError",
    "WorkerLostError",
    "__version__",
    "fit",
    "fit_serial",
    "get_planner",
    "local_cluster",
    "make_plan",
    "ordered_workers",
    "predict_iteration_seconds",
    "register_planner",
    "t_comm",
]
