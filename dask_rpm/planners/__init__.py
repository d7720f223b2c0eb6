"""Planners: from worker abilities to a column-fixed rectangle plan.

A *planner* turns normalised abilities into a real-valued
:class:`~dask_rpm.plan.partition.RealPartition`; :func:`make_plan` validates the
input, leaves out workers too slow to hold one hidden unit or one sample, snaps thin
horizontal bands (:func:`~dask_rpm.plan.partition.snap_small_groups`) and maps the
result to whole samples and hidden units
(:func:`~dask_rpm.plan.partition.to_integer`).

Planners are plain functions with one signature and live in a registry keyed
by name, so new ones can be added without touching :func:`make_plan`::

    def planner(abilities, shape, samples, *, dp=None) -> PlannerResult

``abilities`` is a float array of positive values summing to 1; the indices in
the returned partition refer to positions in that array.

=============  ===============================================================
name           what it does
=============  ===============================================================
``srpm``       optimal columns of the sorted order by dynamic programming
               (:mod:`~dask_rpm.planners.srpm`)
``uniform``    method 1: equal work on a regular grid (heterogeneity ignored)
``grid-h``     method H: regular grid, samples by the slowest of each group,
               hidden units split equally
``grid-hrev``  method H_rev: as H, hidden units in the ability ratio of the
               slowest group (alias ``grid``)
``split-1d``   proportional 1-D batch split: every worker a column of its own
               holding all hidden units, samples in proportion to ability
               (what heterogeneity-aware data-parallel systems do)
``srpm-time``  SRPM's columns chosen by predicted seconds per iteration
               (:mod:`~dask_rpm.planners.srpm_time`)
=============  ===============================================================

Modules: :mod:`~dask_rpm.planners.registry` (the interface and the table of names),
:mod:`~dask_rpm.planners.inputs` (checks), :mod:`~dask_rpm.planners.srpm`,
:mod:`~dask_rpm.planners.grids` (the baselines), :mod:`~dask_rpm.planners.srpm_time` and
:mod:`~dask_rpm.planners.make` (:func:`make_plan`). The built-in planners are registered
below, in one place.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_attributes
from .grids import divisors, grid_h, grid_hrev, split_1d, uniform
from .inputs import normalise, parse_network_shape, parse_shape, validate_abilities
from .make import fastest_grid, make_plan
from .registry import (
    DYNAMIC_MAPPING,
    PLANNERS,
    Planner,
    PlannerResult,
    describe_names,
    get_planner,
    mapping_names,
    planner_aliases,
    register_planner,
)
from .srpm import SRPMResult, srpm, srpm_dp, srpm_dp_reference
from .srpm_time import srpm_time

if not TYPE_CHECKING:  # type checkers resolve submodules themselves; a catch-all hides typos
    __getattr__, __dir__ = lazy_attributes(__name__, __path__)  # submodules on first use


# The built-in planners, in the order users see them listed (aliases after their planner).
for _name, _fn in (
    ("srpm", srpm),
    ("uniform", uniform),
    ("grid-h", grid_h),
    ("grid-hrev", grid_hrev),
    ("grid", grid_hrev),
    ("split-1d", split_1d),
    ("srpm-time", srpm_time),
):
    register_planner(_name, _fn)

__all__ = [
    "DYNAMIC_MAPPING",
    "PLANNERS",
    "Planner",
    "PlannerResult",
    "SRPMResult",
    "describe_names",
    "divisors",
    "fastest_grid",
    "get_planner",
    "grid_h",
    "grid_hrev",
    "make_plan",
    "mapping_names",
    "normalise",
    "parse_shape",
    "parse_network_shape",
    "planner_aliases",
    "register_planner",
    "split_1d",
    "srpm",
    "srpm_dp",
    "srpm_dp_reference",
    "srpm_time",
    "uniform",
    "validate_abilities",
]
