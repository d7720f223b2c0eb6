"""Shipped configuration defaults, merged into ``dask.config`` under the ``rpm`` key.

Defaults live in ``rpm.yaml`` next to this module. They are merged with
:func:`dask.config.update_defaults`, so a user's own dask configuration
(files, environment variables such as ``DASK_RPM__DRPM__INTERVAL=10``, or
``dask.config.set``) always wins. Nothing is written into the user's home.
"""

from __future__ import annotations

import os
from typing import Any

import dask.config
import yaml

_FN = os.path.join(os.path.dirname(__file__), "rpm.yaml")

with open(_FN) as _f:
    #: The shipped defaults (``rpm.yaml``) as a nested dict under ``"rpm"``;
    #: read-only (the job loader checks ``config:`` keys against it).
    DEFAULTS: dict[str, Any] = yaml.safe_load(_f)

dask.config.update_defaults(DEFAULTS)


def get(key: str, value: Any = None) -> Any:
    """Return ``value`` unless it is ``None``, else ``rpm.<key>`` from dask config.

    Keyword defaults in the public API are ``None`` and resolved here at call
    time, so configuration changes made after import take effect.
    """
    if value is not None:
        return value
    return dask.config.get(f"rpm.{key}")


def section(name: str, **overrides: Any) -> dict[str, Any]:
    """``rpm.<name>`` read once, as a new dict with ``-`` in keys written ``_`` (also in nested
    sections); the ``overrides`` that are not ``None`` replace their keys.

    What a settings record (e.g. :class:`dask_rpm.drpm.settings.DRPMSettings`) is built from at a
    public entry point, so one call sees one consistent configuration
    (``receive-timeout`` -> ``receive_timeout``).
    """
    out = _underscored(dask.config.get(f"rpm.{name}"))
    out.update({k: v for k, v in overrides.items() if v is not None})
    return out


def _underscored(d: dict[str, Any]) -> dict[str, Any]:
    return {
        str(k).replace("-", "_"): _underscored(v) if isinstance(v, dict) else v
        for k, v in d.items()
    }
