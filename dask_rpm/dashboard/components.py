"""The figures of the ``/rpm`` page, one component per figure.

Like distributed's ``dashboard/components``, each component owns its Bokeh
figure (``root``) and its data sources and redraws them from a dashboard
snapshot (:func:`dask_rpm.dashboard.state.snapshot`) in ``update``. The page
(:mod:`dask_rpm.dashboard.page`) owns the two sources several figures share:
the iteration rows and the remap events.
"""

from __future__ import annotations

from html import escape
from typing import Any

from bokeh.models import ColumnDataSource, HoverTool, Range1d
from bokeh.models.annotations import Title
from bokeh.models.widgets import Div
from bokeh.palettes import Category10_10, Category20_20
from bokeh.plotting import figure

__all__ = [
    "Header",
    "Rectangles",
    "Abilities",
    "IterationTime",
    "TrainingError",
    "add_remap_spans",
    "palette",
    "REMAP_COLORS",
]

#: Colour of a remap event's line, by kind.
REMAP_COLORS = {"whole": "#d62728", "column": "#ff7f0e"}
_HATCHES = ("/", "\\", "x", ".", "+", "o", "-", "|")
_TOOLS = "pan,wheel_zoom,box_zoom,reset,save"
_EMPTY = (
    "<h2>dask_rpm</h2><p>No rpm training run yet. Train with "
    "<code>dask_rpm.fit(x, d, ..., client=client)</code>; this page refreshes by itself.</p>"
)


def palette(n: int) -> list[str]:
    """``n`` colours, worker ``i`` always the ``i``-th."""
    base = list(Category10_10 if n <= 10 else Category20_20)
    return [base[i % len(base)] for i in range(max(n, 1))]


def _short(address: Any) -> str:
    """``tcp://10.0.0.5:40123`` -> ``10.0.0.5:40123`` (legends must stay short)."""
    return str(address).split("://", 1)[-1]


def _tail(address: Any) -> str:
    """What tells workers apart inside a rectangle: ``:40123`` for TCP, else the last path part."""
    s = _short(address)
    if ":" in s:
        return ":" + s.rsplit(":", 1)[-1]
    return s.rsplit("/", 1)[-1]


def add_remap_spans(fig: Any, remaps: ColumnDataSource, *, legend: bool) -> None:
    """One dotted vertical line per remap event on ``fig`` (with a hover saying what moved)."""
    spans = fig.vspan(
        x="iteration",
        source=remaps,
        line_color="color",
        line_width=2,
        line_dash="dotted",
        **({"legend_field": "kind"} if legend else {}),
    )
    fig.add_tools(
        HoverTool(
            renderers=[spans],
            tooltips=[
                ("remap", "@kind at iteration @iteration"),
                (
                    "moved",
                    "@bytes weight bytes, @sample_bytes sample bytes re-read, @seconds{0.000} s",
                ),
                ("why", "@reason"),
            ],
        )
    )


def _legend_style(fig: Any) -> None:
    fig.legend.location = "top_right"
    fig.legend.click_policy = "hide"
    fig.legend.background_fill_alpha = 0.6


class Header:
    """The run's headline: method, workers, progress, error, remaps, and the EMULATED label."""

    def __init__(self) -> None:
        self.root = Div(text=_EMPTY, sizing_mode="stretch_width")

    @staticmethod
    def _parts(state: dict[str, Any]) -> list[str]:
        s = state.get("summary") or {}
        plan = state.get("plan") or {}
        total = s.get("iterations_total")
        parts = [
            f"<b>run</b> {escape(str(state.get('run')))}",
            f"<b>method</b> {escape(str(s.get('method')))}",
            f"<b>workers</b> {len(state.get('rectangles') or [])} planned"
            + (f", {len(plan.get('excluded') or [])} excluded" if plan.get("excluded") else ""),
            f"<b>iteration</b> {s.get('iterations_done', 0)}" + (f" / {total}" if total else ""),
        ]
        if s.get("last_error") is not None:
            parts.append(f"<b>error</b> {s['last_error']:.4g}")
        if s.get("median_time") is not None:
            parts.append(
                f"<b>iteration time</b> {s['median_time'] * 1e3:.1f} ms (median of last 20)"
            )
        if s.get("validation"):
            v_it, v_loss, v_acc = s["validation"]
            acc = f", accuracy {100 * v_acc:.1f}%" if v_acc == v_acc else ""  # NaN: a regression
            parts.append(f"<b>validation</b> loss {v_loss:.4g}{acc} (after {int(v_it)} iterations)")
        rm = s.get("remaps") or {}
        parts.append(f"<b>remaps</b> {rm.get('column', 0)} column, {rm.get('whole', 0)} whole")
        if plan.get("imbalance") is not None:
            parts.append(f"<b>imbalance</b> {plan['imbalance']:.3f}")
        return parts

    def update(self, state: dict[str, Any]) -> None:
        """Redraw from a snapshot."""
        html = (
            "<h2 style='margin:4px 0'>dask_rpm training</h2><div>"
            + " &nbsp;|&nbsp; ".join(self._parts(state))
            + "</div>"
        )
        if state.get("emulation"):
            html += (
                "<div style='margin:6px 0;padding:6px 10px;background:#fff3cd;"
                "border:1px solid #e0a800;border-radius:4px;font-weight:bold'>"
                + escape(str(state["emulation"]))
                + "</div>"
            )
        notes = (state.get("plan") or {}).get("notes") or []
        if notes:
            html += (
                "<div style='color:#555;font-size:90%'>"
                + escape("; ".join(map(str, notes)))
                + "</div>"
            )
        self.root.text = html


_RECT_COLUMNS = (
    "left right bottom top x y color hatch label worker address group column samples hidden "
    "ability estimate"
).split()


class Rectangles:
    """The current plan drawn to scale: samples on x, hidden units on y (unit 0 at the top)."""

    def __init__(self) -> None:
        # the browser test finds this source by its name
        self.source = ColumnDataSource(name="rpm-rectangles", data={k: [] for k in _RECT_COLUMNS})
        self.x_range = Range1d(start=0, end=1)
        self.y_range = Range1d(start=1, end=0)  # columns list their workers top to bottom
        p = figure(
            title="Rectangles of the current plan (area = work)",
            x_range=self.x_range,
            y_range=self.y_range,
            height=330,
            sizing_mode="stretch_width",
            tools=_TOOLS,
            x_axis_label="samples",
            y_axis_label="hidden units",
        )
        quads = p.quad(
            left="left",
            right="right",
            bottom="bottom",
            top="top",
            source=self.source,
            fill_color="color",
            fill_alpha=0.75,
            line_color="white",
            line_width=2,
            hatch_pattern="hatch",
            hatch_color="white",
            hatch_alpha=0.35,
        )
        p.text(
            x="x",
            y="y",
            text="label",
            source=self.source,
            text_align="center",
            text_baseline="middle",
            text_font_size="12px",
            text_color="black",
        )
        p.add_tools(
            HoverTool(
                renderers=[quads],
                tooltips=[
                    ("worker", "@worker @address"),
                    ("group", "@group"),
                    ("column", "@column"),
                    ("samples", "@samples"),
                    ("hidden units", "@hidden"),
                    ("planned ability", "@ability{0.000}"),
                    ("estimated ability", "@estimate{0.000}"),
                ],
            )
        )
        p.xgrid.visible = p.ygrid.visible = False
        self.root = p

    @staticmethod
    def _label(r: dict[str, Any]) -> str:
        w, est, abil, group = r.get("worker"), r.get("estimate"), r.get("ability"), r.get("group")
        # The estimate may differ from the planned area until the next remap: show both.
        ability_text = " \u00b7 ".join(
            t
            for t in (
                f"p\u0302 {est:.2f}" if est is not None else "",
                f"area {abil:.2f}" if abil is not None else "",
            )
            if t
        )
        name = f"w{w}" + (f" {_tail(r['address'])}" if r.get("address") else "")
        return "\n".join(
            x for x in (name, ability_text, str(group) if group is not None else "") if x
        )

    def _row(self, r: dict[str, Any], color: str, hatch: str) -> dict[str, Any]:
        (s0, s1), (m0, m1) = r["samples"], r["hidden"]
        est, abil, group = r.get("estimate"), r.get("ability"), r.get("group")
        return dict(
            left=s0,
            right=s1,
            bottom=m0,
            top=m1,
            x=(s0 + s1) / 2,
            y=(m0 + m1) / 2,
            color=color,
            hatch=hatch,
            label=self._label(r),
            worker=str(r.get("worker")),
            address=str(r.get("address") or ""),
            group=str(group or ""),
            column=r.get("column"),
            samples=f"{s0}-{s1} ({s1 - s0})",
            hidden=f"{m0}-{m1} ({m1 - m0})",
            ability=abil if abil is not None else float("nan"),
            estimate=est if est is not None else float("nan"),
        )

    def update(self, state: dict[str, Any]) -> None:
        """Redraw from a snapshot."""
        plan = state.get("plan") or {}
        rects = state.get("rectangles") or []
        colors = palette(len(plan.get("abilities") or ()) or len(rects))
        groups = sorted({str(r["group"]) for r in rects if r.get("group") is not None})
        hatch = {
            g: (_HATCHES[i % len(_HATCHES)] if len(groups) > 1 else " ")
            for i, g in enumerate(groups)
        }
        cols: dict[str, list[Any]] = {k: [] for k in _RECT_COLUMNS}
        for r in rects:
            w = r.get("worker")
            group = r.get("group")
            row = self._row(
                r,
                colors[(w if isinstance(w, int) else 0) % len(colors)],
                hatch.get(str(group), " ") if group is not None else " ",
            )
            for k, v in row.items():
                cols[k].append(v)
        self.source.data = cols
        s = plan.get("samples") or max((r["samples"][1] for r in rects), default=1)
        shape = plan.get("shape") or []
        m = shape[1] if len(shape) > 1 else max((r["hidden"][1] for r in rects), default=1)
        self.x_range.start, self.x_range.end = 0, s
        self.y_range.start, self.y_range.end = m, 0
        if isinstance(self.root.title, Title):
            self.root.title.text = (
                f"Rectangles of the current plan: {s} samples x {m} hidden units (area = work)"
            )


class Abilities:
    """Ability per worker over the iterations: estimates (solid) and the current plan (dashed)."""

    def __init__(self, remaps: ColumnDataSource) -> None:
        self.estimates = ColumnDataSource(dict(xs=[], ys=[], color=[], label=[]))
        self.points = ColumnDataSource(dict(iteration=[], ability=[], color=[], label=[]))
        self.planned = ColumnDataSource(dict(xs=[], ys=[], color=[], label=[]))
        a = figure(
            title="Ability per worker: estimates (solid) and current plan (dashed)",
            height=330,
            sizing_mode="stretch_width",
            x_axis_label="iteration",
            y_axis_label="normalised ability",
            tools=_TOOLS,
        )
        a.multi_line(xs="xs", ys="ys", line_color="color", line_width=2, source=self.estimates)
        a.scatter(x="iteration", y="ability", color="color", size=7, source=self.points)
        # The legend hangs on the plan lines: every planned worker has one, estimated or not.
        a.multi_line(
            xs="xs",
            ys="ys",
            line_color="color",
            line_dash="dashed",
            line_width=1.5,
            source=self.planned,
            legend_field="label",
        )
        add_remap_spans(a, remaps, legend=False)
        _legend_style(a)
        a.add_layout(a.legend[0], "right")
        self.root = a

    def update(self, state: dict[str, Any], last_iteration: int) -> None:
        """Redraw from a snapshot; the plan line runs up to ``last_iteration``."""
        planned = (state.get("plan") or {}).get("abilities") or []
        n = len(planned)
        colors = palette(n)
        xs: list[list[Any]] = [[] for _ in range(n)]
        ys: list[list[Any]] = [[] for _ in range(n)]
        for c in state.get("abilities") or []:
            for i, v in enumerate((c.get("abilities") or [])[:n]):
                if v is not None:
                    xs[i].append(c.get("iteration"))
                    ys[i].append(v)
        workers = state.get("workers") or []
        labels = [
            f"w{i}" + (f" {_short(workers[i])}" if i < len(workers) else "") for i in range(n)
        ]
        keep = [i for i in range(n) if xs[i]]
        self.estimates.data = dict(
            xs=[xs[i] for i in keep],
            ys=[ys[i] for i in keep],
            color=[colors[i] for i in keep],
            label=[labels[i] for i in keep],
        )
        self.points.data = dict(
            iteration=[x for i in keep for x in xs[i]],
            ability=[y for i in keep for y in ys[i]],
            color=[colors[i] for i in keep for _ in xs[i]],
            label=[labels[i] for i in keep for _ in xs[i]],
        )
        # The current plan holds from the last remap (or the start) to now.
        rm = state.get("remaps") or []
        x0 = rm[-1].get("iteration", 0) if rm else 0
        x1 = max(last_iteration + 1, x0 + 1)
        self.planned.data = dict(
            xs=[[x0, x1] for _ in range(n)],
            ys=[[v, v] for v in planned],
            color=colors[:n],
            label=labels,
        )


class IterationTime:
    """Wall time of every iteration (the remap lines carry the legend)."""

    def __init__(self, iterations: ColumnDataSource, remaps: ColumnDataSource) -> None:
        t = figure(
            title="Iteration time",
            height=260,
            sizing_mode="stretch_width",
            x_axis_label="iteration",
            y_axis_label="seconds",
            tools=_TOOLS,
        )
        t.line(x="iteration", y="time", source=iterations, line_width=1.5)
        t.scatter(x="iteration", y="time", source=iterations, size=3)
        add_remap_spans(t, remaps, legend=True)
        _legend_style(t)
        self.root = t


class TrainingError:
    """The training error after every iteration (log scale), on the x range of ``x_range``."""

    def __init__(
        self, iterations: ColumnDataSource, remaps: ColumnDataSource, x_range: Any
    ) -> None:
        e = figure(
            title="Training error",
            height=260,
            sizing_mode="stretch_width",
            x_axis_label="iteration",
            y_axis_label="error (0.5 sum ||h - d||^2)",
            x_range=x_range,
            y_axis_type="log",
            tools=_TOOLS,
        )
        e.line(x="iteration", y="error", source=iterations, line_width=2, color="#2ca02c")
        add_remap_spans(e, remaps, legend=False)
        self.root = e
