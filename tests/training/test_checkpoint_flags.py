"""The checkpoint flags ``zoo train`` takes map onto ``TrainConfig`` fields."""

import argparse
import dataclasses

import pytest

from zoo.cli import checkpoint_flags
from zoo.training.cnn import TrainConfig


def _parse(argv):
    parser = argparse.ArgumentParser(prog="zoo train")
    checkpoint_flags.add_arguments(parser)
    args = parser.parse_args(argv)
    fields = {field.name for field in dataclasses.fields(TrainConfig)}
    assert set(vars(args)) <= fields, "every flag is a TrainConfig field"
    return TrainConfig(**vars(args))


def test_flags_fill_the_train_config():
    config = _parse(["--checkpoint-dir", "runs/ckpt", "--checkpoint-every", "7", "--keep", "2", "--resume"])
    assert (config.checkpoint_dir, config.checkpoint_every, config.keep, config.resume) == ("runs/ckpt", 7, 2, True)


def test_defaults_are_the_train_config_defaults():
    assert _parse([]) == TrainConfig()


@pytest.mark.parametrize("flag", ["--checkpoint-every", "--keep"])
def test_a_count_below_one_is_refused(flag, capsys):
    with pytest.raises(SystemExit):
        _parse([flag, "0"])
    assert "expected an integer >= 1, got '0'" in capsys.readouterr().err
