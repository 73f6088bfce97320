"""What a preset may contain: only zoo-registered models built from Keras and zoo classes,
and only files inside its own folder.

Keras' ``deserialize_keras_object`` imports the ``module`` a config names when the class
is not registered; ``safe_mode=True`` only refuses lambdas. A preset is data from
elsewhere, so before Keras sees a config we walk it and refuse any serialised object
whose module is outside ``keras`` and ``zoo``, any ``zoo`` class that is not
registered (``@keras.saving.register_keras_serializable(package="zoo")``), and a
top-level object that is not a zoo ``keras.Model``.

The zoo's classes are registered by ``zoo/__init__.py``, which runs before any ``zoo``
module; this package imports no model (``zoo.models`` imports it: ``ZooModel.from_preset``).

A folder is data from elsewhere too: a file it names (a safetensors index's
``weight_map``) or holds (a symlink) may point anywhere. ``inside_folder`` refuses a
name that is absolute, climbs out with ``..`` or resolves outside the folder, before
anything is opened.
"""

import os

import keras

from zoo.presets._bounds import check_config_sizes
from zoo.presets._format import CONFIG_FILE, PresetError

ZOO_PACKAGE = "zoo"
ALLOWED_MODULE_ROOTS = ("keras", "zoo")
REFUSED_CLASS_NAMES = ("__lambda__",)


def check_model_config(directory, config):
    """Raise ``PresetError`` unless ``config`` (``config.json``) is a zoo model's and every
    object inside it comes from Keras or is zoo-registered. Returns the model class."""
    if "registered_name" not in config or "config" not in config:
        raise PresetError(
            f"preset {directory!r}: {CONFIG_FILE} must hold a serialised model with 'registered_name' "
            f"and 'config', got keys {sorted(config)}"
        )
    model_class = zoo_class(directory, config.get("registered_name"))
    if not (isinstance(model_class, type) and issubclass(model_class, keras.Model)):
        raise PresetError(f"preset {directory!r}: {config['registered_name']!r} is not a model class")
    for path, item in _serialised_objects(config, "config"):
        _check_object(directory, path, item)
    check_config_sizes(f"preset {directory!r}", config)  # before Keras builds anything from them
    return model_class


def zoo_class(directory, registered_name):
    """The class registered under ``registered_name`` (``"zoo>Name"``), or ``PresetError``."""
    if not isinstance(registered_name, str) or not registered_name.startswith(f"{ZOO_PACKAGE}>"):
        raise PresetError(
            f"preset {directory!r}: refusing to load {registered_name!r}; presets hold only zoo-registered "
            f"classes (registered names starting with '{ZOO_PACKAGE}>'), such as {registered_zoo_names()}"
        )
    found = keras.saving.get_registered_object(registered_name)
    if found is None:
        raise PresetError(
            f"preset {directory!r}: no zoo class is registered as {registered_name!r}; "
            f"registered: {registered_zoo_names()}"
        )
    return found


def registered_zoo_names():
    return sorted(name for name in keras.saving.get_custom_objects() if name.startswith(f"{ZOO_PACKAGE}>"))


def _serialised_objects(value, path):
    """``(path, dict)`` for every dict inside ``value`` that names a class."""
    if isinstance(value, dict):
        if "class_name" in value:
            yield path, value
        for key, item in value.items():
            yield from _serialised_objects(item, f"{path}.{key}")
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            yield from _serialised_objects(item, f"{path}[{index}]")


def _check_object(directory, path, item):
    class_name, module, registered = item.get("class_name"), item.get("module"), item.get("registered_name")
    where = f"preset {directory!r}: {CONFIG_FILE} at {path}"
    if class_name in REFUSED_CLASS_NAMES:
        raise PresetError(f"{where}: refusing {class_name!r} (it carries Python code)")
    if isinstance(registered, str) and registered.startswith(f"{ZOO_PACKAGE}>"):
        zoo_class(directory, registered)
        return
    if module is None:
        return  # a Keras built-in named by class only: Keras looks it up, it imports nothing
    root = str(module).split(".")[0]
    if root not in ALLOWED_MODULE_ROOTS or root == ZOO_PACKAGE:
        raise PresetError(
            f"{where}: refusing class {class_name!r} from module {module!r}; presets may hold Keras "
            f"classes and zoo-registered classes only"
        )


# --- every file a loader opens stays inside its folder ---------------------------------

HUB_SNAPSHOTS = "snapshots"  # huggingface_hub's cache: models--org--name/snapshots/<revision>/<file>
HUB_REPOSITORY_PREFIX = "models--"  # ... whose files are symlinks to ../../blobs/<hash>


def containment_root(directory):
    """The folder every file of ``directory`` must resolve inside (symlinks followed): the
    folder itself, or for a Hugging Face cache snapshot (``.../models--org--name/snapshots/
    <revision>``, whose files link to ``../../blobs/<hash>``), its repository folder."""
    real = os.path.realpath(directory)
    parent = os.path.dirname(real)
    if os.path.basename(parent) == HUB_SNAPSHOTS and os.path.basename(os.path.dirname(parent)).startswith(
        HUB_REPOSITORY_PREFIX
    ):
        return os.path.dirname(parent)
    return real


def inside_folder(directory, name, *, listed_in, error=PresetError):
    """``os.path.join(directory, name)`` after checking that it names a file inside
    ``directory``: a relative path without ``..``, and no symlink on the way leading
    out (``containment_root``). Nothing is opened. ``listed_in``: where ``name`` came
    from, for the message (``"model.safetensors.index.json"``); raises ``error``."""
    where = f"{directory!r}: {listed_in}"
    if not isinstance(name, str) or not name or "\0" in name:
        raise error(f"{where} names the file {name!r}, which is not a file name")
    if os.path.isabs(name) or os.path.splitdrive(name)[0]:
        raise error(f"{where} names the absolute path {name!r}; the files of a folder are named relative to it")
    if ".." in name.replace("\\", "/").split("/"):
        raise error(f"{where} names {name!r}, which climbs out of the folder with '..'")
    path = os.path.join(directory, name)
    root, real = containment_root(directory), os.path.realpath(path)
    if os.path.commonpath([root, real]) != root:
        raise error(
            f"{where} names {name!r}, a symlink to {real!r} outside the folder; copy the file into the folder instead"
        )
    return path
