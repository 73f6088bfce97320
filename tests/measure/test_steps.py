"""The one hand-written train step does what one step of ``fit`` does: the same loss and
the same weights after it (a small Dense model with batch-norm, so the non-trainable
state is carried too); an uncompiled model is refused by name."""

import jax
import keras
import numpy as np
import pytest

from zoo.measure.steps import model_state, stateless_train_step


def _model():
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((6,)), keras.layers.Dense(8), keras.layers.BatchNormalization(), keras.layers.Dense(3)],
        name="tiny",
    )
    model.compile(
        optimizer=keras.optimizers.Adam(0.1), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    return model


def test_one_step_equals_one_step_of_fit():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(8, 6)).astype("float32"), rng.integers(0, 3, size=(8,))
    hand, fitted = _model(), _model()
    loss, (trainable, non_trainable, _) = jax.jit(stateless_train_step(hand))(model_state(hand), x, y)
    history = fitted.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    np.testing.assert_allclose(float(loss), history.history["loss"][0], rtol=1e-6)
    for value, variable in zip(trainable + non_trainable, fitted.trainable_variables + fitted.non_trainable_variables):
        np.testing.assert_allclose(np.asarray(value), variable.numpy(), rtol=1e-5, atol=1e-6, err_msg=variable.path)
    moved = [np.abs(np.asarray(v) - w.numpy()).max() for v, w in zip(trainable, hand.trainable_variables)]
    assert min(moved) > 0  # not vacuous: every weight took the step


def test_an_uncompiled_model_is_refused_by_name():
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)], name="bare")
    with pytest.raises(ValueError, match="model 'bare' is not compiled"):
        stateless_train_step(model)
