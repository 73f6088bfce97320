"""The preset directory format: file names, the format version, reading files with clear errors.

A preset is a directory holding

==================  ===========================================================  ========
file                what                                                         required
==================  ===========================================================  ========
config.json         the model, as ``keras.saving.serialize_keras_object`` gives  yes
                    it: ``registered_name`` (``"zoo>SmallCNN"``), ``config``
                    (the model's ``get_config()``) and ``build_config``
model.weights.h5    the weights, as ``model.save_weights`` writes them           yes
metadata.json       format version, zoo / keras / jax versions, parameter        yes
                    count, SHA-256 of every other file, and what the caller
                    adds (dataset, class names, training summary, accuracy)
tokenizer.json      the tokenizer, serialised like the model                     no
==================  ===========================================================  ========
"""

import hashlib
import json
import os

from zoo._version import __version__
from zoo.file_kinds import regular_file

FORMAT_VERSION = 1  # the newest preset format this keras-zoo reads and the one it writes
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.weights.h5"
METADATA_FILE = "metadata.json"
TOKENIZER_FILE = "tokenizer.json"
REQUIRED_FILES = (CONFIG_FILE, WEIGHTS_FILE, METADATA_FILE)


class PresetError(ValueError):
    """A preset that cannot be found, read or trusted; the message names the file or value."""


def read_json(directory, filename):
    """The parsed JSON object in ``directory/filename``; a missing or broken file raises
    ``PresetError`` naming it."""
    path = os.path.join(directory, filename)
    if not os.path.exists(path):
        raise PresetError(f"preset {directory!r} has no {filename} (expected {path!r})")
    regular_file(path, error=PresetError, what="a JSON file")
    try:
        with open(path, encoding="utf-8") as file:
            value = json.load(file)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise PresetError(f"preset file {path!r} is not valid JSON: {error}") from None
    except RecursionError:
        raise PresetError(f"preset file {path!r} is not JSON the zoo reads: nested too deeply") from None
    if not isinstance(value, dict):
        raise PresetError(f"preset file {path!r} must hold a JSON object, got {type(value).__name__}")
    return value


def write_json(directory, filename, value):
    with open(os.path.join(directory, filename), "w", encoding="utf-8") as file:
        json.dump(value, file, indent=2, sort_keys=True)
        file.write("\n")


def sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_version(directory, metadata):
    """Raise ``PresetError`` unless ``metadata`` has a format version this code reads."""
    version = metadata.get("format_version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise PresetError(
            f"preset {directory!r}: {METADATA_FILE} has no valid format_version (got {version!r}); "
            f"it was not written by zoo.presets.save_to_preset"
        )
    if version > FORMAT_VERSION:
        raise PresetError(
            f"preset {directory!r} has format version {version}, newer than the {FORMAT_VERSION} this "
            f"keras-zoo {__version__} reads (written by keras-zoo {metadata.get('zoo_version', '?')}); "
            f"upgrade keras-zoo to load it"
        )


def check_files(directory, metadata):
    """Raise ``PresetError`` naming the file if a required file is missing, or a file's
    SHA-256 differs from the one ``metadata`` recorded (a truncated or altered file)."""
    for filename in REQUIRED_FILES:
        if not os.path.isfile(os.path.join(directory, filename)):
            raise PresetError(
                f"preset {directory!r} has no {filename} (expected {os.path.join(directory, filename)!r})"
            )
    recorded = metadata.get("files", {})
    if not isinstance(recorded, dict):
        raise PresetError(f"preset {directory!r}: {METADATA_FILE} 'files' must map file names to SHA-256 digests")
    for filename, digest in recorded.items():
        path = os.path.join(directory, os.path.basename(filename))
        if not os.path.isfile(path):
            raise PresetError(f"preset {directory!r} has no {filename}, which its {METADATA_FILE} lists")
        actual = sha256(path)
        if actual != digest:
            raise PresetError(
                f"preset file {path!r} is corrupt or was changed after saving: SHA-256 {actual[:16]}... "
                f"differs from the {digest[:16]}... recorded in {METADATA_FILE}"
            )
