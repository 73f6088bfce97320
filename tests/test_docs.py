"""Every Python example in the README and docs that starts with an import runs as written."""

import os
import pathlib
import re
import subprocess
import sys

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
]


def _examples():
    for page in PAGES:
        blocks = re.findall(r"```python\n(.*?)```", (ROOT / page).read_text(), flags=re.S)
        for index, code in enumerate(blocks):
            if code.startswith(("import", "from zoo")) and "build_fn" not in code:
                yield pytest.param(code, id=f"{page}#{index}")


@pytest.mark.parametrize("code", list(_examples()))
def test_example_runs(code, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "KERAS_BACKEND")}
    env["JAX_PLATFORMS"] = "cpu"
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]


def test_every_page_has_a_runnable_example():
    pages_with_examples = {param.id.split("#")[0] for param in _examples()}
    assert pages_with_examples == set(PAGES)
