"""``save_to_preset``: write a model (and tokenizer) as a preset directory, atomically.

Everything is written into a temporary folder beside the target and renamed into
place at the end, so a failure part-way (a full disk, an unserialisable config, a
crash) never leaves a half-written preset, and an existing preset at the target stays
whole until the new one is complete.
"""

import os
import shutil
import tempfile

import jax
import keras

from zoo._version import __version__
from zoo.presets._format import (
    CONFIG_FILE,
    FORMAT_VERSION,
    METADATA_FILE,
    TOKENIZER_FILE,
    WEIGHTS_FILE,
    PresetError,
    sha256,
    write_json,
)
from zoo.presets._safety import ZOO_PACKAGE
from zoo.presets.permissions import honour_umask

RESERVED_METADATA = (
    "format_version",
    "name",
    "class_name",
    "parameter_count",
    "zoo_version",
    "keras_version",
    "jax_version",
    "files",
)


def save_to_preset(model, directory, *, name=None, tokenizer=None, metadata=None):
    """Write ``model`` as a preset in ``directory``; returns the directory's absolute path.

    Args:
        model: a built zoo model (its class registered with ``package="zoo"``).
        directory: the preset folder; created, or replaced if it already holds a preset.
        name: the preset's name in its metadata (default: the folder's name).
        tokenizer: a Keras-serialisable tokenizer (``zoo.data.ByteTokenizer``) to ship.
        metadata: JSON-serialisable extras: ``dataset``, ``class_names``, ``training``
            (a summary), ``accuracy``, ...
    """
    registered = keras.saving.get_registered_name(type(model))
    if not registered.startswith(f"{ZOO_PACKAGE}>"):
        raise PresetError(
            f"only zoo models can be saved as presets: {type(model).__name__} is registered as {registered!r}, "
            f"not with @keras.saving.register_keras_serializable(package={ZOO_PACKAGE!r})"
        )
    if not model.built:
        raise PresetError(f"model {model.name!r} is not built; call it on data (or build it) before saving")
    directory = os.path.abspath(os.fspath(directory))
    check_preset_destination(directory)
    parent = os.path.dirname(directory)
    os.makedirs(parent, exist_ok=True)
    partial = honour_umask(tempfile.mkdtemp(prefix=f".partial-{os.path.basename(directory)}-", dir=parent))  # was 0700
    try:
        _write_files(partial, model, tokenizer, _metadata(model, name or os.path.basename(directory), metadata))
        _replace_directory(partial, directory)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return directory


def _write_files(folder, model, tokenizer, metadata):
    config = keras.saving.serialize_keras_object(model)
    config.pop("compile_config", None)
    write_json(folder, CONFIG_FILE, config)
    model.save_weights(os.path.join(folder, WEIGHTS_FILE))
    if tokenizer is not None:
        write_json(folder, TOKENIZER_FILE, keras.saving.serialize_keras_object(tokenizer))
    files = sorted(f for f in os.listdir(folder))
    metadata["files"] = {f: sha256(os.path.join(folder, f)) for f in files}
    write_json(folder, METADATA_FILE, metadata)


def _metadata(model, name, extra):
    extra = dict(extra or {})
    clashes = sorted(set(extra) & set(RESERVED_METADATA))
    if clashes:
        raise PresetError(f"metadata keys {clashes} are written by save_to_preset itself; choose other names")
    return {
        "format_version": FORMAT_VERSION,
        "name": name,
        "class_name": type(model).__name__,
        "parameter_count": int(model.count_params()),
        "zoo_version": __version__,
        "keras_version": keras.__version__,
        "jax_version": jax.__version__,
        **extra,
    }


def check_preset_destination(directory):
    """Refuse to replace a file, or a folder that is not a preset (it may hold anything);
    ``zoo finetune`` calls it before training, ``save_to_preset`` again before writing."""
    if os.path.isfile(directory):
        raise PresetError(f"cannot save a preset to {directory!r}: it is a file")
    if (
        os.path.isdir(directory)
        and os.listdir(directory)
        and not os.path.isfile(os.path.join(directory, METADATA_FILE))
    ):
        raise PresetError(
            f"refusing to replace {directory!r}: it is not empty and holds no {METADATA_FILE}, so it is not a "
            f"preset; choose a new or empty directory"
        )


def _replace_directory(partial, directory):
    """Rename ``partial`` to ``directory``; an existing preset there is swapped out, then removed."""
    if not os.path.exists(directory):
        os.rename(partial, directory)
        return
    old = tempfile.mkdtemp(prefix=f".old-{os.path.basename(directory)}-", dir=os.path.dirname(directory))
    os.rmdir(old)
    os.rename(directory, old)
    try:
        os.rename(partial, directory)
    except OSError:
        os.rename(old, directory)
        raise
    shutil.rmtree(old, ignore_errors=True)
