"""Every Python example in the README and docs that starts with an import runs as written.

The examples run in this test process (8 simulated devices already started; an example's
``simulate_cpu_devices(8)`` then only checks the count). What the README's first example
needs of a new process is checked there, cheaply: ``import zoo`` choosing JAX with no
KERAS_BACKEND (tests/test_loading.py), ``simulate_cpu_devices`` before JAX starts
(tests/distribution/test_devices.py), and every ```python block of README.md and
docs/*.md, run here or not, importing the zoo before Keras or JAX (here, statically: an
example run on its own that imports Keras first gets the TensorFlow backend).
"""

import pathlib
import re

import keras
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = [
    "README.md",
    "docs/distribution.md",
    "docs/models.md",
    "docs/data.md",
    "docs/tensor_parallel.md",
    "docs/sequence_parallel.md",
    "docs/attention.md",
    "docs/context_parallel.md",
    "docs/recipes.md",
    "docs/checkpoints.md",
    "docs/presets.md",
    "docs/finetuning.md",
    "docs/checkpoints-hf.md",
    "docs/planning.md",
    "docs/pipeline_parallel.md",
    "docs/moe.md",
    "docs/chat.md",
    "docs/generation.md",
    "docs/architecture.md",
]


def _examples():
    for page in PAGES:
        blocks = re.findall(r"```python\n(.*?)```", (ROOT / page).read_text(), flags=re.S)
        for index, code in enumerate(blocks):
            if code.startswith(("import", "from zoo")) and "build_fn" not in code:
                yield pytest.param(code, id=f"{page}#{index}")


@pytest.mark.parametrize("code", list(_examples()))
def test_example_runs(code, request, tmp_path, monkeypatch):
    _check_runs_in_this_process(code, request.node.callspec.id, tmp_path, monkeypatch)


def _check_runs_in_this_process(code, name, folder, monkeypatch):
    """``exec`` as a script in ``folder``; Keras' global dtype policy and names are reset after
    (not its memory: the example's arrays go with their last reference)."""
    monkeypatch.chdir(folder)
    policy = keras.config.dtype_policy()
    try:
        exec(compile(code, name, "exec"), {"__name__": "__main__"})
    finally:
        keras.config.set_dtype_policy(policy)
        # no full gc.collect() (Keras' default): 0.66 s a call late in a worker, 26 calls in tier 1
        keras.utils.clear_session(free_memory=False)


DOC_PAGES = ["README.md", *sorted(f"docs/{page.name}" for page in (ROOT / "docs").glob("*.md"))]
# the block chooses the backend itself: os.environ["KERAS_BACKEND"] = ... or setdefault("KERAS_BACKEND", ...)
_BACKEND_SET = re.compile(r"""KERAS_BACKEND["']\s*(\]\s*=(?!=)|,)""")
_USES = re.compile(r"(?<![\w.])(keras|jax|jnp)\.")  # keras.x, jax.x, jnp.x used unimported


def _imported_modules(line):
    """The top-level modules an ``import``/``from`` line names (``import os, keras`` → os, keras)."""
    match = re.match(r"\s*from\s+([\w.]+)\s+import\b", line)
    if match:
        return [match.group(1).split(".")[0]]
    match = re.match(r"\s*import\s+(.+)", line)
    if match:
        return [name.strip().split()[0].split(".")[0] for name in match.group(1).split(",") if name.strip()]
    return []


def _keras_before_zoo(code):
    """(line number in the block, line) of the first line importing or using Keras or JAX
    before any ``import zoo``/``from zoo`` or KERAS_BACKEND setting; None when there is none."""
    for number, line in enumerate(code.splitlines(), start=1):
        statement = line.split("#", 1)[0]
        modules = _imported_modules(statement)
        if "zoo" in modules or _BACKEND_SET.search(line):
            return None
        if {"keras", "jax"} & set(modules) or _USES.search(statement):
            return number, line.strip()
    return None


def test_every_python_block_imports_the_zoo_before_keras_or_jax():
    """Every ```python block of README.md and docs/*.md, run or not: run on its own, a
    script that imports Keras first gets Keras' default backend (TensorFlow), not JAX, so
    one that imports or uses Keras or JAX imports the zoo (which selects JAX) before them,
    or sets KERAS_BACKEND itself. Static: nothing is executed."""
    late = []
    for page in DOC_PAGES:
        text = (ROOT / page).read_text()
        for index, block in enumerate(re.finditer(r"```python\n(.*?)```", text, flags=re.S)):
            found = _keras_before_zoo(block.group(1))
            if found:
                number, line = found
                page_line = text.count("\n", 0, block.start(1)) + number
                late.append(f"{page} python block #{index}, line {number} of the block ({page}:{page_line}): {line!r}")
    assert not late, "import zoo before Keras/JAX (or set KERAS_BACKEND) in:\n" + "\n".join(late)


def test_every_page_has_a_runnable_example():
    pages_with_examples = {param.id.split("#")[0] for param in _examples()}
    assert pages_with_examples == set(PAGES)
