"""Mini-batch schedule: which samples each iteration uses, and which of them each column takes.

Pure (numpy only). The sequence of mini-batches depends only on the number
of samples, the batch size and the seed — never on the plan — so every plan
and every remap trains on the same batches as the serial reference:

* epoch ``e`` visits the samples in the order ``order(e)``: a permutation
  drawn from ``numpy.random.default_rng((seed, e))`` (``shuffle=True``), or
  ``0 .. s-1``;
* iteration ``k`` of an epoch uses positions ``[k B, min((k + 1) B, s))`` of
  that order (the last batch of an epoch may be smaller);
* a plan's column with samples ``[a, b)`` of ``s`` takes positions
  ``[floor(B' a / s), floor(B' b / s))`` of a batch of ``B'`` samples: the
  same share of every mini-batch as of the full batch. The columns' shares
  tile the batch, and the gradient summed over columns is the batch gradient.

scikit-learn's order instead (``shuffle=`` a ``numpy.random.RandomState``):
epoch ``e`` reshuffles epoch ``e - 1``'s order, ``order(e) = order(e - 1)[p_e]``
with ``p_e`` that generator's ``shuffle`` of ``0 .. s-1``, as
``sklearn.utils.shuffle`` does in ``MLPClassifier``'s loop; the generator's
state at the start is all the schedule keeps, and each process replays it.

Chunk-local shuffle (``shuffle="chunks"``, for data cut into chunks of rows:
:class:`ChunkOrder`): a different sampling, made for data that stay where they
are. Epoch ``e`` permutes the rows within each chunk and interleaves the chunks
in an order drawn from ``default_rng((seed, e))`` (slot ``i`` of chunk ``j``
of ``n_j`` rows sits at key ``(i + u_j) / n_j``, ``u_j`` uniform in ``[0, 1)``,
and the epoch visits the keys in ascending order), so every mini-batch draws
from every chunk in proportion to its rows. A column then takes, of each
batch, the samples in its own range ``[a, b)`` (not a share of positions):
a column whose range is whole chunks uses only those chunks' rows, which is
why it moves none when its workers hold them. The batches depend on the
chunk sizes (not on the plan): :func:`dask_rpm.fit_serial` given the same
chunks trains on the same batches.

Chunk stream (``shuffle="stream"``, :class:`ChunkOrder` with ``stream=True``): another
sampling, made for data larger than the workers' memory. Epoch ``e`` visits the chunks one
after another in a seeded random order, the rows of each permuted within it, and the columns
take their position shares of every batch as with ``shuffle=True``. A batch then comes from
one or two chunks, and a window of iterations from the few chunks it visits: each chunk is
read about once an epoch, where under the other shuffles every window reads every chunk.
Rows move (a column's share of a batch is wherever that chunk lives).

Full-batch training (``batch_size=None``, the paper's) is the special case
of one batch per epoch in sample order: a column's share is then exactly its
sample range, as before mini-batches existed.
"""

from __future__ import annotations

import functools
import math
import threading
import warnings
from typing import Any, NamedTuple

import numpy as np

from ..plan.partition import Plan
from .errors import DataError

__all__ = [
    "ChunkOrder",
    "batch_plan",
    "column_share",
    "BatchSchedule",
    "BatchError",
    "schedule",
    "rng_state",
]


class BatchError(DataError):
    """An invalid batch size, epoch count or shuffle setting."""


class ChunkOrder(NamedTuple):
    """``shuffle=`` this: the chunk-local shuffle over chunks of ``chunks`` rows each, in order,
    or with ``stream`` the chunk stream (module docstring); ``shuffle="chunks"`` /
    ``"stream"`` with Dask data become one with the data's chunks."""

    chunks: tuple[int, ...]
    stream: bool = False


class BatchSchedule(NamedTuple):
    """The mini-batch sequence of a run."""

    samples: int
    batch_size: int | None = None
    shuffle: bool = True
    seed: int = 0
    #: the state of a ``numpy.random.RandomState`` whose shuffles order the epochs as
    #: scikit-learn's do (module docstring); None: seeded permutations of ``seed``
    rng: tuple | None = None
    #: the rows of each chunk, in order, for the chunk-local shuffle (module docstring); None:
    #: the sample order ``order(e)`` and position shares
    chunks: tuple[int, ...] | None = None
    #: with ``chunks``: the chunk stream (chunks one after another) instead of the chunk-local
    #: shuffle
    stream: bool = False

    @property
    def local(self) -> bool:
        """Whether the epochs follow the chunk-local shuffle (columns take their own samples)."""
        return self.chunks is not None and not self.stream and not self.full_batch

    @property
    def full_batch(self) -> bool:
        return self.batch_size is None or self.batch_size >= self.samples

    @property
    def batch(self) -> int:
        """Samples per (full) mini-batch."""
        return self.samples if self.full_batch else int(self.batch_size)  # type: ignore[arg-type]

    @property
    def per_epoch(self) -> int:
        """Iterations per epoch."""
        return math.ceil(self.samples / self.batch)

    def epoch(self, iteration: int) -> int:
        return iteration // self.per_epoch

    def order(self, epoch: int) -> np.ndarray:
        """The sample order of ``epoch`` (int64 indices)."""
        if self.full_batch or not self.shuffle:
            return np.arange(self.samples, dtype=np.int64)
        if self.chunks is not None:
            return _chunk_order(self.chunks, self.seed, epoch, self.stream).copy()
        if self.rng is not None:
            return _replayed_order(self.rng, self.samples, epoch)
        return np.random.default_rng((self.seed, epoch)).permutation(self.samples).astype(np.int64)

    def positions(self, iteration: int) -> tuple[int, int]:
        """Positions ``[lo, hi)`` of ``order(epoch(iteration))`` that the iteration uses."""
        k = iteration % self.per_epoch
        return k * self.batch, min((k + 1) * self.batch, self.samples)

    def share(self, iteration: int, cut: tuple[int, int]) -> tuple[int, int]:
        """Positions of the epoch order that the column with samples ``cut`` takes in ``iteration``."""
        lo, hi = self.positions(iteration)
        a, b = column_share(hi - lo, cut, self.samples)
        return lo + a, lo + b

    def indices(self, iteration: int, cut: tuple[int, int] | None = None) -> np.ndarray:
        """Sample indices of ``iteration`` (of the column with samples ``cut``, if given)."""
        if cut is not None and self.local:
            idx, _ = self.epoch_plan(self.epoch(iteration), cut, iteration, iteration + 1)
            return idx
        p0, p1 = self.positions(iteration) if cut is None else self.share(iteration, cut)
        return self.order(self.epoch(iteration))[p0:p1]

    def epoch_plan(
        self,
        epoch: int,
        cut: tuple[int, int],
        start: int | None = None,
        stop: int | None = None,
    ) -> tuple[np.ndarray, list[int]]:
        """What a column needs for iterations ``[start, stop)`` of an epoch: its sample indices,
        batch after batch, and the offsets of each batch in them.

        ``start`` is the first iteration wanted (default: the epoch's first), ``stop`` the one
        after the last (default: the epoch's end). Returns ``(indices, offsets)`` with
        ``offsets[j]`` .. ``offsets[j + 1]`` the rows of iteration ``start + j``.
        """
        first = epoch * self.per_epoch
        start = first if start is None else start
        stop = first + self.per_epoch if stop is None else min(stop, first + self.per_epoch)
        order = self.order(epoch)
        if stop <= start:
            return np.empty(0, np.int64), [0]
        if self.local:  # the batches' samples within the column's range, in batch order
            a, b = cut
            lo, hi = self.positions(start)[0], self.positions(stop - 1)[1]
            part = order[lo:hi]
            keep = (part >= a) & (part < b)
            edges = [self.positions(it)[0] - lo for it in range(start, stop)] + [hi - lo]
            counts = np.concatenate([[0], np.cumsum(keep)])
            return part[keep], [int(counts[e]) for e in edges]
        parts, offsets = [], [0]
        for it in range(start, stop):
            p0, p1 = self.share(it, cut)
            parts.append(order[p0:p1])
            offsets.append(offsets[-1] + (p1 - p0))
        idx = np.concatenate(parts) if parts else np.empty(0, np.int64)
        return idx, offsets

    def capacity(self, cut: tuple[int, int]) -> int:
        """Most samples the column with samples ``cut`` takes of one iteration."""
        a, b = cut
        if self.full_batch:
            return b - a
        if not self.local:
            return -(-self.batch * (b - a) // self.samples) + 1
        # A window of B consecutive keys spans at most (B + J) / s of the key range, which holds
        # at most floor((B + J) n_j / s) + 1 slots of chunk j (its keys are 1 / n_j apart).
        sizes = np.asarray(self.chunks, dtype=np.int64)
        bounds = np.concatenate([[0], np.cumsum(sizes)])
        inside = np.clip(np.minimum(bounds[1:], b) - np.maximum(bounds[:-1], a), 0, None)
        most = (self.batch + len(sizes)) * sizes // self.samples + 1
        return int(min(np.minimum(inside, most).sum(), self.batch, b - a))


#: replayed scikit-learn orders: (state, samples) -> (epoch, order, generator after it)
_ORDERS: dict[tuple[tuple, int], tuple[int, np.ndarray, np.random.RandomState]] = {}
_ORDERS_LOCK = threading.Lock()


def _replayed_order(rng: tuple, samples: int, epoch: int) -> np.ndarray:
    """Epoch ``epoch``'s order of scikit-learn's cumulative shuffles from generator state ``rng``.

    Epochs are asked for in order, so the last one replayed is kept: each next
    epoch costs one shuffle, an earlier one (after a remap) a replay from the start.
    """
    key = (rng, samples)
    with _ORDERS_LOCK:
        hit = _ORDERS.get(key)
        if hit is None or hit[0] > epoch:
            gen = np.random.RandomState()
            gen.set_state((rng[0], np.asarray(rng[1], dtype=np.uint32), *rng[2:]))
            done, order = -1, np.arange(samples, dtype=np.int64)
        else:
            done, order, gen = hit
        while done < epoch:
            perm = np.arange(samples)
            gen.shuffle(perm)
            order = order[perm]
            done += 1
        if len(_ORDERS) >= 8 and key not in _ORDERS:
            _ORDERS.pop(next(iter(_ORDERS)))
        _ORDERS[key] = (done, order, gen)
        return order.copy()


@functools.lru_cache(maxsize=4)
def _chunk_order(chunks: tuple[int, ...], seed: int, epoch: int, stream: bool) -> np.ndarray:
    """Epoch ``epoch``'s order of the chunk-local shuffle or the chunk stream (module
    docstring); read-only, cached: each column asks for it at every load of the epoch."""
    rng = np.random.default_rng((seed, epoch))
    sizes = np.asarray(chunks, dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    if stream:
        visit = rng.permutation(sizes.size)
        parts = [starts[j] + rng.permutation(int(sizes[j])) for j in visit.tolist()]
        order = np.concatenate(parts).astype(np.int64)
        order.flags.writeable = False
        return order
    offset = rng.random(sizes.size)  # where each chunk's first slot falls: the interleave
    chunk = np.repeat(np.arange(sizes.size), sizes)
    slot = np.arange(int(sizes.sum()), dtype=np.int64) - np.repeat(starts, sizes)
    keys = (slot + offset[chunk]) / sizes[chunk]
    rows = np.concatenate([starts[j] + rng.permutation(n) for j, n in enumerate(sizes.tolist())])
    order = rows[np.lexsort((chunk, keys))].astype(np.int64)
    order.flags.writeable = False
    return order


def rng_state(gen: np.random.RandomState) -> tuple:
    """A ``RandomState``'s state as a hashable tuple (what :class:`BatchSchedule` keeps)."""
    name, keys, pos, has_gauss, cached = gen.get_state()
    return (str(name), tuple(int(k) for k in keys), int(pos), int(has_gauss), float(cached))


def schedule(
    samples: int, batch_size: int | str | None = None, *, shuffle: Any = True, seed: int = 0
) -> BatchSchedule:
    """A validated :class:`BatchSchedule`: ``batch_size`` None (or ``"full"``) is full-batch BP.

    ``shuffle`` may be a ``numpy.random.RandomState``: shuffled epochs in
    scikit-learn's order, drawn from (a copy of) that generator's state; or a
    :class:`ChunkOrder`: the chunk-local shuffle (or the chunk stream) over its chunks.
    """
    rng = None
    chunks = None
    if isinstance(shuffle, np.random.RandomState):
        rng, shuffle = rng_state(shuffle), True
    if isinstance(shuffle, str) and shuffle in ("chunks", "stream"):
        raise BatchError(
            f"shuffle={shuffle!r} needs the data's chunks: give x as a dask "
            "array, xarray backed by dask or a zarr store (dask.array.from_array(x, chunks=...) "
            "for numpy data), or shuffle=True / False"
        )
    stream = False
    if isinstance(shuffle, ChunkOrder):
        chunks, stream = tuple(int(c) for c in shuffle.chunks), bool(shuffle.stream)
        if any(c < 1 for c in chunks) or sum(chunks) != samples:
            raise BatchError(
                f"shuffle=ChunkOrder with chunks of {sum(chunks)} rows ({len(chunks)} chunks) for "
                f"{samples} training samples; give every chunk's rows (each >= 1), summing to "
                f"the samples"
            )
        shuffle = True
    if batch_size is not None and batch_size != "full":
        if (
            isinstance(batch_size, bool)
            or not isinstance(batch_size, (int, np.integer))
            or batch_size < 1
        ):
            raise BatchError(
                f"batch_size={batch_size!r}; give a positive integer, or None for full-batch "
                f"training (every sample in every iteration)"
            )
        batch_size = int(batch_size)
        if batch_size > samples:
            warnings.warn(
                f"batch_size={batch_size} is more than the {samples} training samples: every "
                f"iteration trains on all of them (full batch)",
                stacklevel=3,
            )
    else:
        batch_size = None
    if not isinstance(shuffle, (bool, np.bool_)):
        raise BatchError(
            f"shuffle={shuffle!r}; give true or false, 'chunks' or 'stream' with Dask data (the "
            f"chunk-local shuffle, the chunk stream), or a numpy.random.RandomState for "
            f"scikit-learn's order"
        )
    return BatchSchedule(int(samples), batch_size, bool(shuffle), int(seed), rng, chunks, stream)


def column_share(size: int, cut: tuple[int, int], samples: int) -> tuple[int, int]:
    """Positions ``[floor(size a / s), floor(size b / s))`` of a batch of ``size`` that the
    column with samples ``cut = [a, b)`` of ``s`` takes (shares of adjacent columns tile it)."""
    a, b = cut
    return size * a // samples, size * b // samples


def batch_plan(plan: Plan, batch: int) -> Plan:
    """The rectangles one iteration on mini-batches of ``batch`` samples works on.

    Column ``c`` with sample range ``[a, b)`` of the whole set takes positions
    ``[floor(B a / s), floor(B b / s))`` of every batch (:meth:`BatchSchedule.share`), so its share
    is ``floor(B b / s) - floor(B a / s)`` samples; the hidden cuts do not change. The cost
    model then charges compute and vertical exchanges for what an iteration really holds.
    ``batch >= plan.samples`` (full batch) returns ``plan`` itself.
    """
    if batch >= plan.samples:
        return plan
    sizes = []
    for c in range(plan.n_columns):
        a, b = column_share(batch, plan.column_samples(c), plan.samples)
        sizes.append(b - a)
    if min(sizes) < 1:
        raise ValueError(
            f"a batch of {batch} samples leaves a column of the plan with no sample; "
            f"{plan.n_columns} columns need a batch of at least {plan.n_columns} (more is safer)"
        )
    hidden = [[plan.rectangle(w).n_hidden for w in col] for col in plan.columns]
    out = Plan.from_columns(
        plan.columns,
        sizes,
        hidden,
        abilities=plan.abilities,
        shape=plan.shape,
        method=plan.method,
    )
    return out.with_workers(list(plan.workers)) if plan.workers is not None else out
