"""Named model configs: look one up by name, and fill a partial config with the defaults."""

import inspect

from zoo.config.renamed import MODEL_KEYS, renamed_keys
from zoo.models._transformer_layouts import layout_overrides


def lookup_config(configs, name, family):
    """A copy of ``configs[name]``; an unknown name raises, listing the names there are."""
    if name not in configs:
        raise ValueError(f"unknown {family} config {name!r}; choose one of {list(configs)}")
    return dict(configs[name])


def named_config(configs, name, family, layout=None, overrides=None):
    """``configs[name]`` updated with ``overrides``, then with the entries ``layout`` needs
    (tp+sp sets ``megatron_sp=True``; see ``layout_overrides``)."""
    config = {**lookup_config(configs, name, family), **(overrides or {})}
    if layout is None:
        return config
    needed = {
        key: value for key, value in layout_overrides(layout).items() if not (key == "schedule" and config.get(key))
    }
    return {**config, **needed}


def complete_config(model_class, configs, config, family):
    """``config`` (a name in ``configs`` or a dict of ``__init__`` arguments, old keys
    renamed) with every ``__init__`` argument present, defaults filled in; raises naming
    missing arguments."""
    config = lookup_config(configs, config, family) if isinstance(config, str) else renamed_keys(config, MODEL_KEYS)
    parameters = [
        p
        for p in inspect.signature(model_class.__init__).parameters.values()
        if p.name != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
    ]
    missing = [p.name for p in parameters if p.default is p.empty and p.name not in config]
    if missing:
        raise ValueError(f"{model_class.__name__} config lacks required argument(s) {missing}")
    defaults = {p.name: p.default for p in parameters if p.default is not p.empty}
    return {**defaults, **config}
