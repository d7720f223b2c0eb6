"""What a job writes: checkpoints, the result file and the model, each atomically.

The result is written only when training ends; if the output cannot be
written then, it is saved next to the checkpoint (or further, see
:func:`rescue_paths`) and the job says where.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from typing import Any, TextIO

import numpy as np
import xarray as xr

from .._files import TargetError, atomic_write, atomic_write_text, json_default
from ..engine import FitResult, TrainingError, store
from ..model.cnn import CNNModel
from ..model.cnn import dimension_names as conv_dimension_names
from ..model.files import dimension_names
from ..model.mlp import MLPModel, ModelError
from ..nn.cnn import ConvLayers
from ..nn.layers import layers_of_params
from ..slurm import group_from_name
from .spec import Job, JobError

__all__ = [
    "write_checkpoint",
    "read_checkpoint",
    "mark_store",
    "clear_store",
    "STORE_JOB",
    "write_output",
    "save_result",
    "save_model",
    "rescue_paths",
    "json_default",
    "weight_variables",
]


def _write(ds: xr.Dataset, path: str) -> str:
    """``ds`` to netCDF at ``path``, atomically (a temporary file renamed over it)."""
    with warnings.catch_warnings():
        # h5netcdf's note on string attributes/variables; readers here use h5netcdf
        warnings.filterwarnings("ignore", message=".*invalid netcdf features.*")
        # no makedirs: a directory that went away is a failure the caller reports, not one to paper over
        return atomic_write(
            path, lambda tmp: ds.to_netcdf(tmp, engine="h5netcdf", invalid_netcdf=True)
        )


def _parameters(state: Any) -> list[np.ndarray]:
    """The parameters ``W_1 .. W_L, V`` of a checkpoint state or a result (its ``params``)."""
    params = state["params"] if isinstance(state, dict) else state.params
    return [np.asarray(p) for p in params]


def weight_variables(
    params: list[np.ndarray], what: str, prefix: str = "", conv: ConvLayers | None = None
) -> dict[str, Any]:
    """One variable per parameter, named and dimensioned as in a model file (``W``, ``V`` for one
    hidden layer; ``W1 .. WL``, ``V`` deeper: :func:`~dask_rpm.model.files.dimension_names`);
    a CNN's (``conv``, its geometry) as :func:`~dask_rpm.model.cnn.dimension_names` names them."""
    if conv is not None:
        names, dims = list(conv.names), conv_dimension_names(conv)
    else:
        layers = layers_of_params(params)
        names, dims = list(layers.names), list(dimension_names(layers))
    return {
        f"{prefix}{name}": (d, p, {"description": f"{what} of {name}"})
        for name, d, p in zip(names, dims, params)
    }


def _network_attrs(conv: ConvLayers | None) -> dict[str, Any]:
    """A CNN's layers (``network``: JSON, as a job file's ``network:`` writes them) and
    ``image_shape`` (channels, height, width), as a result file's attributes, named as a model
    file names them (nothing for an MLP)."""
    if conv is None:
        return {}
    return {
        "network": json.dumps(conv.spec()),
        "image_shape": np.asarray(conv.image, dtype=np.int64),
    }


def _optimizer_variables(state: dict[str, Any], conv: ConvLayers | None = None) -> dict[str, Any]:
    """``optimizer_<slot>_<parameter>`` variables of a checkpoint."""
    out: dict[str, Any] = {}
    for slot, arrays in (state.get("optimizer_state") or {}).items():
        out.update(
            weight_variables(list(arrays), f"optimizer state {slot!r}", f"optimizer_{slot}_", conv)
        )
    return out


#: The job's record in a checkpoint store (what ``--resume`` must match), next to the manifest.
STORE_JOB = "job.json"


def mark_store(job: Job) -> None:
    """Write the job's record into its checkpoint store (created): ``--resume`` checks it."""
    os.makedirs(job.checkpoint_path, exist_ok=True)
    record = {"fingerprint": job.fingerprint, "network": job.network, "job": job.text}
    atomic_write_text(os.path.join(job.checkpoint_path, STORE_JOB), json.dumps(record))


def clear_store(job: Job, keep_record: bool = False) -> None:
    """Remove the checkpoint store's files (row files, manifest, the job's record), and the directory
    if nothing else is in it."""
    path = job.checkpoint_path
    if not os.path.isdir(path):
        return
    store.remove_stale(path, [])
    for name in (store.MANIFEST, *(() if keep_record else (STORE_JOB,))):
        if os.path.exists(os.path.join(path, name)):
            os.unlink(os.path.join(path, name))
    if not keep_record and not os.listdir(path):
        os.rmdir(path)


def _store_checkpoint(job: Job, state: dict[str, Any]) -> str:
    """A checkpoint of weights the driver holds (a job stopped early), into the job's store."""
    mark_store(job)
    store.write_whole(
        job.checkpoint_path,
        int(state["iteration"]),
        [np.asarray(p) for p in state["params"]],
        state.get("optimizer_state"),
        extra={
            "errors": np.asarray(state["errors"], dtype=float),
            "plan": state["plan"].to_dict() if state.get("plan") is not None else None,
            "drpm": state.get("drpm"),
        },
        plan=state.get("plan"),  # one file per row range of the plan: a resume reads only its rows
    )
    return job.checkpoint_path


def _read_store(job: Job) -> dict[str, Any]:
    """The job's checkpoint store, after checking it is this job's."""
    path = job.checkpoint_path
    if not os.path.isdir(path):
        old_file = path + ".nc"  # where the default checkpoint was before it became a store
        raise JobError(
            f"--resume: no checkpoint at {path!r}; run without --resume to start from scratch "
            f"(or set checkpoint.path to where the checkpoint is"
            + (f", e.g. checkpoint.path: {old_file}" if os.path.isfile(old_file) else "")
            + ")"
        )
    record_path = os.path.join(path, STORE_JOB)
    try:
        with open(record_path, encoding="utf-8") as f:
            record = json.load(f)
    except (OSError, ValueError) as e:
        raise JobError(
            f"--resume: no checkpoint of this job in {path!r} ({STORE_JOB} cannot be read: "
            f"{getattr(e, 'strerror', None) or e}); run without --resume to start from scratch "
            f"(or set checkpoint.path to where the checkpoint is)"
        ) from None
    if record.get("network") != job.network:
        raise JobError(
            f"--resume: checkpoint store {path!r} is for a {record.get('network')} network "
            f"(inputs-hidden-outputs) but this job trains {job.network}; run without --resume, or "
            f"restore the job file it was written with"
        )
    if record.get("fingerprint") != job.fingerprint:
        raise JobError(
            f"--resume: checkpoint store {path!r} is from a different job (data, hidden, "
            f"learning-rate, seed or dtype differ); run without --resume, or restore the job file it "
            f"was written with"
        )
    try:  # the manifest only: fit(resume=path) has the workers read the row files, each its own
        return store.describe(path)
    except store.StoreError as e:
        raise JobError(f"--resume: {e}") from None


def write_checkpoint(job: Job, state: dict[str, Any]) -> str:
    """Write ``state`` (iteration, W, V, errors, plan) to ``job.checkpoint_path`` atomically
    (a netCDF file, or into the job's checkpoint store)."""
    if job.checkpoint_store:
        return _store_checkpoint(job, state)
    ds = xr.Dataset(
        {
            **weight_variables(
                _parameters(state), "weights after `iteration` updates", "", job.conv
            ),
            "error": (
                ("iteration",),
                np.asarray(state["errors"], dtype=float),
                {
                    "description": "0.5 * sum over samples of ||h - d||^2, before each iteration's update"
                },
            ),
            **_optimizer_variables(state, job.conv),
        },
        attrs={
            "title": "dask_rpm training checkpoint",
            "iteration": int(state["iteration"]),
            "fingerprint": job.fingerprint,
            "network": job.network,
            "plan": state["plan"].to_json() if state.get("plan") is not None else "",
            # DRPM's plan, checks and estimator windows: --resume continues at the plan reached
            "drpm": json.dumps(state["drpm"], default=json_default) if state.get("drpm") else "",
            "job": job.text,
            "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        },
    )
    return _write(ds, job.checkpoint_path)


def _names(ds: xr.Dataset, conv: ConvLayers | None = None) -> list[str]:
    """The parameter variables of a checkpoint or result file: ``W``, ``V``, or ``W1 .. WL``, ``V``;
    a CNN's (``conv``) ``W1, b1, .., V`` (KeyError naming the first one missing)."""
    if conv is not None:
        names = list(conv.names)
    elif "W" in ds:
        names = ["W", "V"]
    else:
        k = 1
        while f"W{k}" in ds:
            k += 1
        names = [*(f"W{i}" for i in range(1, k)), "V"] if k > 1 else ["W", "V"]
    for name in names:
        if name not in ds:
            raise KeyError(name)
    return names


def _open_checkpoint(path: str) -> xr.Dataset:
    if not os.path.exists(path):
        raise JobError(
            f"--resume: no checkpoint at {path!r}; run without --resume to start from scratch "
            f"(or set checkpoint.path to where the checkpoint is)"
        )
    try:
        with xr.open_dataset(path, engine="h5netcdf") as ds:
            ds.load()
        _names(ds), ds["error"], ds.attrs["iteration"]  # noqa: B018 - what a checkpoint must hold
    except (OSError, ValueError, KeyError) as e:
        raise JobError(
            f"--resume: {path!r} is not a dask_rpm checkpoint ({type(e).__name__}: {e}); "
            f"run without --resume to start from scratch"
        ) from None
    return ds


def read_checkpoint(job: Job) -> dict[str, Any]:
    """The checkpoint of ``job``; raises :class:`JobError` if it is missing or from another job."""
    path = job.checkpoint_path
    if job.checkpoint_store:
        return _read_store(job)
    ds = _open_checkpoint(path)
    try:
        names = _names(ds, job.conv)
    except KeyError as e:
        raise JobError(
            f"--resume: checkpoint {path!r} has no parameter {e}; it is not this job's network: "
            f"run without --resume, or restore the job file it was written with"
        ) from None
    params = [ds[name].values for name in names]
    network = ds.attrs.get("network") or "-".join(map(str, layers_of_params(params).shape))
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
        "params": params,
        "errors": ds["error"].values,
        "plan": ds.attrs.get("plan", ""),
        "drpm": json.loads(ds.attrs["drpm"]) if ds.attrs.get("drpm") else None,
        "optimizer_state": {
            k: [ds[f"optimizer_{k}_{name}"].values for name in names] for k in slots
        },
    }


def _history(job: Job, result: FitResult, start: int, errors_before: np.ndarray) -> xr.Dataset:
    """The run's history, with the errors before a resume and the SLURM group of each worker."""
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
        groups = [g.name for g in job.workers["slurm"]["groups"]]
        hist.coords["group"] = (
            "worker",
            np.array([group_from_name(n, groups) or "" for n in hist["name"].values]),
            {"description": "SLURM worker group"},
        )
    for name in list(hist.coords):
        if hist[name].dtype == object:
            hist[name] = hist[name].astype(str)
    return hist.copy()


def write_output(
    job: Job,
    result: FitResult,
    *,
    start: int,
    errors_before: np.ndarray,
    summary: dict[str, Any],
    path: str | None = None,
) -> str:
    """Weights, the whole history and every plan of the run in one netCDF file (``path``, default
    ``job.output``), atomically."""
    ds = _history(job, result, start, errors_before)
    total = start + result.history.sizes.get("iteration", 0)
    ds.update(weight_variables(_parameters(result), "final weights", "", job.conv))
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
        remaps=json.dumps(result.remaps, default=json_default),
        summary=json.dumps(summary, default=json_default),
        job=job.text,
        resumed_from_iteration=int(start),
        emulation=result.emulation or "",
        written=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **_network_attrs(job.conv),
    )
    for k, v in list(ds.attrs.items()):
        if v is None:
            ds.attrs[k] = ""
    return _write(ds, path or job.output)


def rescue_paths(job: Job) -> Iterator[str]:
    """Where a finished result goes when the output cannot be written: next to the checkpoint, then
    the working directory, then the temporary directory (never over an existing file)."""
    name = os.path.basename(job.output)
    stem, ext = os.path.splitext(name)
    for directory in (os.path.dirname(job.checkpoint_path), os.getcwd(), tempfile.gettempdir()):
        for candidate in (name, f"{stem}.rescued-{os.getpid()}{ext or '.nc'}"):
            path = os.path.join(directory, candidate)
            if os.path.abspath(path) != os.path.abspath(job.output) and not os.path.lexists(path):
                yield path
                break


def _say(msg: str, out: TextIO) -> None:
    """A message on the job's output and, if that is not stderr, on stderr too."""
    print(msg, file=out, flush=True)
    if out is not sys.stderr:
        print(f"dask-rpm train: {msg}", file=sys.stderr, flush=True)


def save_model(job: Job, result: FitResult, *, start: int, written: str, out: TextIO) -> str:
    """Write the trained model (:class:`dask_rpm.MLPModel`, a CNN's :class:`dask_rpm.CNNModel`) to
    ``job.model``, atomically; when that fails, next to the result file that was written (as the
    result itself is rescued)."""
    assert job.model is not None
    kind = CNNModel if job.conv is not None else MLPModel
    model = kind.from_result(result, meta={"job": job.text, "resumed_from_iteration": start})
    try:  # check_paths decided whether the job may replace it
        return model.save(job.model, overwrite=True)
    except (OSError, TargetError, ModelError) as e:  # e.g. its directory went away meanwhile
        first = f"{type(e).__name__}: {e}"
    rescue = os.path.splitext(written)[0] + ".model.nc"
    try:
        saved = model.save(rescue, overwrite=True)
    except (OSError, TargetError, ModelError) as e:
        raise TrainingError(
            f"could not write the model to {job.model!r} ({first}) nor to {rescue!r} ({e}); the "
            f"weights are in the result file {written!r}"
        ) from None
    _say(
        f"could not write the model {job.model!r} ({first}); it is saved to {saved!r} instead", out
    )
    return saved


def save_result(
    job: Job,
    result: FitResult,
    *,
    start: int,
    errors_before: np.ndarray,
    summary: dict[str, Any],
    out: TextIO,
) -> str:
    """Write the output; when that fails, save the result next to the checkpoint (or further) and say where."""
    try:
        return write_output(job, result, start=start, errors_before=errors_before, summary=summary)
    except (OSError, TargetError) as e:
        first = f"{type(e).__name__}: {e}"
    tried = [job.output]
    for path in rescue_paths(job):
        summary.update(output=path, rescued=True, output_requested=job.output)
        try:
            written = write_output(
                job, result, start=start, errors_before=errors_before, summary=summary, path=path
            )
        except (OSError, TargetError):
            tried.append(path)
            continue
        _say(
            f"could not write the output {job.output!r} ({first}); the finished run is saved to "
            f"{written!r} instead - move it where you want it",
            out,
        )
        return written
    raise TrainingError(
        f"could not write the result to {job.output!r} ({first}) nor to {', '.join(tried[1:])}; "
        f"free space or fix permissions there"
    )
