"""The data position: each epoch's order is fixed by (seed, epoch), and a resumed fit
serves exactly the batches an uninterrupted one would have left to serve."""

import keras
import numpy as np
import pytest

from tests.training._tiny import batches
from zoo.training.checkpoints import ResumableBatches, TrainingPosition, fit_from


def test_position_after_a_number_of_steps():
    assert TrainingPosition.after(7, 4) == TrainingPosition(epoch=1, batch=3, step=7)
    assert TrainingPosition.after(8, 4) == TrainingPosition(epoch=2, batch=0, step=8)  # a finished epoch
    with pytest.raises(ValueError, match="steps_per_epoch >= 1"):
        TrainingPosition.after(3, 0)


def _epoch_labels(epoch):
    """The labels of every batch of ``epoch`` in a plain DivisibleBatches advanced ``epoch`` times."""
    plain = batches()
    for _ in range(epoch):
        plain.on_epoch_end()
    return [plain[index][1] for index in range(len(plain))]


def test_resumable_batches_serve_the_rest_of_an_epoch_then_whole_epochs():
    data = ResumableBatches(batches(), epoch=2, start_batch=1)
    assert len(data) == 3
    expected = _epoch_labels(2)[1:]
    assert all(np.array_equal(data[i][1], expected[i]) for i in range(3))
    data.on_epoch_end()  # Keras' extra call after peeking at a batch: no effect
    assert data.epoch == 2 and len(data) == 3
    data.set_epoch(3)
    assert len(data) == 4
    assert all(np.array_equal(data[i][1], label) for i, label in enumerate(_epoch_labels(3)))
    assert not np.array_equal(_epoch_labels(2)[0], _epoch_labels(3)[0])  # epochs really differ
    with pytest.raises(ValueError, match="cannot go back to epoch 2 after epoch 3"):
        data.set_epoch(2)


def test_a_start_batch_outside_the_epoch_is_refused():
    with pytest.raises(
        ValueError, match=r"cannot start at batch 4 of epoch 0: an epoch has 4 batches \(valid start batches 0..3\)"
    ):
        ResumableBatches(batches(), start_batch=4)


class _Recorded(ResumableBatches):
    """Records (epoch, batch) of every batch served while training runs."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.served, self.recording = [], False

    def __getitem__(self, index):
        if self.recording:
            self.served.append((self.epoch, self.start_batch + index))
        return super().__getitem__(index)


class _Record(keras.callbacks.Callback):
    def __init__(self, data):
        super().__init__()
        self.data = data

    def on_train_begin(self, logs=None):
        self.data.recording = True  # after Keras' peek at a batch to build the model


def test_fit_from_trains_on_exactly_the_remaining_batches():
    inputs = keras.Input((8, 8, 3))
    model = keras.Model(inputs, keras.layers.Dense(4)(keras.layers.Flatten()(inputs)))
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    data = _Recorded(batches(), epoch=1, start_batch=2)
    history = fit_from(model, data, epochs=3, callbacks=[_Record(data)], verbose=0)
    assert data.served == [(1, 2), (1, 3), (2, 0), (2, 1), (2, 2), (2, 3)]
    assert len(history["loss"]) == 2  # the rest of epoch 2 and all of epoch 3
    assert int(model.optimizer.iterations) == 6
