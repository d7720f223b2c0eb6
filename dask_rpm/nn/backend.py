"""Array backends: the array library and device a worker's kernels, weights and optimizer state
live on (numpy, torch or cupy; CPU or GPU).

Pure (no ``distributed``). The kernels (:mod:`~dask_rpm.nn.kernels`) and optimizers
(:mod:`~dask_rpm.nn.optim`) are written once, over the operations numpy, torch and cupy share
with an ``out=`` argument (``matmul``, ``exp``, ``tanh``, ``log``, ``negative``, ``reciprocal``,
``subtract``, ``multiply``, ``divide``, ``sqrt``, ``clip``) and in-place operators;
:func:`namespace` gives an array's own library for them. The few operations whose spelling
differs between the libraries (a row maximum, a dot product to a Python float, a copy from host
memory) are the functions of this module, which tell the libraries apart through
`array-api-compat <https://data-apis.org/array-api-compat/>`_ - the layer scikit-learn uses for
the same purpose - and never import torch or cupy unless a backend names them.

A :class:`Backend` is what a worker resolved (:func:`resolve`): where its arrays are allocated.
Everything that leaves a worker (messages, checkpoints, the gathered weights) goes through host
memory as numpy arrays (:func:`to_host`); everything that arrives is placed with
:meth:`Backend.asarray`. numpy on the CPU is the default, and its path is the operations it
always ran, bit for bit.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import array_api_compat as compat
import numpy as np

from .. import config
from .errors import DataError

__all__ = [
    "BACKENDS",
    "DEVICES",
    "Backend",
    "Placement",
    "BackendError",
    "NUMPY",
    "check_names",
    "resolve",
    "namespace",
    "is_array",
    "to_host",
    "host_copy",
    "copyto",
    "copy",
    "vdot",
    "row_max",
    "row_sum",
    "relu_",
    "positive_",
    "dtype_of",
    "eps_of",
    "errstate",
    "synchronize",
    "use_in_thread",
    "on_device",
]

#: Backend names: ``auto`` is torch on a worker with a GPU, numpy on one without.
BACKENDS = ("numpy", "torch", "cupy", "auto")
#: Device names: ``auto`` is the worker's GPU where it has one (and the backend runs there).
DEVICES = ("auto", "cpu", "cuda")

_EXTRA = {
    "torch": "pip install 'dask-rpm[torch]'",
    "cupy": "pip install cupy-cuda12x (or -cuda13x)",
}


class BackendError(DataError):
    """A backend or device that is not known, not installed, or not available here."""


@dataclass(frozen=True)
class Backend:
    """An array library (``numpy``, ``torch``, ``cupy``) and the device its arrays live on
    (``cpu``, ``cuda``)."""

    name: str = "numpy"
    device: str = "cpu"

    @property
    def ns(self) -> Any:
        """The library's module (what :func:`namespace` gives for its arrays)."""
        return np if self.name == "numpy" else importlib.import_module(self.name)

    @property
    def label(self) -> str:
        """``numpy``, ``torch-cpu``, ``torch-cuda``, ``cupy-cuda``: as reports name it."""
        return "numpy" if self.name == "numpy" else f"{self.name}-{self.device.split(':')[0]}"

    def _dtype(self, dtype: Any) -> Any:
        if self.name == "torch":
            return getattr(self.ns, np.dtype(dtype).name)
        return np.dtype(dtype)

    def empty(self, shape: tuple[int, ...], dtype: Any) -> Any:
        """An uninitialised array on this backend."""
        if self.name == "numpy":
            return np.empty(shape, dtype)
        if self.name == "torch":
            return self.ns.empty(shape, dtype=self._dtype(dtype), device=self.device)
        with self.ns.cuda.Device(_index(self.device)):
            return self.ns.empty(shape, dtype)

    def zeros(self, shape: tuple[int, ...], dtype: Any) -> Any:
        a = self.empty(shape, dtype)
        a[...] = 0
        return a

    def asarray(self, a: Any, dtype: Any = None) -> Any:
        """``a`` (a host numpy array, or one of this backend's) on this backend, C-contiguous:
        the same array where nothing needs changing, else a copy."""
        if self.name == "numpy":
            return np.ascontiguousarray(to_host(a), dtype=dtype)
        if not isinstance(a, np.ndarray) and namespace(a) is self.ns:
            # a tensor has no astype; to() and contiguous() give a itself where nothing changes
            if self.name == "torch":  # to() is ``a`` itself where device and dtype match
                kw = {} if dtype is None else {"dtype": self._dtype(dtype)}
                return a.to(device=self.device, **kw).contiguous()
            return a if dtype is None else a.astype(self._dtype(dtype))
        host = np.ascontiguousarray(a, dtype=dtype)
        if self.name == "torch":
            # a read-only buffer (a received message) is copied: torch tensors are writable
            t = self.ns.from_numpy(host if host.flags.writeable else host.copy())
            return t if self.device == "cpu" else t.to(self.device)
        with self.ns.cuda.Device(_index(self.device)):
            return self.ns.asarray(host)

    def copy_of(self, a: Any, dtype: Any = None) -> Any:
        """A C-contiguous copy of ``a`` on this backend (never ``a`` itself, nor its memory)."""
        out = self.asarray(a, dtype)
        # torch on the CPU wraps a host array's memory (from_numpy): a copy must not
        if out is a or (self.device == "cpu" and np.may_share_memory(to_host(out), to_host(a))):
            return copy(out)
        return out


NUMPY = Backend()


def _index(device: str) -> int:
    return int(device.split(":")[1]) if ":" in device else 0


def check_names(backend: Any, device: Any) -> tuple[str, str]:
    """``(backend, device)`` validated as names (nothing imported): what the driver checks before
    any worker resolves them (:func:`resolve`)."""
    b = str(backend).strip().lower() if isinstance(backend, str) else backend
    d = str(device).strip().lower() if isinstance(device, str) else device
    if b not in BACKENDS:
        raise BackendError(
            f"backend={backend!r} is not known; valid: {', '.join(BACKENDS)} (set it with "
            f"fit(backend=...) or rpm.engine.backend)"
        )
    if not isinstance(d, str) or not (d in DEVICES or (d.startswith("cuda:") and d[5:].isdigit())):
        raise BackendError(
            f"device={device!r} is not known; valid: {', '.join(DEVICES)} or cuda:<index> (set "
            f"it with fit(device=...) or rpm.engine.device)"
        )
    if b == "numpy" and d.startswith("cuda"):
        raise BackendError(
            f"device={device!r} with backend='numpy': numpy runs on the CPU; use backend='torch' "
            f"or 'cupy' for a GPU (or device='auto')"
        )
    if b == "cupy" and d == "cpu":
        raise BackendError(
            "device='cpu' with backend='cupy': cupy runs on a GPU; use backend='numpy' or "
            "'torch' for the CPU"
        )
    return b, d


def _library(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError:
        raise BackendError(
            f"backend={name!r} but {name} is not installed here; {_EXTRA[name]} "
            f"(or use backend='numpy')"
        ) from None


def torch() -> Any:
    """torch, imported only where a user's torch objects (a CNN given as a ``torch.nn`` module)
    or torch's kernels are asked for; a :class:`BackendError` saying how to install it where it
    is missing."""
    return _library("torch")


def _gpus(name: str) -> int:
    """GPUs ``name`` sees here (0 where it is not installed)."""
    try:
        lib = importlib.import_module(name)
    except ImportError:
        return 0
    try:
        if name == "torch":
            return int(lib.cuda.device_count()) if lib.cuda.is_available() else 0
        return int(lib.cuda.runtime.getDeviceCount())
    except Exception:  # a CUDA runtime without a device raises rather than counting 0
        return 0


class Placement(NamedTuple):
    """Where a run's kernels go, as names (``auto`` is resolved by each worker: :func:`resolve`)."""

    backend: str = "numpy"
    device: str = "auto"

    @classmethod
    def of(
        cls, backend: Any = None, device: Any = None, engine: Mapping[str, Any] | None = None
    ) -> Placement:
        """The names given (``None``: ``rpm.engine.backend`` / ``rpm.engine.device``, from
        ``engine``, the ``rpm.engine`` section a caller has read already, else read now), checked."""
        if backend is None or device is None:
            engine = config.section("engine") if engine is None else engine
            backend = engine["backend"] if backend is None else backend
            device = engine["device"] if device is None else device
        return cls(*check_names(backend, device))


def resolve(backend: Any = None, device: Any = None) -> Backend:
    """The :class:`Backend` this process trains with, for the names a user gave (``None``:
    ``rpm.engine.backend`` / ``rpm.engine.device``).

    ``device="auto"`` is the GPU where the backend sees one (a worker whose
    ``CUDA_VISIBLE_DEVICES`` hides every GPU sees none), else the CPU;
    ``backend="auto"`` is torch (else cupy) on a GPU; without one it is
    ``rpm.engine.cpu-backend``, read where this runs (numpy by default, which needs no extra
    install; a node type where torch's kernels are faster sets ``torch``:
    ``DASK_RPM__ENGINE__CPU_BACKEND=torch`` in its workers' environment, docs/benchmarks.md).
    """
    b, d = Placement.of(backend, device)
    if b == "auto":
        if d != "cpu":
            for name in ("torch", "cupy"):
                if _gpus(name):
                    return resolve(name, d)
            if d != "auto":
                raise BackendError(
                    f"device={device!r}: no GPU is visible here to torch or cupy; use "
                    f"device='auto' or 'cpu'"
                )
        cpu = config.get("engine.cpu-backend")
        if cpu not in ("numpy", "torch"):
            raise BackendError(
                f"rpm.engine.cpu-backend={cpu!r}; valid: numpy, torch (what backend='auto' uses "
                f"on a worker without a GPU)"
            )
        return resolve(cpu, "cpu")
    if b == "numpy":
        return NUMPY
    _library(b)
    if d == "cpu":
        return Backend(b, "cpu")
    n = _gpus(b)
    if d == "auto":
        if n:
            return Backend(b, "cuda")
        if b == "cupy":
            raise BackendError("backend='cupy' but no GPU is visible here; use 'numpy' or 'torch'")
        return Backend(b, "cpu")
    if _index(d) >= n:
        raise BackendError(
            f"device={device!r} but {b} sees {n} GPU(s) here; use device='auto' or 'cpu' "
            f"(or a worker with a GPU)"
        )
    return Backend(b, d if ":" in d else "cuda")


# ------------------------------------------------------------------ operations by array type
def is_array(a: Any) -> bool:
    """Whether ``a`` is an array of a backend (numpy, torch, cupy)."""
    return isinstance(a, np.ndarray) or compat.is_torch_array(a) or compat.is_cupy_array(a)


def namespace(a: Any) -> Any:
    """The library of array ``a``: ``numpy``, ``torch`` or ``cupy`` (for their shared ``out=``
    operations)."""
    if isinstance(a, np.ndarray):
        return np
    if compat.is_torch_array(a):
        return _library("torch")
    if compat.is_cupy_array(a):
        return _library("cupy")
    return np


def to_host(a: Any) -> np.ndarray:
    """``a`` in host memory as numpy: the array itself for numpy, a view of a CPU tensor's
    memory, a copy of a GPU array's (:func:`host_copy` always copies)."""
    if isinstance(a, np.ndarray):
        return a
    if compat.is_torch_array(a):
        return a.detach().cpu().numpy()
    if compat.is_cupy_array(a):
        return a.get()
    return np.asarray(a)


def host_copy(a: Any) -> np.ndarray:
    """A C-contiguous numpy copy of ``a`` in host memory (never ``a`` itself)."""
    return np.array(to_host(a), copy=True, order="C")


def copyto(dst: Any, src: Any) -> None:
    """``dst[...] = src`` for ``src`` on ``dst``'s backend or in host memory."""
    if isinstance(dst, np.ndarray):
        np.copyto(dst, src)
    elif compat.is_torch_array(dst):
        if isinstance(src, np.ndarray):
            src = _library("torch").from_numpy(src if src.flags.writeable else src.copy())
        dst.copy_(src)
    else:
        dst[...] = namespace(dst).asarray(src)


def copy(a: Any) -> Any:
    """A copy of ``a`` on its backend."""
    return a.clone() if compat.is_torch_array(a) else a.copy()


def vdot(a: Any, b: Any) -> float:
    """``sum(a * b)`` over all elements, as a Python float."""
    if isinstance(a, np.ndarray):
        return float(np.vdot(a, b))
    if compat.is_torch_array(a):
        return float(_library("torch").dot(a.reshape(-1), b.reshape(-1)))
    return float(namespace(a).vdot(a, b))


def row_max(a: Any) -> Any:
    """Each row's maximum, as a column (``keepdims``)."""
    return a.amax(dim=1, keepdim=True) if compat.is_torch_array(a) else a.max(axis=1, keepdims=True)


def row_sum(a: Any) -> Any:
    """Each row's sum, as a column (``keepdims``)."""
    return a.sum(dim=1, keepdim=True) if compat.is_torch_array(a) else a.sum(axis=1, keepdims=True)


def relu_(a: Any) -> Any:
    """``max(a, 0)`` in place."""
    if compat.is_torch_array(a):
        return a.clamp_(min=0.0)
    return namespace(a).maximum(a, 0.0, out=a)


def positive_(a: Any) -> Any:
    """``1.0`` where ``a > 0``, else ``0.0``, in place (the ReLU's derivative)."""
    if compat.is_torch_array(a):
        return _library("torch").greater(a, 0.0, out=a)
    return namespace(a).greater(a, 0.0, out=a, casting="unsafe")


def dtype_of(a: Any) -> np.dtype:
    """``a``'s dtype as numpy names it (``float64`` for a torch ``float64`` tensor too)."""
    return np.dtype(str(a.dtype).removeprefix("torch."))


def eps_of(a: Any) -> float:
    """Machine epsilon of ``a``'s floating dtype."""
    if compat.is_torch_array(a):
        return float(_library("torch").finfo(a.dtype).eps)
    return float(np.finfo(a.dtype).eps)


def errstate(a: Any) -> Any:
    """numpy's silence for an overflow that is part of the arithmetic (``exp`` of a large
    negative pre-activation in a sigmoid); torch and cupy warn about none."""
    if isinstance(a, np.ndarray):
        return np.errstate(over="ignore")
    return contextlib.nullcontext()


def synchronize(a: Any) -> None:
    """Wait for the GPU work queued on ``a``'s device (a no-op on the CPU): what a timing of GPU
    kernels needs before reading the clock."""
    if compat.is_torch_array(a) and a.is_cuda:
        _library("torch").cuda.synchronize(a.device)
    elif compat.is_cupy_array(a):
        _library("cupy").cuda.Device(a.device.id).synchronize()


def use_in_thread(be: Backend) -> None:
    """Make ``be``'s GPU current in the calling thread (a compute thread's first CUDA call
    otherwise finds no current context: torch then sets one and warns)."""
    if be.device != "cpu":
        if be.name == "torch":
            be.ns.cuda.set_device(_index(be.device))
        else:
            be.ns.cuda.Device(_index(be.device)).use()


@contextlib.contextmanager
def on_device(be: Backend) -> Iterator[None]:
    """Make ``be``'s GPU the current one for the work inside (cupy allocates on the current)."""
    if be.name == "cupy":
        with be.ns.cuda.Device(_index(be.device)):
            yield
    else:
        yield
