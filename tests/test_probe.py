"""The probing stage (issue #4): kernel throughput per worker, links, and fit(abilities="probe").

The machine may be shared: the emulated cluster runs at a scale well below one
core (the default scale needs ~0.9 of a core for the fast worker, which any
other load on two cores breaks - the probe then reports ``overruns``), and
the ratio check allows a few probes, as tests/test_emulation.py does for
timing assertions. Measured here on a quiet machine, one default probe of the
NETtalk job misses the emulated ratios by ~5 % on average.
"""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
import xarray as xr
from distributed import Client, LocalCluster, get_task_stream

import dask_rpm
from dask_rpm.probe import probe
from dask_rpm.probe.driver import clean_seconds

SPEEDS = (1.0, 0.5, 0.25)
SCALE = 0.25  # fraction of a core for speed 1.0; all three need 0.44 cores
SHAPE, SAMPLES = (203, 80, 26), 1024  # the paper's NETtalk job


@pytest.fixture(scope="module")
def emulated():
    with dask_rpm.local_cluster(SPEEDS, scale=SCALE, dashboard_address=None) as cluster:
        with Client(cluster) as client:
            yield client


@pytest.fixture(scope="module")
def probed(emulated):
    """One probe of the NETtalk job, shared by the structure tests."""
    with get_task_stream(emulated) as stream:
        ds = probe(emulated, shape=SHAPE, samples=SAMPLES)
    return ds, stream.data


def _ratio_error(ds: xr.Dataset) -> float:
    th = ds["throughput"].values
    return float(np.max(np.abs((th / th[0]) / np.asarray(SPEEDS) - 1.0)))


# ---------------------------------------------------------------- must-show


@pytest.mark.parametrize(
    "shape,samples",
    [(SHAPE, SAMPLES), ((9, 7, 4), 61), ((50, 400, 10), 20000)],
    ids=["nettalk", "tiny-job", "large-job"],
)
def test_probe_recovers_emulated_speed_ratios_within_10_percent(emulated, shape, samples):
    # Other load can spoil one probe, and on this VM a worker *process* can run
    # the same kernel 20-30 % faster or slower than its siblings for seconds
    # (seen with one worker alone too: a host effect, and one the probe rightly
    # reports). So: three probes on the shared cluster, then two on a fresh one.
    attempts = []

    def attempt(client):
        ds = probe(client, shape=shape, samples=samples)
        attempts.append(
            (
                _ratio_error(ds),
                ds["throughput"].values / ds["throughput"].values[0],
                ds.attrs["probe_seconds"],
                ds["overruns"].values.tolist(),
            )
        )
        return attempts[-1][0] < 0.10

    ok = any(attempt(emulated) for _ in range(3))
    if not ok:
        with dask_rpm.local_cluster(SPEEDS, scale=SCALE, dashboard_address=None) as cluster:
            with Client(cluster) as client:
                ok = any(attempt(client) for _ in range(2))
    assert ok, (
        f"measured speed ratios {[np.round(a[1], 3).tolist() for a in attempts]} vs {SPEEDS}, "
        f"overrun repetitions per worker {[a[3] for a in attempts]} "
        f"(load average {os.getloadavg()[0]:.1f})"
    )
    assert all(a[2] < 5.0 for a in attempts), attempts


def test_clean_seconds_drops_overrun_repetitions_while_at_least_half_stay():
    nan = np.nan
    seconds = np.array([[1.0, 1.0, 1.0], [9.0, 9.0, 1.0], [1.1, 9.0, nan], [9.0, 9.0, nan]])
    overran = np.array([[0, 0, 0], [1, 1, 0], [0, 1, 0], [1, 1, 0]], dtype=bool)
    out = clean_seconds(seconds, overran)
    # worker 0: two of four overran -> dropped; worker 1: three of four -> all kept
    # (the load is then its speed); worker 2: none overran, the skipped stay NaN
    np.testing.assert_array_equal(out[:, 0], [1.0, nan, 1.1, nan])
    np.testing.assert_array_equal(out[:, 1], seconds[:, 1])
    np.testing.assert_array_equal(out[:, 2], seconds[:, 2])
    assert np.isfinite(seconds).sum() == 10  # the input is not modified


# ---------------------------------------------------------------- structure


def test_dataset_structure_and_units(probed):
    ds, _ = probed
    n_workers = len(SPEEDS)
    assert isinstance(ds, xr.Dataset)
    assert ds.sizes["worker"] == n_workers
    assert ds["worker"].values.tolist() == list(range(n_workers))
    assert ds["address"].dims == ("worker",)
    assert all(str(a).startswith("tcp://") for a in ds["address"].values)
    assert ds["throughput"].dims == ("worker",)
    assert ds["throughput"].attrs["units"] == "work units/s"
    assert ds["throughput"].attrs["description"]
    assert ds["seconds"].dims == ("repeat", "worker")
    assert ds["seconds"].attrs["units"] == "s"
    assert ds.sizes["repeat"] == dask_rpm.config.get("probe.repeats")
    assert np.all(ds["throughput"].values > 0) and np.all(np.isfinite(ds["throughput"].values))
    assert ds["ability"].sum() == pytest.approx(1.0)
    # throughput = work per repetition / mean repetition time with 1/8 cut at each
    # end, over the repetitions that did not overrun (when at least half did not)
    overran = ds["overran"].values
    assert ds["overran"].dims == ("repeat", "worker") and overran.dtype == bool
    np.testing.assert_array_equal(overran.sum(axis=0), ds["overruns"].values)
    for i in range(n_workers):
        sec = ds["seconds"].values[:, i]
        if (~overran[:, i]).sum() * 2 >= len(sec):
            sec = sec[~overran[:, i]]
        sec = np.sort(sec)
        cut = int(len(sec) * 0.125)
        expect = ds["work"].values[i] / sec[cut : len(sec) - cut].mean()
        assert ds["throughput"].values[i] == pytest.approx(expect, rel=1e-12)
    assert np.all(np.isfinite(ds["seconds"].values))  # every repetition ran (within budget)
    assert np.all(ds["cpu_seconds"].values > 0) and ds["cpu_seconds"].attrs["units"] == "s"
    assert ds["overruns"].dims == ("worker",)
    np.testing.assert_allclose(
        ds["work"].values, ds["loops"].values * ds.attrs["block_hidden"] * ds.attrs["block_samples"]
    )
    # the probe block comes from the job: all n inputs and l outputs, at most the average rectangle
    n, m, l = SHAPE
    assert (ds.attrs["block_inputs"], ds.attrs["block_outputs"]) == (n, l)
    assert 1 <= ds.attrs["block_hidden"] <= math.ceil(m / n_workers)
    assert 1 <= ds.attrs["block_samples"] <= math.ceil(SAMPLES / n_workers)
    assert ds.attrs["shape"] == "203-80-26" and ds.attrs["samples"] == SAMPLES
    assert "EMULATED" in ds.attrs["emulation"]
    # attributes survive netCDF (plain numbers and strings only)
    for v in ds.attrs.values():
        assert isinstance(v, (int, float, str, np.integer, np.floating)), v


def test_probe_cost_is_reported_and_small(probed):
    ds, _ = probed
    assert 0 < ds.attrs["compute_seconds"] < ds.attrs["probe_seconds"]
    assert ds.attrs["probe_seconds"] < 5.0
    # one repetition takes a few tens of ms on every worker
    med = np.nanmedian(ds["seconds"].values, axis=0)
    assert np.all(med < 0.2), med


def test_latency_and_bandwidth_are_positive_and_finite(probed):
    ds, _ = probed
    lat, bw = ds.attrs["latency"], ds.attrs["bandwidth"]
    assert math.isfinite(lat) and 0 < lat < 1.0
    assert math.isfinite(bw) and bw > 1e6  # loopback moves far more than 1 MB/s
    assert ds.attrs["latency_units"] == "s" and ds.attrs["bandwidth_units"] == "bytes/s"
    assert ds.attrs["links"] == "0->1, 1->2, 2->0"


def test_probe_tasks_are_pinned_and_named_in_the_task_stream(probed):
    ds, stream = probed
    name = f"rpm-probe-{ds.attrs['token']}"
    addresses = list(ds["address"].values)
    tasks = [t for t in stream if isinstance(t["key"], tuple) and t["key"][0] == name]
    repeats = ds.sizes["repeat"]
    assert len(tasks) == (1 + repeats) * len(addresses)  # warm-up and timed repetitions
    for t in tasks:
        _, rep, w = t["key"]
        assert 0 <= rep <= repeats
        assert t["worker"] == addresses[w]  # pinned to its worker
    # all workers were probed at the same time (concurrently, as in training)
    spans = {}
    for t in tasks:
        _, _, w = t["key"]
        for ss in t["startstops"]:
            if ss["action"] == "compute":
                lo, hi = spans.get(w, (math.inf, -math.inf))
                spans[w] = (min(lo, ss["start"]), max(hi, ss["stop"]))
    assert max(lo for lo, _ in spans.values()) < min(hi for _, hi in spans.values())
    links = [
        t
        for t in stream
        if isinstance(t["key"], tuple) and t["key"][0] == f"rpm-link-{ds.attrs['token']}"
    ]
    assert links


def test_worker_subset_and_order(emulated):
    info = emulated.scheduler_info(n_workers=-1)
    addresses = dask_rpm.ordered_workers(info)
    ds = probe(
        emulated, shape=(9, 7, 4), samples=61, workers=[addresses[2], addresses[0]], repeats=3
    )
    assert ds["address"].values.tolist() == [addresses[2], addresses[0]]
    assert ds.sizes == {"worker": 2, "repeat": 3}
    assert ds["throughput"].values[1] > ds["throughput"].values[0]  # speed 1.0 beats 0.25
    assert ds.attrs["links"] == "0->1, 1->0"


def test_one_worker_has_no_links():
    with LocalCluster(
        n_workers=1, threads_per_worker=1, processes=False, dashboard_address=":0"
    ) as cluster:
        with Client(cluster) as client:
            ds = probe(client, shape=(9, 7, 4), samples=61, repeats=2)
    assert ds.sizes["worker"] == 1
    assert np.isfinite(ds["throughput"].values[0]) and ds["throughput"].values[0] > 0
    assert math.isnan(ds.attrs["latency"]) and math.isnan(ds.attrs["bandwidth"])
    assert "one worker" in ds.attrs["link_note"]
    assert "emulation" not in ds.attrs


def test_probe_uses_the_current_client(emulated):
    with emulated.as_current():
        ds = probe(shape=(9, 7, 4), samples=61, repeats=2)
    assert ds.sizes["worker"] == len(SPEEDS)


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "shape,samples,match",
    [
        ((203, 80), 1024, r"shape=\(203, 80\); give \(n, m, l\)"),
        ((203, 0, 26), 1024, r"shape=.*whole numbers >= 1"),
        ((203, -80, 26), 1024, r"shape=.*whole numbers >= 1"),
        ((203, 80.5, 26), 1024, r"shape="),
        ("203-80-26", 1024, r"shape='203-80-26'"),
        (None, 1024, r"shape=None"),
        ((203, 80, 26), 0, r"samples=0; give the number of training samples, a whole number >= 1"),
        ((203, 80, 26), -5, r"samples=-5"),
        ((203, 80, 26), 10.5, r"samples=10.5"),
        ((203, 80, 26), True, r"samples=True"),
    ],
)
def test_bad_input_raises_value_error(shape, samples, match):
    # validated before a client is even looked up
    with pytest.raises(ValueError, match=match):
        probe(shape=shape, samples=samples)


def test_bad_options_and_workers_raise_value_error(emulated):
    with pytest.raises(ValueError, match="repeats=0"):
        probe(emulated, shape=SHAPE, samples=SAMPLES, repeats=0)
    with pytest.raises(ValueError, match="max_seconds=-1"):
        probe(emulated, shape=SHAPE, samples=SAMPLES, max_seconds=-1)
    with pytest.raises(ValueError, match="not in the cluster"):
        probe(emulated, shape=SHAPE, samples=SAMPLES, workers=["tcp://127.0.0.1:1"])
    first = dask_rpm.ordered_workers(emulated.scheduler_info(n_workers=-1))[0]
    with pytest.raises(ValueError, match="more than once"):
        probe(emulated, shape=SHAPE, samples=SAMPLES, workers=[first, first])


# ---------------------------------------------------------------- fit


def test_fit_with_probed_abilities(emulated):
    rng = np.random.default_rng(0)
    s, n, l, m = 240, 12, 3, 24
    x = rng.normal(size=(s, n))
    d = rng.uniform(0.1, 0.9, size=(s, l))
    r = dask_rpm.fit(
        x, d, hidden=m, iterations=5, mapping="srpm", abilities="probe", client=emulated
    )
    assert isinstance(r.probe, xr.Dataset)
    assert r.probe.attrs["shape"] == f"{n}-{m}-{l}" and r.probe.attrs["samples"] == s
    th = r.probe["throughput"].values
    np.testing.assert_allclose(r.plan.abilities, th / th.sum())
    # the plan follows the probe: the fastest worker gets the largest area
    areas = {w: r.plan.rectangle(w).area for w in r.plan.planned_workers}
    assert max(areas, key=areas.get) == int(np.argmax(th)) == 0
    assert r.history.sizes["iteration"] == 5
    # training is still exact
    W = dask_rpm.fit_serial(x, d, hidden=m, iterations=5).params[0]
    np.testing.assert_allclose(r.params[0], W, rtol=1e-10, atol=0)


# ---------------------------------------------------------------- link classes
def test_link_class_pairs_by_host_and_group():
    from dask_rpm.probe import link_class_pairs

    addresses = ["tcp://10.0.0.1:1", "tcp://10.0.0.1:2", "tcp://10.0.0.2:1", "tcp://10.0.0.3:1"]
    pairs = link_class_pairs(addresses, ["a", "a", "a", "b"], 2)
    assert pairs["host"] == [(0, 1), (1, 0)]
    assert (
        all({i, j} & {2} and 3 not in (i, j) for i, j in pairs["group"])
        and len(pairs["group"]) == 2
    )
    assert all(3 in (i, j) for i, j in pairs["across"]) and len(pairs["across"]) == 2
    assert set(link_class_pairs(addresses[:2], ["a", "b"], 3)) == {"across"}
    with pytest.raises(ValueError, match="3 group labels given for 4 workers"):
        link_class_pairs(addresses, ["a", "a", "b"], 2)


def test_probe_measures_link_classes_and_gives_a_network(emulated):
    from dask_rpm.comm import Interconnect
    from dask_rpm.probe import probe_network

    ds = probe(emulated, shape=(9, 7, 4), samples=61, repeats=3, groups=["x", "x", "y"])
    # one machine: workers 0 and 1 share host and group, worker 2 is in another group
    for cls in ("host", "across"):
        assert ds.attrs[f"latency_{cls}"] > 0 and ds.attrs[f"bandwidth_{cls}"] > 0, cls
    assert "latency_group" not in ds.attrs  # no two workers of one group on different hosts here
    net = probe_network(ds)
    assert isinstance(net, Interconnect) and set(net.classes) == {"host", "across"}
    assert net.groups == ("x", "x", "y")
    assert net.link_class(0, 1) == "host" and net.link_class(0, 2) == "across"
    assert net.link(0, 2).latency == ds.attrs["latency_across"]
    with pytest.raises(ValueError, match="2 group labels given for 3 workers"):
        info = emulated.scheduler_info(n_workers=-1)
        probe(
            emulated,
            shape=(9, 7, 4),
            samples=61,
            workers=dask_rpm.ordered_workers(info),
            groups=["x", "y"],
        )
