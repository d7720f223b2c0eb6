"""``dask-rpm plan``: the rectangle plan for workers of given abilities, as a report or JSON.

:func:`format_plan` and :func:`draw_plan` are also what a Python session uses to
look at a plan (``tutorials/01_planning.py``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
from typing import Any

import yaml

from ..nn.cnn import ConvLayers, NetworkSpecError, is_conv
from ..nn.cnn_records import conv_layers
from ..nn.layers import layers_of
from ..plan.partition import round_cuts
from ..plan.real_partition import count_noun
from ..planners import PLANNERS, make_plan, parse_network_shape
from ._common import PROG, CLIError, float_option, int_option

__all__ = [
    "add_parser",
    "run",
    "parse_abilities",
    "read_abilities_file",
    "plan_json",
    "format_plan",
    "format_layers",
    "draw_plan",
    "read_network_spec",
]

_PLAN_EPILOG = f"""\
examples:
  # the worked example of the SRPM paper (5 workers, NETtalk 203-80-26, 1024 samples)
  {PROG} plan --abilities 0.05,0.10,0.20,0.30,0.35 --shape 203-80-26 --samples 1024

  # a baseline grid with 2 data-parallel groups, as JSON
  {PROG} plan --abilities 1,1.5,2,2.5,3,3.5 --shape 203-80-26 --samples 1024 \\
      --method grid-hrev --dp 2 --json

  # abilities from a file (one number per line, or a JSON list), no band snapping
  {PROG} plan --abilities-file speeds.txt --shape 203-80-26 --samples 1024 --small-group 0

  # a GPU beside three one-thread CPU workers (1 : 100): with measured rates (work units per
  # second) DRPM's choice leaves the CPUs idle when their messages cost more than they save
  {PROG} plan --abilities 1,0.01,0.01,0.01 --rates 2.6e7,2.6e5,2.6e5,2.6e5 \\
      --shape 33-64-4 --samples 512 --idle

  # a CNN (layer records, or a YAML/JSON file of them; images of 1 channel, 8x8): each
  # worker's channels of every stage, 4 workers in 2 columns
  {PROG} plan --abilities 1,1,2,2 --samples 512 --dp 2 --image 1,8,8 \\
      --network '[{{"conv": 4, "kernel": 3}}, "relu", {{"maxpool": 2}}, "flatten", {{"linear": 10}}]'

  # the same through dask's command line
  dask rpm plan --abilities 1,2,3 --shape 10-8-2 --samples 100

Abilities are relative speeds (any positive scale). Workers are named P1..PN in
the order given; JSON worker indices are 0-based in that order. Defaults for
--method and --small-group come from dask config (rpm.planner.*).
"""


def add_parser(subparsers: Any) -> None:
    """Add the ``plan`` subcommand."""
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
    net = p.add_mutually_exclusive_group(required=True)
    net.add_argument(
        "--shape",
        metavar="N-M-L",
        help="network inputs-hidden-outputs, e.g. 203-80-26; several hidden layers: 784-512-256-10",
    )
    net.add_argument(
        "--network",
        metavar="LAYERS",
        help="a CNN instead: a JSON/YAML list of layer records, e.g. "
        '\'[{"conv": 6, "kernel": 5}, "relu", {"maxpool": 2}, "flatten", '
        "{\"linear\": 10}]', or a YAML/JSON file holding one (a job file's network: too); "
        "needs --image",
    )
    p.add_argument(
        "--image",
        metavar="C,H,W",
        default=None,
        help="with --network: channels, height and width of one input image, e.g. 1,28,28",
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
        "--rates",
        metavar="R1,R2,...",
        default=None,
        help="each worker's speed in work units (hidden units x samples) per second, e.g. the "
        "probe's throughput: what srpm-time and --idle predict seconds with",
    )
    p.add_argument(
        "--idle",
        action="store_true",
        help="leave idle the workers whose messages cost more than their share of the work "
        "saves (DRPM's choice; needs --rates with a planner other than srpm-time); the notes "
        "say why",
    )
    p.add_argument(
        "--json", action="store_true", help="print one JSON object instead of the report"
    )
    p.add_argument(
        "--width", type=int, default=64, metavar="CHARS", help="width of the drawing (default 64)"
    )
    p.add_argument("--no-draw", action="store_true", help="leave out the ASCII drawing")
    p.set_defaults(func=run)


def parse_abilities(text: str, where: str) -> list[float]:
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


def read_abilities_file(path: str) -> list[float]:
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
    return parse_abilities("\n".join(ln for ln in lines if ln), f"abilities file {path!r}")


def read_network_spec(text: str) -> list[Any]:
    """``--network``'s layer records: a JSON/YAML list, or the path of a YAML/JSON file holding
    one (or holding a mapping with a ``network:`` list, as a job file does)."""
    where = "--network"
    if os.path.isfile(text):
        where = f"--network file {text!r}"
        try:
            with open(text) as f:
                text = f.read()
        except OSError as e:
            raise CLIError(f"cannot read {where}: {e.strerror}") from None
    elif re.search(r"\.(ya?ml|json)$", text.strip(), re.IGNORECASE):
        raise CLIError(
            f"--network file {text!r} not found: give an existing YAML/JSON file, or the layer "
            f"records themselves"
        )
    try:
        spec = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise CLIError(
            f"{where} is not valid JSON or YAML ({getattr(e, 'problem', None) or e}); give a list "
            f'of layer records, e.g. \'[{{"conv": 6, "kernel": 5}}, "relu", "flatten", '
            f'{{"linear": 10}}]\''
        ) from None
    if isinstance(spec, dict) and "network" in spec:  # a job file
        spec = spec["network"]
    if not isinstance(spec, list) or not spec:
        raise CLIError(
            f"{where} holds {type(spec).__name__} {spec!r:.80}; it must be a non-empty list of "
            f'layer records, e.g. \'[{{"conv": 6, "kernel": 5}}, "relu", "flatten", '
            f'{{"linear": 10}}]\''
        )
    return spec


def _image(text: str | None) -> tuple[int, int, int]:
    """``--image C,H,W`` (``CxHxW`` too) as three whole numbers >= 1."""
    if text is None:
        raise CLIError(
            "--network needs --image C,H,W: the channels, height and width of one input image "
            "(e.g. --image 1,28,28)"
        )
    parts = [t for t in re.split(r"[,x\s]+", text.strip()) if t]
    try:
        dims = [int(t) for t in parts]
    except ValueError:
        dims = []
    if len(dims) != 3 or min(dims) < 1:
        raise CLIError(
            f"--image={text!r}; give three whole numbers >= 1: channels, height, width, e.g. "
            f"1,28,28"
        )
    return dims[0], dims[1], dims[2]


def _layers(args: argparse.Namespace) -> Any:
    """The network's geometry: an MLP's :class:`~dask_rpm.nn.layers.Layers` (``--shape``) or a
    CNN's :class:`~dask_rpm.nn.cnn.ConvLayers` (``--network`` and ``--image``)."""
    if args.network is None:
        if args.image is not None:
            raise CLIError(
                "--image describes a CNN's input; give it with --network (an MLP's --shape "
                "names its inputs)"
            )
        # several hidden layers: the planners cut the narrowest; every layer follows the same rows
        return layers_of(parse_network_shape(args.shape))
    spec = read_network_spec(args.network)
    image = _image(args.image)
    try:
        return conv_layers(spec, image)
    except NetworkSpecError as e:
        raise CLIError(f"--network: {e}") from None


def run(args: argparse.Namespace) -> int:
    """Runner of ``dask-rpm plan``."""
    if args.abilities_file is not None:
        abilities = read_abilities_file(args.abilities_file)
    else:
        abilities = parse_abilities(args.abilities, "--abilities")
    layers = _layers(args)
    # a CNN is planned as its geometry: make_plan takes its shape and communication counts
    shape = layers if is_conv(layers) else layers.plan_shape
    samples = int_option("--samples", args.samples)
    dp = int_option("--dp", args.dp)
    small_group = float_option("--small-group", args.small_group)
    if args.width < 8:
        raise CLIError(
            f"--width={args.width} is too small for a drawing; use at least 8 (or --no-draw)"
        )
    rates = None if args.rates is None else parse_abilities(args.rates, "--rates")
    if rates is not None and len(rates) != len(abilities):
        raise CLIError(
            f"--rates has {len(rates)} values for {len(abilities)} abilities; give one per worker"
        )
    if args.idle and rates is None and str(args.method) != "srpm-time":
        raise CLIError(
            "--idle predicts seconds from each worker's speed: give --rates (work units per "
            "second, e.g. dask-rpm probe's throughput), or use --method srpm-time"
        )
    plan = make_plan(
        abilities,
        shape,
        samples,
        method=args.method,
        dp=dp,
        small_group=small_group,
        rates=rates,
        idle=True if args.idle else None,
    )
    if args.json:
        print(json.dumps(plan_json(plan, layers)))
    else:
        print(format_plan(plan, draw=not args.no_draw, width=args.width))
        if layers.depth > 1 or is_conv(layers):
            print(format_layers(plan, layers))
    return 0


def format_layers(plan: Any, layers: Any) -> str:
    """Each worker's rows of every hidden layer (a network of several hidden layers), or of every
    stage of a CNN (its output channels)."""
    if is_conv(layers):
        return _format_stages(plan, layers)
    out = [f"rows of each hidden layer ({'-'.join(map(str, layers.shape))}):"]
    for col in plan.columns:
        for w in col:
            rows = layers.layer_rows(plan.rectangle(w).hidden)
            out.append(f"  P{w + 1:<6}" + "  ".join(f"[{a}, {b})" for a, b in rows))
    return "\n".join(out)


def _format_stages(plan: Any, layers: ConvLayers) -> str:
    """A CNN's stages, then each worker's channels of every stage."""
    c, h, w = layers.image
    out = [f"network on {c}x{h}x{w} images:"]
    out.extend(f"  {line}" for line in layers.describe())
    bias = (
        f" (stage {layers.depth}'s last row, {layers.hidden[-1] - 1}, is the output bias channel)"
        if layers.out_bias
        else ""
    )
    out.append(f"channels of each stage{bias}:")
    out.append(
        f"  {'worker':<7}" + "  ".join(f"{f'stage {k + 1}':<10}" for k in range(layers.depth))
    )
    for col in plan.columns:
        for wk in col:
            rows = layers.layer_rows(plan.rectangle(wk).hidden)
            out.append(f"  P{wk + 1:<6}" + "  ".join(f"{f'[{a}, {b})':<10}" for a, b in rows))
    return "\n".join(line.rstrip() for line in out)


def _finite_or_none(v: float) -> float | None:
    return float(v) if math.isfinite(v) else None


def plan_json(plan: Any, layers: Any = None) -> dict[str, Any]:
    """The ``--json`` object of a plan (strict JSON: infeasible values become null); with
    ``layers`` each rectangle's rows of every hidden layer too (``layers``), or with a CNN's
    :class:`~dask_rpm.nn.cnn.ConvLayers` its channels of every stage (``channels``) and the
    network (``network``: the layer records, ``image``, ``stages``, ``cost_shape``)."""
    conv = layers is not None and is_conv(layers)
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
            **(
                {"channels" if conv else "layers": [list(v) for v in layers.layer_rows(r.hidden)]}
                if layers is not None and (conv or layers.depth > 1)
                else {}
            ),
        }
        for r in (plan.rectangle(w) for col in plan.columns for w in col)
    ]
    if conv:
        d["network"] = {
            "layers": layers.spec(),
            "image": list(layers.image),
            "stages": list(layers.hidden),
            "cost_shape": list(layers.cost_shape),
        }
    d["imbalance"] = plan.imbalance()
    d["excluded"] = list(plan.excluded)
    d["notes"] = list(plan.notes)
    return d


def format_plan(plan: Any, *, draw: bool = True, width: int = 64) -> str:
    """Human-readable report of a plan, optionally with an ASCII drawing."""
    n, m, l = plan.shape
    out = [
        f"{plan.method} plan: {count_noun(len(plan.rectangles), 'worker')} in {count_noun(plan.n_columns, 'column')}; "
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
