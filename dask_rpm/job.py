"""``dask-rpm train --config FILE``: a training job described in YAML.

A job file names the data, the network, how long to train, where the workers
come from and where the result goes::

    data: digits.nc             # netCDF with x(sample, input), d(sample, output)
    hidden: 32                  # hidden units m (n and l come from the data)
    iterations: 500             # at most this many BP iterations ...
    target-error: 40.0          # ... or stop once the error is at most this (optional)
    learning-rate: 0.0005
    mapping: drpm               # drpm | srpm | uniform | grid | grid-h | grid-hrev | ...
    seed: 0
    output: digits-result.nc    # weights, history and plans, one netCDF, written atomically
    model: null                 # the trained model (dask-rpm predict --model); default <output stem>.model.nc; false: none
    overwrite: false            # true: replace an existing output (also --overwrite)
    checkpoint:
      every: 50                 # iterations between checkpoints (0: none)
      path: null                # default: <output>.checkpoint.nc
    min-workers: 3              # start once this many workers are up; later ones are absorbed
    on-worker-loss: recover     # recover | raise
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
Checkpoints are written the same way. When training is stopped early (SIGTERM,
e.g. SLURM's walltime warning, or ``time-limit``) the job writes a checkpoint,
prints how to resume and exits 0 without an output file;
``dask-rpm train --config FILE --resume`` continues from the checkpoint and
ends with the weights an uninterrupted run would have had.
"""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import json
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, TextIO

import numpy as np

__all__ = ["Job", "JobError", "load_job", "run_job", "read_checkpoint"]

#: Job keys that choose what is trained, and fit()'s keyword for each (validated by dask_rpm.recipe).
TRAINING_KEYS = {
    "epochs": "epochs",
    "batch-size": "batch_size",
    "shuffle": "shuffle",
    "activation": "activation",
    "loss": "loss",
    "output-layer": "output",
    "bias": "bias",
    "optimizer": "optimizer",
    "validation": "validation",
    "validate-every": "validate_every",
    "early-stopping": "early_stopping",
    "tol": "tol",
}
_KEYS = (
    "data",
    "hidden",
    "iterations",
    "target-error",
    "learning-rate",
    "mapping",
    "seed",
    "dtype",
    "output",
    "overwrite",
    "checkpoint",
    "min-workers",
    "on-worker-loss",
    "time-limit",
    "workers",
    "config",
    "model",
    *TRAINING_KEYS,
)
_OVERWRITE_HINT = "set overwrite: true in the job file (or pass --overwrite) to replace it"


class JobError(ValueError):
    """The job file is invalid; the message says which key, what was received and how to fix it."""


@dataclass
class Job:
    """A validated training job (see the module docstring for the file format)."""

    path: str
    text: str
    data: str
    hidden: int
    iterations: int
    learning_rate: float
    output: str
    checkpoint_path: str
    checkpoint_every: int = 0
    target_error: float | None = None
    mapping: str = "drpm"
    seed: int = 0
    dtype: str = "float64"
    min_workers: int = 1
    on_worker_loss: str = "recover"
    time_limit: float | None = None
    workers: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    shape: tuple[int, int, int] = (0, 0, 0)  # (s, n, l) of the data
    overwrite: bool = False
    training: dict[str, Any] = field(default_factory=dict)  # fit() keywords from TRAINING_KEYS
    model: str | None = None  # where the trained model goes (None: not written)

    @property
    def fingerprint(self) -> str:
        """What a checkpoint must match to be resumed by this job (data, network, learning)."""
        key = json.dumps(
            [
                os.path.abspath(self.data),
                list(self.shape),
                self.hidden,
                self.learning_rate,
                self.seed,
                self.dtype,
                *([sorted(self.training.items())] if self.training else []),
            ],
        )
        return hashlib.sha256(key.encode()).hexdigest()[:16]

    @property
    def network(self) -> str:
        """``n-m-l`` of the network this job trains."""
        return f"{self.shape[1]}-{self.hidden}-{self.shape[2]}"

    @property
    def expected_workers(self) -> int | None:
        """Workers the job starts (None for an existing scheduler)."""
        if "local" in self.workers:
            return len(self.workers["local"]["speeds"])
        if "slurm" in self.workers:
            return sum(g.jobs * g.processes for g in self.workers["slurm"]["groups"])
        return None


def _bad(key: str, got: Any, valid: str, fix: str) -> JobError:
    return JobError(f"job file: {key}={got!r} is invalid; {valid}. {fix}")


def _unknown(keys: Any, valid: tuple[str, ...], where: str) -> None:
    for k in keys:
        if k not in valid:
            close = difflib.get_close_matches(str(k), valid, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise JobError(
                f"job file: unknown key {k!r} in {where}; valid keys: {', '.join(valid)}.{hint}"
            )


def _int(raw: dict, key: str, lo: int, default: Any = None, where: str = "") -> Any:
    v = raw.get(key, default)
    if v is None and default is None and key not in raw:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise _bad(
            where + key,
            v,
            f"expected a whole number >= {lo}",
            f"Write e.g. {key}: {max(lo, 1) * 10 if lo else 0}.",
        )
    return v


def _number(raw: dict, key: str, *, positive: bool, example: str = "0.01") -> float | None:
    v = raw.get(key)
    if v is None:
        return None
    ok = (
        isinstance(v, (int, float))
        and not isinstance(v, bool)
        and math.isfinite(v)
        and (v > 0 if positive else v >= 0)
    )
    if not ok:
        raise _bad(
            key,
            v,
            f"expected a finite number {'> 0' if positive else '>= 0'}",
            f"Write e.g. {key}: {example}.",
        )
    return float(v)


def _training_iterations(training: dict[str, Any], shape: tuple[int, int, int], raw: dict) -> int:
    """Check the training keys (as fit() will) and return the number of iterations they make."""
    from .recipe import RecipeError, recipe

    if "iterations" in raw and "epochs" in training:
        raise JobError(
            f"job file: both iterations={raw['iterations']!r} and epochs={training['epochs']!r}; "
            f"give one of them"
        )
    val = training.get("validation")
    if val is not None and not (isinstance(val, float) and 0 < val < 1):
        raise _bad(
            "validation",
            val,
            "expected a fraction of the samples to hold out, in (0, 1)",
            "Write e.g. validation: 0.1.",
        )
    s = shape[0] - (int(round(val * shape[0])) if val else 0)
    try:
        rec = recipe(
            s,
            iterations=raw.get("iterations") if "epochs" not in training else None,
            learning_rate=1.0,
            **{k: v for k, v in training.items() if k not in ("validation", "optimizer")},
            optimizer_spec=training.get("optimizer"),
            validation=val is not None,
        )
    except (RecipeError, ValueError) as e:
        key = next((k for k, kw in TRAINING_KEYS.items() if f"{kw}=" in str(e)), None)
        raise JobError(f"job file: {key + ': ' if key else ''}{e}") from None
    return rec.iterations


def load_job(path: str | os.PathLike, *, overwrite: bool = False) -> Job:
    """Read and check a job file; nothing is started.

    ``overwrite`` (``--overwrite``) has the effect of ``overwrite: true`` in
    the file. The output and checkpoint paths are checked by
    :func:`check_paths` (which also needs to know whether the run resumes).

    Raises
    ------
    JobError
        Missing or unreadable file, bad YAML, unknown keys, invalid values,
        a data file that is missing or lacks ``x``/``d``, worker groups that
        are invalid.
    """
    import yaml

    from .data import DataError, data_shape

    path = os.fspath(path)
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        raise JobError(
            f"job file {path!r} does not exist; give the path of a YAML job file (see dask-rpm train --help)"
        ) from None
    except OSError as e:
        raise JobError(f"cannot read job file {path!r}: {e.strerror}") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise JobError(
            f"job file {path!r} is not valid YAML{where}: {getattr(e, 'problem', e)}"
        ) from None
    if not isinstance(raw, dict):
        raise JobError(
            f"job file {path!r} must hold a mapping of keys such as 'data:', 'hidden:', 'output:'; got {type(raw).__name__}"
        )
    _unknown(raw, _KEYS, "the job")
    base = os.path.dirname(os.path.abspath(path))

    def rel(p: Any, key: str) -> str:
        if not isinstance(p, str) or not p.strip():
            raise _bad(key, p, "expected a file path", f"Write e.g. {key}: result.nc.")
        return os.path.normpath(os.path.join(base, os.path.expanduser(p)))

    for key in ("data", "hidden", "output"):
        if key not in raw:
            raise JobError(
                f"job file {path!r} has no {key!r}; add e.g. "
                + {
                    "data": "data: digits.nc (netCDF with x(sample, input) and d(sample, output))",
                    "hidden": "hidden: 32 (hidden units)",
                    "output": "output: result.nc (where weights, history and plans go)",
                }[key]
            )
    data = rel(raw["data"], "data")
    try:
        shape = data_shape(data)
    except DataError as e:
        raise JobError(f"job file: data: {e}") from None
    except (OSError, ValueError) as e:
        raise JobError(
            f"job file: data={raw['data']!r} cannot be read as netCDF ({e}); give a netCDF file with x(sample, input) and d(sample, output)"
        ) from None
    hidden = _int(raw, "hidden", 1)
    iterations = _int(raw, "iterations", 1, default=None)
    target = _number(raw, "target-error", positive=False)
    training = {kw: raw[key] for key, kw in TRAINING_KEYS.items() if key in raw}
    if training:
        n_iterations = _training_iterations(training, shape, raw)
        if "epochs" in training:
            iterations = n_iterations
            training.pop("epochs")  # the job runs that many iterations (a resume counts from them)
    if iterations is None:
        if target is None:
            raise JobError(
                "job file: give 'iterations:' (how many BP iterations), 'target-error:' (train until the error is at most this), or both (iterations is then the maximum)"
            )
        raise JobError(
            "job file: 'target-error:' needs 'iterations:' as the maximum number of iterations, so a run that never reaches it ends"
        )
    lr = _number(raw, "learning-rate", positive=True)
    if lr is None:
        raise JobError(
            "job file: no 'learning-rate:'; add e.g. learning-rate: 0.001 (eps in W <- W - eps * sum dW)"
        )
    mapping = raw.get("mapping", "drpm")
    from .planners import describe_names, mapping_names

    if mapping not in mapping_names():
        raise _bad(
            "mapping",
            mapping,
            f"valid: {describe_names(mapping_names())}",
            "drpm re-maps while training; srpm plans once.",
        )
    seed = _int(raw, "seed", 0, default=0)
    dtype = raw.get("dtype", "float64")
    if dtype not in ("float64", "float32"):
        raise _bad("dtype", dtype, "valid: float64, float32", "float64 is exact to serial BP.")
    output = rel(raw["output"], "output")
    if os.path.abspath(output) == os.path.abspath(data):
        raise _bad(
            "output", raw["output"], "it is the data file", "Write the result to a new file."
        )
    model = raw.get("model")
    if model is None or model is True:
        model = os.path.splitext(output)[0] + ".model.nc"
    elif model is False:
        model = None
    else:
        model = rel(model, "model")
        if os.path.abspath(model) in (os.path.abspath(output), os.path.abspath(data)):
            raise _bad(
                "model",
                raw["model"],
                "it is the output or the data file",
                "Give the model its own file.",
            )
    over = raw.get("overwrite", False)
    if not isinstance(over, bool):
        raise _bad(
            "overwrite",
            over,
            "expected true or false",
            "Write overwrite: true to replace an existing output.",
        )

    ck = raw.get("checkpoint") or {}
    if not isinstance(ck, dict):
        raise _bad(
            "checkpoint",
            ck,
            "expected a mapping with 'every' and optionally 'path'",
            "Write checkpoint: {every: 50}.",
        )
    _unknown(ck, ("every", "path"), "checkpoint")
    every = _int(ck, "every", 0, default=0, where="checkpoint.")
    ck_path = (
        rel(ck["path"], "checkpoint.path")
        if ck.get("path")
        else os.path.splitext(output)[0] + ".checkpoint.nc"
    )

    min_workers = _int(raw, "min-workers", 1, default=1)
    loss = raw.get("on-worker-loss", "recover")
    if loss not in ("recover", "raise"):
        raise _bad(
            "on-worker-loss",
            loss,
            "valid: recover, raise",
            "recover goes on without the lost worker.",
        )
    time_limit = _number(raw, "time-limit", positive=True, example="3600 (seconds)")
    config = raw.get("config") or {}
    if not isinstance(config, dict):
        raise _bad(
            "config",
            config,
            "expected a mapping of rpm settings",
            "Write e.g. config: {drpm: {interval: 10}}.",
        )
    if "rpm" in config and len(config) == 1:
        config = config["rpm"]
    _check_config(config)
    workers = _workers(raw.get("workers"))
    job = Job(
        path=os.path.abspath(path),
        text=text,
        data=data,
        hidden=hidden,
        iterations=iterations,
        learning_rate=lr,
        output=output,
        checkpoint_path=ck_path,
        checkpoint_every=every,
        target_error=target,
        mapping=mapping,
        seed=seed,
        dtype=dtype,
        min_workers=min_workers,
        on_worker_loss=loss,
        time_limit=time_limit,
        workers=workers,
        config=config,
        shape=shape,
        overwrite=over or bool(overwrite),
        training=training,
        model=model,
    )
    expected = job.expected_workers
    if expected is not None and min_workers > expected:
        raise _bad(
            "min-workers",
            min_workers,
            f"the job starts only {expected} worker(s)",
            f"Use min-workers: {expected} or start more workers.",
        )
    return job


def _check_config(config: dict[str, Any]) -> None:
    """Every key under ``config:`` must be an ``rpm.*`` setting of rpm.yaml (``_`` and ``-`` alike)."""
    from .config import _DEFAULTS

    def walk(given: dict[str, Any], known: dict[str, Any], where: str) -> None:
        names = {str(k).replace("_", "-"): k for k in known}
        for key, value in given.items():
            norm = str(key).replace("_", "-")
            if norm not in names:
                close = difflib.get_close_matches(norm, list(names), n=1)
                hint = f" Did you mean {close[0]!r}?" if close else ""
                raise JobError(
                    f"job file: unknown setting {where}.{key} under 'config:'; valid keys of {where}: "
                    f"{', '.join(sorted(names))}.{hint} (all settings: docs/configuration.md)"
                )
            default = known[names[norm]]
            if isinstance(default, dict) and default:
                if not isinstance(value, dict):
                    raise _bad(
                        f"config {where}.{key}",
                        value,
                        f"{where}.{key} is a group of settings ({', '.join(sorted(default))})",
                        f"Write e.g. {key}: {{{next(iter(default))}: ...}}.",
                    )
                walk(value, default, f"{where}.{key}")

    walk(config, _DEFAULTS["rpm"], "rpm")


def check_paths(job: Job, *, resume: bool = False) -> None:
    """Refuse, before any work, outputs and checkpoints that would lose a file or cannot be written.

    Raises
    ------
    JobError
        The output exists (without ``overwrite``) or is not a regular file; the
        checkpoint exists and the run does not resume (without ``overwrite``);
        a directory is missing or not writable.
    """
    from ._files import TargetError, check_target

    try:
        check_target(
            job.output, what="job file: output", overwrite=job.overwrite, hint=_OVERWRITE_HINT
        )
        if job.model is not None:
            check_target(
                job.model, what="job file: model", overwrite=job.overwrite, hint=_OVERWRITE_HINT
            )
    except TargetError as e:
        raise JobError(str(e)) from None
    try:
        if resume:  # rewritten in place: it may exist, but its directory must still take new files
            check_target(job.checkpoint_path, what="job file: checkpoint path", overwrite=True)
            return
        check_target(
            job.checkpoint_path,
            what="job file: checkpoint path",
            overwrite=job.overwrite,
            hint="continue that run with --resume, or " + _OVERWRITE_HINT,
        )
    except TargetError as e:
        raise JobError(str(e)) from None


def _workers(spec: Any) -> dict[str, Any]:
    from .slurm import SlurmConfigError, load_groups

    if spec is None:
        raise JobError(
            "job file: no 'workers:'; add one of workers: {local: {speeds: [1.0, 0.5]}} (EMULATED, this machine), "
            "workers: {slurm: {groups: [...]}} or workers: {scheduler: tcp://host:8786}"
        )
    if not isinstance(spec, dict) or len(spec) != 1:
        raise _bad(
            "workers",
            spec,
            "expected exactly one of 'local', 'slurm', 'scheduler'",
            "Keep one of them.",
        )
    _unknown(spec, ("local", "slurm", "scheduler"), "workers")
    kind, value = next(iter(spec.items()))
    if kind == "scheduler":
        if not isinstance(value, str) or "://" not in value and ":" not in value:
            raise _bad(
                "workers.scheduler",
                value,
                "expected a scheduler address",
                "Write e.g. scheduler: tcp://10.0.0.1:8786.",
            )
        return {"scheduler": value}
    if kind == "local":
        if not isinstance(value, dict):
            raise _bad(
                "workers.local",
                value,
                "expected a mapping with 'speeds'",
                "Write local: {speeds: [1.0, 0.5]}.",
            )
        _unknown(value, ("speeds",), "workers.local")
        speeds = value.get("speeds")
        if (
            not isinstance(speeds, list)
            or not speeds
            or any(
                isinstance(v, bool)
                or not isinstance(v, (int, float))
                or not math.isfinite(v)
                or v <= 0
                for v in speeds
            )
        ):
            raise _bad(
                "workers.local.speeds",
                speeds,
                "expected a list of EMULATED relative speeds > 0",
                "Write speeds: [1.0, 0.5, 0.25].",
            )
        return {"local": {"speeds": [float(v) for v in speeds]}}
    if not isinstance(value, dict):
        raise _bad(
            "workers.slurm",
            value,
            "expected a mapping with 'groups' and optionally 'cluster'",
            "See docs/slurm.md.",
        )
    _unknown(value, ("groups", "cluster"), "workers.slurm")
    try:
        groups = load_groups(value.get("groups"))
    except SlurmConfigError as e:
        raise JobError(f"job file: workers.slurm.groups: {e}") from None
    cluster = value.get("cluster") or {}
    if not isinstance(cluster, dict):
        raise _bad(
            "workers.slurm.cluster",
            cluster,
            "expected a mapping of dask-jobqueue options",
            "Write e.g. cluster: {interface: ib0}.",
        )
    cluster = {str(k).replace("-", "_"): v for k, v in cluster.items()}
    return {"slurm": {"groups": groups, "cluster": cluster}}


# --------------------------------------------------------------------------
# Checkpoints and output
# --------------------------------------------------------------------------


def write_checkpoint(job: Job, state: dict[str, Any]) -> str:
    """Write ``state`` (iteration, W, V, errors, plan) to ``job.checkpoint_path`` atomically."""
    import xarray as xr

    W, V = state["W"], state["V"]
    ds = xr.Dataset(
        {
            "W": (
                ("hidden", "input"),
                W,
                {"description": "input-to-hidden weights after `iteration` updates"},
            ),
            "V": (
                ("output", "hidden"),
                V,
                {"description": "hidden-to-output weights after `iteration` updates"},
            ),
            "error": (
                ("iteration",),
                np.asarray(state["errors"], dtype=float),
                {
                    "description": "0.5 * sum over samples of ||h - d||^2, before each iteration's update"
                },
            ),
            **{
                f"optimizer_{slot}_{name}": (
                    dims,
                    a,
                    {"description": f"optimizer state {slot!r} of {name}"},
                )
                for slot, pair in (state.get("optimizer_state") or {}).items()
                for name, dims, a in zip(
                    ("W", "V"), (("hidden", "input"), ("output", "hidden")), pair
                )
            },
        },
        attrs={
            "title": "dask_rpm training checkpoint",
            "iteration": int(state["iteration"]),
            "fingerprint": job.fingerprint,
            "network": job.network,
            "plan": state["plan"].to_json() if state.get("plan") is not None else "",
            # DRPM's plan, checks and estimator windows: --resume continues at the plan reached
            "drpm": json.dumps(state["drpm"], default=_json_default) if state.get("drpm") else "",
            "job": job.text,
            "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        },
    )
    return _write(ds, job.checkpoint_path)


def read_checkpoint(job: Job) -> dict[str, Any]:
    """The checkpoint of ``job``; raises :class:`JobError` if it is missing or from another job."""
    import xarray as xr

    path = job.checkpoint_path
    if not os.path.exists(path):
        raise JobError(
            f"--resume: no checkpoint at {path!r}; run without --resume to start from scratch "
            f"(or set checkpoint.path to where the checkpoint is)"
        )
    try:
        with xr.open_dataset(path, engine="h5netcdf") as ds:
            ds.load()
        ds["W"], ds["V"], ds["error"], ds.attrs["iteration"]  # noqa: B018 - what a checkpoint must hold
    except (OSError, ValueError, KeyError) as e:
        raise JobError(
            f"--resume: {path!r} is not a dask_rpm checkpoint ({type(e).__name__}: {e}); "
            f"run without --resume to start from scratch"
        ) from None
    network = ds.attrs.get("network") or "-".join(
        str(v) for v in (ds["W"].shape[1], ds["W"].shape[0], ds["V"].shape[0])
    )
    if network != job.network:
        raise JobError(
            f"--resume: checkpoint {path!r} is for a {network} network (inputs-hidden-outputs) but "
            f"this job trains {job.network}; run without --resume, or restore the job file it was "
            f"written with"
        )
    if ds.attrs.get("fingerprint") != job.fingerprint:
        raise JobError(
            f"--resume: checkpoint {path!r} is from a different job (data, hidden, learning-rate, seed "
            f"or dtype differ); run without --resume, or restore the job file it was written with"
        )
    slots = sorted({str(k).split("_")[1] for k in ds.data_vars if str(k).startswith("optimizer_")})
    return {
        "iteration": int(ds.attrs["iteration"]),
        "W": ds["W"].values,
        "V": ds["V"].values,
        "errors": ds["error"].values,
        "plan": ds.attrs.get("plan", ""),
        "drpm": json.loads(ds.attrs["drpm"]) if ds.attrs.get("drpm") else None,
        "optimizer_state": {
            k: [ds[f"optimizer_{k}_W"].values, ds[f"optimizer_{k}_V"].values] for k in slots
        },
    }


def write_output(
    job: Job,
    result: Any,
    *,
    start: int,
    errors_before: np.ndarray,
    summary: dict[str, Any],
    path: str | None = None,
) -> str:
    """Weights, the whole history and every plan of the run in one netCDF file (``path``, default
    ``job.output``), atomically."""

    hist = result.history
    total = start + hist.sizes.get("iteration", 0)
    if start:
        hist = hist.reindex(iteration=np.arange(total))
        hist["error"] = (
            "iteration",
            np.concatenate([errors_before[:start], result.history["error"].values]),
            result.history["error"].attrs,
        )
    if "slurm" in job.workers and "name" in hist.coords:
        from .slurm import group_from_name

        groups = [g.name for g in job.workers["slurm"]["groups"]]
        hist.coords["group"] = (
            "worker",
            np.array([group_from_name(n, groups) or "" for n in hist["name"].values]),
            {"description": "SLURM worker group"},
        )
    for name in list(hist.coords):
        if hist[name].dtype == object:
            hist[name] = hist[name].astype(str)
    ds = hist.copy()
    ds["W"] = (
        ("hidden", "input"),
        result.W,
        {"description": "final input-to-hidden weights (m x n)"},
    )
    ds["V"] = (
        ("output", "hidden"),
        result.V,
        {"description": "final hidden-to-output weights (l x m)"},
    )
    ds["plan_json"] = (
        ("plan",),
        np.array([p.to_json() for p in (result.plans or [result.plan])], dtype=str),
        {
            "description": "every plan used, in order, as JSON (dask_rpm.Plan.from_dict(json.loads(...)))"
        },
    )
    ds.attrs.update(
        title="dask_rpm training result",
        status="complete",
        iterations=int(total),
        final_error=float(ds["error"].values[-1]) if total else float("nan"),
        stopped=result.stopped or "",
        remaps=json.dumps(result.remaps, default=_json_default),
        summary=json.dumps(summary, default=_json_default),
        job=job.text,
        resumed_from_iteration=int(start),
        emulation=result.emulation or "",
        written=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )
    for k, v in list(ds.attrs.items()):
        if v is None:
            ds.attrs[k] = ""
    return _write(ds, path or job.output)


def _write(ds: Any, path: str) -> str:
    import warnings

    from ._files import atomic_write

    with (
        warnings.catch_warnings()
    ):  # h5netcdf's note on string attributes/variables; readers here use h5netcdf
        warnings.filterwarnings("ignore", message=".*invalid netcdf features.*")
        # no makedirs: a directory that went away is a failure the caller reports, not one to paper over
        return atomic_write(
            path, lambda tmp: ds.to_netcdf(tmp, engine="h5netcdf", invalid_netcdf=True)
        )


def _rescue_paths(job: Job) -> Iterator[str]:
    """Where a finished result goes when the output cannot be written: next to the checkpoint, then
    the working directory, then the temporary directory (never over an existing file)."""
    import tempfile

    name = os.path.basename(job.output)
    stem, ext = os.path.splitext(name)
    for directory in (os.path.dirname(job.checkpoint_path), os.getcwd(), tempfile.gettempdir()):
        for candidate in (name, f"{stem}.rescued-{os.getpid()}{ext or '.nc'}"):
            path = os.path.join(directory, candidate)
            if os.path.abspath(path) != os.path.abspath(job.output) and not os.path.lexists(path):
                yield path
                break


def _flatten(d: dict[str, Any], prefix: str) -> Iterator[tuple[str, Any]]:
    for k, v in d.items():
        if isinstance(v, dict) and v:
            yield from _flatten(v, f"{prefix}.{k}")
        else:
            yield f"{prefix}.{k}", v


def _json_default(o: Any) -> Any:
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    return str(o)


# --------------------------------------------------------------------------
# Running
# --------------------------------------------------------------------------


@contextlib.contextmanager
def _client_for(job: Job, out: TextIO) -> Iterator[Any]:
    from distributed import Client

    kind = next(iter(job.workers))
    if kind == "scheduler":
        import dask.config

        address = job.workers["scheduler"]
        timeout = dask.config.get("distributed.comm.timeouts.connect")
        try:
            client = Client(address, timeout=timeout)
        except (OSError, TimeoutError, ValueError) as e:
            raise JobError(
                f"job file: workers.scheduler={address!r}: cannot connect within {timeout} "
                f"({type(e).__name__}: {' '.join(str(e).split())[:200]}); check that the scheduler runs and the "
                f"address (e.g. tcp://host:8786), or use workers: {{local: ...}} / {{slurm: ...}}"
            ) from None
        with client:
            print(f"workers: existing cluster at {job.workers['scheduler']}", file=out, flush=True)
            yield client
        return
    if kind == "local":
        from .emulation import local_cluster

        with (
            local_cluster(job.workers["local"]["speeds"], dashboard_address=":0") as cluster,
            Client(cluster) as client,
        ):
            print(f"workers: {cluster.emulation_label}", file=out, flush=True)
            yield client
        return
    from .slurm import HeterogeneousSLURMCluster

    spec = job.workers["slurm"]
    with HeterogeneousSLURMCluster(spec["groups"], **spec["cluster"]) as cluster:
        jobs = ", ".join(
            f"{g.name}: {g.jobs} job(s) x {g.processes} worker(s)" for g in spec["groups"]
        )
        print(
            f"workers: SLURM groups {jobs}; scheduler {cluster.scheduler_address}",
            file=out,
            flush=True,
        )
        with Client(cluster) as client:
            yield client


@contextlib.contextmanager
def _stop_signals(flag: threading.Event) -> Iterator[None]:
    """SIGTERM (SLURM's walltime warning, scancel) and SIGUSR1 set ``flag`` instead of killing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {}

    def handler(signum: int, frame: Any) -> None:
        flag.set()
        flag.signal = signal.Signals(signum).name  # type: ignore[attr-defined]

    for sig in (signal.SIGTERM, signal.SIGUSR1):
        old[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)


def run_job(
    path: str | os.PathLike,
    *,
    resume: bool = False,
    overwrite: bool = False,
    out: TextIO | None = None,
    client: Any = None,
    stop: threading.Event | None = None,
) -> dict[str, Any]:
    """Run the job in ``path``; returns a summary dict (also written into the output).

    Parameters
    ----------
    path
        The job file.
    resume
        Continue from the job's checkpoint.
    overwrite
        Replace an existing output (as ``overwrite: true`` in the file).
    out
        Where progress lines go (default stdout): one plain line per block.
    client
        Use this client instead of the job's ``workers`` (tests, notebooks).
    stop
        An event that, once set, stops training after the current block
        (checkpoint, no output) - what SIGTERM does from the command line.

    The summary's ``output`` is where the result was written: ``job.output``,
    or (``rescued: True``) the place next to the checkpoint it was saved to
    when the output could not be written at the end.

    Raises
    ------
    JobError
        Invalid job file, an output or checkpoint that exists or cannot be
        written, ``--resume`` without a matching checkpoint, an unreachable
        scheduler; all before any training.
    dask_rpm.data.DataError
        A worker found a NaN or infinite value in its samples of the data file
        (before the first iteration).
    dask_rpm.TrainingError
        Training failed (nothing is written to the output path).
    """
    import dask.config

    from .engine import fit

    out = out or sys.stdout
    job = load_job(path, overwrite=overwrite)
    check_paths(job, resume=resume)
    start, errors_before, ck = 0, np.zeros(0), None
    if resume:
        ck = read_checkpoint(job)
        start, errors_before = ck["iteration"], ck["errors"]
        if start >= job.iterations:
            raise JobError(
                f"--resume: the checkpoint is at iteration {start}, already at iterations={job.iterations}; raise iterations to train on"
            )
        print(
            f"resuming from checkpoint {job.checkpoint_path} at iteration {start}",
            file=out,
            flush=True,
        )
        if ck.get("drpm") and job.mapping == "drpm":
            print(
                f"DRPM continues on the checkpoint's plan ({len(ck['drpm'].get('checks', []))} check(s), "
                f"estimator windows kept)",
                file=out,
                flush=True,
            )
    stop = stop or threading.Event()
    t0 = time.monotonic()

    def should_stop() -> bool:
        if job.time_limit is not None and time.monotonic() - t0 > job.time_limit:
            stop.signal = f"time-limit {job.time_limit:g} s"  # type: ignore[attr-defined]
            return True
        return stop.is_set()

    def progress(info: dict[str, Any]) -> None:
        for rec in info["remaps"]:
            if rec.get("lost"):
                what = f"worker(s) {', '.join(rec['lost'])} lost; rows from the {rec['recovered_from']}"
                if rec.get("replayed"):
                    what += f", {rec['replayed']} iteration(s) recomputed"
            elif rec.get("joined"):
                what = f"worker(s) {', '.join(rec['joined'])} joined"
            else:
                what = rec.get("reason", "")
            print(
                f"remap at iteration {rec['iteration']}: {rec['kind']} ({what}), {rec['bytes']} weight "
                f"bytes, {rec.get('sample_bytes', 0)} sample bytes re-read, {rec['seconds']:.3f} s",
                file=out,
                flush=True,
            )
        spi = info["seconds_per_iteration"]
        print(
            f"iteration {info['iteration']}/{job.iterations}: error {info['error']:.6g}, "
            f"{spi * 1e3:.1f} ms/iteration, {len(info['workers'])} worker(s)",
            file=out,
            flush=True,
        )

    def on_checkpoint(state: dict[str, Any]) -> None:
        state = dict(state, errors=np.concatenate([errors_before[:start], state["errors"][start:]]))
        write_checkpoint(job, state)
        print(
            f"checkpoint at iteration {state['iteration']} -> {job.checkpoint_path}",
            file=out,
            flush=True,
        )

    every = job.checkpoint_every
    settings = dict(
        _flatten(job.config, "rpm")
    )  # dotted keys: set() would replace the whole rpm tree
    with dask.config.set(settings), _stop_signals(stop), contextlib.ExitStack() as stack:
        if client is None:
            client = stack.enter_context(_client_for(job, out))
        print(
            f"training {job.shape[1]}-{job.hidden}-{job.shape[2]} on {job.shape[0]} samples from {job.data}: "
            f"iterations {start}..{job.iterations}, mapping {job.mapping}, min-workers {job.min_workers}",
            file=out,
            flush=True,
        )
        t_train = time.monotonic()
        result = fit(
            job.data,
            hidden=job.hidden,
            iterations=job.iterations,
            learning_rate=job.learning_rate,
            mapping=job.mapping,
            seed=job.seed,
            dtype=job.dtype,
            resume=ck,
            client=client,
            **job.training,
            progress="none",
            on_worker_loss=job.on_worker_loss,
            min_workers=job.min_workers,
            target_error=job.target_error,
            checkpoint_every=every,
            on_checkpoint=on_checkpoint if every else None,
            should_stop=should_stop,
            callback=progress,
        )
        wall = time.monotonic() - t_train
    done = start + result.history.sizes.get("iteration", 0)
    summary = {
        "iterations": done,
        "final_error": result.error,
        "target_error": job.target_error,
        "stopped": result.stopped,
        "wall_seconds": wall,
        "seconds_per_iteration": result.seconds_per_iteration,
        "workers": len(result.plan.planned_workers),
        "remaps": len(result.remaps),
        "worker_losses": sum(1 for r in result.remaps if r.get("lost")),
        "output": job.output,
        "emulation": result.emulation,
    }
    if result.stopped and result.stopped.startswith("stop requested"):
        why = getattr(stop, "signal", "stop requested")
        write_checkpoint(
            job,
            {
                "iteration": done,
                "W": result.W,
                "V": result.V,
                "plan": result.plan,
                "optimizer_state": result.optimizer_state,
                "drpm": result.drpm_state,
                "errors": np.concatenate([errors_before[:start], result.history["error"].values]),
            },
        )
        print(
            f"stopped at iteration {done} ({why}); checkpoint written to {job.checkpoint_path}; "
            f"continue with: dask-rpm train --config {path} --resume",
            file=out,
            flush=True,
        )
        summary["checkpoint"] = job.checkpoint_path
        return summary
    if result.stopped and "diverged" in result.stopped:
        print(result.stopped, file=out, flush=True)
    written = _save_result(
        job, result, start=start, errors_before=errors_before, summary=summary, out=out
    )
    if job.model is not None:
        written += ", model " + _save_model(job, result, start=start, written=written, out=out)
    print(
        f"done: {done} iterations, error {result.error:.6g}"
        + (f" (target {job.target_error:g})" if job.target_error is not None else "")
        + f", {wall:.1f} s; wrote {written}",
        file=out,
        flush=True,
    )
    if every and os.path.exists(job.checkpoint_path):
        os.unlink(job.checkpoint_path)  # the result file holds everything the checkpoint did
    return summary


def _save_model(job: Job, result: Any, *, start: int, written: str, out: TextIO) -> str:
    """Write the trained model (:class:`dask_rpm.MLPModel`) to ``job.model``, atomically; when that fails,
    next to the result file that was written (as the result itself is rescued)."""
    from ._files import TargetError
    from .engine import TrainingError
    from .model import MLPModel

    assert job.model is not None
    model = MLPModel.from_result(result, meta={"job": job.text, "resumed_from_iteration": start})
    try:
        return model.save(job.model)
    except (OSError, TargetError) as e:
        first = f"{type(e).__name__}: {e}"
    rescue = os.path.splitext(written)[0] + ".model.nc"
    try:
        saved = model.save(rescue)
    except (OSError, TargetError) as e:
        raise TrainingError(
            f"could not write the model to {job.model!r} ({first}) nor to {rescue!r} ({e}); the "
            f"weights are in the result file {written!r}"
        ) from None
    msg = f"could not write the model {job.model!r} ({first}); it is saved to {saved!r} instead"
    print(msg, file=out, flush=True)
    if out is not sys.stderr:
        print(f"dask-rpm train: {msg}", file=sys.stderr, flush=True)
    return saved


def _save_result(
    job: Job,
    result: Any,
    *,
    start: int,
    errors_before: np.ndarray,
    summary: dict[str, Any],
    out: TextIO,
) -> str:
    """Write the output; when that fails, save the result next to the checkpoint (or further) and say where."""
    from ._files import TargetError
    from .engine import TrainingError

    try:
        return write_output(job, result, start=start, errors_before=errors_before, summary=summary)
    except (OSError, TargetError) as e:
        first = f"{type(e).__name__}: {e}"
    tried = [job.output]
    for path in _rescue_paths(job):
        summary.update(output=path, rescued=True, output_requested=job.output)
        try:
            written = write_output(
                job, result, start=start, errors_before=errors_before, summary=summary, path=path
            )
        except (OSError, TargetError):
            tried.append(path)
            continue
        msg = (
            f"could not write the output {job.output!r} ({first}); the finished run is saved to "
            f"{written!r} instead - move it where you want it"
        )
        print(msg, file=out, flush=True)
        if out is not sys.stderr:
            print(f"dask-rpm train: {msg}", file=sys.stderr, flush=True)
        return written
    raise TrainingError(
        f"could not write the result to {job.output!r} ({first}) nor to {', '.join(tried[1:])}; "
        f"free space or fix permissions there"
    )
