"""Probing stage: measure worker abilities and links before planning.

:func:`probe` runs the real BP kernels (forward, output delta, backward; the
work of one rectangle) on every worker at once and returns each worker's
throughput in *work units per second*, a work unit being one (hidden unit x
sample) pair of a rectangle, the unit in which the planner measures area
(docs/method.md §3). ``dask_rpm.fit(..., abilities="probe")`` uses these
throughputs as the initial abilities.

How the kernel probe is sized
-----------------------------
The probe block has the job's ``n`` inputs and ``l`` outputs and, at most,
the average rectangle of the job: ``ceil(m / N)`` hidden units by
``ceil(s / N)`` samples. Its shape matters (cache behaviour and the share of
the small ``l``-sized terms are those of training); its size does not, so it
is shrunk, keeping its aspect ratio, until one kernel pass takes at most an
eighth of ``rpm.probe.target-seconds`` on the client (a quick calibration
with BLAS limited to one thread, like the workers). A repetition runs the
pass ``loops`` times inside one :func:`dask_rpm.emulation.pace` block, so
tiny jobs still give repetitions long enough to time, and a worker many
times slower than the client still finishes a pass within a repetition.

A CNN (``layers=``, what ``fit(network=..., abilities="probe")`` passes) is timed on its own
kernels at the share of channels a worker will train, not on whole layers (a GPU slows on
thin channel slices): the rows of an average worker in SRPM's plan for equal workers on one
iteration's samples (:func:`~dask_rpm.probe.driver.conv_share`), the same share of every
stage's channels; only the samples shrink to fit the pass time. A work unit is then one
plan row x sample, as the planner and DRPM count a CNN's area.

Every worker first runs one warm-up repetition (discarded). Its time sets
each worker's ``loops`` so that one timed repetition takes about
``target-seconds`` on *every* worker: all workers are then busy for the same
wall time, as in a balanced training iteration, so they contend for the
machine as they will during training, and a change of the machine's load
hits them alike. Then ``repeats`` timed repetitions run, one at a time per
worker (even on multi-threaded workers) and concurrently across workers. A task times its own kernel block with ``time.perf_counter``
(scheduling and transfers are excluded) and the throughput is
``work / trimmed-mean(seconds)``: the mean of the repetitions left after
cutting an eighth at each end (see :func:`~dask_rpm.probe.kernel.robust_mean`
for why not the median). With the defaults (16 repetitions of 30 ms) the kernel probe took
about 0.9 s of wall time on the 2-core development machine (warm-up and
queueing included) and the link measurement about 0.3 s.

How links are measured
----------------------
On a few worker pairs ``a -> b`` (neighbours in worker order) a task on ``b``
depends on an array produced on ``a``: a tiny one (latency) and a larger one
(``rpm.probe.link-bytes``, bandwidth). The transfer time is the ``"transfer"``
start/stop entry that Dask's worker attaches to the consuming task (the same
entry it reports to the scheduler), read inside that task. It covers exactly
the fetch - request, serialisation, the wire, deserialisation - and none of
the scheduler hops around it, which timing from the producer's end to the
consumer's start would include; and unlike the worker's
``transfer_incoming_log`` it has no 1 ms floor. The hops run as one chain, so
no two transfers overlap. ``latency`` is the median tiny-transfer time (one
Dask fetch, i.e. what a message costs here) and ``bandwidth`` is
``(big - tiny bytes) / (median big - median tiny time)``.

Modules: :mod:`~dask_rpm.probe.kernel` (what runs on the workers, and the
block calibration), :mod:`~dask_rpm.probe.links` (the link probe),
:mod:`~dask_rpm.probe.driver` (the asynchronous driver, :func:`probe_async`),
:mod:`~dask_rpm.probe.sync` (:func:`probe`, :func:`probe_network`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_attributes
from .driver import probe_async
from .links import link_class_pairs
from .sync import probe, probe_network

if not TYPE_CHECKING:  # type checkers resolve submodules themselves; a catch-all hides typos
    __getattr__, __dir__ = lazy_attributes(__name__, __path__)  # submodules on first use

__all__ = ["probe", "probe_async", "probe_network", "link_class_pairs"]
