"""Every name the README, the docs and the tutorials use works as written after ``import dask_rpm``.

A dotted name ``dask_rpm.a.b.c`` in the text must resolve as a chain of attributes from the
package alone (``getattr(getattr(getattr(dask_rpm, "a"), "b"), "c")``), the way a reader types
it: each package imports its submodules on first use (:mod:`dask_rpm._lazy`). Each name is
resolved in a process that has run ``import dask_rpm`` and nothing else (a fork of one fresh
interpreter per name), so a name resolved earlier cannot import the module a later one needs
and hide a missing lazy import. A path ``dask_rpm/....py`` must be a file.

Left out: docs/benchmarks-history.md and CHANGELOG.md (history: they name what was), and the
pages tools/docgen.py generates from the code, docs/api.md and docs/configuration.md
(tests/test_docgen.py keeps them equal to what the code generates now).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HISTORY = {"docs/benchmarks-history.md", "docs/CHANGELOG.md"}
GENERATED = {"docs/api.md", "docs/configuration.md"}

NAME = re.compile(r"(?<![\w.])dask_rpm(?:\.[A-Za-z_]\w*)+")
#: ``from dask_rpm.x import a, b as c`` (parenthesised over lines, too) in code: ``dask_rpm.x.a``, ...
FROM = re.compile(r"^[ \t>]*from\s+(dask_rpm(?:\.\w+)*)\s+import\s+(\([^)]*\)|[^\n#]+)", re.M)
PATH = re.compile(r"(?<![\w./-])dask_rpm/[\w./-]*\.py\b")

#: Runs in a fresh interpreter: reads the names (JSON) on stdin, prints {name: why} of those that
#: do not resolve. Each name is resolved in a fork taken right after ``import dask_rpm``.
RESOLVER = r"""
import inspect, json, os, sys

import dask_rpm


def resolve(name):
    parts = name.split(".")
    obj = dask_rpm
    for i, part in enumerate(parts[1:], start=2):
        try:
            obj = getattr(obj, part)
        except AttributeError as exc:
            # a dataclass or NamedTuple field without a default is no class attribute: the
            # class's annotations name it (and nothing can follow it)
            if isinstance(obj, type) and i == len(parts) and any(
                part in inspect.get_annotations(k) for k in obj.__mro__
            ):
                return ""
            return f"{'.'.join(parts[:i])}: {exc}"
        except Exception as exc:  # an import that fails is as wrong as a missing name
            return f"{'.'.join(parts[:i])}: {type(exc).__name__}: {exc}"
    return ""


names = json.load(sys.stdin)
failed, running = {}, {}


def reap():
    pid, _ = os.wait()
    name, fd = running.pop(pid)
    with os.fdopen(fd, "rb") as f:
        why = f.read().decode()
    if why:
        failed[name] = why


for name in names:
    if len(running) >= max(1, min(4, os.cpu_count() or 1)):
        reap()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: resolve, report, leave without running the parent's cleanup
        os.close(r)
        try:
            why = resolve(name)
        except BaseException as exc:
            why = f"{type(exc).__name__}: {exc}"
        os.write(w, why.encode()[:60000])  # one pipe buffer: never blocks
        os._exit(0)
    os.close(w)
    running[pid] = (name, r)
while running:
    reap()
print(json.dumps(failed))
"""


def _sources() -> dict[str, str]:
    """Relative path -> text of the README, the hand-written docs and the tutorials."""
    paths = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    paths += sorted((ROOT / "tutorials").glob("*.py"))
    out = {}
    for path in paths:
        rel = path.relative_to(ROOT).as_posix()
        if rel not in HISTORY | GENERATED:
            out[rel] = path.read_text(encoding="utf-8")
    return out


def _imported(text: str) -> set[str]:
    """The dotted names of the ``from dask_rpm... import ...`` statements in ``text``."""
    out = set()
    for module, what in FROM.findall(text):
        for item in what.strip("()").replace("\n", ",").split(","):
            name = item.split("#")[0].split(" as ")[0].strip()
            if name.isidentifier():
                out.add(f"{module}.{name}")
    return out


def _occurrences(pattern: re.Pattern[str]) -> dict[str, list[str]]:
    """Each match of ``pattern`` in the sources (with the names a ``from dask_rpm... import``
    brings in, for :data:`NAME`) -> the files that use it."""
    found: dict[str, list[str]] = {}
    for rel, text in _sources().items():
        matches = set(pattern.findall(text)) | (_imported(text) if pattern is NAME else set())
        for match in sorted(matches):
            found.setdefault(match, []).append(rel)
    return found


def _longest(names: list[str]) -> list[str]:
    """The names no other name extends: resolving ``a.b.c`` from the top resolves ``a.b`` too."""
    extended = {n.rsplit(".", i)[0] for n in names for i in range(1, n.count("."))}
    return sorted(set(names) - extended)


def test_the_sources_are_read():
    sources = _sources()
    assert "README.md" in sources and "docs/training.md" in sources
    assert any(rel.startswith("tutorials/") for rel in sources)
    assert not set(sources) & (HISTORY | GENERATED)
    assert _longest(["dask_rpm.nn", "dask_rpm.nn.data", "dask_rpm.nn.data.write_dataset"]) == [
        "dask_rpm.nn.data.write_dataset"
    ]
    code = "from dask_rpm.nn import (\n    data,  # datasets\n    kernels as k,\n)\nfrom dask_rpm import fit\n"
    assert _imported(code) == {"dask_rpm.nn.data", "dask_rpm.nn.kernels", "dask_rpm.fit"}


def test_every_documented_path_exists():
    missing = {
        path: files for path, files in _occurrences(PATH).items() if not (ROOT / path).is_file()
    }
    assert not missing, f"paths named in the docs that are no file (path: where): {missing}"


@pytest.mark.skipif(not hasattr(os, "fork"), reason="each name is resolved in a fork")
@pytest.mark.slow
def test_every_documented_name_resolves_after_import_dask_rpm():
    used = _occurrences(NAME)
    assert len(used) > 100, "the docs name fewer dask_rpm names than they do: is the pattern right?"
    proc = subprocess.run(
        [sys.executable, "-c", RESOLVER],
        input=json.dumps(_longest(list(used))),
        capture_output=True,
        text=True,
        cwd=ROOT,  # this checkout's dask_rpm
        timeout=540,
    )
    assert proc.returncode == 0, proc.stderr
    failed = json.loads(proc.stdout.splitlines()[-1])
    report = "\n".join(f"{name} ({', '.join(used[name])}): {why}" for name, why in failed.items())
    assert not failed, f"names in the docs that do not resolve after `import dask_rpm`:\n{report}"
