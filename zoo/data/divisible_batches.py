"""Batches whose sizes are all divisible by the data-parallel size.

Under a ``keras.distribution`` the batch axis is split over the devices of the
data axis, so every batch, the last partial one included, must have a size
divisible by that axis; otherwise JAX raises an indivisible-shape error.
``DivisibleBatches`` feeds ``model.fit`` / ``evaluate`` / ``predict`` with
batches that satisfy this, by dropping or by padding the last partial batch.

Padding must not change what ``evaluate`` reports, or the validation loss of the same
weights would depend on the mesh (issue 27: 4.988 on data=8, 5.015 on data=1). Keras
averages a ``"sum_over_batch_size"`` loss over every row of a batch, padding included
(the sum of the weighted losses over the batch's size), and then over the batches by
their row counts: over an epoch, the sum of the weighted losses over the N + P rows it
yielded. So padding rows weigh 0 and real rows (N + P) / N: the loss is the mean over the
N real examples, as on one device. Weighted metrics (the sum of weighted values over the
sum of the weights) do not change with that common factor.
"""

import keras
import numpy as np

REMAINDER_CHOICES = ("pad", "drop")


class DivisibleBatches(keras.utils.PyDataset):
    """A `keras.utils.PyDataset` whose every batch size divides by `multiple_of`.

    With ``batch_size=B``, ``multiple_of=M`` and ``N`` examples there are
    ``N // B`` full batches and one partial batch of ``r = N % B`` rows
    (if ``r > 0``). ``remainder`` decides what happens to that partial batch:

    - ``"drop"``: it is dropped; batches are ``(x, y)``, or ``x`` when y is None.
    - ``"pad"``: it is padded up to the next multiple of ``M`` (``P = (-N) mod M``
      padding rows, copies of its last real row). With y, every batch is
      ``(x, y, sample_weight)`` with weight 0.0 for padding and ``real_weight``
      = (N + P) / N for real rows (1.0 when nothing is padded), so that
      ``evaluate``'s loss (``"sum_over_batch_size"``) and weighted metrics are
      the means over the N real examples, whatever M is. Without y (for
      ``predict``), batches are ``x`` alone; ``trim(predictions)`` removes the
      padding rows. Meant for evaluation: training data should drop.

    Args:
        x: array (N, ...) or a nested structure (dict, list, tuple) of arrays
            sharing the leading dimension N.
        y: same kinds as x, or None.
        batch_size: rows per full batch; must be divisible by `multiple_of`.
        multiple_of: the data-parallel size every batch must divide by.
        remainder: "pad" or "drop".
        shuffle: reshuffle the examples at every epoch end, deterministically
            from `seed`. Keep False for `predict`, whose outputs follow the
            (shuffled) example order.
        seed: integer seed for the shuffles.
        **pydataset_kwargs: `workers`, `use_multiprocessing`, `max_queue_size`.
    """

    def __init__(
        self,
        x,
        y=None,
        *,
        batch_size,
        multiple_of=1,
        remainder="pad",
        shuffle=False,
        seed=0,
        **pydataset_kwargs,
    ):
        super().__init__(**pydataset_kwargs)
        _check_batching(batch_size, multiple_of, remainder)
        self.x = x
        self.y = y
        self.batch_size = int(batch_size)
        self.multiple_of = int(multiple_of)
        self.remainder = remainder
        self.shuffle = shuffle
        self.seed = seed
        self._x = keras.tree.map_structure(np.asarray, x)  # arrays (N, ...)
        self._y = None if y is None else keras.tree.map_structure(np.asarray, y)
        self._num_examples = _leading_dim(self._x, self._y)
        if remainder == "drop" and self._num_examples < self.batch_size:
            raise ValueError(
                f"remainder='drop' needs at least one full batch, but there are "
                f"{self._num_examples} examples and batch_size is {self.batch_size}."
            )
        self._epoch = 0
        self._order = self._epoch_order()  # (N,) example indices, this epoch

    @property
    def num_examples(self):
        """Real (unpadded) examples, N."""
        return self._num_examples

    @property
    def real_weight(self):
        """Sample weight of a real row under "pad": (N + num_padding) / N (1.0 for "drop")."""
        return (self._num_examples + self.num_padding) / self._num_examples

    @property
    def num_batches(self):
        """Batches per epoch: N // B for "drop", ceil(N / B) for "pad"."""
        full, partial = divmod(self._num_examples, self.batch_size)
        return full + (1 if partial and self.remainder == "pad" else 0)

    @property
    def num_padding(self):
        """Padding rows per epoch: (-N) mod M for "pad", 0 for "drop"."""
        if self.remainder != "pad":
            return 0
        return -self._num_examples % self.multiple_of

    def __len__(self):
        return self.num_batches

    def __getitem__(self, index):
        if not 0 <= index < self.num_batches:
            raise IndexError(f"batch index {index} is out of range for {self.num_batches} batches.")
        rows, num_real = self._batch_rows(index)  # (b,), b % M == 0
        x = _take(self._x, rows)
        if self._y is None:
            return x
        y = _take(self._y, rows)
        if self.remainder == "drop":
            return x, y
        return x, y, _padding_weights(len(rows), num_real, y, self.real_weight)

    def on_epoch_end(self):
        """Advance to the next epoch; draws a new example order if shuffling."""
        self._epoch += 1
        if self.shuffle:
            self._order = self._epoch_order()

    def trim(self, predictions):
        """Drop the padding rows from predictions concatenated over all batches.

        Args:
            predictions: array (N + num_padding, ...) or a nested structure of
                such arrays, as returned by ``model.predict(self)``. (With
                remainder="drop": (num_batches * batch_size, ...), returned
                as is, since the dropped examples were never predicted.)

        Returns:
            The same structure with arrays of leading dimension N.
        """
        yielded = self.num_batches * self.batch_size  # "drop": all real rows
        kept = yielded
        if self.remainder == "pad":
            yielded, kept = self._num_examples + self.num_padding, self._num_examples
        return keras.tree.map_structure(lambda p: _trim_rows(p, yielded, kept), predictions)

    def _epoch_order(self):
        if not self.shuffle:
            return np.arange(self._num_examples)
        rng = np.random.default_rng([self.seed, self._epoch])
        return rng.permutation(self._num_examples)

    def _batch_rows(self, index):
        """Example indices (b,) of batch `index`, padded, and its real count."""
        start = index * self.batch_size
        rows = self._order[start : start + self.batch_size]  # (<= B,)
        num_real = len(rows)
        pad = -num_real % self.multiple_of  # 0 except for a partial batch
        rows = np.concatenate([rows, np.repeat(rows[-1:], pad)])  # (b,)
        return rows, num_real


def _check_batching(batch_size, multiple_of, remainder):
    if remainder not in REMAINDER_CHOICES:
        raise ValueError(f"Unknown remainder {remainder!r}; choose one of {REMAINDER_CHOICES}.")
    for name, value in (("batch_size", batch_size), ("multiple_of", multiple_of)):
        if not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}.")
    if batch_size % multiple_of:
        nearest = batch_size - batch_size % multiple_of or multiple_of
        raise ValueError(
            f"batch_size {batch_size} is not divisible by multiple_of "
            f"{multiple_of}; use a batch size that is a multiple of "
            f"{multiple_of}, such as {nearest}."
        )


def _leading_dim(x, y):
    """N, the shared leading dimension of every array in x and y."""
    leaves = keras.tree.flatten(x) + ([] if y is None else keras.tree.flatten(y))
    if not leaves:
        raise ValueError("x holds no arrays.")
    sizes = sorted({len(leaf) for leaf in leaves})
    if len(sizes) > 1:
        raise ValueError(f"x and y must share their leading (example) dimension, got sizes {sizes}.")
    if sizes[0] == 0:
        raise ValueError("x has 0 examples; DivisibleBatches needs at least one.")
    return sizes[0]


def _take(structure, rows):
    return keras.tree.map_structure(lambda a: a[rows], structure)  # (b, ...)


def _padding_weights(batch_rows, num_real, y, real_weight):
    """``real_weight`` for real rows, 0.0 for padding: ``(b,)``, or ``y``'s shape for per-token integer labels
    ``(b, T)``.

    Keras does not broadcast ``(b,)`` weights against per-token losses ``(b, T)``;
    one-hot (float) labels keep ``(b,)`` weights since their loss is per example.
    """
    weights = np.zeros((batch_rows,), np.float32)  # (b,)
    weights[:num_real] = real_weight
    if isinstance(y, np.ndarray) and y.ndim > 1 and np.issubdtype(y.dtype, np.integer):
        weights = np.ascontiguousarray(np.broadcast_to(weights.reshape((batch_rows,) + (1,) * (y.ndim - 1)), y.shape))
    return weights


def _trim_rows(predictions, yielded, kept):
    if len(predictions) != yielded:
        raise ValueError(
            f"predictions have {len(predictions)} rows but this dataset yields "
            f"{yielded} rows per epoch; pass the output of model.predict on "
            f"this same DivisibleBatches."
        )
    return predictions[:kept]
