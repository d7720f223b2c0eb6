"""``dask-rpm probe``: measure worker abilities and links from the command line.

Runs :func:`dask_rpm.probe.probe` - the real BP kernels on a block shaped like
the job's rectangles, on every worker at once, then a few worker-to-worker
transfers - and prints each worker's throughput and normalised ability, the
latency and bandwidth, and the ``dask-rpm plan`` command that plans with the
measured abilities.

Without ``--scheduler`` it probes a local cluster of workers with EMULATED
heterogeneous speeds (``--speeds``, default ``rpm.demo.speeds``, the demo's) started
for the purpose; with ``--scheduler ADDRESS`` it probes the workers of a
running cluster (e.g. SLURM worker groups of different node types).
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

from .._files import TargetError, atomic_write, check_target
from ..demo.settings import demo_settings
from ._common import CLIError, int_option, positive_option

__all__ = ["add_parser", "run", "format_probe", "probe_json"]

_DESCRIPTION = """\
Measure how fast each worker runs this job's BP kernels (its ability) and how
fast the links between workers are, then print the dask-rpm plan command that
plans with the measured abilities.

Each worker runs the real kernels on a block shaped like the job's rectangles,
all workers at once, then a few worker-to-worker transfers are timed.
Without --scheduler a local cluster of workers with EMULATED speeds is started
for the purpose (the demo's workers, rpm.demo.speeds; emulation on this
machine, not hardware); with --scheduler ADDRESS the workers of a running
cluster are probed (e.g. SLURM worker groups of different node types).
"""

_EPILOG = """\
examples:
  # probe the demo's 4 EMULATED local workers (speeds 1, 0.6, 0.4, 0.25; about 6 s)
  dask-rpm probe

  # other emulated speeds and the paper's NETtalk job, as JSON
  dask-rpm probe --speeds 1,0.6,0.4,0.25 --shape 203-80-26 --samples 1024 --json

  # the workers of a running cluster (e.g. SLURM worker groups), saving the full dataset
  dask-rpm probe --scheduler tcp://10.0.0.5:8786 --shape 203-80-26 --samples 1024 --netcdf probe.nc

  # then plan with the measured abilities (the report prints this command)
  dask-rpm plan --abilities 0.52,0.29,0.19 --shape 203-80-26 --samples 1024

Throughput is in work units per second (one hidden unit for one sample: the
unit of rectangle area). Budgets come from dask config (rpm.probe.*).
"""


def add_parser(subparsers: Any) -> None:
    """Add the ``probe`` subcommand."""
    p = subparsers.add_parser(
        "probe",
        help="measure worker abilities (BP kernel throughput) and links",
        description=_DESCRIPTION,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    where = p.add_mutually_exclusive_group()
    where.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        help="probe the workers of this running cluster (e.g. tcp://host:8786)",
    )
    where.add_argument(
        "--speeds",
        metavar="S1,S2,...",
        help="EMULATED relative speeds of the local workers (default rpm.demo.speeds, "
        "the same workers as dask-rpm train)",
    )
    p.add_argument(
        "--shape",
        default=None,
        metavar="N-M-L",
        help="the job's network inputs-hidden-outputs (default rpm.demo.shape, the train demo's)",
    )
    p.add_argument(
        "--samples",
        default=None,
        metavar="S",
        help="the job's number of training samples (default rpm.demo.samples)",
    )
    p.add_argument(
        "--repeats",
        default=None,
        metavar="K",
        help="timed repetitions per worker (default rpm.probe.repeats)",
    )
    p.add_argument(
        "--max-seconds",
        default=None,
        metavar="T",
        help="kernel-probe budget per worker in seconds (default rpm.probe.max-seconds)",
    )
    p.add_argument(
        "--timeout",
        default="30",
        metavar="T",
        help="seconds to wait for --scheduler to answer (default 30)",
    )
    p.add_argument("--netcdf", metavar="PATH", help="also save the full probe dataset as netCDF")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.set_defaults(func=run)


def _parse_speeds(text: str) -> list[float]:
    try:
        speeds = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise CLIError(
            f"--speeds={text!r} is not a comma-separated list of numbers; use e.g. 1,0.5,0.25"
        ) from None
    if not speeds or any(not math.isfinite(v) or v <= 0 for v in speeds):
        raise CLIError(f"--speeds={text!r}: give one finite speed > 0 per worker, e.g. 1,0.5,0.25")
    return speeds


def run(args: argparse.Namespace) -> int:
    """Runner of ``dask-rpm probe``."""
    demo = demo_settings(shape=args.shape)  # rpm.demo.* read once: the demo's job and workers
    shape = demo.shape
    samples = int_option("--samples", args.samples) if args.samples is not None else demo.samples
    if samples < 1:
        raise CLIError(f"--samples={samples} must be at least 1")
    repeats = positive_option("--repeats", args.repeats, int)
    max_seconds = positive_option("--max-seconds", args.max_seconds, float)
    timeout = positive_option("--timeout", args.timeout, float)
    speeds = _parse_speeds(args.speeds) if args.speeds is not None else list(demo.speeds)
    if (
        args.netcdf is not None
    ):  # before the cluster starts: a directory, a device or no place to write
        try:
            check_target(args.netcdf, what="--netcdf", overwrite=True)
        except TargetError as e:
            raise CLIError(str(e)) from None

    ds = _measure(args, shape, samples, repeats, max_seconds, timeout, speeds)
    if args.netcdf is not None:
        _write_netcdf(ds, args.netcdf)
    if args.json:
        print(json.dumps(probe_json(ds)))
    else:
        print(format_probe(ds))
        if args.netcdf is not None:
            print(f"saved the probe dataset to {args.netcdf}")
    return 0


def _measure(
    args: argparse.Namespace,
    shape: tuple[int, int, int],
    samples: int,
    repeats: int | None,
    max_seconds: float | None,
    timeout: float,
    speeds: list[float],
) -> Any:
    """The probe dataset of the cluster at ``--scheduler``, or of a local EMULATED one."""
    # imported here: they load distributed (about 0.6 s), which --help and plan need not pay
    from distributed import Client

    from ..emulation import local_cluster  # loads distributed: only when the command runs
    from ..probe import probe  # loads distributed: only when the command runs

    def measure(client: Any) -> Any:
        try:
            return probe(
                client, shape=shape, samples=samples, repeats=repeats, max_seconds=max_seconds
            )
        except ValueError as e:
            raise CLIError(str(e)) from None

    if args.scheduler is not None:
        try:
            client = Client(args.scheduler, timeout=timeout)
        except (OSError, TimeoutError, ValueError) as e:
            raise CLIError(
                f"cannot connect to scheduler {args.scheduler!r} within {timeout:g} s ({type(e).__name__}: {e}); "
                f"check the address (e.g. tcp://host:8786) or omit --scheduler to probe a local EMULATED cluster"
            ) from None
        with client:
            if not client.scheduler_info().get("workers"):
                raise CLIError(
                    f"the cluster at {args.scheduler!r} has no workers; start some and retry"
                )
            return measure(client)
    else:
        with local_cluster(speeds, dashboard_address=":0") as cluster, Client(cluster) as client:
            return measure(client)


def _write_netcdf(ds: Any, path: str) -> None:
    """Write via a temporary file in the same directory, then rename (no partial file)."""
    out = ds.copy()
    out["address"] = out["address"].astype(str)
    atomic_write(path, lambda tmp: out.to_netcdf(tmp, engine="h5netcdf"))


def _num(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def probe_json(ds: Any) -> dict[str, Any]:
    """The ``--json`` object of a probe dataset (strict JSON: NaN becomes null)."""
    thr = ds["throughput"].values
    return {
        "shape": ds.attrs.get("shape"),
        "samples": int(ds.attrs.get("samples", 0)),
        "emulation": ds.attrs.get("emulation"),
        "workers": [
            {
                "worker": int(w),
                "address": str(a),
                "throughput": _num(t),
                "ability": _num(p),
                "relative": _num(t / thr.max()) if thr.size else None,
                "overruns": int(o),
            }
            for w, a, t, p, o in zip(
                ds["worker"].values,
                ds["address"].values,
                thr,
                ds["ability"].values,
                ds["overruns"].values,
            )
        ],
        "throughput_units": ds["throughput"].attrs.get("units"),
        "latency": _num(ds.attrs.get("latency")),
        "bandwidth": _num(ds.attrs.get("bandwidth")),
        "latency_units": "s",
        "bandwidth_units": "bytes/s",
        "links": ds.attrs.get("links"),
        "probe_seconds": _num(ds.attrs.get("probe_seconds")),
        "block": {
            "hidden": int(ds.attrs["block_hidden"]),
            "samples": int(ds.attrs["block_samples"]),
        },
        "repeats": int(ds.attrs.get("repeats", 0)),
    }


def format_probe(ds: Any) -> str:
    """The probe as a table, the links, and the matching ``dask-rpm plan`` command."""
    d = probe_json(ds)
    out = []
    if d["emulation"]:
        out.append(d["emulation"])
    out.append(
        f"probe of {len(d['workers'])} worker(s) for a {d['shape']} job on {d['samples']} samples: "
        f"block of {d['block']['hidden']} hidden units x {d['block']['samples']} samples, "
        f"{d['repeats']} repetitions, {d['probe_seconds'] or float('nan'):.1f} s"
    )
    out.append("")
    width = max([len("address")] + [len(w["address"]) for w in d["workers"]])
    out.append(
        f"  {'worker':<7}{'address':<{width + 2}}{'work units/s':>14}{'ability':>9}{'relative':>10}{'overruns':>10}"
    )
    for w in d["workers"]:
        thr = "-" if w["throughput"] is None else f"{w['throughput']:.4g}"
        ab = "-" if w["ability"] is None else f"{w['ability']:.3f}"
        rel = "-" if w["relative"] is None else f"{w['relative']:.3f}"
        out.append(
            f"  P{w['worker'] + 1:<6}{w['address']:<{width + 2}}{thr:>14}{ab:>9}{rel:>10}{w['overruns']:>10}"
        )
    out.append("")
    if d["latency"] is not None and d["bandwidth"] is not None:
        out.append(
            f"links ({d['links']}): latency {d['latency'] * 1e3:.3f} ms, bandwidth {d['bandwidth'] / 1e6:.1f} MB/s"
        )
    else:
        out.append(f"links: not measured ({ds.attrs.get('link_note', 'no transfer recorded')})")
    if any(w["overruns"] for w in d["workers"]):
        out.append(
            "note: some EMULATED repetitions overran (other load on the machine set their time)"
        )
    abilities = ",".join(f"{w['ability']:.4g}" for w in d["workers"] if w["ability"] is not None)
    out.append("plan with these abilities:")
    out.append(
        f"  dask-rpm plan --abilities {abilities} --shape {d['shape']} --samples {d['samples']}"
    )
    return "\n".join(out)
