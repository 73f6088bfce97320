"""``from_preset``: a model (and tokenizer) from a shipped preset name or a preset directory.

The model is built under the Keras distribution in force, so each variable is created
with its layout (split over the mesh as the layout map says), and the weights then go
from the file into those layouts shard by shard (``sharded_weights``), never as a
whole array on one device first.
"""

import copy
import os

import keras

from zoo.file_kinds import read_json_file
from zoo.presets._format import (
    CONFIG_FILE,
    METADATA_FILE,
    TOKENIZER_FILE,
    WEIGHTS_FILE,
    PresetError,
    check_files,
    check_version,
    read_json,
)
from zoo.presets._safety import check_model_config, inside_folder, zoo_class
from zoo.presets.registry import preset_directory
from zoo.presets.safetensors_weights import has_safetensors
from zoo.presets.sharded_weights import load_weights_sharded


def resolve_preset(name_or_dir):
    """The directory of a preset given by name or path.

    A ``pathlib.Path`` (any ``os.PathLike``), or a string holding a path separator, is a
    directory; a plain word is a shipped preset's name (``list_presets()``), looked up
    in the registry only. Raises ``PresetError`` naming what was given.
    """
    if isinstance(name_or_dir, os.PathLike):
        return _existing_directory(os.fspath(name_or_dir))
    if not isinstance(name_or_dir, str):
        raise PresetError(f"a preset is a name or a directory, got {type(name_or_dir).__name__} {name_or_dir!r}")
    if _looks_like_path(name_or_dir):
        return _existing_directory(name_or_dir)
    return preset_directory(name_or_dir)


def _looks_like_path(text):
    return os.sep in text or "/" in text or (os.altsep is not None and os.altsep in text) or os.path.isabs(text)


def _existing_directory(path):
    if not os.path.isdir(path):
        raise PresetError(f"no preset directory at {path!r}")
    return path


def load_preset_metadata(name_or_dir):
    """The preset's ``metadata.json``, after checking its format version."""
    directory = resolve_preset(name_or_dir)
    metadata = read_json(directory, METADATA_FILE)
    check_version(directory, metadata)
    return metadata


def load_preset_config(name_or_dir):
    """The preset's checked ``config.json`` (what ``keras.saving.serialize_keras_object`` gave)."""
    directory = resolve_preset(name_or_dir)
    metadata = read_json(directory, METADATA_FILE)
    check_version(directory, metadata)
    config = read_json(directory, CONFIG_FILE)
    check_model_config(directory, config)
    return config


def from_preset(name_or_dir, *, load_weights=True, skip_layers=(), **config_overrides):
    """Build the preset's model under the current distribution and load its weights.

    Args:
        name_or_dir: a shipped preset's name (``list_presets()``) or a preset directory.
        load_weights: False gives the architecture with freshly initialised weights.
        skip_layers: names of layers whose weights are not loaded (they keep their fresh
            initialisation): a new classification head, say.
        **config_overrides: replace entries of the model's config (``num_classes=10``,
            ``dropout=0.1``, ``megatron_sp=True``, ...).

    Raises ``PresetError`` for an unknown name, a path-like name, a newer format
    version, a missing, corrupt or changed file (naming it), and a config naming a
    class that is not zoo-registered or not from Keras.

    ``SmallCNN.from_preset(...)`` (every zoo model class has it) also checks the class.
    """
    return load_preset_model(
        keras.Model, name_or_dir, load_weights=load_weights, skip_layers=skip_layers, **config_overrides
    )


def load_preset_model(model_class, name_or_dir, *, load_weights=True, skip_layers=(), **config_overrides):
    """``from_preset``, refusing (``PresetError``) a preset that holds no ``model_class``
    before building anything; ``ZooModel.from_preset`` calls it with its own class."""
    directory = resolve_preset(name_or_dir)
    _refuse_hugging_face_folder(directory)
    metadata = read_json(directory, METADATA_FILE)
    check_version(directory, metadata)
    check_files(directory, metadata)
    config = read_json(directory, CONFIG_FILE)
    check_class(directory, check_model_config(directory, config), model_class)
    model = _build(directory, config, config_overrides)
    if load_weights:
        skip = [_layer(model, name, directory) for name in skip_layers]
        _load_weights(model, directory, skip)
    return model


def _refuse_hugging_face_folder(directory):
    """A Hugging Face folder (safetensors, no metadata.json) is a ``GPTCausalLM``'s to read;
    one whose ``config.json`` is not JSON is a damaged folder, and the error says that."""
    if not os.path.isfile(os.path.join(directory, METADATA_FILE)) and has_safetensors(directory):
        _check_json(directory, CONFIG_FILE)
        raise PresetError(
            f"{directory!r} is a Hugging Face folder (config.json + safetensors), not a zoo preset; "
            f"load it with GPTCausalLM.from_preset({directory!r}) (docs/checkpoints-hf.md)"
        )


def _check_json(directory, name):
    """``PresetError`` naming ``directory/name`` and where its JSON breaks, if it is a file that
    is not JSON (a symlink out of the folder is refused, not followed)."""
    path = inside_folder(directory, name, listed_in="the folder")
    if not os.path.lexists(path):
        return
    value = read_json_file(path, error=PresetError)  # a FIFO or directory refused, unopened
    if not isinstance(value, dict):
        raise PresetError(f"{path} holds a JSON {type(value).__name__}, not an object of keys: not a config.json")


def check_class(directory, found, model_class):
    """Raise ``PresetError`` unless the preset's class ``found`` is a ``model_class``."""
    if not issubclass(found, model_class):
        raise PresetError(
            f"preset {directory!r} holds a {found.__name__}, not a {model_class.__name__}; "
            f"load it with {found.__name__}.from_preset (or zoo.presets.from_preset)"
        )


def _build(directory, config, overrides):
    config = copy.deepcopy(config)
    config.pop("compile_config", None)  # a preset is weights, not a training set-up
    _override(config["config"], overrides)
    try:
        return keras.saving.deserialize_keras_object(config, safe_mode=True)
    except (TypeError, ValueError) as error:
        raise PresetError(
            f"preset {directory!r}: cannot build {config.get('class_name', config['registered_name'])} from {CONFIG_FILE}"
            + (f" with overrides {overrides}" if overrides else "")
            + f": {error}"
        ) from error


def _override(config, overrides):
    """Put ``overrides`` into a model's config. A task nests its backbone (keras-hub's shape:
    ``GPTCausalLM``): a key the task's own config lacks goes to the backbone's config."""
    backbone = config.get("backbone")
    nested = backbone.get("config") if isinstance(backbone, dict) else None
    for key, value in overrides.items():
        if key not in config and isinstance(nested, dict):
            nested[key] = value
        else:
            config[key] = value


def _layer(model, name, directory):
    try:
        return model.get_layer(name)
    except ValueError:
        names = [layer.name for layer in model.layers]
        raise PresetError(
            f"preset {directory!r}: the model has no layer {name!r} to skip; its layers are {names}"
        ) from None


def _load_weights(model, directory, skip):
    path = os.path.join(directory, WEIGHTS_FILE)
    try:
        load_weights_sharded(model, path, skip)
    except (OSError, ValueError, KeyError) as error:
        raise PresetError(f"cannot load the weights in {path!r} into {type(model).__name__}: {error}") from error


def load_tokenizer(name_or_dir):
    """The preset's tokenizer (``tokenizer.json``), or None when it has none."""
    directory = resolve_preset(name_or_dir)
    check_version(directory, read_json(directory, METADATA_FILE))
    if not os.path.isfile(os.path.join(directory, TOKENIZER_FILE)):
        return None
    config = read_json(directory, TOKENIZER_FILE)
    zoo_class(directory, config.get("registered_name"))
    try:
        return keras.saving.deserialize_keras_object(config, safe_mode=True)
    except (TypeError, ValueError) as error:
        raise PresetError(f"preset {directory!r}: cannot build the tokenizer in {TOKENIZER_FILE}: {error}") from error
