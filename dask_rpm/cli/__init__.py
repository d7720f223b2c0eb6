"""Command line: ``dask-rpm <subcommand> ...`` and ``dask rpm <subcommand> ...``.

Each subcommand is a module of this package with ``add_parser(subparsers)``
(adds its parser and sets ``func=<runner>`` via ``set_defaults``) and the
runner, which takes the parsed namespace and returns an exit code. The
subcommands are listed in :data:`COMMANDS`; :func:`register_parser` adds one
from elsewhere. Runners report bad input by raising :class:`CLIError` or
:class:`~dask_rpm.plan.partition.PlanError`; :func:`main` prints the message as one
line on stderr and exits 2.

``dask rpm ...`` works because the ``dask_cli`` entry point group is loaded by
dask's own ``dask`` command; :data:`dask_cli` is a click command that forwards
its raw arguments to :func:`main`.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import click

from .._lazy import lazy_attributes
from .._version import __version__
from ..plan.partition import PlanError
from . import bench, plan, predict, probe, simulate, train
from ._common import PROG, CLIError, Parser, join_dashed_values, subcommand_names
from .plan import draw_plan, format_plan, plan_json

if not TYPE_CHECKING:  # type checkers resolve submodules themselves; a catch-all hides typos
    __getattr__, __dir__ = lazy_attributes(__name__, __path__)  # submodules on first use

__all__ = [
    "CLIError",
    "COMMANDS",
    "main",
    "build_parser",
    "register_parser",
    "dask_cli",
    "draw_plan",
    "format_plan",
    "plan_json",
]

#: The subcommands, in the order ``dask-rpm --help`` lists them: each one's ``add_parser``.
COMMANDS: tuple[Callable[[Any], None], ...] = (
    plan.add_parser,
    bench.add_parser,
    predict.add_parser,
    probe.add_parser,
    simulate.add_parser,
    train.add_parser,
)

_REGISTERED: list[Callable[[Any], None]] = []


def register_parser(fn: Callable[[Any], None]) -> Callable[[Any], None]:
    """Register ``fn(subparsers)`` that adds a subcommand; usable as a decorator."""
    if fn not in _REGISTERED and fn not in COMMANDS:
        _REGISTERED.append(fn)
    return fn


#: How the command is spelled when started through dask's own command line (``dask rpm ...``).
DASK_PROG = "dask rpm"

_MAIN_DESCRIPTION = """\
Train a neural network by batch back-propagation on Dask workers of different
speeds. Each iteration (samples x hidden units) is cut into one rectangle per
worker, sized to the worker's speed; DRPM re-measures the speeds while
training and re-plans.
"""

_MAIN_EPILOG = """\
first steps:
  {prog} train                 # a demo on 4 EMULATED workers of this machine (about 10 s)
  {prog} plan --abilities 1,0.5,0.25 --shape 33-128-8 --samples 4096
  {prog} probe                 # measure the workers' speeds (about 6 s)

Run '{prog} <command> --help' for the options and examples of a command.
Documentation: README.md and docs/ in the dask-rpm source.
"""


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    """The top-level parser with every known subcommand.

    ``prog`` is how the command was started (``dask-rpm``, or ``dask rpm``
    through dask's command line); usage lines and errors name it.
    """
    parser = Parser(
        prog=prog,
        description=_MAIN_DESCRIPTION,
        epilog=_MAIN_EPILOG.format(prog=prog),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {__version__}", help="print the version"
    )
    parser.add_argument(
        "--debug",
        "-v",
        action="store_true",
        help="on an unexpected error, show its traceback (default: one line)",
    )
    sub = parser.add_subparsers(dest="command", metavar="<command>")
    for add in (*COMMANDS, *_REGISTERED):
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None, *, prog: str | None = None) -> int:
    """Run the command line; returns the exit code (0 ok, 2 bad input).

    ``prog`` names the command in usage lines and errors (default ``dask-rpm``).
    """
    args_list = list(sys.argv[1:] if argv is None else argv)
    prog = prog or PROG
    parser = build_parser(prog)
    try:
        args = parser.parse_args(join_dashed_values(args_list))
    except SystemExit as e:  # --help (0) or a usage error (2), already printed
        return int(e.code or 0) if not isinstance(e.code, str) else 2
    func = getattr(args, "func", None)
    if func is None:
        names = ", ".join(sorted(subcommand_names(parser)))
        print(f"{prog}: error: choose a command: {names} (see {prog} --help)", file=sys.stderr)
        return 2
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _one_line_warning(f"{prog} {args.command}")
            code = int(func(args) or 0)
        sys.stdout.flush()  # inside the try: a reader that left shows here, not at exit
        return code
    except (CLIError, PlanError) as e:
        msg = " ".join(str(e).split())
        print(f"{prog} {args.command}: error: {msg}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog} {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader left (`plan | head`): nothing more to say, and nothing more to flush
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except Exception as e:  # a failure that is not bad input: one line unless --debug
        if args.debug:
            raise
        msg = " ".join(str(e).split())[:500]
        print(
            f"{prog} {args.command}: failed: {type(e).__name__}: {msg} (run with --debug for the "
            f"traceback)",
            file=sys.stderr,
        )
        return 1


def _one_line_warning(prefix: str) -> Callable[..., None]:
    """``warnings.showwarning`` for the command line: one line, no source file or code."""

    def show(message: Any, category: Any, *args: Any, **kwargs: Any) -> None:
        print(f"{prefix}: warning: {' '.join(str(message).split())}", file=sys.stderr)

    return show


def _make_dask_cli() -> click.Command:
    @click.command(
        name="rpm",
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
        add_help_option=False,
        help=f"Rectangular-partitioning BP on Dask (same as '{PROG}'; try 'dask rpm --help').",
    )
    @click.argument("args", nargs=-1, type=click.UNPROCESSED)
    @click.pass_context
    def rpm(ctx: Any, args: tuple[str, ...]) -> None:
        ctx.exit(main(list(args), prog=DASK_PROG))

    return rpm


#: ``dask rpm ...``: the ``dask_cli`` entry point (a click command forwarding to :func:`main`).
dask_cli = _make_dask_cli()
