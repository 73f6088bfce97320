"""The recipe file schema: one dataclass per TOML section, and checked parsing into them.

A recipe is a TOML file whose sections and keys are exactly the fields below. Every
field's ``metadata`` says what a value must be (``kind``, ``choices``, ``minimum``,
``required``); ``parse_sections`` refuses anything else, naming the file, the section,
the key, the value and what is allowed. A key left out of the file is ``None`` here,
which means "the job's own default" (the job config dataclass is the one source of
defaults); the few recipe-only keys (``[target]``, ``[multihost]``) carry their own.
"""

import dataclasses
import difflib
import os
import tomllib

from zoo.distribution.context_parallel import ATTENTIONS, BALANCES
from zoo.distribution.strategies import STRATEGIES
from zoo.layers.transformer_block import REMATS

JOBS = ("train_cnn", "pretrain_gpt", "finetune")
PLATFORMS = ("cpu", "gpu", "tpu")
PRECISIONS = ("float32", "mixed_bfloat16")  # Keras dtype policies the jobs train under
FINETUNE_METHODS = ("frozen", "lora", "full")


class RecipeError(ValueError):
    """A recipe that cannot be read, or does not fit its target or job; names file and values."""


def key(kind, *, default=None, choices=(), minimum=None, required=False, booleans=None):
    """A schema field: ``kind`` (int, float, bool or str) and its constraints.

    ``booleans``: ``{True: value, False: value}`` for a str field that also takes true
    and false, read as those values (``remat = true`` is ``remat = "full"``).
    """
    metadata = {"kind": kind, "choices": tuple(choices), "minimum": minimum, "required": required, "booleans": booleans}
    return dataclasses.field(default=default, metadata=metadata)


@dataclasses.dataclass(frozen=True)
class RecipeSection:
    """[recipe]: what runs."""

    job: str = key(str, choices=JOBS, required=True)  # which job function the recipe drives
    description: str | None = key(str)  # one line shown by ``zoo recipe check``


@dataclasses.dataclass(frozen=True)
class TargetSection:
    """[target]: the machines the recipe is sized for."""

    platform: str = key(str, choices=PLATFORMS, required=True)  # the device kind JAX must find at run time
    hosts: int = key(int, default=1, minimum=1)  # JAX processes, one per host
    devices_per_host: int = key(int, required=True, minimum=1)  # accelerators (or simulated CPU devices) per host
    device_memory_gib: float | None = key(float, minimum=0.001)  # memory per device; None: not checked
    device: str | None = key(str)  # accelerator kind zoo plan times the step on (zoo.planning.DEVICES: h100, tpu-v5e, ...); None: by platform

    @property
    def devices(self):
        return self.hosts * self.devices_per_host


@dataclasses.dataclass(frozen=True)
class MultihostSection:
    """[multihost]: joining the processes (``zoo.distribution.multihost.initialize``)."""

    coordinator_address: str | None = key(str)  # "host:port" of process 0; None: environment or cluster
    timeout_s: float = key(float, default=300.0, minimum=1)  # wait for the coordinator this long, then fail


@dataclasses.dataclass(frozen=True)
class ModelSection:
    """[model]: which model."""

    name: str | None = key(str)  # GPT: a GPT_CONFIGS name; CNN: small_cnn; finetune: the preset
    dropout: float | None = key(float, minimum=0.0)  # overrides the model config's dropout


@dataclasses.dataclass(frozen=True)
class ParallelSection:
    """[parallel]: how the model and batch are laid out over the devices."""

    strategy: str | None = key(str, choices=STRATEGIES)  # see docs/models.md and zoo.distribution.strategies
    mesh: str | None = key(str)  # "data=2,model=4"; one axis may be -1; None: the strategy's default
    attention: str | None = key(str, choices=ATTENTIONS)  # context strategy: the sequence-parallel kernel
    balance: str | None = key(str, choices=[b for b in BALANCES if b is not None])  # context strategy: causal load balancing; None: none


@dataclasses.dataclass(frozen=True)
class DataSection:
    """[data]: the training data."""

    dataset: str | None = key(str)  # a zoo.data dataset name (zoo data list)
    data_dir: str | None = key(str)  # TFDS folder; None: $ZOO_DATA_DIR, $TFDS_DATA_DIR, ~/tensorflow_datasets
    image_size: int | None = key(int, minimum=1)  # images: side length; None: the dataset's own
    train_examples: int | None = key(int, minimum=1)  # use only the first N training examples
    test_examples: int | None = key(int, minimum=1)  # fine-tuning: evaluate on the first N test examples


@dataclasses.dataclass(frozen=True)
class TrainSection:
    """[train]: the optimisation."""

    global_batch: int | None = key(int, minimum=1)  # examples per step over all devices
    sequence_length: int | None = key(int, minimum=1)  # tokens per example
    precision: str | None = key(str, choices=PRECISIONS)  # compute dtype policy
    remat: str | None = key(str, choices=REMATS, booleans={True: "full", False: "none"})  # recompute block activations in the backward pass: none | full | dots_saveable (true = full)
    gradient_accumulation_steps: int | None = key(int, minimum=1)  # steps per optimizer update
    epochs: int | None = key(int, minimum=1)  # passes over the training data
    steps_per_epoch: int | None = key(int, minimum=1)  # None: the whole split
    learning_rate: float | None = key(float, minimum=0.0)  # peak learning rate
    weight_decay: float | None = key(float, minimum=0.0)  # AdamW weight decay
    seed: int | None = key(int, minimum=0)  # initialisation, dropout and shuffling
    output: str | None = key(str)  # where the trained model is saved (.keras)


@dataclasses.dataclass(frozen=True)
class CheckpointSection:
    """[checkpoint]: saving and resuming (zoo.training.checkpoints)."""

    dir: str | None = key(str)  # checkpoint directory; None: no checkpoints
    every: int | None = key(int, minimum=1)  # save every N optimizer steps
    keep: int | None = key(int, minimum=1)  # keep the newest N complete checkpoints
    resume: bool | None = key(bool)  # continue from the newest complete checkpoint in dir


@dataclasses.dataclass(frozen=True)
class LoggingSection:
    """[logging]: throughput/MFU reports and profiling."""

    every_steps: int | None = key(int, minimum=1)  # report throughput and MFU every N steps
    profile_dir: str | None = key(str)  # write a JAX profiler trace here; None: no trace
    profile_steps: int | None = key(int, minimum=1)  # how many steps the trace covers (from step 2, after compilation)
    peak_tflops: float | None = key(float, minimum=0.001)  # peak dense TFLOP/s per device for MFU


@dataclasses.dataclass(frozen=True)
class FinetuneSection:
    """[finetune]: what a fine-tune trains."""

    method: str | None = key(str, choices=FINETUNE_METHODS)  # frozen backbone, LoRA adapters or everything
    lora_rank: int | None = key(int, minimum=1)  # LoRA rank r
    lora_alpha: float | None = key(float, minimum=0.001)  # LoRA scale alpha (update scaled by alpha / r)


SECTIONS = {
    "recipe": RecipeSection,
    "target": TargetSection,
    "multihost": MultihostSection,
    "model": ModelSection,
    "parallel": ParallelSection,
    "data": DataSection,
    "train": TrainSection,
    "checkpoint": CheckpointSection,
    "logging": LoggingSection,
    "finetune": FinetuneSection,
}


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
        raise RecipeError(f"{path}: not UTF-8 text (byte {error.object[error.start:error.end]!r} at offset {error.start}); save the recipe as UTF-8") from None
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
    return sections, frozenset(given)


def _parse_section(section_class, name, values, path):
    fields = {field.name: field for field in dataclasses.fields(section_class)}
    _check_names(values, fields, path, "key", f" in [{name}]")
    missing = [f for f in fields.values() if f.metadata["required"] and f.name not in values]
    if missing:
        raise RecipeError(f"{path}: [{name}] needs the key {missing[0].name!r} ({_describe(missing[0].metadata)})")
    checked = {key_name: check_value(fields[key_name], value, f"{path}: [{name}] {key_name}") for key_name, value in values.items()}
    return section_class(**checked)


def _check_names(values, allowed, path, what, where):
    for name in values:
        if name not in allowed:
            close = difflib.get_close_matches(name, list(allowed), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise RecipeError(f"{path}: unknown {what} {name!r}{where}{hint}; allowed: {', '.join(allowed)}")


def check_value(field, value, where):
    """``value`` converted to the field's kind; raises ``RecipeError`` naming ``where``."""
    meta = field.metadata
    kind = meta["kind"]
    if meta["booleans"] and isinstance(value, bool):
        value = meta["booleans"][value]
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    elif not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise RecipeError(f"{where}: expected {_describe(meta)}, got {value!r} ({type(value).__name__})")
    if meta["choices"] and value not in meta["choices"]:
        also = " (or true, false)" if meta["booleans"] else ""
        raise RecipeError(f"{where}: {value!r} is not one of the allowed values {list(meta['choices'])}{also}")
    if kind in (int, float) and meta["minimum"] is not None and value < meta["minimum"]:
        raise RecipeError(f"{where}: expected {_describe(meta)}, got {value!r}")
    return value


def _describe(meta):
    names = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}
    text = names[meta["kind"]]
    if meta["choices"]:
        text += f", one of {list(meta['choices'])}"
    if meta["minimum"] is not None and meta["kind"] in (int, float):
        text += f" >= {meta['minimum']}"
    if meta["booleans"]:
        text += ", " + ", ".join(f"or {str(flag).lower()} (= {value!r})" for flag, value in meta["booleans"].items())
    return text
