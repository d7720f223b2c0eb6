"""Tutorial 1: plan rectangles - how dask_rpm splits one BP iteration over unequal workers.

No cluster needed: planning is pure arithmetic. We take the worked example of
the SRPM paper - five workers of abilities 0.05, 0.10, 0.20, 0.30, 0.35, a
203-80-26 network (NETtalk) and 1024 training samples - and

1. plan it with SRPM and look at the columns, the rectangles and the drawing;
2. read the same plan as an ``xarray.Dataset`` (units in ``attrs``);
3. see why SRPM chose 2 columns: ``t_comm`` for every column count;
4. compare with the baselines that ignore heterogeneity (``uniform``) or
   keep a regular grid (``grid-hrev``): their predicted imbalance.

Run::

    python tutorials/01_planning.py                 # prints everything
    python tutorials/01_planning.py --png plan.png  # also draws the plan (needs matplotlib)

The same from a shell: ``dask-rpm plan --abilities 0.05,0.10,0.20,0.30,0.35
--shape 203-80-26 --samples 1024``.
"""

from __future__ import annotations

import argparse

import dask_rpm
from dask_rpm.cli import draw_plan

ABILITIES = [0.05, 0.10, 0.20, 0.30, 0.35]
SHAPE = (203, 80, 26)  # n inputs, m hidden units, l outputs
SAMPLES = 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--png", help="also save a drawing of the plan here (needs matplotlib)")
    args = parser.parse_args()

    # 1. The SRPM plan. Workers are sorted by ability; columns take runs of
    #    that order, slowest first; rectangle area is proportional to ability.
    plan = dask_rpm.make_plan(ABILITIES, SHAPE, SAMPLES, method="srpm")
    print(plan)
    for c, col in enumerate(plan.columns):
        s0, s1 = plan.column_samples(c)
        print(
            f"column {c + 1}: samples [{s0}, {s1}) shared by " + ", ".join(f"P{w + 1}" for w in col)
        )
    for w in plan.planned_workers:
        r = plan.rectangle(w)
        print(
            f"  P{w + 1} (ability {ABILITIES[w]:.2f}): {r.n_samples} samples x {r.n_hidden} hidden units "
            f"= {r.area} work units ({r.area / (SAMPLES * SHAPE[1]):.1%} of the iteration)"
        )
    print()
    print(draw_plan(plan, width=60))

    # 2. The plan as labelled data.
    ds = plan.to_dataset()
    print("\nas an xarray.Dataset:")
    table = ds[["column", "sample_start", "sample_stop", "hidden_start", "hidden_stop", "load"]]
    print(table.reset_coords(drop=True).to_dataframe().round(3).to_string())
    print(
        f"units: samples in {ds.sample_start.attrs['units']!r}, rows in {ds.hidden_start.attrs['units']!r}; "
        f"load: {ds['load'].attrs['description']}"
    )

    # 3. Why two columns: the paper's communication model for every column count C.
    print("\nt_comm (elements) by number of columns:")
    for c, t in enumerate(plan.t_comm_by_columns, start=1):
        print(f"  C={c}: {t:10.1f}{'   <- chosen' if c == plan.n_columns else ''}")

    # 4. Baselines: equal work for everyone, and the regular grid of method H_rev.
    print("\npredicted imbalance (largest work share / ability share; 1.0 is perfect):")
    # (with 5 workers the regular grids can only have 1 or 5 columns)
    for method, dp in (
        ("srpm", None),
        ("uniform", 1),
        ("uniform", 5),
        ("grid-hrev", 1),
        ("grid-hrev", 5),
    ):
        other = dask_rpm.make_plan(ABILITIES, SHAPE, SAMPLES, method=method, dp=dp)
        print(
            f"  {method:<10} {other.n_columns} column(s)  imbalance {other.imbalance():.3f}  "
            f"t_comm {other.t_comm:9.1f}"
        )
    print(
        "uniform gives the slowest worker (P1, 5% of the ability) 20% of the work: it sets the pace;\n"
        "grid-hrev balances, but only with 1 or 5 columns, both costlier to communicate than SRPM's 2."
    )

    if args.png:
        from dask_rpm.results import plot_plan, save_figure

        ax = plot_plan(plan, title="SRPM plan of the paper's worked example")
        save_figure(ax.figure, args.png, dpi=100)
        print(f"\nsaved the drawing to {args.png}")


if __name__ == "__main__":
    main()
