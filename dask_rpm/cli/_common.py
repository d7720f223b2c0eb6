"""What every ``dask-rpm`` subcommand shares: the error type, the parser class, option parsing.

A runner reports bad input by raising :class:`CLIError` (or a library error the
runner translates into one); :func:`dask_rpm.cli.main` prints its message as one
line on stderr and exits 2. The option helpers turn the raw strings argparse
hands over into numbers with messages that say what was given and what is valid.
"""

from __future__ import annotations

import argparse
import math
import re
from typing import Any, overload

__all__ = [
    "PROG",
    "CLIError",
    "Parser",
    "int_option",
    "float_option",
    "positive_option",
    "split_list",
    "join_dashed_values",
    "subcommand_names",
]

#: How the command is spelled when started as a console script.
PROG = "dask-rpm"


class CLIError(Exception):
    """Bad command-line input; the message is printed as one line and the exit code is 2."""


class Parser(argparse.ArgumentParser):
    """ArgumentParser whose usage errors are one line on stderr (exit code 2)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        msg = " ".join(message.split())
        self.exit(2, f"{self.prog}: error: {msg} (see {self.prog} --help)\n")


@overload
def int_option(name: str, value: str) -> int: ...
@overload
def int_option(name: str, value: None) -> None: ...
def int_option(name: str, value: str | None) -> int | None:
    """``value`` as an int (None stays None); :class:`CLIError` naming ``name`` otherwise."""
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise CLIError(f"{name}={value!r} is not a whole number") from None


def float_option(name: str, value: str | None) -> float | None:
    """``value`` as a float (None stays None), for fractions of ``m`` such as ``--small-group``."""
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        raise CLIError(
            f"{name}={value!r} is not a number; give a fraction of m in [0, 1), e.g. 0.06"
        ) from None


def positive_option(name: str, value: str | None, kind: type) -> Any:
    """``value`` as a finite ``kind`` (int or float) > 0; None stays None."""
    if value is None:
        return None
    try:
        v = kind(value)
    except ValueError:
        what = "a whole number" if kind is int else "a number"
        raise CLIError(f"{name}={value!r} is not {what}; give {what} > 0") from None
    if not (math.isfinite(v) and v > 0):
        raise CLIError(f"{name}={value!r} must be > 0")
    return v


def split_list(text: str | None, default: Any = ()) -> list[str]:
    """Comma-separated ``text`` as a list of stripped, non-empty items (``default`` when None)."""
    if text is None:
        return list(default)
    return [t.strip() for t in text.split(",") if t.strip()]


# Options whose value may legitimately start with '-' (a negative ability is
# still reported by our own validation instead of argparse's "expected one argument").
_VALUE_OPTIONS = {"--abilities", "--shape", "--samples", "--dp", "--small-group"}
_DASHED_VALUE = re.compile(r"^-(\d|\.|inf|nan)", re.IGNORECASE)


def join_dashed_values(argv: list[str]) -> list[str]:
    """``--abilities -1,2`` as ``--abilities=-1,2``, so argparse does not take ``-1,2`` for an option."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        tok = argv[i]
        if tok in _VALUE_OPTIONS and i + 1 < len(argv) and _DASHED_VALUE.match(argv[i + 1]):
            out.append(f"{tok}={argv[i + 1]}")
            i += 2
            continue
        out.append(tok)
        i += 1
    return out


def subcommand_names(parser: argparse.ArgumentParser) -> list[str]:
    """The subcommands ``parser`` knows, in the order ``--help`` lists them."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return list(action.choices)
    return []
