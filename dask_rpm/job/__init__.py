"""``dask-rpm train --config FILE``: a training job described in YAML.

A job file names the data, the network, how long to train, where the workers
come from and where the result goes::

    data: digits.nc             # netCDF with x(sample, input), d(sample, output); or a zarr store (below)
    hidden: 32                  # hidden units m (n and l come from the data)
    iterations: 500             # at most this many BP iterations ...
    target-error: 40.0          # ... or stop once the error is at most this (optional)
    learning-rate: 0.0005
    mapping: drpm               # a planner name (dask_rpm.planners); default rpm.train.mapping
    seed: 0                     # default rpm.train.seed
    output: digits-result.nc    # weights, history and plans, one netCDF, written atomically
    model: null                 # the trained model (dask-rpm predict --model); default <output stem>.model.nc; false: none
    overwrite: false            # true: replace an existing output (also --overwrite)
    checkpoint:
      every: 50                 # iterations between checkpoints (0: none)
      path: null                # default: the directory <output stem>.checkpoint, each worker writes its own rows there; a path ending in .nc: one netCDF file the driver writes
    min-workers: 3              # start once this many workers are up; later ones are absorbed (default rpm.train.min-workers)
    on-worker-loss: recover     # recover | raise (default rpm.train.on-worker-loss)
    backend: auto               # numpy | torch | cupy | auto: torch on a worker with a GPU (default rpm.engine.backend)
    device: auto                # auto (a worker's GPU where it has one) | cpu | cuda (default rpm.engine.device)
    time-limit: null            # seconds; then checkpoint and stop cleanly (SIGTERM does the same)
    workers:                    # exactly one of:
      slurm:                    #   SLURM jobs (dask_rpm.slurm.HeterogeneousSLURMCluster)
        groups:                 #   as in rpm.slurm.groups (docs/slurm.md)
          - {name: fast, jobs: 2, cores: 2, memory: 2GiB, partition: fast}
          - {name: slow, jobs: 2, cores: 1, memory: 2GiB, partition: slow}
        cluster: {interface: ib0}  # cluster-wide dask-jobqueue options
      # local: {speeds: [1.0, 0.5, 0.25]}   # EMULATED heterogeneity on this machine
      # scheduler: tcp://host:8786          # an existing Dask cluster
    config:                     # rpm.* settings for this run (dask config), e.g.
      drpm: {interval: 10}
      train: {dtype: float64}   # rpm.train.*: what mapping, seed, dtype, ... default to when not set above

What is trained (each optional; default ``rpm.train.*``; docs/training.md)::

    epochs: 20                  # instead of iterations: epochs x ceil(samples / batch-size) iterations
    batch-size: 256             # mini-batches (default: full batch, the paper's)
    shuffle: true               # a seeded new sample order every epoch (the same for every plan)
    loss: cross-entropy         # squared | cross-entropy (d: one-hot rows or class probabilities)
    activation: relu            # sigmoid | tanh | relu
    output-layer: auto          # auto (follows the loss) | sigmoid | linear | softmax
    bias: true                  # hidden and output bias terms
    optimizer: adam             # sgd | momentum | adam, or {name: adam, beta1: 0.9, ...}
    validation: 0.1             # hold out this fraction of the samples (seeded)
    validate-every: auto        # iterations between validation evaluations
    early-stopping: 5           # stop after this many evaluations without improvement (needs validation)
    tol: 1.0e-4                 # an improvement must lower the best validation loss by this fraction
    alpha: 1.0e-4               # L2 penalty 0.5 alpha sum W^2 on the weights (not the biases)
    reduction: mean             # sum (the paper's) | mean: step on the batch-mean gradient

Data in a zarr store (``Dataset.to_zarr``; needs the ``zarr`` package) train where its chunks
are: ``fit`` reads them on the workers (docs/training.md, "How the samples reach the
workers")::

    data: {zarr: train.zarr, x: x, d: d}   # the inputs' and targets' variables (default x, d),
                                           # each with a sample dimension; d may be 1-D class labels
    data: train.zarr                       # the same, variables x and d

A missing store, a missing variable (the message lists the store's) or one without a
``sample`` dimension is refused before any worker starts.

A convolutional network (CNN) instead of an MLP: ``network:`` in place of ``hidden:``
(``activation:`` and ``bias:`` are then the layers' own); the data file's ``x`` holds images::

    data: images.nc             # netCDF with x(sample, channel, height, width), d(sample, output)
                                # (or a zarr store: data: {zarr: images.zarr, x: x, d: d})
    network:                    # the layers in order, each cut along its output channels
      - {conv: 6, kernel: 5, padding: 2}  # output channels; kernel, stride (1), padding (0), bias (true)
      - relu                    # relu | tanh | sigmoid: after a conv or linear layer
      - {maxpool: 2}            # maxpool | avgpool: the window; stride (default: the window)
      - flatten                 # before the first linear layer
      - {linear: 10}            # the output layer: as many units as d has outputs

A CNN's images are read whole where the job runs and sent to the workers
(:func:`dask_rpm.nn.data.write_dataset` writes 4-D ``x``). Its output holds each
stage's parameters ``W1, b1, ..., V`` (dimensions ``stage1, stage1_input, ...``;
the last stage's last row is the output bias channel) and the attributes
``network`` (the layers, JSON) and ``image_shape``; its model file is a
:class:`dask_rpm.CNNModel`'s (``dask-rpm predict`` reads it). ``dask-rpm plan
--network job.yaml --image C,H,W`` shows which channels of every stage each
worker holds.

``mapping``, ``seed``, ``dtype``, ``min-workers`` and ``on-worker-loss``
that the file leaves out are not fixed by the job: ``fit`` reads
``rpm.train.*`` at call time, so the job's ``config:`` section,
``dask.config.set`` and ``DASK_RPM__TRAIN__...`` environment variables all
apply (the values they give are checked before any worker starts too).

Relative paths are relative to the job file. Everything is checked before any
worker starts; a bad file raises :class:`JobError` naming the key, the value
received, what is valid and how to fix it (the CLI prints it as one line and
exits 2). Settings under ``config:`` are checked against ``rpm.yaml`` (a
misspelt key is an error with a "did you mean"). Every bad input and its
message is listed in docs/errors.md.

Nothing the user has is overwritten by accident: an existing ``output`` is
refused unless ``overwrite: true`` (or ``--overwrite``), a path that is not a
regular file (a directory, ``/dev/full``) is always refused, and an existing
checkpoint is refused without ``--resume`` (it may be the only copy of a
stopped run). The output's and the checkpoint's directories are tried for
writing before the first iteration.

The output is written only when training ends (iterations done, target error
reached): to a temporary file in the output's directory, then renamed over
the output, so a file at the output path is always a complete result (with
the permissions the umask gives, readable by collaborators). If that write
still fails at the end (the directory went away, the disk filled), the result
is saved next to the checkpoint instead and the job says where (exit 1).
Checkpoints go by default into the directory ``<output stem>.checkpoint``
(``result.nc`` -> ``result.checkpoint/``): every worker writes its own rows
of the weights there in parallel and a manifest written last makes the
checkpoint valid (docs/checkpoints.md), so the driver never gathers the
weights to checkpoint; the directory must be one every worker can reach (on
SLURM, the shared file system the output is on). A ``checkpoint.path`` ending
in ``.nc`` instead names one netCDF file the driver writes (it gathers the
weights every ``checkpoint.every`` iterations), for workers without a shared
file system. Either is written atomically and removed once the output holds
the finished run. When training is stopped early (SIGTERM,
e.g. SLURM's walltime warning, or ``time-limit``) the job writes a checkpoint,
prints how to resume and exits 0 without an output file;
``dask-rpm train --config FILE --resume`` continues from the checkpoint and
ends with the weights an uninterrupted run would have had.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_attributes
from .load import check_config, check_paths, load_job
from .output import read_checkpoint, write_checkpoint, write_output
from .run import run_job
from .spec import TRAIN_SETTINGS, TRAINING_KEYS, Job, JobError
from .workers import workers_spec

if not TYPE_CHECKING:  # type checkers resolve submodules themselves; a catch-all hides typos
    __getattr__, __dir__ = lazy_attributes(__name__, __path__)  # submodules on first use

__all__ = [
    "Job",
    "JobError",
    "load_job",
    "run_job",
    "read_checkpoint",
    "write_checkpoint",
    "write_output",
    "check_paths",
    "check_config",
    "workers_spec",
    "TRAINING_KEYS",
    "TRAIN_SETTINGS",
]
