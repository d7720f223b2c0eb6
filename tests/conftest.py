"""Shared pytest fixtures for dask_rpm's tests.

Each fixture lives in its own section below; keep sections self-contained.
"""

import pytest

# ---------------------------------------------------------------------------
# slurm_cluster: the local single-node SLURM of slurm/local-cluster.sh (issue #5)
# ---------------------------------------------------------------------------


@pytest.fixture(scope="session")
def slurm_cluster():
    """Ensure the local SLURM (``slurm/local-cluster.sh``) runs; set ``SLURM_CONF``.

    Starts it when it is not running (as root; installs ``slurm-wlm munge``
    with apt-get when missing). When that is impossible - not root, no
    apt-get, install or start failing - the test is *skipped* with the reason,
    except when ``CI=true``: then it *fails*, so CI never silently drops the
    SLURM tests. The cluster is left running afterwards (other sessions may
    share it); stop it with ``slurm/local-cluster.sh stop``.

    Yields a namespace with ``conf`` (path of slurm.conf), ``directory``
    (state directory) and ``partitions`` (``("fast", "slow")`` unless
    ``DASK_RPM_SLURM_PARTITIONS`` says otherwise). Honours the script's
    ``DASK_RPM_SLURM_*`` settings.
    """
    import os
    import subprocess
    import types
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "slurm" / "local-cluster.sh"
    directory = Path(os.environ.get("DASK_RPM_SLURM_DIR", "/tmp/dask-rpm-slurm"))
    conf = directory / "slurm.conf"
    in_ci = os.environ.get("CI", "").lower() == "true"

    def unavailable(reason: str):
        if in_ci:
            pytest.fail(
                f"local SLURM unavailable in CI (CI=true, so this fails instead of skipping): {reason}"
            )
        pytest.skip(f"local SLURM unavailable: {reason}")

    def run(command: str, timeout: float) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["bash", str(script), command], capture_output=True, text=True, timeout=timeout
        )

    # Already running (perhaps started by root earlier): use it as it is.
    if run("status", 60).returncode != 0:
        if os.geteuid() != 0:
            unavailable(
                f"it is not running and starting it needs root; run 'sudo {script} start' first"
            )
        have_slurm = all(
            subprocess.run(["bash", "-c", f"command -v {c}"], capture_output=True).returncode == 0
            for c in ("slurmctld", "slurmd", "sbatch", "munged")
        )
        have_apt = (
            subprocess.run(["bash", "-c", "command -v apt-get"], capture_output=True).returncode
            == 0
        )
        if not have_slurm and not have_apt:
            unavailable("SLURM is not installed and apt-get is not available to install it")
        try:
            started = run("start", 900)
        except subprocess.TimeoutExpired:
            unavailable(f"'{script} start' did not finish within 900 s")
        if started.returncode != 0:
            unavailable(
                f"'{script} start' failed (exit {started.returncode}):\n"
                f"{started.stdout[-2000:]}\n{started.stderr[-4000:]}"
            )

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SLURM_CONF", str(conf))
        partitions = tuple(os.environ.get("DASK_RPM_SLURM_PARTITIONS", "fast slow").split())
        yield types.SimpleNamespace(conf=str(conf), directory=str(directory), partitions=partitions)


@pytest.fixture
def sigkill_after():
    """``sigkill_after(client, victim, at)``: a ``fit`` callback that SIGKILLs worker ``victim``'s process
    once ``at`` iterations are done (so the loss lands mid-run at a known point); ``.fired`` lists when."""
    import os
    import signal

    def make(client, victim, at):
        pids = client.run(os.getpid)
        fired = []

        def callback(info):
            if not fired and info["iteration"] >= at:
                fired.append(info["iteration"])
                os.kill(pids[victim], signal.SIGKILL)

        callback.fired = fired
        return callback

    return make


# ---------------------------------------------------------------------------
# DRPM's idle workers (issue 25) off for the session; tests of the idle choice turn it on
# ---------------------------------------------------------------------------


@pytest.fixture(scope="session", autouse=True)
def drpm_idle_off():
    """``rpm.drpm.idle`` off for the whole session (tests/test_idle.py turns it on where it tests it).

    The tests of DRPM's mechanics (remaps, recovery, checkpoints of every worker's rows, the
    demo's evidence) train jobs so small that one worker alone is faster than several: with
    the default on, DRPM would rightly leave the others idle and those mechanics would not
    run. Off in this process (``dask.config.set``, before any module-scoped fixture trains)
    and in the subprocesses tests start (``DASK_RPM__DRPM__IDLE``).
    """
    import os

    import dask.config

    before = os.environ.get("DASK_RPM__DRPM__IDLE")
    os.environ["DASK_RPM__DRPM__IDLE"] = "false"
    try:
        with dask.config.set({"rpm.drpm.idle": False}):
            yield
    finally:
        if before is None:
            os.environ.pop("DASK_RPM__DRPM__IDLE", None)
        else:
            os.environ["DASK_RPM__DRPM__IDLE"] = before
