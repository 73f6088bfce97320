"""Saved configs written before issue 16's renames still load: old keys mapped to new.

A ``.keras`` file or preset ``config.json`` saved with ``sequence_parallel`` or
``tp_sequence_parallel`` keeps loading; the layers' ``from_config`` maps the old key to
the new one (``context_attention``, ``megatron_sp``). The constructors take only the
new names.
"""


def renamed_keys(config, renames):
    """``config`` with each old key of ``renames`` ({old: new}) under its new name.

    A config that holds both the old and the new key keeps the new one's value.
    """
    config = dict(config)
    for old, new in renames.items():
        if old in config:
            value = config.pop(old)
            config.setdefault(new, value)
    return config
