"""``dask_rpm.serial`` is :mod:`dask_rpm.nn.serial` (moved there; this path keeps working)."""

import importlib
import sys

# the old name is the same module object: its names, its classes' pickles, its identity
sys.modules[__name__] = importlib.import_module("dask_rpm.nn.serial")
