"""What the Transformer jobs (GPT, encoder, ViT) share: strategy -> distribution and model settings."""

from zoo import distribution as zd
from zoo.models._transformer_layouts import LAYOUT_STRATEGIES, config_overrides

# every layout a Transformer model of the zoo trains under (see zoo.distribution.strategies)
TRANSFORMER_STRATEGIES = ("single", "data") + zd.TRANSFORMER_STRATEGIES


def resolve_transformer_distribution(model_class, strategy, mesh_spec, *, attention="ring", balance=None, config=None):
    """The distribution for ``strategy`` (None for ``"single"``) with ``model_class``'s layout map.

    ``config``: the model's config dict, when known: its sizes are checked against the mesh
    and the layout map fits it (no ``lm_head`` rule for tied embeddings)."""
    if strategy not in TRANSFORMER_STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; choose one of {list(TRANSFORMER_STRATEGIES)}")
    if strategy == "single":
        if mesh_spec:
            raise zd.MeshError(f"strategy 'single' runs on one device; drop --mesh {mesh_spec!r}")
        return None
    layout = {} if config is None or strategy == "data" else {"config": config}
    if strategy == "context":
        return zd.distribution_for(model_class, strategy, mesh_spec, attention=attention, balance=balance, **layout)
    if balance is not None:
        raise ValueError(f"balance={balance!r} reorders the sequence for context parallelism; strategy {strategy!r} does not split it")
    return zd.distribution_for(model_class, strategy, mesh_spec, **layout)


def strategy_overrides(strategy):
    """Model-config entries a strategy needs: ``tp+sp`` builds Megatron sequence-parallel blocks.

    The layout strategies say so themselves (``config_overrides``); single, data and
    context leave the model as it is."""
    return config_overrides(strategy) if strategy in LAYOUT_STRATEGIES else {"tp_sequence_parallel": False}


def report_setup(distribution, report):
    """Print the devices and the distribution (every training job starts with these lines)."""
    report(f"devices: {zd.describe_devices()}")
    if distribution is None:
        report("distribution: single device")
    else:
        report(f"distribution: {type(distribution).__name__} on mesh {zd.describe_mesh(distribution.device_mesh)}")
