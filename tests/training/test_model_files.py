"""``.keras`` safety: files are loaded in safe mode (a Lambda's bytecode is refused, never
run), and a save that fails leaves the previous file untouched; an export killed part-way
leaves no folder, and the next one removes what it left."""

import ast
import os
import pathlib
import subprocess
import sys

import keras
import numpy as np
import pytest

from zoo.training.paths import save_model_atomically
from zoo.training.saving import load_zoo_model

ZOO = pathlib.Path(__file__).resolve().parents[2] / "zoo"


def _lambda_model_file(tmp_path):
    """A real .keras file whose Lambda layer, if its bytecode ever runs, creates ``marker``."""
    marker = tmp_path / "bytecode-ran"
    function = eval(f"lambda x: (open({str(marker)!r}, 'w').close(), x)[1]")  # no closure: all in the bytecode
    inputs = keras.Input((2,))
    model = keras.Model(inputs, keras.layers.Lambda(function, name="payload")(inputs))
    path = tmp_path / "lambda.keras"
    model.save(path)
    os.remove(marker)  # building the model ran it once
    return path, marker


def test_a_lambda_layer_is_refused_and_its_code_never_runs(tmp_path):
    path, marker = _lambda_model_file(tmp_path)
    with pytest.raises(ValueError, match=r"(?s)Lambda.*safe_mode"):
        load_zoo_model(str(path))
    assert not marker.exists()

    keras.saving.load_model(path, safe_mode=False)  # the file really carries code that runs
    assert marker.exists()


def _load_model_calls():
    for source in ZOO.rglob("*.py"):
        for node in ast.walk(ast.parse(source.read_text(), filename=str(source))):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "attr", getattr(node.func, "id", None))
                if name in ("load_model", "load_weights", "enable_unsafe_deserialization"):
                    yield source.relative_to(ZOO.parent), node.lineno, name, node


def test_every_load_model_call_in_zoo_is_in_safe_mode():
    unsafe = []
    for source, line, name, node in _load_model_calls():
        keywords = {k.arg: k.value for k in node.keywords}
        safe = (
            name == "load_model"
            and isinstance(keywords.get("safe_mode"), ast.Constant)
            and keywords["safe_mode"].value is True
        )
        if name != "load_weights" and not safe:
            unsafe.append(f"{source}:{line}: {name}(...) without safe_mode=True")
    assert not unsafe, "\n".join(unsafe)


@keras.saving.register_keras_serializable(package="zoo_tests")
class _FailsToSave(keras.layers.Layer):
    """Writes part of its weights, then fails, as a full disk would."""

    def build(self, input_shape):
        self.w = self.add_weight(shape=(input_shape[-1],), initializer="ones", name="w")

    def call(self, x):
        return x * self.w

    def save_own_variables(self, store):
        store["0"] = np.asarray(self.w.value)
        raise OSError("No space left on device (simulated inside Keras' own save)")


def test_a_failing_save_leaves_the_previous_file_intact(tmp_path):
    path = str(tmp_path / "model.keras")
    good = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="dense")])
    save_model_atomically(good, path)
    before = pathlib.Path(path).read_bytes()

    failing = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="dense"), _FailsToSave()])
    with pytest.raises(OSError, match="No space left on device"):
        save_model_atomically(failing, path)
    assert pathlib.Path(path).read_bytes() == before
    assert os.listdir(tmp_path) == ["model.keras"]  # no partial file left behind
    restored = load_zoo_model(path)
    np.testing.assert_array_equal(restored.get_layer("dense").kernel.numpy(), good.get_layer("dense").kernel.numpy())


def test_a_model_failing_its_check_is_not_written_at_the_target_but_rescued(tmp_path):
    """``zoo train gpt`` checks its model's logits before saving (``refused``: the probe's
    error): a model that fails it (a diverged run: NaN logits) leaves the previous file at the target, and is
    kept beside the run for inspection, the error (the check's own type) saying where."""
    from zoo.models import GPTCausalLM
    from zoo.models.gpt import NonFiniteModelError, non_finite_error

    path = str(tmp_path / "model.keras")
    good = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="dense")])
    save_model_atomically(good, path)
    before = pathlib.Path(path).read_bytes()
    diverged = GPTCausalLM.from_config_name("gpt_tiny", num_layers=1, max_sequence_length=16)
    diverged.backbone.token_embedding.embeddings.assign(
        np.full(diverged.backbone.token_embedding.embeddings.shape, np.nan)
    )
    with pytest.raises(
        NonFiniteModelError, match=r"model.keras: not written: .* NaN .*; the model was saved to .*rescued-"
    ):
        save_model_atomically(
            diverged, path, fallback_folders=[str(tmp_path / "run")], refused=non_finite_error(diverged, path)
        )
    assert pathlib.Path(path).read_bytes() == before
    (rescued,) = os.listdir(tmp_path / "run")
    assert rescued.startswith("rescued-") and rescued.endswith("model.keras")


# ``zoo export`` in a process that SIGKILLs itself once the weights are written, as it
# starts the config.json: the moment a kill 1-2 s into a big export hits.
_KILLED_EXPORT = """
import os, signal, sys
from zoo.config.settings import ExportSettings
from zoo.models.gpt import _hf_save
from zoo.training.export import export
_hf_save._write_json = lambda *arguments: os.kill(os.getpid(), signal.SIGKILL)
export(ExportSettings(model=sys.argv[1], output=sys.argv[2]))
"""


def test_a_killed_export_leaves_no_folder_and_the_next_removes_its_partial(tmp_path):
    from zoo.config.settings import ExportSettings
    from zoo.models import GPTCausalLM
    from zoo.tokenizers import ByteTokenizer
    from zoo.training.export import export

    keras.utils.set_random_seed(0)
    model = GPTCausalLM.from_config_name("gpt_tiny", num_layers=1)  # as zoo train gpt saves it: no preprocessor
    source, target = tmp_path / "gpt.keras", tmp_path / "hf"
    model.save(source)
    killed = subprocess.run(
        [sys.executable, "-c", _KILLED_EXPORT, str(source), str(target)], cwd=ZOO.parent, capture_output=True, text=True
    )
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert not target.exists()
    [partial] = tmp_path.glob("hf.partial-*")
    assert (partial / "model.safetensors").is_file() and not (partial / "config.json").exists()

    lines = []
    export(ExportSettings(model=str(source), output=str(target)), report=lines.append)
    assert any(line.startswith(f"removed {partial}") for line in lines), lines
    assert list(tmp_path.glob("hf.partial*")) == []
    files = {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"}
    assert set(os.listdir(target)) == files  # the byte tokenizer it was trained on, as tokenizer.json
    exported = GPTCausalLM.from_preset(target)
    token_ids = ByteTokenizer().encode("def f(x):")[None]  # (1, T)
    np.testing.assert_array_equal(np.asarray(exported(token_ids)), np.asarray(model(token_ids)))
    assert exported.preprocessor.tokenizer.encode("héllo").tolist() == ByteTokenizer().encode("héllo").tolist()
