"""``zoo train cnn`` (the CLI's own ``main``) in a subprocess that signals itself at chosen points.

    python tests/training/_train_worker.py CONFIG_JSON [--kill-at-commit N] [--signal-after-step N --signal INT|TERM|KILL]

CONFIG_JSON holds ``CNNTrainSettings`` fields, passed as the matching ``zoo train cnn`` flags.
``--kill-at-commit N`` SIGKILLs the process inside Orbax's save of step N, after every
file of the step (its commit marker included) is written into ``N.orbax-checkpoint-tmp``
and just before the rename that commits it: no Python cleanup, no atexit, no flush.
``--signal-after-step N`` sends the process a real SIGINT or SIGTERM right after step N,
as Ctrl-C or a scheduler's preemption notice would (the exit status is then the CLI's),
or a SIGKILL.
"""

import argparse
import json
import os
import signal
import sys

import keras


def kill_now():
    os.kill(os.getpid(), signal.SIGKILL)


class SignalAfterStep(keras.callbacks.Callback):
    """A real signal to this process right after optimizer step ``step`` (counted from the
    step ``fit`` starts at)."""

    def __init__(self, step, signal_number):
        super().__init__()
        self.step = step
        self.signal_number = signal_number

    def on_train_begin(self, logs=None):
        self._step = int(self.model.optimizer.iterations)

    def on_train_batch_end(self, batch, logs=None):
        self._step += 1
        if self._step == self.step:
            print(f"worker: {signal.Signals(self.signal_number).name} after step {self.step}", flush=True)
            os.kill(os.getpid(), self.signal_number)


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


def flags(config):
    """``zoo train cnn`` flags for ``CNNTrainSettings`` fields."""
    result = []
    for name, value in config.items():
        flag = "--" + name.replace("_", "-")
        if value is True:
            result.append(flag)
        elif value is not False and value is not None:
            result += [flag, str(value)]
    return result


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("config")
    parser.add_argument("--kill-at-commit", type=int, default=None)
    parser.add_argument("--signal-after-step", type=int, default=None)
    parser.add_argument("--signal", choices=["INT", "TERM", "KILL"], default="INT")
    args = parser.parse_args()
    import zoo.training.cnn
    from zoo.cli.main import main as zoo_main

    callbacks = []
    if args.signal_after_step is not None:
        callbacks.append(SignalAfterStep(args.signal_after_step, getattr(signal, f"SIG{args.signal}")))
    if args.kill_at_commit is not None:
        kill_at_commit(args.kill_at_commit)
    train = zoo.training.cnn.train
    zoo.training.cnn.train = lambda config, report=print: train(config, report=report, callbacks=callbacks)
    sys.exit(zoo_main(["train", "cnn", *flags(json.loads(args.config))]))


if __name__ == "__main__":
    main()
