"""A SmallCNN small enough to compile in seconds, its data, and array comparisons."""

import keras
import numpy as np

from zoo.data import DivisibleBatches
from zoo.models import SmallCNN

IMAGE = 8  # the smallest SmallCNN input
BATCH = 8
EXAMPLES = 32  # 4 batches per epoch
CLASSES = 4


def data():
    rng = np.random.default_rng(0)
    x = rng.random((EXAMPLES, IMAGE, IMAGE, 3), dtype=np.float32)  # (N, S, S, C)
    y = (np.arange(EXAMPLES) % CLASSES).astype(np.int32)  # (N,)
    return x, y


def batches(seed=0):
    x, y = data()
    return DivisibleBatches(x, y, batch_size=BATCH, remainder="drop", shuffle=True, seed=seed)


def build(hidden_units=8, dropout=0.5):
    """Compiled, optimizer built; every width divides by 8 so ModelParallel can split it."""
    keras.utils.set_random_seed(0)
    model = SmallCNN(
        num_classes=CLASSES, image_size=IMAGE, filters=(8, 8, 8), hidden_units=hidden_units, dropout=dropout, seed=0
    )
    model.compile(keras.optimizers.Adam(1e-2), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.optimizer.build(model.trainable_variables)
    return model


def values(model):
    """``{"model": [np.ndarray], "optimizer": [np.ndarray]}``, the layout of ``Checkpoints.read``."""
    return {
        "model": [np.asarray(v.value) for v in model.variables],
        "optimizer": [np.asarray(v.value) for v in model.optimizer.variables],
    }


def assert_bitwise_equal(actual, expected, what):
    for group in ("model", "optimizer"):
        assert len(actual[group]) == len(expected[group]), f"{what}: {group} variable counts differ"
        for index, (a, e) in enumerate(zip(actual[group], expected[group])):
            assert a.dtype == e.dtype and a.shape == e.shape, f"{what}: {group} variable {index} dtype/shape differ"
            assert np.array_equal(a, e), (
                f"{what}: {group} variable {index} differs by up to {np.max(np.abs(a.astype(np.float64) - e)):.3g}"
            )
