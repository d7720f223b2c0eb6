"""A trained network (``MLPModel``, ``CNNModel``) and its model file."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_attributes

if not TYPE_CHECKING:  # type checkers resolve submodules themselves; a catch-all hides typos
    __getattr__, __dir__ = lazy_attributes(__name__, __path__)  # submodules on first use
