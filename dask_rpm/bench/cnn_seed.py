"""``dask-rpm simulate --cnn-seed``: the seed's CNN time model as a table, a figure and its claims.

Pure module (numpy; matplotlib for the figure only). The numbers come from
:mod:`dask_rpm.cost.cnn_model`; this module lays them out: seconds per
iteration of data parallelism, the seed's hybrids hv1-hv3 and the rectangle
model's plan ("rpm") against the global mini-batch per node, the batches
where two of them swap places, and whether the model reproduces what the
seed's Fig. 10 says. Everything is labelled :data:`LABEL`: a MODEL, neither
EMULATED nor measured.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from .._files import atomic_write
from ..cost.cnn_model import BATCHES, TABLE2, Crossover, Sweep, crossovers, sweep

__all__ = ["LABEL", "Claim", "CnnSeedReport", "report", "markdown", "plot_cnn_seed"]

#: The label of every table and figure made here.
LABEL = "MODEL (seed §4, Table 1/2)"

#: Points of the figure's curves and of the claim checks, evenly spaced in log b.
_FINE = 257


class Claim(NamedTuple):
    """One statement of the seed's Fig. 10, checked against the model."""

    text: str
    holds: bool
    detail: str


class CnnSeedReport(NamedTuple):
    """What ``--cnn-seed`` prints and draws."""

    table: Sweep  # at the requested batches
    fine: Sweep  # on a fine grid between the smallest and the largest batch
    crossovers: tuple[Crossover, ...]
    claims: tuple[Claim, ...]


def report(batches: Sequence[float] = BATCHES) -> CnnSeedReport:
    """Evaluate the model at ``batches`` (global mini-batch per node) and check Fig. 10's claims.

    Parameters
    ----------
    batches : sequence of float
        At least one, each > 0; the crossovers and claims cover their range
        (a single batch: no crossovers).
    """
    table = sweep(batches)
    lo, hi = float(table.batches.min()), float(table.batches.max())
    fine = sweep(np.geomspace(lo, hi, _FINE) if hi > lo else [lo])
    found = crossovers(lo, hi) if hi > lo else ()
    return CnnSeedReport(table, fine, found, _claims(fine, found))


def _claims(fine: Sweep, found: Sequence[Crossover]) -> tuple[Claim, ...]:
    t = dict(zip(fine.names, fine.seconds, strict=True))
    b = fine.batches
    span = f"b = {b.min():g} to {b.max():g}"
    hv1 = t["hv1"] / t["data"]
    hv3 = t["hv3"] / t["data"]
    turns = [c.batch for c in found if {c.below, c.above} == {"hv3", "data"}]
    faster_detail = f"hv3 / data {hv3[0]:.2f} at b = {b[0]:g}, {hv3[-1]:.2f} at b = {b[-1]:g}"
    if turns:
        faster_detail = f"only for b < {turns[0]:.2f}; " + faster_detail
    gain = 1 - hv3
    return (
        Claim(
            "hv1 is slower than data parallel across the whole range",
            bool(np.all(hv1 > 1)),
            f"hv1 / data {hv1.min():.2f} to {hv1.max():.2f} over {span}",
        ),
        Claim(
            "hv3 is faster than data parallel across the range",
            bool(np.all(hv3 < 1)),
            faster_detail,
        ),
        Claim(
            "hv3's lead over data parallel is largest at a small batch per node",
            bool(np.argmax(gain) == 0),
            f"hv3 / data is smallest, {hv3.min():.2f}, at b = {b[np.argmax(gain)]:.3g}"
            + (", and grows with b" if np.all(np.diff(hv3) >= 0) else ""),
        ),
    )


def markdown(rep: CnnSeedReport) -> str:
    """The report as Markdown: the table, the crossovers and the claims, headed by :data:`LABEL`."""
    tab = rep.table
    lines = [
        f"{LABEL}: seconds per iteration of one set, predicted, not measured; "
        f"{TABLE2.flops / 1e12:g} TFLOP/s, {TABLE2.memory_bandwidth / 1e9:g} GB/s memory, "
        f"{TABLE2.network_bandwidth / 1e9:g} GB/s network per node; equal nodes and equal "
        "global mini-batch, b = global mini-batch / nodes",
        "",
        "| b | " + " | ".join(f"{n} s/it" for n in tab.names) + " | rpm k |",
        "| ---: |" + " ---: |" * len(tab.names) + " ---: |",
    ]
    for j, b in enumerate(tab.batches):
        cells = " | ".join(f"{tab.seconds[i, j]:.4f}" for i in range(len(tab.names)))
        lines.append(f"| {b:g} | {cells} | {tab.rpm_k[j]} |")
    lines += ["", "Crossovers (below b the first is faster, above it the second):", ""]
    if rep.crossovers:
        lines += [
            f"* {c.below} / {c.above} at b = {c.batch:.2f} ({c.seconds:.4f} s)"
            for c in rep.crossovers
        ]
    else:
        lines.append("* none in this range")
    lines += ["", "The seed's Fig. 10, against this model:", ""]
    lines += [
        f"* {c.text}: {'reproduced' if c.holds else 'NOT reproduced'} ({c.detail})"
        for c in rep.claims
    ]
    return "\n".join(lines) + "\n"


def plot_cnn_seed(rep: CnnSeedReport, path: str) -> str:
    """Log-log seconds per iteration against b, one line per scenario, and each over data parallel.

    Writes a PNG at ``path`` (atomically) and returns ``path``. The title carries :data:`LABEL`.
    """
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fine, tab = rep.fine, rep.table
    data = fine.seconds[fine.names.index("data")]
    fig, (a, r) = plt.subplots(1, 2, figsize=(11, 4.4))
    for i, name in enumerate(fine.names):
        style = {"linestyle": "--"} if name == "rpm" else {}
        (line,) = a.loglog(fine.batches, fine.seconds[i], label=name, **style)
        a.plot(tab.batches, tab.seconds[i], "o", color=line.get_color(), markersize=3.5)
        r.semilogx(
            fine.batches, fine.seconds[i] / data, label=name, color=line.get_color(), **style
        )
    for c in rep.crossovers:
        if "data" in (c.below, c.above):
            r.axvline(c.batch, color="0.6", linewidth=0.8, linestyle=":")
            r.annotate(
                f"{c.below}/{c.above}\nb={c.batch:.1f}",
                (c.batch, 1.0),
                fontsize=7,
                xytext=(3, 8),
                textcoords="offset points",
            )
    a.set_xlabel("global mini-batch per node b")
    a.set_ylabel("seconds per iteration")
    r.set_xlabel("global mini-batch per node b")
    r.set_ylabel("time / data parallel")
    for ax in (a, r):
        ax.set_xscale("log", base=2)  # the table's batches are powers of 2
        ax.xaxis.set_major_formatter(
            matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}")
        )  # 16, not 2^4
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    fig.suptitle(
        f"{LABEL}: simplified VGG16, 4 TFLOP/s, 400 GB/s memory, 4 GB/s network per node; "
        "not measured",
        fontsize=9,
    )
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=100, format="png"))
    plt.close(fig)
    return path
