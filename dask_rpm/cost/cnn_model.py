"""The seed's time model for training a small CNN data-parallel, hybrid, or channel-split.

Pure module (numpy only). A MODEL: nothing is run or measured. It restates §4 of
the channel-wise hybrid parallelism seed (docs/method.md, "The seed's CNN time
model") and adds the rectangle model's own plan for the same network.

The quantities
--------------
:data:`TABLE1` is the seed's simplified VGG16 (Table 1: four conv layers and one
FC layer, per-sample flop, parameter bytes, input and output bytes) and
:data:`TABLE2` its assumed node (Table 2: 4 TFLOP/s, 400 GB/s memory, 4 GB/s
network). The time of layer ``L`` for one sample on one node is

* conv: ``T_L = flop_L / P_node`` (compute-bound),
* FC: ``T_L = param_bytes_L / M_node`` (memory-bound: every weight is read once
  per sample),

and a layer cut by output channel into ``k`` equal parts takes ``T_L / k`` on
each of its ``k`` nodes, which also hold ``param_bytes_L / k`` each.

The parameter column is read as printed. Table 1 heads it "Param (B)"; the
conv rows are 4-byte weights (cv1: 64 x 128 x 3 x 3 x 4 B = 0.29 MB), but
fc1's 411 M is its weight *count* (7 x 7 x 512 inputs x 4096 outputs), which
would be 1.64 GB at 4 bytes. Taking 411 MB keeps the seed's own arithmetic
(fc1 holds 96 % of the 427 MB total, the seed's "97 %"), so the figures of
this module are the seed's.

The iteration of one set (local mini-batch ``N`` samples)
---------------------------------------------------------
``T1`` forward and backward over the ``N`` samples, ``T2`` the exchange of
parameter updates between the sets (each node sends its own parameters once,
all nodes at once, so the busiest node sets the time), ``T3`` the update.

* data parallel (:func:`data_parallel`): ``T1 = 2 N sum T_L``,
  ``T2 = sum param_bytes / NW``, ``T3 = sum T_L``.
* hybrid with a layer-wise pipeline (:func:`hybrid_pipeline`): one node group
  per layer, samples streamed through them.
  ``interval = max T_L``, ``latency = sum T_L + sum U_{L,L+1}``,
  ``T1 = 2 (interval (N - 1) + latency)``, ``T2 = max param_bytes_L / NW``,
  ``T3 = max T_L`` (``T_L`` and ``param_bytes_L`` already divided by the
  layer's channel split). The seed names ``U_{L,L+1}`` (the transfer between
  the nodes of consecutive layers) without a formula; here it is
  ``output_bytes_L / NW``: every node of layer ``L + 1`` needs the whole output
  of layer ``L`` (a broadcast when ``L + 1`` is split, a gather when ``L`` is),
  and its one link receives it, so a split changes neither end's time.
* the rectangle model's plan (:func:`channel_split`): each of the set's ``k``
  members computes ``1/k`` of the output channels of *every* layer, no
  pipeline. After each layer the members all-gather the activations (each
  receives ``(k - 1)/k`` of the layer's output), and on the way back they
  reduce-scatter the partial input gradients of every layer but the first
  (``(k - 1)/k`` of its input). ``T1 = 2 N sum T_L / k + N sum_L (k - 1)/k
  (output_L + input_L [L > 1]) / NW``, ``T2 = sum param_bytes / (k NW)``,
  ``T3 = sum T_L / k``. Communication is not overlapped with computation.
  ``k = 1`` is data parallelism exactly.

The x-axis: global mini-batch per node
--------------------------------------
The seed compares the scenarios against "the global mini-batch per node",
``b = B / P`` for a global mini-batch ``B`` on ``P`` nodes in all, and reads a
small ``b`` as a small mini-batch at a high parallelism. We compare at equal
``P`` and equal ``B``: a set of ``k`` nodes is one of ``P / k`` data-parallel
sets, so its local mini-batch is ``N = k b`` (data parallel: ``N = b``; hv3,
nine nodes per set: ``N = 9 b``). ``P`` is taken to be a multiple of every set
size (for example 90 nodes for sets of 1, 5, 6 and 9), and ``T2`` does not
depend on ``P`` in the seed's model, so the seconds per iteration are a
function of ``b`` alone. The formulas are affine in ``N``; :func:`crossovers`
reads them at real ``b`` to locate where two scenarios swap places.

The rectangle model's set size
------------------------------
:func:`best_channel_split` tries every ``k`` in :data:`RPM_SET_SIZES`, the
divisors of 128, the fewest output channels of any layer (cv1: 128), so
every layer splits into equal whole channel blocks, and keeps the fastest;
ties go to the smaller ``k`` (fewer nodes to coordinate). The trade-off: the
exchange ``T2`` shrinks as ``1/k`` while the per-sample all-gathers grow as
``(k - 1) b c`` (``c``: the bytes one sample's all-gathers and reduce-scatters
would move if each were whole, over ``NW``; 5.8 ms for Table 1). The best
real ``k`` is ``sqrt((T2 + T3 at k = 1) / (b c))``, about ``sqrt(19.6 / b)``
here, so the plan is data parallelism (``k = 1``) from ``b`` of about 10 up.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, NamedTuple

import numpy as np

__all__ = [
    "Layer",
    "Machine",
    "Scenario",
    "Breakdown",
    "Sweep",
    "Crossover",
    "TABLE1",
    "TABLE2",
    "SCENARIOS",
    "RPM_SET_SIZES",
    "BATCHES",
    "layer_seconds",
    "split_layer_seconds",
    "data_parallel",
    "hybrid_pipeline",
    "channel_split",
    "best_channel_split",
    "iteration",
    "sweep",
    "crossovers",
]


class Layer(NamedTuple):
    """One row of the seed's Table 1 (per sample, in bytes where a size)."""

    name: str
    kind: Literal["conv", "fc"]
    flop: float
    param_bytes: float
    input_bytes: float
    output_bytes: float


class Machine(NamedTuple):
    """The seed's Table 2: one node's rates."""

    flops: float  # flop/s
    memory_bandwidth: float  # B/s
    network_bandwidth: float  # B/s, per node


class Scenario(NamedTuple):
    """How one set of nodes holds the network.

    Attributes
    ----------
    name : str
        Label in tables and figures.
    splits : tuple of int
        Per layer, the number of nodes that share it by output channel.
    pipeline : bool
        True: each layer (or channel part) has its own nodes and samples stream
        through them (the seed's hybrid). False: every member computes its share
        of every layer (data parallel when all splits are 1, the rectangle
        model's plan when they are all ``k``).
    """

    name: str
    splits: tuple[int, ...]
    pipeline: bool

    @property
    def nodes(self) -> int:
        """Nodes per set."""
        return sum(self.splits) if self.pipeline else max(self.splits)


class Breakdown(NamedTuple):
    """Seconds of one iteration of one set, by part (:func:`data_parallel`, ...)."""

    t1: float  # forward + backward over the local mini-batch
    t2: float  # parameter exchange between the sets
    t3: float  # update
    local_batch: float  # N, samples per set per iteration

    @property
    def total(self) -> float:
        """``t1 + t2 + t3``."""
        return self.t1 + self.t2 + self.t3


class Sweep(NamedTuple):
    """Seconds per iteration of several scenarios over global mini-batches per node."""

    batches: np.ndarray  # global mini-batch per node, shape (n,)
    names: tuple[str, ...]  # scenarios, "rpm" last
    seconds: np.ndarray  # shape (len(names), n)
    rpm_k: np.ndarray  # the rectangle model's best set size at each batch, shape (n,)


class Crossover(NamedTuple):
    """Two scenarios swap places at ``batch``: ``below`` is faster under it, ``above`` over it."""

    below: str
    above: str
    batch: float
    seconds: float


_G, _M = 1e9, 1e6  # the table's prefixes

#: The seed's Table 1 (simplified VGG16: 64 x 224 x 224 input, 4096 outputs), as printed.
TABLE1: tuple[Layer, ...] = (
    Layer("cv1", "conv", 7.40 * _G, 0.29 * _M, 12.8 * _M, 6.42 * _M),
    Layer("cv2", "conv", 7.40 * _G, 1.18 * _M, 6.42 * _M, 3.21 * _M),
    Layer("cv3", "conv", 7.40 * _G, 4.72 * _M, 3.21 * _M, 1.60 * _M),
    Layer("cv4", "conv", 3.70 * _G, 9.43 * _M, 1.60 * _M, 0.40 * _M),
    Layer("fc1", "fc", 0.21 * _G, 411 * _M, 0.40 * _M, 4096.0),
)

#: The seed's Table 2: 4 TFLOP/s, 400 GB/s memory and 4 GB/s network per node.
TABLE2 = Machine(flops=4e12, memory_bandwidth=400e9, network_bandwidth=4e9)

#: The seed's four scenarios (§4.2), for :data:`TABLE1`'s five layers.
SCENARIOS: tuple[Scenario, ...] = (
    Scenario("data", (1, 1, 1, 1, 1), pipeline=False),
    Scenario("hv1", (1, 1, 1, 1, 1), pipeline=True),
    Scenario("hv2", (1, 1, 1, 1, 2), pipeline=True),
    Scenario("hv3", (2, 2, 2, 1, 2), pipeline=True),
)

#: Set sizes the rectangle model's plan may take: the divisors of 128 (see the module docstring).
RPM_SET_SIZES: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)

#: The table's global mini-batches per node.
BATCHES: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def layer_seconds(layer: Layer, machine: Machine = TABLE2) -> float:
    """``T_L``: seconds of one sample through ``layer`` (forward or backward) on one whole node."""
    if layer.kind == "conv":
        return layer.flop / machine.flops
    if layer.kind == "fc":
        return layer.param_bytes / machine.memory_bandwidth
    raise ValueError(f"layer {layer.name!r}: kind {layer.kind!r} is not 'conv' or 'fc'")


def split_layer_seconds(
    splits: Sequence[int], network: Sequence[Layer] = TABLE1, machine: Machine = TABLE2
) -> np.ndarray:
    """Per layer, ``T_L / k_L``: one node's seconds per sample when ``k_L`` nodes share the layer."""
    k = _splits(splits, network)
    return np.array([layer_seconds(layer, machine) for layer in network]) / k


def data_parallel(
    n: float, network: Sequence[Layer] = TABLE1, machine: Machine = TABLE2
) -> Breakdown:
    """The seed's data-parallel iteration of one node on a local mini-batch of ``n`` samples.

    Parameters
    ----------
    n : float
        Local mini-batch ``N`` (> 0).
    network, machine
        Table 1 and Table 2 by default.

    Returns
    -------
    Breakdown
        ``T1 = 2 N sum T_L``, ``T2 = sum param_bytes / NW``, ``T3 = sum T_L``.
    """
    _positive(n)
    t = split_layer_seconds([1] * len(network), network, machine)
    params = sum(layer.param_bytes for layer in network)
    return Breakdown(
        t1=2 * n * float(t.sum()),
        t2=params / machine.network_bandwidth,
        t3=float(t.sum()),
        local_batch=float(n),
    )


def hybrid_pipeline(
    n: float,
    splits: Sequence[int],
    network: Sequence[Layer] = TABLE1,
    machine: Machine = TABLE2,
) -> Breakdown:
    """The seed's hybrid iteration: layers pipelined over a set's nodes, some split by channel.

    Parameters
    ----------
    n : float
        The set's local mini-batch ``N`` (> 0).
    splits : sequence of int
        Per layer, how many nodes share it by output channel (1: a whole layer).
    network, machine
        Table 1 and Table 2 by default.

    Returns
    -------
    Breakdown
        ``T1 = 2 (interval (N - 1) + latency)`` with ``interval = max T_L`` and
        ``latency = sum T_L + sum U_{L,L+1}``, ``U_{L,L+1} = output_bytes_L / NW``;
        ``T2 = max param_bytes_L / NW``; ``T3 = max T_L``; ``T_L`` and
        ``param_bytes_L`` divided by the layer's split.
    """
    _positive(n)
    k = _splits(splits, network)
    t = split_layer_seconds(splits, network, machine)
    transfers = sum(layer.output_bytes for layer in network[:-1]) / machine.network_bandwidth
    interval = float(t.max())
    latency = float(t.sum()) + transfers
    params = np.array([layer.param_bytes for layer in network]) / k
    return Breakdown(
        t1=2 * (interval * (n - 1) + latency),
        t2=float(params.max()) / machine.network_bandwidth,
        t3=interval,
        local_batch=float(n),
    )


def channel_split(
    n: float, k: int, network: Sequence[Layer] = TABLE1, machine: Machine = TABLE2
) -> Breakdown:
    """The rectangle model's plan: every layer's output channels cut among a set's ``k`` members.

    Parameters
    ----------
    n : float
        The set's local mini-batch ``N`` (> 0).
    k : int
        Members per set (>= 1); ``k = 1`` is :func:`data_parallel`.
    network, machine
        Table 1 and Table 2 by default.

    Returns
    -------
    Breakdown
        ``T1 = 2 N sum T_L / k`` plus, for the ``N`` samples, an all-gather of each
        layer's output and a reduce-scatter of each later layer's input gradient
        (``(k - 1)/k`` of the bytes received per member, at ``NW``);
        ``T2 = sum param_bytes / (k NW)``; ``T3 = sum T_L / k``.
    """
    _positive(n)
    k = _set_size(k)
    t = split_layer_seconds([k] * len(network), network, machine)
    share = (k - 1) / k  # of a tensor a member receives in an all-gather or reduce-scatter
    per_sample = sum(layer.output_bytes for layer in network)  # forward all-gathers
    per_sample += sum(layer.input_bytes for layer in network[1:])  # backward reduce-scatters
    params = sum(layer.param_bytes for layer in network)
    return Breakdown(
        t1=2 * n * float(t.sum()) + n * share * per_sample / machine.network_bandwidth,
        t2=params / k / machine.network_bandwidth,
        t3=float(t.sum()),
        local_batch=float(n),
    )


def best_channel_split(
    batch: float,
    network: Sequence[Layer] = TABLE1,
    machine: Machine = TABLE2,
    sizes: Sequence[int] = RPM_SET_SIZES,
) -> tuple[int, Breakdown]:
    """The fastest set size ``k`` of :func:`channel_split` at global mini-batch per node ``batch``.

    Each ``k`` in ``sizes`` runs a local mini-batch of ``k * batch``; ties go to the smaller ``k``.

    Returns
    -------
    (int, Breakdown)
        The set size and its iteration.
    """
    _positive(batch)
    if not sizes:
        raise ValueError("sizes is empty: give at least one set size")
    best: tuple[int, Breakdown] | None = None
    for k in sorted(sizes):
        b = channel_split(k * batch, k, network, machine)
        if best is None or b.total < best[1].total:
            best = (k, b)
    assert best is not None
    return best


def iteration(
    scenario: Scenario,
    batch: float,
    network: Sequence[Layer] = TABLE1,
    machine: Machine = TABLE2,
) -> Breakdown:
    """One iteration of ``scenario`` at global mini-batch per node ``batch`` (``N = nodes * batch``).

    Parameters
    ----------
    scenario : Scenario
        A pipelined hybrid, or a non-pipelined set whose layers are all split alike.
    batch : float
        Global mini-batch divided by the total number of nodes (> 0).
    network, machine
        Table 1 and Table 2 by default.
    """
    _positive(batch)
    n = scenario.nodes * batch
    if scenario.pipeline:
        return hybrid_pipeline(n, scenario.splits, network, machine)
    if len(set(scenario.splits)) != 1:
        raise ValueError(
            f"scenario {scenario.name!r}: without a pipeline every layer is split alike, "
            f"not {scenario.splits}"
        )
    k = scenario.splits[0]
    return data_parallel(n, network, machine) if k == 1 else channel_split(n, k, network, machine)


def sweep(
    batches: Sequence[float] | np.ndarray = BATCHES,
    scenarios: Sequence[Scenario] = SCENARIOS,
    network: Sequence[Layer] = TABLE1,
    machine: Machine = TABLE2,
) -> Sweep:
    """Seconds per iteration of ``scenarios`` and of the rectangle model's best plan ("rpm").

    Parameters
    ----------
    batches : sequence or 1-D array of float
        Global mini-batches per node (each > 0).
    scenarios : sequence of Scenario
        The seed's four by default.
    network, machine
        Table 1 and Table 2 by default.
    """
    b = np.asarray(batches, dtype=float)
    if b.ndim != 1 or b.size == 0 or not np.all(np.isfinite(b) & (b > 0)):
        raise ValueError(f"batches must be finite numbers > 0, got {list(batches)}")
    seconds = np.empty((len(scenarios) + 1, b.size))
    rpm_k = np.empty(b.size, dtype=int)
    for j, x in enumerate(b):
        for i, s in enumerate(scenarios):
            seconds[i, j] = iteration(s, x, network, machine).total
        rpm_k[j], best = best_channel_split(x, network, machine)
        seconds[-1, j] = best.total
    return Sweep(b, tuple(s.name for s in scenarios) + ("rpm",), seconds, rpm_k)


def crossovers(
    lo: float = 1.0,
    hi: float = 256.0,
    scenarios: Sequence[Scenario] = SCENARIOS,
    network: Sequence[Layer] = TABLE1,
    machine: Machine = TABLE2,
    points: int = 2049,
) -> tuple[Crossover, ...]:
    """Where two of the scenarios (and "rpm") change order between ``lo`` and ``hi``.

    Every pair is compared on ``points`` batches spaced evenly in ``log b``; each sign
    change of their difference is narrowed by bisection (the times are continuous in
    ``b``). A pair that only touches without crossing is not reported.

    Returns
    -------
    tuple of Crossover
        By batch.
    """
    if not (0 < lo < hi and np.isfinite(hi)):
        raise ValueError(f"need 0 < lo < hi, got lo={lo}, hi={hi}")
    grid = np.geomspace(lo, hi, points)
    sw = sweep(grid, scenarios, network, machine)

    def seconds(name: str, x: float) -> float:
        return float(sweep([x], scenarios, network, machine).seconds[sw.names.index(name), 0])

    out = []
    for i, a in enumerate(sw.names):
        for c in sw.names[i + 1 :]:
            d = sw.seconds[i] - sw.seconds[sw.names.index(c)]
            sign = np.sign(d)
            for j in np.flatnonzero(sign[:-1] * sign[1:] < 0):
                x0, x1 = grid[j], grid[j + 1]
                for _ in range(60):  # bisection to ~1e-16 of the bracket
                    mid = 0.5 * (x0 + x1)
                    dm = seconds(a, mid) - seconds(c, mid)
                    if np.sign(dm) == sign[j]:
                        x0 = mid
                    else:
                        x1 = mid
                x = 0.5 * (x0 + x1)
                below, above = (a, c) if sign[j] < 0 else (c, a)
                out.append(Crossover(below, above, float(x), seconds(a, x)))
    return tuple(sorted(out, key=lambda r: r.batch))


def _positive(x: float) -> None:
    if not (np.isfinite(x) and x > 0):
        raise ValueError(f"a mini-batch must be a finite number > 0, got {x!r}")


def _set_size(k: int) -> int:
    if isinstance(k, bool) or int(k) != k or k < 1:
        raise ValueError(f"a set size must be a whole number >= 1, got {k!r}")
    return int(k)


def _splits(splits: Sequence[int], network: Sequence[Layer]) -> np.ndarray:
    if len(splits) != len(network):
        raise ValueError(
            f"{len(splits)} splits for {len(network)} layers: give one per layer "
            f"({', '.join(layer.name for layer in network)})"
        )
    return np.array([_set_size(k) for k in splits], dtype=float)
