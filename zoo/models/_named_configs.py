"""Named model configs: look one up by name, and fill a partial config with the defaults."""

import inspect

from zoo.models._transformer_layouts import config_overrides


def lookup_config(configs, name, family):
    """A copy of ``configs[name]``; an unknown name raises, listing the names there are."""
    if name not in configs:
        raise ValueError(f"unknown {family} config {name!r}; choose one of {list(configs)}")
    return dict(configs[name])


def named_config(configs, name, family, strategy=None, overrides=None):
    """``configs[name]`` updated with ``overrides``, then with the entries ``strategy`` needs
    (``"tp+sp"`` sets ``tp_sequence_parallel=True``; see ``config_overrides``)."""
    config = {**lookup_config(configs, name, family), **(overrides or {})}
    return config if strategy is None else {**config, **config_overrides(strategy)}


def complete_config(model_class, configs, config, family):
    """``config`` (a name in ``configs`` or a dict of ``__init__`` arguments) with every
    ``__init__`` argument present, defaults filled in; raises naming missing arguments."""
    if isinstance(config, str):
        config = lookup_config(configs, config, family)
    parameters = [
        p for p in inspect.signature(model_class.__init__).parameters.values()
        if p.name != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
    ]
    missing = [p.name for p in parameters if p.default is p.empty and p.name not in config]
    if missing:
        raise ValueError(f"{model_class.__name__} config lacks required argument(s) {missing}")
    defaults = {p.name: p.default for p in parameters if p.default is not p.empty}
    return {**defaults, **config}
