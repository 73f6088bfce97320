"""What a preset may contain: only zoo-registered models built from Keras and zoo classes.

Keras' ``deserialize_keras_object`` imports the ``module`` a config names when the class
is not registered; ``safe_mode=True`` only refuses lambdas. A preset is data from
elsewhere, so before Keras sees a config we walk it and refuse any serialised object
whose module is outside ``keras`` and ``zoo``, any ``zoo`` class that is not
registered (``@keras.saving.register_keras_serializable(package="zoo")``), and a
top-level object that is not a zoo ``keras.Model``.

The zoo's classes are registered by ``zoo/__init__.py``, which runs before any ``zoo``
module; this package imports no model (``zoo.models`` imports it: ``ZooModel.from_preset``).
"""

import keras

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
