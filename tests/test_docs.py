"""Every Python example in the README and docs that starts with an import runs as written.

The examples run in this test process (8 simulated devices already started; an example's
``simulate_cpu_devices(8)`` then only checks the count), except those in ``FRESH_PROCESS``,
which run as a user runs them: a new Python process, JAX not yet started.
"""

import os
import pathlib
import re
import subprocess
import sys

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
]

# The README's example: a new user's first run, whose simulate_cpu_devices(8) must work
# before JAX starts (as in every other page's example, which would run the same way).
FRESH_PROCESS = {"README.md#0"}


def _examples():
    for page in PAGES:
        blocks = re.findall(r"```python\n(.*?)```", (ROOT / page).read_text(), flags=re.S)
        for index, code in enumerate(blocks):
            if code.startswith(("import", "from zoo")) and "build_fn" not in code:
                yield pytest.param(code, id=f"{page}#{index}")


@pytest.mark.parametrize("code", list(_examples()))
def test_example_runs(code, request, tmp_path, monkeypatch):
    name = request.node.callspec.id
    if name in FRESH_PROCESS:
        _check_runs_in_a_new_process(code, tmp_path)
    else:
        _check_runs_in_this_process(code, name, tmp_path, monkeypatch)


def _check_runs_in_a_new_process(code, folder):
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "KERAS_BACKEND")}
    env["JAX_PLATFORMS"] = "cpu"
    result = subprocess.run([sys.executable, "-c", code], cwd=folder, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]


def _check_runs_in_this_process(code, name, folder, monkeypatch):
    """``exec`` as a script in ``folder``; Keras' global dtype policy and names are reset after."""
    monkeypatch.chdir(folder)
    policy = keras.config.dtype_policy()
    try:
        exec(compile(code, name, "exec"), {"__name__": "__main__"})
    finally:
        keras.config.set_dtype_policy(policy)
        keras.utils.clear_session()


def test_every_page_has_a_runnable_example():
    pages_with_examples = {param.id.split("#")[0] for param in _examples()}
    assert pages_with_examples == set(PAGES)
