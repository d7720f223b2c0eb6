"""A package's attributes imported on first use (PEP 562): its submodules, and names it lists.

``import dask_rpm`` imports no subpackage, yet ``dask_rpm.nn.data.write_dataset`` works as
written: each package's ``__getattr__`` imports the submodule asked for. A package sets it up
with one line::

    if not TYPE_CHECKING:  # type checkers see the real imports, not a catch-all
        __getattr__, __dir__ = lazy_attributes(__name__, __path__)

Standard library only (a leaf): every layer may use it, the pure one included.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from collections.abc import Callable, Iterable, Mapping

__all__ = ["lazy_attributes"]


def lazy_attributes(
    package: str, path: Iterable[str], names: Mapping[str, str] | None = None
) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package`` (its ``__name__`` and ``__path__``).

    Parameters
    ----------
    package : str
        The package's ``__name__``.
    path : iterable of str
        The package's ``__path__``: where its submodules are.
    names : mapping of str to str, optional
        Public names the package defines elsewhere, each mapped to the submodule (relative to
        ``package``) that defines it: imported when first asked for, e.g. to keep
        ``distributed`` out until a name needs it.

    Returns
    -------
    (__getattr__, __dir__)
        ``__getattr__(name)`` returns ``names[name]``'s attribute ``name``, or imports the
        submodule ``package.name`` where ``path`` holds one; any other name raises
        ``AttributeError``, as for any module. ``__dir__`` adds both to the module's globals.
    """
    folders = list(path)
    listed = dict(names or {})
    found: list[frozenset[str]] = []  # the submodules, listed on the first miss only

    def submodules() -> frozenset[str]:
        if not found:
            found.append(frozenset(m.name for m in pkgutil.iter_modules(folders)))
        return found[0]

    def __getattr__(name: str) -> object:
        if name in listed:
            value = getattr(importlib.import_module(f".{listed[name]}", package), name)
            setattr(sys.modules[package], name, value)  # later lookups skip __getattr__
            return value
        if name in submodules():
            return importlib.import_module(f"{package}.{name}")  # the import binds it on package
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *listed, *submodules()})

    return __getattr__, __dir__
