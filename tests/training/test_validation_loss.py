"""The validation loss of the same weights on the same split is the mean over its real
examples, the same on 8-way data parallel as on one device (issue 27 item 5: 4.988 on
data=8 vs 5.015 on data=1). 13 rows in batches of 8: on 8 devices the last batch is padded
with 3 rows, on one device it is not."""

import types

import jax
import keras
import numpy as np
import pytest

from tests.training import _tiny
from zoo.data import DivisibleBatches
from zoo.distribution import global_distribution
from zoo.models.gpt import GPT_CONFIGS, GPTBackbone, GPTCausalLM
from zoo.training import cnn as cnn_training
from zoo.training import gpt as gpt_training

ROWS = 13  # 13 = 8 + 5: 3 padding rows on 8 devices
BATCH = 8
LENGTH = 8  # T


def _data_parallel(devices):
    mesh = keras.distribution.DeviceMesh((devices,), ["data"], jax.devices()[:devices])
    return keras.distribution.DataParallel(device_mesh=mesh)


def _gpt(distribution, weights=None):
    with global_distribution(distribution):
        keras.utils.set_random_seed(0)
        model = GPTCausalLM(backbone=GPTBackbone(**GPT_CONFIGS["gpt_tiny"] | {"num_layers": 1}))
        model(np.zeros((BATCH, LENGTH), np.int32))
        if weights is not None:
            model.set_weights(weights)
        gpt_training.compile_gpt(model, 1e-3, total_steps=1)
    return model


def _gpt_validation_loss(distribution, model, xv, yv):
    """``zoo train gpt``'s validation batches (``_batches``) and ``evaluate``, under ``distribution``."""
    settings = types.SimpleNamespace(layout="data", batch_size=BATCH, steps_per_epoch=None, seed=0)
    _, validation = gpt_training._batches(settings, distribution, xv, yv, xv, yv)
    with global_distribution(distribution):
        return validation.num_padding, model.evaluate(validation, verbose=0)


def test_gpt_validation_loss_is_the_same_on_8_devices_and_one():
    tokens = np.random.default_rng(0).integers(1, 256, size=(ROWS, LENGTH + 1)).astype(np.int32)
    xv, yv = tokens[:, :-1], tokens[:, 1:]  # (N, T) windows and their next-token labels
    one = _gpt(None)
    eight = _gpt(_data_parallel(8), one.get_weights())
    padding_8, loss_8 = _gpt_validation_loss(_data_parallel(8), eight, xv, yv)
    padding_1, loss_1 = _gpt_validation_loss(None, one, xv, yv)
    assert (padding_8, padding_1) == (3, 0)
    np.testing.assert_allclose(loss_8, loss_1, rtol=1e-6)
    logits = one.predict(xv, batch_size=ROWS, verbose=0)  # (N, T, V)
    per_token = keras.ops.sparse_categorical_crossentropy(yv, logits, from_logits=True)  # (N, T)
    np.testing.assert_allclose(loss_1, np.mean(per_token), rtol=1e-5)  # the mean over the real tokens


def _cnn_metrics(distribution, devices, x, y, weights):
    with global_distribution(distribution):
        model = _tiny.build()
        model.set_weights(weights)
        cnn_training.compile_cnn(model)  # zoo train cnn's loss and weighted accuracy
        validation = DivisibleBatches(x, y, batch_size=BATCH, multiple_of=devices, remainder="pad")  # as _datasets
        return validation.num_padding, model.evaluate(validation, verbose=0, return_dict=True)


@pytest.mark.parametrize("metric", ["loss", "accuracy"])
def test_cnn_validation_metrics_are_the_same_on_8_devices_and_one(metric):
    x, y = (array[:ROWS] for array in _tiny.data())
    weights = _tiny.build().get_weights()
    padding_8, on_8 = _cnn_metrics(_data_parallel(8), 8, x, y, weights)
    padding_1, on_1 = _cnn_metrics(None, 1, x, y, weights)
    assert (padding_8, padding_1) == (3, 0)
    np.testing.assert_allclose(on_8[metric], on_1[metric], rtol=1e-6)
