"""GPUs in the cluster (issue 25): which GPU each worker sees, SLURM groups with ``gpus:``,
``local_cluster(gpus=N)``.

No GPU is needed: a worker's GPU is its ``CUDA_VISIBLE_DEVICES``, which the tests read in
real worker processes. The GPU entries a job or a machine has are given the way SLURM or a
user gives them, through ``CUDA_VISIBLE_DEVICES`` in the environment the workers start
from, so the real nannies and job scripts do the assignment. The local SLURM has no GPUs
configured: GPU groups' job scripts are checked as text and run with ``bash`` against the
cluster's scheduler (what ``sbatch`` would run), and a CPU group goes through real SLURM.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from distributed import Client, Scheduler, Worker

import dask_rpm
from dask_rpm.emulation import emulation_info
from dask_rpm.job import JobError, load_job
from dask_rpm.nn.data import write_dataset
from dask_rpm.runtime.gpus import (
    CUDA_ENV,
    GPUS_ENV,
    WORKER_GPU_ENV,
    GPUAssignmentError,
    assign_gpu,
    job_gpus,
    local_gpus,
    machine_gpu_count,
    visible_entries,
    worker_position,
)
from dask_rpm.slurm import (
    GPU_KEY,
    GROUP_KEY,
    HeterogeneousSLURMCluster,
    SlurmConfigError,
    WorkerGroup,
)
from dask_rpm.slurm.gpu import gpu_exports, gres_directives, with_gpu_resource, worker_gpu

ROOT = Path(__file__).resolve().parents[1]
LOCAL = dict(
    interface="lo",
    scheduler_options={"host": "127.0.0.1", "dashboard_address": ":0"},
    python=sys.executable,
)


# run on the workers; a lambda travels by value (workers started from a job script cannot
# import this test module)
_cuda_visible = lambda: __import__("os").environ.get("CUDA_VISIBLE_DEVICES")  # noqa: E731


# --------------------------------------------------------------------------
# The assignment, as pure functions
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, entries",
    [
        ("0,1", ("0", "1")),
        (" 2 , 3 ", ("2", "3")),
        ("", ()),
        ("-1", ()),
        ("NoDevFiles", ()),
        ("1,-1,2", ("1",)),  # CUDA stops at the first invalid entry
        (
            "GPU-8a1b2c3d-aaaa-bbbb-cccc-0123456789ab,1",
            ("GPU-8a1b2c3d-aaaa-bbbb-cccc-0123456789ab", "1"),
        ),
        ("MIG-4b2c/1/0", ("MIG-4b2c/1/0",)),
    ],
)
def test_visible_entries_read_as_cuda_reads_them(value, entries):
    assert visible_entries(value) == entries


def test_job_gpus_prefers_cuda_visible_devices_then_slurm():
    # slurmd sets CUDA_VISIBLE_DEVICES in the job's own numbering (0,1 under cgroups) ...
    assert job_gpus({CUDA_ENV: "0,1", "SLURM_JOB_GPUS": "2,3"}) == ("0", "1")
    # ... and where it does not, SLURM_JOB_GPUS / SLURM_STEP_GPUS name the node's indices
    assert job_gpus({"SLURM_JOB_GPUS": "2,3"}) == ("2", "3")
    assert job_gpus({"SLURM_STEP_GPUS": "5"}) == ("5",)
    assert job_gpus({CUDA_ENV: ""}) == ()
    assert job_gpus({}) is None


def test_worker_position_from_dask_jobqueue_names():
    # dask worker --name <job> --nworkers N names its processes <job>-0 .. <job>-(N-1)
    assert worker_position("gpu-3", 1) == 0
    assert worker_position("gpu-3-0", 2) == 0
    assert worker_position("gpu-3-1", 2) == 1
    assert worker_position("gpu-dummy-1", 2) == 1
    for bad in ("gpu-3", "gpu-3-2", "tcp://127.0.0.1:1"):
        with pytest.raises(GPUAssignmentError, match="--nworkers 2"):
            worker_position(bad, 2)


def test_assign_gpu_gives_each_worker_of_a_job_its_own():
    assert [assign_gpu(k, 2, ("3", "5")) for k in range(2)] == ["3", "5"]
    assert [assign_gpu(k, 4, None) for k in range(4)] == ["0", "1", "2", "3"]
    assert assign_gpu(0, 1, ("GPU-abc",)) == "GPU-abc"
    with pytest.raises(GPUAssignmentError, match=r"sees 1 GPU\(s\).*--gres=gpu:2"):
        assign_gpu(1, 2, ("0",))


def test_worker_gpu_reads_the_job_environment():
    job = {GPUS_ENV: "2", CUDA_ENV: "6,7"}
    assert [worker_gpu(f"gpu-0-{k}", job) for k in range(2)] == ["6", "7"]
    assert worker_gpu("gpu-0", {GPUS_ENV: "1", "SLURM_JOB_GPUS": "4"}) == "4"
    assert worker_gpu("gpu-0-1", {GPUS_ENV: "2"}) == "1"  # nothing says: 0 .. N-1
    assert worker_gpu("cpu-0", {}) is None
    assert worker_gpu("cpu-0", {GPUS_ENV: "0"}) is None
    with pytest.raises(SlurmConfigError, match="whole number"):
        worker_gpu("gpu-0", {GPUS_ENV: "two"})


def test_local_gpus_are_this_process_s_visible_ones_else_the_machine_s():
    assert local_gpus({CUDA_ENV: "4,6"}, lambda: 8) == ("4", "6")
    assert local_gpus({CUDA_ENV: ""}, lambda: 8) == ()
    assert local_gpus({}, lambda: 2) == ("0", "1")


def test_gres_and_resource_merging():
    assert gres_directives(0, ["--exclusive"]) == ["--exclusive"]
    assert gres_directives(2, ["--exclusive"]) == ["--gres=gpu:2", "--exclusive"]
    # sbatch keeps only the last --gres: the GPUs join it
    assert gres_directives(2, ["--gres=nvme:1"]) == ["--gres=gpu:2,nvme:1"]
    assert gres_directives(1, ["--gres nvme:1"]) == ["--gres=gpu:1,nvme:1"]
    assert with_gpu_resource(["--lifetime=5m"]) == ["--lifetime=5m", "--resources", "GPU=1"]
    assert with_gpu_resource(["--resources", "mem=2"]) == ["--resources", "mem=2,GPU=1"]
    assert with_gpu_resource(["--resources=mem=2"]) == ["--resources=mem=2,GPU=1"]
    assert with_gpu_resource(["--resources mem=2"]) == ["--resources mem=2,GPU=1"]
    assert gpu_exports(2) == [f"export {GPUS_ENV}=2"]
    assert gpu_exports(0) == [f"export {CUDA_ENV}=''"]


# --------------------------------------------------------------------------
# SLURM groups with gpus:
# --------------------------------------------------------------------------


def test_gpu_group_runs_one_worker_per_gpu():
    g = WorkerGroup("gpu", gpus=2, cores=8, memory="16GiB")
    assert (g.gpus, g.processes) == (2, 2)
    assert WorkerGroup.from_dict(g.to_dict()) == g
    assert WorkerGroup("gpu", gpus=2, processes=2, cores=8) == WorkerGroup("gpu", gpus=2, cores=8)
    assert (WorkerGroup("cpu").gpus, WorkerGroup("cpu").processes) == (0, 1)
    assert WorkerGroup("cpu", cores=4, processes=4).processes == 4


@pytest.mark.parametrize(
    "spec, words",
    [
        ({"gpus": -1}, ["gpus=-1 is invalid", "integer >= 0", "--gres=gpu:N", "Give e.g. gpus=2"]),
        ({"gpus": 1.5}, ["gpus=1.5 is invalid", "integer >= 0"]),
        ({"gpus": "2"}, ["gpus='2' is invalid", "integer >= 0"]),
        ({"gpus": True}, ["gpus=True is invalid"]),
        (
            {"gpus": 2, "cores": 4, "processes": 4},
            [
                "processes=4 is invalid",
                "one worker process per GPU",
                "must be 2",
                "Leave processes out",
                "gpus=4",
            ],
        ),
        (
            {"gpus": 2, "cores": 4, "processes": 1},
            ["processes=1 is invalid", "must be 2"],
        ),
        ({"gpus": 2, "cores": 3}, ["cores=3 is invalid", "multiple of 2", "cores=2"]),
        (
            {"gpus": 1, "job-extra-directives": ["--gres=gpu:1"]},
            ["'--gres=gpu:1'", "gpus field", "Remove '--gres=gpu:1'"],
        ),
        ({"job-extra-directives": ["--gres=gpu:a100:2"]}, ["'--gres=gpu:a100:2'", "set gpus: N"]),
        ({"job-extra-directives": ["--gpus=2"]}, ["'--gpus=2'", "gpus field"]),
        ({"job-extra-directives": ["-G 1"]}, ["'-G 1'"]),
        (
            {"gpus": 1, "worker-extra-args": ["--resources", "GPU=2"]},
            ["--resources GPU=2", "follows the group's gpus"],
        ),
        ({"gpus": 1, "speed": 0.5}, ["speed=0.5 is invalid", "runs REAL", "Leave speed unset"]),
    ],
)
def test_invalid_gpu_groups_explain_what_and_how(spec, words):
    with pytest.raises(SlurmConfigError) as info:
        WorkerGroup.from_dict({"name": "g", **spec})
    for w in words:
        assert w in str(info.value), str(info.value)


def test_other_generic_resources_stay_allowed():
    g = WorkerGroup("g", gpus=1, cores=2, job_extra_directives=["--gres=nvme:1"])
    assert g.job_extra_directives == ("--gres=nvme:1",)


def _job_file(tmp_path: Path, group: dict) -> Path:
    data = tmp_path / "data.nc"
    write_dataset(data, np.ones((8, 3)), np.zeros((8, 2)))
    job = {
        "data": str(data),
        "hidden": 4,
        "iterations": 2,
        "learning-rate": 0.01,
        "output": "out.nc",
        "workers": {"slurm": {"groups": [group]}},
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def test_job_files_take_gpus_and_check_it(tmp_path):
    ok = {"name": "gpu", "gpus": 2, "cores": 4, "memory": "8GiB", "partition": "gpu"}
    job = load_job(_job_file(tmp_path, ok))
    (group,) = job.workers["slurm"]["groups"]
    assert (group.gpus, group.processes) == (2, 2)
    assert job.expected_workers == 2
    for bad, needle in [
        ({**ok, "gpus": -2}, "gpus=-2 is invalid; expected an integer >= 0"),
        ({**ok, "gpus": "two"}, "gpus='two' is invalid"),
        ({**ok, "processes": 1}, "processes=1 is invalid; with gpus=2"),
        ({**ok, "gpu": 2}, "Did you mean 'gpus'"),
    ]:
        with pytest.raises(JobError) as info:
            load_job(_job_file(tmp_path, bad))
        assert "workers.slurm.groups" in str(info.value) and needle in str(info.value)


def _groups() -> list[WorkerGroup]:
    return [
        WorkerGroup("gpu", gpus=2, cores=2, memory="2GiB", queue="gpu", walltime="00:20:00"),
        WorkerGroup("cpu", cores=1, memory="1GiB", queue="cpu", walltime="00:20:00"),
    ]


def test_gpu_job_script_header_and_worker_command():
    with HeterogeneousSLURMCluster(_groups(), submit=False, **LOCAL) as cluster:
        gpu, cpu = cluster.job_script("gpu"), cluster.job_script("cpu")
    assert "#SBATCH --gres=gpu:2" in gpu
    assert "#SBATCH --cpus-per-task=2" in gpu
    assert "--nworkers 2" in gpu and "--nthreads 1" in gpu  # one process per GPU
    assert "--resources GPU=1" in gpu
    assert "--preload-nanny dask_rpm.slurm" in gpu and "--preload dask_rpm.slurm" in gpu
    assert f"export {GPUS_ENV}=2" in gpu and f"export {CUDA_ENV}" not in gpu
    # the header's directives all come before the first command
    assert gpu.index("#SBATCH --gres=gpu:2") < gpu.index("export ")

    assert "gres" not in cpu and "GPU=1" not in cpu and "--nworkers" not in cpu
    assert "--preload-nanny" not in cpu
    assert f"export {CUDA_ENV}=''" in cpu


def test_gpu_job_script_joins_the_site_s_gres_and_resources():
    g = WorkerGroup(
        "gpu",
        gpus=4,
        cores=8,
        job_extra_directives=["--gres=nvme:1"],
        worker_extra_args=["--resources", "scratch=1"],
    )
    with HeterogeneousSLURMCluster([g], submit=False, **LOCAL) as cluster:
        script = cluster.job_script()
    assert "#SBATCH --gres=gpu:4,nvme:1" in script and script.count("--gres") == 1
    assert "--resources scratch=1,GPU=1" in script and script.count("--resources") == 1
    assert "--nworkers 4" in script and "--nthreads 2" in script


def test_job_scripts_run_give_each_worker_its_own_gpu_and_cpu_workers_none():
    """Each job script as sbatch would run it, where SLURM gave the GPU job GPUs 3 and 5."""
    with (
        HeterogeneousSLURMCluster(_groups(), submit=False, **LOCAL) as cluster,
        Client(cluster) as client,
    ):
        env = {
            **os.environ,
            CUDA_ENV: "3,5",  # what slurmd sets for the job (and a CPU node may have GPUs too)
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        }
        jobs = [
            subprocess.Popen(
                ["bash", "-c", script],
                env=env,
                start_new_session=True,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for script in cluster.job_scripts().values()
        ]
        try:
            client.wait_for_workers(3, timeout=90)
            seen = client.run(_cuda_visible)
            info = client.scheduler_info()["workers"]
        finally:
            for job in jobs:
                os.killpg(job.pid, signal.SIGTERM)
            for job in jobs:
                job.wait(timeout=60)
    by_name = {
        w["name"]: (seen[addr], w.get("resources", {}), w.get(GPU_KEY)) for addr, w in info.items()
    }
    assert by_name == {
        "gpu-dummy-0": ("3", {"GPU": 1.0}, "3"),
        "gpu-dummy-1": ("5", {"GPU": 1.0}, "5"),
        "cpu-dummy": ("", {}, None),
    }
    assert sorted(w[GROUP_KEY] for w in info.values()) == ["cpu", "gpu", "gpu"]


def test_a_worker_without_a_nanny_takes_its_gpu_itself(monkeypatch):
    """``dask worker --no-nanny``: the worker's own preload sets its GPU, in its process."""
    monkeypatch.setenv(CUDA_ENV, "0,1")
    monkeypatch.setenv(GPUS_ENV, "2")
    monkeypatch.setenv(WORKER_GPU_ENV, "")  # recorded, so the value the preload sets is undone
    monkeypatch.delenv(WORKER_GPU_ENV)

    async def main() -> tuple[str, str, str]:
        async with Scheduler(dashboard_address=":0", host="127.0.0.1") as s:
            async with Worker(s.address, name="gpu-7-1", preload=["dask_rpm.slurm"]) as w:
                return (
                    os.environ[CUDA_ENV],
                    os.environ[WORKER_GPU_ENV],
                    s.workers[w.address].extra[GPU_KEY],
                )

    assert asyncio.run(main()) == ("1", "1", "1")


@pytest.mark.slurm
def test_a_cpu_group_on_real_slurm_sees_no_gpu(slurm_cluster, tmp_path, monkeypatch):
    monkeypatch.setenv(CUDA_ENV, "0")  # what the submitting shell has must not leak into the job
    group = WorkerGroup("cpu", cores=1, memory="512MiB", queue=slurm_cluster.partitions[0])
    with (
        HeterogeneousSLURMCluster(
            [group], log_directory=str(tmp_path / "jobs"), **LOCAL
        ) as cluster,
        Client(cluster) as client,
    ):
        assert cluster.wait_for_groups(timeout=120) == {"cpu": 1}
        assert list(client.run(_cuda_visible).values()) == [""]


# --------------------------------------------------------------------------
# local_cluster(gpus=N)
# --------------------------------------------------------------------------


def test_local_cluster_cpu_workers_see_no_gpu_and_gpus_0_is_as_before():
    with (
        dask_rpm.local_cluster([1.0, 0.5], dashboard_address=None) as cluster,
        Client(cluster) as client,
    ):
        assert set(client.run(_cuda_visible).values()) == {""}
        assert cluster.gpu_devices == {} and cluster.emulation_metadata["gpus"] == {}
        assert cluster.emulation_label.startswith(
            "EMULATED heterogeneity on one machine: speeds 1.0, 0.5 x scale"
        )
        assert all(v is not None for v in emulation_info(client).values())  # every worker paced
        assert all(w["resources"] == {} for w in client.scheduler_info()["workers"].values())


def test_local_cluster_asking_for_more_gpus_than_the_machine_has_is_a_clear_error(monkeypatch):
    monkeypatch.delenv(CUDA_ENV, raising=False)
    have = machine_gpu_count()  # 0 on a machine without GPUs
    with pytest.raises(ValueError) as info:
        dask_rpm.local_cluster([1.0] * (have + 1), gpus=have + 1)
    text = str(info.value)
    assert f"local_cluster(gpus={have + 1}) asks for {have + 1} GPU(s)" in text
    assert f"this machine has {have}" in text and "nvidia-smi -L" in text
    assert "use gpus=0 (CPU workers only)" in text or f"use gpus={have} or fewer" in text


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        ({"gpus": -1}, "expected an integer >= 0"),
        ({"gpus": 1.0}, "expected an integer >= 0"),
        ({"gpus": 3}, "with 2 worker(s): the first 3 workers get a GPU each"),
        ({"gpus": 1, "processes": False}, "use processes=True"),
        ({"gpus": 1, "schedule": {0: [(5, 0.5)]}}, "schedule workers 1 and up"),
        ({"gpus": 1, "env": {CUDA_ENV: "1"}}, "remove it from env"),
    ],
)
def test_local_cluster_gpus_errors(monkeypatch, kwargs, needle):
    monkeypatch.setenv(CUDA_ENV, "0")  # one GPU visible, so only the argument is wrong
    with pytest.raises(ValueError) as info:
        dask_rpm.local_cluster([1.0, 0.5], **kwargs)
    assert needle in str(info.value)


def test_local_cluster_gpu_workers_get_their_gpu_and_run_real(monkeypatch):
    """Two GPUs visible to this process (as CUDA_VISIBLE_DEVICES shows them): workers 0, 1."""
    monkeypatch.setenv(CUDA_ENV, "4,6")
    with (
        dask_rpm.local_cluster([1.0, 1.0, 0.5], gpus=2, dashboard_address=None) as cluster,
        Client(cluster) as client,
    ):
        addresses = cluster.worker_addresses()
        seen = client.run(_cuda_visible)
        info = client.scheduler_info()["workers"]
        emulated = emulation_info(client)
    assert [seen[a] for a in addresses] == ["4", "6", ""]
    assert [info[a]["resources"] for a in addresses] == [{"GPU": 1.0}, {"GPU": 1.0}, {}]
    # the GPU workers are not paced (REAL); the CPU worker keeps its EMULATED speed
    assert emulated[addresses[0]] is None and emulated[addresses[1]] is None
    assert emulated[addresses[2]]["speed"] == 0.5
    assert cluster.gpu_devices == {0: "4", 1: "6"}
    assert cluster.emulation_metadata["gpus"] == {"0": "4", "1": "6"}
    assert "speeds 0.5 x scale" in cluster.emulation_label
    assert "; workers 0, 1 on GPUs 4, 6: REAL, unpaced (the speeds are worker 2's)" in (
        cluster.emulation_label
    )


def test_local_cluster_of_gpu_workers_only_says_real(monkeypatch):
    monkeypatch.setenv(CUDA_ENV, "GPU-aaaa")
    with dask_rpm.local_cluster([1.0], gpus=1, dashboard_address=None) as cluster:
        assert (
            cluster.emulation_label == "REAL, unpaced, no EMULATED worker: worker 0 on GPU GPU-aaaa"
        )
