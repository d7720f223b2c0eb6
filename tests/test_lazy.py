"""dask_rpm._lazy: a package's submodules and listed names, imported on first attribute access.

Fresh interpreters (the import state is the point), and a real package written to a temporary
directory for the helper on its own.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(code: str, cwd: Path = ROOT) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_a_dotted_name_of_the_pure_layer_resolves_without_distributed():
    out = _run(
        """
        import sys
        import dask_rpm

        assert "dask_rpm.nn.data" not in sys.modules  # nothing imported before it is asked for
        f = dask_rpm.nn.data.write_dataset
        plan = dask_rpm.plan.partition.Plan
        decide = dask_rpm.drpm.policy.decide
        print(f.__module__, plan.__module__, decide.__module__, "distributed" in sys.modules)
        """
    )
    assert out == "dask_rpm.nn.data dask_rpm.plan.partition dask_rpm.drpm.policy False"


def test_an_unknown_name_is_an_attribute_error_and_dir_lists_the_submodules():
    out = _run(
        """
        import dask_rpm.nn

        try:
            dask_rpm.nn.nope
        except AttributeError as exc:
            print(exc)
        print(hasattr(dask_rpm.nn, "data"), {"data", "kernels", "serial"} <= set(dir(dask_rpm.nn)))
        """
    )
    assert out.splitlines() == ["module 'dask_rpm.nn' has no attribute 'nope'", "True True"]


def test_a_package_of_its_own_gets_its_submodules_and_listed_names(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "from dask_rpm._lazy import lazy_attributes\n"
        "__getattr__, __dir__ = lazy_attributes(__name__, __path__, {'answer': 'deep'})\n"
    )
    (pkg / "deep.py").write_text("answer = 42\n")
    (pkg / "other.py").write_text("value = 'other'\n")
    out = _run(
        f"""
        import sys
        sys.path[:0] = [{str(tmp_path)!r}, {str(ROOT)!r}]
        import pkg

        assert "pkg.deep" not in sys.modules and "pkg.other" not in sys.modules
        print(pkg.answer, "answer" in vars(pkg), "pkg.deep" in sys.modules)  # cached on the package
        print(pkg.other.value, sorted(n for n in dir(pkg) if not n.startswith("_")))
        try:
            pkg.missing
        except AttributeError as exc:
            print(exc)
        """,
        cwd=tmp_path,
    )
    assert out.splitlines() == [
        "42 True True",
        "other ['answer', 'deep', 'lazy_attributes', 'other']",
        "module 'pkg' has no attribute 'missing'",
    ]
