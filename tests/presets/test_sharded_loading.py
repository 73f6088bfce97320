"""Loading a preset under ModelParallel puts each weight straight into its shards
(keras-team/keras#21634): per-device memory is the sharded size, no weight passes
through one device whole, and the outputs equal the single-device preset's."""

import collections
import math

import jax
import keras
import numpy as np
import pytest

from tests.presets._helpers import fixed_images
from zoo import distribution as zd
from zoo.models import SmallCNN
from zoo.presets import from_preset, preset_directory

MESH = "data=2,model=4"


def per_device_bytes(model):
    """``{device: bytes}`` of the model's weights as they sit on each device."""
    totals = collections.Counter()
    for variable in model.weights:
        for shard in variable.value.addressable_shards:
            totals[shard.device] += shard.data.nbytes
    return totals


def expected_shard_bytes(model, mesh_sizes):
    """Bytes one device holds of each weight: its size over the mesh axes it is split on."""
    total = 0
    for variable in model.weights:
        split = math.prod(mesh_sizes[axis] for axis in variable.value.sharding.spec if axis is not None)
        total += variable.value.nbytes // split
    return total


@pytest.fixture
def host_conversions(monkeypatch):
    """Shapes of the host (numpy / HDF5) arrays ``jnp.asarray`` turned into device arrays."""
    seen = []
    original = jax.numpy.asarray

    def spy(value, *args, **kwargs):
        if not isinstance(value, jax.Array) and hasattr(value, "shape"):
            seen.append(tuple(value.shape))
        return original(value, *args, **kwargs)

    monkeypatch.setattr(jax.numpy, "asarray", spy)
    return seen


def test_sharded_load_holds_only_shards_and_matches_one_device(host_conversions):
    images = fixed_images(8)
    reference = np.asarray(from_preset("small_cnn_shapes")(images))
    host_conversions.clear()

    distribution = zd.distribution_for(SmallCNN, "model", MESH)
    model = zd.build_distributed(lambda: from_preset("small_cnn_shapes"), distribution)

    split = {v.path: tuple(v.shape) for v in model.weights if any(a is not None for a in v.value.sharding.spec)}
    assert "hidden_dense/kernel" in split and "block3_conv/kernel" in split
    assert not set(host_conversions) & set(split.values()), "a split weight went through one device whole"
    sizes = dict(zip(distribution.device_mesh.axis_names, distribution.device_mesh.shape))
    replicated = sum(v.value.nbytes for v in model.weights)
    sharded = expected_shard_bytes(model, sizes)
    assert sharded < 0.4 * replicated  # most bytes are in weights split 4 ways
    assert per_device_bytes(model) == {device: sharded for device in jax.devices()}
    np.testing.assert_allclose(model.predict(images, batch_size=8, verbose=0), reference, rtol=1e-5, atol=1e-4)


def test_keras_load_weights_alone_converts_whole_arrays_first(host_conversions):
    """The behaviour zoo.presets avoids: Keras' own load_weights turns each whole HDF5
    array into a device array before re-laying it out (keras-team/keras#21634)."""
    distribution = zd.distribution_for(SmallCNN, "model", MESH)
    model = zd.build_distributed(lambda: from_preset("small_cnn_shapes", load_weights=False), distribution)
    host_conversions.clear()
    model.load_weights(f"{preset_directory('small_cnn_shapes')}/model.weights.h5")
    assert tuple(model.get_layer("hidden_dense").kernel.shape) in host_conversions
    keras.distribution.set_distribution(None)
