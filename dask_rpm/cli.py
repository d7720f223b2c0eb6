"""Command line: ``dask-rpm <subcommand> ...`` and ``dask rpm <subcommand> ...``.

Subcommands are added by functions named ``add_<name>_parser(subparsers)``
defined in this module (found automatically, in definition order) or passed to
:func:`register_parser` from elsewhere. Each one adds its parser with
``subparsers.add_parser(...)`` and sets ``func=<runner>`` via ``set_defaults``;
the runner takes the parsed namespace and returns an exit code. Runners report
bad input by raising :class:`CLIError` or :class:`~dask_rpm.partition.PlanError`;
:func:`main` prints the message as one line on stderr and exits 2.

``dask rpm ...`` works because the ``dask_cli`` entry point group is loaded by
dask's own ``dask`` command; :data:`dask_cli` is a click command that forwards
its raw arguments to :func:`main`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any

__all__ = [
    "CLIError",
    "main",
    "build_parser",
    "register_parser",
    "add_plan_parser",
    "dask_cli",
    "draw_plan",
]

PROG = "dask-rpm"


class CLIError(Exception):
    """Bad command-line input; the message is printed as one line and the exit code is 2."""


class _Parser(argparse.ArgumentParser):
    """ArgumentParser whose usage errors are one line on stderr (exit code 2)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        msg = " ".join(message.split())
        self.exit(2, f"{self.prog}: error: {msg} (see {self.prog} --help)\n")


_REGISTERED: list[Callable[[Any], None]] = []


def register_parser(fn: Callable[[Any], None]) -> Callable[[Any], None]:
    """Register ``fn(subparsers)`` that adds a subcommand; usable as a decorator."""
    if fn not in _REGISTERED:
        _REGISTERED.append(fn)
    return fn


def _parser_hooks() -> list[Callable[[Any], None]]:
    local = [
        obj
        for name, obj in list(globals().items())
        if name.startswith("add_") and name.endswith("_parser") and callable(obj)
    ]
    return local + [fn for fn in _REGISTERED if fn not in local]


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
    parser = _Parser(
        prog=prog,
        description=_MAIN_DESCRIPTION,
        epilog=_MAIN_EPILOG.format(prog=prog),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="<command>")
    for hook in _parser_hooks():
        hook(sub)
    return parser


# Options whose value may legitimately start with '-' (a negative ability is
# still reported by our own validation instead of argparse's "expected one argument").
_VALUE_OPTIONS = {"--abilities", "--shape", "--samples", "--dp", "--small-group"}
_DASHED_VALUE = re.compile(r"^-(\d|\.|inf|nan)", re.IGNORECASE)


def _join_dashed_values(argv: list[str]) -> list[str]:
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


def main(argv: Sequence[str] | None = None, *, prog: str | None = None) -> int:
    """Run the command line; returns the exit code (0 ok, 2 bad input).

    ``prog`` names the command in usage lines and errors (default ``dask-rpm``).
    """
    args_list = list(sys.argv[1:] if argv is None else argv)
    prog = prog or PROG
    parser = build_parser(prog)
    try:
        args = parser.parse_args(_join_dashed_values(args_list))
    except SystemExit as e:  # --help (0) or a usage error (2), already printed
        return int(e.code or 0) if not isinstance(e.code, str) else 2
    func = getattr(args, "func", None)
    if func is None:
        names = ", ".join(sorted(sub for sub in _subcommand_names(parser)))
        print(f"{prog}: error: choose a command: {names} (see {prog} --help)", file=sys.stderr)
        return 2
    from .partition import PlanError

    try:
        return int(func(args) or 0)
    except (CLIError, PlanError) as e:
        msg = " ".join(str(e).split())
        print(f"{prog} {args.command}: error: {msg}", file=sys.stderr)
        return 2


def _subcommand_names(parser: argparse.ArgumentParser) -> list[str]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return list(action.choices)
    return []


# ------------------------------------------------------------------- plan
_PLAN_EPILOG = f"""\
examples:
  # the worked example of the SRPM paper (5 workers, NETtalk 203-80-26, 1024 samples)
  {PROG} plan --abilities 0.05,0.10,0.20,0.30,0.35 --shape 203-80-26 --samples 1024

  # a baseline grid with 2 data-parallel groups, as JSON
  {PROG} plan --abilities 1,1.5,2,2.5,3,3.5 --shape 203-80-26 --samples 1024 \\
      --method grid-hrev --dp 2 --json

  # abilities from a file (one number per line, or a JSON list), no band snapping
  {PROG} plan --abilities-file speeds.txt --shape 203-80-26 --samples 1024 --small-group 0

  # the same through dask's command line
  dask rpm plan --abilities 1,2,3 --shape 10-8-2 --samples 100

Abilities are relative speeds (any positive scale). Workers are named P1..PN in
the order given; JSON worker indices are 0-based in that order. Defaults for
--method and --small-group come from dask config (rpm.planner.*).
"""


def add_plan_parser(subparsers: Any) -> None:
    """Add the ``plan`` subcommand."""
    from .planners import PLANNERS

    p = subparsers.add_parser(
        "plan",
        help="compute a rectangle plan for workers of given abilities",
        description=(
            "Compute the column-fixed rectangle plan (samples x hidden units per worker) "
            "for one BP iteration and show it, its communication cost and load balance."
        ),
        epilog=_PLAN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--abilities",
        metavar="P1,P2,...",
        help="comma-separated positive abilities, one per worker",
    )
    src.add_argument(
        "--abilities-file", metavar="PATH", help="file with one ability per line, or a JSON list"
    )
    p.add_argument(
        "--shape",
        required=True,
        metavar="N-M-L",
        help="network inputs-hidden-outputs, e.g. 203-80-26",
    )
    p.add_argument("--samples", required=True, metavar="S", help="number of training samples")
    p.add_argument(
        "--method",
        choices=sorted(PLANNERS),
        default=None,
        help="planner (default: rpm.planner.method, srpm)",
    )
    p.add_argument(
        "--dp", metavar="N_DP", default=None, help="number of columns (data-parallel degree)"
    )
    p.add_argument(
        "--small-group",
        metavar="A",
        default=None,
        help="snap horizontal bands at most this fraction of m thick (default 0.06; 0 disables)",
    )
    p.add_argument(
        "--json", action="store_true", help="print one JSON object instead of the report"
    )
    p.add_argument(
        "--width", type=int, default=64, metavar="CHARS", help="width of the drawing (default 64)"
    )
    p.add_argument("--no-draw", action="store_true", help="leave out the ASCII drawing")
    p.set_defaults(func=run_plan)


def _parse_abilities(text: str, where: str) -> list[float]:
    tokens = [t for t in re.split(r"[,\s]+", text.strip()) if t]
    if not tokens:
        raise CLIError(
            f"{where} is empty: give one positive number per worker, e.g. 0.05,0.10,0.20"
        )
    out = []
    for i, t in enumerate(tokens):
        try:
            out.append(float(t))
        except ValueError:
            raise CLIError(
                f"ability #{i + 1} {t!r} in {where} is not a number: abilities must be positive numbers"
            ) from None
    return out


def _read_abilities_file(path: str) -> list[float]:
    if not os.path.isfile(path):
        raise CLIError(
            f"abilities file {path!r} not found: give an existing file with one number per line"
        )
    try:
        with open(path) as f:
            text = f.read()
    except OSError as e:
        raise CLIError(f"cannot read abilities file {path!r}: {e.strerror}") from None
    stripped = text.strip()
    if stripped.startswith("["):
        try:
            data = json.loads(stripped)
        except json.JSONDecodeError as e:
            raise CLIError(
                f"abilities file {path!r} is not valid JSON: {e.msg} at line {e.lineno}"
            ) from None
        if not isinstance(data, list):
            raise CLIError(f"abilities file {path!r} must hold a JSON list of numbers")
        out = []
        for i, v in enumerate(data):
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise CLIError(
                    f"ability #{i + 1} {v!r} in {path!r} is not a number: abilities must be positive numbers"
                )
            out.append(float(v))
        if not out:
            raise CLIError(f"abilities file {path!r} is empty: give one positive number per worker")
        return out
    lines = [ln.split("#", 1)[0].strip() for ln in text.splitlines()]
    return _parse_abilities("\n".join(ln for ln in lines if ln), f"abilities file {path!r}")


def _int_option(name: str, value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise CLIError(f"{name}={value!r} is not a whole number") from None


def _float_option(name: str, value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        raise CLIError(
            f"{name}={value!r} is not a number; give a fraction of m in [0, 1), e.g. 0.06"
        ) from None


def run_plan(args: argparse.Namespace) -> int:
    """Runner of ``dask-rpm plan``."""
    from .planners import make_plan, parse_shape

    if args.abilities_file is not None:
        abilities = _read_abilities_file(args.abilities_file)
    else:
        abilities = _parse_abilities(args.abilities, "--abilities")
    shape = parse_shape(args.shape)
    samples = _int_option("--samples", args.samples)
    dp = _int_option("--dp", args.dp)
    small_group = _float_option("--small-group", args.small_group)
    if args.width < 8:
        raise CLIError(
            f"--width={args.width} is too small for a drawing; use at least 8 (or --no-draw)"
        )
    plan = make_plan(abilities, shape, samples, method=args.method, dp=dp, small_group=small_group)
    if args.json:
        print(json.dumps(plan_json(plan)))
    else:
        print(format_plan(plan, draw=not args.no_draw, width=args.width))
    return 0


def _finite_or_none(v: float) -> float | None:
    return float(v) if math.isfinite(v) else None


def plan_json(plan: Any) -> dict[str, Any]:
    """The ``--json`` object of a plan (strict JSON: infeasible values become null)."""
    d: dict[str, Any] = {
        "method": plan.method,
        "abilities": list(plan.abilities),
        "shape": list(plan.shape),
        "samples": plan.samples,
        "n_columns": plan.n_columns,
        "columns": [list(c) for c in plan.columns],
        "t_comm": _finite_or_none(plan.t_comm),
    }
    if plan.method == "srpm":
        d["t_comm_by_columns"] = [_finite_or_none(v) for v in plan.t_comm_by_columns]
    d["rectangles"] = [
        {
            "worker": r.worker,
            "label": f"P{r.worker + 1}",
            "column": r.column,
            "samples": list(r.samples),
            "hidden": list(r.hidden),
            "work": r.area,
        }
        for r in (plan.rectangle(w) for col in plan.columns for w in col)
    ]
    d["imbalance"] = plan.imbalance()
    d["excluded"] = list(plan.excluded)
    d["notes"] = list(plan.notes)
    return d


def format_plan(plan: Any, *, draw: bool = True, width: int = 64) -> str:
    """Human-readable report of a plan, optionally with an ASCII drawing."""
    from .partition import _count

    n, m, l = plan.shape
    out = [
        f"{plan.method} plan: {_count(len(plan.rectangles), 'worker')} in {_count(plan.n_columns, 'column')}; "
        f"s={plan.samples} samples, n-m-l={n}-{m}-{l}",
        "",
    ]
    for c, col in enumerate(plan.columns):
        s0, s1 = plan.column_samples(c)
        names = " ".join(f"P{w + 1}" for w in col)
        out.append(f"  column {c + 1}: samples [{s0}, {s1}) ({s1 - s0}), workers {names}")
    out.append("")
    planned = plan.planned_workers
    psum = sum(plan.abilities[w] for w in planned)
    total = plan.samples * m
    out.append(
        f"  {'worker':<7}{'ability':>9}{'column':>8}  {'samples':<14}{'hidden':<12}{'work':>9}{'load':>7}"
    )
    for c, col in enumerate(plan.columns):
        for w in col:
            r = plan.rectangle(w)
            share = plan.abilities[w] / psum
            load = (r.area / total) / share
            out.append(
                f"  P{w + 1:<6}{share:>9.4f}{c + 1:>8}  "
                f"{f'[{r.samples[0]}, {r.samples[1]})':<14}{f'[{r.hidden[0]}, {r.hidden[1]})':<12}"
                f"{r.area:>9}{load:>7.3f}"
            )
    out.append("")
    out.append(f"t_comm (model, elements): {plan.t_comm:.1f}")
    if plan.t_comm_by_columns:
        best = plan.n_columns
        parts = [
            f"C={c}: {v:.1f}{' *' if c == best else ''}"
            if math.isfinite(v)
            else f"C={c}: infeasible"
            for c, v in enumerate(plan.t_comm_by_columns, start=1)
        ]
        if len(parts) > 12:
            parts = parts[:10] + [f"... ({len(parts) - 10} more)"]
        out.append("t_comm by columns: " + ", ".join(parts))
    out.append(
        f"predicted imbalance: {plan.imbalance():.3f} "
        f"(largest work share / ability share; 1.000 is perfect)"
    )
    out.append("excluded: " + (", ".join(f"P{w + 1}" for w in plan.excluded) or "none"))
    if plan.notes:
        out.append("notes:")
        out.extend(f"  - {note}" for note in plan.notes)
    if draw:
        out.append("")
        out.append(draw_plan(plan, width=width))
    return "\n".join(out)


def draw_plan(plan: Any, *, width: int = 64, height: int | None = None) -> str:
    """ASCII drawing of the plan to scale: samples across, hidden units down.

    Column edges and row cuts are rounded to character cells (each rectangle
    keeps at least one cell); labels ``P1..PN`` go in the middle of rectangles
    wide enough, the others are listed below the drawing.
    """
    from .partition import round_cuts

    if height is None:
        height = max(6, width // 3)
    C = plan.n_columns
    kmax = max(len(col) for col in plan.columns)
    if C > width // 2 or kmax > height // 2:
        return f"(drawing omitted: {C} columns x up to {kmax} workers do not fit {width}x{height} characters)"
    widths = [plan.column_samples(c)[1] - plan.column_samples(c)[0] for c in range(C)]
    xs = [0]
    for w in round_cuts(widths, width):
        xs.append(xs[-1] + w)
    grid = [[" "] * (width + 1) for _ in range(height + 1)]

    def put(y: int, x: int, ch: str) -> None:
        cur = grid[y][x]
        if cur == "+" or (cur in "-|" and ch in "-|" and cur != ch):
            grid[y][x] = "+"
        else:
            grid[y][x] = ch

    unlabelled = []
    for c, col in enumerate(plan.columns):
        sizes = [plan.rectangle(w).n_hidden for w in col]
        ys = [0]
        for h in round_cuts(sizes, height):
            ys.append(ys[-1] + h)
        x0, x1 = xs[c], xs[c + 1]
        for w, y0, y1 in zip(col, ys[:-1], ys[1:]):
            for x in range(x0, x1 + 1):
                put(y0, x, "-")
                put(y1, x, "-")
            for y in range(y0, y1 + 1):
                put(y, x0, "|")
                put(y, x1, "|")
            for y, x in ((y0, x0), (y0, x1), (y1, x0), (y1, x1)):
                grid[y][x] = "+"
            label = f"P{w + 1}"
            if x1 - x0 - 1 >= len(label) and y1 - y0 >= 2:
                ym = (y0 + y1) // 2
                xm = x0 + 1 + (x1 - x0 - 1 - len(label)) // 2
                for i, ch in enumerate(label):
                    grid[ym][xm + i] = ch
            else:
                unlabelled.append(label)
    lines = ["".join(row).rstrip() for row in grid]
    caption = f"samples 0..{plan.samples} ->  (down: hidden units 0..{plan.m})"
    lines = [caption, *lines]
    if unlabelled:
        lines.append("too thin to label: " + ", ".join(unlabelled))
    return "\n".join(lines)


# ------------------------------------------------------------ dask rpm ...
def _make_dask_cli() -> Any:
    import click

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


dask_cli = _make_dask_cli()

# Subcommands defined in their own modules (picked up by _parser_hooks).
from .bench import add_bench_parser  # noqa: E402, F401
from .predict_cli import add_predict_parser  # noqa: E402, F401
from .probe_cli import add_probe_parser  # noqa: E402, F401
from .simulate import add_simulate_parser  # noqa: E402, F401
from .train import add_train_parser  # noqa: E402, F401

if __name__ == "__main__":  # python -m dask_rpm.cli
    sys.exit(main())
