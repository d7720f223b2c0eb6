"""Progress of :func:`dask_rpm.fit`: a bar on a terminal, plain lines in logs.

``fit(..., progress=...)`` takes one of

``"auto"`` (default, ``rpm.train.progress``)
    a bar when the client's stderr is interactive (a terminal, or a Jupyter
    / IPython kernel), plain log lines otherwise (pipes, files, sbatch logs);
``"bar"``
    one line on stderr redrawn in place (``\\r``)::

        rpm [########..........]  40/100  error 3.212e+01  11.8 ms/it  remap: column@40  ETA 0.7 s

``"log"``
    one plain line per report, at most one every ``rpm.train.progress-interval``
    seconds, plus the first and last block and every remap::

        dask-rpm fit: iteration 40/100 (40%), error 3.212e+01, 11.8 ms/iteration, 0.5 s elapsed

``"none"`` (also ``False``)
    nothing.

Iterations run in blocks (up to the next DRPM check), so progress advances a
block at a time. The iteration time shown is the median over the block, per
iteration from the end of the slowest worker's previous update to the end of
this one - the ``iteration_time`` of ``result.history``.

This module decides and formats only: it reads the run's timing log
timings and errors and never talks to the cluster.
"""

from __future__ import annotations

import math
import shutil
import sys
import time
from typing import Any, TextIO

from . import config
from .records import RemapRecord, Validation

__all__ = ["MODES", "Progress", "resolve_mode", "weight_bytes"]

#: Accepted values of ``progress=`` / ``rpm.train.progress``.
MODES = ("auto", "bar", "log", "none")


def weight_bytes(rec: RemapRecord, verb: str = "") -> str:
    """The weight bytes a remap moved, as its log lines say it (``"640 weight bytes moved"`` with
    ``verb="moved"``): through the client, and those the workers read from a checkpoint store
    themselves (a recovery from one)."""
    text = f"{rec.get('bytes', 0)} weight bytes" + (f" {verb}" if verb else "")
    if rec.get("store_bytes"):
        text += f" (and {rec['store_bytes']} read from the checkpoint store by the workers)"
    return text


def resolve_mode(progress: Any = None, stream: TextIO | None = None) -> str:
    """The concrete mode (``"bar"``, ``"log"`` or ``"none"``) for ``progress``.

    Parameters
    ----------
    progress : {"auto", "bar", "log", "none"}, bool or None
        ``None`` reads ``rpm.train.progress``; ``True`` means ``"auto"`` and
        ``False`` means ``"none"``.
    stream : file, optional
        Where the progress goes (default ``sys.stderr``); ``"auto"`` looks at it.

    Raises
    ------
    ValueError
        Any other value.
    """
    value = config.get("train.progress", progress)
    if value is True:
        value = "auto"
    elif value is False:
        value = "none"
    if not isinstance(value, str) or value.lower() not in MODES:
        where = "progress" if progress is not None else "rpm.train.progress"
        raise ValueError(
            f"{where}={value!r}; give one of {', '.join(repr(m) for m in MODES)} (or True / False), "
            f"e.g. fit(..., progress='log') or dask.config.set({{'rpm.train.progress': 'none'}})"
        )
    value = value.lower()
    if value != "auto":
        return value
    return "bar" if _interactive(sys.stderr if stream is None else stream) else "log"


def _interactive(stream: Any) -> bool:
    """A terminal, or a Jupyter / IPython kernel's stream (renders ``\\r``), but not a batch log."""
    try:
        if stream.isatty():
            return True
    except (AttributeError, ValueError, OSError):
        pass
    return type(stream).__module__.split(".")[0] == "ipykernel"


def _format_seconds(t: float) -> str:
    if not math.isfinite(t):
        return "?"
    if t < 60:
        return f"{t:.1f} s"
    if t < 3600:
        return f"{int(t // 60)} min {int(t % 60):02d} s"
    return f"{int(t // 3600)} h {int(t % 3600 // 60):02d} min"


def _format_iteration_time(t: float) -> str:
    if not math.isfinite(t):
        return "? ms"
    return f"{t * 1e3:.1f} ms" if t < 10 else f"{t:.1f} s"


class Progress:
    """Report training progress a block at a time.

    Parameters
    ----------
    progress : see :func:`resolve_mode`
    total : int
        Iterations planned.
    stream : file, optional
        Default ``sys.stderr`` (looked up when the reporter is made).
    min_interval : float, optional
        Log mode: least seconds between two ordinary lines; default
        ``rpm.train.progress-interval``.
    width : int, optional
        Bar mode: line width; default the terminal width (at most 100).
    """

    def __init__(
        self,
        progress: Any = None,
        total: int = 0,
        *,
        stream: TextIO | None = None,
        min_interval: float | None = None,
        width: int | None = None,
    ) -> None:
        self.stream = sys.stderr if stream is None else stream
        self.mode = resolve_mode(progress, self.stream)
        self.total = int(total)
        self.min_interval = float(config.get("train.progress-interval", min_interval))
        self.width = width or min(shutil.get_terminal_size((80, 24)).columns, 100)
        self.started = time.perf_counter()
        self.done = 0
        self.error = math.nan
        self.iteration_time = math.nan
        self.last_remap: RemapRecord | None = None
        self.validation: Validation | None = None
        self._n_remaps = 0
        self._last_end = math.nan
        self._last_line = -math.inf
        self._drawn = False
        self.lines = 0  # lines written (log mode) or redraws (bar mode)

    # -------------------------------------------------------------- reporting
    def update(
        self,
        done: int,
        *,
        error: float = math.nan,
        iteration_time: float = math.nan,
        remaps: list[RemapRecord] | None = None,
        validation: Validation | None = None,
    ) -> None:
        """Record that ``done`` iterations have finished, and show it.

        ``validation`` is the latest ``(iteration, loss, accuracy)`` on the validation set, if any.
        """
        if self.mode == "none":
            return
        if validation is not None:
            self.validation = validation
        first_report = self.done == 0
        self.done = int(done)
        self.error = float(error)
        if math.isfinite(iteration_time):
            self.iteration_time = float(iteration_time)
        new_remaps = list(remaps or [])[self._n_remaps :]
        self._n_remaps += len(new_remaps)
        if new_remaps:
            self.last_remap = new_remaps[-1]
        if self.mode == "bar":
            self._draw()
            return
        for rec in new_remaps:
            self._write_line(self._remap_line(rec))
        now = time.perf_counter()
        if (
            first_report
            or self.done >= self.total
            or new_remaps
            or now - self._last_line >= self.min_interval
        ):
            self._write_line(self._log_line())
            self._last_line = now

    def close(self, stopped: str | None = None) -> None:
        """End the report: finish the bar line; in log mode say why training stopped early."""
        if self.mode == "bar" and self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False
        if stopped and self.mode != "none":
            self._write_line(f"dask-rpm fit: stopped after {self.done} iteration(s): {stopped}")

    # --------------------------------------------------------------- formats
    def _elapsed(self) -> float:
        return time.perf_counter() - self.started

    def _validation_text(self, sep: str) -> str:
        if self.validation is None:
            return ""
        _, loss, acc = self.validation
        return (
            f"val loss {loss:.4g}" + (f" acc {100 * acc:.1f}%" if math.isfinite(acc) else "") + sep
        )

    def _remap_text(self) -> str:
        r = self.last_remap
        return "-" if r is None else f"{r.get('kind', '?')}@{r.get('iteration', '?')}"

    def _remap_line(self, rec: RemapRecord) -> str:
        extra = f", {weight_bytes(rec, 'moved')}" if "bytes" in rec else ""
        if rec.get("sample_bytes"):
            extra += f", {rec['sample_bytes']} sample bytes re-read"
        reason = f" ({rec['reason']})" if rec.get("reason") else ""
        return f"dask-rpm fit: {rec.get('kind', '?')} remap at iteration {rec.get('iteration', '?')}{extra}{reason}"

    def _log_line(self) -> str:
        pct = f" ({100 * self.done / self.total:.0f}%)" if self.total else ""
        return (
            f"dask-rpm fit: iteration {self.done}/{self.total}{pct}, error {self.error:.4g}, "
            f"{self._validation_text(', ')}"
            f"{_format_iteration_time(self.iteration_time)}/iteration, last remap {self._remap_text()}, "
            f"{_format_seconds(self._elapsed())} elapsed"
        )

    def bar_text(self) -> str:
        """The bar line as it is drawn (without ``\\r``)."""
        elapsed = self._elapsed()
        frac = min(max(self.done / self.total, 0.0), 1.0) if self.total else 1.0
        eta = elapsed * (1 - frac) / frac if frac > 0 else math.nan
        right = (
            f" {self.done:>{len(str(self.total))}}/{self.total}  error {self.error:.4g}  {self._validation_text('  ')}"
            f"{_format_iteration_time(self.iteration_time)}/it  remap: {self._remap_text()}  "
            f"{'ETA ' + _format_seconds(eta) if frac < 1 else _format_seconds(elapsed)}"
        )
        cells = max(self.width - len(right) - 7, 5)  # the whole line is width - 1 characters
        full = int(round(frac * cells))
        return f"rpm [{'#' * full}{'.' * (cells - full)}]{right}"

    def _draw(self) -> None:
        text = self.bar_text()
        self.stream.write("\r" + text[: max(self.width - 1, 20)])
        self.stream.flush()
        self._drawn = True
        self.lines += 1

    def _write_line(self, text: str) -> None:
        if self._drawn:  # do not write over a bar
            self.stream.write("\n")
            self._drawn = False
        self.stream.write(text + "\n")
        self.stream.flush()
        self.lines += 1
