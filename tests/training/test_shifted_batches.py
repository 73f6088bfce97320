"""``ShiftedBatches``, the ViT job's random shifts: every image is the original moved by at
most s pixels each way with its edge pixels repeated, each shift in range occurs, batches
are reproducible from (seed, epoch, index), and the job refuses a shift over half the side."""

import types

import numpy as np
import pytest

from zoo.data import DivisibleBatches
from zoo.training import classifiers
from zoo.training.shifted_batches import ShiftedBatches

SIDE = 6
MAX_SHIFT = 2
EXAMPLES = 192  # draws: all (2 MAX_SHIFT + 1)^2 shifts occur


def _moved(image, dy, dx):
    """The expected image: pixel (i, j) is image's (i - dy, j - dx), clamped to the border."""
    out = np.empty_like(image)
    for i in range(SIDE):
        for j in range(SIDE):
            out[i, j] = image[min(max(i - dy, 0), SIDE - 1), min(max(j - dx, 0), SIDE - 1)]
    return out


def _batches(seed=0):
    x = np.arange(EXAMPLES * SIDE * SIDE * 2, dtype=np.float32).reshape(
        EXAMPLES, SIDE, SIDE, 2
    )  # every pixel its own value
    y = np.arange(EXAMPLES, dtype=np.int32)
    return x, ShiftedBatches(DivisibleBatches(x, y, batch_size=32, remainder="drop"), MAX_SHIFT, seed=seed)


def test_each_image_is_its_original_moved_within_range_with_the_edges_repeated():
    x, batches = _batches()
    seen = set()
    for index in range(len(batches)):
        shifted, labels = batches[index]
        for image, label in zip(shifted, labels):
            matches = [
                (dy, dx)
                for dy in range(-MAX_SHIFT, MAX_SHIFT + 1)
                for dx in range(-MAX_SHIFT, MAX_SHIFT + 1)
                if np.array_equal(image, _moved(x[label], dy, dx))
            ]
            assert len(matches) == 1, f"example {label} is no shift of its image within {MAX_SHIFT} pixels"
            seen.add(matches[0])
    assert len(seen) == (2 * MAX_SHIFT + 1) ** 2  # the draws reach all 25 shifts


def test_shifts_are_reproducible_and_new_each_epoch():
    _, first = _batches(seed=3)
    _, again = _batches(seed=3)
    np.testing.assert_array_equal(first[1][0], again[1][0])
    epoch_0 = first[1][0]
    first.on_epoch_end()
    assert not np.array_equal(first[1][0], epoch_0)
    _, unshifted = _batches()
    unshifted.max_shift = 0
    np.testing.assert_array_equal(unshifted[0][0], unshifted.batches[0][0])


def test_the_vit_job_shifts_an_eighth_of_the_side_and_refuses_over_half():
    def shifted(shift):
        settings = types.SimpleNamespace(random_shift=shift, seed=0)
        return classifiers._shifted(settings, None, (32, 32), report=lambda line: None)

    assert shifted(None).max_shift == 4 and shifted(16).max_shift == 16
    with pytest.raises(ValueError, match="random_shift 17 is more than half the image side 32: at most 16 pixels"):
        shifted(17)
