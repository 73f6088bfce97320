"""The presets that ship with keras-zoo, under ``zoo/presets/assets/<name>/``.

Each was trained by ``recipes/presets/make_presets.py`` on an embedded offline dataset;
its ``metadata.json`` records the dataset, class names, parameter count and accuracy.
"""

import dataclasses
import os
import re

from zoo.presets._format import METADATA_FILE, PresetError, read_json

ASSETS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "assets")
NAME_PATTERN = re.compile(r"[a-z0-9][a-z0-9_]*")  # plain words: no separator, no dot, no "..": never a path


@dataclasses.dataclass(frozen=True)
class PresetSpec:
    """One shipped preset."""

    name: str  # the name given to zoo.presets.from_preset
    model: str  # the model class
    dataset: str  # the zoo.data dataset it was trained on
    description: str


PRESETS = {
    spec.name: spec
    for spec in (
        PresetSpec(
            "small_cnn_shapes",
            "SmallCNN",
            "shapes",
            "SmallCNN (filters 8/16/32, hidden 64) classifying the 8 procedural shapes at 32x32 RGB",
        ),
        PresetSpec(
            "gpt_tiny_python_docs",
            "GPTCausalLM",
            "python_docs",
            "GPTCausalLM gpt_tiny (2 layers, width 32, GQA) predicting the next byte of the Python docs; 64 positions",
        ),
        PresetSpec(
            "encoder_tiny_topics",
            "TransformerEncoderClassifier",
            "python_docs_topics",
            "TransformerEncoderClassifier encoder_tiny telling 4 pydoc topics apart from 64-byte windows",
        ),
        PresetSpec(
            "vit_tiny_shapes",
            "ViTClassifier",
            "shapes",
            "ViTClassifier vit_tiny (4x4 patches) classifying the 8 procedural shapes at 32x32 RGB",
        ),
    )
}


def list_presets():
    """The names of the shipped presets, sorted."""
    return sorted(PRESETS)


def preset_directory(name):
    """The folder of the shipped preset ``name``.

    Raises ``PresetError`` for an unknown name (listing the known ones) and for anything
    that is not a plain name (a path separator, ``..``, an absolute path): a name is
    looked up in the registry and can never point outside the presets folder.
    """
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise PresetError(
            f"{name!r} is not a preset name: names are lower-case words of letters, digits and '_' "
            f"(no path separators, '..' or absolute paths); available presets: {', '.join(list_presets())}. "
            f"To load a preset saved elsewhere pass its directory, e.g. pathlib.Path(...)"
        )
    if name not in PRESETS:
        raise PresetError(f"unknown preset {name!r}; available presets: {', '.join(list_presets())}")
    directory = os.path.realpath(os.path.join(ASSETS_DIR, name))
    if os.path.commonpath([directory, os.path.realpath(ASSETS_DIR)]) != os.path.realpath(ASSETS_DIR):
        raise PresetError(f"preset {name!r} resolves to {directory!r}, outside the presets folder {ASSETS_DIR!r}")
    if not os.path.isdir(directory):
        raise PresetError(
            f"preset {name!r} is registered but its files are missing at {directory!r}; "
            f"regenerate them with python recipes/presets/make_presets.py"
        )
    return directory


def preset_metadata(name):
    """The ``metadata.json`` of the shipped preset ``name`` (dataset, accuracy, parameters, ...)."""
    return read_json(preset_directory(name), METADATA_FILE)
