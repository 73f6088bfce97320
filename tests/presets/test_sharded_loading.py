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


# --- safetensors: a stacked-expert view reads only the experts asked for ----------------


class CountedFiles:
    """A ``SafetensorsFiles`` noting each (tensor name, index) read."""

    def __init__(self, files):
        self.files, self.reads = files, []

    def shape(self, name):
        return self.files.shape(name)

    def read(self, name, index=()):
        self.reads.append((name, index))
        return self.files.read(name, index)


def test_stacked_view_reads_only_the_experts_and_rows_of_its_slice(tmp_path):
    from zoo.presets.safetensors_weights import SafetensorsFiles, StackedView, TensorView, write_safetensors

    weight = np.random.default_rng(0).normal(size=(4, 6, 10)).astype("float32")  # (E, C, F)
    view = StackedView(tuple(TensorView(f"experts.{j}.w1.weight", axes=(1, 0)) for j in range(4)))  # each (F, C)
    tensors = view.file_tensors(weight)
    assert list(tensors) == [f"experts.{j}.w1.weight" for j in range(4)] and tensors["experts.2.w1.weight"].shape == (
        10,
        6,
    )
    write_safetensors(tensors, tmp_path, max_file_bytes=2 * 10 * 6 * 4)  # experts 0-1 and 2-3 in two files
    with SafetensorsFiles(tmp_path) as opened:
        files = CountedFiles(opened)
        assert view.shape_in(files) == (4, 6, 10)
        block = view.read(files, (slice(2, 3), slice(0, 3), slice(5, 10)))  # expert 2, C rows 0-2, F 5-9
        np.testing.assert_array_equal(block, weight[2:3, 0:3, 5:10])
        assert files.reads == [("experts.2.w1.weight", (slice(5, 10), slice(0, 3)))]  # one tensor, its (F, C) part
        np.testing.assert_array_equal(view.read(files, ()), weight)
        np.testing.assert_array_equal(view.to_weight([opened.read(name) for name in view.names]), weight)
