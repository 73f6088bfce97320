"""Importing zoo selects JAX, and refuses another backend with a clear error."""

import os
import subprocess
import sys


def _run(code, **env_changes):
    env = {k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"}
    env.update(env_changes)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)


def test_import_selects_jax_when_unset():
    result = _run("import zoo, keras; print(keras.backend.backend())")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "jax"


def test_other_backend_in_environment_is_refused():
    result = _run("import zoo", KERAS_BACKEND="numpy")
    assert result.returncode != 0
    assert "KERAS_BACKEND='numpy' but keras-zoo needs the 'jax' backend" in result.stderr


def test_keras_already_loaded_with_other_backend_is_refused():
    result = _run("import keras; import zoo", KERAS_BACKEND="numpy")
    assert result.returncode != 0
    assert "Keras is already imported with the 'numpy' backend" in result.stderr
    assert "import zoo before keras" in result.stderr
