"""Imports run one way: config -> kernels -> distribution -> layers -> models -> data/training -> planning -> cli/bench;
config -> tokenizers -> models, data (the tokenizers are a side branch that needs none of the parallel code);
models -> measure (hardware table, HLO parser, compiled steps, FLOPs) -> training, planning, bench, cli;
zoo/units.py (byte units) and zoo/file_kinds.py (regular files, write targets) under everything."""

import ast
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1] / "zoo"

# package -> zoo packages it must not import
FORBIDDEN = {
    # the vocabulary and the settings schema: pure Python, imported before JAX by the zoo command
    "config": {
        "kernels",
        "distribution",
        "layers",
        "models",
        "presets",
        "data",
        "training",
        "planning",
        "cli",
        "bench",
        "plotting",
        "tokenizers",
        "measure",
    },
    "kernels": {
        "measure",
        "distribution",
        "layers",
        "models",
        "data",
        "training",
        "planning",
        "cli",
        "bench",
        "tokenizers",
    },
    "distribution": {"measure", "layers", "models", "data", "training", "planning", "cli", "bench", "tokenizers"},
    "layers": {"measure", "models", "data", "training", "planning", "cli", "bench", "tokenizers"},
    # text <-> ids (keras, numpy, the `tokenizers` library): models and data import it; it imports
    # no zoo package but zoo.config (every other package, present or future)
    "tokenizers": {path.parent.name for path in ROOT.glob("*/__init__.py")} - {"config", "tokenizers"},
    "models": {"measure", "kernels", "data", "training", "planning", "cli", "bench"},
    "data": {"models", "layers", "training", "planning", "cli", "bench", "presets"},
    # presets (the file format, reading and writing) sits below models: ZooModel.from_preset imports it
    "presets": {"measure", "models", "layers", "data", "training", "planning", "cli", "bench"},
    "training": {"planning", "cli", "bench", "plotting"},
    # charts of a run's files and of benchmark tables (matplotlib): above training, read by cli and bench
    "plotting": {"planning", "cli", "bench"},
    "planning": {"cli", "bench"},  # compiles the training jobs' steps: above training, below the entry points
    # measurement (hardware table, HLO parser, compiled steps, FLOPs) that training, planning,
    # the benchmarks and zoo comms read: above the models, below the jobs
    "measure": {"data", "training", "planning", "cli", "bench", "plotting"},
}


def _zoo_imports(path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module == "zoo" and node.level == 0:
            names = [
                f"zoo.{alias.name}" for alias in node.names if _is_zoo_module(alias.name)
            ]  # from zoo import kernels
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


def _is_zoo_module(name):
    """Whether ``zoo.<name>`` is a subpackage or module (not a name the package root defines)."""
    return (ROOT / name / "__init__.py").exists() or (ROOT / f"{name}.py").exists()


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_import_direction(package):
    bad = []
    for path in (ROOT / package).rglob("*.py"):
        for target, name in _zoo_imports(path):
            if target in FORBIDDEN[package] or (package in ("kernels", "config") and target == "keras"):
                bad.append(f"{path.relative_to(ROOT.parent)} imports {name}")
    assert not bad, "\n".join(bad)


def test_units_import_nothing():
    """zoo/units.py (KIB, MIB, GIB, format_bytes) is the bottom of the import graph: any
    package, zoo.config and zoo.kernels included, may import it, so it imports nothing."""
    tree = ast.parse((ROOT / "units.py").read_text())
    assert not [node.lineno for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]


# --- the package root is imported by the entry points only (DESIGN.md, convention 14) ---

# The root (zoo/__init__.py) imports every part of the zoo, so a module below the command
# line that imports it (``import zoo``, ``from zoo import __version__``) sits above
# everything; ``from zoo import kernels`` names a subpackage and is ``zoo.kernels`` above.
ROOT_IMPORTERS = ("cli/", "__init__.py", "__main__.py")  # relative to zoo/; cli/ and below


def _root_imports(path):
    """``import zoo`` and ``from zoo import <a name the root defines>`` in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = ["import zoo" for alias in node.names if alias.name == "zoo"]
        elif isinstance(node, ast.ImportFrom) and node.module == "zoo" and node.level == 0:
            names = [f"from zoo import {alias.name}" for alias in node.names if not _is_zoo_module(alias.name)]
        else:
            continue
        found += [f"{path.relative_to(ROOT.parent)}:{node.lineno}: {name}" for name in names]
    return found


def _below_the_entry_points():
    for path in sorted(ROOT.rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        if not (relative.startswith(ROOT_IMPORTERS[0]) or relative in ROOT_IMPORTERS[1:]):
            yield relative, path


def test_no_module_below_the_entry_points_imports_the_package_root():
    bad = [found for relative, path in _below_the_entry_points() for found in _root_imports(path)]
    assert not bad, "import zoo._version (or the zoo.<part> meant), not the package root:\n" + "\n".join(bad)


def test_version_is_single_sourced():
    """pyproject.toml's static version is zoo/_version.py's (zoo.__version__ re-exports it)."""
    import tomllib

    import zoo
    from zoo import _version

    project = tomllib.loads((ROOT.parent / "pyproject.toml").read_text())["project"]
    assert "version" not in project.get("dynamic", ()), (
        "pyproject reads the version dynamically: point it at zoo._version"
    )
    assert project["version"] == _version.__version__
    assert zoo.__version__ is _version.__version__


# --- private APIs of other libraries live only in zoo/_compat.py (DESIGN.md, convention 12) ---

COMPAT = ROOT / "_compat.py"

# Text that names a private API (comments and strings included), outside zoo/_compat.py.
PRIVATE_TEXT = {
    r"\bkeras\.src\b": "Keras' private package keras.src",
    r"\bjax\._src\b": "JAX's private package jax._src",
    r"\b_track_variable\b": "Keras' Layer._track_variable",
    r"\b_flatten_layers\b": "Keras' Layer._flatten_layers",
    r"\b_convert_to_tensor\b": "Keras' Variable._convert_to_tensor",
    r"\b_cluster_types\b": "JAX's ClusterEnv._cluster_types",
    r"\bbackends_are_initialized\b": "JAX's xla_bridge.backends_are_initialized",
    r"\binitialize_rng\b": "Keras' distribution_lib.initialize_rng",
    r"\bglobal_state\b": "Keras' / JAX's private global_state",
    r"\b_option_string_actions\b": "argparse's ArgumentParser._option_string_actions",
    r"\._kernel\b|[\"']_kernel[\"']": "Keras' Dense._kernel",
    r"\._layout\b|[\"']_layout[\"']": "Keras' Variable._layout",
    r"(?<!self)\._layout_map\b|[\"']_layout_map[\"']": "Keras' ModelParallel._layout_map (read from outside the distribution)",
}

# ``obj._name`` on an object that is not ``self``/``cls``: allowed only for the zoo's own classes.
ZOO_PRIVATE_ATTRIBUTES = {
    ("training/recipes/__init__.py", "_job_config"),  # zoo.training.recipes.Recipe's own method
    ("training/recipes/_jobs.py", "_distribution"),  # zoo.training.finetune's own resolver
}


def _zoo_sources():
    return sorted(path for path in ROOT.rglob("*.py") if path != COMPAT)


def _private_text(path):
    found = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        for pattern, what in PRIVATE_TEXT.items():
            if re.search(pattern, line):
                found.append(f"{path.relative_to(ROOT.parent)}:{number}: {what}: {line.strip()}")
    return found


def _is_private(name):
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _private_attributes(path):
    """``x._name`` (x not self/cls) and ``getattr/setattr/hasattr/delattr(x, "_name")``."""
    relative = path.relative_to(ROOT).as_posix()
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        name = None
        if isinstance(node, ast.Attribute) and _is_private(node.attr):
            if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                name = node.attr
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "setattr", "hasattr", "delattr")
        ):
            if len(node.args) > 1 and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
                name = node.args[1].value if _is_private(node.args[1].value) else None
        if name is not None and (relative, name) not in ZOO_PRIVATE_ATTRIBUTES:
            found.append(f"{path.relative_to(ROOT.parent)}:{node.lineno}: private attribute {name!r} of another object")
    return found


def test_private_apis_only_in_compat():
    bad = [problem for path in _zoo_sources() for problem in _private_text(path) + _private_attributes(path)]
    assert not bad, (
        "private APIs belong in zoo/_compat.py (with the versions checked and the public replacement):\n"
        + "\n".join(bad)
    )


def test_compat_imports_nothing_heavy_at_module_level():
    """zoo/_compat.py is the bottom of the import graph: any package (zoo.kernels too, which
    must not import Keras) may import it, so it imports no zoo module and, at module
    level, neither Keras nor a private module (those are imported where they are used)."""
    tree = ast.parse(COMPAT.read_text())
    top = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
    names = [alias.name for node in top if isinstance(node, ast.Import) for alias in node.names]
    names += [node.module or "" for node in top if isinstance(node, ast.ImportFrom)]
    assert not [n for n in names if n.split(".")[0] in ("zoo", "keras", "jax")], names
    everywhere = [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]
    assert not [
        node.module for node in everywhere if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("zoo")
    ]


# --- a package's private modules and names are its own (DESIGN.md, conventions 1 and 14) ---

# zoo/_version.py, zoo/_compat.py and zoo/_backend.py sit below every package: any module may import them.
SHARED_PRIVATE_MODULES = ("_version", "_compat", "_backend")


def _imported_names(node, package):
    """The dotted names under ``zoo`` (without the ``zoo.``) that ``node`` imports; a
    ``from`` import gives module + name (``from zoo.layers import _x`` -> ``layers._x``).
    ``package``: the importing module's package (parts under zoo/), for relative imports."""
    if isinstance(node, ast.Import):
        return [alias.name.split(".")[1:] for alias in node.names if alias.name.split(".")[0] == "zoo"]
    if not isinstance(node, ast.ImportFrom):
        return []
    if node.level:  # from .x import y, inside zoo/<package>/
        base = list(package[: len(package) - node.level + 1]) + (node.module.split(".") if node.module else [])
    elif (node.module or "").split(".")[0] == "zoo":
        base = node.module.split(".")[1:]
    else:
        return []
    return [base + [alias.name] for alias in node.names]


def _owner(parts):
    """The package (parts under zoo/) that the first private part of ``zoo.<parts>``
    belongs to: a private module to the package holding it, a private name of a module
    to that module's package; None when nothing in it is private (or it is shared)."""
    for index, part in enumerate(parts):
        if _is_private(part):
            if index == 0 and part in SHARED_PRIVATE_MODULES:
                return None
            container = tuple(parts[:index])
            if container and not (ROOT.joinpath(*container) / "__init__.py").exists():
                container = container[:-1]  # zoo.<package>.<module>._name: the module's package
            return container
    return None


def _private_imports(relative, source):
    """``file:line: ...`` for each import in ``source`` (the file zoo/``relative``) of a
    private module or name that belongs to a package the file is not in."""
    package = tuple(pathlib.PurePosixPath(relative).parent.parts)
    found = []
    for node in sorted(ast.walk(ast.parse(source)), key=lambda node: getattr(node, "lineno", 0)):
        for parts in _imported_names(node, package):
            owner = _owner(parts)
            if owner is None or (owner and package[: len(owner)] == owner) or (not owner and not package):
                continue
            where = "zoo." + ".".join(owner) if owner else "the package root zoo"
            found.append(f"zoo/{relative}:{node.lineno}: imports zoo.{'.'.join(parts)}, private to {where}")
    return found


def _every_source(check, skip=()):
    """``check(path relative to zoo/, source)``'s findings over every zoo module but ``skip``."""
    sources = {path.relative_to(ROOT).as_posix(): path for path in sorted(ROOT.rglob("*.py"))}
    return [
        found
        for relative, path in sources.items()
        if relative not in skip
        for found in check(relative, path.read_text())
    ]


def test_no_module_imports_another_packages_private_module_or_name():
    bad = _every_source(_private_imports)
    assert not bad, (
        "import the public name (the package's __init__ or a public module exports it), or move the code "
        "to the package that uses it:\n" + "\n".join(bad)
    )


def test_the_private_import_rule_tells_own_from_other():
    """The rule above flags each form of a foreign private import and passes a package's own."""
    foreign = (
        "from zoo.training._lora import enable_lora\n"
        "from zoo.layers import _sequence_parallel\n"
        "from zoo.models.gpt.hf_checkpoints import _helper\n"
        "import zoo.presets._safety\n"
        "from zoo._private_root import x\n"
    )
    assert [line.split(":")[1] for line in _private_imports("planning/plan.py", foreign)] == ["1", "2", "3", "4", "5"]
    own = (
        "from zoo._version import __version__\n"
        "from zoo._compat import sublayers\n"
        "from zoo.planning._activations import activation_bytes\n"
        "from zoo.planning import _activations\n"
        "from zoo.training.recipes import compile_job_step\n"
    )
    assert _private_imports("planning/plan.py", own) == []
    assert _private_imports("models/encoder/x.py", "from zoo.models._classifier_layouts import head_rules\n") == []
    assert _private_imports("kernels/pipeline.py", "from zoo.kernels.collective_matmul import _varying_axes\n") == []


# --- jax.shard_map runs in the one bridge (DESIGN.md, conventions 11 and 12) ---

# layers/_parallel_plan.py holds the one cached shard_map path (run_sharded for the layers,
# run_manual_over for the pipeline, manual over stage and the batch axis only, run_on_mesh for
# the benchmarks' kernel runs); zoo/_compat.py is where a version shim of it would live.
SHARD_MAP_HOMES = ("layers/_parallel_plan.py", "_compat.py")


def _shard_map_uses(relative, source):
    """``file:line: ...`` for each ``jax.shard_map`` (or ``jax.experimental.shard_map``)
    named in ``source``: an attribute, or an import of the name."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr == "shard_map":
            found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.ImportFrom) and any(
            "shard_map" in [alias.name, *(node.module or "").split(".")] for alias in node.names
        ):
            found.append((node.lineno, f"from {node.module} import ..."))
        elif isinstance(node, ast.Import) and any("shard_map" in alias.name.split(".") for alias in node.names):
            found.append((node.lineno, "import ...shard_map"))
    return [f"zoo/{relative}:{line}: {what}" for line, what in sorted(found)]


def test_shard_map_is_called_only_in_the_bridge():
    bad = _every_source(_shard_map_uses, skip=SHARD_MAP_HOMES)
    assert not bad, (
        "run a shard_map through zoo.layers._parallel_plan.run_sharded (a layer) or zoo.layers.run_on_mesh "
        "(a kernel on a mesh of its own), the one cached path:\n" + "\n".join(bad)
    )


def test_the_shard_map_rule_finds_each_spelling():
    source = (
        "import jax\n"
        "run = jax.shard_map(body, mesh=mesh, in_specs=P(), out_specs=P())\n"
        "from jax import shard_map\n"
        "from jax.experimental.shard_map import shard_map as smap\n"
        "f = jax.jit(jax.shard_map)\n"
    )
    assert [line.split(":")[1] for line in _shard_map_uses("bench/x.py", source)] == ["2", "3", "4", "5"]
    assert _shard_map_uses("bench/x.py", '"""Runs under ``jax.shard_map``."""\n') == []  # words are not calls


def test_benchmarks_export_nothing():
    """A benchmark imports only the library and the benchmarks' private helpers (``zoo/bench/_*.py``),
    never another benchmark; nothing outside ``zoo/bench`` imports it (``zoo bench`` reaches
    each by name, zoo/cli/bench.py). What two of them, or a benchmark and ``zoo comms``, both
    need lives in the library (e.g. ``zoo.measure.tensor_parallel_mlp``)."""
    bad = []
    for path in ROOT.rglob("*.py"):
        inside = path.parent == ROOT / "bench"
        for _, name in _zoo_imports(path):
            parts = name.split(".")
            if parts[:2] != ["zoo", "bench"] or len(parts) < 3:
                continue
            if not inside or not parts[2].startswith("_"):
                bad.append(f"{path.relative_to(ROOT.parent)} imports {name}")
    assert not bad, "a benchmark exports code:\n" + "\n".join(bad)


# --- a layout's meaning is its record in the layout table (zoo/config/layouts.py) ---

# The layout names that name nothing else (data, expert and seq are also mesh axes, context a
# word of its own); the library branches on the record's fields, never on these strings.
# The benchmarks and the command line name one through the table's constants (FSDP_TP ...).
LAYOUT_ONLY_NAMES = ("tp+sp", "fsdp+tp", "pipeline", "fsdp+expert", "expert+tp")
LAYOUT_LITERAL_HOMES = ("config/layouts.py",)


def _layout_literals(relative, source):
    """``relative:line: "name"`` for each string constant in ``source`` that is one of
    ``LAYOUT_ONLY_NAMES``, docstrings left out."""
    tree = ast.parse(source)
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        f"zoo/{relative}:{node.lineno}: {node.value!r}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and node.value in LAYOUT_ONLY_NAMES and id(node) not in docstrings
    ]


def test_layout_names_are_written_only_in_the_layout_table():
    bad = _every_source(_layout_literals, skip=LAYOUT_LITERAL_HOMES)
    assert not bad, (
        "read the layout's record (zoo.config.layouts.layout_record: its axes, fsdp_axis, model_axis, "
        "sequence_axis, expert_axis, stage_axis, model_options) instead of comparing its name:\n" + "\n".join(bad)
    )


def test_the_layout_literal_rule_finds_a_comparison_and_not_a_docstring():
    source = '"""Layout ``"tp+sp"`` splits the tokens."""\nif layout == "tp+sp":\n    pass\nX = ("fsdp+tp",)\n'
    assert _layout_literals("planning/x.py", source) == [
        "zoo/planning/x.py:2: 'tp+sp'",
        "zoo/planning/x.py:4: 'fsdp+tp'",
    ]
    assert _layout_literals("bench/x.py", source) == ["zoo/bench/x.py:2: 'tp+sp'", "zoo/bench/x.py:4: 'fsdp+tp'"]
