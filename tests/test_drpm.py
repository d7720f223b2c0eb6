"""DRPM in the driver: remaps keep training exact, and emulated speeds are recovered."""

from __future__ import annotations

import dask
import numpy as np
import pytest
from distributed import Client, LocalCluster

import dask_rpm
from dask_rpm.demo.train import demo_data
from dask_rpm.drpm.remap import column_remap
from dask_rpm.emulation import emulation_report, set_speed
from dask_rpm.engine import Driver, ensure_plugins, fit, ordered_workers
from dask_rpm.engine.records import Checkpoint, RunSpec
from dask_rpm.nn.backend import Placement
from dask_rpm.nn.kernels import init_weights
from dask_rpm.nn.options import TrainingOptions
from dask_rpm.nn.recipe import recipe
from dask_rpm.nn.serial import fit_serial
from dask_rpm.plan.partition import Plan

RTOL = 1e-10


def _skip_if_emulation_violated(client, limit: float = 0.10) -> None:
    """Timing claims only hold if the machine could keep the EMULATED speeds.

    When other processes load the cores, compute blocks overrun their emulated
    duration and every worker looks equally slow; the ratios then measure the
    machine's load, not DRPM. Skip (visibly) in that case.
    """
    from dask_rpm.emulation import emulation_report

    rows = emulation_report(client)
    worst = max(rows, key=lambda r: r["overrun_s"] / max(r["wall_s"], 1e-9))
    frac = worst["overrun_s"] / max(worst["wall_s"], 1e-9)
    if frac > limit:
        pytest.skip(
            f"machine too loaded to keep the EMULATED speeds: worker {worst['index']} (speed {worst['speed']}) "
            f"overran its emulated duration for {frac:.0%} of its paced time (> {limit:.0%})"
        )


def _random_plan(rng, addresses, s, shape):
    n_workers = len(addresses)
    n, m, l = shape
    order = [int(v) for v in rng.permutation(n_workers)]
    n_cols = int(rng.integers(1, n_workers + 1))
    cuts = (
        sorted(int(c) for c in rng.choice(np.arange(1, n_workers), size=n_cols - 1, replace=False))
        if n_cols > 1
        else []
    )
    columns = [order[a:b] for a, b in zip([0, *cuts], [*cuts, n_workers])]
    scuts = (
        sorted(int(c) for c in rng.choice(np.arange(1, s), size=n_cols - 1, replace=False))
        if n_cols > 1
        else []
    )
    hidden = []
    for col in columns:
        mc = (
            sorted(int(c) for c in rng.choice(np.arange(1, m), size=len(col) - 1, replace=False))
            if len(col) > 1
            else []
        )
        hidden.append(list(np.diff([0, *mc, m])))
    plan = Plan.from_columns(
        columns,
        np.diff([0, *scuts, s]),
        hidden,
        shape=shape,
        abilities=rng.uniform(0.2, 1, n_workers),
        method="random",
    )
    return plan.with_workers(addresses)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_any_sequence_of_remaps_equals_serial(seed):
    """Random plans one after another (whole remaps) and column remaps between blocks."""
    rng = np.random.default_rng(seed)
    s, n, m, l = 57, 7, 13, 3
    x = rng.normal(size=(s, n))
    d = rng.uniform(0.1, 0.9, size=(s, l))
    W0, V0 = init_weights(n, m, l, seed=seed)
    eps, block = 0.05, 4
    with LocalCluster(
        n_workers=5, threads_per_worker=1, processes=False, dashboard_address=":0"
    ) as cluster:
        with Client(cluster) as client:
            addresses = ordered_workers(client.scheduler_info())

            async def run() -> tuple[np.ndarray, np.ndarray, int, list[int]]:
                await ensure_plugins(client)
                plan = _random_plan(rng, addresses, s, (n, m, l))
                rec = recipe(s, TrainingOptions(iterations=7 * block, learning_rate=eps))
                tr = Driver(
                    client,
                    spec=RunSpec(f"t{seed}", rec, "float64", Placement("numpy", "cpu")),
                    plan=plan,
                    source=None,
                    arrays=(x, d),
                )
                await tr.install(plan, Checkpoint(0, (W0, V0)))
                moved = []
                for step in range(6):
                    assert (await tr.run_block(block)).status == "ok"
                    if step % 2 == 0:
                        new = _random_plan(rng, addresses, s, (n, m, l))
                        kind = "whole"
                    else:
                        new = column_remap(tr.plan, rng.uniform(0.1, 1.0, len(addresses)))
                        kind = "column"
                    rec = await tr.remap(new, kind)
                    moved.append(rec["bytes"])
                assert (await tr.run_block(block)).status == "ok"
                W, V = await tr.gather()  # the parameters of one hidden layer
                await tr.close()
                return W, V, tr.iteration, moved

            W, V, iterations, moved = client.sync(run)
    Ws, Vs = fit_serial(x, d, iterations=iterations, learning_rate=eps, init=(W0, V0)).params
    np.testing.assert_allclose(W, Ws, rtol=RTOL)
    np.testing.assert_allclose(V, Vs, rtol=RTOL)
    assert iterations == 7 * block
    # A row moves (n + l) * 8 bytes: remaps never move more than the whole model per worker.
    assert all(0 <= b <= (n + l) * m * 8 * 5 for b in moved)


@pytest.mark.parametrize("column_times", ["tc", "t1"])
def test_drpm_fit_with_remaps_equals_serial(column_times):
    x, d = demo_data(512, (17, 24, 4))
    speeds = [1.0, 0.3, 0.6]
    with (
        dask_rpm.local_cluster(speeds, scale=0.5, processes=False) as cluster,
        Client(cluster) as client,
    ):
        # t-line 1.0: remap at every check (t_min < t_max)
        with dask.config.set({"rpm.drpm.t-line": 1.0, "rpm.drpm.column-times": column_times}):
            r = fit(
                x,
                d,
                hidden=24,
                iterations=40,
                learning_rate=2e-3,
                mapping="drpm",
                client=client,
                interval=8,
            )
    assert len(r.remaps) == 4 and r.remaps[0]["kind"] == "whole"
    assert all(rec["kind"] in ("whole", "column") for rec in r.remaps)
    assert "ability" in r.history and r.history["ability"].dims == ("check", "worker")
    assert r.emulation and "EMULATED" in r.history.attrs["emulation"]
    ref = fit_serial(x, d, hidden=24, iterations=40, learning_rate=2e-3)
    (W, V), err = ref.params, ref.errors
    np.testing.assert_allclose(r.params[0], W, rtol=RTOL)
    np.testing.assert_allclose(r.params[-1], V, rtol=RTOL)
    np.testing.assert_allclose(r.history["error"].values, err, rtol=RTOL)


def test_bad_column_times_is_refused_before_training():
    x, d = demo_data(64, (5, 6, 2))
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
        dask.config.set({"rpm.drpm.column-times": "t3"}),
    ):
        with pytest.raises(ValueError, match="column-times must be 'tc'.*or 't1'.*got 't3'"):
            fit(
                x,
                d,
                hidden=6,
                iterations=4,
                learning_rate=1e-2,
                mapping="drpm",
                client=client,
                progress="none",
            )
        # no BP task ran: the scheduler plugin (registered by fit) recorded none
        recorded = client.run_on_scheduler(
            lambda dask_scheduler: sum(
                len(r.log) for r in dask_scheduler.plugins["rpm"].runs.values()
            )
        )
        assert recorded == 0


def _interleaved_medians(client, x, d, arms: dict, *, rounds: int = 3, iterations: int = 8) -> dict:
    """Median iteration time of each arm, the arms run in turns (A B, B A, A B, ...) on one cluster.

    A shared host's load comes in bursts of a second or two. Timed one after
    the other, a burst could land on one arm only and move its median by
    30 % (these tests failed about 1 run in 13 that way, with the same plan in
    both arms). Run in short turns, in alternating order, a burst or a drift
    falls on both arms alike. The first 2 iterations of every run are left
    out (warm-up); 3 rounds of 8 keep 18 iterations per arm, as before.
    """
    names = list(arms)
    times: dict = {k: [] for k in names}
    for i in range(rounds):
        for k in names if i % 2 == 0 else names[::-1]:
            res = fit(x, d, iterations=iterations, client=client, progress="none", **arms[k])
            times[k].extend(res.history["iteration_time"].values[2:])
    return {k: float(np.median(v)) for k, v in times.items()}


@pytest.mark.slow
def test_condition_a_without_initial_abilities_recovers_speeds(record_property):
    """docs/method.md §8, condition A, 4 workers: estimates within 10 %, time within 15 % of SRPM with true speeds.

    DRPM starts uniform, checks at iteration 20 and remaps once (whole); its
    plan from then on is ``r.plan``. That plan and SRPM on the true speeds are
    then timed in turns on the same cluster (:func:`_interleaved_medians`).
    """
    speeds = [0.25, 0.31, 0.63, 1.0]
    x, d = demo_data(4096, (257, 384, 16))
    common = dict(hidden=384, learning_rate=1e-4, interval=20)
    with dask_rpm.local_cluster(speeds, scale=0.25) as cluster, Client(cluster) as client:
        r = fit(x, d, iterations=40, mapping="drpm", client=client, progress="none", **common)
        assert len(r.plans) == 2  # uniform, then the one remap at 20: r.plan ran iterations 20..40
        med = _interleaved_medians(
            client,
            x,
            d,
            {
                "drpm": dict(mapping=r.plan, **common),
                "srpm-true": dict(mapping="srpm", abilities=speeds, **common),
            },
        )
        record_property("medians", med)  # in the JUnit XML, also when the guard skips
        record_property("in_run_drpm", float(np.median(r.history["iteration_time"].values[22:])))
        _skip_if_emulation_violated(client)
    first = r.history["ability"].isel(check=0).values
    truth = np.array(speeds) / sum(speeds)
    np.testing.assert_allclose(first, truth, rtol=0.10)
    assert r.remaps and r.remaps[0]["kind"] == "whole"
    assert med["drpm"] <= 1.15 * med["srpm-true"], med


@pytest.mark.slow
def test_step_change_is_detected_and_remapped(record_property):
    """One worker becomes 3x slower at iteration 30: the next check remaps, time returns near the new optimum.

    The plan DRPM ends with and SRPM on the new true speeds are timed in turns
    on the same cluster afterwards, worker 1 held at its new speed.
    """
    speeds = [1.0, 1.0, 0.5, 0.5]
    new_speeds = [1.0, 1.0 / 3.0, 0.5, 0.5]
    x, d = demo_data(4096, (257, 384, 16))
    schedule = {1: [(30, 1.0 / 3.0)]}
    common = dict(hidden=384, learning_rate=1e-4, interval=20)
    with (
        dask_rpm.local_cluster(speeds, scale=0.25, schedule=schedule) as cluster,
        Client(cluster) as client,
    ):
        r = fit(
            x,
            d,
            iterations=80,
            mapping="drpm",
            abilities=speeds,
            client=client,
            progress="none",
            **common,
        )
        # Worker 1 kept at its new speed (a new run restarts the iteration
        # schedule; the override outlasts it).
        set_speed(client, 1, 1.0 / 3.0)
        med = _interleaved_medians(
            client,
            x,
            d,
            {
                "drpm": dict(mapping=r.plan, **common),
                "srpm-true": dict(mapping="srpm", abilities=new_speeds, **common),
            },
        )
        assert emulation_report(client)[1]["current_speed"] == pytest.approx(1.0 / 3.0)
        record_property("medians", med)  # in the JUnit XML, also when the guard skips
        record_property("in_run_drpm", float(np.median(r.history["iteration_time"].values[62:])))
        _skip_if_emulation_violated(client)
    kinds = {rec["iteration"]: rec["kind"] for rec in r.remaps}
    assert 40 in kinds, r.remaps  # the first check after the change
    est = r.history["ability"].sel(check=r.history["check_iteration"] == 40).values[0]
    assert est[1] < 0.6 * est[0]
    assert med["drpm"] <= 1.15 * med["srpm-true"], med


@pytest.mark.slow
def test_resume_continues_drpm_on_the_plan_it_had_reached():
    """A checkpoint carries DRPM's plan, checks and estimator windows; fit(resume=...) starts on that plan.

    Without the state a resumed DRPM run starts uniform and spends its first
    check on a forced whole remap (the slow iterations before it included);
    with it, the first block already runs the plan reached before the stop.
    Both end with the weights of serial BP.
    """
    x, d = demo_data(1024, (17, 48, 4))
    kw = dict(hidden=48, learning_rate=1e-3, mapping="drpm", interval=10, progress="none")
    saved: dict = {}
    with dask_rpm.local_cluster([1.0, 0.5, 0.25]) as cluster, Client(cluster) as client:
        before = fit(
            x,
            d,
            iterations=20,
            checkpoint_every=20,
            on_checkpoint=saved.update,
            client=client,
            **kw,
        )
        assert before.remaps[0]["iteration"] == 10 and "first check" in before.remaps[0]["reason"]
        resumed = fit(x, d, iterations=40, resume=saved, client=client, **kw)
        afresh = fit(
            x,
            d,
            iterations=40,
            resume={k: v for k, v in saved.items() if k != "drpm"},
            client=client,
            **kw,
        )
    state = saved["drpm"]
    assert state["plan"] == before.plan.to_dict() and before.plan.method != "uniform"
    assert [it for it, _ in state["checks"]] == [10]
    assert len(state["windows"]) == 3 and all(len(rows) == 6 for rows in state["windows"].values())
    # At once on the plan reached before the stop; the restored check is not a "first check".
    assert resumed.plans[0].to_dict() == before.plan.to_dict()
    assert list(resumed.history["check_iteration"].values[:1]) == [10]
    assert not any("first check" in rec.get("reason", "") for rec in resumed.remaps), resumed.remaps
    # Without the state: uniform again, and a forced whole remap at the first check.
    assert afresh.plans[0].method == "uniform"
    assert (
        afresh.remaps[0]["iteration"] == 30
        and "first check without initial abilities" in afresh.remaps[0]["reason"]
    )
    W, V = fit_serial(x, d, hidden=48, iterations=40, learning_rate=1e-3).params
    for r in (resumed, afresh):
        np.testing.assert_allclose(r.params[0], W, rtol=RTOL, atol=0)
        np.testing.assert_allclose(r.params[-1], V, rtol=RTOL, atol=0)


def test_drpm_state_reads_the_settings_once_per_run():
    from dask_rpm.drpm.settings import DRPMSettings
    from dask_rpm.engine.drpm import DRPMState

    with dask.config.set({"rpm.drpm.window": 3, "rpm.drpm.outlier": 0, "rpm.drpm.idle": False}):
        state = DRPMState(initial_abilities=True, auto=False)
    # what it read when the run started, not what the configuration says later
    assert state.estimator.window == 3 and state.settings.outlier == 0.0 and not state.idle
    given = DRPMSettings.from_config(window=4)
    assert DRPMState(initial_abilities=True, auto=False, settings=given).estimator.window == 4
    with dask.config.set({"rpm.drpm.column-times": "t2"}):
        with pytest.raises(ValueError, match="column-times must be 'tc'"):
            DRPMState(initial_abilities=True, auto=False)
