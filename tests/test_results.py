"""Plans and histories as labelled xarray Datasets; result.plot() (dask_rpm.results)."""

from __future__ import annotations

import os
import sys
from functools import partial

import numpy as np
import pytest
import xarray as xr
from distributed import Client, LocalCluster
from problems import regression_problem

import dask_rpm
from dask_rpm import Plan, make_plan
from dask_rpm.plan.partition import PlanError
from dask_rpm.results import plan_dataset, plans_dataset, plot_plan

PAPER = ([0.05, 0.10, 0.20, 0.30, 0.35], (203, 80, 26), 1024)


_problem = partial(regression_problem, s=64)


@pytest.fixture(scope="module")
def drpm_result():
    """A DRPM run that remaps (no initial abilities: whole remap at the first check)."""
    x, d = _problem()
    with LocalCluster(
        n_workers=3, threads_per_worker=1, processes=False, dashboard_address=":0"
    ) as cluster:
        with Client(cluster) as client:
            yield dask_rpm.fit(
                x,
                d,
                hidden=9,
                iterations=16,
                learning_rate=0.05,
                interval=6,
                mapping="drpm",
                client=client,
                progress=False,
            )


# ------------------------------------------------------------------- plans
def test_plan_dataset_matches_the_plan_with_units():
    plan = make_plan(*PAPER)
    ds = plan.to_dataset()
    assert ds.sizes["worker"] == 5
    for w in range(5):
        r = plan.rectangle(w)
        assert (int(ds.sample_start[w]), int(ds.sample_stop[w])) == r.samples
        assert (int(ds.hidden_start[w]), int(ds.hidden_stop[w])) == r.hidden
        assert int(ds.work[w]) == r.area
        assert int(ds.column[w]) == r.column
    # The paper's worked example: {P1, P2, P3} | {P4, P5}.
    assert list(ds.column.values) == [0, 0, 0, 1, 1]
    assert float(ds.work_share.sum()) == pytest.approx(1.0)
    assert float(ds["load"].max()) == pytest.approx(plan.imbalance())
    assert ds.attrs["t_comm"] == pytest.approx(73913.6)
    for name, var in ds.data_vars.items():
        assert var.attrs.get("description"), name
        assert "units" in var.attrs, name
    assert (
        ds.sample_start.attrs["units"] == "samples"
        and ds.hidden_start.attrs["units"] == "hidden units"
    )


def test_plan_dataset_round_trips_through_netcdf(tmp_path):
    plan = make_plan(*PAPER).with_workers([f"tcp://10.0.0.{i}:1" for i in range(5)])
    path = tmp_path / "plan.nc"
    plan.to_dataset().to_netcdf(path)
    with xr.open_dataset(path) as ds:
        back = Plan.from_dataset(ds)
        assert list(ds.address.values) == list(plan.workers)
    assert back == plan and back.workers == plan.workers


def test_excluded_workers_are_marked_not_planned():
    plan = make_plan([1.0, 1.0, 1e-6], (5, 4, 2), 50)
    assert plan.excluded == (2,)
    ds = plan.to_dataset()
    assert list(ds.planned.values) == [True, True, False]
    assert int(ds.column[2]) == -1 and int(ds.work[2]) == 0 and np.isnan(float(ds["load"][2]))


def test_from_dataset_without_a_plan_says_how_to_make_one():
    with pytest.raises(PlanError, match="Plan.to_dataset"):
        Plan.from_dataset(xr.Dataset())


def test_plans_dataset_stacks_plans_with_their_start():
    a = make_plan(*PAPER)
    b = make_plan([0.2, 0.2, 0.2, 0.2, 0.2], PAPER[1], PAPER[2])
    ds = plans_dataset([a, b], [{"iteration": 20, "kind": "whole"}])
    assert ds.sizes == {"plan": 2, "worker": 5}
    assert list(ds.from_iteration.values) == [0, 20] and list(ds.kind.values) == [
        "initial",
        "whole",
    ]
    xr.testing.assert_equal(
        ds.isel(plan=1).sample_stop.drop_vars("plan"),
        plan_dataset(b).sample_stop.reset_coords(drop=True),
    )
    assert ds.t_comm.attrs["units"] == "elements"
    with pytest.raises(ValueError, match="plans is empty"):
        plans_dataset([])


# ------------------------------------------------------------- fit results
def test_history_and_plans_of_a_run_are_described(drpm_result):
    h = drpm_result.history
    assert "title" in h.attrs and h.attrs["samples"] == 64
    assert h.iteration.attrs["units"] == "iterations"
    assert h.check_iteration.attrs["units"] == "iterations"
    for name, var in h.data_vars.items():
        assert var.attrs.get("description") and "units" in var.attrs, name
    ds = drpm_result.plans_dataset()
    assert ds.sizes["plan"] == len(drpm_result.plans) == len(drpm_result.remaps) + 1 >= 2
    assert int(ds.from_iteration[1]) == drpm_result.remaps[0]["iteration"]
    assert set(ds.address.values[-1]) == set(drpm_result.plan.workers)


def test_plot_writes_a_nonblank_png(drpm_result, tmp_path):
    from PIL import Image

    path = tmp_path / "run.png"
    fig = drpm_result.plot(path)
    assert len(fig.axes) == 4  # error, times, first plan, last plan
    assert [f for f in os.listdir(tmp_path)] == ["run.png"]  # no temporary file left
    img = np.asarray(Image.open(path).convert("RGB"), dtype=float)
    assert img.shape[0] > 300 and img.shape[1] > 300
    assert img.std() > 20  # not a blank page
    assert len(np.unique(img.reshape(-1, 3)[::7], axis=0)) > 50  # lines, text, coloured rectangles
    # the rectangles are filled with the workers' colours
    colours = {
        tuple(np.round(np.array(fig.axes[3].patches[i].get_facecolor()[:3]) * 255))
        for i in range(3)
    }
    assert len(colours) == 3


def test_plot_plan_draws_every_rectangle():
    ax = plot_plan(make_plan(*PAPER))
    assert len(ax.patches) == 5 and sorted(t.get_text().split("\n")[0] for t in ax.texts) == [
        f"P{i}" for i in range(1, 6)
    ]
    assert ax.get_ylim() == (80, 0)


def test_plot_save_into_missing_directory_fails_clearly(drpm_result, tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        drpm_result.plot(tmp_path / "nope" / "run.png")


def test_plot_without_matplotlib_says_how_to_install(drpm_result, monkeypatch):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    with pytest.raises(ImportError, match=r"pip install 'dask-rpm\[plot\]'"):
        drpm_result.plot()


@pytest.mark.parametrize("directory", ["/sys", "/proc"])
def test_plot_save_into_unwritable_directory_names_the_path_given(drpm_result, directory):
    # /sys and /proc refuse new files even for root: the error must name the
    # caller's path, never the temporary file the figure is first written to
    path = f"{directory}/run.png"
    with pytest.raises(OSError) as info:
        drpm_result.plot(path)
    assert repr(path) in str(info.value) and ".rpm-plot-" not in str(info.value)
    assert not [f for f in os.listdir(directory) if f.startswith(".rpm-plot-")]
