"""Sparse inputs: scipy's CSR / CSC matrices as the first layer's ``x``, kept sparse on numpy.

Pure (numpy; scipy only when the data are sparse, so dask_rpm needs no scipy otherwise). A
sparse ``x`` enters the kernels only in the first layer's two products (``x W_1^T`` forward,
``delta_1^T x`` backward, :mod:`dask_rpm.nn.kernels`), as in scikit-learn's
``safe_sparse_dot``; every other array stays dense. Samples travel as CSR rows: the serial
loop, the driver's column slices and a worker's copy of the training set
(:mod:`dask_rpm.engine.samples`) are CSR matrices, indexed by rows. A worker whose kernels run
on torch or cupy densifies its rows once per load (:func:`dense_on`): their products take
dense operands, and a GPU's dense product of a batch costs less than moving it as CSR.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .backend import Backend

__all__ = ["issparse", "as_csr", "augment", "take", "all_finite", "dense_on", "placed", "nbytes"]


def issparse(a: Any) -> bool:
    """Whether ``a`` is a scipy sparse matrix or array (without importing scipy)."""
    return type(a).__module__.startswith("scipy.sparse") and hasattr(a, "tocsr")


def as_csr(a: Any, dtype: Any) -> Any:
    """``a`` as a CSR matrix of ``dtype`` with sorted indices (a copy where anything changes)."""
    out = a.tocsr().astype(dtype, copy=False)
    if not out.has_sorted_indices:
        out = out.sorted_indices()
    return out


def augment(x: Any) -> Any:
    """``x`` (CSR) with a constant-1 last column: the bias input of
    :meth:`dask_rpm.nn.network.Network.augment`, stored sparse."""
    from scipy import sparse  # only for sparse data: scipy is not a dependency of dask_rpm

    ones = sparse.csr_matrix(np.ones((x.shape[0], 1), dtype=x.dtype))
    return sparse.hstack([x, ones], format="csr", dtype=x.dtype)


def take(x: Any, idx: Any) -> Any:
    """Rows ``idx`` of ``x`` in that order (CSR), as numpy's ``x[idx]``."""
    return x[np.asarray(idx)]


def all_finite(x: Any) -> bool:
    """Whether every stored value of ``x`` is finite (the implicit zeros are)."""
    return bool(np.isfinite(x.data).all())


def nbytes(x: Any) -> int:
    """Bytes ``x`` holds: a CSR matrix's stored values and indices, or an array's."""
    if issparse(x):
        return int(x.data.nbytes + x.indices.nbytes + x.indptr.nbytes)
    return int(x.nbytes)


def dense_on(x: Any, dtype: Any) -> np.ndarray:
    """``x`` as a dense C-contiguous array of ``dtype``: for a backend whose products take no
    sparse operand (module docstring)."""
    return np.ascontiguousarray(x.toarray(), dtype=dtype)


def placed(be: Backend, x: Any, dtype: Any = None) -> Any:
    """Samples ``x`` on backend ``be`` for the kernels: CSR stays CSR on numpy, and is densified
    for torch and cupy (module docstring); dense ``x`` is :meth:`Backend.asarray`'s."""
    if not issparse(x):
        return be.asarray(x, dtype)
    if be.name == "numpy":
        return as_csr(x, x.dtype if dtype is None else dtype)
    return be.asarray(dense_on(x, x.dtype if dtype is None else dtype))
