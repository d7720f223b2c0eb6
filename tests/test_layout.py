"""The layout rules of the package (issue 12), checked on the source tree.

* no module over ``MAX_MODULE_LINES`` lines unless its docstring says why ("longer because");
* no function body over ``MAX_FUNCTION_LINES`` lines (the docstring not counted);
* no private name (``_x``) imported from another of the package's modules;
* a package-internal import inside a function says why in a comment on its line or the line
  above (a heavy optional dependency, a subprocess entry point...), because hidden imports
  are how the import cycles this issue removed used to hide.

The import structure itself (layers, no cycles, the pure layer without ``distributed``) is
import-linter's job (``lint-imports``, contracts in ``pyproject.toml``, run by tests/run.sh).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "dask_rpm"
MODULES = sorted(PACKAGE.rglob("*.py"))
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80


def _name(path: Path) -> str:
    return str(path.relative_to(PACKAGE.parent))


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def _body_lines(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    body = fn.body
    has_doc = (
        isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
        and isinstance(body[0].value.value, str)
    )
    if has_doc and len(body) == 1:
        return 0
    first = body[1] if has_doc else body[0]
    start = min([first.lineno, *(d.lineno for d in getattr(first, "decorator_list", []))])
    return fn.end_lineno - start + 1  # type: ignore[operator]


def _internal_module(node: ast.ImportFrom, path: Path) -> str | None:
    """The package module an ``from ... import`` names, or None for a third-party one."""
    if node.level == 0:
        return node.module if (node.module or "").startswith("dask_rpm") else None
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    base = parts[: len(parts) - node.level]
    return ".".join(base + ([node.module] if node.module else []))


@pytest.mark.parametrize("path", MODULES, ids=_name)
def test_module_size(path: Path) -> None:
    lines = path.read_text().count("\n")
    doc = ast.get_docstring(_tree(path)) or ""
    assert lines <= MAX_MODULE_LINES or "longer because" in doc, (
        f"{_name(path)} has {lines} lines (> {MAX_MODULE_LINES}): split it along a seam, "
        f"or say in its docstring why it is longer because ..."
    )


@pytest.mark.parametrize("path", MODULES, ids=_name)
def test_function_size(path: Path) -> None:
    long = [
        f"{n.name} (line {n.lineno}): {_body_lines(n)} lines"
        for n in ast.walk(_tree(path))
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
        and _body_lines(n) > MAX_FUNCTION_LINES
    ]
    assert not long, f"{_name(path)}: function bodies over {MAX_FUNCTION_LINES} lines: {long}"


@pytest.mark.parametrize("path", MODULES, ids=_name)
def test_no_private_name_crosses_modules(path: Path) -> None:
    crossing = [
        f"line {n.lineno}: from {_internal_module(n, path)} import {a.name}"
        for n in ast.walk(_tree(path))
        if isinstance(n, ast.ImportFrom) and _internal_module(n, path)
        for a in n.names
        if a.name.startswith("_") and not a.name.startswith("__")
    ]
    assert not crossing, f"{_name(path)} imports private names of other modules: {crossing}"


@pytest.mark.parametrize("path", MODULES, ids=_name)
def test_imports_inside_functions_say_why(path: Path) -> None:
    source = path.read_text().splitlines()
    tree = _tree(path)
    type_checking = {
        id(sub)
        for n in ast.walk(tree)
        if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test)
        for sub in ast.walk(n)
    }
    silent = []
    for n in ast.walk(tree):
        if not isinstance(n, ast.ImportFrom) or n.col_offset == 0 or id(n) in type_checking:
            continue
        if _internal_module(n, path) is None:
            continue
        here, above = source[n.lineno - 1], source[n.lineno - 2] if n.lineno > 1 else ""
        if "#" not in here and not above.strip().startswith("#"):
            silent.append(f"line {n.lineno}: {here.strip()}")
    assert not silent, (
        f"{_name(path)} imports package modules inside functions without saying why "
        f"(move them to the top, or add a comment): {silent}"
    )


def test_the_checks_see_the_package() -> None:
    # the parametrised checks above would pass vacuously on an empty list
    assert len(MODULES) > 50 and PACKAGE.joinpath("planners", "registry.py") in MODULES
