"""Flags of an earlier release name the flag that replaced it (``zoo.cli._errors.RENAMED_FLAGS``),
and ``zoo plan`` given a GPT config's name where the recipe goes names ``--config-name``.

Each case runs ``zoo.cli.main.main`` in-process; the renamed flags are refused while the
command line is parsed, before any device or model, so the file runs in about a second.
"""

import argparse

import pytest

from zoo.cli import main as cli
from zoo.cli._errors import RENAMED_FLAGS

USAGE = 2

# (argv, the error line's message)
CASES = [
    (["train", "cnn", "--distribution", "model"], "--distribution was renamed --layout"),
    (["train", "gpt", "--strategy", "fsdp"], "--strategy was renamed --layout"),
    (["train", "gpt", "--seq-len", "64"], "--seq-len was renamed --sequence-length"),
    (["train", "gpt", "--seq-len=64"], "--seq-len was renamed --sequence-length"),
    (["train", "gpt", "--attention", "ulysses"], "--attention was renamed --context-attention"),
    (["train", "encoder", "--seq-len", "64"], "--seq-len was renamed --sequence-length"),
    (["train", "vit", "--distribution", "data"], "--distribution was renamed --layout"),
    (
        ["verify", "--distribution", "model", "cnn"],
        "--distribution was renamed --layout",
    ),  # before the positional's own check
    (
        ["finetune", "small_cnn_shapes", "--strategy", "lora"],
        "--strategy was renamed --method",
    ),  # finetune's was what trains
    (["finetune", "small_cnn_shapes", "--distribution", "data"], "--distribution was renamed --layout"),
    (["comms", "mlp", "--sequence-parallel"], "--sequence-parallel was renamed --megatron-sp"),
    (["comms", "mlp", "--seq-len", "128"], "--seq-len was renamed --sequence-length"),
    (["comms", "cnn", "--distribution", "model"], "--distribution was renamed --layout"),
    (["plan", "--strategy", "fsdp"], "--strategy was renamed --layout"),
    (["bench", "tp", "--seq-len", "128"], "--seq-len was renamed --sequence-length"),
    # where the new flag does not exist, the old one is only unknown
    (["generate", "--seq-len", "3"], "unrecognized arguments: --seq-len 3"),  # and nothing near it to suggest
    # an unknown word: the subcommand's own help, the nearest flag; no flag is abbreviated
    (["train", "gpt", "--epcohs", "1"], "unrecognized arguments: --epcohs 1 (did you mean --epochs?)"),
    (["train", "gpt", "--epoch", "1"], "unrecognized arguments: --epoch 1 (did you mean --epochs?)"),
    (["bench", "step", "--step", "3"], "unrecognized arguments: --step 3 (did you mean --steps?)"),
    (["train", "gpt", "--sequence-parallel"], "--sequence-parallel was renamed --layout tp+sp"),  # a layout now
]


def _run(argv, capsys):
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def _assert_usage_line(code, err, message):
    lines = err.splitlines()
    assert code == USAGE, err
    assert len(lines) == 1 and lines[0].startswith(f"zoo: error: {message} (see zoo"), err


@pytest.mark.parametrize("argv, message", CASES, ids=[" ".join(argv) for argv, _ in CASES])
def test_old_flag_names_the_new_one(argv, message, capsys):
    code, out, err = _run(argv, capsys)
    _assert_usage_line(code, err, message)
    assert out == ""  # refused while parsing: not even the device line


def _leaves(parser, path=()):
    """``(words, parser)`` of every (sub)command that takes flags."""
    subparsers = [action for action in parser._actions if isinstance(action, argparse._SubParsersAction)]
    if not subparsers:
        yield list(path), parser
        return
    for name, child in subparsers[0].choices.items():
        yield from _leaves(child, (*path, name))


def test_every_command_with_the_new_flag_names_it(capsys):
    """Each old flag, in every (sub)command that has one of its new flags, is answered
    with the first of them that command has, in the error line of that command."""
    checked = 0
    for words, parser in _leaves(cli.build_parser()):
        options = set(parser._option_string_actions)
        for old, new_flags in RENAMED_FLAGS.items():
            new = next((flag for flag in new_flags if flag in options), None)
            if new is None:
                continue
            code, _, err = _run([*words, old], capsys)
            _assert_usage_line(code, err, f"{old} was renamed {new}")
            assert f"(see {parser.prog} --help)" in err
            checked += 1
    assert checked >= 30  # train x4, verify, finetune, comms, plan, the bench commands with --sequence-length ...


def test_new_flags_still_parse():
    args = cli.build_parser().parse_args(
        ["comms", "mlp", "--megatron-sp", "--sequence-length", "64", "--layout", "model"]
    )
    assert args.megatron_sp and args.sequence_length == 64 and args.layout == "model"
    args = cli.build_parser().parse_args(["finetune", "small_cnn_shapes", "--method", "lora", "--layout", "data"])
    assert (args.method, args.layout) == ("lora", "data")


def test_an_old_flag_after_double_dash_is_not_a_flag(capsys):
    code, _, err = _run(["train", "cnn", "--", "--distribution"], capsys)
    assert code == USAGE and "was renamed" not in err


@pytest.mark.parametrize(
    "argv", [["plan", "--auto", "gpt_1b", "--batch-size", "32"], ["plan", "gpt_tiny"]], ids=" ".join
)
def test_plan_with_a_config_name_for_a_recipe_names_config_name(argv, capsys):
    name = argv[-3] if "--batch-size" in argv else argv[-1]
    code, _, err = _run(argv, capsys)
    assert code == USAGE, err
    assert err.splitlines()[-1] == f"zoo: error: {name} is no recipe file; did you mean --config-name {name}?"


def test_plan_with_a_file_named_like_a_config_reads_the_file(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "gpt_tiny").write_text("not toml [")
    code, _, err = _run(["plan", "gpt_tiny"], capsys)
    assert code == USAGE and "did you mean --config-name" not in err, err


def test_an_unknown_flag_points_to_the_subcommands_own_help(capsys):
    code, _, err = _run(["train", "gpt", "--epcohs", "1"], capsys)
    assert code == USAGE and err.strip().endswith("(see zoo train gpt --help)"), err
