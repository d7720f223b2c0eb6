"""Every bad input in docs/errors.md, exercised: the real CLI (``main()``) and the Python API.

Each case runs the real thing on real files in a fresh directory and checks
what the standards ask of a refusal: the CLI exits 2 with one line on stderr,
nothing is written or changed in the directory, and the message is the one
docs/errors.md shows (paths shown as ``<dir>``). The last test keeps the
document and these cases in sync, both ways.

``python tests/test_errors.py`` prints the cases as the Markdown of
docs/errors.md (with the messages the code gives now), to update the page.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pytest
import yaml

DOC = Path(__file__).resolve().parents[1] / "docs" / "errors.md"


class Case(NamedTuple):
    """One bad input: where it is given, what is wrong, and how to provoke it (returns the message)."""

    id: str
    section: str
    what: str
    run: Callable[[Path, Any], str]


# --------------------------------------------------------------------------
# Helpers: real files, the real CLI
# --------------------------------------------------------------------------

JOB = {
    "data": "data.nc",
    "hidden": 4,
    "iterations": 3,
    "learning-rate": 0.01,
    "output": "result.nc",
    "workers": {"local": {"speeds": [1.0]}},
}


def _arrays(s: int = 40, n: int = 5, l: int = 2) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.normal(size=(s, n)), rng.uniform(0.1, 0.9, size=(s, l))


def _data(tmp: Path, name: str = "data.nc", x: Any = None, d: Any = None) -> Path:
    from dask_rpm.nn.data import write_dataset

    xa, da = _arrays()
    write_dataset(tmp / name, xa if x is None else x, da if d is None else d)
    return tmp / name


def _job(tmp: Path, name: str = "job.yaml", **over: Any) -> Path:
    job = {**JOB, **{k.replace("_", "-"): v for k, v in over.items()}}
    job = {k: v for k, v in job.items() if v is not None}
    (tmp / name).write_text(yaml.safe_dump(job))
    return tmp / name


def _listing(tmp: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(tmp)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(tmp.rglob("*"))
    }


def _norm(text: str, tmp: Path) -> str:
    return " ".join(text.split()).replace(str(tmp), "<dir>")


def _cli(tmp: Path, *argv: str) -> str:
    """Run ``dask-rpm ARGV`` in-process in ``tmp``: exit 2, one line on stderr, nothing written."""
    from dask_rpm.cli import main

    before = _listing(tmp)
    err = io.StringIO()
    cwd = os.getcwd()
    os.chdir(tmp)
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = main(list(argv))
    finally:
        os.chdir(cwd)
    lines = err.getvalue().strip().splitlines()
    assert code == 2, (code, lines)
    assert len(lines) == 1, lines
    assert _listing(tmp) == before, "a refused command wrote or changed files"
    return _norm(lines[0], tmp)


def _train(tmp: Path, *extra: str, **over: Any) -> str:
    """``dask-rpm train --config job.yaml`` on a valid job changed by ``over`` (``data.nc`` exists)."""
    if not (tmp / "data.nc").exists():
        _data(tmp)
    job = _job(tmp, **over)
    return _cli(tmp, "train", "--config", str(job), *extra)


def _api(tmp: Path, call: Callable[[], Any], error: type = ValueError) -> str:
    before = _listing(tmp)
    with pytest.raises(error) as info:
        call()
    assert _listing(tmp) == before
    return _norm(f"{type(info.value).__name__}: {info.value}", tmp)


def _fit(
    tmp: Path, client: Any, x: Any = None, d: Any = None, error: type = ValueError, **kw: Any
) -> str:
    """``dask_rpm.fit`` refusing before any work: no iteration is timed anywhere."""
    from dask_rpm import fit

    xa, da = _arrays()
    args = {
        "hidden": 4,
        "iterations": 3,
        "learning_rate": 0.01,
        "client": client,
        "progress": "none",
        **kw,
    }
    before = _tasks(client)
    msg = _api(tmp, lambda: fit(xa if x is None else x, da if d is None else d, **args), error)
    assert _tasks(client) == before, "fit ran iterations before refusing"
    return msg


def _tasks(client: Any) -> int:
    """Iterations recorded by the scheduler plugin over all runs (every worker streams each one it times)."""

    def count(dask_scheduler: Any) -> int:
        plugin = dask_scheduler.plugins.get("rpm")
        return 0 if plugin is None else sum(len(r.log) for r in plugin.runs.values())

    return client.run_on_scheduler(count)


def _checkpoint(tmp: Path, iteration: int = 2, **over: Any) -> None:
    """A real checkpoint written by the job ``over`` describes (by default the store ``result.checkpoint``)."""
    from dask_rpm.job import load_job, write_checkpoint

    _data(tmp)
    job = load_job(_job(tmp, "other.yaml", **over))
    n, m, l = job.shape[1], job.training.hidden, job.shape[2]
    write_checkpoint(
        job,
        {
            "iteration": iteration,
            "params": [np.zeros((m, n)), np.zeros((l, m))],
            "errors": np.ones(iteration),
        },
    )
    (tmp / "other.yaml").unlink()


#: the opt-in checkpoint file the driver writes: a ``checkpoint.path`` ending in ``.nc``
FILE_JOB = {"every": 1, "path": "result.checkpoint.nc"}


def _damaged(tmp: Path) -> None:
    """The job's default store with a valid manifest whose row file was truncated after it was written."""
    _checkpoint(tmp)
    (row,) = tmp.joinpath("result.checkpoint").glob("it*.npz")
    row.write_bytes(row.read_bytes()[:100])


def _store(tmp: Path, hidden: int = 4, damage: bool = False) -> None:
    """A real checkpoint store at ``ck`` (one row file, the manifest) of a ``5-hidden-2`` network."""
    from dask_rpm.engine import store

    (tmp / "ck").mkdir()
    store.write_whole(str(tmp / "ck"), 2, [np.zeros((hidden, 5)), np.zeros((2, hidden))], None)
    if damage:
        (row,) = tmp.joinpath("ck").glob("it*.npz")
        row.write_bytes(row.read_bytes()[:100])


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _unreachable(tmp: Path, _: Any) -> str:
    import dask

    port = _free_port()
    with dask.config.set({"distributed.comm.timeouts.connect": "2s"}):
        msg = _train(tmp, workers={"scheduler": f"tcp://127.0.0.1:{port}"})
    return msg.replace(str(port), "<port>")


def _no_client(tmp: Path, _: Any) -> str:
    code = "import numpy as np, dask_rpm\ndask_rpm.fit(np.ones((8, 3)), np.ones((8, 2)), hidden=2, iterations=1)\n"
    p = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp
    )
    assert p.returncode == 1
    name, _, msg = p.stderr.strip().splitlines()[-1].partition(": ")
    return f"{name.rsplit('.', 1)[-1]}: {msg}"


def _predict_wide(tmp: Path) -> str:
    from dask_rpm.nn.data import write_dataset

    _model(tmp)
    xa, da = _arrays(n=7)
    write_dataset(tmp / "wide.nc", xa, da)
    return _cli(tmp, "predict", "--model", "model.nc", "--data", "wide.nc", "--output", "pred.nc")


def _load_result(tmp: Path) -> str:
    import xarray as xr

    from dask_rpm.model.mlp import MLPModel

    xr.Dataset(
        {"W": (("hidden", "input"), np.zeros((2, 2)))}, attrs={"title": "dask_rpm training result"}
    ).to_netcdf(tmp / "result.nc", engine="h5netcdf")
    return _api(tmp, lambda: MLPModel.load(tmp / "result.nc"))


def _raw(tmp: Path, text: str) -> Path:
    (tmp / "job.yaml").write_text(text)
    return tmp / "job.yaml"


J, D, P, C, A = (
    "The job file (dask-rpm train --config FILE)",
    "Data files",
    "Output and checkpoint paths",
    "Command-line options",
    "The Python API (dask_rpm.fit)",
)
M = "Models (dask-rpm predict, MLPModel.load)"


def _model(tmp: Path) -> None:
    """A saved 5-input classifier ``model.nc`` and its inputs ``data.nc`` (x of width 5)."""
    from dask_rpm.model.mlp import MLPModel
    from dask_rpm.nn.network import Network

    rng = np.random.default_rng(0)
    MLPModel(
        rng.normal(size=(3, 5)),
        rng.normal(size=(2, 3)),
        Network("tanh", "cross-entropy", "softmax"),
    ).save(tmp / "model.nc")
    _data(tmp)


def _predict(tmp: Path, *argv: str) -> str:
    """``dask-rpm predict`` with ``model.nc`` and ``data.nc`` present; ``argv`` replaces the default options."""
    _model(tmp)
    opts = {"--model": "model.nc", "--data": "data.nc", "--output": "pred.nc"}
    extra = list(argv)
    for i in range(0, len(extra) - 1, 2):
        if extra[i] in opts:
            opts[extra[i]] = extra[i + 1]
    args = [a for kv in opts.items() for a in kv] + [
        a for a in extra if a.startswith("--") and a not in opts
    ]
    return _cli(tmp, "predict", *args)


def _serial_on(device: str) -> Any:
    from dask_rpm import fit_serial

    x, d = _arrays()
    return fit_serial(x, d, hidden=4, iterations=1, backend="torch", device=device)


def _local_cluster_without_gpus() -> Any:
    import dask_rpm

    before = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    try:
        return dask_rpm.local_cluster([1.0, 0.5], gpus=1)
    finally:
        if before is None:
            del os.environ["CUDA_VISIBLE_DEVICES"]
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = before


CASES = [
    # ---- the job file
    Case(
        "job-file-missing",
        J,
        "The job file does not exist.",
        lambda t, c: _cli(t, "train", "--config", "nope.yaml"),
    ),
    Case(
        "job-not-yaml",
        J,
        "The job file is not valid YAML.",
        lambda t, c: _cli(t, "train", "--config", str(_raw(t, "data: [unclosed\n"))),
    ),
    Case(
        "job-not-mapping",
        J,
        "The job file holds a list, not keys.",
        lambda t, c: _cli(t, "train", "--config", str(_raw(t, "- data.nc\n- 4\n"))),
    ),
    Case("job-unknown-key", J, "A misspelt top-level key.", lambda t, c: _train(t, itterations=5)),
    Case(
        "job-backend",
        J,
        "A `backend:` that is not known.",
        lambda t, c: _train(t, backend="tensorflow"),
    ),
    Case(
        "cli-backend",
        J,
        "`dask-rpm train --backend` that is not known.",
        lambda t, c: _train(t, "--backend", "jax"),
    ),
    Case("job-missing-data", J, "No `data:`.", lambda t, c: _train(t, data=None)),
    Case("job-missing-hidden", J, "No `hidden:`.", lambda t, c: _train(t, hidden=None)),
    Case("job-missing-output", J, "No `output:`.", lambda t, c: _train(t, output=None)),
    Case(
        "hidden-zero", J, "`hidden:` is not a whole number >= 1.", lambda t, c: _train(t, hidden=0)
    ),
    Case("hidden-text", J, "`hidden:` is text.", lambda t, c: _train(t, hidden="many")),
    Case(
        "iterations-missing",
        J,
        "Neither `iterations:` nor `target-error:`.",
        lambda t, c: _train(t, iterations=None),
    ),
    Case(
        "target-without-iterations",
        J,
        "`target-error:` without `iterations:` as the maximum.",
        lambda t, c: _train(t, iterations=None, target_error=1.0),
    ),
    Case("iterations-zero", J, "`iterations: 0`.", lambda t, c: _train(t, iterations=0)),
    Case(
        "target-error-negative",
        J,
        "A negative target error.",
        lambda t, c: _train(t, target_error=-1),
    ),
    Case(
        "learning-rate-missing",
        J,
        "No `learning-rate:`.",
        lambda t, c: _train(t, learning_rate=None),
    ),
    Case(
        "learning-rate-negative",
        J,
        "A learning rate <= 0.",
        lambda t, c: _train(t, learning_rate=-1),
    ),
    Case(
        "learning-rate-nan",
        J,
        "A learning rate that is not finite.",
        lambda t, c: _train(t, learning_rate=float("nan")),
    ),
    Case("batch-size-zero", J, "`batch-size: 0`.", lambda t, c: _train(t, batch_size=0)),
    Case(
        "mapping-unknown",
        J,
        "A mapping that is not DRPM or a planner.",
        lambda t, c: _train(t, mapping="best"),
    ),
    Case(
        "dtype-unknown",
        J,
        "A dtype other than float64 / float32.",
        lambda t, c: _train(t, dtype="float16"),
    ),
    Case("seed-negative", J, "A negative seed.", lambda t, c: _train(t, seed=-1)),
    Case(
        "min-workers-too-many",
        J,
        "`min-workers:` above the workers the job starts.",
        lambda t, c: _train(t, min_workers=3),
    ),
    Case(
        "on-worker-loss-unknown",
        J,
        "`on-worker-loss:` other than recover / raise.",
        lambda t, c: _train(t, on_worker_loss="retry"),
    ),
    Case(
        "config-train-mapping-unknown",
        J,
        "A job without `mapping:` whose `config:` sets an unknown `rpm.train.mapping` (the value"
        " a job falls back on is checked like its own).",
        lambda t, c: _train(t, mapping=None, config={"train": {"mapping": "best"}}),
    ),
    Case(
        "config-train-min-workers-too-many",
        J,
        "A job without `min-workers:` whose `rpm.train.min-workers` (here from `config:`) is above"
        " the workers it starts.",
        lambda t, c: _train(t, min_workers=None, config={"train": {"min-workers": 3}}),
    ),
    Case("time-limit-negative", J, "A time limit <= 0.", lambda t, c: _train(t, time_limit=-5)),
    Case("config-not-mapping", J, "`config:` is not a mapping.", lambda t, c: _train(t, config=5)),
    Case(
        "config-typo",
        J,
        "A misspelt setting under `config:` (checked against rpm.yaml).",
        lambda t, c: _train(t, config={"drpm": {"intervall": 10}}),
    ),
    Case(
        "config-group-not-mapping",
        J,
        "A group of settings given a value.",
        lambda t, c: _train(t, config={"drpm": 5}),
    ),
    Case("workers-missing", J, "No `workers:`.", lambda t, c: _train(t, workers=None)),
    Case(
        "workers-two-kinds",
        J,
        "Two kinds of workers at once.",
        lambda t, c: _train(t, workers={"local": {"speeds": [1]}, "scheduler": "tcp://h:8786"}),
    ),
    Case(
        "workers-local-speeds",
        J,
        "An EMULATED speed <= 0.",
        lambda t, c: _train(t, workers={"local": {"speeds": [1.0, 0]}}),
    ),
    Case(
        "workers-scheduler-address",
        J,
        "A scheduler address that is not one.",
        lambda t, c: _train(t, workers={"scheduler": 8786}),
    ),
    Case(
        "workers-scheduler-unreachable",
        J,
        "A scheduler nobody answers at (connect timeout 2 s here).",
        _unreachable,
    ),
    Case(
        "workers-slurm-group",
        J,
        "A SLURM worker group with a bad name.",
        lambda t, c: _train(
            t,
            workers={
                "slurm": {"groups": [{"name": "a-b", "jobs": 1, "cores": 1, "memory": "1GiB"}]}
            },
        ),
    ),
    Case(
        "workers-slurm-gpus",
        J,
        "A SLURM worker group with `gpus: -1`.",
        lambda t, c: _train(
            t, workers={"slurm": {"groups": [{"name": "gpu", "gpus": -1, "cores": 2}]}}
        ),
    ),
    Case(
        "workers-slurm-gpus-processes",
        J,
        "A GPU group whose `processes` is not its `gpus` (one worker process per GPU).",
        lambda t, c: _train(
            t,
            workers={"slurm": {"groups": [{"name": "gpu", "gpus": 2, "processes": 4, "cores": 4}]}},
        ),
    ),
    Case(
        "checkpoint-not-mapping",
        J,
        "`checkpoint:` is not a mapping.",
        lambda t, c: _train(t, checkpoint=5),
    ),
    Case(
        "checkpoint-unknown-key",
        J,
        "A misspelt key under `checkpoint:`.",
        lambda t, c: _train(t, checkpoint={"evry": 5}),
    ),
    Case(
        "checkpoint-every-negative",
        J,
        "`checkpoint.every` < 0.",
        lambda t, c: _train(t, checkpoint={"every": -1}),
    ),
    Case(
        "overwrite-not-bool",
        J,
        "`overwrite:` is not true / false.",
        lambda t, c: _train(t, overwrite="yes"),
    ),
    # ---- data
    Case(
        "data-missing",
        D,
        "The data file does not exist.",
        lambda t, c: _train(t, data="missing.nc"),
    ),
    Case(
        "data-not-netcdf",
        D,
        "The data file is not netCDF.",
        lambda t, c: (t.joinpath("notes.nc").write_text("x,d\n1,2\n"), _train(t, data="notes.nc"))[
            1
        ],
    ),
    Case(
        "data-lacks-d",
        D,
        "The data file has no teacher signals `d`.",
        lambda t, c: (_xr(t, "onlyx.nc", d=False), _train(t, data="onlyx.nc"))[1],
    ),
    Case(
        "data-not-2d",
        D,
        "`x` is not 2-D (sample, input).",
        lambda t, c: (_xr(t, "x1d.nc", x1d=True), _train(t, data="x1d.nc"))[1],
    ),
    Case(
        "data-sample-dims",
        D,
        "`x` and `d` on different sample dimensions.",
        lambda t, c: (_xr(t, "dims.nc", ddims=("row", "output")), _train(t, data="dims.nc"))[1],
    ),
    Case(
        "data-nan",
        D,
        "A NaN in `x`: found by the worker reading that slice, before the first iteration.",
        lambda t, c: (
            _data(t, "nan.nc", x=_with(_arrays()[0], (17, 3), np.nan)),
            _train(t, data="nan.nc"),
        )[1],
    ),
    Case(
        "data-inf",
        D,
        "An infinite teacher signal in `d`.",
        lambda t, c: (
            _data(t, "inf.nc", d=_with(_arrays()[1], (33, 1), -np.inf)),
            _train(t, data="inf.nc"),
        )[1],
    ),
    # ---- output and checkpoint paths
    Case(
        "output-exists",
        P,
        "The output exists (and `overwrite:` is not true).",
        lambda t, c: (t.joinpath("result.nc").write_text("last week's result"), _train(t))[1],
    ),
    Case(
        "output-device",
        P,
        "The output is a device, even with `overwrite: true`.",
        lambda t, c: _train(t, output="/dev/full", overwrite=True),
    ),
    Case(
        "output-directory",
        P,
        "The output is a directory.",
        lambda t, c: (t.joinpath("runs").mkdir(), _train(t, output="runs"))[1],
    ),
    Case(
        "output-dir-missing",
        P,
        "The output's directory does not exist.",
        lambda t, c: _train(t, output="nodir/result.nc"),
    ),
    Case(
        "output-unwritable",
        P,
        "The output's directory cannot be written (tried by creating a file).",
        lambda t, c: _train(t, output="/proc/result.nc"),
    ),
    Case(
        "output-is-data",
        P,
        "The output is the data file.",
        lambda t, c: _train(t, output="data.nc"),
    ),
    Case(
        "checkpoint-exists",
        P,
        "The checkpoint store (by default `<output stem>.checkpoint`) holds a checkpoint and the run "
        "does not `--resume`.",
        lambda t, c: (_checkpoint(t), _train(t))[1],
    ),
    Case(
        "checkpoint-file-exists",
        P,
        "The checkpoint file (a `checkpoint.path` ending in `.nc`) exists and the run does not "
        "`--resume`.",
        lambda t, c: (
            t.joinpath("result.checkpoint.nc").write_text("a stopped run"),
            _train(t, checkpoint=FILE_JOB),
        )[1],
    ),
    Case(
        "checkpoint-is-a-file",
        P,
        "The checkpoint store's path (a `checkpoint.path` without `.nc`, or the default) is a file.",
        lambda t, c: (t.joinpath("result.checkpoint").write_text("notes"), _train(t))[1],
    ),
    Case(
        "checkpoint-unwritable",
        P,
        "The checkpoint's directory cannot be written.",
        lambda t, c: _train(t, checkpoint={"every": 1, "path": "/proc/ck.nc"}),
    ),
    Case(
        "resume-without-checkpoint",
        P,
        "`--resume` and no checkpoint.",
        lambda t, c: _train(t, "--resume"),
    ),
    Case(
        "resume-other-network",
        P,
        "`--resume` with a checkpoint store of another network shape.",
        lambda t, c: (_checkpoint(t, hidden=6), _train(t, "--resume"))[1],
    ),
    Case(
        "resume-file-other-network",
        P,
        "`--resume` with a checkpoint file (a `checkpoint.path` ending in `.nc`) of another network.",
        lambda t, c: (
            _checkpoint(t, hidden=6, checkpoint=FILE_JOB),
            _train(t, "--resume", checkpoint=FILE_JOB),
        )[1],
    ),
    Case(
        "resume-other-job",
        P,
        "`--resume` with a checkpoint of the same shape but another learning rate.",
        lambda t, c: (_checkpoint(t, learning_rate=0.02), _train(t, "--resume"))[1],
    ),
    Case(
        "resume-damaged-store",
        P,
        "`--resume` with a checkpoint store one of whose row files was truncated.",
        lambda t, c: (_damaged(t), _train(t, "--resume"))[1],
    ),
    Case(
        "resume-not-a-checkpoint",
        P,
        "`--resume` and the checkpoint file (a `checkpoint.path` ending in `.nc`) holds something "
        "else.",
        lambda t, c: (
            t.joinpath("result.checkpoint.nc").write_text("notes"),
            _train(t, "--resume", checkpoint=FILE_JOB),
        )[1],
    ),
    Case(
        "resume-past-end",
        P,
        "`--resume` with a checkpoint already at `iterations`.",
        lambda t, c: (_checkpoint(t, iteration=3), _train(t, "--resume"))[1],
    ),
    # ---- command line
    Case(
        "cli-resume-without-config",
        C,
        "`--resume` without `--config`.",
        lambda t, c: _cli(t, "train", "--resume"),
    ),
    Case(
        "cli-overwrite-without-config",
        C,
        "`--overwrite` without `--config`.",
        lambda t, c: _cli(t, "train", "--overwrite"),
    ),
    Case(
        "cli-demo-options-with-config",
        C,
        "Demo options next to `--config`.",
        lambda t, c: (_data(t), _cli(t, "train", "--config", str(_job(t)), "--speeds", "1,2"))[1],
    ),
    Case(
        "cli-speeds",
        C,
        "`--speeds` that are not numbers.",
        lambda t, c: _cli(t, "train", "--speeds", "1,fast"),
    ),
    Case(
        "cli-iterations", C, "`--iterations 0`.", lambda t, c: _cli(t, "train", "--iterations", "0")
    ),
    Case(
        "cli-mapping", C, "`--mapping` unknown.", lambda t, c: _cli(t, "train", "--mapping", "best")
    ),
    Case(
        "cli-probe-netcdf-device",
        C,
        "`dask-rpm probe --netcdf` naming a device (refused before the cluster starts).",
        lambda t, c: _cli(t, "probe", "--netcdf", "/dev/full"),
    ),
    Case(
        "cli-plan-ability",
        C,
        "`dask-rpm plan` with an ability <= 0.",
        lambda t, c: _cli(
            t, "plan", "--abilities", "1,-2", "--shape", "10-8-2", "--samples", "100"
        ),
    ),
    Case(
        "cli-plan-shape",
        C,
        "`dask-rpm plan` with a shape that is not n-m-l.",
        lambda t, c: _cli(t, "plan", "--abilities", "1,2", "--shape", "10-8", "--samples", "100"),
    ),
    # ---- Python API
    Case("fit-no-client", A, "`fit()` with no Dask client started.", _no_client),
    Case(
        "fit-rows-differ",
        A,
        "`x` and `d` with different numbers of samples.",
        lambda t, c: _fit(t, c, d=_arrays()[1][:-1]),
    ),
    Case(
        "fit-nan",
        A,
        "A NaN in `x` (arrays are checked on the client).",
        lambda t, c: _fit(t, c, x=_with(_arrays()[0], (17, 3), np.nan)),
    ),
    Case(
        "fit-netcdf-nan",
        A,
        "A NaN in a netCDF file given by path (checked by the workers).",
        lambda t, c: _fit(t, c, x=str(_data(t, "nan.nc", x=_with(_arrays()[0], (17, 3), np.nan)))),
    ),
    Case("fit-learning-rate", A, "`learning_rate=0`.", lambda t, c: _fit(t, c, learning_rate=0.0)),
    Case(
        "fit-hidden-missing",
        A,
        "No `hidden` (and no `init`).",
        lambda t, c: _fit(t, c, hidden=None),
    ),
    Case(
        "fit-init-shape",
        A,
        "`init` weights of another shape.",
        lambda t, c: _fit(t, c, init=(np.zeros((4, 6)), np.zeros((2, 4)))),
    ),
    Case(
        "fit-dtype",
        A,
        "`dtype` other than float64 / float32.",
        lambda t, c: _fit(t, c, dtype="float16"),
    ),
    Case("fit-iterations", A, "`iterations=0`.", lambda t, c: _fit(t, c, iterations=0)),
    Case(
        "fit-plan-shape",
        A,
        "A `Plan` made for another network or sample count.",
        lambda t, c: _fit(t, c, mapping=_plan((5, 8, 2), 40), error=Exception),
    ),
    Case(
        "fit-abilities",
        A,
        "Abilities for a different number of workers.",
        lambda t, c: _fit(t, c, mapping="srpm", abilities=[1, 2, 3], error=Exception),
    ),
    Case(
        "fit-batch-size",
        A,
        "`batch_size=0` (mini-batches need at least one sample).",
        lambda t, c: _fit(t, c, batch_size=0),
    ),
    Case("fit-loss", A, "A loss that is not known.", lambda t, c: _fit(t, c, loss="hinge")),
    Case(
        "fit-optimizer",
        A,
        "An optimizer that is not known.",
        lambda t, c: _fit(t, c, optimizer="sgdx"),
    ),
    Case("fit-min-workers", A, "`min_workers=0`.", lambda t, c: _fit(t, c, min_workers=0)),
    Case("fit-backend", A, "A backend that is not known.", lambda t, c: _fit(t, c, backend="jax")),
    Case(
        "fit-device",
        A,
        "numpy asked to run on a GPU.",
        lambda t, c: _fit(t, c, backend="numpy", device="cuda"),
    ),
    Case(
        "fit-serial-device",
        A,
        "`fit_serial` on a GPU this machine does not have.",
        lambda t, c: _api(t, lambda: _serial_on("cuda:7")),
    ),
    Case(
        "local-cluster-gpus",
        A,
        "`local_cluster(gpus=1)` where this process sees no GPU (`CUDA_VISIBLE_DEVICES=''` here; "
        "on a machine without GPUs the message counts them with `nvidia-smi -L`).",
        lambda t, c: _api(t, _local_cluster_without_gpus),
    ),
    Case(
        "fit-min-workers-timeout",
        A,
        "More `min_workers` than connect within `rpm.train.wait-workers` "
        "(1 s here; the wait is logged).",
        lambda t, c: _wait_timeout(t, c),
    ),
    Case(
        "fit-on-worker-loss",
        A,
        "`on_worker_loss` other than recover / raise.",
        lambda t, c: _fit(t, c, on_worker_loss="retry"),
    ),
    Case(
        "fit-progress",
        A,
        "`progress` of an unknown kind.",
        lambda t, c: _fit(t, c, progress="loud"),
    ),
    Case(
        "fit-resume-store-other-network",
        A,
        "`resume=` a checkpoint store whose manifest names another network shape.",
        lambda t, c: (_store(t, hidden=6), _fit(t, c, resume=t / "ck"))[1],
    ),
    Case(
        "fit-resume-store-empty",
        A,
        "`resume=` a directory without a completed checkpoint.",
        lambda t, c: (t.joinpath("ck").mkdir(), _fit(t, c, resume=t / "ck"))[1],
    ),
    Case(
        "fit-resume-store-damaged",
        A,
        "`resume=` a checkpoint store one of whose row files was truncated.",
        lambda t, c: (_store(t, damage=True), _fit(t, c, resume=t / "ck"))[1],
    ),
    Case(
        "fit-checkpoint-dir-held",
        A,
        "`checkpoint_dir=` a store holding a checkpoint, without `resume=` it.",
        lambda t, c: (
            _store(t),
            _fit(t, c, checkpoint_every=1, checkpoint_dir=t / "ck"),
        )[1],
    ),
    Case(
        "fit-checkpoint-dir-without-every",
        A,
        "`checkpoint_dir=` without `checkpoint_every`: no checkpoint would be written.",
        lambda t, c: _fit(t, c, checkpoint_dir=t / "ck"),
    ),
    # ---- models
    Case(
        "predict-model-missing",
        M,
        "`--model` does not exist.",
        lambda t, c: _predict(t, "--model", "nope.nc"),
    ),
    Case(
        "predict-not-a-model",
        M,
        "`--model` is a netCDF file but not a model (here a training dataset).",
        lambda t, c: _predict(t, "--model", "data.nc"),
    ),
    Case(
        "predict-data-missing",
        M,
        "`--data` does not exist.",
        lambda t, c: _predict(t, "--data", "nope.nc"),
    ),
    Case(
        "predict-input-width",
        M,
        "The inputs have another width than the model was trained on.",
        lambda t, c: _predict_wide(t),
    ),
    Case(
        "predict-output-exists",
        M,
        "`--output` exists and `--overwrite` is not given.",
        lambda t, c: (t.joinpath("pred.nc").write_text("old"), _predict(t))[1],
    ),
    Case(
        "predict-output-is-data",
        M,
        "`--output` is the data file.",
        lambda t, c: _predict(t, "--output", "data.nc"),
    ),
    Case(
        "model-load-result",
        M,
        "`MLPModel.load` given a training result file (the model is next to it).",
        lambda t, c: _load_result(t),
    ),
]


def _with(arr: np.ndarray, where: tuple[int, int], value: float) -> np.ndarray:
    out = arr.copy()
    out[where] = value
    return out


def _xr(
    tmp: Path,
    name: str,
    *,
    d: bool = True,
    x1d: bool = False,
    ddims: tuple[str, str] = ("sample", "output"),
) -> None:
    import xarray as xr

    xa, da = _arrays()
    xv = ("sample", xa[:, 0]) if x1d else (("sample", "input"), xa)
    ds = xr.Dataset({"x": xv, **({"d": (ddims, da)} if d else {})})
    ds.to_netcdf(tmp / name, engine="h5netcdf")


def _plan(shape: tuple[int, int, int], samples: int) -> Any:
    from dask_rpm.plan.partition import Plan

    n, m, l = shape
    return Plan.from_columns([[0]], [samples], [[m]], shape=shape)


def _wait_timeout(tmp: Path, client: Any) -> str:
    import dask

    from dask_rpm.engine import TrainingError

    with dask.config.set({"rpm.train.wait-workers": 1}):
        return _fit(tmp, client, min_workers=5, error=TrainingError)


# --------------------------------------------------------------------------
# The tests
# --------------------------------------------------------------------------


def _doc_messages() -> dict[str, str]:
    """``{id: message}`` from docs/errors.md: a ``### `id` `` heading, then the first fenced block."""
    text = DOC.read_text()
    found = re.findall(r"^### `([a-z0-9-]+)`\n(?:.*?\n)*?```\n(.*?)\n```", text, flags=re.M)
    return {k: v for k, v in found}


@pytest.fixture(scope="module")
def client():
    from distributed import Client, LocalCluster

    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0"
    ) as cluster:
        with Client(cluster) as c:
            yield c


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_refused_with_the_documented_message(case, tmp_path, client):
    message = case.run(tmp_path, client)
    documented = _doc_messages().get(case.id)
    assert documented is not None, f"docs/errors.md has no entry for {case.id!r}"
    assert message == documented


def test_docs_and_cases_are_in_sync():
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids)) and len(ids) >= 30
    doc = _doc_messages()
    assert sorted(doc) == sorted(ids), set(doc) ^ set(ids)
    assert DOC.read_text().count("\n### `") == len(ids)  # no entry the parser missed


def _markdown(messages: dict[str, str]) -> str:
    """docs/errors.md from the cases and their messages (``python tests/test_errors.py``)."""
    head = (
        (DOC.read_text().split("\n## ", 1)[0].rstrip() + "\n") if DOC.exists() else "# Bad input\n"
    )
    out = [head]
    for section in dict.fromkeys(c.section for c in CASES):
        out.append(f"\n## {section}\n")
        for c in (c for c in CASES if c.section == section):
            out.append(f"### `{c.id}`\n\n{c.what}\n\n```\n{messages[c.id]}\n```\n")
    return "\n".join(out)


if __name__ == "__main__":  # regenerate docs/errors.md from what the code says now
    import tempfile

    from distributed import Client, LocalCluster

    msgs = {}
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0"
        ) as cl,
        Client(cl) as cli,
    ):
        for case in CASES:
            with tempfile.TemporaryDirectory() as d:
                msgs[case.id] = case.run(Path(d), cli)
    DOC.write_text(_markdown(msgs))
    print(f"wrote {DOC}: {len(msgs)} entries")
