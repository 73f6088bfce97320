"""One name per idea (docs/architecture.md, "Vocabulary"): every choice tuple is defined
once, in zoo/config/choices.py; no ``locals()`` forwarding; ``from_preset`` is not
attached from outside a class; the mesh axis names are ``zoo.distribution.axes``'."""

import ast
import pathlib

from zoo.config import choices

ZOO = pathlib.Path(__file__).resolve().parents[2] / "zoo"
CHOICES = ZOO / "config" / "choices.py"


def _sources():
    return sorted(path for path in ZOO.rglob("*.py"))


def _string_tuples(tree):
    """``(line, {strings})`` of each literal tuple/list/set of two or more strings,
    assigned to a name or written inline (``if x not in ("gather", "ring", "ulysses")``)."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            strings = [
                item.value for item in node.elts if isinstance(item, ast.Constant) and isinstance(item.value, str)
            ]
            if len(strings) >= 2 and len(strings) == len(node.elts):
                yield f"line {node.lineno}", frozenset(strings)


def test_every_choice_tuple_is_defined_once():
    defined = {
        frozenset(c for c in value if c is not None): name
        for name, value in vars(choices).items()
        if isinstance(value, tuple)
    }
    copies = []
    for path in _sources():
        if path == CHOICES:
            continue
        for name, strings in _string_tuples(ast.parse(path.read_text())):
            if strings in defined:
                copies.append(f"{path.relative_to(ZOO.parent)}: {name} repeats zoo.config.choices.{defined[strings]}")
    assert not copies, "\n".join(copies)


def test_no_locals_forwarding_and_no_attached_from_preset():
    found = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "locals":
                found.append(f"{path.relative_to(ZOO.parent)}:{node.lineno} calls locals()")
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Attribute) and t.attr == "from_preset" for t in node.targets
            ):
                found.append(
                    f"{path.relative_to(ZOO.parent)}:{node.lineno} attaches from_preset to a class from outside"
                )
    assert not found, "\n".join(found)


def test_mesh_axis_names_come_from_axes():
    """Outside axes.py (and the kernels, which take axis names as arguments), code names
    a mesh axis by its constant, not by a string literal used as an axis."""
    literal_axes = []
    for path in _sources():
        if path.name == "axes.py" or "kernels" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            for keyword in getattr(node, "keywords", []):
                if keyword.arg in (
                    "axis_name",
                    "batch_dim_name",
                    "sequence_dim_name",
                    "model_axis",
                    "sequence_axis",
                    "batch_axis",
                ):
                    if isinstance(keyword.value, ast.Constant) and keyword.value.value in ("data", "model", "seq"):
                        literal_axes.append(
                            f"{path.relative_to(ZOO.parent)}:{node.lineno} {keyword.arg}={keyword.value.value!r}"
                        )
    assert not literal_axes, "\n".join(literal_axes)
