"""Tutorial 3: train on SLURM worker groups of different node types.

On a real site the groups would be partitions of different node types. Here
we use the private single-node SLURM of ``slurm/local-cluster.sh`` (two
partitions, ``fast`` and ``slow``, on loopback) and make the difference by
EMULATION: the ``slow`` group's workers run the BP kernels at half speed.

The script

1. describes two worker groups and prints the job script SLURM receives for one;
2. starts ``dask_rpm.slurm.HeterogeneousSLURMCluster``: one Dask scheduler
   here, the workers as SLURM jobs (``squeue`` shows them while it runs);
3. trains a 32-256-8 network on 4096 samples with ``dask_rpm.fit`` (DRPM),
   prints the plan with each rectangle's worker group, and holds DRPM's
   estimates and the plan against the EMULATED speeds (within 10 %, or why
   not); an iteration is mostly computation at this size, so the timings
   show the speeds;
4. closes the cluster, which cancels its jobs, and removes the job logs
   (``--keep-logs`` keeps them).

It needs SLURM: ``sbatch`` on the PATH and ``SLURM_CONF`` pointing at a
running cluster. Without them it prints ``SKIPPED: ...`` with the reason and
exits 0. To start the local one::

    sudo slurm/local-cluster.sh start
    export SLURM_CONF=/tmp/dask-rpm-slurm/slurm.conf
    python tutorials/03_slurm.py

Takes about 6 seconds on 2 cores (measured; mostly waiting for the jobs to start).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile

import numpy as np

from dask_rpm.slurm import slurm_unavailable

PARTITIONS = os.environ.get("DASK_RPM_SLURM_PARTITIONS", "fast slow").split()


def make_data(
    samples: int = 4096, inputs: int = 32, outputs: int = 8, seed: int = 3
) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(samples, inputs))
    x[:, -1] = 1.0
    d = (x @ rng.normal(size=(inputs, outputs)) > 0).astype(float)
    return x, d


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--keep-logs", action="store_true", help="keep the SLURM job logs (printed path)"
    )
    args = ap.parse_args()
    reason = slurm_unavailable(PARTITIONS, conf_required=True)
    if reason:
        print(f"SKIPPED: this tutorial needs SLURM: {reason}")
        return 0
    logs = tempfile.mkdtemp(prefix="rpm-tutorial-slurm-")
    try:
        return run(logs)
    finally:
        if not args.keep_logs:
            shutil.rmtree(logs, ignore_errors=True)


def run(logs: str) -> int:
    from distributed import Client

    import dask_rpm
    from dask_rpm.demo.evidence import overrun_counts, plan_speeds, speed_check
    from dask_rpm.emulation import emulation_info
    from dask_rpm.slurm import HeterogeneousSLURMCluster, WorkerGroup

    fast_p, slow_p = PARTITIONS[0], PARTITIONS[-1]
    # 1. Two node types = two groups. `speed` is EMULATION ONLY (one machine);
    #    on real hardware leave it unset and let DRPM measure the abilities.
    groups = [
        WorkerGroup(
            "fast", jobs=1, cores=1, memory="1GiB", queue=fast_p, walltime="00:10:00", speed=1.0
        ),
        WorkerGroup(
            "slow", jobs=2, cores=1, memory="1GiB", queue=slow_p, walltime="00:10:00", speed=0.5
        ),
    ]
    options = dict(
        interface="lo",
        scheduler_options={"host": "127.0.0.1", "dashboard_address": ":0"},
        python=sys.executable,
        log_directory=logs,
    )
    with HeterogeneousSLURMCluster(groups, submit=False, **options) as dry:
        script = dry.job_script("slow")
    print("the job script of the 'slow' group (first lines):")
    for line in script.splitlines()[:8]:
        print("  " + line)

    # 2. Start the jobs; wait until every group has its workers.
    x, d = make_data()
    with HeterogeneousSLURMCluster(groups, **options) as cluster:
        print(
            f"\nsubmitted {cluster.requested_jobs()} jobs; job logs in {logs} (removed at the end unless --keep-logs)"
        )
        print("workers per group:", cluster.wait_for_groups(timeout=180))
        with Client(cluster) as client:
            label = dask_rpm.emulation.emulation_label(client)
            print(label or "no emulation: real hardware")
            # 3. Train: DRPM estimates each worker's ability and remaps.
            result = dask_rpm.fit(
                x, d, hidden=256, iterations=60, learning_rate=1e-4, client=client
            )
            print(result)
            info = emulation_info(client)
            groups_of = cluster.worker_groups()
            print("final plan (samples x hidden units per worker):")
            for w, address in enumerate(result.plan.workers):  # worker order, as the checks below
                r = result.plan.rectangle(w)
                print(f"  {groups_of.get(address, '?'):<5} {address}: {r.n_samples} x {r.n_hidden}")
            for rec in result.remaps:
                print(f"remap at iteration {rec['iteration']}: {rec['kind']}")
            print(f"error {float(result.history['error'][0]):.1f} -> {result.error:.1f}")
            print("the run against the EMULATED speeds:")
            blocks, overruns = overrun_counts(info)
            for line in speed_check(
                result, plan_speeds(result.plan, info), blocks=blocks, overruns=overruns
            ).lines():
                print("  " + line)
    # 4. Leaving the `with` block cancelled the jobs.
    print("cluster closed: its SLURM jobs are cancelled")
    if os.path.exists(os.path.join(os.path.dirname(__file__), os.pardir, "slurm", "train.sbatch")):
        print("to run training itself as a batch job, see slurm/train.sbatch")
    return 0


if __name__ == "__main__":
    sys.exit(main())
