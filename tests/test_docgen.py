"""docs/configuration.md and docs/api.md are generated and current (tools/docgen.py)."""

from __future__ import annotations

import inspect
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

import dask_rpm

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))  # a repository tool, not part of the package

import docgen  # noqa: E402


def _leaves(d, prefix=""):
    for k, v in d.items():
        path = f"{prefix}.{k}" if prefix else k
        if isinstance(v, dict):
            yield from _leaves(v, path)
        else:
            yield path


def test_committed_pages_are_current():
    bad = docgen.stale(str(ROOT))
    assert not bad, (
        f"{bad} differ from the generated text: run `python tools/docgen.py` and commit the result"
    )


def test_configuration_page_lists_every_key_with_its_comment():
    text = docgen.config_markdown()
    data = yaml.safe_load((ROOT / "dask_rpm" / "rpm.yaml").read_text())
    for key in _leaves(data):
        assert f"| `{key}` |" in text, key
    assert (
        '| `rpm.drpm.interval` | `20` | R: iterations between checks, or "auto" | `DASK_RPM__DRPM__INTERVAL` |'
        in text
    )
    assert (
        "| `rpm.cost.latency` | `50.0e-6` | seconds per message" in text
    )  # the literal from the file
    assert "### rpm.slurm.groups" in text and "```yaml\ngroups:\n  - name: fast" in text


def test_comment_parser_on_a_small_file(tmp_path):
    p = tmp_path / "x.yaml"
    p.write_text(
        "rpm:\n"
        "  a:\n"
        "    k: 1   # one | two\n"
        "    # about the list\n"
        "    # Example:\n"
        "    # l: [1]\n"
        "    l: []\n"
        '    s: "a b"\n'
    )
    text = docgen.config_markdown(str(p))
    assert "| `rpm.a.k` | `1` | one \\| two | `DASK_RPM__A__K` |" in text
    assert "| `rpm.a.l` | `[]` | (see [below](#rpmal)) |" in text
    assert "### rpm.a.l\n\nabout the list Example:\n\n```yaml\nl: [1]\n```" in text
    assert '| `rpm.a.s` | `"a b"` |  |' in text


def test_api_page_documents_every_public_function_and_class():
    text = docgen.api_markdown()
    for name in dask_rpm.__all__:
        obj = getattr(dask_rpm, name)
        if inspect.isfunction(obj) or inspect.isclass(obj):
            assert f"`dask_rpm.{name}(" in text, name
    assert "`dask_rpm.probe.probe(client: Any = None, *, shape: Sequence[int], samples: int" in text
    assert "`dask_rpm.FitResult.plot(self, path: Any = None, **kwargs: Any) -> Any`" in text
    # numpydoc turned into Markdown: no setext underlines, parameters as list items
    assert "\n----------\n" not in text and "**Parameters**" in text and "- `progress` : *" in text


def test_check_reports_a_stale_page_and_write_fixes_it(tmp_path):
    (tmp_path / "docs").mkdir()
    for rel in docgen.OUTPUTS:
        shutil.copy(ROOT / rel, tmp_path / rel)
    (tmp_path / "docs" / "api.md").write_text("old\n")
    p = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "docgen.py"), "--check", "--root", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert (
        p.returncode == 1 and "docs/api.md is stale" in p.stderr and "configuration" not in p.stderr
    )
    p = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "docgen.py"), "--root", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert p.returncode == 0 and docgen.stale(str(tmp_path)) == []
    assert sorted(f.name for f in (tmp_path / "docs").iterdir()) == ["api.md", "configuration.md"]


def test_concepts_page_and_its_picture(tmp_path):
    import numpy as np
    from PIL import Image

    page = (ROOT / "docs" / "concepts.md").read_text()
    assert "![Three plans of the same five workers](img/concepts.png)" in page
    assert (ROOT / "docs" / "img" / "concepts.png").is_file()
    out = tmp_path / "concepts.png"
    p = subprocess.run(
        [sys.executable, str(ROOT / "docs" / "make_figures.py"), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    img = np.asarray(Image.open(out).convert("RGB"), dtype=float)
    assert (
        img.shape[1] > 2 * img.shape[0] > 400 and img.std() > 20
    )  # three panels side by side, not blank
    for rel in (
        "planner.md",
        "drpm.md",
        "configuration.md",
        "api.md",
        "../tutorials/01_planning.py",
    ):
        assert f"]({rel}" in page, rel
