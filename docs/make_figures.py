"""Draw docs/img/concepts.png, the picture of docs/concepts.md (or, with --cnn-seed, the CNN model's).

Run from the repository root (needs matplotlib, ``pip install 'dask-rpm[plot]'``)::

    python docs/make_figures.py               # writes docs/img/concepts.png
    python docs/make_figures.py --out x.png   # somewhere else
    python docs/make_figures.py --cnn-seed    # writes docs/img/cnn_seed_model.png (docs/method.md)

Three plans of the SRPM paper's worked example (abilities 0.05, 0.10, 0.20,
0.30, 0.35; network 203-80-26; 1024 samples), drawn to scale with
:func:`dask_rpm.results.plot_plan`: equal work for everyone, the SRPM plan, and
the column remap DRPM makes when P4 slows down to half its speed.

``--cnn-seed`` draws the seed's CNN time model instead (a MODEL, nothing run:
:func:`dask_rpm.bench.cnn_seed.plot_cnn_seed`), the figure
``benchmarks/cnn_seed_model.py`` also writes.
"""

from __future__ import annotations

import argparse
import os
import sys

from matplotlib.figure import Figure

from dask_rpm import make_plan
from dask_rpm.drpm.remap import column_remap
from dask_rpm.results import plot_plan, save_figure

ABILITIES = [0.05, 0.10, 0.20, 0.30, 0.35]
SHAPE = (203, 80, 26)
SAMPLES = 1024
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "img", "concepts.png")
CNN_SEED_OUT = os.path.join(os.path.dirname(OUT), "cnn_seed_model.png")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help=f"where to write the PNG (default {OUT})")
    parser.add_argument(
        "--cnn-seed",
        action="store_true",
        help=f"draw the seed's CNN time model instead (default --out {CNN_SEED_OUT})",
    )
    args = parser.parse_args()
    if args.cnn_seed:
        from dask_rpm.bench.cnn_seed import plot_cnn_seed, report  # only this figure needs it

        out = plot_cnn_seed(report(), args.out or CNN_SEED_OUT)
        print(f"wrote {out}")
        return 0
    out = args.out or OUT
    uniform = make_plan(ABILITIES, SHAPE, SAMPLES, method="uniform", dp=1)
    srpm = make_plan(ABILITIES, SHAPE, SAMPLES, method="srpm")
    slower = list(ABILITIES)
    slower[3] /= 2  # P4 slows down (another job on its node)
    remapped = column_remap(srpm, slower)
    fig = Figure(figsize=(13, 4.2), layout="constrained")
    axes = fig.subplots(1, 3)
    plot_plan(
        uniform,
        axes[0],
        title=f"equal work (heterogeneity ignored)\nimbalance {uniform.imbalance():.2f}: "
        f"P1 has 5% of the ability, 20% of the work",
    )
    plot_plan(
        srpm,
        axes[1],
        title=f"SRPM: area = ability, 2 columns\nimbalance {srpm.imbalance():.2f}, "
        f"t_comm {srpm.t_comm:.0f} elements",
    )
    plot_plan(
        remapped,
        axes[2],
        title="DRPM column remap after P4 slows to half\n"
        f"same columns, cuts moved; imbalance {remapped.imbalance():.2f}",
    )
    fig.suptitle(
        "one BP iteration = the unit square of samples x hidden units; one rectangle per worker "
        "(paper's example: abilities 0.05, 0.10, 0.20, 0.30, 0.35)",
        fontsize=11,
    )
    save_figure(fig, out, dpi=90)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
