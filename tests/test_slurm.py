"""Heterogeneous SLURM provisioning (dask_rpm.slurm).

Unmarked tests need no SLURM: they check groups, validation, the generated job
scripts and the cluster's bookkeeping with a stand-in job class. Tests marked
``slurm`` submit real jobs to the local SLURM of ``slurm/local-cluster.sh``
(the ``slurm_cluster`` fixture starts it).
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import dask.config
import numpy as np
import pytest
from dask_jobqueue.slurm import SLURMJob
from distributed import Client

from dask_rpm import fit
from dask_rpm.emulation import emulation_label
from dask_rpm.slurm import (
    GROUP_ENV,
    GROUP_KEY,
    SPEED_ENV,
    SPEED_KEY,
    HeterogeneousSLURMCluster,
    SlurmConfigError,
    WorkerGroup,
    dask_setup,
    group_from_name,
    load_groups,
    slurm_unavailable,
)
from dask_rpm.slurm.replacement import ReplacementBudget, ended_jobs

# Loopback only, random dashboard port: never clash with other test sessions.
LOCAL = dict(
    interface="lo",
    scheduler_options={"host": "127.0.0.1", "dashboard_address": ":0"},
    python=sys.executable,
)


def two_groups(**fast_extra) -> list[WorkerGroup]:
    return [
        WorkerGroup(
            "fast",
            jobs=1,
            cores=2,
            memory="1GiB",
            queue="fast",
            walltime="00:20:00",
            job_extra_directives=["--exclusive", "--comment=rpm-test"],
            job_script_prologue=["echo prologue-of-fast"],
            **fast_extra,
        ),
        WorkerGroup(
            "slow", jobs=1, cores=2, processes=2, memory="2GiB", queue="slow", account="proj1"
        ),
    ]


# --------------------------------------------------------------------------
# Groups and validation
# --------------------------------------------------------------------------


def test_from_dict_accepts_yaml_keys_and_partition_alias():
    g = WorkerGroup.from_dict(
        {
            "name": "fast",
            "jobs": 3,
            "cores": 4,
            "memory": "8GiB",
            "partition": "gpu",
            "job-extra-directives": ["--exclusive"],
            "job-script-prologue": ["module load x"],
            "worker-extra-args": ["--lifetime=55m"],
        }
    )
    assert g.queue == "gpu"
    assert g.job_extra_directives == ("--exclusive",)
    assert g.worker_extra_args == ("--lifetime=55m",)
    assert g.speed is None
    assert WorkerGroup.from_dict(g.to_dict()) == g


@pytest.mark.parametrize(
    "spec, words",
    [
        ({"name": "a-b"}, ["'a-b'", "'a_b'"]),
        ({"name": "x", "cors": 2}, ["'cors'", "Did you mean 'cores'"]),
        ({"cores": 2}, ["no 'name'"]),
        ({"name": "x", "cores": 0}, ["cores=0", ">= 1"]),
        ({"name": "x", "jobs": -1}, ["jobs=-1"]),
        ({"name": "x", "cores": 4, "processes": 3}, ["processes=3", "divide cores=4"]),
        ({"name": "x", "memory": "lots"}, ["memory='lots'", "4GiB"]),
        ({"name": "x", "walltime": 43200}, ["walltime=43200", "quote"]),
        ({"name": "x", "walltime": "1h"}, ["walltime='1h'", "HH:MM:SS"]),
        (
            {"name": "x", "job_extra_directives": "--exclusive"},
            ["list of strings", "['--exclusive']"],
        ),
        (
            {"name": "x", "job_extra_directives": ["#SBATCH --exclusive"]},
            ["#SBATCH", "'--exclusive'"],
        ),
        (
            {"name": "x", "worker_extra_args": ["--nthreads", "4"]},
            ["--nthreads", "set from the group"],
        ),
        ({"name": "x", "speed": 0}, ["speed=0", "real hardware"]),
        ({"name": "x", "queue": "a", "partition": "b"}, ["given twice", "queue"]),
        ({"name": "x", "queue": "two words"}, ["queue='two words'"]),
    ],
)
def test_invalid_groups_explain_what_and_how(spec, words):
    with pytest.raises(SlurmConfigError) as info:
        WorkerGroup.from_dict(spec)
    for w in words:
        assert w in str(info.value)


def test_load_groups_from_config_at_call_time():
    with dask.config.set(
        {"rpm.slurm.groups": [{"name": "a", "cores": 2}, {"name": "b", "partition": "slow"}]}
    ):
        groups = load_groups()
    assert [g.name for g in groups] == ["a", "b"]
    assert groups[1].queue == "slow"
    # Python wins over config.
    assert [g.name for g in load_groups([WorkerGroup("c")])] == ["c"]


@pytest.mark.parametrize(
    "groups, words",
    [
        ([], ["no worker groups", "rpm.slurm.groups"]),
        ([{"name": "a"}, {"name": "a"}], ["unique", "'a'"]),
        ({"name": "a"}, ["list of groups"]),
        (["fast"], ["mapping"]),
    ],
)
def test_load_groups_errors(groups, words):
    with pytest.raises(SlurmConfigError) as info:
        load_groups(groups)
    for w in words:
        assert w in str(info.value)


def test_group_from_name():
    groups = ["fast", "fast_gpu", "slow"]
    assert group_from_name("fast-0", groups) == "fast"
    assert group_from_name("fast_gpu-12", groups) == "fast_gpu"
    assert group_from_name("slow-3-1", groups) == "slow"
    assert group_from_name("slowish-0", groups) is None
    assert group_from_name("fast-", groups) is None
    assert group_from_name("tcp://127.0.0.1:1234", groups) is None


def test_worker_preload_reports_group_and_speed(monkeypatch):
    class FakeWorker:
        startup_information: dict = {}

    w = FakeWorker()
    w.startup_information = {}
    monkeypatch.setenv(GROUP_ENV, "slow")
    monkeypatch.setenv(SPEED_ENV, "0.5")
    dask_setup(w)
    assert {k: f(w) for k, f in w.startup_information.items()} == {
        GROUP_KEY: "slow",
        SPEED_KEY: 0.5,
    }

    w.startup_information = {}
    monkeypatch.delenv(GROUP_ENV)
    monkeypatch.delenv(SPEED_ENV)
    dask_setup(w)
    assert w.startup_information == {}


# --------------------------------------------------------------------------
# The cluster without SLURM
# --------------------------------------------------------------------------


def test_job_scripts_per_group_without_slurm():
    groups = two_groups(speed=0.5)
    with HeterogeneousSLURMCluster(groups, submit=False, **LOCAL) as cluster:
        scripts = cluster.job_scripts()
        assert cluster.requested_jobs() == {"fast": 0, "slow": 0}
        address = cluster.scheduler.address
    assert set(scripts) == {"fast", "slow"}
    fast, slow = scripts["fast"], scripts["slow"]

    assert "#SBATCH -J dask-rpm-fast" in fast
    assert "#SBATCH -p fast" in fast
    assert "#SBATCH --cpus-per-task=2" in fast
    assert "#SBATCH --mem=1G" in fast
    assert "#SBATCH -t 00:20:00" in fast
    assert "#SBATCH --exclusive" in fast and "#SBATCH --comment=rpm-test" in fast
    assert "echo prologue-of-fast" in fast
    assert f"export {GROUP_ENV}=fast" in fast
    assert f"export {SPEED_ENV}=0.5" in fast
    assert "--name fast-dummy" in fast and "--nthreads 2" in fast
    assert "--preload dask_rpm.slurm" in fast and "--preload dask_rpm.emulation" in fast
    assert "--interface lo" in fast and address in fast and sys.executable in fast
    # The group's own exports come before its prologue, so the prologue may use them.
    assert fast.index(f"export {GROUP_ENV}") < fast.index("echo prologue-of-fast")

    assert "#SBATCH -p slow" in slow and "#SBATCH -A proj1" in slow
    assert "#SBATCH --mem=2G" in slow
    assert "--nworkers 2" in slow and "--nthreads 1" in slow
    assert f"export {GROUP_ENV}=slow" in slow
    # Nothing of the other group leaks in; no emulation on a group without speed.
    for leak in ("--exclusive", "prologue-of-fast", SPEED_ENV, "dask_rpm.emulation", "-p fast"):
        assert leak not in slow


def test_site_wide_jobqueue_lists_are_kept():
    site = {
        "jobqueue.slurm.job-extra-directives": ["--qos=normal"],
        "jobqueue.slurm.job-script-prologue": ["source /site/env.sh"],
        "jobqueue.slurm.worker-extra-args": ["--lifetime=50m"],
    }
    with dask.config.set(site):
        with HeterogeneousSLURMCluster(two_groups(), submit=False, **LOCAL) as cluster:
            fast = cluster.job_script("fast")
    assert "#SBATCH --qos=normal" in fast and "#SBATCH --exclusive" in fast
    assert "source /site/env.sh" in fast and "--lifetime=50m" in fast
    assert fast.count("--lifetime") == 1  # the site's lifetime wins over the one from the walltime


def test_worker_lifetime_comes_from_the_walltime_unless_given():
    """Workers retire before the walltime kills them (dask_rpm.engine.retirement moves their rows first)."""
    groups = [
        WorkerGroup("a", walltime="00:20:00"),
        WorkerGroup("b", walltime="12:00:00"),
        WorkerGroup("c", walltime="00:20:00", lifetime="7m"),
        WorkerGroup("d", walltime="1", lifetime=False),
    ]
    with HeterogeneousSLURMCluster(groups, submit=False, **LOCAL) as cluster:
        s = cluster.job_scripts()
    assert "--lifetime 1080s" in s["a"]  # 20 min - 10 %
    assert "--lifetime 42900s" in s["b"]  # 12 h - 5 min (at most)
    assert "--lifetime 7m" in s["c"] and "--lifetime" not in s["d"]
    with pytest.raises(SlurmConfigError, match="lifetime='soon'.*expected a duration"):
        WorkerGroup("e", lifetime="soon")
    with pytest.raises(SlurmConfigError, match="worker_extra_args already has --lifetime"):
        WorkerGroup("f", lifetime="5m", worker_extra_args=["--lifetime=6m"])


def test_groups_from_config_and_job_script_choice():
    with dask.config.set({"rpm.slurm.groups": [{"name": "only", "cores": 2, "memory": "2GiB"}]}):
        with HeterogeneousSLURMCluster(submit=False, **LOCAL) as cluster:
            assert [g.name for g in cluster.groups] == ["only"]
            assert "--name only-dummy" in cluster.job_script()
    with HeterogeneousSLURMCluster(two_groups(), submit=False, **LOCAL) as cluster:
        with pytest.raises(ValueError, match="several worker groups"):
            cluster.job_script()
        with pytest.raises(KeyError, match="no worker group 'medium'"):
            cluster.job_script("medium")


def test_refuses_adapt_plain_scale_and_per_group_kwargs():
    with HeterogeneousSLURMCluster(two_groups(), submit=False, **LOCAL) as cluster:
        with pytest.raises(NotImplementedError, match="trainer owns the worker set"):
            cluster.adapt(minimum=1, maximum=4)
        with pytest.raises(NotImplementedError, match="scale_group"):
            cluster.scale(4)
        with pytest.raises(SlurmConfigError, match="jobs must be an integer"):
            cluster.scale_group("fast", -1)
    with pytest.raises(SlurmConfigError, match="per-group settings"):
        HeterogeneousSLURMCluster(two_groups(), submit=False, cores=8, **LOCAL)


class _EchoJob(SLURMJob):
    """Stand-in job: 'submits' by echoing a job id, so no SLURM is needed."""

    submit_command = "echo Submitted batch job 4242"
    cancel_command = "true"


def test_scale_group_bookkeeping_with_stand_in_jobs():
    with HeterogeneousSLURMCluster(two_groups(), job_cls=_EchoJob, **LOCAL) as cluster:
        assert cluster.requested_jobs() == {"fast": 1, "slow": 1}
        cluster.scale_group("fast", 3)
        assert sorted(n for n in cluster.worker_spec if n.startswith("fast")) == [
            "fast-0",
            "fast-1",
            "fast-2",
        ]
        cluster.scale_group("fast", 1)  # none connected: the newest go first
        assert [n for n in cluster.worker_spec if n.startswith("fast")] == ["fast-0"]
        cluster.scale_group("fast", 2)  # numbers are never reused
        assert sorted(n for n in cluster.worker_spec if n.startswith("fast")) == [
            "fast-0",
            "fast-3",
        ]
        cluster.scale_groups({"slow": 0})
        assert cluster.requested_jobs() == {"fast": 2, "slow": 0}
        with pytest.raises(KeyError, match="no worker group"):
            cluster.scale_groups({"fast": 1, "medium": 1})
        assert cluster.requested_jobs() == {"fast": 2, "slow": 0}  # unchanged on error
        # Group of a job name, of a process of a multi-process job, of a removed job.
        assert cluster.group_of("fast-3") == "fast"
        assert cluster.group_of("slow-0-1") == "slow"
        with pytest.raises(KeyError, match="not a worker of this cluster"):
            cluster.group_of("tcp://10.0.0.1:1")
        # The stand-in jobs never connect, so waiting must time out with counts.
        with pytest.raises(TimeoutError, match="wanted"):
            cluster.wait_for_groups(timeout=0.5)


class _FailingJob(SLURMJob):
    """Stand-in job whose submission fails, as sbatch does on a bad partition."""

    submit_command = "sh -c 'echo sbatch: error: invalid partition specified >&2; exit 1' --"
    cancel_command = "true"


def test_submission_errors_reach_the_caller():
    with pytest.raises(RuntimeError, match="invalid partition"):
        HeterogeneousSLURMCluster(two_groups(), job_cls=_FailingJob, **LOCAL)
    with HeterogeneousSLURMCluster(
        two_groups(), submit=False, job_cls=_FailingJob, **LOCAL
    ) as cluster:
        with pytest.raises(RuntimeError, match="invalid partition"):
            cluster.scale_group("slow", 1)
        assert cluster.requested_jobs() == {"fast": 0, "slow": 0}  # the failed job is forgotten

    async def main() -> None:
        async with HeterogeneousSLURMCluster(
            two_groups(), job_cls=_FailingJob, asynchronous=True, **LOCAL
        ):
            pass

    with pytest.raises(RuntimeError, match="invalid partition"):
        asyncio.run(main())


def test_asynchronous_cluster_scales_with_await():
    async def main() -> dict[str, int]:
        async with HeterogeneousSLURMCluster(
            two_groups(), job_cls=_EchoJob, asynchronous=True, **LOCAL
        ) as cluster:
            assert set(cluster.workers) == {"fast-0", "slow-0"}
            await cluster.scale_group("fast", 2)
            assert set(cluster.workers) == {"fast-0", "fast-1", "slow-0"}
            await cluster.scale_groups({"fast": 0, "slow": 0})
            assert not cluster.workers
            return cluster.requested_jobs()

    assert asyncio.run(main()) == {"fast": 0, "slow": 0}


def test_scheduler_preload_passes_through(tmp_path):
    preload = tmp_path / "rpm_test_scheduler_preload.py"
    preload.write_text("def dask_setup(scheduler):\n    scheduler.rpm_test_preloaded = True\n")
    options = dict(
        LOCAL, scheduler_options={**LOCAL["scheduler_options"], "preload": [str(preload)]}
    )
    with HeterogeneousSLURMCluster(two_groups(), submit=False, **options) as cluster:
        assert getattr(cluster.scheduler, "rpm_test_preloaded", False)


# --------------------------------------------------------------------------
# Real SLURM
# --------------------------------------------------------------------------


def _squeue(job_ids: list[str]) -> dict[str, tuple[str, str]]:
    """``{job_id: (state, partition)}`` for the given jobs still known to SLURM."""
    out = subprocess.run(
        ["squeue", "-h", "-o", "%i %T %P", "-j", ",".join(job_ids)], capture_output=True, text=True
    ).stdout
    return {i: (s, p) for i, s, p in (line.split() for line in out.splitlines() if line.strip())}


def _wait_squeue(
    job_ids: list[str], predicate, timeout: float = 30.0
) -> dict[str, tuple[str, str]]:
    deadline = time.monotonic() + timeout
    while True:
        seen = _squeue(job_ids)
        if predicate(seen) or time.monotonic() > deadline:
            return seen
        time.sleep(0.25)


@pytest.mark.slurm
def test_two_groups_on_real_slurm(slurm_cluster, tmp_path):
    fast_p, slow_p = slurm_cluster.partitions[0], slurm_cluster.partitions[-1]
    groups = two_groups(speed=1.0)
    # --exclusive would give one job the whole (only) node and queue the rest.
    groups[0] = replace(groups[0], queue=fast_p, job_extra_directives=["--comment=rpm-test"])
    groups[1] = replace(groups[1], queue=slow_p)  # keeps -A proj1: no accounting, so accepted
    with HeterogeneousSLURMCluster(
        groups, log_directory=str(tmp_path / "jobs"), **LOCAL
    ) as cluster:
        assert cluster.wait_for_groups(timeout=120) == {"fast": 1, "slow": 2}
        jobs = {name: job.job_id for name, job in cluster.workers.items()}
        assert set(jobs) == {"fast-0", "slow-0"}
        seen = _squeue(list(jobs.values()))
        assert seen[jobs["fast-0"]] == ("RUNNING", fast_p)
        assert seen[jobs["slow-0"]] == ("RUNNING", slow_p)

        # One scheduler, named workers, group known on the scheduler too.
        workers = cluster.scheduler_info["workers"]
        names = {w["name"]: addr for addr, w in workers.items()}
        assert sorted(names) == ["fast-0", "slow-0-0", "slow-0-1"]
        for name, addr in names.items():
            group = name.split("-")[0]
            assert workers[addr][GROUP_KEY] == group
            assert cluster.group_of(addr) == cluster.group_of(name) == group
        assert workers[names["fast-0"]][SPEED_KEY] == 1.0
        assert SPEED_KEY not in workers[names["slow-0-0"]]
        assert sorted(cluster.worker_groups().values()) == ["fast", "slow", "slow"]

        with Client(cluster) as client:
            env = client.run(lambda: __import__("os").environ.get(GROUP_ENV))
            assert {
                names[n]: g
                for n, g in [("fast-0", "fast"), ("slow-0-0", "slow"), ("slow-0-1", "slow")]
            } == env
            plugins = client.run(lambda dask_worker: sorted(dask_worker.plugins))
            # Emulated speed reached the emulation layer only on the group that asked for it.
            assert "rpm-emulation" in plugins[names["fast-0"]]
            assert "rpm-emulation" not in plugins[names["slow-0-0"]]
            # fit on the groups records the EMULATED label, asked of the workers (the
            # SLURM cluster object has none), with the workers it does not cover
            label = emulation_label(client)
            assert label == (
                "EMULATED heterogeneity on one machine: speeds 1.0 x scale 1 of a core"
                " (2 of 3 workers not emulated)"
            )
            x = np.random.default_rng(0).normal(size=(40, 5))
            d = np.random.default_rng(1).uniform(0.1, 0.9, size=(40, 2))
            r = fit(x, d, hidden=6, iterations=3, learning_rate=0.05, mapping="uniform")
            assert r.emulation == r.history.attrs["emulation"] == label

            # Scale the groups independently.
            cluster.scale_group("fast", 2)
            assert cluster.wait_for_groups(timeout=120) == {"fast": 2, "slow": 2}
            # Data on a slow worker survives its group being scaled away
            # (workers are retired gracefully before their job is cancelled).
            payload = bytes(range(256)) * 4
            kept = client.scatter(payload, workers=[names["slow-0-1"]])
            cluster.scale_group("slow", 0)
            assert cluster.wait_for_groups(timeout=120) == {"fast": 2, "slow": 0}
            assert kept.result(timeout=30) == payload
            assert sorted(w["name"] for w in cluster.scheduler_info["workers"].values()) == [
                "fast-0",
                "fast-1",
            ]
            gone = _wait_squeue([jobs["slow-0"]], lambda s: jobs["slow-0"] not in s)
            assert jobs["slow-0"] not in gone, f"slow job still in squeue: {gone}"
            all_ids = [job.job_id for job in cluster.workers.values()]
    # Closing the cluster cancels every job it submitted.
    left = _wait_squeue(all_ids, lambda s: not s)
    assert not left, f"jobs left after close: {left}"
    assert Path(tmp_path / "jobs").is_dir()


@pytest.mark.slurm
def test_groups_from_config_on_real_slurm(slurm_cluster, tmp_path):
    groups = [
        {
            "name": "a",
            "jobs": 1,
            "cores": 1,
            "memory": "512MiB",
            "partition": slurm_cluster.partitions[0],
        },
        {
            "name": "b",
            "jobs": 0,
            "cores": 1,
            "memory": "512MiB",
            "partition": slurm_cluster.partitions[-1],
        },
    ]
    with dask.config.set({"rpm.slurm.groups": groups}):
        with HeterogeneousSLURMCluster(log_directory=str(tmp_path / "jobs"), **LOCAL) as cluster:
            assert cluster.wait_for_groups(timeout=120) == {"a": 1, "b": 0}
            cluster.scale_groups({"a": 0, "b": 1})
            assert cluster.wait_for_groups(timeout=120) == {"a": 0, "b": 1}
            (name,) = [w["name"] for w in cluster.scheduler_info["workers"].values()]
            assert name == "b-0" and cluster.group_of(name) == "b"


def test_slurm_unavailable_says_how_to_fix(monkeypatch, tmp_path):
    """Without a usable SLURM the reason names what is missing and the fix (no SLURM needed)."""
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    monkeypatch.setenv("PATH", str(fake_bin))
    assert "sbatch is not on the PATH" in slurm_unavailable()
    sbatch = fake_bin / "sbatch"
    sbatch.write_text("#!/bin/sh\nexit 0\n")
    sbatch.chmod(0o755)
    monkeypatch.delenv("SLURM_CONF", raising=False)
    assert "export SLURM_CONF=" in slurm_unavailable()
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "nope.conf"))
    assert "does not exist" in slurm_unavailable()


@pytest.mark.slurm
def test_slurm_unavailable_on_real_slurm(slurm_cluster):
    assert slurm_unavailable(slurm_cluster.partitions) is None
    reason = slurm_unavailable(["no-such-partition"])
    assert "no-such-partition" in reason and slurm_cluster.partitions[0] in reason


def test_replacement_budget_refuses_a_group_whose_jobs_keep_ending(caplog):
    """At most ``limit`` resubmissions per group within ``window`` seconds; the refusal is logged once."""
    budget = ReplacementBudget()
    assert budget.allow("fast", 0.0, limit=2, window=10.0)
    assert budget.allow("fast", 1.0, limit=2, window=10.0)
    assert budget.allow("slow", 1.5, limit=2, window=10.0)  # each group has its own budget
    with caplog.at_level(logging.WARNING, logger="dask_rpm.slurm.replacement"):
        assert not budget.allow("fast", 2.0, limit=2, window=10.0)
        assert not budget.allow("fast", 3.0, limit=2, window=10.0)
    assert budget.given_up == {"fast"}
    warned = [r.getMessage() for r in caplog.records if "not resubmitting" in r.getMessage()]
    assert len(warned) == 1 and "'fast'" in warned[0]
    # both resubmissions have left the window: the group may be resubmitted again
    assert budget.allow("fast", 11.5, limit=2, window=10.0)


@pytest.mark.slurm
def test_ended_jobs_asks_squeue(slurm_cluster, tmp_path):
    assert ended_jobs({}) == []
    out = subprocess.run(
        ["sbatch", "--parsable", "-p", slurm_cluster.partitions[0], "-o", str(tmp_path / "%j.out")]
        + ["--wrap", "sleep 120"],
        capture_output=True,
        text=True,
        check=True,
    )
    job_id = out.stdout.strip().split(";")[0]
    try:
        assert ended_jobs({"sleeper": job_id}) == []
    finally:
        subprocess.run(["scancel", job_id], check=True)
    gone = _wait_squeue([job_id], lambda s: job_id not in s)
    assert job_id not in gone
    assert ended_jobs({"sleeper": job_id}) == ["sleeper"]
