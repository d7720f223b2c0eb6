"""The network: its form, kernels, optimizers, mini-batches, recipe, data and the serial reference.

The model layer (pure: numpy and xarray, torch or cupy arrays where a backend names them; no
``distributed``): what one BP iteration computes, shared by the serial reference and the engine's
workers.

* :mod:`~dask_rpm.nn.options` - :class:`TrainingOptions`, what a run trains;
* :mod:`~dask_rpm.nn.network` - the network's form (activation, output, loss, bias);
* :mod:`~dask_rpm.nn.kernels` - the one set of BP kernels (:class:`Workspace`);
* :mod:`~dask_rpm.nn.backend` - where the kernels' arrays live (numpy, torch, cupy; CPU or GPU);
* :mod:`~dask_rpm.nn.optim` - optimizer steps (PyTorch's and scikit-learn's conventions);
* :mod:`~dask_rpm.nn.batches` - the mini-batch sequence, the same for every plan;
* :mod:`~dask_rpm.nn.recipe` - options resolved into one :class:`Recipe`, validation;
* :mod:`~dask_rpm.nn.convergence` - end-of-epoch rules (scikit-learn's stopping);
* :mod:`~dask_rpm.nn.data` - datasets on disk, input checks;
* :mod:`~dask_rpm.nn.prepare` - data and options to a validated job;
* :mod:`~dask_rpm.nn.serial` - the serial reference every distributed run equals.

Each is imported on first use: after ``import dask_rpm``, ``dask_rpm.nn.data.write_dataset``
works as written.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_attributes

if not TYPE_CHECKING:  # type checkers resolve submodules themselves; a catch-all hides typos
    __getattr__, __dir__ = lazy_attributes(__name__, __path__)  # submodules on first use
