"""DRPM's decisions (pure): ability estimates, when to remap, and the remap itself.

* :mod:`~dask_rpm.drpm.estimator` - abilities from the workers' timings (least squares);
* :mod:`~dask_rpm.drpm.policy` - when to check and which remap to make;
* :mod:`~dask_rpm.drpm.remap` - column and whole remaps of a plan, and what moves.

The engine runs them between blocks (:mod:`dask_rpm.engine.drpm`). The old
paths (``dask_rpm.drpm.estimator``, ``dask_rpm.drpm.policy``, ``dask_rpm.drpm.remap``) are the same modules.
"""
