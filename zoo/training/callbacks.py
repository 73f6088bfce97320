"""Callbacks shared by the training jobs."""

import time

import keras


class Throughput(keras.callbacks.Callback):
    """Measures training examples (images, tokens: ``unit``) per second for each epoch
    (validation excluded).

    The clock runs from the start of the epoch to the end of its last training batch;
    epoch 1 includes XLA compilation.
    """

    def __init__(self, global_batch_size, report=print, unit="images"):
        super().__init__()
        self.global_batch_size = global_batch_size  # examples per step, in ``unit``
        self.report = report
        self.unit = unit
        self.per_epoch = []  # examples/s, one entry per epoch

    def on_epoch_begin(self, epoch, logs=None):
        self._start = time.perf_counter()
        self._end = self._start
        self._examples = 0

    def on_train_batch_end(self, batch, logs=None):
        self._examples += self.global_batch_size
        self._end = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        rate = self._examples / max(self._end - self._start, 1e-9)
        self.per_epoch.append(rate)
        note = " (includes compilation)" if epoch == 0 else ""
        self.report(f"epoch {epoch + 1}: {rate:,.1f} {self.unit}/s over {self._examples} {self.unit}{note}")
