"""docs/architecture.md names real modules, in the layers the import-linter contract gives them."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEXT = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
LAYERS = ("commands", "drivers", "results", "decisions", "model", "leaves")


def _picture() -> dict[str, list[str]]:
    """Layer -> dotted module names, as the box picture of §1 draws them."""
    block = re.search(r"## 1\. The layers.*?```\n(.*?)\n```", TEXT, flags=re.S).group(1)
    out: dict[str, list[str]] = {}
    layer, package = None, None
    for line in block.splitlines():
        if m := re.match(r"\+-- (\w+):", line):
            layer, package = m.group(1), None
            out[layer] = []
        elif line.startswith("| ") and layer:
            words = line.strip("| ").split()
            if words and words[0].endswith("/"):
                package, words = words[0][:-1], words[1:]
                out[layer].append(package)
            elif not line.startswith("|  "):
                package = None
            out[layer] += [f"{package}.{w}" if package else w for w in words]
    return out


def _module_exists(name: str) -> bool:
    path = ROOT / "dask_rpm" / Path(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _contract() -> dict[str, list[str]]:
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contract = next(c for c in cfg["tool"]["importlinter"]["contracts"] if c["type"] == "layers")
    return {
        name: [m.strip().removeprefix("dask_rpm.") for m in spec.split(":")]
        for name, spec in zip(LAYERS, contract["layers"], strict=True)
    }


def test_picture_has_every_layer_and_only_real_modules():
    picture = _picture()
    assert tuple(picture) == LAYERS
    for layer, names in picture.items():
        assert names, f"layer {layer} is empty in the picture"
        for name in names:
            assert _module_exists(name), (
                f"docs/architecture.md names dask_rpm.{name} ({layer}): no such module"
            )


def test_picture_agrees_with_the_layers_contract():
    picture = _picture()
    where = {name: layer for layer, names in picture.items() for name in names}
    for layer, modules in _contract().items():
        for module in modules:
            assert where.get(module) == layer, (
                f"pyproject's layers contract puts dask_rpm.{module} in {layer}; "
                f"docs/architecture.md has it in {where.get(module)}"
            )
