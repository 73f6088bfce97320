"""Imports run one way: kernels -> distribution -> layers -> models -> data/training/cli."""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1] / "zoo"

# package -> zoo packages it must not import
FORBIDDEN = {
    "kernels": {"distribution", "layers", "models", "data", "training", "cli", "bench"},
    "distribution": {"layers", "models", "data", "training", "cli", "bench"},
    "layers": {"models", "data", "training", "cli", "bench"},
    "models": {"kernels", "data", "training", "cli", "bench", "presets"},
    "data": {"models", "layers", "training", "cli", "bench", "presets"},
    "presets": {"training", "cli", "bench"},
    "training": {"cli", "bench"},
}


def _zoo_imports(path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "zoo" and len(parts) > 1:
                yield parts[1], name
            elif parts[0] == "keras":
                yield "keras", name


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_import_direction(package):
    bad = []
    for path in (ROOT / package).rglob("*.py"):
        for target, name in _zoo_imports(path):
            if target in FORBIDDEN[package] or (package == "kernels" and target == "keras"):
                bad.append(f"{path.relative_to(ROOT.parent)} imports {name}")
    assert not bad, "\n".join(bad)
