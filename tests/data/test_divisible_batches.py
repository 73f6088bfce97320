"""Tests for DivisibleBatches (zoo.data.divisible_batches)."""

import jax
import keras
import numpy as np
import pytest

from zoo.data import DivisibleBatches, load_shapes


def _ids(n):
    """x whose single feature is the example index, so rows can be traced."""
    x = np.arange(n, dtype=np.float32)[:, None]  # (N, 1)
    y = np.arange(n, dtype=np.int32) * 10  # (N,)
    return x, y


def _batches(dataset):
    return [dataset[i] for i in range(len(dataset))]


def _real_ids(dataset):
    """Example ids of the real (weight > 0) rows, in the order the epoch yields them."""
    ids = [x[w > 0, 0] for x, _, w in _batches(dataset)]
    return np.concatenate(ids).astype(int)


@pytest.mark.parametrize("num_examples", [1, 7, 8, 9, 100, 128])
@pytest.mark.parametrize("batch_size,multiple_of", [(16, 8), (24, 4), (5, 1)])
def test_pad_batches_are_divisible_and_cover_every_example(num_examples, batch_size, multiple_of):
    x, y = _ids(num_examples)
    ds = DivisibleBatches(x, y, batch_size=batch_size, multiple_of=multiple_of)
    batches = _batches(ds)
    assert len(batches) == ds.num_batches == -(-num_examples // batch_size)
    sizes = [len(bx) for bx, _, _ in batches]
    assert all(s % multiple_of == 0 and s <= batch_size for s in sizes), sizes
    assert ds.num_padding == -num_examples % multiple_of
    assert ds.num_padding < multiple_of
    assert sum(len(bx) for bx, _, _ in batches) == num_examples + ds.num_padding
    np.testing.assert_array_equal(_real_ids(ds), np.arange(num_examples))
    assert ds.num_examples == num_examples


def test_pad_rows_copy_the_last_real_row_with_weight_zero():
    x, y = _ids(100)
    ds = DivisibleBatches(x, y, batch_size=16, multiple_of=8)
    bx, by, bw = ds[6]  # 100 = 6 * 16 + 4: four real rows, four padding rows
    np.testing.assert_array_equal(bx[:, 0], [96, 97, 98, 99, 99, 99, 99, 99])
    np.testing.assert_array_equal(by, [960, 970, 980, 990, 990, 990, 990, 990])
    real = np.float32(104 / 100)  # (N + P) / N: the loss over the 104 yielded rows is the mean over the 100 real
    assert ds.real_weight == 104 / 100
    np.testing.assert_array_equal(bw, [real] * 4 + [0] * 4)
    assert bw.dtype == np.float32
    for i in range(6):
        np.testing.assert_array_equal(ds[i][2], np.full(16, real, np.float32))


def test_real_rows_weigh_one_when_nothing_is_padded():
    x, y = _ids(96)
    ds = DivisibleBatches(x, y, batch_size=16, multiple_of=8)  # 96 = 6 * 16 + 0
    assert ds.num_padding == 0 and ds.real_weight == 1.0
    assert all(np.array_equal(w, np.ones(16, np.float32)) for _, _, w in _batches(ds))
    assert DivisibleBatches(x, y, batch_size=16, multiple_of=8, remainder="drop").real_weight == 1.0


def test_pad_goes_only_to_the_next_multiple_not_the_batch_size():
    x, y = _ids(100)
    ds = DivisibleBatches(x, y, batch_size=32, multiple_of=8)  # 100 = 3 * 32 + 4
    assert [len(bx) for bx, _, _ in _batches(ds)] == [32, 32, 32, 8]
    assert ds.num_padding == 4


def test_drop_yields_full_pairs_only():
    x, y = _ids(100)
    ds = DivisibleBatches(x, y, batch_size=16, multiple_of=8, remainder="drop")
    batches = _batches(ds)
    assert ds.num_batches == len(batches) == 6
    assert ds.num_padding == 0
    assert all(len(batch) == 2 and len(batch[0]) == 16 for batch in batches)
    ids = np.concatenate([bx[:, 0] for bx, _ in batches])
    np.testing.assert_array_equal(ids, np.arange(96))


def test_drop_with_fewer_examples_than_a_batch_names_both_numbers():
    x, y = _ids(10)
    with pytest.raises(ValueError, match=r"10 examples and batch_size is 16"):
        DivisibleBatches(x, y, batch_size=16, multiple_of=8, remainder="drop")


def test_x_only_yields_arrays_and_trim_removes_padding():
    x, _ = _ids(100)
    ds = DivisibleBatches(x, batch_size=16, multiple_of=8)
    batches = _batches(ds)
    assert all(isinstance(b, np.ndarray) for b in batches)
    assert ds.num_padding == 4
    predictions = np.concatenate(batches) * 2.0  # (104, 1): a stand-in model
    trimmed = ds.trim(predictions)
    np.testing.assert_array_equal(trimmed[:, 0], np.arange(100) * 2.0)
    nested = ds.trim({"a": predictions, "b": predictions[:, 0]})
    assert nested["a"].shape == (100, 1) and nested["b"].shape == (100,)


def test_trim_rejects_predictions_of_the_wrong_length():
    x, _ = _ids(100)
    ds = DivisibleBatches(x, batch_size=16, multiple_of=8)
    with pytest.raises(ValueError, match=r"100 rows .* yields 104 rows"):
        ds.trim(np.zeros((100, 3)))


def test_trim_after_drop_keeps_every_predicted_row():
    x, _ = _ids(100)
    ds = DivisibleBatches(x, batch_size=16, multiple_of=8, remainder="drop")
    assert ds.trim(np.zeros((96, 3))).shape == (96, 3)


def test_shuffle_is_a_deterministic_permutation_per_epoch():
    x, y = _ids(50)
    a = DivisibleBatches(x, y, batch_size=8, multiple_of=4, shuffle=True, seed=7)
    b = DivisibleBatches(x, y, batch_size=8, multiple_of=4, shuffle=True, seed=7)
    first = _real_ids(a)
    np.testing.assert_array_equal(np.sort(first), np.arange(50))
    assert not np.array_equal(first, np.arange(50))
    np.testing.assert_array_equal(first, _real_ids(b))
    a.on_epoch_end()
    second = _real_ids(a)
    np.testing.assert_array_equal(np.sort(second), np.arange(50))
    assert not np.array_equal(first, second)
    b.on_epoch_end()
    np.testing.assert_array_equal(second, _real_ids(b))
    # Within a batch, x and y stay paired.
    for bx, by, _ in _batches(a):
        np.testing.assert_array_equal(by, bx[:, 0].astype(np.int32) * 10)


def test_shuffle_depends_on_seed_and_off_means_in_order():
    x, y = _ids(50)
    s0 = DivisibleBatches(x, y, batch_size=8, shuffle=True, seed=0)
    s1 = DivisibleBatches(x, y, batch_size=8, shuffle=True, seed=1)
    assert not np.array_equal(_real_ids(s0), _real_ids(s1))
    plain = DivisibleBatches(x, y, batch_size=8)
    plain.on_epoch_end()
    np.testing.assert_array_equal(_real_ids(plain), np.arange(50))


def test_nested_inputs_are_batched_together():
    x, y = _ids(20)
    inputs = {"ids": x, "twice": x * 2.0}
    ds = DivisibleBatches(inputs, y, batch_size=8, multiple_of=4)
    bx, by, _ = ds[2]  # 20 = 2 * 8 + 4
    np.testing.assert_array_equal(bx["ids"][:, 0], [16, 17, 18, 19])
    np.testing.assert_array_equal(bx["twice"][:, 0], [32, 34, 36, 38])
    np.testing.assert_array_equal(by, [160, 170, 180, 190])


def test_batch_size_not_divisible_names_both_numbers():
    x, y = _ids(20)
    message = r"batch_size 12 is not divisible by multiple_of 8.* such as 8\b"
    with pytest.raises(ValueError, match=message):
        DivisibleBatches(x, y, batch_size=12, multiple_of=8)


def test_unknown_remainder_lists_choices():
    x, y = _ids(20)
    with pytest.raises(ValueError, match=r"'wrap'.*'pad'.*'drop'"):
        DivisibleBatches(x, y, batch_size=8, remainder="wrap")


@pytest.mark.parametrize("batch_size,multiple_of", [(0, 1), (8, 0), (-8, 2)])
def test_non_positive_sizes_are_rejected(batch_size, multiple_of):
    x, y = _ids(20)
    with pytest.raises(ValueError, match="must be a positive integer"):
        DivisibleBatches(x, y, batch_size=batch_size, multiple_of=multiple_of)


def test_mismatched_lengths_name_the_sizes():
    x, _ = _ids(20)
    with pytest.raises(ValueError, match=r"\[19, 20\]"):
        DivisibleBatches(x, np.zeros(19), batch_size=8)


def test_index_out_of_range_raises_index_error():
    x, y = _ids(20)
    ds = DivisibleBatches(x, y, batch_size=8)
    with pytest.raises(IndexError, match="index 3 .* 3 batches"):
        ds[3]


def test_pydataset_kwargs_reach_keras():
    x, y = _ids(20)
    ds = DivisibleBatches(x, y, batch_size=8, workers=2, max_queue_size=3)
    assert ds.workers == 2 and ds.max_queue_size == 3


@pytest.fixture
def data_parallel_8():
    mesh = keras.distribution.DeviceMesh((8,), ["data"], jax.devices()[:8])
    distribution = keras.distribution.DataParallel(device_mesh=mesh)
    keras.distribution.set_distribution(distribution)
    try:
        yield mesh
    finally:
        keras.distribution.set_distribution(None)


def _tiny_classifier(image_size, num_classes):
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((image_size, image_size, 3)),
            keras.layers.Conv2D(4, 3, strides=2, activation="relu", name="conv"),
            keras.layers.GlobalAveragePooling2D(name="pool"),
            keras.layers.Dense(num_classes, name="logits"),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(1e-2),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        weighted_metrics=["accuracy"],  # weighted: padding rows count 0
    )
    return model


def test_fit_evaluate_predict_under_data_parallel_are_exact(data_parallel_8):
    assert len(jax.devices()) >= 8, "conftest should simulate 8 CPU devices"
    x, y = load_shapes("train", image_size=16, num_examples=100)  # 100 = 6 * 16 + 4
    model = _tiny_classifier(16, 8)
    train = DivisibleBatches(x, y, batch_size=16, multiple_of=8, shuffle=True)
    history = model.fit(train, epochs=2, verbose=0, shuffle=False)
    assert np.isfinite(history.history["loss"]).all()

    labelled = DivisibleBatches(x, y, batch_size=16, multiple_of=8)
    metrics = model.evaluate(labelled, verbose=0, return_dict=True)
    inputs = DivisibleBatches(x, batch_size=16, multiple_of=8)
    logits = inputs.trim(model.predict(inputs, verbose=0))  # (100, 8)
    assert logits.shape == (100, 8)
    accuracy = np.mean(logits.argmax(axis=1) == y)
    np.testing.assert_allclose(metrics["accuracy"], accuracy, atol=1e-6)
    # The reported loss is the mean over the 100 real examples, not over the 104 rows
    # yielded (the padding rows weigh 0, the real ones 104 / 100): as on one device.
    losses = keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)
    expected_loss = float(np.mean(losses))
    np.testing.assert_allclose(metrics["loss"], expected_loss, rtol=1e-4)


def test_per_token_labels_get_per_token_padding_weights():
    x = np.zeros((10, 5), np.int32)
    y = np.ones((10, 5), np.int32)  # (N, T) next-token labels
    _, _, weights = DivisibleBatches(x, y, batch_size=8, multiple_of=4)[1]  # 2 real + 2 padding rows
    real = np.float32(12 / 10)  # (N + P) / N
    np.testing.assert_array_equal(weights, np.repeat([[real], [real], [0.0], [0.0]], 5, axis=1))
    one_hot = np.eye(3, dtype=np.float32)[np.arange(10) % 3]  # (N, C): loss is per example
    assert DivisibleBatches(x, one_hot, batch_size=8, multiple_of=4)[1][2].shape == (4,)
