"""The checkpoint store the workers write: one file per row range, made valid by a manifest written last.

A store is a plain directory every worker can reach (on SLURM a shared file
system path, on a local cluster a local directory)::

    <store>/manifest.json                          the valid checkpoint (written last, atomically)
    <store>/it000000040-rows0000000-0000342.npz    plan rows [0, 342) of every parameter and its optimizer state
    <store>/it000000040-rows0000342-0001024.npz    ...

Each row file is written by the one worker :func:`writers` picks for those
rows (every column holds a full copy of the weights, so a row range has one
holder per column; exactly one of them writes it), from its own shard, in a
thread off its event loop, through :func:`dask_rpm._files.atomic_write` (a
temporary file renamed into place). The driver collects only each file's
name, size and SHA-256, then writes ``manifest.json`` (iteration, network
shape, dtype, the row files with their sizes and checksums, the errors so
far, the plan and DRPM's state) by an atomic rename, and only then removes
files no manifest names. A checkpoint interrupted at any point (a writer
killed mid-write, a write that failed, the driver gone before the manifest)
therefore leaves the previous manifest and every file it names in place:
that checkpoint stays the valid one. Reading checks every file's size and
checksum, so a truncated or corrupted row file is reported, never loaded.

Why not zarr: a zarr array written chunk by chunk by several processes is
valid chunk by chunk, not as a whole; making a checkpoint valid at once still
needs a manifest (or a second array and a pointer) written last, and zarr
would be a new dependency of every worker. Row files of ``numpy``'s own
``.npz`` format and one JSON manifest need nothing beyond numpy and are
readable without dask_rpm.

This module only reads and writes files (numpy and the standard library); the
driver's side (who writes which rows, the manifest after every writer
finished) is :mod:`dask_rpm.engine.checkpoint`.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from .._files import atomic_write, atomic_write_text, json_default, unwritable_reason
from ..nn.cnn import is_conv
from ..nn.cnn_records import conv_layers
from ..nn.data import DataError
from ..nn.layers import layers_of, layers_of_params
from ..plan.partition import Plan

__all__ = [
    "FORMAT",
    "MANIFEST",
    "RowFile",
    "StoreError",
    "writers",
    "row_file_name",
    "write_rows",
    "write_manifest",
    "commit",
    "network_entry",
    "geometry",
    "write_whole",
    "read_manifest",
    "StoreRows",
    "manifest_files",
    "rows_to_read",
    "read_rows",
    "load",
    "describe",
    "remove_stale",
    "MARK",
    "write_mark",
    "unseen_marks",
    "unseen_files",
    "file_digest",
    "prepare_directory",
    "open_resume",
]

#: The manifest's ``format`` (a reader refuses other values).
FORMAT = "dask_rpm-checkpoint-store/1"
MANIFEST = "manifest.json"
logger = logging.getLogger("dask_rpm")
_ROW_FILE = re.compile(r"^it(\d{9})-rows(\d{7})-(\d{7})\.npz$")


class StoreError(DataError):
    """A checkpoint store that cannot be read or written; the message names the path and the fix."""


class RowFile(NamedTuple):
    """One row file of a checkpoint: what the worker that wrote it reports, and the manifest lists."""

    name: str  # file name inside the store
    rows: tuple[int, int]  # hidden rows [a, b)
    bytes: int  # its size
    sha256: str  # hex digest of its content


def writers(plan: Plan) -> dict[int, list[tuple[int, int]]]:
    """Which worker writes which hidden rows: each row exactly once, spread over all planned workers.

    The hidden rows are cut at every column's row boundaries; each piece has
    one holder per column. A piece is shared out among its holders, the least
    loaded first, each taking rows up to its fair share ``ceil(m / N)``
    (the rest, if all are full, to the least loaded), so every worker writes
    about ``m / N`` rows - also when every column is a single worker holding
    all rows - and the store is written once, in parallel. Adjacent ranges
    of one worker are merged into one.
    """
    m = plan.shape[1]
    fair = -(-m // max(len(plan.planned_workers), 1))
    cuts = sorted({b for w in plan.planned_workers for b in plan.rectangle(w).hidden})
    load: dict[int, int] = {w: 0 for w in plan.planned_workers}
    out: dict[int, list[tuple[int, int]]] = {}
    for a, b in zip(cuts[:-1], cuts[1:]):
        holders = [
            next(w for w in col if plan.rectangle(w).hidden[0] <= a < plan.rectangle(w).hidden[1])
            for col in plan.columns
        ]
        while a < b:
            w = min(holders, key=lambda h: load[h])  # min keeps the first (lowest column) on ties
            take = b - a if load[w] >= fair else min(b - a, fair - load[w])
            load[w] += take
            ranges = out.setdefault(w, [])
            if ranges and ranges[-1][1] == a:
                ranges[-1] = (ranges[-1][0], a + take)
            else:
                ranges.append((a, a + take))
            a += take
    return out


def row_file_name(iteration: int, a: int, b: int) -> str:
    """The file of rows ``[a, b)`` of the checkpoint at ``iteration``."""
    return f"it{int(iteration):09d}-rows{int(a):07d}-{int(b):07d}.npz"


def write_rows(
    directory: str,
    iteration: int,
    a: int,
    b: int,
    rows: Mapping[str, Any],
    names: Sequence[str],
) -> RowFile:
    """Write plan rows ``[a, b)`` (:func:`~dask_rpm.engine.worker.rows_of`'s dict) atomically;
    returns its record.

    The file is ``numpy``'s ``.npz`` (uncompressed): each parameter under its name in
    ``names`` (:attr:`Layers.names <dask_rpm.nn.layers.Layers.names>`, the paper's names of
    the weight matrices: ``W`` (rows x inputs) and ``V`` (outputs x rows) for one hidden
    layer) and ``state_<slot>_<name>`` for the optimizer's state.
    """
    arrays = dict(zip(names, rows["params"]))
    for slot, parts in (rows.get("state") or {}).items():
        arrays.update({f"state_{slot}_{name}": p for name, p in zip(names, parts)})
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    data = buf.getbuffer()
    name = row_file_name(iteration, a, b)

    def write(tmp: str) -> None:
        with open(tmp, "wb") as f:
            f.write(data)

    atomic_write(os.path.join(directory, name), write)
    return RowFile(name, (int(a), int(b)), len(data), hashlib.sha256(data).hexdigest())


def network_entry(layers: Any) -> dict[str, Any]:
    """What a manifest records of a CNN (``{"network": {"image", "layers"}}``: its layer
    records); nothing for an MLP, whose ``shape`` says it all."""
    if not is_conv(layers):
        return {}
    return {"network": {"image": list(layers.image), "layers": layers.spec()}}


def geometry(shape: Sequence[int], network: Mapping[str, Any] | None = None) -> Any:
    """The network a manifest describes: an MLP's :class:`~dask_rpm.nn.layers.Layers` from its
    ``shape``, or a CNN's :class:`~dask_rpm.nn.cnn.ConvLayers` from its ``network`` entry."""
    if network:
        return conv_layers(network["layers"], network["image"], int(shape[-1]))
    return layers_of(shape)


def write_manifest(
    directory: str,
    *,
    iteration: int,
    shape: Sequence[int],
    dtype: str,
    files: Iterable[RowFile],
    slots: Sequence[str],
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Make the checkpoint whose row files are ``files`` the valid one (an atomic rename); returns it.

    ``files`` must cover the hidden rows ``[0, m)`` exactly once. ``extra``
    holds what else the checkpoint carries (``errors``, ``plan``, ``drpm``):
    JSON values.
    """
    files = sorted(files, key=lambda f: f.rows[0])
    m = geometry(shape, (extra or {}).get("network")).m
    edges = [f.rows for f in files]
    if (
        not edges
        or edges[0][0] != 0
        or edges[-1][1] != m
        or any(p[1] != q[0] for p, q in zip(edges[:-1], edges[1:]))
    ):
        raise StoreError(
            f"internal error: the row files {edges} do not cover the hidden rows [0, {m}) exactly once"
        )
    manifest = {
        "format": FORMAT,
        "iteration": int(iteration),
        "shape": [int(v) for v in shape],
        "dtype": str(dtype),
        "optimizer_slots": list(slots),
        "files": [
            {"name": f.name, "rows": list(f.rows), "bytes": f.bytes, "sha256": f.sha256}
            for f in files
        ],
        "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **dict(extra or {}),
    }
    atomic_write_text(os.path.join(directory, MANIFEST), json.dumps(manifest, default=json_default))
    return manifest


def commit(directory: str, **manifest: Any) -> dict[str, Any]:
    """:func:`write_manifest` (the checkpoint becomes the valid one), then :func:`remove_stale`."""
    written = write_manifest(directory, **manifest)
    remove_stale(directory, [f["name"] for f in written["files"]])
    return written


def write_whole(
    directory: str,
    iteration: int,
    params: Sequence[np.ndarray],
    state: Mapping[str, Sequence[np.ndarray]] | None,
    extra: Mapping[str, Any] | None = None,
    plan: Plan | None = None,
    layers: Any = None,
) -> dict[str, Any]:
    """A checkpoint of weights held in this process, committed; returns the manifest.

    For weights the driver holds anyway (a job stopped early writes its final
    weights): the same format as the workers' checkpoints. The rows are cut
    at the row boundaries of ``plan``'s rectangles (one file if None), so a
    resume on that plan has each worker read only the files of its rows. If
    the store's valid checkpoint is already at ``iteration`` (the workers wrote
    it at that boundary: the same weights), it is kept as it is: rewriting a
    file it names could leave it damaged if interrupted. ``layers`` is the network's geometry
    (default: the MLP ``params`` make; a CNN's must be given).
    """
    try:
        current = read_manifest(directory)
    except StoreError:
        current = None
    if current is not None and int(current["iteration"]) == int(iteration):
        return current
    layers = layers_of_params(params) if layers is None else layers
    extra = {**(extra or {}), **network_entry(layers)}
    m = layers.m
    cuts = sorted(
        {0, m}
        | ({b for w in plan.planned_workers for b in plan.rectangle(w).hidden} if plan else set())
    )
    files = []
    for a, b in zip(cuts[:-1], cuts[1:]):
        rows = {
            "params": layers.views(params, (a, b)),
            "state": {k: layers.views(v, (a, b)) for k, v in (state or {}).items()},
        }
        files.append(write_rows(directory, iteration, a, b, rows, layers.names))
    return commit(
        directory,
        iteration=iteration,
        shape=layers.shape,
        dtype=str(params[0].dtype),
        files=files,
        slots=list(state or {}),
        extra=extra,
    )


def read_manifest(directory: str | os.PathLike) -> dict[str, Any]:
    """The valid checkpoint's manifest; :class:`StoreError` if there is none or it is not one."""
    directory = os.fspath(directory)
    path = os.path.join(directory, MANIFEST)
    if not os.path.isfile(path):
        raise StoreError(
            f"checkpoint store {directory!r} holds no checkpoint ({MANIFEST} is missing: none was "
            f"completed); start without resume, or give the directory a run wrote its checkpoints to"
        )
    try:
        with open(path, encoding="utf-8") as f:
            manifest = json.load(f)
        if manifest.get("format") != FORMAT:
            raise ValueError(f"format {manifest.get('format')!r}, expected {FORMAT!r}")
        manifest["iteration"], manifest["shape"], manifest["files"]  # noqa: B018 - required keys
    except (OSError, ValueError, KeyError, AttributeError) as exc:
        raise StoreError(
            f"checkpoint store {directory!r}: {MANIFEST} is not a dask_rpm checkpoint manifest "
            f"({type(exc).__name__}: {exc}); start without resume, or restore the store"
        ) from None
    return manifest


def _read_file(directory: str, entry: Mapping[str, Any]) -> Any:
    """One row file's arrays, after checking its size and checksum against the manifest."""
    path = os.path.join(directory, entry["name"])
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise StoreError(
            f"checkpoint store {directory!r}: row file {entry['name']!r} named by {MANIFEST} cannot be "
            f"read here ({exc.strerror or exc}); the store is damaged (restore it, or start without "
            f"resume), or this process does not see the directory the checkpoint was written to "
            f"(put the store on a file system every worker mounts)"
        ) from None
    if len(data) != entry["bytes"] or hashlib.sha256(data).hexdigest() != entry["sha256"]:
        raise StoreError(
            f"checkpoint store {directory!r}: row file {entry['name']!r} does not match {MANIFEST} "
            f"({len(data)} bytes, {entry['bytes']} recorded; or another SHA-256): it was truncated or "
            f"changed; restore the store, or start without resume"
        )
    return np.load(io.BytesIO(data))


class StoreRows(NamedTuple):
    """Rows ``[a, b)`` of a store's valid checkpoint, for the worker that will hold them to read itself.

    The driver builds it from the manifest (:func:`rows_to_read`): only the
    row files that overlap ``rows``, each with the size and SHA-256 the
    manifest records, so the worker reads and checks exactly what that
    checkpoint wrote - and the weights never pass through the driver.
    """

    directory: str
    files: tuple[RowFile, ...]  # the manifest's row files that overlap ``rows``
    rows: tuple[int, int]  # plan rows [a, b) wanted
    shape: tuple[int, ...]  # (n, m_1, ..., m_L, l) of the network
    slots: tuple[str, ...]  # optimizer state slots in the files
    network: Any = None  # a CNN's layers (:func:`network_entry`); None: an MLP


def manifest_files(manifest: Mapping[str, Any]) -> list[RowFile]:
    """The row files a manifest names, as records."""
    return [
        RowFile(e["name"], (int(e["rows"][0]), int(e["rows"][1])), int(e["bytes"]), e["sha256"])
        for e in manifest["files"]
    ]


def rows_to_read(directory: str, manifest: Mapping[str, Any], a: int, b: int) -> StoreRows:
    """What a worker holding hidden rows ``[a, b)`` reads of the checkpoint ``manifest`` describes."""
    files = tuple(f for f in manifest_files(manifest) if f.rows[0] < b and a < f.rows[1])
    shape = tuple(int(v) for v in manifest["shape"])
    slots = tuple(manifest.get("optimizer_slots") or ())
    return StoreRows(
        os.fspath(directory), files, (int(a), int(b)), shape, slots, manifest.get("network")
    )


def read_rows(part: StoreRows, dtype: Any) -> dict[str, Any]:
    """Read ``part`` (every file checked against its recorded size and SHA-256 first).

    Returns :func:`~dask_rpm.engine.worker.rows_of`'s dict (``params``, ``state``) in
    ``dtype``, plus ``bytes``: the size of the files read.
    """
    a, b = part.rows
    layers = geometry(part.shape, part.network)
    dtype = np.dtype(dtype)
    params = layers.zeros((a, b), dtype)
    state = {s: layers.zeros((a, b), dtype) for s in part.slots}
    covered = 0
    for f in part.files:
        lo, hi = max(a, f.rows[0]), min(b, f.rows[1])  # the part of this file wanted
        with _read_file(part.directory, f._asdict()) as z:
            for dst, prefix in [(params, ""), *((state[s], f"state_{s}_") for s in part.slots)]:
                src = [z[f"{prefix}{name}"] for name in layers.names]
                layers.put(dst, layers.views(src, (lo, hi), f.rows[0]), (lo, hi), a)
        covered += hi - lo
    if (
        covered != b - a
    ):  # the manifest covers [0, m) once (write_manifest checks it): a damaged store
        raise StoreError(
            f"checkpoint store {part.directory!r}: its row files cover {covered} of the hidden rows "
            f"[{a}, {b}); the store is damaged: restore it, or start without resume"
        )
    return {"params": params, "state": state, "bytes": sum(f.bytes for f in part.files)}


def load(directory: str | os.PathLike) -> dict[str, Any]:
    """The valid checkpoint as :func:`dask_rpm.fit`'s ``on_checkpoint`` receives it.

    Keys ``iteration``, ``params`` (``W_1 .. W_L, V``), ``optimizer_state``, ``errors``,
    ``plan`` (JSON, or None), ``drpm`` (or None), ``shape``, ``dtype`` and
    ``directory``. Every row file is checked against the manifest's size and
    SHA-256 first. (A run reads its checkpoints on the workers instead, each
    its own rows: :class:`StoreRows`.)
    """
    directory = os.fspath(directory)
    man = read_manifest(directory)
    m = geometry(man["shape"], man.get("network")).m
    got = read_rows(rows_to_read(directory, man, 0, m), man["dtype"])
    return {
        **_about(man, directory),
        "params": got["params"],
        "optimizer_state": got["state"],
    }


def _about(man: Mapping[str, Any], directory: str) -> dict[str, Any]:
    """What a manifest says of its checkpoint besides the weights."""
    return {
        "iteration": int(man["iteration"]),
        "errors": np.asarray(man.get("errors") or [], dtype=float),
        "plan": man.get("plan"),
        "drpm": man.get("drpm"),
        "optimizer_slots": list(man.get("optimizer_slots") or []),
        "shape": tuple(int(v) for v in man["shape"]),
        "dtype": np.dtype(man["dtype"]).name,
        "directory": directory,
    }


#: Prefix of the files :func:`write_mark` leaves for :func:`unseen_marks` (removed right after).
MARK = ".shared-check-"


def write_mark(directory: str, name: str, text: str) -> None:
    """Write the small file ``name`` (a :data:`MARK` name) holding ``text``: a worker's side of the
    check that the store is on a file system the workers and the driver share."""
    atomic_write_text(os.path.join(directory, name), text)


def unseen_marks(directory: str, marks: Mapping[str, str]) -> list[str]:
    """Of ``marks`` (file name -> the text its writer put in it), the names this process does not
    see with that text in ``directory``: their writers and this process see different files there."""
    unseen = []
    for name, text in marks.items():
        try:
            with open(os.path.join(directory, name), encoding="utf-8") as f:
                if f.read() == text:
                    continue
        except OSError:
            pass
        unseen.append(name)
    return unseen


def file_digest(path: str) -> str | None:
    """SHA-256 (hex) of the file at ``path``; None if it cannot be read."""
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return None


def unseen_files(directory: str, files: Iterable[RowFile]) -> list[str]:
    """Of ``files`` (what writers reported), the names this process does not see in ``directory``
    with the reported size."""
    unseen = []
    for f in files:
        try:
            if os.path.getsize(os.path.join(directory, f.name)) == f.bytes:
                continue
        except OSError:
            pass
        unseen.append(f.name)
    return unseen


def remove_stale(directory: str, keep: Iterable[str]) -> list[str]:
    """Remove row files (and temporary files of interrupted writes) not in ``keep``; returns their names.

    Call it only after the manifest naming ``keep`` is in place: until then the
    previous checkpoint's files are the valid ones.
    """
    keep = set(keep)
    gone = []
    for name in os.listdir(directory):
        ours = (
            _ROW_FILE.match(name)
            or (name.startswith(".tmp-") and (name.endswith(".npz") or MARK in name))
            or name.startswith(MARK)  # a check's files, left if its driver died meanwhile
        )
        if ours and name not in keep:
            try:
                os.unlink(os.path.join(directory, name))
                gone.append(name)
            except FileNotFoundError:  # removed meanwhile (another cleanup)
                pass
            except OSError as exc:  # the manifest is in place: a file left over costs only space
                logger.warning(f"checkpoint store {directory!r}: could not remove {name!r} ({exc})")
    return gone


def prepare_directory(directory: Any, resume: Any) -> str:
    """``checkpoint_dir`` made absolute and created; refused if not writable or holding another run's checkpoint."""
    path = os.path.abspath(os.fspath(directory))
    if os.path.exists(path) and not os.path.isdir(path):
        raise StoreError(
            f"checkpoint_dir={os.fspath(directory)!r} is not a directory; give a directory (new or "
            f"empty) that every worker can reach"
        )
    resuming_it = (
        isinstance(resume, (str, os.PathLike)) and os.path.abspath(os.fspath(resume)) == path
    )
    if os.path.exists(os.path.join(path, MANIFEST)) and not resuming_it:
        raise StoreError(
            f"checkpoint_dir={os.fspath(directory)!r} already holds a checkpoint of another run; "
            f"continue that run with resume={os.fspath(directory)!r}, or choose a new directory"
        )
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise StoreError(
            f"checkpoint_dir={os.fspath(directory)!r} cannot be created ({exc.strerror or exc}); "
            f"choose a writable directory every worker can reach"
        ) from None
    why = unwritable_reason(path)
    if why is not None:
        raise StoreError(
            f"checkpoint_dir={os.fspath(directory)!r} cannot be written: {why}; choose a writable "
            f"directory every worker can reach"
        )
    return path


def describe(directory: str | os.PathLike) -> dict[str, Any]:
    """The valid checkpoint's manifest summed up, without reading a row file.

    :func:`load`'s keys but ``params`` and ``optimizer_state``; adds
    ``optimizer_slots``.
    """
    directory = os.fspath(directory)
    return _about(read_manifest(directory), directory)


def open_resume(resume: Any, shape: Sequence[int]) -> dict[str, Any]:
    """``fit(resume=<store directory>)``: :func:`describe` of its checkpoint, after checking its shape.

    ``shape`` is ``(n, m, l)`` of the network being trained (bias units
    included). Only the manifest is read: the workers read the row files,
    each its own rows (:class:`StoreRows`), when the run places its shards.
    """
    path = os.fspath(resume)
    if not os.path.isdir(path):
        raise StoreError(
            f"resume={path!r}: no such directory; give a checkpoint store (the checkpoint_dir a run "
            f"wrote), a checkpoint dict as on_checkpoint receives it, or None to start from scratch"
        )
    man = read_manifest(path)
    have, want = [int(v) for v in man["shape"]], [int(v) for v in shape]
    if have != want:
        fmt = "-".join
        raise StoreError(
            f"resume={path!r}: the checkpoint is of a {fmt(map(str, have))} network "
            f"(inputs-hidden-outputs, bias units included) but this run trains "
            f"{fmt(map(str, want))}; resume with the store this network wrote (same data, hidden "
            f"units and bias), or start without resume"
        )
    return _about(man, os.path.abspath(path))
