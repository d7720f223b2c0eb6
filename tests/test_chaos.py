"""The chaos soak (benchmarks/chaos.py), short: real worker processes SIGKILLed and retired while training,
and on the local SLURM real worker jobs cancelled with ``scancel``, removed and added with ``scale_group``.

The injector's kinds depend on the seed only (seed 1: kill, then retire, then add); when each fault lands —
between blocks, inside one, during a remap or a checkpoint — is left to timing, and the engine must survive
any of them with the final weights equal to serial BP.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "chaos.py"


@pytest.fixture(scope="module")
def chaos():
    spec = importlib.util.spec_from_file_location("dask_rpm_bench_chaos", _PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_kinds_depend_on_the_seed_only(chaos):
    assert chaos.planned_kinds(1, 3) == ["kill", "retire", "add"]
    # never below min_workers or above max_workers, whatever the seed
    for seed in range(50):
        n = 3
        for kind in chaos.planned_kinds(seed, 20):
            n += {"kill": 0, "retire": -1, "add": 1}[kind]
            assert 2 <= n <= 5


@pytest.mark.parametrize("store", [False, True], ids=["driver-checkpoints", "store-checkpoints"])
@pytest.mark.slow
def test_a_short_soak_survives_every_fault_and_equals_serial(chaos, store):
    # store: checkpoints the workers write and, in a recovery from one, read (fit(checkpoint_dir=))
    rep = chaos.soak(seconds=30, seed=1, checkpoint_store=store)
    assert rep["setup"]["checkpoints"] == ("store (workers write and read)" if store else "driver")
    assert rep["error"] is None, rep["error"]
    assert rep["injector_errors"] == []
    kinds = [f["kind"] for f in rep["faults"]]
    assert kinds[:2] == ["kill", "retire"], kinds  # at least two faults: one every 3-8 s for 30 s
    assert rep["completed"] and rep["well_conditioned"], rep["conditioning_1e15_W0"]
    assert "UNACCOUNTED" not in rep["outcomes"], list(zip(rep["faults"], rep["outcomes"]))
    assert rep["faults_survived"] == rep["faults_injected"] == len(kinds)
    assert rep["equal_to_serial"] and rep["bytes_lost"] == 0, rep["relative_difference_vs_serial"]
    assert rep["relative_difference_vs_serial"] <= 1e-10
    # the killed worker held rows (every worker does at the start): a recovery remap names it
    assert rep["outcomes"][0].startswith("recovered from the"), rep["outcomes"]


@pytest.mark.slurm
def test_a_short_slurm_soak_survives_scancel_and_equals_serial(chaos, slurm_cluster):
    """Seed 1 on SLURM: scancel of a worker's job first (then a scale-down, then a scale-up, timing allowing).

    The cancelled job's worker is recovered from, the trainer resubmits the job (replace-lost), and the
    weights at the end equal serial BP's for the iterations done.
    """
    rep = chaos.soak(seconds=40, seed=1, slurm=True)
    assert rep["error"] is None, rep["error"]
    assert rep["injector_errors"] == []
    kinds = [f["kind"] for f in rep["faults"]]
    assert kinds[:1] == ["kill"] and kinds == chaos.planned_kinds(1, len(kinds)), kinds
    assert rep["completed"] and rep["well_conditioned"], rep["conditioning_1e15_W0"]
    assert "UNACCOUNTED" not in rep["outcomes"], list(zip(rep["faults"], rep["outcomes"]))
    assert rep["faults_survived"] == rep["faults_injected"] == len(kinds) >= 1
    assert rep["equal_to_serial"] and rep["bytes_lost"] == 0, rep["relative_difference_vs_serial"]
    # the cancelled job's worker held rows (every worker does at the start): a recovery remap names it
    assert rep["outcomes"][0].startswith("recovered from the"), rep["outcomes"]
    assert rep["jobs_resubmitted"] >= 1, rep["replacement_log"]
