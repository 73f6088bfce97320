import time

import jax
import keras
import numpy as np
import pytest
import tensorflow_datasets as tfds

from zoo.data import DATASETS, DivisibleBatches, load, load_shapes
from zoo.data.tfds_source import DatasetNotPreparedError


def _data_parallel():
    mesh = keras.distribution.DeviceMesh((8,), ["data"], jax.devices())
    keras.distribution.set_distribution(keras.distribution.DataParallel(device_mesh=mesh))


def test_shapes_through_its_builder_equals_the_generator():
    x, y = load("shapes", "validation", image_size=16)
    ref_x, ref_y = load_shapes("validation", image_size=16)
    assert x.shape == (512, 16, 16, 3) and x.dtype == np.float32
    np.testing.assert_array_equal(y, ref_y)
    np.testing.assert_allclose(x, np.round(ref_x * 255) / 255, atol=1e-6)


@pytest.mark.parametrize(
    "name, kwargs, x_shape, y_shape",
    [
        ("digits", {}, (1437, 16, 16, 1), (1437,)),
        ("digits", {"image_size": 32}, (1437, 32, 32, 1), (1437,)),
        ("python_docs", {"sequence_length": 64}, (None, 64), (None, 64)),
        ("python_docs_topics", {"sequence_length": 128}, (None, 128), (None,)),
    ],
)
def test_embedded_datasets_load(name, kwargs, x_shape, y_shape):
    x, y = load(name, "train", **kwargs)
    assert x.shape[1:] == x_shape[1:] and y.shape[1:] == y_shape[1:] and len(x) == len(y) > 100
    if x_shape[0]:
        assert x.shape == x_shape
    if name == "python_docs":
        assert (x[:, 1:] == y[:, :-1]).all()  # y is the next byte


@pytest.mark.parametrize(
    "name, x_shape, y_shape",
    [
        ("mnist", (7, 28, 28, 1), (7,)),
        ("cifar10", (7, 32, 32, 3), (7,)),
        ("imdb_reviews", (7, 64), (7,)),
        ("tiny_shakespeare", (None, 64), (None, 64)),
    ],
)
def test_tfds_datasets_through_the_same_api(name, x_shape, y_shape, tmp_path):
    with tfds.testing.mock_data(num_examples=7):
        x, y = load(name, "train", data_dir=tmp_path, sequence_length=64)
    assert x.shape[1:] == x_shape[1:] and y.shape[1:] == y_shape[1:]
    if x_shape[0]:
        assert len(x) == 7
    if x.dtype == np.float32:
        assert 0.0 <= x.min() and x.max() <= 1.0  # images normalised
    else:
        assert x.dtype == np.int32 and x.max() < 256  # text tokenised to bytes


def test_offline_unprepared_dataset_fails_fast_with_instructions(tmp_path):
    start = time.perf_counter()
    with pytest.raises(DatasetNotPreparedError) as error:
        load("mnist", "train", data_dir=tmp_path)
    assert time.perf_counter() - start < 5
    assert f"zoo data prepare mnist --data-dir {tmp_path}" in str(error.value)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: load("imagenet"), "unknown dataset 'imagenet'; available: shapes, digits, python_docs"),
        (
            lambda: load("digits", "dev"),
            "dataset 'digits' has no split 'dev'; its splits are ['train', 'validation', 'test']",
        ),
        (lambda: load("shapes", image_size=48), "shapes is prepared at image sizes [16, 32, 64, 128], got 48"),
        (lambda: load("digits", image_size=20), "digits: image_size must be 8 or a multiple of it, got 20"),
        (lambda: load("digits", "test", num_examples=500), "num_examples must be in [1, 180], got 500"),
        (lambda: load("python_docs", sequence_length=0), "sequence_length must be a positive integer, got 0"),
    ],
)
def test_bad_requests_name_the_values(call, message):
    with pytest.raises(ValueError) as error:
        call()
    assert message in str(error.value)


def test_process_shards_partition_the_split():
    shards = [load("digits", "test", process_index=i, process_count=3) for i in range(3)]
    full_x, full_y = load("digits", "test")
    np.testing.assert_array_equal(np.concatenate([s[1] for s in shards]), full_y)
    np.testing.assert_array_equal(np.concatenate([s[0] for s in shards]), full_x)


@pytest.mark.parametrize("size", range(1, 60, 7))
def test_uneven_sizes_never_give_an_indivisible_batch(size):
    x = np.arange(size, dtype=np.float32)[:, None]
    for remainder in ("pad", "drop"):
        if remainder == "drop" and size < 16:
            continue
        batches = DivisibleBatches(x, x, batch_size=16, multiple_of=8, remainder=remainder)
        assert all(len(batches[i][0]) % 8 == 0 for i in range(len(batches)))


def _image_model(x, classes):
    return keras.Sequential(
        [
            keras.Input(x.shape[1:]),
            keras.layers.Conv2D(8, 3, name="conv"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(classes, name="logits"),
        ]
    )


def _text_model(x, outputs, per_token):
    layers = [keras.Input(x.shape[1:], dtype="int32"), keras.layers.Embedding(256, 16, name="embed")]
    if not per_token:
        layers.append(keras.layers.GlobalAveragePooling1D())
    return keras.Sequential(layers + [keras.layers.Dense(outputs, name="logits")])


@pytest.mark.parametrize("name", ["shapes", "digits", "python_docs", "python_docs_topics"])
def test_short_fit_on_8_devices(name):
    x, y = load(name, "validation", **({"image_size": 16} if name == "shapes" else {"sequence_length": 32}))
    spec = DATASETS[name]
    _data_parallel()
    if x.ndim == 4:
        model = _image_model(x, len(spec.classes))
    else:
        model = _text_model(x, 256 if not spec.classes else len(spec.classes), per_token=not spec.classes)
    model.compile(
        optimizer="adam",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        weighted_metrics=["accuracy"],
    )
    batches = DivisibleBatches(x, y, batch_size=48, multiple_of=8)  # uneven sizes: last batch padded
    history = model.fit(batches, epochs=2, shuffle=False, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    assert history.history["loss"][1] < history.history["loss"][0]
