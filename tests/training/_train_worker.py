"""``zoo.training.cnn.train`` in a subprocess that can SIGKILL itself at chosen points.

    python tests/training/_train_worker.py CONFIG_JSON [--kill-after-step N] [--kill-at-commit N]

CONFIG_JSON holds ``TrainConfig`` fields. ``--kill-after-step N`` kills the process right
after optimizer step N (between checkpoints); ``--kill-at-commit N`` kills it inside
Orbax's save of step N, after every file of the step (its commit marker included) is
written into ``N.orbax-checkpoint-tmp`` and just before the rename that commits it.
The kills are real ``SIGKILL``s: no Python cleanup, no atexit, no flush.
"""

import argparse
import json
import os
import signal

import keras


def kill_now():
    os.kill(os.getpid(), signal.SIGKILL)


class KillAfterStep(keras.callbacks.Callback):
    """SIGKILL right after optimizer step ``step`` (counted from the step ``fit`` starts at)."""

    def __init__(self, step):
        super().__init__()
        self.step = step

    def on_train_begin(self, logs=None):
        self._step = int(self.model.optimizer.iterations)

    def on_train_batch_end(self, batch, logs=None):
        self._step += 1
        if self._step == self.step:
            print(f"worker: SIGKILL after step {self.step}", flush=True)
            kill_now()


def kill_at_commit(step):
    """Make Orbax's commit rename of step ``step`` kill the process instead."""
    from orbax.checkpoint._src.path import async_path

    rename = async_path.rename
    doomed = f"{step}.orbax-checkpoint-tmp"

    async def rename_or_die(source, target):
        if os.path.basename(str(source)) == doomed:
            print(f"worker: SIGKILL while committing {source}", flush=True)
            kill_now()
        return await rename(source, target)

    async_path.rename = rename_or_die


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("config")
    parser.add_argument("--kill-after-step", type=int, default=None)
    parser.add_argument("--kill-at-commit", type=int, default=None)
    args = parser.parse_args()
    from zoo.training.cnn import TrainConfig, train

    callbacks = [] if args.kill_after_step is None else [KillAfterStep(args.kill_after_step)]
    if args.kill_at_commit is not None:
        kill_at_commit(args.kill_at_commit)
    train(TrainConfig(**json.loads(args.config)), report=lambda line: print(line, flush=True), callbacks=callbacks)


if __name__ == "__main__":
    main()
