"""``.keras`` safety: files are loaded in safe mode (a Lambda's bytecode is refused, never
run), and a save that fails leaves the previous file untouched."""

import ast
import os
import pathlib

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
        safe = name == "load_model" and isinstance(keywords.get("safe_mode"), ast.Constant) and keywords["safe_mode"].value is True
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
