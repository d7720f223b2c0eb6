"""Process-level leaves: BLAS threads, GPU visibility, hooks and closing of resources.

Pure: nothing here imports ``distributed``; the engine, the probe and the clusters use them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_attributes

if not TYPE_CHECKING:  # type checkers resolve submodules themselves; a catch-all hides typos
    __getattr__, __dir__ = lazy_attributes(__name__, __path__)  # submodules on first use
