"""Where training is in its data, and ``fit`` continued from there.

Each epoch's example order is a pure function of ``(seed, epoch)`` (``DivisibleBatches``
draws ``default_rng([seed, epoch]).permutation(N)``), so a position ``(epoch, batch)`` says
exactly which batches are still to come: ``ResumableBatches`` serves them and
``fit_from`` runs the rest of the interrupted epoch, then the remaining whole epochs.
"""

import dataclasses

import keras


@dataclasses.dataclass(frozen=True)
class TrainingPosition:
    """How far training has got: the next batch to train is batch ``batch`` of epoch ``epoch``.

    ``step`` counts optimizer steps over all epochs; positions are normalised so that
    ``batch`` is always less than the batches per epoch (a finished epoch is ``(epoch + 1, 0)``).
    """

    epoch: int = 0  # 0-based epoch in progress
    batch: int = 0  # batches of that epoch already trained
    step: int = 0  # optimizer steps taken in all

    @classmethod
    def after(cls, step, steps_per_epoch):
        """The position after ``step`` optimizer steps of ``steps_per_epoch`` each."""
        if steps_per_epoch < 1 or step < 0:
            raise ValueError(f"need steps_per_epoch >= 1 and step >= 0, got {steps_per_epoch} and {step}")
        epoch, batch = divmod(step, steps_per_epoch)
        return cls(epoch=epoch, batch=batch, step=step)

    def as_dict(self):
        return dataclasses.asdict(self)


class ResumableBatches(keras.utils.PyDataset):
    """The batches of a fresh ``DivisibleBatches`` from ``(epoch, start_batch)`` on.

    Epoch ``epoch`` yields its batches ``start_batch, start_batch + 1, ...`` (in the order
    that epoch has in an uninterrupted run); every later epoch yields all of its batches.
    The epoch is set by ``fit``'s own epoch number (``fit_from`` passes it through
    ``set_epoch``), not by counting ``on_epoch_end`` calls: Keras also calls that once
    after peeking at a batch to build the model, which would shift every order by one.

    Args:
        batches: a ``DivisibleBatches`` (or any PyDataset whose ``on_epoch_end`` draws
            the next epoch's order) that has not yet been iterated: it is at epoch 0.
        epoch: the epoch to start in.
        start_batch: batches of that epoch to skip, ``0 <= start_batch < len(batches)``.
    """

    def __init__(self, batches, *, epoch=0, start_batch=0):
        super().__init__()
        if not 0 <= start_batch < len(batches) or epoch < 0:
            raise ValueError(
                f"cannot start at batch {start_batch} of epoch {epoch}: an epoch has {len(batches)} batches "
                f"(valid start batches 0..{len(batches) - 1}) and epochs count from 0"
            )
        self.batches = batches
        self.start = (epoch, start_batch)
        self._batches_epoch = 0  # the epoch whose order `batches` holds
        self.set_epoch(epoch)

    def set_epoch(self, epoch):
        """Serve epoch ``epoch`` (never an earlier one than already served)."""
        if epoch < self._batches_epoch:
            raise ValueError(f"cannot go back to epoch {epoch} after epoch {self._batches_epoch}")
        while self._batches_epoch < epoch:
            self.batches.on_epoch_end()  # draws the order of the next epoch
            self._batches_epoch += 1
        self.epoch = epoch
        self.start_batch = self.start[1] if epoch == self.start[0] else 0

    @property
    def num_batches(self):
        return len(self.batches) - self.start_batch

    def __len__(self):
        return self.num_batches

    def __getitem__(self, index):
        if not 0 <= index < self.num_batches:
            raise IndexError(f"batch index {index} is out of range for {self.num_batches} batches")
        return self.batches[self.start_batch + index]

    def on_epoch_end(self):
        """Nothing: epochs follow ``set_epoch`` (see the class docstring)."""


class _FollowEpochs(keras.callbacks.Callback):
    """Tells a ``ResumableBatches`` which epoch ``fit`` is starting (before any batch is drawn)."""

    def __init__(self, data):
        super().__init__()
        self.data = data

    def on_epoch_begin(self, epoch, logs=None):
        self.data.set_epoch(epoch)


def fit_from(model, data, *, epochs, callbacks=(), **fit_kwargs):
    """``model.fit`` over ``data`` (a ``ResumableBatches``) from its position to ``epochs``.

    Keras fixes the batches per epoch when ``fit`` starts, so a partly done epoch gets
    a ``fit`` call of its own (``initial_epoch=epoch, epochs=epoch + 1``) and the whole
    epochs after it another. Returns the merged ``History.history`` dict (the interrupted
    epoch's metrics cover only its remaining batches).
    """
    if getattr(model.optimizer, "use_ema", False):
        # fit ends by overwriting the weights with their moving averages: a split fit would do it mid-run
        raise ValueError("fit_from cannot continue a run whose optimizer has use_ema=True")
    callbacks = [_FollowEpochs(data), *callbacks]
    history = {}
    if data.start_batch and data.epoch < epochs:
        _merge(
            history,
            model.fit(
                data, initial_epoch=data.epoch, epochs=data.epoch + 1, shuffle=False, callbacks=callbacks, **fit_kwargs
            ),
        )
        data.set_epoch(data.epoch + 1)
    if data.epoch < epochs:
        _merge(
            history,
            model.fit(data, initial_epoch=data.epoch, epochs=epochs, shuffle=False, callbacks=callbacks, **fit_kwargs),
        )
    return history


def _merge(history, result):
    for name, values in result.history.items():
        history.setdefault(name, []).extend(values)
