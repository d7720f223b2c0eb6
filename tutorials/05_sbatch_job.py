"""Tutorial 5: a training job file, run as a SLURM batch job with ``slurm/train.sbatch``.

Tutorial 3 drove SLURM worker groups from Python. On a cluster you would rather
describe the job in a file and submit it: the *driver* job runs
``dask-rpm train --config job.yaml``, submits the worker jobs itself, trains,
and writes one netCDF file. The script

1. writes scikit-learn's handwritten digits (1797 samples, 8x8 pixels, shipped
   with the package) as a netCDF dataset ``x(sample, input)``, ``d(sample, output)``;
2. writes a job file: a 65-24-10 network, train until the error is at most
   120 (at most 400 iterations), two worker groups (``fast``: 2 jobs,
   ``slow``: 1 job whose workers are EMULATED at half speed), checkpoints
   every 50 iterations;
3. submits ``sbatch slurm/train.sbatch job.yaml`` and prints the driver's
   log as it grows (one line per block of iterations);
4. opens the output file with xarray: weights, error history, plans, and how
   many digits the trained net classifies right;
5. holds DRPM's last ability estimates and the last plan against the groups'
   EMULATED speeds - at this small size the output says why they cannot show them.

It needs SLURM: ``sbatch`` on the PATH and ``SLURM_CONF`` pointing at a
running cluster. Without them it prints ``SKIPPED: ...`` and exits 0::

    sudo slurm/local-cluster.sh start
    export SLURM_CONF=/tmp/dask-rpm-slurm/slurm.conf
    python tutorials/05_sbatch_job.py

Takes about half a minute. ``--keep DIR`` keeps the files in ``DIR``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from types import SimpleNamespace

import numpy as np

from dask_rpm.slurm import slurm_unavailable

HERE = os.path.dirname(os.path.abspath(__file__))
SBATCH = os.path.join(HERE, os.pardir, "slurm", "train.sbatch")
PARTITIONS = os.environ.get("DASK_RPM_SLURM_PARTITIONS", "fast slow").split()


def write_digits(path: str) -> None:
    from sklearn.datasets import load_digits

    from dask_rpm.nn.data import write_dataset

    pixels, labels = load_digits(return_X_y=True)
    x = np.column_stack([pixels / 16.0, np.ones(len(pixels))])  # last input: constant 1 (the bias)
    d = np.full((len(x), 10), 0.1)
    d[np.arange(len(x)), labels] = 0.9  # one output per digit
    write_dataset(path, x, d, source="sklearn.datasets.load_digits")


JOB = """\
data: digits.nc
hidden: 24
iterations: 400
target-error: 120.0
learning-rate: 0.005
mapping: drpm
output: digits-result.nc
checkpoint: {{every: 50}}
min-workers: 3
workers:
  slurm:
    groups:
      # speed: EMULATION ONLY (one machine). On real node types leave it out.
      - {{name: fast, jobs: 2, cores: 1, memory: 1GiB, partition: {fast}, walltime: "00:10:00", speed: 1.0}}
      - {{name: slow, jobs: 1, cores: 1, memory: 1GiB, partition: {slow}, walltime: "00:10:00", speed: 0.5}}
    cluster:
      interface: lo                    # the local SLURM runs on loopback
      python: {python}
      scheduler-options: {{host: 127.0.0.1, dashboard_address: ":0"}}
      log-directory: jobs
config:
  # idle: false - a job this small runs fastest on one worker, and DRPM would leave the others
  # idle (docs/drpm.md, "Idle workers"); off here so that the run shows DRPM's speed estimates
  drpm: {{interval: 10, idle: false}}
"""


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--keep", metavar="DIR", help="write the files here and keep them")
    args = ap.parse_args()
    reason = slurm_unavailable(PARTITIONS, conf_required=True)
    if reason:
        print(f"SKIPPED: this tutorial needs SLURM: {reason}")
        return 0
    try:
        import sklearn  # noqa: F401  (its digits are the job's data)
    except ImportError:
        print("SKIPPED: this tutorial needs scikit-learn: pip install '.[sklearn]'")
        return 0
    work = args.keep or tempfile.mkdtemp(prefix="rpm-tutorial-sbatch-")
    os.makedirs(work, exist_ok=True)
    here = os.getcwd()
    os.chdir(work)
    try:
        return run(work)
    finally:
        os.chdir(here)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def run(work: str) -> int:
    """Steps 1-5 inside the working directory ``work``."""
    # 1. The data: one netCDF file every worker reads its own samples from.
    write_digits("digits.nc")
    # 2. The job file.
    with open("job.yaml", "w") as f:
        f.write(JOB.format(fast=PARTITIONS[0], slow=PARTITIONS[-1], python=sys.executable))
    print(f"job file {os.path.join(work, 'job.yaml')}:")
    for line in open("job.yaml").read().splitlines()[:9]:
        print("  " + line)

    # 3. Submit the driver. sbatch passes on this environment (PATH, SLURM_CONF);
    #    DASK_RPM names this interpreter's dask-rpm in case it is not on PATH.
    exe = os.path.join(os.path.dirname(sys.executable), "dask-rpm")
    env = dict(os.environ, DASK_RPM=exe if os.path.exists(exe) else "dask-rpm")
    cmd = ["sbatch", "--parsable", "--output=driver.out", os.path.abspath(SBATCH), "job.yaml"]
    job_id = (
        subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
        .stdout.strip()
        .split(";")[0]
    )
    print(f"\n$ sbatch --output=driver.out slurm/train.sbatch job.yaml   -> driver job {job_id}")
    shown, deadline = 0, time.monotonic() + 300
    while True:
        running = (
            job_id
            in subprocess.run(
                ["squeue", "-h", "-o", "%i"], capture_output=True, text=True
            ).stdout.split()
        )
        lines = open("driver.out").read().splitlines() if os.path.exists("driver.out") else []
        for line in lines[shown:]:
            print("  | " + line)
        shown = len(lines)
        if not running:
            break
        if time.monotonic() > deadline:
            subprocess.run(["scancel", job_id])
            print("the driver did not finish within 300 s; cancelled it")
            return 1
        time.sleep(0.5)

    # 4. The result: one netCDF file.
    import xarray as xr

    from dask_rpm import Plan
    from dask_rpm.demo.evidence import speed_check
    from dask_rpm.nn.network import Network
    from dask_rpm.nn.recipe import forward

    with (
        xr.open_dataset("digits-result.nc", engine="h5netcdf") as res,
        xr.open_dataset("digits.nc", engine="h5netcdf") as data,
    ):
        res.load()
        h = forward(data["x"].values, [res["W"].values, res["V"].values], Network())
        right = float(np.mean(h.argmax(1) == data["d"].values.argmax(1)))
    print(
        f"\noutput digits-result.nc: status {res.attrs['status']}, {res.attrs['iterations']} iterations, "
        f"error {float(res['error'][0]):.1f} -> {res.attrs['final_error']:.1f} ({res.attrs['stopped']})"
    )
    plans = [Plan.from_dict(json.loads(str(s))) for s in res["plan_json"].values]
    print(f"{len(plans)} plan(s); the last: {plans[-1]!r}")
    print(f"workers: {', '.join(str(a) for a in res['address'].values)}")
    print(f"digits classified right by the trained net: {right:.1%}")

    # 5. DRPM's estimates and the last plan against the EMULATED speeds of the groups.
    #    This job is small (1797 samples x 24 hidden units: an iteration's kernels take
    #    a few milliseconds), so expect the output to say the size cannot show them.
    speed_of = {"fast": 1.0, "slow": 0.5}
    group = dict(zip(map(str, res["address"].values), map(str, res["group"].values)))
    last = plans[-1]
    if list(last.workers) == [str(a) for a in res["address"].values]:
        run = SimpleNamespace(plan=last, history=res)
        print("the run against the EMULATED speeds:")
        for line in speed_check(run, [speed_of[group[a]] for a in last.workers]).lines():
            print("  " + line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
