"""DRPM's decisions (pure): ability estimates, when to remap, and the remap itself.

* :mod:`~dask_rpm.drpm.estimator` - abilities from the workers' timings (least squares);
* :mod:`~dask_rpm.drpm.policy` - when to check and which remap to make;
* :mod:`~dask_rpm.drpm.remap` - column and whole remaps of a plan, and what moves;
* :mod:`~dask_rpm.drpm.settings` - ``rpm.drpm.*`` as one record, read once per call.

The engine runs them between blocks (:mod:`dask_rpm.engine.drpm`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_attributes

if not TYPE_CHECKING:  # type checkers resolve submodules themselves; a catch-all hides typos
    __getattr__, __dir__ = lazy_attributes(__name__, __path__)  # submodules on first use
