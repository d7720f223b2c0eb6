"""The package's public namespace: every name resolves, and the pure layer stays light.

``dask_rpm/__init__`` imports its names on first use, so importing the planner, the cost model
or the kernels must not drag in ``distributed`` (the issue-12 contract, also enforced by
import-linter); these run in a fresh interpreter because this test process already has it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import dask_rpm

PURE = [
    "dask_rpm.planners",
    "dask_rpm.plan.partition",
    "dask_rpm.cost",
    "dask_rpm.nn.kernels",
    "dask_rpm.drpm.policy",
    "dask_rpm.drpm.estimator",
    "dask_rpm.drpm.remap",
    "dask_rpm.nn.serial",
    "dask_rpm.records",
]


def _fresh(code: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )


@pytest.mark.parametrize("module", PURE)
def test_pure_layer_does_not_import_distributed(module: str) -> None:
    out = _fresh(f"import sys, {module}; print('distributed' in sys.modules)")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False", f"{module} imports distributed"


def test_import_dask_rpm_is_light() -> None:
    out = _fresh(
        "import sys, dask_rpm; print(sorted(m for m in ('distributed', 'sklearn', 'torch', 'bokeh') if m in sys.modules))"
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("name", [n for n in dask_rpm.__all__ if n != "__version__"])
def test_every_public_name_resolves(name: str) -> None:
    if name in ("MLPClassifier", "MLPRegressor"):
        pytest.importorskip("sklearn")
    assert getattr(dask_rpm, name) is not None
    assert name in dir(dask_rpm)


def test_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        dask_rpm.nope  # noqa: B018


def test_all_lists_exactly_the_lazy_names() -> None:
    # the subpackages are reachable as attributes but not star-imported (that would load them all)
    lazy = set(dask_rpm._LAZY) | {"__version__"}
    assert sorted(dask_rpm.__all__) == sorted(lazy)


def test_every_subpackage_is_an_attribute_and_a_folder() -> None:
    folders = {p.parent.name for p in Path(dask_rpm.__file__).parent.glob("*/__init__.py")}
    assert folders <= set(dir(dask_rpm))
    for name in sorted(folders):
        assert getattr(dask_rpm, name).__name__ == f"dask_rpm.{name}"
