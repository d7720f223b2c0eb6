"""dask_rpm: heterogeneity-aware batch back-propagation on Dask by rectangular partitioning."""

from . import config  # noqa: F401  (registers the rpm.yaml defaults)
from .partition import Plan, PlanError, Rectangle

__version__ = "0.1.0.dev0"

__all__ = ["Plan", "PlanError", "Rectangle", "__version__"]
