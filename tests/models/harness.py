"""The checks every zoo model family goes through (after keras-hub's ``run_backbone_test``
/ ``run_task_test`` / ``run_preset_test``): the config round-trip, a clone from it with
the same weights computing the same outputs, optionally a batch of another size, and the ``.keras``
file round-trip (plain ``keras.saving.load_model(..., safe_mode=True)``: the class, its
config, its variable paths and its outputs), and, with ``preset_dir``, the preset
round-trip (``save_to_preset`` then ``Class.from_preset``).

``check_model_contract(model, inputs, ...)`` runs them all; each family's test module
calls it once on its own small model (tests/models/test_small_cnn.py, test_encoder.py,
test_vit.py, test_gpt.py) and keeps the checks only its family needs. The layers' own
contract: tests/layers/harness.py.
"""

import keras
import numpy as np


def check_model_contract(
    model, inputs, *, expected_output_shape, save_dir, preset_dir=None, other_batch=None, rtol=1e-6, atol=1e-6
):
    """Every check on ``model`` (built, on one device) with ``inputs`` (a numpy batch).

    Args:
        expected_output_shape: the shape of ``model(inputs)``.
        save_dir: a folder for the ``.keras`` file (``tmp_path``).
        preset_dir: a folder for the preset round-trip, or None to skip it.
        other_batch: the rows of a second batch size checked (a prefix of ``inputs``), or
            None (an eager call of a new shape compiles every op again: seconds on 2 cores).
    Returns the outputs of ``model(inputs)`` (numpy), for the family's own checks.
    """
    outputs = np.asarray(model(inputs))
    assert outputs.shape == tuple(expected_output_shape), (outputs.shape, expected_output_shape)
    assert np.all(np.isfinite(outputs))
    check_config_round_trip(model, inputs, outputs, rtol=rtol, atol=atol)
    if other_batch is not None:
        fewer = np.asarray(model(inputs[:other_batch]))
        np.testing.assert_allclose(fewer, outputs[:other_batch], rtol=1e-5, atol=1e-5)  # rows are independent
    check_keras_file_round_trip(model, inputs, outputs, save_dir, rtol=rtol, atol=atol)
    if preset_dir is not None:
        check_preset_round_trip(model, inputs, outputs, preset_dir, rtol=rtol, atol=atol)
    return outputs


def check_config_round_trip(model, inputs, outputs, *, rtol, atol):
    """``from_config(get_config())`` has the same config, and with the model's weights the
    same outputs."""
    config = model.get_config()
    clone = type(model).from_config(config)
    assert clone.get_config() == config
    clone.set_weights(model.get_weights())
    np.testing.assert_allclose(np.asarray(clone(inputs)), outputs, rtol=rtol, atol=atol)


def check_keras_file_round_trip(model, inputs, outputs, save_dir, *, rtol, atol):
    """``model.save`` then plain Keras' ``load_model(safe_mode=True)``: the same class,
    config, variable paths and outputs."""
    path = save_dir / f"{model.name}.keras"
    model.save(path)
    loaded = keras.saving.load_model(path, safe_mode=True)
    assert type(loaded) is type(model) and loaded.get_config() == model.get_config()
    assert [v.path for v in loaded.weights] == [v.path for v in model.weights]
    np.testing.assert_allclose(np.asarray(loaded(inputs)), outputs, rtol=rtol, atol=atol)


def check_preset_round_trip(model, inputs, outputs, preset_dir, *, rtol, atol):
    """``zoo.presets.save_to_preset`` then ``Class.from_preset``: the same config and outputs."""
    from zoo.presets import save_to_preset

    save_to_preset(model, preset_dir)
    loaded = type(model).from_preset(str(preset_dir))
    assert loaded.get_config() == model.get_config()
    np.testing.assert_allclose(np.asarray(loaded(inputs)), outputs, rtol=rtol, atol=atol)
