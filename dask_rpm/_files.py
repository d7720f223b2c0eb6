"""Writing files without ever leaving a partial one or clobbering what is not ours.

One helper for every file dask_rpm writes (job results and checkpoints,
datasets, probe and bench outputs, figures, generated docs):

* :func:`atomic_write` writes through a temporary file in the target's
  directory, flushes it to disk and renames it over the target
  (``os.replace`` is atomic on POSIX), so readers see the old file or the new
  one, never half of one. The new file gets the permissions ``open()`` would
  give it (``0o666`` minus the umask, or the mode of the file it replaces):
  ``tempfile.mkstemp`` creates files ``0o600``, which would hide results from
  collaborators on a shared cluster.
* :func:`check_target` refuses, before any work, a target that is not a
  regular file (a directory, ``/dev/full``: a rename would replace the
  device), one that exists when overwriting was not asked for, and one whose
  directory cannot be written (tried by creating a file there: ``os.access``
  says yes to root even on read-only mounts).

This is a leaf module: it imports nothing from dask_rpm (the pure layer uses it).
"""

from __future__ import annotations

import os
import stat
import tempfile
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = [
    "TargetError",
    "atomic_write",
    "atomic_write_text",
    "check_target",
    "json_default",
    "new_file_mode",
    "unwritable_reason",
]

_UMASK_LOCK = threading.Lock()


def json_default(o: Any) -> Any:
    """``json.dumps(default=...)`` for what results, checkpoints and models hold: records
    (NamedTuples such as Network, Optimizer) as mappings, numpy scalars and arrays as plain
    values, anything else as its ``str``."""
    if hasattr(o, "_asdict"):
        return o._asdict()
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    return str(o)


class TargetError(ValueError):
    """A file target is refused; the message names the path, why, and how to fix it."""


def _umask() -> int:
    """The process umask (read from /proc on Linux; elsewhere set and restored under a lock)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    with _UMASK_LOCK:
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


def new_file_mode(path: str | os.PathLike) -> int:
    """Permission bits for a file written at ``path``: the replaced file's, else ``0o666 & ~umask``."""
    try:
        st = os.stat(path)
    except OSError:
        return 0o666 & ~_umask()
    return stat.S_IMODE(st.st_mode)


def _not_regular(path: str) -> str | None:
    """Why ``path`` cannot be replaced by a result file (it exists and is not a regular file), or None."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as e:
        return f"it cannot be inspected ({e.strerror})"
    if stat.S_ISREG(st.st_mode):
        return None
    if stat.S_ISDIR(st.st_mode):
        return "it is a directory"
    if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
        return "it is a device, not a regular file"
    return "it is not a regular file"


def unwritable_reason(directory: str | os.PathLike) -> str | None:
    """Why no file can be created in ``directory`` (missing, not a directory, not writable), or None.

    Creates and removes an empty temporary file: the only test that also holds
    for root, read-only mounts and network file systems.
    """
    directory = os.fspath(directory)
    if not os.path.exists(directory):
        return f"its directory {directory!r} does not exist"
    if not os.path.isdir(directory):
        return f"{directory!r} is not a directory"
    try:
        fd, tmp = tempfile.mkstemp(prefix=".rpm-write-test-", dir=directory)
    except OSError as e:
        return f"its directory {directory!r} is not writable (creating a file there failed: {e.strerror or e})"
    os.close(fd)
    os.unlink(tmp)
    return None


def check_target(
    path: str | os.PathLike, *, what: str = "output", overwrite: bool = False, hint: str = ""
) -> str:
    """Refuse ``path`` as a place to write a new file unless it is safe; returns the absolute path.

    Parameters
    ----------
    path
        Where the file will go.
    what
        How the caller's user knows this path (``"output"``, ``"--netcdf"``),
        used in the message.
    overwrite
        Accept an existing regular file (it is replaced atomically at the end).
    hint
        How to allow overwriting, added to the "exists" message
        (e.g. ``"set overwrite: true in the job file or pass --overwrite"``).

    Raises
    ------
    TargetError
        ``path`` exists and is not a regular file (always refused), exists and
        ``overwrite`` is false, or its directory is missing or not writable.
    """
    path = os.path.abspath(os.fspath(path))
    why = _not_regular(path)
    if why is not None:
        raise TargetError(
            f"{what} {path!r} is refused: {why}; give the path of a new or regular file, e.g. result.nc"
        )
    if os.path.exists(path) and not overwrite:
        allow = f", or {hint}" if hint else ""
        raise TargetError(
            f"{what} {path!r} already exists and would be overwritten; "
            f"choose a new file name, move the file away{allow}"
        )
    why = unwritable_reason(os.path.dirname(path))
    if why is not None:
        raise TargetError(f"{what} {path!r} cannot be written: {why}; choose a writable place")
    return path


def atomic_write(path: str | os.PathLike, write: Callable[[str], object]) -> str:
    """Write a file with ``write(tmp_path)`` and rename it over ``path``; returns ``path``.

    The temporary file is in ``path``'s directory (same file system, so the
    rename is atomic), ends in ``path``'s own name (format detection by
    suffix still works), is fsync'ed before the rename and is removed when
    anything fails. The result has :func:`new_file_mode` permissions.

    Raises
    ------
    TargetError
        ``path`` exists and is not a regular file (it would be replaced).
    OSError
        The directory is missing or not writable, the disk is full, ...
    """
    path = os.fspath(path)
    why = _not_regular(path)
    if why is not None:
        raise TargetError(f"refusing to write {path!r}: {why}")
    directory = os.path.dirname(os.path.abspath(path))
    mode = new_file_mode(path)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix="-" + os.path.basename(path), dir=directory)
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> str:
    """:func:`atomic_write` of a text file (UTF-8)."""

    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)

    return atomic_write(path, write)
