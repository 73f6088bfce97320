"""``ShiftedBatches``: training images moved by a few random pixels, new shifts every step.

A ViT has no convolution: nothing in it makes a shape at one place look like the same
shape two pixels away, so on a small dataset it learns where the training shapes sit
instead of what they are (``zoo train vit`` on ``shapes``: 0.580 held-out accuracy with
``--random-shift 0``, 0.773 with its default shifts; docs/models.md). Random shifts show
it every shape at many positions.
"""

import keras
import numpy as np


def shift_images(images, max_shift, rng):
    """Each image of ``images`` (B, H, W, C) moved by (dy, dx), each drawn uniformly from
    [-max_shift, max_shift] by ``rng``; the rows and columns it uncovers repeat the edge
    pixels (the background, where it reaches the border). Returns a new (B, H, W, C) array."""
    count, height, width = images.shape[:3]
    dy, dx = rng.integers(-max_shift, max_shift + 1, size=(2, count))  # (B,) each
    rows = np.clip(np.arange(height)[None, :] - dy[:, None], 0, height - 1)  # (B, H): output row i <- row i - dy
    cols = np.clip(np.arange(width)[None, :] - dx[:, None], 0, width - 1)  # (B, W)
    return images[np.arange(count)[:, None, None], rows[:, :, None], cols[:, None, :]]  # (B, H, W, C)


class ShiftedBatches(keras.utils.PyDataset):
    """The batches of ``batches`` (a ``DivisibleBatches`` yielding ``(x, y)`` or
    ``(x, y, sample_weight)``, x (B, H, W, C)) with every image shifted by up to
    ``max_shift`` pixels each way (``shift_images``).

    The shifts of batch i in epoch e come from ``np.random.default_rng([seed, e, i])``:
    a run is reproducible, and batch i's shifts do not depend on the batches read before it.

    Args:
        batches: the training batches; their epoch ends are passed on (reshuffling).
        max_shift: s >= 0 pixels; 0 yields the batches unchanged.
        seed: integer seed of the shifts.
    """

    def __init__(self, batches, max_shift, seed=0):
        super().__init__()
        if not isinstance(max_shift, (int, np.integer)) or max_shift < 0:
            raise ValueError(f"max_shift must be an integer >= 0 pixels, got {max_shift!r}")
        self.batches = batches
        self.max_shift = int(max_shift)
        self.seed = seed
        self._epoch = 0

    @property
    def num_batches(self):
        return len(self.batches)

    def __len__(self):
        return len(self.batches)

    def __getitem__(self, index):
        x, *rest = self.batches[index]
        if self.max_shift:
            x = shift_images(x, self.max_shift, np.random.default_rng([self.seed, self._epoch, index]))
        return (x, *rest)

    def on_epoch_end(self):
        self._epoch += 1
        self.batches.on_epoch_end()
