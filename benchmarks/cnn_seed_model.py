"""MODEL: the channel-wise hybrid seed's CNN time model (its §4, Tables 1 and 2), and the rpm plan.

Nothing is run or measured: :func:`dask_rpm.bench.cnn_seed.report` evaluates
:mod:`dask_rpm.cost.cnn_model` for data parallelism, the seed's hybrids hv1-hv3
and the rectangle model's channel-split plan (rpm) at global mini-batches per
node 1, 2, ..., 256. Prints the Markdown table, the crossovers and the seed's
Fig. 10 claims checked against the model, and writes
``docs/img/cnn_seed_model.png`` (or ``--plot``); ``--json`` keeps the numbers::

    python benchmarks/cnn_seed_model.py                    # about 1 s
    python benchmarks/cnn_seed_model.py --plot /tmp/x.png --json /tmp/x.json

``dask-rpm simulate --cnn-seed`` prints the same table.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from dask_rpm.bench.cnn_seed import LABEL, markdown, plot_cnn_seed, report
from dask_rpm.cost.cnn_model import BATCHES

OUT = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), os.pardir, "docs", "img", "cnn_seed_model.png"
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plot", default=OUT, help=f"the figure (default {OUT})")
    parser.add_argument("--json", default=None, help="also write the numbers here")
    args = parser.parse_args()
    rep = report(BATCHES)
    print(markdown(rep))
    plot_cnn_seed(rep, args.plot)
    print(f"wrote {os.path.normpath(args.plot)}  ({LABEL}, not measured)", file=sys.stderr)
    if args.json:
        t = rep.table
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(
                {
                    "label": LABEL,
                    "batch_per_node": t.batches.tolist(),
                    "seconds": {n: t.seconds[i].tolist() for i, n in enumerate(t.names)},
                    "rpm_k": t.rpm_k.tolist(),
                    "crossovers": [c._asdict() for c in rep.crossovers],
                    "claims": [c._asdict() for c in rep.claims],
                },
                f,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
