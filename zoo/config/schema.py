"""One schema for every job: a settings dataclass whose fields carry their own flag, recipe
key, type, range, choices and help.

A field made with ``setting(...)`` is the single source of one setting's name: the
dataclass field ``batch_size`` is the command-line flag ``--batch-size`` and the recipe
key ``batch_size`` in its ``[train]`` section. ``add_flags`` generates the argparse
flags of a settings class, ``recipe_fields`` its TOML sections, ``check_value`` checks a
recipe value (or a Python argument, through ``check_settings``) against the same
metadata the flag's ``type=`` checks on the command line, with the same words.

Pure Python: the command line builds every parser from here without importing JAX.
"""

import argparse
import dataclasses

from zoo.config.types import NONE_WORD

RECIPE_SECTIONS = ("recipe", "target", "multihost")  # a recipe file's own sections (zoo.training.recipes._schema)
SECTIONS = (
    *RECIPE_SECTIONS,
    "model",
    "parallel",
    "data",
    "train",
    "checkpoint",
    "logging",
    "finetune",
    "generate",
    "export",
    "verify",
    "bench",
)


class SettingError(ValueError):
    """A value a setting does not allow; names the setting, the value and what is allowed."""


def setting(
    default,
    help,
    *,
    section,
    parse=None,
    choices=(),
    positional=False,
    metavar=None,
    store_true=False,
    const=None,
    booleans=None,
    required=False,
):
    """A settings field.

    Args:
        default: the job's default (None: "not set", the job decides).
        help: one line for ``--help``, the docs and the recipe reference.
        section: the recipe section (``SECTIONS``) the key sits in.
        parse: a ``zoo.config.types`` function: the flag's ``type=`` and the range a
            number must be in; None for free text (paths, names).
        choices: the allowed values (from ``zoo.config.choices``); None in it means
            "none" on the command line.
        positional: a positional argument on the command line (``zoo finetune PRESET``).
        store_true: a bool flag without a value (``--resume``).
        const: the value of the flag given alone (``--remat`` means ``--remat full``).
        booleans: ``{True: value, False: value}``: a recipe may write true / false for a
            choice (``remat = true`` is ``remat = "full"``).
        required: a recipe must give it (``[target] platform``); its default is unused.
    """
    if section not in SECTIONS:
        raise ValueError(f"unknown section {section!r}; one of {SECTIONS}")
    kind = bool if store_true or isinstance(default, bool) else getattr(parse, "kind", str)
    metadata = {
        "help": help,
        "section": section,
        "parse": parse,
        "choices": tuple(choices),
        "kind": kind,
        "positional": positional,
        "metavar": metavar,
        "const": const,
        "booleans": booleans,
        "required": required,
    }
    return dataclasses.field(default=default, metadata=metadata)


def settings_fields(settings_class):
    """The ``setting(...)`` fields of a settings class, in declaration order."""
    return [field for field in dataclasses.fields(settings_class) if "section" in field.metadata]


def flag_name(field):
    return "--" + field.name.replace("_", "-")


# --- the command line -------------------------------------------------------------


def add_flags(parser, settings_class, *, skip=(), defaults=None):
    """Add one argparse argument per field of ``settings_class`` (grouped by recipe
    section); ``defaults``: an instance whose values replace the class defaults."""
    defaults = defaults or settings_class()
    fields = [field for field in settings_fields(settings_class) if field.name not in skip]
    for field in (f for f in fields if f.metadata["positional"]):
        _add_flag(parser, field, getattr(defaults, field.name))
    for section in SECTIONS:
        in_section = [f for f in fields if f.metadata["section"] == section and not f.metadata["positional"]]
        group = parser.add_argument_group(f"[{section}]") if in_section else None
        for field in in_section:
            _add_flag(group, field, getattr(defaults, field.name))


def _add_flag(group, field, default):
    meta = field.metadata
    if meta["positional"]:
        group.add_argument(field.name, nargs="?" if default is not None else None, default=default, help=meta["help"])
        return
    options = {"dest": field.name, "default": default, "help": _help_text(meta, default)}
    if meta["kind"] is bool:
        action = "store_true" if default is False else argparse.BooleanOptionalAction
        group.add_argument(flag_name(field), action=action, **options)
        return
    if meta["choices"]:
        options["type"] = _choice_parser(field)
        options["metavar"] = "{" + ",".join(_word(choice) for choice in meta["choices"]) + "}"
    elif meta["parse"] is not None:
        options["type"] = meta["parse"]
        options["metavar"] = {int: "N", float: "X"}.get(meta["kind"])
    if meta["metavar"]:
        options["metavar"] = meta["metavar"]
    if meta["const"] is not None:
        options.update(nargs="?", const=meta["const"])
    group.add_argument(flag_name(field), **options)


def _help_text(meta, default):
    text = meta["help"].replace("%", "%%")  # argparse formats help with %
    if default is None or default == "" or meta["kind"] is bool:
        return text
    return f"{text} (default {_word(default)})"


def _word(value):
    if isinstance(value, (tuple, list)):
        return ",".join(map(_word, value))  # as a comma-separated flag takes it
    return NONE_WORD if value is None else str(value)


def _choice_parser(field):
    words = {_word(choice): choice for choice in field.metadata["choices"]}

    def parse(text):
        if text not in words:
            raise argparse.ArgumentTypeError(f"invalid choice: {text!r} (choose from {', '.join(map(repr, words))})")
        return words[text]

    parse.__name__ = field.name
    return parse


def from_args(settings_class, args, **values):
    """A settings instance from parsed flags (``values`` added or overriding)."""
    names = {field.name for field in dataclasses.fields(settings_class)}
    given = {name: value for name, value in vars(args).items() if name in names}
    return settings_class(**{**given, **values})


# --- checking a value (recipes, Python) -----------------------------------------------


def check_value(field, value, where):
    """``value`` checked against ``field``'s metadata (kind, choices, range) and converted
    (an int where a float is wanted); raises ``SettingError`` naming ``where``."""
    meta = field.metadata
    kind = meta["kind"]
    if meta["booleans"] and isinstance(value, bool):
        value = meta["booleans"][value]
    if value is None:
        if meta["choices"] and None not in meta["choices"] and field.default is not None:
            raise SettingError(f"{where}: expected {describe(field)}, got None")
        return value
    if isinstance(value, str) and value in getattr(meta["parse"], "words", ()):  # a word an int setting takes
        return value
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise SettingError(f"{where}: expected {describe(field)}, got {value!r} ({type(value).__name__})")
    if meta["choices"] and value not in meta["choices"]:
        raise SettingError(f"{where}: {value!r} is not one of the allowed values {[_word(c) for c in meta['choices']]}")
    if meta["parse"] is not None and kind in (int, float):
        try:
            meta["parse"](repr(value))
        except argparse.ArgumentTypeError:
            maximum = getattr(meta["parse"], "maximum", None)
            expected = f"an integer <= {maximum:,}" if maximum is not None and value > maximum else describe(field)
            raise SettingError(f"{where}: expected {expected}, got {value!r}") from None
    return value


def describe(field):
    """What a value of ``field`` must be, in words (error messages, the recipe reference)."""
    meta = field.metadata
    if meta["choices"]:
        also = "".join(f", or {str(flag).lower()} (= {value!r})" for flag, value in (meta["booleans"] or {}).items())
        return "one of " + ", ".join(_word(choice) for choice in meta["choices"]) + also
    if meta["kind"] is bool:
        return "true or false"
    return getattr(meta["parse"], "expected", "a string")


def check_settings(settings):
    """Every field of a settings instance checked (``__post_init__`` of the job settings):
    Python callers get the errors the command line gives."""
    name = type(settings).__name__
    for field in settings_fields(type(settings)):
        setattr(settings, field.name, check_value(field, getattr(settings, field.name), f"{name}.{field.name}"))


# --- recipes -------------------------------------------------------------------------


def recipe_fields(settings_class):
    """``{section: {key: field}}``: the recipe sections and keys of a job's settings."""
    sections = {}
    for field in settings_fields(settings_class):
        sections.setdefault(field.metadata["section"], {})[field.name] = field
    return {section: sections[section] for section in SECTIONS if section in sections}
