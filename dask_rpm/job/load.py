"""Reading and checking a job file: :func:`load_job` and :func:`check_paths`.

Everything is checked before any worker starts, in the order a reader of
the file would: the file itself, the data (:mod:`dask_rpm.job.data`), how
long to train, the learning settings, where results go, checkpoints, the
run options, ``config:`` and the workers.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
from collections.abc import Callable, Mapping
from typing import Any

import yaml

from .. import config as rpm_config
from .._files import TargetError, check_target, unwritable_reason
from ..engine.options import RunOptions
from ..nn.cnn import NetworkSpecError
from ..nn.cnn_records import conv_layers
from ..nn.options import TrainingOptions
from ..nn.recipe import RecipeError, recipe
from ..planners import describe_names, mapping_names
from .data import data_source, image_file_shape, netcdf_shape, zarr_image_shape, zarr_shape
from .spec import (
    KEYS,
    OVERWRITE_HINT,
    TRAIN_SETTINGS,
    TRAINING_KEYS,
    Job,
    JobError,
    bad,
    number,
    placement,
    unknown,
    whole,
)
from .workers import workers_spec

__all__ = ["load_job", "check_paths", "check_config"]

#: What each required key looks like, for the message when it is missing.
_REQUIRED = {
    "data": "data: digits.nc (netCDF with x(sample, input) and d(sample, output))",
    "hidden": "hidden: 32 (hidden units; a list for several hidden layers: [512, 256]), or "
    "network: [...] (a CNN's layers)",
    "output": "output: result.nc (where weights, history and plans go)",
}


class _JobLoader(yaml.SafeLoader):
    """YAML as a job file's author means it: ``1e-3`` is a number (YAML 1.2; PyYAML's 1.1 rules
    read it as text), and a key given twice is an error, not the last one silently winning."""

    def construct_mapping(self, node: Any, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"{key!r} is given twice (lines {seen[key] + 1} and "
                    f"{key_node.start_mark.line + 1}); keep one",
                    key_node.start_mark,
                )
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


_JobLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"""^[-+]?(?:[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?
        |[0-9][0-9_]*[eE][-+]?[0-9]+
        |\.[0-9_]+(?:[eE][-+]?[0-9]+)?)$""",
        re.X,
    ),
    list("-+0123456789."),
)


def _read(path: str) -> tuple[str, dict[str, Any]]:
    """The job file's text and its YAML mapping."""
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        raise JobError(
            f"job file {path!r} does not exist; give the path of a YAML job file "
            f"(see dask-rpm train --help)"
        ) from None
    except OSError as e:
        raise JobError(f"cannot read job file {path!r}: {e.strerror}") from None
    try:
        raw = yaml.load(text, Loader=_JobLoader)  # noqa: S506 - a SafeLoader (above)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise JobError(
            f"job file {path!r} is not valid YAML{where}: {getattr(e, 'problem', e)}"
        ) from None
    if raw is None:
        raise JobError(
            f"job file {path!r} is empty; it must hold a mapping of keys such as 'data:', "
            f"'hidden:', 'output:' (see dask-rpm train --help)"
        )
    if not isinstance(raw, dict):
        raise JobError(
            f"job file {path!r} must hold a mapping of keys such as 'data:', 'hidden:', "
            f"'output:'; got {type(raw).__name__}"
        )
    unknown(raw, KEYS, "the job")
    for key, example in _REQUIRED.items():
        if key not in raw and not (key == "hidden" and "network" in raw):
            raise JobError(f"job file {path!r} has no {key!r}; add e.g. {example}")
    return text, raw


def _relative_to(path: str) -> Callable[[Any, str], str]:
    """A function making the job file's paths absolute (relative to the file's directory)."""
    base = os.path.dirname(os.path.abspath(path))

    def rel(p: Any, key: str) -> str:
        if not isinstance(p, str) or not p.strip():
            raise bad(key, p, "expected a file path", f"Write e.g. {key}: result.nc.")
        return os.path.normpath(os.path.join(base, os.path.expanduser(p)))

    return rel


#: Keys that describe an MLP's layers; a CNN's ``network:`` says them per layer.
_MLP_KEYS = ("hidden", "activation", "bias")


def _network(
    raw: Mapping[str, Any], data: str, data_vars: tuple[str, str] | None = None
) -> tuple[tuple[int, int, int], Any, list[Any] | None]:
    """``(shape of the data, a CNN's ConvLayers or None, its layer records or None)``: a job
    with ``network:`` trains a CNN on the images of its data file or zarr store (its variables
    ``data_vars``), one with ``hidden:`` an MLP."""
    if "network" not in raw:
        return netcdf_shape(raw, data), None, None
    given = [k for k in _MLP_KEYS if k in raw]
    if given:
        both = ", ".join(f"{k}={raw[k]!r}" for k in given)
        raise JobError(
            f"job file: network: (a CNN's layers) given with {both}; the layers give a CNN's "
            f"sizes, activations and biases: remove {', '.join(repr(k + ':') for k in given)}, or "
            f"remove network: to train an MLP"
        )
    spec = raw["network"]
    if not isinstance(spec, list) or not spec:
        raise bad(
            "network",
            spec,
            "expected a list of layers",
            "Write e.g. network: [{conv: 6, kernel: 5}, relu, {maxpool: 2}, flatten, "
            "{linear: 10}].",
        )
    if data_vars is None:
        s, image, l = image_file_shape(raw, data)
    else:
        s, image, l = zarr_image_shape(data, data_vars)
    try:
        layers = conv_layers(spec, image, l)
    except NetworkSpecError as e:
        raise JobError(f"job file: network: {e}") from None
    c, h, w = image
    return (s, c * h * w, l), layers, spec


def _training(
    raw: Mapping[str, Any],
    shape: tuple[int, int, int],
    hidden: int | tuple[int, ...] | None,
    settings: Mapping[str, Any],
    network: list[Any] | None = None,
) -> TrainingOptions:
    """The job's training options, checked as ``fit`` will check them; ``iterations`` is always
    set (``epochs`` become the iterations they make: a resume counts from them)."""
    iterations = whole(raw, "iterations", 1)
    target = number(raw, "target-error", positive=False)
    given = {kw: raw[key] for key, kw in TRAINING_KEYS.items() if key in raw}
    if iterations is None and "epochs" not in given:
        if target is None:
            raise JobError(
                "job file: give 'iterations:' (how many BP iterations), 'target-error:' (train "
                "until the error is at most this), or both (iterations is then the maximum)"
            )
        raise JobError(
            "job file: 'target-error:' needs 'iterations:' as the maximum number of iterations, "
            "so a run that never reaches it ends"
        )
    if iterations is not None and "epochs" in given:
        raise JobError(
            f"job file: both iterations={iterations!r} and epochs={given['epochs']!r}; "
            f"give one of them"
        )
    val = given.get("validation")
    if val is not None and not (isinstance(val, float) and 0 < val < 1):
        raise bad(
            "validation",
            val,
            "expected a fraction of the samples to hold out, in (0, 1)",
            "Write e.g. validation: 0.1.",
        )
    options = TrainingOptions.of(
        hidden=hidden,
        network=network,
        iterations=iterations,
        learning_rate=_learning_rate(raw),
        target_error=target,
        **settings,
        **given,
    )
    s = shape[0] - (int(round(val * shape[0])) if val else 0)
    try:
        rec = recipe(s, options, validation=val is not None)
    except (RecipeError, ValueError) as e:
        key = next((k for k, kw in TRAINING_KEYS.items() if f"{kw}=" in str(e)), None)
        raise JobError(f"job file: {key + ': ' if key else ''}{e}") from None
    return dataclasses.replace(options, iterations=rec.iterations, epochs=None)


def _learning_rate(raw: Mapping[str, Any]) -> float:
    lr = number(raw, "learning-rate", positive=True)
    if lr is None:
        raise JobError(
            "job file: no 'learning-rate:'; add e.g. learning-rate: 0.001 "
            "(eps in W <- W - eps * sum dW)"
        )
    return lr


def _outputs(
    raw: Mapping[str, Any], rel: Callable[[Any, str], str], data: str
) -> tuple[str, str | None, bool]:
    """``(output, model or None, overwrite)``."""
    output = rel(raw["output"], "output")
    if os.path.abspath(output) == os.path.abspath(data):
        raise bad("output", raw["output"], "it is the data file", "Write the result to a new file.")
    model = raw.get("model")
    if model is None or model is True:
        model = os.path.splitext(output)[0] + ".model.nc"
    elif model is False:
        model = None
    else:
        model = rel(model, "model")
        if os.path.abspath(model) in (os.path.abspath(output), os.path.abspath(data)):
            raise bad(
                "model",
                raw["model"],
                "it is the output or the data file",
                "Give the model its own file.",
            )
    over = raw.get("overwrite", False)
    if not isinstance(over, bool):
        raise bad(
            "overwrite",
            over,
            "expected true or false",
            "Write overwrite: true to replace an existing output.",
        )
    return output, model, over


def _checkpoint(
    raw: Mapping[str, Any], rel: Callable[[Any, str], str], output: str
) -> tuple[int, str]:
    """``(every, path)`` of the checkpoints.

    Default: the store ``<output stem>.checkpoint`` the workers write their own rows into (the
    driver never gathers the weights); a ``checkpoint.path`` ending in ``.nc`` is one netCDF
    file the driver writes.
    """
    ck = raw.get("checkpoint") or {}
    if not isinstance(ck, dict):
        raise bad(
            "checkpoint",
            ck,
            "expected a mapping with 'every' and optionally 'path'",
            "Write checkpoint: {every: 50}.",
        )
    unknown(ck, ("every", "path"), "checkpoint")
    every = whole(ck, "every", 0, default=0, where="checkpoint.")
    if ck.get("path"):
        return every, rel(ck["path"], "checkpoint.path")
    path = os.path.splitext(output)[0] + ".checkpoint"
    # an output named like the default store (``x.checkpoint``) must not become its own checkpoint
    return every, path if path != output else output + ".checkpoint"


def _config_section(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The ``config:`` section (``rpm.*`` settings, with or without the ``rpm:`` level)."""
    config = raw.get("config") or {}
    if not isinstance(config, dict):
        raise bad(
            "config",
            config,
            "expected a mapping of rpm settings",
            "Write e.g. config: {drpm: {interval: 10}}.",
        )
    if "rpm" in config and len(config) == 1:
        config = config["rpm"]
    check_config(config)
    return config


def check_config(config: dict[str, Any]) -> None:
    """Every key under ``config:`` must be an ``rpm.*`` setting of rpm.yaml (``_`` and ``-`` alike)."""

    def walk(given: dict[str, Any], known: dict[str, Any], where: str) -> None:
        names = {str(k).replace("_", "-"): k for k in known}
        for key, value in given.items():
            norm = str(key).replace("_", "-")
            if norm not in names:
                close = difflib.get_close_matches(norm, list(names), n=1)
                hint = f" Did you mean {close[0]!r}?" if close else ""
                raise JobError(
                    f"job file: unknown setting {where}.{key} under 'config:'; valid keys of "
                    f"{where}: {', '.join(sorted(names))}.{hint} (all settings: "
                    f"docs/configuration.md)"
                )
            default = known[names[norm]]
            if isinstance(default, dict) and default:
                if not isinstance(value, dict):
                    raise bad(
                        f"config {where}.{key}",
                        value,
                        f"{where}.{key} is a group of settings ({', '.join(sorted(default))})",
                        f"Write e.g. {key}: {{{next(iter(default))}: ...}}.",
                    )
                walk(value, default, f"{where}.{key}")

    walk(config, rpm_config.DEFAULTS["rpm"], "rpm")


def _check_mapping(key: str, value: Any) -> None:
    if value not in mapping_names():
        raise bad(
            key,
            value,
            f"valid: {describe_names(mapping_names())}",
            "drpm re-maps while training; srpm plans once.",
        )


def _check_dtype(key: str, value: Any) -> None:
    if value not in ("float64", "float32"):
        raise bad(key, value, "valid: float64, float32", "float64 is exact to serial BP.")


def _check_loss(key: str, value: Any) -> None:
    if value not in ("recover", "raise"):
        raise bad(key, value, "valid: recover, raise", "recover goes on without the lost worker.")


def _check_whole(lo: int) -> Callable[[str, Any], None]:
    def check(key: str, value: Any) -> None:
        whole({key: value}, key, lo)

    return check


#: How each of :data:`TRAIN_SETTINGS` is checked: ``check(key, value)`` raises a JobError.
_TRAIN_CHECKS: dict[str, Callable[[str, Any], None]] = {
    "mapping": _check_mapping,
    "seed": _check_whole(0),
    "dtype": _check_dtype,
    "min_workers": _check_whole(1),
    "on_worker_loss": _check_loss,
}


def _train_settings(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The :data:`TRAIN_SETTINGS` the file sets (checked); absent ones are ``None``."""
    out: dict[str, Any] = {}
    for name, key in TRAIN_SETTINGS.items():
        value = raw.get(key)
        if value is not None:
            _TRAIN_CHECKS[name](key, value)
        out[name] = value
    return out


def _check_effective(job: Job) -> None:
    """Check the ``rpm.train.*`` values a job falls back on, and that its workers can suffice."""
    for name, key in TRAIN_SETTINGS.items():
        if getattr(job.run if hasattr(job.run, name) else job.training, name) is None:
            # from the job's config: section or the dask configuration (rpm.yaml, DASK_RPM__...)
            _TRAIN_CHECKS[name](f"rpm.train.{key}", job.effective(name))
    expected = job.expected_workers
    min_workers = job.effective("min_workers")
    if expected is not None and min_workers > expected:
        where = "min-workers" if job.run.min_workers is not None else "rpm.train.min-workers"
        raise bad(
            where,
            min_workers,
            f"the job starts only {expected} worker(s)",
            f"Use {where}: {expected} or start more workers.",
        )


def _hidden(raw: Mapping[str, Any]) -> int | tuple[int, ...]:
    """``hidden:``: a whole number (one hidden layer) or a list of them (one per hidden layer)."""
    v = raw.get("hidden")
    if isinstance(v, list):
        if not v or any(isinstance(u, bool) or not isinstance(u, int) or u < 1 for u in v):
            raise bad(
                "hidden",
                v,
                "expected a whole number >= 1, or a list of them (one per hidden layer)",
                "Write e.g. hidden: [512, 256].",
            )
        return v[0] if len(v) == 1 else tuple(v)
    return int(whole(raw, "hidden", 1))


def load_job(path: str | os.PathLike[str], *, overwrite: bool = False) -> Job:
    """Read and check a job file; nothing is started.

    ``overwrite`` (``--overwrite``) has the effect of ``overwrite: true`` in
    the file. The output and checkpoint paths are checked by
    :func:`check_paths` (which also needs to know whether the run resumes).
    Keys of :data:`~dask_rpm.job.spec.TRAIN_SETTINGS` the file leaves out
    stay ``None`` (``fit`` reads ``rpm.train.*``); the values they fall
    back on are checked here too, with the job's ``config:`` section applied.

    Raises
    ------
    JobError
        Missing or unreadable file, bad YAML, unknown keys, invalid values, a data file that is
        missing or lacks ``x``/``d`` (a CNN's: images ``x(sample, channel, height, width)``), a
        ``network:`` that does not fit its images or is given with ``hidden:``, worker groups
        that are invalid.
    """
    path = os.fspath(path)
    text, raw = _read(path)
    rel = _relative_to(path)
    data, data_vars = data_source(raw, rel)
    if data_vars is not None and "network" not in raw:  # an MLP on a zarr store
        shape, conv, network = zarr_shape(data, data_vars), None, None
    else:
        shape, conv, network = _network(raw, data, data_vars)
    settings = _train_settings(raw)
    run_settings = {k: settings.pop(k) for k in ("mapping", "min_workers", "on_worker_loss")}
    output, model, over = _outputs(raw, rel, data)
    every, ck_path = _checkpoint(raw, rel, output)
    time_limit = number(raw, "time-limit", positive=True, example="3600 (seconds)")
    job = Job(
        path=os.path.abspath(path),
        text=text,
        data=data,
        training=_training(
            raw, shape, None if conv is not None else _hidden(raw), settings, network
        ),
        run=RunOptions(**run_settings, **placement(raw)),
        output=output,
        checkpoint_path=ck_path,
        checkpoint_every=every,
        time_limit=time_limit,
        config=_config_section(raw),
        workers=workers_spec(raw.get("workers")),
        shape=shape,
        overwrite=over or bool(overwrite),
        model=model,
        conv=conv,
        data_vars=data_vars,
    )
    _check_effective(job)
    return job


def check_paths(job: Job, *, resume: bool = False) -> None:
    """Refuse, before any work, outputs and checkpoints that would lose a file or cannot be written.

    Raises
    ------
    JobError
        The output exists (without ``overwrite``) or is not a regular file; the
        checkpoint exists and the run does not resume (without ``overwrite``);
        a directory is missing or not writable.
    """
    try:
        check_target(
            job.output, what="job file: output", overwrite=job.overwrite, hint=OVERWRITE_HINT
        )
        if job.model is not None:
            check_target(
                job.model, what="job file: model", overwrite=job.overwrite, hint=OVERWRITE_HINT
            )
    except TargetError as e:
        raise JobError(str(e)) from None
    if job.checkpoint_store:
        _check_store(job, resume)
        return
    try:
        if resume:  # rewritten in place: it may exist, but its directory must still take new files
            check_target(job.checkpoint_path, what="job file: checkpoint path", overwrite=True)
            return
        check_target(
            job.checkpoint_path,
            what="job file: checkpoint path",
            overwrite=job.overwrite,
            hint="continue that run with --resume, or " + OVERWRITE_HINT,
        )
    except TargetError as e:
        raise JobError(str(e)) from None


def _check_store(job: Job, resume: bool) -> None:
    """A checkpoint store (``checkpoint.path`` without ``.nc``): a directory the workers write into.

    Refused: a path that is a file, a directory that cannot be created or
    written, and (without ``--resume`` or ``overwrite``) a store holding a
    checkpoint, which may be the only copy of a stopped run.
    """
    path = job.checkpoint_path
    what = f"job file: checkpoint path {path!r}"
    if os.path.exists(path) and not os.path.isdir(path):
        raise JobError(
            f"{what} is refused: it is a file, and a checkpoint path without .nc (the default: "
            f"<output stem>.checkpoint) is a directory the workers write into; move the file away, "
            f"or set checkpoint.path to another directory, or to a path ending in .nc for one "
            f"netCDF file the driver writes"
        )
    parent = path if os.path.isdir(path) else os.path.dirname(path)
    while parent and not os.path.exists(parent):  # the directories still to be created
        parent = os.path.dirname(parent)
    held = os.path.exists(os.path.join(path, "manifest.json"))
    if held and not resume and not job.overwrite:
        raise JobError(
            f"{what} already holds a checkpoint and would be overwritten; continue that run with "
            f"--resume, or {OVERWRITE_HINT}"
        )
    parent = parent or "."
    before = os.stat(parent)
    why = unwritable_reason(parent)
    # the probe's file came and went: leave the directory's times as they were (a refused
    # command changes nothing, docs/errors.md)
    os.utime(parent, ns=(before.st_atime_ns, before.st_mtime_ns))
    if why is not None:
        raise JobError(f"{what} cannot be written: {why}; choose a writable place")
