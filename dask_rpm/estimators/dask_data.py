"""The estimators on Dask's own data: dask arrays, dask-backed xarray, zarr stores.

What ``fit`` / ``partial_fit`` / ``predict`` / ``predict_proba`` / ``score`` of every dask_rpm
estimator do with a Dask user's data (:mod:`dask_rpm.nn.chunked` says which forms):

* :func:`inputs`: ``X`` and ``y`` as dask arrays chunked along samples; without a cluster
  (no ``client`` and no default client) computed into numpy arrays, which the estimator then
  takes as it takes any arrays;
* :func:`features` and :func:`labels`: scikit-learn's checks of ``X`` and class labels, done
  with reductions on the workers (the classes, a few numbers, reach the client) and the labels
  binarized there by the estimator's ``LabelBinarizer``;
* :func:`split`: scikit-learn's early-stopping split by indices, so that the training rows stay
  on the cluster and only the validation rows reach the client;
* :func:`lazy`: ``predict`` and friends as a dask array, one task per chunk applying a copy of
  the fitted estimator, which the graph holds once (one key every chunk's task depends on);
* :func:`score`: accuracy or R^2 as reductions on the workers.
"""

from __future__ import annotations

import copy
import uuid
import warnings
from typing import Any

import numpy as np

from ..nn.chunked import as_chunked, chunked_inputs, is_chunked
from .errors import EstimatorError

__all__ = [
    "aligned",
    "compute",
    "features",
    "images",
    "inputs",
    "is_lazy",
    "labels",
    "lazy",
    "numeric",
    "score",
    "split",
    "unique",
]


def is_lazy(a: Any) -> bool:
    """Whether ``a`` is a dask array."""
    return type(a).__module__.startswith("dask.array")


def compute(client: Any, *arrays: Any) -> list[Any]:
    """``arrays`` computed on ``client``'s workers (None: dask's current scheduler)."""
    if client is None:
        import dask

        return list(dask.compute(*arrays))
    return list(client.compute(list(arrays), sync=True))


def inputs(client: Any, X: Any, y: Any) -> tuple[Any, Any]:
    """``X`` and ``y`` of ``fit`` / ``partial_fit`` as they are when neither is Dask's, else as
    dask arrays with the same row chunks (``y`` may be left out for an xarray ``Dataset`` or a
    zarr store holding ``x`` and ``d``), computed when ``client`` is None."""
    if not is_chunked(X, y):
        return X, y
    pair = as_chunked(X, y)
    if client is None:  # serial training: the arrays it would be given computed
        x, d = compute(None, pair.x, pair.d)
        return np.asarray(x), np.asarray(d)
    return pair.x, pair.d


def images(X: Any, y: Any) -> tuple[np.ndarray, np.ndarray]:
    """A CNN's Dask images ``X`` (``(samples, channels, height, width)`` or rows of flattened
    images, chunked along samples) and labels ``y`` computed, for training without a cluster."""
    x = chunked_inputs(X)
    if type(y).__module__.startswith("xarray"):
        y = y.transpose("sample", ...).data
    xv, yv = compute(None, x, y) if is_lazy(y) else (*compute(None, x), y)
    return np.asarray(xv), np.asarray(yv)


def numeric(X: Any) -> None:
    """Dask ``X`` of numbers (its values are checked on the workers as training starts), else an
    :class:`EstimatorError` saying how to convert it."""
    if X.dtype.kind not in "biuf":
        raise EstimatorError(
            f"X has dtype {X.dtype}; the inputs must be numbers: convert them (X.astype('float64'))"
        )


def features(est: Any, X: Any, reset: bool) -> Any:
    """scikit-learn's checks of dask ``X`` that ``validate_data`` does on arrays: float64
    (float32 kept), ``n_features_in_`` set or compared; finite values are checked on the
    workers when training starts (:func:`dask_rpm.engine.dask_data.on_cluster`)."""
    numeric(X)
    if X.dtype not in (np.float64, np.float32):
        X = X.astype(np.float64)
    n = int(np.prod(X.shape[1:]))
    if reset:
        est.n_features_in_ = n
        if hasattr(est, "feature_names_in_"):
            del est.feature_names_in_
    elif n != est.n_features_in_:
        raise EstimatorError(
            f"X has {n} features, but {type(est).__name__} is expecting {est.n_features_in_} "
            f"features as input."
        )
    return X


def _binarize(block: np.ndarray, binarizer: Any, dtype: Any) -> np.ndarray:
    """One chunk of class labels binarized (on a worker)."""
    return np.asarray(binarizer.transform(block), dtype=dtype)


def unique(client: Any, y: Any) -> np.ndarray:
    """The sorted distinct values of dask ``y``, found on the workers."""
    import dask.array as da

    (found,) = compute(client, da.unique(y))
    return np.unique(np.asarray(found))


def labels(est: Any, y: Any, binarizer: Any, dtype: Any) -> Any:
    """Dask 1-D labels binarized on the workers by ``binarizer`` (fitted), in ``dtype``."""
    width = binarizer.transform(binarizer.classes_[:1]).shape[1]
    return y.map_blocks(
        _binarize,
        binarizer,
        np.dtype(dtype),
        new_axis=1,
        chunks=(y.chunks[0], (width,)),
        dtype=np.dtype(dtype),
        meta=np.empty((0, 0), dtype=dtype),
    )


def split(
    client: Any, X: Any, Y: Any, rs: Any, test_size: float, stratify: bool
) -> tuple[Any, Any, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """scikit-learn's ``train_test_split(X, Y, random_state=rs, test_size=..., stratify=...)``
    of dask ``X`` and ``Y``: the same rows, from the same draws of ``rs`` (the split depends on
    the number of samples and the strata alone); the training rows as dask arrays, the
    validation rows computed, then the training and validation row indices."""
    from sklearn.model_selection import train_test_split

    strata = None
    if stratify:  # one bool per sample reaches the client: the classes of a one-column target
        (strata,) = compute(client, Y.astype(bool))
    train, held = train_test_split(
        np.arange(X.shape[0]), random_state=rs, test_size=test_size, stratify=strata
    )
    xv, yv = compute(client, X[held], Y[held])
    return X[train], Y[train], np.asarray(xv), np.asarray(yv), train, held


def aligned(y: Any, x: Any) -> Any:
    """``y`` (dask, xarray with a ``sample`` dimension, or numpy) as a dask array with the row
    chunks of ``x``."""
    import dask.array as da

    if type(y).__module__.startswith("xarray"):
        y = y.transpose("sample", ...).data
    if type(y).__module__.startswith("dask.dataframe"):  # a Series or DataFrame of targets
        with warnings.catch_warnings():  # a Series of strings becomes object labels, as intended
            warnings.filterwarnings("ignore", message=".*converting pandas extension dtypes.*")
            y = y.to_dask_array(lengths=True)
    if not is_lazy(y):
        y = np.asarray(y)
        y = da.from_array(y, chunks=(-1,) * y.ndim)
    if y.shape[0] != x.shape[0]:
        raise EstimatorError(
            f"X has {x.shape[0]} samples and y {y.shape[0]}; give one target or label per sample"
        )
    return y.rechunk({0: x.chunks[0]})


def _apply(block: np.ndarray, model: Any, method: str) -> np.ndarray:
    """``model.method`` on one chunk of inputs (on a worker)."""
    return np.asarray(getattr(model, method)(block))


def lazy(est: Any, method: str, X: Any) -> Any:
    """``est.method(X)`` for Dask's ``X`` as a dask array with ``X``'s row chunks, one task per
    chunk. The tasks apply a copy of the fitted estimator (without its client or last result)
    that the graph holds once under its own key, so each worker receives it once."""
    import dask

    x = chunked_inputs(X)
    model = copy.deepcopy(est)  # __getstate__ leaves the client and result_ out
    # the shape and dtype of the output, from one row of zeros (no chunk of X is computed)
    probe = np.asarray(getattr(model, method)(np.zeros((1, *x.shape[1:]), dtype=x.dtype)))
    held = dask.delayed(model, name=f"rpm-model-{type(est).__name__}-{uuid.uuid4().hex[:12]}")
    return x.map_blocks(
        _apply,
        held,
        method,
        drop_axis=list(range(probe.ndim, x.ndim)),
        chunks=(x.chunks[0], *((int(c),) for c in probe.shape[1:])),
        dtype=probe.dtype,
        meta=np.empty((0,) * probe.ndim, dtype=probe.dtype),
    )


def score(est: Any, X: Any, y: Any, sample_weight: Any, kind: str) -> float:
    """scikit-learn's ``score`` of Dask's data with reductions on the workers: the (weighted)
    accuracy of ``predict`` (``kind="accuracy"``; a row of several labels counts when all
    match) or the coefficient of determination R^2 averaged over the outputs (``"r2"``, with
    scikit-learn's values where the targets are constant: 1 for a perfect fit, else 0)."""
    import dask.array as da

    x = chunked_inputs(X)
    t = aligned(y, x)
    if kind == "accuracy" and t.ndim == 2 and t.shape[1] == 1:
        t = t[:, 0]
    pred = lazy(est, "predict", x)
    w = None
    if sample_weight is not None:
        w = sample_weight
        if not is_lazy(w):
            w = da.from_array(np.asarray(w, dtype=np.float64), chunks=(x.chunks[0],))
        w = w.rechunk((x.chunks[0],)).astype(np.float64)
    client = est._client()
    if kind == "accuracy":
        hit = pred == t
        if hit.ndim == 2:
            hit = hit.all(axis=1)
        hit = hit.astype(np.float64)
        if w is None:
            (value,) = compute(client, hit.mean())
        else:
            num, den = compute(client, (hit * w).sum(), w.sum())
            value = num / den
        return float(value)
    t = t.astype(np.float64)
    if t.ndim == 1:
        t = t[:, None]
    if pred.ndim == 1:
        pred = pred[:, None]
    w2 = da.ones(t.shape[0], chunks=(t.chunks[0],)) if w is None else w
    total = w2.sum()
    mean = (t * w2[:, None]).sum(axis=0) / total
    res, tot = compute(
        client,
        (w2[:, None] * (t - pred) ** 2).sum(axis=0),
        (w2[:, None] * (t - mean) ** 2).sum(axis=0),
    )
    res, tot = np.asarray(res, dtype=np.float64), np.asarray(tot, dtype=np.float64)
    r2 = np.where(tot != 0, 1.0 - res / np.where(tot != 0, tot, 1.0), np.where(res == 0, 1.0, 0.0))
    return float(np.mean(r2))
