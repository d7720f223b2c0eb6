"""``dask-rpm bench``: every mapping method side by side on EMULATED heterogeneous workers.

Reproduces the paper's efficiency experiment (docs/method.md §8) on
:func:`dask_rpm.local_cluster` and measures it against what users run today.
**All figures are EMULATED heterogeneity on one machine**: every worker runs on
the same cores and slow workers sleep in proportion to the CPU time they used
(docs/emulation.md). They show how each method copes with a speed profile;
they are not hardware measurements.

For every *case* (workload x condition x N) one cluster is started and, in one
run on that cluster:

1. ``T_series(i)``: the same job (same network, all samples) on worker ``i``
   alone, a one-rectangle plan, for every worker;
2. the methods, one after the other on the same workers:

   ================  ============================================================
   ``uniform``       method 1, equal work (heterogeneity ignored), best N_DP
   ``hrev``          method H_rev on the assumed abilities, best N_DP
   ``srpm-assumed``  SRPM on the paper's *assumed* abilities (clock and job
                     count, docs/method.md §8), not the emulated truth
   ``srpm-probed``   SRPM on abilities measured by :func:`dask_rpm.probe.probe`
   ``drpm-init``     DRPM starting from SRPM on the assumed abilities
   ``drpm``          DRPM without initial abilities (starts uniform)
   ``split-1d``      proportional 1-D batch split on the probed abilities
   ``ddp``           plain PyTorch DistributedDataParallel (gloo, CPU), the same
                     MLP, equal sample shares, ranks paced to the same EMULATED
                     speeds; needs torch (``pip install .[bench]``), else skipped
   ================  ============================================================

Truth versus assumption: the profiles of docs/method.md §8 are what the paper *assumed*
(0.63 for a Pentium III 500 MHz against 800 MHz = 1.0); the paper then
*measured* about 0.5 for those machines (condition B estimates 0.49-0.52). The
emulated truth is therefore the profile with every 0.63 replaced by 0.5;
``srpm-assumed``, ``hrev`` and ``drpm-init`` get the profile as listed.

Best N_DP: the baselines are run at the N_DP (divisor of N) with the smallest
iteration time predicted by :func:`dask_rpm.cost.predict_iteration_seconds`
from the measured ``T_series`` speeds (``dp_search="model"``), or at every
N_DP keeping the fastest measured (``dp_search="measured"``, slower).

Metric: ``gamma = (1 / T_parallel) / sum_i (1 / T_series(i))`` with
``T_parallel`` the median iteration time over the second half of the run
(steady state, same rule for every method) and ``ratio_to_drpm`` that time
over DRPM's. ``ddp``'s gamma uses the same ``T_series`` (numpy kernels), so
gammas compare iteration times directly; torch's kernels are not numpy's.

Mini-batches (workload ``minibatch``, 203-1024-26 with 16384
samples, at ``batch_sizes`` 256, 1024, 4096 by default): one case per batch
size; an iteration is one mini-batch step, ``T_series(i)`` is worker ``i``
alone on the same batches, and every method trains on the same mini-batch
sequence (:mod:`dask_rpm.nn.batches`; the DDP peer's ranks take equal shares of
each batch and all-reduce every step). ``weights_vs_serial`` checks that:
every method's final weights against :func:`dask_rpm.fit_serial` with the
same batches. ``phase_seconds`` says where the engine's time goes.

Deep network (workload ``deep``, 784-1024-1024-1024-10 with 16384 samples, at
the same batch sizes): every hidden layer is cut by the same rectangles, so a
column also gathers activations and sums deltas between its layers; the plans
count those exchanges (``cost_shape``), the DDP peer stacks one bias-free
``Linear`` + sigmoid per weight matrix, and ``weights_vs_serial`` compares every
parameter ``W_1 .. W_L, V``. ``custom`` takes several hidden layers too:
``custom=(n, m_1, ..., m_L, l, s)``.

Load step (conditions ``A-step``/``B-step``): the fastest worker slows to a
third of its speed from iteration ``step_at`` (an emulation schedule, every
run). Its ``T_series`` is measured at the slowed speed, so gamma refers to the
capacity after the step, and the steady-state window starts after it.

The package's modules: :mod:`~dask_rpm.bench.profiles` (the profiles,
workloads, methods and cases; pure), :mod:`~dask_rpm.bench.harness` (the runs
on the EMULATED cluster), :mod:`~dask_rpm.bench.ddp` (the PyTorch peer) and
:mod:`~dask_rpm.bench.report` (the dataset and the files). Their public names
are also reachable here: the pure profiles' at once, the others imported on first use,
so ``import dask_rpm.bench`` loads neither ``distributed`` nor torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_attributes
from .profiles import (  # pure and light (numpy only): imported at once
    ASSUMED_TO_TRUE,
    CONDITIONS,
    MAX_N,
    METHODS,
    MINIBATCH_METHODS,
    MINIBATCH_SIZES,
    STEP_FACTOR,
    WORKLOADS,
    BenchCase,
    BenchError,
    Workload,
    bench_learning_rate,
    gamma,
    make_cases,
    steady_seconds,
    takes_batch_sizes,
    true_profile,
    weights_difference,
    workload_batch_sizes,
    workload_of,
)

#: public name -> the submodule that defines it (imported on first use, PEP 562): the
#: harness, the DDP peer and the report need distributed, torch or xarray
_LAZY = {
    **dict.fromkeys(("run_bench", "run_case", "serial_reference", "Progress"), "harness"),
    **dict.fromkeys(("run_ddp", "run_ddp_method", "torch_available"), "ddp"),
    **dict.fromkeys(
        (
            "MethodResult",
            "CaseResult",
            "bench_dataset",
            "summary_rows",
            "markdown_table",
            "plot_bench",
            "write_outputs",
        ),
        "report",
    ),
}

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time __getattr__ imports these
    from .ddp import run_ddp, run_ddp_method, torch_available
    from .harness import Progress, run_bench, run_case, serial_reference
    from .report import (
        CaseResult,
        MethodResult,
        bench_dataset,
        markdown_table,
        plot_bench,
        summary_rows,
        write_outputs,
    )
else:  # at run time: the names above and the submodules, imported on first use
    __getattr__, __dir__ = lazy_attributes(__name__, __path__, _LAZY)

__all__ = [  # the lazy names above, spelled out for linters and `from dask_rpm.bench import *`
    "ASSUMED_TO_TRUE",
    "BenchCase",
    "BenchError",
    "CONDITIONS",
    "CaseResult",
    "MAX_N",
    "METHODS",
    "MINIBATCH_METHODS",
    "MINIBATCH_SIZES",
    "MethodResult",
    "Progress",
    "STEP_FACTOR",
    "WORKLOADS",
    "Workload",
    "bench_dataset",
    "bench_learning_rate",
    "gamma",
    "make_cases",
    "markdown_table",
    "plot_bench",
    "run_bench",
    "run_case",
    "run_ddp",
    "run_ddp_method",
    "serial_reference",
    "steady_seconds",
    "summary_rows",
    "takes_batch_sizes",
    "torch_available",
    "true_profile",
    "weights_difference",
    "workload_batch_sizes",
    "workload_of",
    "write_outputs",
]
