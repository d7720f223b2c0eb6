"""The README's Python examples, saved as files and run as a new user would: they must end well and
print no traceback (a local cluster starts worker processes: a script without the ``__main__``
guard fails with spawn errors)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BLOCKS = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)


def test_the_readme_has_its_python_examples():
    assert len(BLOCKS) >= 2 and any("MLPClassifier" in b for b in BLOCKS)


@pytest.mark.parametrize("k", range(len(BLOCKS)))
@pytest.mark.slow
def test_a_readme_example_runs_as_a_script(k, tmp_path):
    if "MLPClassifier" in BLOCKS[k]:
        pytest.importorskip("sklearn")
    script = tmp_path / "example.py"
    script.write_text(BLOCKS[k])
    p = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert "Traceback" not in p.stderr, p.stderr[-3000:]
    if "save(" in BLOCKS[k]:
        assert (tmp_path / "digits.model.nc").exists()
