"""Progress of fit: a bar on terminals, plain lines in logs, silenceable (dask_rpm.progress)."""

from __future__ import annotations

import io
import os
import re

import dask
import numpy as np
import pytest
from distributed import Client, LocalCluster
from problems import regression_problem

import dask_rpm
from dask_rpm.progress import Progress, resolve_mode

_problem = regression_problem


@pytest.fixture(scope="module")
def client3():
    with LocalCluster(
        n_workers=3, threads_per_worker=1, processes=False, dashboard_address=":0"
    ) as cluster:
        with Client(cluster) as client:
            yield client


# ------------------------------------------------------------- mode decision
def test_auto_is_log_on_a_pipe_and_bar_on_a_terminal():
    assert resolve_mode("auto", io.StringIO()) == "log"
    master, slave = os.openpty()
    try:
        with open(slave, "w", closefd=True) as tty:
            assert tty.isatty()
            assert resolve_mode("auto", tty) == "bar"
    finally:
        os.close(master)


def test_config_default_and_booleans():
    with dask.config.set({"rpm.train.progress": "none"}):
        assert resolve_mode(None, io.StringIO()) == "none"
    assert resolve_mode(False) == "none"
    assert resolve_mode(True, io.StringIO()) == "log"
    assert resolve_mode("BAR") == "bar"


@pytest.mark.parametrize("bad", ["fancy", 3, ""])
def test_bad_mode_says_what_is_valid(bad):
    with pytest.raises(ValueError, match=r"progress=.*'auto', 'bar', 'log', 'none'"):
        resolve_mode(bad)
    with dask.config.set({"rpm.train.progress": "fancy"}):
        with pytest.raises(ValueError, match=r"rpm\.train\.progress='fancy'"):
            resolve_mode(None)


# ------------------------------------------------------------------ formats
def test_log_lines_are_throttled_but_keep_first_last_and_remaps():
    out = io.StringIO()
    p = Progress("log", 100, stream=out, min_interval=3600)
    p.update(20, error=12.5, iteration_time=0.0123)
    p.update(40, error=10.0, iteration_time=0.0120)  # throttled
    p.update(
        60,
        error=8.0,
        iteration_time=0.0119,
        remaps=[
            {
                "iteration": 60,
                "kind": "column",
                "bytes": 640,
                "sample_bytes": 4096,
                "reason": "t_min/t_max < 0.8",
            }
        ],
    )
    p.update(
        80,
        error=7.0,
        iteration_time=0.0118,
        remaps=[{"iteration": 60, "kind": "column", "bytes": 640}],
    )
    p.update(
        100,
        error=6.0,
        iteration_time=0.0117,
        remaps=[{"iteration": 60, "kind": "column", "bytes": 640}],
    )
    p.close()
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue()
    assert lines[0].startswith(
        "dask-rpm fit: iteration 20/100 (20%), error 12.5, 12.3 ms/iteration, last remap -"
    )
    assert lines[1] == (
        "dask-rpm fit: column remap at iteration 60, 640 weight bytes moved, "
        "4096 sample bytes re-read (t_min/t_max < 0.8)"
    )
    assert (
        lines[2].startswith("dask-rpm fit: iteration 60/100 (60%), error 8,")
        and "last remap column@60" in lines[2]
    )
    assert lines[3].startswith("dask-rpm fit: iteration 100/100 (100%), error 6,")
    assert (
        len(lines) == 4
    )  # 40 and 80 were throttled; the remap list repeated is not reported twice


def test_bar_redraws_in_place_and_ends_the_line():
    out = io.StringIO()
    p = Progress("bar", 50, stream=out, width=90)
    p.update(25, error=3.25, iteration_time=0.004, remaps=[{"iteration": 20, "kind": "whole"}])
    half = p.bar_text()
    p.update(50, error=1.5, iteration_time=0.005)
    p.close("diverged")
    text = out.getvalue()
    assert text.count("\r") == 2
    assert re.search(r"rpm \[#+\.+\] 25/50  error 3\.25  4\.0 ms/it  remap: whole@20  ETA", half)
    cells = half.split("[", 1)[1].split("]", 1)[0]
    assert abs(cells.count("#") - cells.count(".")) <= 1  # half done
    assert len(half) == 89  # width - 1: never wraps
    last = text.split("\r")[-1]
    assert "50/50" in last and "error 1.5" in last and "." not in last.split("]")[0].split("[")[1]
    assert text.endswith("\ndask-rpm fit: stopped after 50 iteration(s): diverged\n")


def test_none_writes_nothing():
    out = io.StringIO()
    p = Progress("none", 10, stream=out)
    p.update(10, error=1.0, iteration_time=0.1, remaps=[{"iteration": 5, "kind": "whole"}])
    p.close("stopped")
    assert out.getvalue() == ""


# ---------------------------------------------------- through fit on a cluster
def test_fit_logs_progress_from_the_real_run(client3, capsys):
    x, d = _problem()
    with dask.config.set({"rpm.train.progress-interval": 0.0}):
        result = dask_rpm.fit(
            x,
            d,
            hidden=7,
            iterations=12,
            learning_rate=0.05,
            interval=4,
            mapping="srpm",
            abilities=[1, 2, 3],
            client=client3,
            progress="log",
        )
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("dask-rpm fit: iteration")]
    assert [re.search(r"iteration (\d+)/12", ln).group(1) for ln in lines] == ["4", "8", "12"]
    # The error shown is the history's error of the block's last iteration.
    shown = float(re.search(r"error ([-0-9.e+]+),", lines[-1]).group(1))
    np.testing.assert_allclose(shown, result.history["error"].values[-1], rtol=1e-3)
    ms = float(re.search(r"([0-9.]+) ms/iteration", lines[-1]).group(1))
    assert ms > 0


def test_fit_bar_and_silence(client3, capsys):
    x, d = _problem()
    dask_rpm.fit(
        x,
        d,
        hidden=7,
        iterations=6,
        learning_rate=0.05,
        interval=3,
        mapping="uniform",
        client=client3,
        progress="bar",
    )
    err = capsys.readouterr().err
    assert err.count("\r") == 2 and "6/6" in err and err.endswith("\n")
    dask_rpm.fit(
        x,
        d,
        hidden=7,
        iterations=6,
        learning_rate=0.05,
        interval=3,
        mapping="uniform",
        client=client3,
        progress=False,
    )
    err = capsys.readouterr().err
    assert "dask-rpm fit" not in err and "rpm [" not in err


def test_fit_rejects_a_bad_progress_before_work(client3):
    x, d = _problem()
    with pytest.raises(ValueError, match="progress='loud'"):
        dask_rpm.fit(x, d, hidden=7, iterations=2, client=client3, progress="loud")
