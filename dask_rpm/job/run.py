"""Running a job: :func:`run_job` (workers, training, checkpoints, stopping, the output)."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TextIO

import dask.config
import numpy as np
from distributed import Client

from ..emulation import local_cluster
from ..engine import FitResult, fit, store
from ..nn.chunked import zarr_variables
from ..progress import weight_bytes
from ..records import RemapRecord
from ..slurm import HeterogeneousSLURMCluster, slurm_unavailable
from .load import check_paths, load_job
from .output import (
    clear_store,
    mark_store,
    read_checkpoint,
    save_model,
    save_result,
    write_checkpoint,
)
from .spec import Job, JobError

__all__ = ["run_job"]


def _connect(address: str) -> Client:
    """A client of the existing scheduler at ``address`` (a JobError if it does not answer)."""
    timeout = dask.config.get("distributed.comm.timeouts.connect")
    try:
        return Client(address, timeout=timeout)
    except (OSError, TimeoutError, ValueError) as e:
        raise JobError(
            f"job file: workers.scheduler={address!r}: cannot connect within {timeout} "
            f"({type(e).__name__}: {' '.join(str(e).split())[:200]}); check that the scheduler "
            f"runs and the address (e.g. tcp://host:8786), or use workers: {{local: ...}} / "
            f"{{slurm: ...}}"
        ) from None


@contextlib.contextmanager
def _client_for(job: Job, out: TextIO) -> Iterator[Client]:
    """A client of the workers the job names (started here, and stopped at the end, unless existing)."""
    kind = next(iter(job.workers))
    if kind == "scheduler":
        with _connect(job.workers["scheduler"]) as client:
            print(f"workers: existing cluster at {job.workers['scheduler']}", file=out, flush=True)
            yield client
        return
    if kind == "local":
        with (
            local_cluster(job.workers["local"]["speeds"], dashboard_address=":0") as cluster,
            Client(cluster) as client,
        ):
            # Ctrl-C in a terminal reaches every process of its group, these workers too: the
            # job stops them itself, after its checkpoint, instead of each dying with a traceback
            client.run(_ignore_interrupts)
            print(f"workers: {cluster.emulation_label}", file=out, flush=True)
            yield client
        return
    spec = job.workers["slurm"]
    # before any job is submitted: one line on what is missing, not sbatch's traceback
    partitions = sorted({g.queue for g in spec["groups"] if g.queue})
    why = slurm_unavailable(partitions)
    if why is not None:
        raise JobError(f"job file: workers.slurm: SLURM cannot take jobs from here: {why}")
    cluster_kw = dict(spec["cluster"])
    if "log_directory" not in cluster_kw and not dask.config.get(
        "jobqueue.slurm.log-directory", None
    ):  # the worker jobs' slurm-*.out next to the output, not in whatever directory this runs in
        stem = os.path.splitext(job.output)[0]
        cluster_kw["log_directory"] = f"{stem}.slurm-logs"
    with HeterogeneousSLURMCluster(spec["groups"], **cluster_kw) as cluster:
        jobs = ", ".join(
            f"{g.name}: {g.jobs} job(s) x {g.processes} worker(s)"
            + (" on a GPU each" if g.gpus else "")
            for g in spec["groups"]
        )
        logs = cluster_kw.get("log_directory") or dask.config.get("jobqueue.slurm.log-directory")
        print(
            f"workers: SLURM groups {jobs}; scheduler {cluster.scheduler_address}; worker job "
            f"logs in {logs}",
            file=out,
            flush=True,
        )
        with Client(cluster) as client:
            yield client


def _ignore_interrupts() -> bool:
    """In a worker process (its main thread runs the event loop): ignore SIGINT."""
    if threading.current_thread() is not threading.main_thread():
        return False
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    return True


@contextlib.contextmanager
def _stop_signals(flag: threading.Event) -> Iterator[None]:
    """SIGTERM (SLURM's walltime warning, scancel), SIGUSR1 and a first SIGINT (Ctrl-C) set ``flag``
    instead of killing: training stops after the current block and writes its checkpoint. A
    second Ctrl-C interrupts at once (KeyboardInterrupt)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {}

    def handler(signum: int, frame: Any) -> None:
        flag.set()
        flag.signal = signal.Signals(signum).name  # type: ignore[attr-defined]
        if signum == signal.SIGINT:
            signal.signal(signal.SIGINT, signal.default_int_handler)
            print(
                "interrupted: stopping after the current block and writing a checkpoint "
                "(Ctrl-C again to stop at once)",
                file=sys.stderr,
                flush=True,
            )

    for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):
        old[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)


def _resume_from(job: Job, resume: bool, out: TextIO) -> tuple[int, np.ndarray, Any]:
    """``(start iteration, errors before it, checkpoint or None)``."""
    if not resume:
        return 0, np.zeros(0), None
    ck = read_checkpoint(job)
    start = ck["iteration"]
    if start >= job.training.iterations:
        raise JobError(
            f"--resume: the checkpoint is at iteration {start}, already at "
            f"iterations={job.training.iterations}; raise iterations to train on"
        )
    print(
        f"resuming from checkpoint {job.checkpoint_path} at iteration {start}", file=out, flush=True
    )
    if ck.get("drpm") and job.effective("mapping") == "drpm":
        print(
            f"DRPM continues on the checkpoint's plan ({len(ck['drpm'].get('checks', []))} "
            f"check(s), estimator windows kept)",
            file=out,
            flush=True,
        )
    return start, ck["errors"], ck


def remap_line(rec: RemapRecord) -> str:
    """One progress line for a remap (a plan change, a lost or a joined worker)."""
    if rec.get("lost"):
        what = f"worker(s) {', '.join(rec['lost'])} lost; rows from the {rec['recovered_from']}"
        if rec.get("replayed"):
            what += f", {rec['replayed']} iteration(s) recomputed"
    elif rec.get("joined"):
        what = f"worker(s) {', '.join(rec['joined'])} joined"
    else:
        what = rec.get("reason", "")
    return (
        f"remap at iteration {rec['iteration']}: {rec['kind']} ({what}), {weight_bytes(rec)}, "
        f"{rec.get('sample_bytes', 0)} sample bytes re-read, {rec['seconds']:.3f} s"
    )


def _progress(job: Job, out: TextIO) -> Callable[[dict[str, Any]], None]:
    """fit's per-block ``callback``: one line per remap, one per checkpoint the workers wrote into
    the job's store, and one per block."""

    def progress(info: dict[str, Any]) -> None:
        for rec in info["remaps"]:
            print(remap_line(rec), file=out, flush=True)
        k, every = info["iteration"], job.checkpoint_every
        if job.checkpoint_store and every and k % every == 0 and _store_iteration(job) == k:
            print(f"checkpoint at iteration {k} -> {job.checkpoint_path}", file=out, flush=True)
        spi = info["seconds_per_iteration"]
        print(
            f"iteration {info['iteration']}/{job.training.iterations}: error {info['error']:.6g}, "
            f"{spi * 1e3:.1f} ms/iteration, {len(info['workers'])} worker(s)",
            file=out,
            flush=True,
        )

    return progress


def _store_iteration(job: Job) -> int | None:
    """The iteration of the valid checkpoint in the job's store (None: none yet)."""
    try:
        return int(store.read_manifest(job.checkpoint_path)["iteration"])
    except store.StoreError:
        return None


def _should_stop(job: Job, stop: threading.Event) -> Callable[[], bool]:
    """fit's ``should_stop``: the event is set (a signal) or the job's time limit passed."""
    t0 = time.monotonic()

    def should_stop() -> bool:
        if job.time_limit is not None and time.monotonic() - t0 > job.time_limit:
            stop.signal = f"time-limit {job.time_limit:g} s"  # type: ignore[attr-defined]
            return True
        return stop.is_set()

    return should_stop


def _checkpointer(
    job: Job, start: int, errors_before: np.ndarray, out: TextIO
) -> Callable[[dict[str, Any]], None]:
    """fit's ``on_checkpoint``: write the job's checkpoint (errors before a resume included)."""

    def on_checkpoint(state: dict[str, Any]) -> None:
        state = dict(state, errors=np.concatenate([errors_before[:start], state["errors"][start:]]))
        write_checkpoint(job, state)
        print(
            f"checkpoint at iteration {state['iteration']} -> {job.checkpoint_path}",
            file=out,
            flush=True,
        )

    return on_checkpoint


def _summary(job: Job, result: FitResult, done: int, wall: float) -> dict[str, Any]:
    """What the run did (returned, and written into the output)."""
    return {
        "iterations": done,
        "final_error": result.error,
        "target_error": job.training.target_error,
        "stopped": result.stopped,
        "wall_seconds": wall,
        "seconds_per_iteration": result.seconds_per_iteration,
        "workers": len(result.plan.planned_workers),
        "remaps": len(result.remaps),
        "worker_losses": sum(1 for r in result.remaps if r.get("lost")),
        "output": job.output,
        "emulation": result.emulation,
    }


def _train(
    job: Job,
    client: Client,
    *,
    start: int,
    errors_before: np.ndarray,
    ck: Any,
    stop: threading.Event,
    out: TextIO,
) -> tuple[FitResult, float]:
    """``fit`` with the job's settings (``None`` where the file sets none); ``(result, wall seconds)``."""
    print(
        f"training {job.network} on {job.shape[0]} samples from {job.data}: "
        f"iterations {start}..{job.training.iterations}, mapping {job.effective('mapping')}, "
        f"min-workers {job.effective('min_workers')}",
        file=out,
        flush=True,
    )
    every = job.checkpoint_every
    to_store = job.checkpoint_store and bool(every)
    if to_store:
        if ck is None:  # a new run (check_paths allowed it): an old checkpoint there goes
            clear_store(job)
        mark_store(job)
    t_train = time.monotonic()
    try:
        result = _fit(
            job,
            client,
            ck=ck,
            every=every,
            to_store=to_store,
            start=start,
            errors_before=errors_before,
            stop=stop,
            out=out,
        )
    except BaseException:
        # refused before its first checkpoint (bad data, no workers): a new run leaves no store
        # behind (nothing written, docs/errors.md); one holding a checkpoint stays for --resume
        if to_store and ck is None and _store_iteration(job) is None:
            clear_store(job)
        raise
    return result, time.monotonic() - t_train


def _fit(
    job: Job,
    client: Client,
    *,
    ck: Any,
    every: int,
    to_store: bool,
    start: int,
    errors_before: np.ndarray,
    stop: threading.Event,
    out: TextIO,
) -> FitResult:
    """``fit`` with the job's settings (``None`` where the file sets none)."""
    x: Any = job.data
    d: Any = None
    if job.data_vars is not None:  # a zarr store: its chunks stay on the workers
        x, d = zarr_variables(job.data, *job.data_vars)
    return fit(
        x,
        d,
        options=job.training,
        mapping=job.run.mapping,
        backend=job.run.backend,
        device=job.run.device,
        # a store is read by fit itself (its manifest and checksums again), and written on into
        resume=job.checkpoint_path if ck is not None and job.checkpoint_store else ck,
        client=client,
        progress="none",
        on_worker_loss=job.run.on_worker_loss,
        min_workers=job.run.min_workers,
        checkpoint_every=every,
        checkpoint_dir=job.checkpoint_path if to_store else None,
        on_checkpoint=(
            _checkpointer(job, start, errors_before, out) if every and not to_store else None
        ),
        should_stop=_should_stop(job, stop),
        callback=_progress(job, out),
    )


def _stopped(
    job: Job, result: FitResult, *, done: int, errors_before: np.ndarray, start: int
) -> None:
    """Training was stopped early: write the checkpoint a ``--resume`` continues from."""
    write_checkpoint(
        job,
        {
            "iteration": done,
            "params": result.params,
            "plan": result.plan,
            "optimizer_state": result.optimizer_state,
            "drpm": result.drpm_state,
            "errors": np.concatenate([errors_before[:start], result.history["error"].values]),
        },
    )


def run_job(
    path: str | os.PathLike[str],
    *,
    resume: bool = False,
    overwrite: bool = False,
    out: TextIO | None = None,
    client: Any = None,
    stop: threading.Event | None = None,
) -> dict[str, Any]:
    """Run the job in ``path``; returns a summary dict (also written into the output).

    Parameters
    ----------
    path
        The job file.
    resume
        Continue from the job's checkpoint.
    overwrite
        Replace an existing output (as ``overwrite: true`` in the file).
    out
        Where progress lines go (default stdout): one plain line per block.
    client
        Use this client instead of the job's ``workers`` (tests, notebooks).
    stop
        An event that, once set, stops training after the current block
        (checkpoint, no output) - what SIGTERM does from the command line.

    The summary's ``output`` is where the result was written: ``job.output``,
    or (``rescued: True``) the place next to the checkpoint it was saved to
    when the output could not be written at the end.

    Raises
    ------
    JobError
        Invalid job file, an output or checkpoint that exists or cannot be
        written, ``--resume`` without a matching checkpoint, an unreachable
        scheduler; all before any training.
    dask_rpm.nn.data.DataError
        A worker found a NaN or infinite value in its samples of the data file
        (before the first iteration).
    dask_rpm.TrainingError
        Training failed (nothing is written to the output path).
    """
    out = out or sys.stdout
    job = load_job(path, overwrite=overwrite)
    check_paths(job, resume=resume)
    start, errors_before, ck = _resume_from(job, resume, out)
    stop = stop or threading.Event()
    with dask.config.set(job.settings()), _stop_signals(stop), contextlib.ExitStack() as stack:
        if client is None:
            client = stack.enter_context(_client_for(job, out))
        result, wall = _train(
            job, client, start=start, errors_before=errors_before, ck=ck, stop=stop, out=out
        )
    done = start + result.history.sizes.get("iteration", 0)
    summary = _summary(job, result, done, wall)
    if result.stopped and result.stopped.startswith("stop requested"):
        _stopped(job, result, done=done, errors_before=errors_before, start=start)
        why = getattr(stop, "signal", "stop requested")
        print(
            f"stopped at iteration {done} ({why}); checkpoint written to {job.checkpoint_path}; "
            f"continue with: dask-rpm train --config {path} --resume",
            file=out,
            flush=True,
        )
        summary["checkpoint"] = job.checkpoint_path
        summary["signal"] = why
        return summary
    if result.stopped and "diverged" in result.stopped:
        print(result.stopped, file=out, flush=True)
    written = save_result(
        job, result, start=start, errors_before=errors_before, summary=summary, out=out
    )
    if job.model is not None:
        written += ", model " + save_model(job, result, start=start, written=written, out=out)
    print(
        f"done: {done} iterations, error {result.error:.6g}"
        + (
            f" (target {job.training.target_error:g})"
            if job.training.target_error is not None
            else ""
        )
        + f", {wall:.1f} s; wrote {written}",
        file=out,
        flush=True,
    )
    # the result file holds everything the checkpoint did
    if job.checkpoint_store:
        clear_store(job)
    elif job.checkpoint_every and os.path.exists(job.checkpoint_path):
        os.unlink(job.checkpoint_path)
    return summary
