"""Tests for the embedded shapes dataset (zoo.data.shapes)."""

import hashlib

import numpy as np
import pytest

from zoo.data import SHAPE_CLASSES, load_shapes

NUM_CLASSES = len(SHAPE_CLASSES)
SPLITS = ("train", "validation", "test")


def _image_hashes(x):
    return {hashlib.sha1(image.tobytes()).hexdigest() for image in x}


def _foreground_fraction(x):
    """Per image (N,), the share of pixels far from the median (background) colour."""
    background = np.median(x.reshape(len(x), -1, 3), axis=1)  # (N, 3)
    distance = np.linalg.norm(x - background[:, None, None, :], axis=-1)  # (N, S, S)
    return (distance > 0.25).mean(axis=(1, 2))


def test_classes_are_distinct_names():
    assert 6 <= NUM_CLASSES <= 8
    assert len(set(SHAPE_CLASSES)) == NUM_CLASSES


@pytest.mark.parametrize("image_size", [16, 33, 64])
def test_shapes_dtypes_and_ranges(image_size):
    x, y = load_shapes("train", image_size=image_size, num_examples=50)
    assert x.shape == (50, image_size, image_size, 3)
    assert x.dtype == np.float32 and y.dtype == np.int32
    assert y.shape == (50,)
    assert x.min() >= 0.0 and x.max() <= 1.0
    assert y.min() >= 0 and y.max() < NUM_CLASSES


@pytest.mark.parametrize("image_size", [16, 33, 64])
def test_every_image_shows_a_visible_shape(image_size):
    # Contrast and size rules: the shape covers a real but minority share of pixels.
    x, _ = load_shapes("validation", image_size=image_size, num_examples=256)
    fraction = _foreground_fraction(x)  # (N,)
    assert fraction.min() > 0.02, fraction.min()
    assert fraction.max() < 0.5, fraction.max()


def test_default_split_sizes():
    sizes = {s: len(load_shapes(s, image_size=16)[1]) for s in SPLITS}
    assert sizes == {"train": 2048, "validation": 512, "test": 512}


def test_same_arguments_give_identical_arrays():
    x1, y1 = load_shapes("validation", image_size=24, num_examples=40, seed=3)
    x2, y2 = load_shapes("validation", image_size=24, num_examples=40, seed=3)
    np.testing.assert_array_equal(x1, x2)
    np.testing.assert_array_equal(y1, y2)


def test_seed_and_image_size_change_the_data():
    x0, _ = load_shapes("train", image_size=24, num_examples=40, seed=0)
    x1, _ = load_shapes("train", image_size=24, num_examples=40, seed=1)
    assert not np.array_equal(x0, x1)
    assert not _image_hashes(x0) & _image_hashes(x1)


def test_splits_share_no_images():
    hashes = {s: _image_hashes(load_shapes(s, image_size=16)[0]) for s in SPLITS}
    assert len(hashes["train"]) == 2048  # no duplicates within a split either
    assert not hashes["train"] & hashes["validation"]
    assert not hashes["train"] & hashes["test"]
    assert not hashes["validation"] & hashes["test"]


@pytest.mark.parametrize("num_examples", [2048, 100, 5])
def test_classes_are_balanced_and_shuffled(num_examples):
    _, y = load_shapes("train", image_size=16, num_examples=num_examples)
    counts = np.bincount(y, minlength=NUM_CLASSES)
    assert counts.max() - counts.min() <= 1, counts
    assert counts.sum() == num_examples
    if num_examples > NUM_CLASSES:
        assert not np.array_equal(y, np.arange(num_examples) % NUM_CLASSES)


def test_unknown_split_lists_valid_splits():
    with pytest.raises(ValueError, match="'bogus'") as info:
        load_shapes("bogus")
    for split in SPLITS:
        assert split in str(info.value)


@pytest.mark.parametrize("image_size", [15, 0, -3])
def test_small_image_size_names_the_value(image_size):
    with pytest.raises(ValueError, match=rf"got {image_size}\b"):
        load_shapes("train", image_size=image_size)


@pytest.mark.parametrize("num_examples", [0, -1])
def test_bad_num_examples_names_the_value(num_examples):
    with pytest.raises(ValueError, match=rf"got {num_examples}\b"):
        load_shapes("train", image_size=16, num_examples=num_examples)


def test_negative_seed_names_the_value():
    with pytest.raises(ValueError, match=r"got -2\b"):
        load_shapes("train", image_size=16, seed=-2)


def _fft_features(x):
    """Translation- and colour-free features (N, F): |FFT| of the foreground map."""
    background = np.median(x.reshape(len(x), -1, 3), axis=1)  # (N, 3)
    shape_map = np.linalg.norm(x - background[:, None, None, :], axis=-1)  # (N, S, S)
    shape_map -= shape_map.mean(axis=(1, 2), keepdims=True)
    magnitude = np.abs(np.fft.rfft2(shape_map)).reshape(len(x), -1)
    return np.log1p(magnitude)


def _nearest_centroid(f_train, y_train, f_test):
    """Predicted classes (N,) for f_test, by the closest class mean of f_train."""
    classes = range(NUM_CLASSES)
    centroids = np.stack([f_train[y_train == k].mean(axis=0) for k in classes])
    distance = ((f_test[:, None, :] - centroids[None]) ** 2).sum(axis=-1)  # (N, K)
    return distance.argmin(axis=1)


def test_every_class_is_learnable_from_shift_invariant_features():
    # Nearest centroid on standardised |FFT| features: no training loop, still
    # far above the 1/8 chance level (0.90 overall, worst class 0.69 when
    # written). Per-class recall catches two classes drawn alike.
    x_train, y_train = load_shapes("train", image_size=32, num_examples=1024)
    x_test, y_test = load_shapes("test", image_size=32)
    f_train, f_test = _fft_features(x_train), _fft_features(x_test)
    mean, std = f_train.mean(axis=0), f_train.std(axis=0) + 1e-6
    f_train, f_test = (f_train - mean) / std, (f_test - mean) / std
    predicted = _nearest_centroid(f_train, y_train, f_test)
    recall = [np.mean(predicted[y_test == k] == k) for k in range(NUM_CLASSES)]
    assert np.mean(predicted == y_test) > 0.8
    assert min(recall) > 0.5, dict(zip(SHAPE_CLASSES, recall))


def test_mean_colour_does_not_reveal_the_class():
    # The colours are nuisances: a nearest-centroid on mean colour stays near chance.
    x_train, y_train = load_shapes("train", image_size=32, num_examples=1024)
    x_test, y_test = load_shapes("test", image_size=32)
    f_train, f_test = x_train.mean(axis=(1, 2)), x_test.mean(axis=(1, 2))  # (N, 3)
    accuracy = np.mean(_nearest_centroid(f_train, y_train, f_test) == y_test)
    assert accuracy < 0.25, accuracy
