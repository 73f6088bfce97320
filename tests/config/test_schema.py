"""One schema: every job's flags and recipe keys are generated from its settings dataclass
under the same names; every field has help, a type and a default; an old recipe key is
refused naming its new one; the parser answers ``--help`` and bad flags without JAX."""

import argparse
import dataclasses
import os
import pathlib
import subprocess
import sys

import pytest

from zoo.cli.main import build_parser
from zoo.config import schema, settings
from zoo.training.recipes._schema import (
    JOB_SETTINGS,
    RENAMED_KEYS,
    SECTIONS,
    RecipeError,
    parse_sections,
)

ROOT = pathlib.Path(__file__).resolve().parents[2]
JOB_COMMANDS = {  # settings class -> the command whose flags it generates
    settings.CNNTrainSettings: ["train", "cnn"],
    settings.GPTTrainSettings: ["train", "gpt"],
    settings.EncoderTrainSettings: ["train", "encoder"],
    settings.ViTTrainSettings: ["train", "vit"],
    settings.VerifySettings: ["verify", "cnn"],
    settings.GenerateSettings: ["generate"],
    settings.FinetuneSettings: ["finetune", "small_cnn_shapes"],
}
TARGET = {"platform": "cpu", "devices_per_host": 8}


@pytest.mark.parametrize("settings_class", list(JOB_COMMANDS), ids=lambda c: c.__name__)
def test_every_field_has_help_a_type_and_a_default(settings_class):
    for field in schema.settings_fields(settings_class):
        meta = field.metadata
        assert meta["help"].strip(), f"{settings_class.__name__}.{field.name} has no help"
        assert meta["kind"] in (int, float, bool, str), field.name
        assert field.default is not dataclasses.MISSING, field.name
        assert meta["kind"] is str or meta["parse"] is not None or meta["kind"] is bool or meta["choices"], (
            f"{field.name}: a number without a range"
        )
    assert {f.name for f in dataclasses.fields(settings_class)} == {
        f.name for f in schema.settings_fields(settings_class)
    }, "every field is a setting"


@pytest.mark.parametrize("settings_class", list(JOB_COMMANDS), ids=lambda c: c.__name__)
def test_the_command_line_is_generated_from_the_settings(settings_class, capsys):
    """Each field is the flag of its name (``batch_size`` -> ``--batch-size``) with the
    field's default; parsing no flags gives the settings' defaults."""
    argv = JOB_COMMANDS[settings_class]
    args = build_parser().parse_args(argv)
    config = schema.from_args(settings_class, args)
    assert config == settings_class(**({"preset": "small_cnn_shapes"} if "preset" in vars(args) else {}))
    help_text = _help(argv[:2] if argv[0] != "finetune" else ["finetune"], capsys)
    for field in schema.settings_fields(settings_class):
        if not field.metadata["positional"]:
            assert schema.flag_name(field) in help_text, (
                f"{schema.flag_name(field)} missing from zoo {' '.join(argv)} --help"
            )


def _help(argv, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args([*argv, "--help"])
    return capsys.readouterr().out


@pytest.mark.parametrize("job", sorted(JOB_SETTINGS))
def test_the_recipe_sections_are_the_settings_fields(job):
    """A recipe job's keys are exactly its settings' fields, in the sections they name."""
    settings_class = JOB_SETTINGS[job]
    for section, fields in schema.recipe_fields(settings_class).items():
        recipe_keys = {f.name for f in dataclasses.fields(SECTIONS[section])}
        assert set(fields) <= recipe_keys, (section, set(fields) - recipe_keys)
    every_key = {
        f.name
        for name, section in SECTIONS.items()
        if name not in ("recipe", "target", "multihost")
        for f in dataclasses.fields(section)
    }
    every_field = {f.name for settings_class in JOB_SETTINGS.values() for f in schema.settings_fields(settings_class)}
    assert every_key == every_field


@pytest.mark.parametrize("old", sorted(RENAMED_KEYS))
def test_a_recipe_with_an_old_key_names_the_new_one(old):
    section, _, key = old.partition(".")
    document = {"recipe": {"job": "pretrain_gpt"}, "target": TARGET, section: {key: 1}}
    with pytest.raises(
        RecipeError,
        match=rf"old.toml: key '{key}' in \[{section}\] was renamed: write .*{RENAMED_KEYS[old].split(' ')[1]}",
    ):
        parse_sections(document, "old.toml")


def test_python_and_the_command_line_refuse_a_value_in_the_same_words(capsys):
    with pytest.raises(ValueError, match=r"GPTTrainSettings.batch_size: expected an integer >= 1, got 0"):
        settings.GPTTrainSettings(batch_size=0)
    with pytest.raises(
        ValueError, match=r"GPTTrainSettings.layout: 'zero3' is not one of the allowed values \['single', 'data'"
    ):
        settings.GPTTrainSettings(layout="zero3")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "gpt", "--batch-size", "0"])
    assert "argument --batch-size: expected an integer >= 1, got '0'" in capsys.readouterr().err
    with pytest.raises(RecipeError, match=r"\[train\] batch_size: expected an integer >= 1, got 0"):
        parse_sections({"recipe": {"job": "pretrain_gpt"}, "target": TARGET, "train": {"batch_size": 0}}, "r.toml")


def test_help_and_usage_errors_answer_without_jax():
    """The ``zoo`` command parses before it loads anything heavy (zoo/__init__.py)."""
    script = pathlib.Path(sys.executable).with_name("zoo")
    if not script.exists():
        pytest.skip(f"the zoo console script is not installed beside {sys.executable}")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for argv, status in (
        (["--help"], 0),
        (["train", "gpt", "--help"], 0),
        (["train", "gpt", "--mesh", "data=2", "--layout", "nope"], 2),
    ):
        done = subprocess.run(
            [sys.executable, "-X", "importtime", str(script), *argv],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        imported = {
            line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")
        }
        assert done.returncode == status, done.stderr[-2000:]
        assert not imported & {"jax", "keras", "numpy", "tensorflow_datasets"}, (
            f"zoo {' '.join(argv)} imported {sorted(imported & {'jax', 'keras', 'numpy'})}"
        )


def test_docs_hold_the_generated_settings_reference():
    from zoo.config.reference import reference_lines

    generated = "\n".join(reference_lines())
    assert generated in (ROOT / "docs" / "recipes.md").read_text(), (
        "docs/recipes.md: paste the output of python -m zoo.config.reference"
    )


def test_every_flag_of_every_command_has_help():
    def missing(parser, path):
        for action in parser._actions:  # argparse keeps no public list of a parser's arguments
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield from missing(sub, [*path, name])
            elif not action.help:
                yield f"{' '.join(path)} {'/'.join(action.option_strings) or action.dest}"

    assert not list(missing(build_parser(), ["zoo"]))


def test_an_old_settings_class_name_names_its_new_one():
    with pytest.raises(ImportError, match="^zoo.config.settings.GPTTrainConfig was renamed GPTTrainSettings$"):
        from zoo.config.settings import GPTTrainConfig  # noqa: F401
    import zoo.config.bench_settings as bench_settings

    with pytest.raises(ImportError, match="MoEBenchConfig was renamed MoEBenchSettings"):
        bench_settings.MoEBenchConfig  # noqa: B018
    with pytest.raises(AttributeError, match="has no attribute 'NoSuchSettings'"):
        bench_settings.NoSuchSettings  # noqa: B018
