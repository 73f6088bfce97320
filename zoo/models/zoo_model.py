"""``ZooModel``: the base of every zoo model (config, named configs, ``from_preset``).

The shape of keras-hub's ``Backbone`` / ``Task`` base classes: a model class loads a
preset of its own class with ``from_preset`` (``SmallCNN.from_preset("small_cnn_shapes")``)
and refuses a preset holding another class before building anything.
"""

import inspect
from typing import ClassVar

import keras

from zoo.config.renamed import MODEL_KEYS, renamed_keys
from zoo.models._named_configs import named_config
from zoo.presets import load as preset_loading


class ZooModel(keras.Model):
    """A ``keras.Model`` whose ``__init__`` arguments are its config.

    Every ``__init__`` argument is kept as an attribute of the same name (DESIGN.md,
    convention 2; ``keep_arguments`` checks none is missed), so ``get_config`` is those attributes (tuples as lists, as JSON keeps
    them) and ``from_config`` calls the class with them, after renaming the keys an
    older keras-zoo saved (``zoo.config.renamed.MODEL_KEYS``).

    Subclasses with named sizes set ``CONFIGS`` ({name: arguments}) for
    ``from_config_name``.
    """

    CONFIGS: ClassVar[dict] = {}  # named sizes: {name: __init__ arguments}

    def keep_arguments(self, **arguments):
        """Keep each ``__init__`` argument (as normalised) as an attribute of the same name;
        raises naming any argument left out, since ``get_config`` reads them back."""
        missing = [key for key in init_arguments(type(self)) if key not in arguments]
        if missing:
            raise TypeError(f"{type(self).__name__} does not keep its __init__ argument(s) {missing}")
        for key, value in arguments.items():
            setattr(self, key, value)

    def get_config(self):
        config = {"name": self.name, "trainable": self.trainable}
        config.update({key: _json_ready(getattr(self, key)) for key in init_arguments(type(self))})
        return config

    @classmethod
    def from_config(cls, config):
        return cls(**renamed_keys(config, MODEL_KEYS))

    @classmethod
    def from_config_name(cls, name, layout=None, **overrides):
        """The model of ``CONFIGS[name]`` with ``overrides`` replacing entries, and with a
        ``layout``, the entries it needs (tp+sp: ``megatron_sp=True``; see
        ``_transformer_layouts.layout_overrides``). An unknown name raises, listing the names."""
        return cls(**cls.named_config(name, layout, **overrides))

    @classmethod
    def named_config(cls, name, layout=None, **overrides):
        """The ``__init__`` arguments ``from_config_name`` builds the model from."""
        return named_config(cls.CONFIGS, name, cls.__name__, layout, overrides)

    @classmethod
    def from_preset(cls, name_or_dir, *, load_weights=True, skip_layers=(), **config_overrides):
        """The model in a preset (a shipped name, ``zoo.presets.list_presets()``, or a
        directory), built under the current distribution, with its weights.

        Refuses (``zoo.presets.PresetError``) a preset that holds another class, before
        building it. ``load_weights``, ``skip_layers`` and ``config_overrides`` as
        ``zoo.presets.from_preset``.
        """
        return preset_loading.load_preset_model(
            cls, name_or_dir, load_weights=load_weights, skip_layers=skip_layers, **config_overrides
        )


def init_arguments(model_class):
    """The names of ``model_class.__init__``'s arguments, in order, without ``name`` and ``**kwargs``."""
    parameters = inspect.signature(model_class.__init__).parameters.values()
    return [
        p.name for p in parameters if p.name not in ("self", "name") and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
    ]


def _json_ready(value):
    return list(value) if isinstance(value, tuple) else value
