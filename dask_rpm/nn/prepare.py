"""From what the user passed to a validated training job: data, targets, validation split, recipe, weights.

Pure (numpy and xarray only): :func:`dask_rpm.fit` and
:func:`dask_rpm.fit_serial` both start here, so they train on the same
samples with the same rules, and every bad input is refused before any work
starts.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, NamedTuple

import numpy as np

from . import sparse
from .chunked import LazySamples
from .cnn import ConvLayers
from .cnn_records import conv_layers, init_conv_params
from .cnn_torch import params_from_torch
from .data import (
    DataError,
    as_arrays,
    check_training_args,
    data_shape,
    dataset_classes,
    load_images,
    load_rows,
)
from .layers import Layers, layers_of_params
from .options import TrainingOptions
from .recipe import Recipe, Validator, holdout, one_hot, recipe

__all__ = ["Prepared", "prepare", "sample_weights"]


class Prepared(NamedTuple):
    """A validated training job.

    ``arrays`` are the training samples (data inputs, no bias column) when
    loaded; otherwise ``source`` is the dataset path and ``rows`` the file rows
    of the training samples (None: all rows in order), or ``lazy`` the samples left on the
    cluster as Dask chunks (:class:`~dask_rpm.nn.chunked.LazySamples`).
    """

    recipe: Recipe
    params0: tuple[np.ndarray, ...]
    layers: Layers | ConvLayers
    shape: tuple[int, int, int]
    samples: int
    arrays: tuple[np.ndarray, np.ndarray] | None
    source: str | None
    rows: np.ndarray | None
    validation: tuple[np.ndarray, np.ndarray] | None
    classes: np.ndarray | None
    target_error: float | None
    dtype: str
    lazy: LazySamples | None = None

    def validator(self) -> Validator | None:
        if self.validation is None:
            return None
        return Validator(self.recipe, *self.validation)


def _targets(
    d: np.ndarray, loss: str | None, classes: Any = None
) -> tuple[np.ndarray, np.ndarray | None]:
    """2-D targets; 1-D labels become one-hot rows (cross-entropy only)."""
    if d.ndim == 1:
        if loss != "cross-entropy":
            raise DataError(
                f"d is 1-D (shape {d.shape}); class labels need loss='cross-entropy', "
                f"other losses take d as (samples, outputs)"
            )
        return one_hot(d, classes)  # a label it does not know: RecipeError, a DataError
    return d, None


def _check_distribution(d: np.ndarray, where: str, output: str = "softmax") -> None:
    """Cross-entropy targets must be probability rows (one-hot or soft labels); with sigmoid
    outputs (binary / multi-label) each target a probability of its own."""
    if output == "sigmoid":
        if d.size and (np.min(d) < 0 or np.max(d) > 1):
            raise DataError(
                f"{where}: with loss='cross-entropy' and output='sigmoid' every target must be in "
                f"[0, 1] (0/1 labels or probabilities); got values from {np.min(d)!r} to {np.max(d)!r}"
            )
        return
    if d.size and (np.min(d) < 0 or not np.allclose(d.sum(axis=1), 1.0, rtol=0, atol=1e-9)):
        bad = int(
            np.argmax((d < 0).any(axis=1) | ~np.isclose(d.sum(axis=1), 1.0, rtol=0, atol=1e-9))
        )
        raise DataError(
            f"{where}: with loss='cross-entropy' every row of d must be >= 0 and sum to 1 "
            f"(one-hot or class probabilities); sample {bad} is {d[bad].tolist()[:8]}. "
            f"Pass 1-D integer labels to have them one-hot encoded"
        )


def _weights(init: Any, weights: list[np.ndarray], rec: Recipe) -> list[np.ndarray]:
    """The augmented initial parameters: ``init``'s biases (``(W0, V0, b0, c0)``, or
    ``(weights, biases)``) joined to ``weights`` (:meth:`~dask_rpm.nn.network.Network.join_params`)."""
    given = _split_init(init)[1]
    biases = None if given is None else [np.asarray(b, dtype=weights[0].dtype) for b in given]
    if biases is not None:
        want = [(w.shape[0],) for w in weights]
        got = [b.shape for b in biases]
        if got != want:
            raise DataError(f"init biases of shapes {got}; they must be {want} (one per unit)")
        if not rec.net.bias:
            raise DataError(
                "init has bias terms (b0, c0) but bias=False; pass bias=True, or init=(W0, V0) "
                "(several hidden layers: the weights alone)"
            )
    return rec.net.join_params(weights, biases)


def _split_init(init: Any) -> tuple[list[Any] | None, list[Any] | None]:
    """``init`` as (weight matrices, biases or None); ``(None, None)`` without one.

    Its forms: ``(W0, V0)``, ``(W0, V0, b0, c0)`` (1-D third entry), a list
    ``(W_1, ..., W_L, V)``, or ``(weights, biases)`` (two sequences of arrays).
    """
    if init is None:
        return None, None
    if not isinstance(init, (tuple, list)) or len(init) < 2:
        raise DataError(
            "init must be (W0, V0), (W0, V0, b0, c0), a list (W_1, ..., W_L, V) or "
            "(weights, biases) for several hidden layers"
        )
    if isinstance(init[0], (list, tuple)):
        return list(init[0]), list(init[1]) if len(init) == 2 else None
    if len(init) == 4 and np.ndim(init[2]) == 1:
        return list(init[:2]), list(init[2:])
    return list(init), None


def prepare(
    x: Any,
    d: Any = None,
    options: TrainingOptions | None = None,
    *,
    classes: Any = None,
    load: bool = False,
) -> Prepared:
    """Validate the data and the training options of a run (``None`` fields: ``rpm.train.*``).

    With ``load=False`` a dataset path stays a path (workers read their
    samples); ``options.validation`` may be None, a fraction to hold out
    (seeded), or ``(x_val, d_val)``. Every bad option raises :class:`DataError`.
    """
    given = options or TrainingOptions()
    o: Any = given.resolved()  # the rpm.train.* defaults, read once
    image = None
    file_classes = None  # the labels an image file was written with (write_dataset)
    if o.network is not None:  # a CNN: images travel as rows; the layers hold the biases
        if isinstance(x, (str, os.PathLike)):  # read here, whole: the workers get arrays
            if d is not None:
                raise DataError(
                    "d given with a dataset path; the file's d(sample, output) are the targets: "
                    "leave d out, or pass the images as an array"
                )
            file_classes = dataset_classes(x)
            x, d = load_images(x)
        x, o, image = _images(x, o, given)
    dtype, seed, init, loss = str(o.dtype), int(o.seed), o.init, o.loss
    target_error = o.target_error
    if target_error is not None and not (np.isfinite(target_error) and target_error >= 0):
        raise DataError(f"target_error={target_error!r}; it must be a finite number >= 0, or None")
    start = _split_init(init)[0]
    src = _source(x, d, loss, classes, load)
    if src.classes is None and file_classes is not None:
        src = src._replace(classes=file_classes)
    classes = src.classes
    # the weights ride in the targets' last column (dask_rpm.nn.network): they split with them
    src = _with_weights(src, o.sample_weight, image is not None)
    # the validation split decides how many samples train, which the schedule needs
    src, rows, val = _split_validation(src, o.validation, loss, seed, dtype)
    s, n, l = src.shape
    try:
        rec = recipe(s, o, validation=val is not None, weights=_weights_of(src, dtype))
    except DataError:
        raise  # with its own class: RecipeError, NetworkError, OptimizerError or BatchError
    except ValueError as exc:
        raise DataError(str(exc)) from None
    checks: dict[str, Any] = dict(
        # a CNN's sizes are its network's: one hidden unit stands in for them in the data checks
        hidden=o.hidden if image is None else 1,
        iterations=rec.iterations,
        learning_rate=rec.learning_rate,
    )
    checks.update(init=start, seed=seed, dtype=dtype)
    weights, arrays = _checked_arrays(src, rec, checks)
    if val is not None:
        val = _checked_validation(val, dtype, rec)
    if image is not None:
        layers: Any = conv_layers(o.network, image, l)
        if type(o.network).__module__.startswith("torch"):
            params0 = tuple(params_from_torch(o.network, layers, dtype))
        else:
            params0 = tuple(init_conv_params(layers, seed=seed, dtype=dtype))
        rec = rec._replace(layers=layers)
    else:
        params0 = tuple(_weights(init, weights, rec))
        layers = layers_of_params(params0)
    path = src.path
    return Prepared(
        rec,
        params0,
        layers,
        layers.plan_shape,
        s,
        arrays,
        path,
        rows,
        val,
        classes,
        target_error,
        dtype,
        x if isinstance(x, LazySamples) else None,
    )


def _checked_arrays(
    src: _Source, rec: Recipe, checks: dict[str, Any]
) -> tuple[list[np.ndarray], tuple[Any, np.ndarray] | None]:
    """The initial weights (:func:`~dask_rpm.nn.data.check_training_args`) and the training
    arrays in the run's dtype (None for a dataset the workers read), the targets checked for
    the loss."""
    dtype, (s, n, l) = checks["dtype"], src.shape
    if src.x is None or src.d is None:
        return check_training_args(None, None, **checks, shape=(s, n, l)), None
    weights = check_training_args(src.x, src.d[:, :l], **checks)
    x = (
        sparse.as_csr(src.x, dtype)
        if sparse.issparse(src.x)
        else np.ascontiguousarray(src.x, dtype)
    )
    arrays = (x, np.ascontiguousarray(src.d, dtype=dtype))
    _check_targets(arrays[1][:, :l], "d", rec)
    return weights, arrays


def _check_targets(d: np.ndarray, where: str, rec: Recipe) -> None:
    """Targets the loss can take: distributions for cross-entropy, counts (>= 0) for Poisson."""
    if rec.net.loss == "cross-entropy":
        _check_distribution(d, where, rec.net.output)
    elif rec.net.loss == "poisson" and d.size and np.min(d) < 0:
        raise DataError(
            f"{where}: the Poisson loss needs targets >= 0 (counts or rates); the smallest is "
            f"{np.min(d)!r}"
        )


def sample_weights(sample_weight: Any, samples: int) -> np.ndarray:
    """``sample_weight`` as float64, checked: 1-D, one number per sample, finite, >= 0 and not
    all 0 (:class:`DataError` saying which)."""
    w = np.asarray(sample_weight)
    if w.ndim != 1 or w.shape[0] != samples or not np.issubdtype(w.dtype, np.number):
        raise DataError(
            f"sample_weight has shape {w.shape} ({w.dtype}); give one number per sample: "
            f"({samples},)"
        )
    w = w.astype(np.float64)
    if not np.isfinite(w).all() or (w < 0).any():
        raise DataError("sample_weight must be finite and >= 0")
    if not w.any():
        raise DataError("sample_weight is zero for every sample; at least one weight must be > 0")
    return w


def _with_weights(src: _Source, sample_weight: Any, cnn: bool) -> _Source:
    """``src`` with one weight per sample appended to its targets (:mod:`~dask_rpm.nn.network`),
    checked (:func:`sample_weights`). None: ``src`` as it is; Dask's data carry theirs already
    (:func:`~dask_rpm.engine.dask_data.on_cluster`)."""
    if sample_weight is None or (src.weights is not None and not cnn):
        return src
    if src.x is None or src.d is None or cnn:
        raise DataError(
            "sample_weight needs an MLP trained on arrays; with a dataset path or network= "
            "give every sample weight 1 (leave sample_weight out)"
        )
    w = sample_weights(sample_weight, src.shape[0])
    return src._replace(d=np.hstack([np.asarray(src.d, dtype=np.float64), w[:, None]]))


def _weights_of(src: _Source, dtype: str) -> np.ndarray | None:
    """The training samples' weights (the targets' last column) in ``dtype``, or None."""
    s, _, l = src.shape
    if src.weights is not None:
        return np.ascontiguousarray(src.weights, dtype=dtype)
    if src.d is None or src.d.shape[1] == l:
        return None
    return np.ascontiguousarray(src.d[:, -1], dtype=dtype)


def _images(x: Any, o: Any, given: Any) -> tuple[Any, Any, tuple[int, int, int]]:
    """A CNN's images ``(samples, channels, height, width)`` as rows, the options without what
    the network itself says (its weights, sizes, activations and biases), and the image shape.
    ``given`` are the options as the user gave them (before the ``rpm.train.*`` defaults)."""
    clash = [f for f in ("hidden", "init", "activation", "bias") if getattr(given, f) is not None]
    if clash:
        raise DataError(
            f"{' and '.join(clash)} given with network=; a network's layers give its sizes, "
            f"activations, biases and initial weights (a torch module's own, or seeded for layer "
            f"records): leave {' and '.join(clash)} out"
        )
    if isinstance(x, LazySamples):  # Dask's images: rows on the cluster, their shape here
        xa, shape, image = None, x.shape[:2], x.image
    else:
        xa = np.asarray(x)
        shape, image = xa.shape, None
        if xa.ndim == 4:
            image = (int(xa.shape[1]), int(xa.shape[2]), int(xa.shape[3]))
    if image is None:
        raise DataError(
            f"x has shape {shape}; a network with conv layers trains on images "
            f"(samples, channels, height, width): reshape it, e.g. x.reshape(-1, 1, 8, 8)"
        )
    val = o.validation
    if isinstance(val, (tuple, list)) and len(val) == 2 and np.ndim(val[0]) == 4:
        xv = np.asarray(val[0])
        if xv.shape[1:] != image:
            raise DataError(
                f"validation images of shape {xv.shape[1:]}; the training images are {image}"
            )
        val = (xv.reshape(xv.shape[0], -1), val[1])
    o = dataclasses.replace(o, bias=False, activation="relu", validation=val)
    return (x if xa is None else xa.reshape(xa.shape[0], -1)), o, image


class _Source(NamedTuple):
    """The training samples: loaded arrays (``x``, ``d``), or a dataset ``path`` workers read."""

    path: str | None
    x: np.ndarray | None
    d: np.ndarray | None
    classes: np.ndarray | None
    shape: tuple[int, int, int]  # (samples, inputs, outputs)
    weights: np.ndarray | None = None  # Dask's data: the training samples' weights
    held: tuple[Any, Any] | None = None  # Dask's data: the held-out validation rows


def _source(x: Any, d: Any, loss: str | None, classes: Any, load: bool) -> _Source:
    """Arrays with 2-D targets, or the path and shape of a dataset left for the workers."""
    if isinstance(x, LazySamples):  # on the cluster: checked there (dask_rpm.engine.dask_data)
        return _Source(None, None, None, x.classes, x.shape, x.weights, x.held)
    if isinstance(x, (str, os.PathLike)) and not load:
        path = os.path.abspath(os.fspath(x))
        shape = data_shape(path)
        if classes is None:  # labels written with the file (dask_rpm.nn.data.write_dataset)
            classes = dataset_classes(path)
        return _Source(path, None, None, classes, shape)
    if sparse.issparse(x):  # CSR rows from here on (dask_rpm.nn.sparse)
        if d is None:
            raise DataError("d is required when x is a sparse matrix")
        xa = sparse.as_csr(x, x.dtype if np.issubdtype(x.dtype, np.floating) else np.float64)
        da = np.asarray(d)
        if da.ndim not in (1, 2):
            raise DataError(f"d must be (samples, outputs) or 1-D labels; got shape {da.shape}")
    elif d is None or np.ndim(d) != 1:
        xa, da = as_arrays(x, d)
    else:
        xa, da = np.asarray(x), np.asarray(d)
    if xa.ndim != 2:
        raise DataError(f"x must be (samples, inputs); got shape {xa.shape}")
    da, classes = _targets(da, loss, classes)
    return _Source(None, xa, da, classes, (xa.shape[0], xa.shape[1], da.shape[1]))


def _split_validation(
    src: _Source, validation: Any, loss: str | None, seed: int, dtype: str
) -> tuple[_Source, np.ndarray | None, tuple[np.ndarray, np.ndarray] | None]:
    """Hold out a seeded fraction, or check a given ``(x_val, d_val)``.

    Returns the training source, the file rows that train (a dataset path with a held-out
    fraction; else None) and the validation pair (or None).
    """
    s, n, l = src.shape
    if validation is None:
        return src, None, None
    if src.held is not None:  # Dask's data: the fraction held out on the cluster
        return src, None, src.held
    if not isinstance(validation, (tuple, list)):
        try:
            train_idx, val_idx = holdout(
                s, float(validation) if not isinstance(validation, bool) else validation, seed
            )
        except DataError:
            raise  # holdout's RecipeError
        except (TypeError, ValueError) as exc:
            raise DataError(str(exc)) from None
        shape = (len(train_idx), n, l)
        if src.x is not None and src.d is not None:
            val = (src.x[val_idx], src.d[val_idx])
            return src._replace(x=src.x[train_idx], d=src.d[train_idx], shape=shape), None, val
        assert src.path is not None  # no arrays: the samples are in a dataset file
        val = load_rows(src.path, val_idx, dtype)
        return src._replace(shape=shape), train_idx, val
    if len(validation) != 2:
        raise DataError("validation must be a fraction or a pair (x_val, d_val)")
    xv = validation[0] if sparse.issparse(validation[0]) else np.asarray(validation[0])
    dv, _ = _targets(np.asarray(validation[1]), loss, src.classes)
    if (
        xv.ndim != 2
        or xv.shape[1] != n
        or dv.ndim != 2
        or dv.shape[1] != l
        or xv.shape[0] != dv.shape[0]
    ):
        raise DataError(
            f"validation data x{xv.shape}, d{dv.shape}; they must be (k, {n}) and (k, {l})"
        )
    if src.d is not None and src.d.shape[1] > l:  # weighted targets: the given samples weigh 1
        dv = np.hstack([dv, np.ones((dv.shape[0], 1))])
    return src, None, (xv, dv)


def _checked_validation(
    val: tuple[np.ndarray, np.ndarray], dtype: str, rec: Recipe
) -> tuple[np.ndarray, np.ndarray]:
    """The validation pair in the training dtype, finite, and the targets the loss takes."""
    x = val[0]
    xv = sparse.as_csr(x, dtype) if sparse.issparse(x) else np.ascontiguousarray(x, dtype=dtype)
    out = (xv, np.ascontiguousarray(val[1], dtype=dtype))
    for name, arr in zip(("x_val", "d_val"), out):
        finite = sparse.all_finite(arr) if sparse.issparse(arr) else np.all(np.isfinite(arr))
        if not finite:
            raise DataError(f"validation {name} contains NaN or infinite values")
    d = out[1][:, :-1] if rec.net.weighted else out[1]
    _check_targets(d, "validation d", rec)
    return out
