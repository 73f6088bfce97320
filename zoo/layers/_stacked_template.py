"""The stacked blocks' template: one ``TransformerBlock`` built abstractly, whose variables a
``PipelinedBlocks`` stacks (R, L/R, ...) and whose computation it runs on each slice; the
stacked initializer; the layout-map keys that place a stack's LoRA factors like its kernels."""

import contextlib

import jax.numpy as jnp
import keras

from zoo._compat import distribution_layout_map, forgetting_deferred_variables
from zoo.config.choices import LORA_WEIGHTS
from zoo.distribution.distributions import global_distribution
from zoo.layers._lora import factor_axes_like, factor_layout_keys
from zoo.layers._parallel_plan import weight_axes
from zoo.layers.transformer_block import TransformerBlock

TEMPLATE = "pipelined_block_template"  # the name of the block whose computation runs on each slice
SEED_GENERATOR = "seed_generator"  # the dropout layers' seed state: not stacked (one seed for the stack)


class StackedInitializer:
    """Initialises a stacked variable (*lead, *shape) block by block with ``initializer``."""

    def __init__(self, initializer, lead):
        self.initializer, self.lead = initializer, tuple(lead)

    def __call__(self, shape, dtype=None):
        count = self.lead[0] * self.lead[1]
        blocks = [self.initializer(tuple(shape[2:]), dtype=dtype) for _ in range(count)]
        return jnp.stack(blocks).reshape(shape)


class Untracked:
    """A holder Keras does not look into (the template block's variables are not the layer's)."""

    def __init__(self, value):
        self.value = value


@contextlib.contextmanager
def factors_laid_out_like_kernels(layer, variables):
    """While the stacked LoRA factors among ``variables`` are made: exact layout-map keys
    placing each like its stacked kernel (R, L/R, *k) is placed, as ``zoo.training``'s
    ``enable_lora`` places a layer's: ``lora_kernel_a`` (R, L/R, *k[:-1], r) as the kernel
    but its last axis, ``lora_kernel_b`` (R, L/R, r, k[-1]) the stacking axes and the last
    (under fsdp the factors split as the kernels, not replicated; an EinsumDense's packed
    int4 kernel as the float kernel it stands for, ``float_kernel_axes``). Without a layout
    map (no distribution, data parallelism) nothing is added: Keras replicates them. In an
    abstract build each factor is given its layout while its key is in the map."""
    layout_map = distribution_layout_map(keras.distribution.distribution())
    if layout_map is None:
        yield
        return
    quantized, wanted, paths = layer.quantized_layers(), {}, {}
    for path, variable in variables.items():
        prefix, name = path.rsplit("/", 1)
        kernel = layer.stacked.get(f"{prefix}/kernel")
        if name not in LORA_WEIGHTS or path in layer.stacked or kernel is None:
            continue
        original = getattr(quantized.get(f"{prefix}/kernel"), "original_kernel_shape", None)
        axes = float_kernel_axes(kernel, original, layout_map)  # (R, L/R, *k)
        factor = axes[:2] + factor_axes_like(axes[2:], kernel.ndim - 2)[name]  # a block's factor behind (R, L/R)
        if len(factor) == 2 + len(variable.shape):
            key = f"{layer.path}/{path}"
            wanted[key], paths[key] = factor, path
    with factor_layout_keys(layout_map, wanted, lambda key: layer.stacked[paths[key]]):
        yield


def float_kernel_axes(kernel, original, layout_map):
    """The layout axes (R, L/R, *k) of the float kernel a stack's ``kernel`` stands for, read
    without initialising it (``kernel.value`` would allocate the whole stack in a plan's
    abstract build: a 70B int4 stack is 9.4 GB on the host). An EinsumDense's int4 kernel
    (``original``: its float kernel's shape) is stored packed in 2-D: its factors follow the
    layout map's rule for the float kernel (R, L/R, *original), as ``zoo.distribution.layouts``
    lays out its parts."""
    if original is None or len(original) + 2 == kernel.ndim:
        return weight_axes(kernel) or (None,) * kernel.ndim
    rule = layout_map[kernel.path]  # the rule's regex lookup, as for the packed parts
    axes = tuple(rule.axes) if rule is not None else ()
    return axes + (None,) * (2 + len(original) - len(axes))


@contextlib.contextmanager
def abstract_scope():
    """The template's variables made abstractly: no weight allocated, under no distribution."""
    with global_distribution(None), forgetting_deferred_variables(), keras.StatelessScope(initialize_variables=False):
        yield


def template_block(block, input_shape, dtype_policy):
    """A ``TransformerBlock`` built abstractly and {path relative to the block: variable}
    of its weights (``block_variables``)."""
    with abstract_scope():
        template = TransformerBlock(**block, dtype=dtype_policy, name=TEMPLATE)
        template.build(tuple(input_shape))
    return template, block_variables(template)


def block_variables(template):
    """{path relative to the block: variable} of the template's weights (seed states left out)."""
    prefix = template.name + "/"
    variables = {}
    for variable in template.weights:
        path = variable.path.split(prefix, 1)[-1]
        if SEED_GENERATOR not in path:
            variables[path] = variable
    return variables


def is_factor(path):
    return path.rsplit("/", 1)[-1] in LORA_WEIGHTS
