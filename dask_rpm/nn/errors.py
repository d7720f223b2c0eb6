"""The one class of bad training input, :class:`DataError`, and what its subclasses name.

A leaf of :mod:`dask_rpm.nn` (no imports), so every module of the network can
raise its own subclass - :class:`~dask_rpm.nn.recipe.RecipeError`,
:class:`~dask_rpm.nn.network.NetworkError`, :class:`~dask_rpm.nn.optim.OptimizerError`,
:class:`~dask_rpm.nn.batches.BatchError` - and ``except DataError`` still catches
every refusal of ``fit`` and ``fit_serial``.
"""

from __future__ import annotations

__all__ = ["DataError"]


class DataError(ValueError):
    """Training data or options are invalid; the message says how to fix them (subclasses say
    which part: the recipe, the network, the optimizer, the mini-batches)."""
