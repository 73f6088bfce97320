"""Every Python example in the README and docs that starts with an import runs as written.

The examples run in this test process (8 simulated devices already started; an example's
``simulate_cpu_devices(8)`` then only checks the count). What the README's first example
needs of a new process is checked there, cheaply: ``import zoo`` choosing JAX with no
KERAS_BACKEND (tests/test_loading.py), ``simulate_cpu_devices`` before JAX starts
(tests/distribution/test_devices.py), and every example importing the zoo before Keras
(here: an example run on its own that imports Keras first gets the TensorFlow backend).
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
    """``exec`` as a script in ``folder``; Keras' global dtype policy and names are reset after."""
    monkeypatch.chdir(folder)
    policy = keras.config.dtype_policy()
    try:
        exec(compile(code, name, "exec"), {"__name__": "__main__"})
    finally:
        keras.config.set_dtype_policy(policy)
        keras.utils.clear_session()


def test_every_example_imports_the_zoo_before_keras():
    """Run on its own, an example that imports Keras first gets Keras' default backend
    (TensorFlow), not JAX: ``import zoo`` must come first (it sets KERAS_BACKEND)."""
    late = []
    for param in _examples():
        lines = param.values[0].splitlines()
        keras_line = next((n for n, line in enumerate(lines) if re.match(r"\s*(import|from) keras\b", line)), None)
        zoo_line = next((n for n, line in enumerate(lines) if re.match(r"\s*(import|from) zoo\b", line)), len(lines))
        if keras_line is not None and zoo_line > keras_line:
            late.append(param.id)
    assert not late, f"these examples import keras before zoo: {late}"


def test_every_page_has_a_runnable_example():
    pages_with_examples = {param.id.split("#")[0] for param in _examples()}
    assert pages_with_examples == set(PAGES)
