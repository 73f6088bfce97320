"""Presets: trained zoo models saved as a directory (config, weights, tokenizer, metadata).

``from_preset("small_cnn_shapes")`` loads a shipped preset (``list_presets()``), or
``from_preset(pathlib.Path("my_preset"))`` one saved with ``save_to_preset``. Under a
``keras.distribution`` the model is built sharded and each weight is loaded straight
into its shards. Every zoo model class has ``from_preset`` too
(``SmallCNN.from_preset(...)``, from ``zoo.models.ZooModel``), which also checks the
preset holds that class.

This package sits below ``zoo.models`` (which imports it) and imports no model. Writers of
other folders (``zoo.models.gpt.hf_checkpoints``) use its ``write_folder_atomically`` and
``inside_folder`` too.
"""

from zoo.presets._atomic_folder import write_folder_atomically
from zoo.presets._bounds import check_config_sizes
from zoo.presets._format import FORMAT_VERSION, PresetError
from zoo.presets._safety import inside_folder
from zoo.presets.load import (
    from_preset,
    load_preset_config,
    load_preset_metadata,
    load_tokenizer,
    resolve_preset,
)
from zoo.presets.registry import (
    PRESETS,
    PresetSpec,
    list_presets,
    preset_directory,
    preset_metadata,
)
from zoo.presets.save import save_to_preset

__all__ = [
    "FORMAT_VERSION",
    "PRESETS",
    "PresetError",
    "PresetSpec",
    "check_config_sizes",
    "from_preset",
    "inside_folder",
    "list_presets",
    "load_preset_config",
    "load_preset_metadata",
    "load_tokenizer",
    "preset_directory",
    "preset_metadata",
    "resolve_preset",
    "save_to_preset",
    "write_folder_atomically",
]
