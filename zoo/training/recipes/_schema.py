"""The recipe file schema: the recipe-only sections, and the job sections generated from
the job settings (``zoo.config.settings``), and checked parsing into them.

A recipe is a TOML file. ``[recipe]``, ``[target]`` and ``[multihost]`` are the
recipe's own (one dataclass each below); every other section and key is a field of a
job's settings dataclass under the same name (``[train] batch_size`` is
``GPTTrainSettings.batch_size`` and ``--batch-size``): the section dataclasses below are
generated from them (``job_sections``). ``parse_sections`` refuses anything else, naming
the file, the section, the key, the value and what is allowed; a key that was renamed
gets its new name (``RENAMED_KEYS``). A key left out of the file is ``None`` here, which
means "the job's own default" (the settings dataclass is the one source of defaults).
"""

import dataclasses
import difflib
import os
import tomllib

from zoo.config import choices, settings, types
from zoo.config.schema import SettingError, describe, recipe_fields, setting
from zoo.config.schema import check_value as check_setting

JOBS = ("train_cnn", "pretrain_gpt", "finetune")
# recipe job -> its settings (zoo.training.recipes._jobs runs them)
JOB_SETTINGS = {
    "train_cnn": settings.CNNTrainSettings,
    "pretrain_gpt": settings.GPTTrainSettings,
    "finetune": settings.FinetuneSettings,
}
# "section.key" of an earlier release -> the key that replaced it (docs/architecture.md, Vocabulary)
RENAMED_KEYS = {
    "model.name": "[model] config_name (GPT), [model] preset (finetune)",
    "parallel.strategy": "[parallel] layout",
    "parallel.attention": "[parallel] context_attention",
    "train.global_batch": "[train] batch_size",
    "checkpoint.dir": "[checkpoint] checkpoint_dir",
    "checkpoint.every": "[checkpoint] checkpoint_every",
    "logging.every_steps": "[logging] report_every",
}


class RecipeError(ValueError):
    """A recipe that cannot be read, or does not fit its target or job; names file and values."""


@dataclasses.dataclass(frozen=True)
class RecipeSection:
    """[recipe]: what runs."""

    job: str = setting(None, "which job the recipe drives", section="recipe", choices=JOBS, required=True)
    description: str | None = setting(None, "one line shown by zoo recipe check", section="recipe")


@dataclasses.dataclass(frozen=True)
class TargetSection:
    """[target]: the machines the recipe is sized for."""

    platform: str = setting(
        None, "the device kind JAX must find at run time", section="target", choices=choices.PLATFORMS, required=True
    )
    hosts: int = setting(1, "JAX processes, one per host", section="target", parse=types.positive_int)
    devices_per_host: int = setting(
        None,
        "accelerators (or simulated CPU devices) per host",
        section="target",
        parse=types.device_count,
        required=True,
    )
    device_memory_gib: float | None = setting(
        None, "memory per device; unset: not checked", section="target", parse=types.positive_float
    )
    device: str | None = setting(
        None,
        "accelerator kind zoo plan times the step on (zoo.planning.DEVICES: h100, tpu-v5e, ...); unset: by platform",
        section="target",
    )

    @property
    def devices(self):
        return self.hosts * self.devices_per_host


@dataclasses.dataclass(frozen=True)
class MultihostSection:
    """[multihost]: joining the processes (``zoo.distribution.multihost.initialize``)."""

    coordinator_address: str | None = setting(
        None, '"host:port" of process 0; unset: the environment or the cluster', section="multihost"
    )
    timeout_s: float = setting(
        300.0, "wait for the coordinator this long, then fail", section="multihost", parse=types.at_least_one_second
    )


def job_sections():
    """``{section: frozen dataclass}`` with every key any recipe job's settings have in that
    section (default None: the job's own); generated, so a new settings field is a new
    recipe key under the same name."""
    merged = {}  # section -> {key: metadata}
    for settings_class in JOB_SETTINGS.values():
        for section, fields in recipe_fields(settings_class).items():
            for name, field in fields.items():
                known = merged.setdefault(section, {}).setdefault(name, dict(field.metadata))
                known["choices"] = tuple(
                    dict.fromkeys(known["choices"] + field.metadata["choices"])
                )  # each job checks its own
    return {
        section: dataclasses.make_dataclass(
            f"{section.title()}Section",
            [(name, object, dataclasses.field(default=None, metadata=meta)) for name, meta in keys.items()],
            frozen=True,
        )
        for section, keys in merged.items()
    }


SECTIONS = {"recipe": RecipeSection, "target": TargetSection, "multihost": MultihostSection, **job_sections()}


def read_toml(path):
    """The parsed TOML document at ``path``; a file that is missing, a folder, unreadable,
    not UTF-8 or not TOML raises ``RecipeError`` naming it."""
    try:
        with open(path, "rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError:
        raise RecipeError(f"{path}: no such recipe file") from None
    except IsADirectoryError:
        raise RecipeError(f"{path}: is a folder; give a recipe file in it: {_toml_files(path)}") from None
    except OSError as error:
        raise RecipeError(f"{path}: cannot be read ({error.strerror or error})") from None
    except UnicodeDecodeError as error:
        raise RecipeError(
            f"{path}: not UTF-8 text (byte {error.object[error.start : error.end]!r} at offset {error.start}); save the recipe as UTF-8"
        ) from None
    except tomllib.TOMLDecodeError as error:
        raise RecipeError(f"{path}: not valid TOML: {error}") from None


def _toml_files(folder):
    names = sorted(name for name in os.listdir(folder) if name.endswith(".toml"))
    if not names:
        return f"there is none ({os.path.join(folder, '<job>.toml')})"
    return ", ".join(os.path.join(folder, name) for name in names[:4]) + (", ..." if len(names) > 4 else "")


def apply_overrides(document, overrides, path):
    """``document`` with ``{"section.key": value}`` set (values from ``parse_override``)."""
    document = {name: dict(values) if isinstance(values, dict) else values for name, values in document.items()}
    for dotted, value in overrides.items():
        section, dot, name = dotted.partition(".")
        if not dot or not name:
            raise RecipeError(f"{path}: override {dotted!r} must be written section.key, e.g. train.epochs")
        document.setdefault(section, {})[name] = value
    return document


def parse_override(text):
    """``"train.epochs=1"`` -> ``("train.epochs", 1)``: the value read as TOML, else kept as text."""
    dotted, sep, value = text.partition("=")
    if not sep:
        raise RecipeError(f"override {text!r} must be written section.key=value, e.g. train.epochs=1")
    try:
        return dotted.strip(), tomllib.loads(f"value = {value.strip()}")["value"]
    except tomllib.TOMLDecodeError:
        return dotted.strip(), value.strip()


def parse_sections(document, path):
    """``({section name: section dataclass}, given)`` from a TOML document.

    ``given``: the ``"section.key"`` names the document set. Raises ``RecipeError`` for
    an unknown section or key, a missing required key, or a bad value.
    """
    _check_names(document, SECTIONS, path, "section", "")
    sections, given = {}, set()
    for name, section_class in SECTIONS.items():
        values = document.get(name, {})
        if not isinstance(values, dict):
            raise RecipeError(f"{path}: [{name}] must be a table (a [{name}] section), got {values!r}")
        sections[name] = _parse_section(section_class, name, values, path)
        given.update(f"{name}.{key_name}" for key_name in values)
    _check_device_total(sections["target"], path)
    return sections, frozenset(given)


def _check_device_total(target, path):
    """Each of ``hosts`` and ``devices_per_host`` has its own range; their product, the devices
    planned for and passed on to XLA, is bounded by the same ``types.MAX_DEVICES``."""
    if target.hosts * target.devices_per_host > types.MAX_DEVICES:
        raise RecipeError(
            f"{path}: [target] hosts = {target.hosts:,} x devices_per_host = {target.devices_per_host:,} "
            f"= {target.devices:,} devices, above the {types.MAX_DEVICES:,} the zoo plans and simulates "
            f"(zoo.config.types.MAX_DEVICES)"
        )


def _parse_section(section_class, name, values, path):
    fields = {field.name: field for field in dataclasses.fields(section_class)}
    _check_names(values, fields, path, "key", f" in [{name}]")
    missing = [f for f in fields.values() if f.metadata.get("required") and f.name not in values]
    if missing:
        raise RecipeError(f"{path}: [{name}] needs the key {missing[0].name!r} ({describe(missing[0])})")
    checked = {
        key_name: check_value(fields[key_name], value, f"{path}: [{name}] {key_name}")
        for key_name, value in values.items()
    }
    return section_class(**checked)


def _check_names(values, allowed, path, what, where):
    for name in values:
        section = where.strip()[4:-1] if where else name
        renamed = RENAMED_KEYS.get(f"{section}.{name}") if where else None
        if renamed:
            raise RecipeError(f"{path}: {what} {name!r}{where} was renamed: write {renamed} (docs/recipes.md)")
        if name not in allowed:
            close = difflib.get_close_matches(name, list(allowed), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise RecipeError(f"{path}: unknown {what} {name!r}{where}{hint}; allowed: {', '.join(allowed)}")


def check_value(field, value, where):
    """``value`` checked and converted as the settings schema says (``zoo.config.schema``);
    raises ``RecipeError`` naming ``where``."""
    try:
        return check_setting(field, value, where)
    except SettingError as error:
        raise RecipeError(str(error)) from None
