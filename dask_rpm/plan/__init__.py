"""Plans: the rectangles of one iteration (``Plan``), their real-valued layout and their dataset form.

Pure (numpy only): the planners build these records, the engine and the results read them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_attributes

if not TYPE_CHECKING:  # type checkers resolve submodules themselves; a catch-all hides typos
    __getattr__, __dir__ = lazy_attributes(__name__, __path__)  # submodules on first use
