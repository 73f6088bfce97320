"""``SynchronousSteps`` keeps every step's callbacks in the main thread (fit, its validation
pass, predict): Keras' thread pool fetching a step's arrays while the main thread dispatches
the next one aborts XLA:CPU with several devices."""

import threading

import keras
import numpy as np
import pytest

from zoo.training.callbacks import SynchronousSteps


class ThreadRecorder(keras.callbacks.Callback):
    """Records the thread each batch-end hook runs in; ``async_safe`` so that it does not,
    itself, make Keras dispatch synchronously."""

    async_safe = True

    def __init__(self):
        super().__init__()
        self.threads = set()

    def on_train_batch_end(self, batch, logs=None):
        self.threads.add(("train", threading.current_thread() is threading.main_thread()))

    def on_test_batch_end(self, batch, logs=None):
        self.threads.add(("test", threading.current_thread() is threading.main_thread()))

    def on_predict_batch_end(self, batch, logs=None):
        self.threads.add(("predict", threading.current_thread() is threading.main_thread()))


@pytest.mark.parametrize("synchronous", [False, True])
def test_every_step_callback_runs_in_the_main_thread(synchronous):
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile("sgd", "mse")
    x, y = np.ones((8, 4), np.float32), np.ones((8, 2), np.float32)
    recorder = ThreadRecorder()
    callbacks = [recorder, SynchronousSteps()] if synchronous else [recorder]
    model.fit(x, y, batch_size=4, validation_data=(x, y), epochs=1, verbose=0, callbacks=callbacks)
    model.predict(x, batch_size=4, verbose=0, callbacks=callbacks)
    in_main = {(hook, True) for hook in ("train", "test", "predict")}
    if synchronous:
        assert recorder.threads == in_main
    else:  # Keras' own way: the pool (the test would prove nothing if Keras stopped using it)
        assert recorder.threads.isdisjoint(in_main)
