"""Presets: trained zoo models saved as a directory (config, weights, tokenizer, metadata).

``from_preset("small_cnn_shapes")`` loads a shipped preset (``list_presets()``), or
``from_preset(pathlib.Path("my_preset"))`` one saved with ``save_to_preset``. Under a
``keras.distribution`` the model is built sharded and each weight is loaded straight
into its shards. Importing this package also gives every zoo model class a
``from_preset`` classmethod (``SmallCNN.from_preset(...)``).
"""

import keras

from zoo.presets._format import FORMAT_VERSION, PresetError
from zoo.presets._safety import registered_zoo_names
from zoo.presets.load import from_preset, load_preset_config, load_preset_metadata, load_tokenizer, resolve_preset
from zoo.presets.registry import PRESETS, PresetSpec, list_presets, preset_directory, preset_metadata
from zoo.presets.save import save_to_preset

__all__ = [
    "FORMAT_VERSION",
    "PRESETS",
    "PresetError",
    "PresetSpec",
    "from_preset",
    "list_presets",
    "load_preset_config",
    "load_preset_metadata",
    "load_tokenizer",
    "preset_directory",
    "preset_metadata",
    "resolve_preset",
    "save_to_preset",
]


def _class_from_preset(cls, name_or_dir, **kwargs):
    """``zoo.presets.from_preset``, checking the preset holds a ``cls``."""
    model = from_preset(name_or_dir, **kwargs)
    if not isinstance(model, cls):
        raise PresetError(f"preset {name_or_dir!r} holds a {type(model).__name__}, not a {cls.__name__}")
    return model


def _attach_from_preset():
    """Give each zoo model class ``from_preset`` (models may not import presets, so the
    classmethod is attached from here)."""
    for registered in registered_zoo_names():
        cls = keras.saving.get_registered_object(registered)
        if isinstance(cls, type) and issubclass(cls, keras.Model) and not hasattr(cls, "from_preset"):
            cls.from_preset = classmethod(_class_from_preset)


_attach_from_preset()
