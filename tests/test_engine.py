"""Distributed BP by rectangles equals serial BP, for every kind of plan."""

from __future__ import annotations

import os
import threading
import time
from functools import partial

import numpy as np
import pytest
from distributed import Client, LocalCluster
from problems import regression_problem

import dask_rpm
from dask_rpm.engine import TrainingError, WorkerLostError, fit, ordered_workers
from dask_rpm.nn.data import DataError, write_dataset
from dask_rpm.nn.serial import fit_serial
from dask_rpm.plan.partition import Plan, PlanError

RTOL = 1e-10


_problem = partial(regression_problem, s=61, n=9, l=4)


def _random_plan(rng, n_workers, s, shape):
    """A random valid column-fixed plan over workers 0..n_workers-1."""
    n, m, l = shape
    order = list(rng.permutation(n_workers))
    n_cols = int(rng.integers(1, n_workers + 1))
    cuts = (
        sorted(rng.choice(np.arange(1, n_workers), size=n_cols - 1, replace=False))
        if n_cols > 1
        else []
    )
    columns = [order[a:b] for a, b in zip([0, *cuts], [*cuts, n_workers])]
    scuts = (
        sorted(rng.choice(np.arange(1, s), size=n_cols - 1, replace=False)) if n_cols > 1 else []
    )
    sample_sizes = np.diff([0, *scuts, s])
    hidden = []
    for col in columns:
        k = len(col)
        mc = sorted(rng.choice(np.arange(1, m), size=k - 1, replace=False)) if k > 1 else []
        hidden.append(list(np.diff([0, *mc, m])))
    ab = rng.uniform(0.2, 1.0, size=n_workers)
    return Plan.from_columns(
        columns, sample_sizes, hidden, shape=shape, abilities=ab, method="random"
    )


def _assert_equal_serial(result, x, d, m, iterations, lr, seed=0):
    ref = fit_serial(x, d, hidden=m, iterations=iterations, learning_rate=lr, seed=seed)
    (W, V), err = ref.params, ref.errors
    np.testing.assert_allclose(result.params[0], W, rtol=RTOL, atol=0)
    np.testing.assert_allclose(result.params[-1], V, rtol=RTOL, atol=0)
    np.testing.assert_allclose(result.history["error"].values, err, rtol=RTOL, atol=0)


@pytest.fixture(scope="module")
def client6():
    with LocalCluster(
        n_workers=6, threads_per_worker=1, processes=True, dashboard_address=":0"
    ) as cluster:
        with Client(cluster) as client:
            yield client


def test_one_worker_cluster_equals_serial():
    x, d = _problem()
    with LocalCluster(
        n_workers=1, threads_per_worker=1, processes=False, dashboard_address=":0"
    ) as cluster:
        with Client(cluster) as client:
            r = fit(
                x, d, hidden=7, iterations=50, learning_rate=0.05, mapping="uniform", client=client
            )
    assert r.plan.n_columns == 1 and len(r.plan.rectangles) == 1
    _assert_equal_serial(r, x, d, 7, 50, 0.05)
    assert r.history.sizes == {"iteration": 50, "worker": 1}


@pytest.mark.parametrize("seed", range(6))
def test_random_plans_equal_serial(client6, seed):
    rng = np.random.default_rng(100 + seed)
    x, d = _problem(
        s=int(rng.integers(20, 80)),
        n=int(rng.integers(2, 12)),
        l=int(rng.integers(1, 6)),
        seed=seed,
    )
    m = int(rng.integers(6, 15))
    n_workers = 1 + seed % 6
    plan = _random_plan(rng, n_workers, x.shape[0], (x.shape[1], m, d.shape[1]))
    r = fit(
        x, d, hidden=m, iterations=50, learning_rate=0.03, mapping=plan, seed=seed, client=client6
    )
    _assert_equal_serial(r, x, d, m, 50, 0.03, seed=seed)
    # Only the plan's workers worked.
    assert int(np.isfinite(r.history["forward"].values).any(axis=0).sum()) == n_workers


def test_every_column_count_equals_serial(client6):
    """One column, N columns, and everything in between, uneven sizes."""
    x, d = _problem(s=50, n=6, l=3, seed=4)
    m = 12
    for cols in ([[0, 1, 2, 3, 4, 5]], [[0], [1], [2], [3], [4], [5]], [[0, 1], [2, 3, 4], [5]]):
        k = len(cols)
        sizes = [50 // k + (1 if i < 50 % k else 0) for i in range(k)]
        hidden = [[m // len(c) + (1 if i < m % len(c) else 0) for i in range(len(c))] for c in cols]
        plan = Plan.from_columns(cols, sizes, hidden, shape=(6, m, 3), abilities=[1, 2, 3, 4, 5, 6])
        r = fit(x, d, hidden=m, iterations=50, learning_rate=0.05, mapping=plan, client=client6)
        _assert_equal_serial(r, x, d, m, 50, 0.05)


@pytest.mark.parametrize(
    "mapping, abilities",
    [
        ("srpm", [0.05, 0.10, 0.20, 0.30, 0.35, 0.5]),
        ("srpm", None),
        ("uniform", None),
        ("grid", [1.0, 1.5, 2.0, 2.5, 3.0, 3.5]),
        ("grid-h", [1.0, 1.5, 2.0, 2.5, 3.0, 3.5]),
    ],
)
def test_planner_mappings_equal_serial(client6, mapping, abilities):
    x, d = _problem(s=64, n=8, l=3, seed=7)
    r = fit(
        x,
        d,
        hidden=16,
        iterations=50,
        learning_rate=0.05,
        mapping=mapping,
        abilities=abilities,
        client=client6,
    )
    _assert_equal_serial(r, x, d, 16, 50, 0.05)


def test_xarray_and_netcdf_inputs(client6, tmp_path):
    import xarray as xr

    x, d = _problem(s=40, n=5, l=2, seed=11)
    plan = Plan.from_columns([[0, 1], [2]], [25, 15], [[3, 5], [8]], shape=(5, 8, 2))
    ds = xr.Dataset({"x": (("sample", "input"), x), "d": (("sample", "output"), d)})
    r1 = fit(ds, hidden=8, iterations=20, learning_rate=0.05, mapping=plan, client=client6)
    path = write_dataset(tmp_path / "train.nc", x, d)
    r2 = fit(path, hidden=8, iterations=20, learning_rate=0.05, mapping=plan, client=client6)
    W, V = fit_serial(x, d, hidden=8, iterations=20, learning_rate=0.05).params
    for r in (r1, r2):
        np.testing.assert_allclose(r.params[0], W, rtol=RTOL)
        np.testing.assert_allclose(r.params[-1], V, rtol=RTOL)


def test_history_and_task_keys(client6):
    x, d = _problem(s=30, n=4, l=2)
    plan = Plan.from_columns([[0, 1], [2, 3]], [15, 15], [[2, 4], [4, 2]], shape=(4, 6, 2))
    r = fit(
        x, d, hidden=6, iterations=5, learning_rate=0.1, mapping=plan, client=client6, interval=2
    )
    h = r.history
    for var in (
        "error",
        "iteration_time",
        "forward",
        "vertical_wait",
        "backward",
        "horizontal",
        "modify",
        "t1",
        "t2",
    ):
        assert var in h and "units" in h[var].attrs and "description" in h[var].attrs
    assert h["forward"].dims == ("iteration", "worker")
    assert np.all(h["forward"].values > 0) and np.all(h["modify"].values > 0)
    assert np.all(h["iteration_time"].values > 0)
    np.testing.assert_allclose(h["t1"], h["forward"] + h["vertical_wait"] + h["backward"])
    # One task per worker per block (blocks of 2, 2, 1 iterations), named in the task stream.
    prefixes = client6.run_on_scheduler(lambda dask_scheduler: sorted(dask_scheduler.task_prefixes))
    assert "rpm-block" in prefixes and "rpm-setup" in prefixes and "rpm-gather" in prefixes
    assert r.stats["blocks"] == 3
    n_gather = 2  # the first column's workers
    assert r.stats["tasks"] == 4 + 3 * 4 + n_gather


def test_bad_inputs_fail_before_work(client6):
    x, d = _problem(s=20, n=4, l=2)
    with pytest.raises(DataError, match="same number of rows"):
        fit(x, d[:-1], hidden=4, iterations=2, client=client6)
    xn = x.copy()
    xn[3, 1] = np.nan
    with pytest.raises(DataError, match="NaN or infinite"):
        fit(xn, d, hidden=4, iterations=2, client=client6)
    with pytest.raises(DataError, match="learning_rate"):
        fit(x, d, hidden=4, iterations=2, learning_rate=0.0, client=client6)
    with pytest.raises(DataError, match="learning_rate"):
        fit(x, d, hidden=4, iterations=2, learning_rate=-1.0, client=client6)
    plan7 = Plan.from_columns(
        [[0, 1, 2, 3, 4, 5, 6]], [20], [[1, 1, 1, 1, 1, 1, 2]], shape=(4, 8, 2)
    )
    with pytest.raises(PlanError, match="needs 7 workers but the cluster has 6"):
        fit(x, d, hidden=8, iterations=2, mapping=plan7, client=client6)
    plan2 = Plan.from_columns([[0, 1]], [20], [[2, 2]], shape=(4, 4, 2)).with_workers(
        ["tcp://10.0.0.1:1", "tcp://10.0.0.2:1"]
    )
    with pytest.raises(PlanError, match="does not have"):
        fit(x, d, hidden=4, iterations=2, mapping=plan2, client=client6)
    with pytest.raises(PlanError, match="abilities given for 6 workers"):
        fit(x, d, hidden=8, iterations=2, mapping="srpm", abilities=[1, 2], client=client6)


@pytest.mark.parametrize("interval", [1, 5])
def test_divergence_returns_last_finite_weights(client6, interval):
    # Targets all 1 on one output and 0 on the other: lr * dV overflows V to
    # +-inf in the first update, then 0 * inf makes W NaN.
    rng = np.random.default_rng(0)
    x = rng.normal(size=(100, 4))
    d = np.column_stack([np.ones(100), np.zeros(100)])
    plan = Plan.from_columns([[0], [1]], [50, 50], [[6], [6]], shape=(4, 6, 2))
    W0, V0 = dask_rpm.nn.kernels.init_weights(4, 6, 2, seed=0, scale=0.1)
    r = fit(
        x,
        d,
        hidden=6,
        iterations=30,
        learning_rate=1e308,
        mapping=plan,
        client=client6,
        interval=interval,
    )
    assert r.stopped is not None and "diverged" in r.stopped and "after 0 iteration" in r.stopped
    # The last finite weights are the initial ones (the first update overflowed).
    np.testing.assert_array_equal(r.params[0], W0)
    np.testing.assert_array_equal(r.params[-1], V0)
    assert r.history.sizes["iteration"] == 0


def test_worker_loss_raises_naming_the_worker():
    x, d = _problem(s=40, n=4, l=2)
    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
    ) as cluster:
        with Client(cluster) as client:
            victim = ordered_workers(client.scheduler_info())[1]
            plan = Plan.from_columns([[0, 1]], [40], [[3, 3]], shape=(4, 6, 2))

            def kill():
                time.sleep(1.5)
                try:
                    client.run(os._exit, 1, workers=[victim])
                except Exception:  # the run call fails: the worker is gone, as intended
                    pass

            t = threading.Thread(target=kill)
            t.start()
            with pytest.raises(WorkerLostError, match=victim.replace(".", r"\.")):
                fit(
                    x,
                    d,
                    hidden=6,
                    iterations=100_000,
                    learning_rate=0.01,
                    mapping=plan,
                    client=client,
                    on_worker_loss="raise",
                )
            t.join()


def test_public_api_exports():
    for name in ("fit", "fit_serial", "FitResult", "Plan"):
        assert hasattr(dask_rpm, name)


EXCHANGES = [
    ("allgather", "pairwise"),
    ("leader", "pairwise"),
    ("tree", "tree"),
    ("halving", "halving"),
    ("ring", "ring"),
    ("direct", "direct"),
    ("allgather", "tree"),
    ("leader", "ring"),
]


@pytest.mark.parametrize("vertical,horizontal", EXCHANGES, ids=["-".join(e) for e in EXCHANGES])
def test_every_exchange_algorithm_equals_serial(client6, vertical, horizontal):
    """Columns of 3, 2 and 1 workers (halving folds a third member in), bands held by 3 columns."""
    import dask.config

    rng = np.random.default_rng(5)
    x, d = _problem(s=45, n=7, l=3, seed=5)
    plan = Plan.from_columns(
        [[0, 1, 2], [3, 4], [5]],
        [15, 18, 12],
        [[3, 4, 5], [7, 5], [12]],
        shape=(7, 12, 3),
        abilities=rng.uniform(0.2, 1, 6),
    )
    cfg = {"rpm.engine.vertical": vertical, "rpm.engine.horizontal": horizontal}
    with dask.config.set(cfg):
        r = fit(
            x,
            d,
            hidden=12,
            iterations=40,
            learning_rate=0.05,
            mapping=plan,
            client=client6,
            progress="none",
        )
    _assert_equal_serial(r, x, d, 12, 40, 0.05)
    # what ran is recorded (and is what was asked for)
    h = "pairwise" if horizontal == "pairwise" else f"{horizontal} x3 (groups of bands)"
    assert r.history.attrs["exchanges"] == f"vertical: {vertical} x2, none; horizontal: {h}"


@pytest.mark.parametrize("seed", range(4))
def test_random_plans_with_random_exchanges_equal_serial(client6, seed):
    """Random plans on up to 6 workers, each run with a random pair of exchange algorithms; with
    mini-batches in half of them (a column's share of a batch changes size between iterations)."""
    import dask.config

    rng = np.random.default_rng(300 + seed)
    x, d = _problem(s=int(rng.integers(30, 80)), n=int(rng.integers(2, 9)), l=2, seed=seed)
    m = int(rng.integers(8, 15))
    plan = _random_plan(rng, 3 + seed % 4, x.shape[0], (x.shape[1], m, d.shape[1]))
    vertical = str(rng.choice(["allgather", "leader", "tree", "halving", "ring", "direct"]))
    horizontal = str(rng.choice(["pairwise", "tree", "halving", "ring", "direct"]))
    batch = int(rng.integers(7, 20)) if seed % 2 else None
    with dask.config.set({"rpm.engine.vertical": vertical, "rpm.engine.horizontal": horizontal}):
        r = fit(
            x,
            d,
            hidden=m,
            iterations=30,
            learning_rate=0.03,
            mapping=plan,
            seed=seed,
            batch_size=batch,
            shuffle=False,
            client=client6,
            progress="none",
        )
    ref = fit_serial(
        x,
        d,
        hidden=m,
        iterations=30,
        learning_rate=0.03,
        seed=seed,
        batch_size=batch,
        shuffle=False,
    )
    (W, V), err = ref.params, ref.errors
    np.testing.assert_allclose(r.params[0], W, rtol=RTOL, atol=0)
    np.testing.assert_allclose(r.params[-1], V, rtol=RTOL, atol=0)
    np.testing.assert_allclose(r.history["error"].values, err, rtol=RTOL, atol=0)


def test_auto_exchanges_switch_to_schedules_above_allgather_max(client6):
    """auto: one hop up to rpm.engine.allgather-max holders; above it the cost model's pick,
    which on a bandwidth-bound network (rpm.cost.bandwidth 1 kB/s) is a schedule."""
    import dask.config

    x, d = _problem(s=36, n=5, l=2, seed=2)
    cols = [[0, 1, 2], [3, 4], [5]]
    plan = Plan.from_columns(cols, [12, 12, 12], [[4, 4, 4], [6, 6], [12]], shape=(5, 12, 2))
    runs = {}
    for one_hop in (4, 1):
        with dask.config.set({"rpm.engine.allgather-max": one_hop, "rpm.cost.bandwidth": 1e3}):
            runs[one_hop] = fit(
                x, d, hidden=12, iterations=20, learning_rate=0.05, mapping=plan, client=client6
            )
        _assert_equal_serial(runs[one_hop], x, d, 12, 20, 0.05)
    assert runs[4].history.attrs["exchanges"] == (
        "vertical: allgather x2, none; horizontal: pairwise"
    )
    # 3 members sending bytes: direct (2 x 2/3 of the buffer each); 2 members: one hop stays
    # cheapest (direct would send as much, in two rounds)
    assert runs[1].history.attrs["exchanges"] == (
        "vertical: direct, allgather, none; horizontal: direct x4 (groups of bands)"
    )


@pytest.mark.slow
def test_a_peer_that_does_not_answer_fails_the_block_naming_it(client6):
    """Receive deadline: after the first block, worker 1's event loop is blocked for 4 s (a stalled
    process); worker 0 gives up after rpm.engine.receive-timeout = 1 s, the driver aborts the
    block, and the error names worker 1."""
    import dask.config

    x, d = _problem(s=30, n=4, l=2)
    addrs = ordered_workers(client6.scheduler_info())
    plan = Plan.from_columns([[0], [1]], [15, 15], [[6], [6]], shape=(4, 6, 2))
    stalls = []

    def stall(info):
        if not stalls:  # the loop of worker 1 sleeps: it neither computes nor answers
            stalls.append(
                threading.Thread(
                    target=client6.run, args=(time.sleep, 4.0), kwargs={"workers": [addrs[1]]}
                )
            )
            stalls[0].start()

    t0 = time.monotonic()
    with dask.config.set({"rpm.engine.receive-timeout": 1.0}):
        with pytest.raises(
            TrainingError,
            match=rf"no horizontal data of iteration \d+ from worker 1 "
            rf"\({addrs[1]}\) within 1 s",
        ):
            fit(
                x,
                d,
                hidden=6,
                iterations=100_000,
                learning_rate=0.01,
                mapping=plan,
                client=client6,
                interval=5,
                progress="none",
                on_worker_loss="raise",
                callback=stall,
                elastic=False,
            )
    assert time.monotonic() - t0 < 30
    stalls[0].join()


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_sigkill_mid_block_recovers_to_serial_weights():
    """A worker process SIGKILLed in the middle of a long block: no hang, survivors aborted and
    rolled back, rows rebuilt from the other column, final weights equal serial BP. Buddy copies
    off: with them the run goes back only to the last copy inside the block
    (tests/test_buddies.py), not to the block's start this test checks."""
    import signal

    import dask.config

    x, d = _problem(s=64, n=6, l=3, seed=2)
    with (
        dask.config.set({"rpm.resilience.buddies": False}),
        LocalCluster(
            n_workers=4, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster,
    ):
        with Client(cluster) as client:
            addrs = ordered_workers(client.scheduler_info())
            pids = client.run(os.getpid)
            plan = Plan.from_columns([[0, 1], [2, 3]], [32, 32], [[4, 5], [6, 3]], shape=(6, 9, 3))
            started = []

            def callback(info):  # after the first block, arm a kill that lands inside the next one
                if not started:
                    started.append(info["iteration"])
                    threading.Timer(0.5, os.kill, args=(pids[addrs[1]], signal.SIGKILL)).start()

            r = fit(
                x,
                d,
                hidden=9,
                iterations=4000,
                learning_rate=0.05,
                mapping=plan,
                client=client,
                interval=2000,
                callback=callback,
                progress="none",
            )
    (rec,) = [rec for rec in r.remaps if rec.get("lost")]
    assert rec["lost"] == [addrs[1]] and rec["recovered_from"] == "columns"
    # the kill landed inside the second block (iterations 2000..3999), which was rolled back to 2000
    assert rec["iteration"] == 2000
    assert r.history.sizes["iteration"] == 4000
    _assert_equal_serial(r, x, d, 9, 4000, 0.05)


def test_min_workers_wait_says_what_it_waits_for(caplog):
    """fit(min_workers=...) with too few workers logs the goal, the count and the timeout, then a clear error."""
    import dask

    x, d = _problem(s=20, n=4, l=2)
    with (
        LocalCluster(
            n_workers=1, threads_per_worker=1, processes=False, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
        dask.config.set({"rpm.train.wait-workers": 1.5}),
    ):
        with (
            caplog.at_level("WARNING", logger="dask_rpm"),
            pytest.raises(
                TrainingError, match=r"only 1 of min_workers=3 workers connected within 1.5 s"
            ),
        ):
            fit(x, d, hidden=4, iterations=2, client=client, min_workers=3, progress="none")
        # nothing ran: the scheduler has no rpm task
        prefixes = client.run_on_scheduler(
            lambda dask_scheduler: sorted(dask_scheduler.task_prefixes)
        )
        assert not [p for p in prefixes if p.startswith("rpm-")], prefixes
    waits = [r.getMessage() for r in caplog.records if "waiting for" in r.getMessage()]
    assert waits and waits[0].startswith(
        "fit: waiting for min_workers=3 workers: 1 connected; giving up in "
    )
    assert "(rpm.train.wait-workers=1.5 s)" in waits[0]


def test_fit_without_a_client_says_how_to_start_one():
    """In a fresh interpreter (no client of another test around), the error says how to start one."""
    import subprocess
    import sys

    code = (
        "import numpy as np, dask_rpm\n"
        "dask_rpm.fit(np.ones((8, 3)), np.ones((8, 2)), hidden=2, iterations=1)\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 1
    last = p.stderr.strip().splitlines()[-1]
    assert last == (
        "dask_rpm.engine.errors.TrainingError: fit() found no Dask client: start one first, e.g. "
        "`client = distributed.Client(dask_rpm.local_cluster())`, or pass client=..."
    ), p.stderr[-2000:]


def test_fit_through_an_address_records_the_emulation_label():
    """The EMULATED label reaches the result and its history whether the client holds the
    cluster object or only the scheduler's address (then it is asked of the workers)."""
    x, d = _problem()
    with dask_rpm.local_cluster([1.0, 0.5], processes=False, dashboard_address=":0") as cluster:
        label = cluster.emulation_label
        recorded = {}
        for how, target in (("cluster", cluster), ("address", cluster.scheduler_address)):
            with Client(target) as client:
                assert (client.cluster is None) == (how == "address")
                r = fit(
                    x,
                    d,
                    hidden=7,
                    iterations=5,
                    learning_rate=0.05,
                    mapping="uniform",
                    client=client,
                )
                _assert_equal_serial(r, x, d, 7, 5, 0.05)
                recorded[how] = (r.emulation, r.history.attrs.get("emulation"))
    assert label.startswith("EMULATED heterogeneity on one machine: speeds 1.0, 0.5")
    assert recorded["cluster"] == recorded["address"] == (label, label)


@pytest.mark.parametrize("name", ["DRPM", " Drpm "])
def test_a_mapping_name_in_other_case_trains_with_it(name):
    """fit(mapping="DRPM") is DRPM: the name is normalised where it is checked, so the run gets
    DRPM's state (before, it passed validation but trained without it and failed late)."""
    x, d = regression_problem(s=48, n=5, l=2, seed=3)
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0"
        ) as cluster,
        Client(cluster),
    ):
        result = fit(
            x, d, hidden=6, iterations=12, learning_rate=0.05, mapping=name, progress="none"
        )
    assert result.drpm_state is not None and result.drpm_state["plan"]
    serial = fit_serial(x, d, hidden=6, iterations=12, learning_rate=0.05)
    np.testing.assert_allclose(result.params[0], serial.params[0], rtol=1e-10, atol=0)
