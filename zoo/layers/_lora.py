"""LoRA on a layer's Dense / EinsumDense layers: which are its targets, and enabling it on
one of them with the update computed factored (``factored_lora_call``). ``zoo.training``'s
``enable_lora`` adds the factors' layouts under a distribution; ``PipelinedBlocks`` enables
it on its template block, whose factors it stacks like its other weights."""

import contextlib
import types

import keras

from zoo._compat import deferred_initializer, set_deferred_variable_layout, sublayers, variable_layout
from zoo.layers._tensor_parallel import factored_lora_call
from zoo.layers.moe_feed_forward import MoEFeedForward

LORA_LAYER_TYPES = (keras.layers.Dense, keras.layers.EinsumDense)  # zoo's TP layers are Dense subclasses


def lora_target_layers(model, exclude=()):
    """Every Dense / EinsumDense layer inside ``model`` (zoo TP layers too), in model
    order, except the layer objects in ``exclude`` (a classification head, say) and the
    routers of Mixture-of-Experts layers: ``MoEFeedForward`` reads its router's kernel
    itself (a LoRA update there would be ignored) and the routing stays as pretrained, as
    PEFT's usual targets leave it. The stacked expert weights are not Dense layers: they
    stay frozen under LoRA; the shared expert and its gate are adapted."""
    routers = [layer.router for layer in sublayers(model) if isinstance(layer, MoEFeedForward)]
    excluded = {id(layer) for layer in exclude} | {id(router) for router in routers}
    return [layer for layer in sublayers(model) if isinstance(layer, LORA_LAYER_TYPES) and id(layer) not in excluded]


def enable_layer_lora(layer, rank, alpha=None):
    """Keras' ``layer.enable_lora`` (the factors ``lora_kernel_a`` (kernel dims but the last,
    r) and ``lora_kernel_b`` (r, last kernel dim); the kernel frozen), and the factored call
    for a plain Keras ``Dense`` / ``EinsumDense`` (the zoo's subclasses factor in their own
    ``call``; a class with its own ``call`` keeps it)."""
    layer.enable_lora(rank, lora_alpha=alpha)
    for kind in (keras.layers.EinsumDense, keras.layers.Dense):
        if isinstance(layer, kind) and type(layer).call is kind.call:
            layer.call = types.MethodType(factored_lora_call, layer)
            return


def check_lora_rank(rank):
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise ValueError(f"LoRA rank must be a positive integer, got {rank!r}")


def factor_axes_like(axes, rank):
    """Layout axes ``{name: axes}`` of the LoRA factors of a kernel of ``rank`` laid out as
    ``axes`` (missing: None): ``lora_kernel_a`` as the kernel but its last axis (r whole),
    ``lora_kernel_b`` (r whole, the kernel's last axis)."""
    axes = tuple(axes) + (None,) * (rank - len(axes))  # (d_0, ..., d_last)
    return {"lora_kernel_a": axes[:-1] + (None,), "lora_kernel_b": (None, axes[-1])}


@contextlib.contextmanager
def factor_layout_keys(layout_map, wanted, made):
    """While LoRA factors are created: exact layout-map keys ``wanted`` ({key: axes}; a user's
    own exact key stays in charge), removed after. A factor still deferred then (an abstract
    build lays a variable out when it is initialised, these keys gone by then) takes its
    layout now, from the map with its key in it; ``made(key)`` is the variable made for ``key``."""
    keys = set(iter(layout_map))  # not ``key in layout_map``: its regex lookup says True for any match
    added = [key for key in wanted if key not in keys]
    for key in added:
        layout_map[key] = wanted[key]
    try:
        yield
        distribution = keras.distribution.distribution()
        for key in wanted:
            factor = made(key)
            if deferred_initializer(factor) is not None and variable_layout(factor) is None:
                set_deferred_variable_layout(factor, distribution.get_variable_layout(factor))
    finally:
        for key in added:
            del layout_map[key]
