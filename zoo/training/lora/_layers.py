"""Keras LoRA on a model's Dense and EinsumDense layers, laid out like their kernels.

``layer.enable_lora(rank)`` adds ``lora_kernel_a`` (kernel dims but the last, r) and
``lora_kernel_b`` (r, last kernel dim) and freezes the kernel; the layer then computes
with ``kernel + (alpha / r) * a @ b``. Under a ``ModelParallel`` distribution Keras
places the new variables by the layout map, where a greedy rule written for the kernel
(``.*dense.*``, or ``.*kernel.*``) can catch ``lora_kernel_a`` and split its rank
dimension, or fail to divide it (keras-team/keras#19496); with no matching rule they
are replicated even when the kernel is split.

Here, while LoRA is enabled on a layer, the distribution's layout map holds two exact
keys (an exact key beats every regex in ``LayoutMap``) giving the factors the kernel's
own layout: ``a`` takes the kernel's layout on the input dims, ``b`` on the output dim,
and the rank dim is never split. So ``a @ b`` is laid out like the kernel and the merge
``kernel + a @ b`` needs no communication. The keys are removed afterwards. The zoo's
tensor-parallel layers place their factors themselves (``zoo.layers``) and keep doing so.
In an abstract build (``compiled_step.abstract_build``: variables deferred, no values)
the kernel's layout is read from the distribution instead of its value, and each factor
is given its layout as its own, so it is laid out so when it is initialised, after the
keys are gone.

The update is computed factored, ``x @ kernel + (alpha / r) (x @ a) @ b``, never with the
merged kernel: its backward forms no (C, F) gradient of the frozen kernel (the costly
half of Keras' merged-kernel LoRA, ``zoo.layers._tensor_parallel``). The zoo's Dense
subclasses do it in their own calls; a plain Keras ``Dense`` / ``EinsumDense`` (whose
class keeps Keras' ``call``) gets ``factored_lora_call`` as its instance's ``call`` here.
Saving is unchanged: ``.keras`` files hold the merged kernel, as Keras writes them.
"""

import contextlib
import math

import keras

from zoo._compat import (
    deferred_initializer,
    distribution_layout_map,
    sublayers,
    variable_layout,
)
from zoo.config.choices import LORA_WEIGHTS
from zoo.layers import (
    PipelinedBlocks,
    check_lora_rank,
    enable_layer_lora,
    factor_axes_like,
    factor_layout_keys,
    kernel_variable,
    lora_target_layers,
)


def is_lora_variable(variable):
    return variable.path.rsplit("/", 1)[-1] in LORA_WEIGHTS


def lora_layers(model):
    """The layers of ``model`` with LoRA enabled."""
    return [layer for layer in sublayers(model) if getattr(layer, "lora_enabled", False)]


def layer_prefix(layer):
    """The variable-path prefix of a Dense-like layer (``block_0/attention/query``)."""
    return kernel_variable(layer).path.rsplit("/", 1)[0]


def kernel_path(layer):
    """The path of a Dense / EinsumDense layer's own kernel variable (with LoRA enabled,
    Keras' ``layer.kernel`` is the merged sum, not a variable)."""
    return kernel_variable(layer).path


def enable_lora(model, rank, *, alpha=None, exclude=(), layers=None):
    """Enable Keras LoRA of ``rank`` on ``layers`` (default: every target layer of
    ``model`` but ``exclude``, and the blocks of each ``PipelinedBlocks``: a scanned or
    pipelined GPT's, stacked), each factor laid out like its kernel, the update computed
    factored (module docstring). Returns the layers (a stack's template layers each stand
    for its L blocks' layer: ``adapted_layer_count``)."""
    check_lora_rank(rank)
    stacks = [layer for layer in sublayers(model) if isinstance(layer, PipelinedBlocks)] if layers is None else []
    layers = lora_target_layers(model, exclude) if layers is None else list(layers)
    if not layers and not stacks:
        raise ValueError(f"model {model.name!r} has no Dense or EinsumDense layer to adapt with LoRA")
    already = [layer_prefix(layer) for layer in layers if layer.lora_enabled]
    already += [stack.name for stack in stacks if stack.lora is not None]
    if already:
        raise ValueError(f"LoRA is already enabled on {already}; load a fresh model to enable it again")
    for layer in layers:
        with _factor_layouts(layer):
            enable_layer_lora(layer, rank, alpha)
    for stack in stacks:
        stack.enable_lora(rank, alpha)
        layers += lora_layers(stack.template[0])
    return layers


def lora_stacks(model):
    """The ``PipelinedBlocks`` of ``model`` with LoRA enabled (their factors stacked)."""
    return [layer for layer in sublayers(model) if isinstance(layer, PipelinedBlocks) and layer.lora is not None]


def adapted_layer_count(model):
    """The layers of ``model`` LoRA adapts, a stack's counted once for each of its blocks."""
    stacked = sum(len(lora_layers(stack.template[0])) * stack.num_blocks for stack in lora_stacks(model))
    return len(lora_layers(model)) + stacked


def in_layers_form(model):
    """``model`` with no LoRA on stacked blocks: itself, or (a scanned or pipelined GPT whose
    blocks LoRA adapts) the same model as L layers with the same weights and factors
    (``GPTCausalLM.with_block_form``), for what reads adapters layer by layer (the adapter
    files, PEFT's format). Both are held at once while the weights are copied."""
    stacks = lora_stacks(model)
    if not stacks:
        return model
    rank, alpha = stacks[0].lora
    template_prefix = stacks[0].template[0].name + "/"
    in_blocks = [layer_prefix(layer).split(template_prefix, 1)[-1] for layer in lora_layers(stacks[0].template[0])]
    wanted = {layer_prefix(layer) for layer in lora_layers(model)}
    wanted |= {f"block_{index}/{path}" for index in range(stacks[0].num_blocks) for path in in_blocks}

    def adapt(twin):
        enable_lora(twin, rank, alpha=alpha, layers=[t for t in lora_target_layers(twin) if layer_prefix(t) in wanted])

    return model.with_block_form(scan_layers=False, prepare=adapt)


def factor_axes(kernel, distribution=None):
    """Layout axes ``{name: axes}`` of the LoRA factors of a kernel laid out as it is: by
    its value's sharding, or, deferred (an abstract build), by the layout ``distribution``
    gives it when it is initialised."""
    if distribution is not None and deferred_initializer(kernel) is not None:
        layout = variable_layout(kernel) or distribution.get_variable_layout(kernel)
        spec = getattr(layout, "axes", None) or getattr(layout, "spec", None)
    else:
        spec = getattr(getattr(kernel.value, "sharding", None), "spec", None)
    return factor_axes_like(tuple(spec) if spec is not None else (), len(kernel.shape))


def _int4_factor_axes(layer, layout_map):
    """An EinsumDense's int4 kernel is stored flattened to 2-D and packed (``zoo.distribution.layouts``):
    its factors take the layout the map's rule gives the float kernel it stands for."""
    layout = layout_map[kernel_path(layer)]
    return factor_axes_like(tuple(layout.axes) if layout is not None else (), len(layer.original_kernel_shape))


@contextlib.contextmanager
def _factor_layouts(layer):
    """Exact layout-map keys for ``layer``'s LoRA factors while they are created; in an
    abstract build, also each deferred factor's own layout (module docstring)."""
    distribution = keras.distribution.distribution()
    layout_map = distribution_layout_map(distribution)
    if layout_map is None:  # no distribution, or DataParallel: Keras replicates them
        yield
        return
    prefix = layer_prefix(layer)
    if layer.quantization_mode == "int4" and hasattr(layer, "original_kernel_shape"):  # EinsumDense's: flattened
        factors = _int4_factor_axes(layer, layout_map)
    else:
        factors = factor_axes(kernel_variable(layer), distribution)
    wanted = {f"{prefix}/{name}": axes for name, axes in factors.items()}
    with factor_layout_keys(layout_map, wanted, lambda key: getattr(layer, key.rsplit("/", 1)[1])):
        yield


def lora_parameter_count(model):
    """LoRA parameters of ``model``: its factors' sizes, r * (prod(kernel dims but the last)
    + last kernel dim) for each adapted layer (each block of a stack)."""
    return sum(math.prod(variable.shape) for variable in model.weights if is_lora_variable(variable))


def merge_lora(model):
    """A copy of ``model`` without LoRA whose kernels hold ``kernel + (alpha / r) a @ b``.

    Built from ``model.get_config()`` under the current distribution (so laid out as
    ``model`` is); every other weight is copied device to device (both models are held
    at once for that moment: twice the weight memory). The outputs equal the
    LoRA model's up to float rounding.
    """
    adapted = {layer_prefix(layer): layer for layer in lora_layers(model)}
    stacked = {}  # a stack's weights, its kernels merged: {variable path: (R, L/R, ...)}
    for stack in lora_stacks(model):
        merged_stack = stack.merged_weights()
        stacked.update({stack.stacked[path].path: value for path, value in merged_stack.items()})
    if not adapted and not stacked:
        raise ValueError(f"model {model.name!r} has no LoRA-enabled layer to merge")
    source = _weights_by_path(model, skip_lora=True)
    merged = type(model).from_config(model.get_config())
    target = _weights_by_path(merged, skip_lora=False)
    if set(source) != set(target):
        raise ValueError(
            f"cannot merge: the rebuilt {type(model).__name__} has weights {sorted(set(target) - set(source))} the "
            f"LoRA model lacks, and lacks {sorted(set(source) - set(target))}"
        )
    for path, variable in target.items():
        prefix, name = path.rsplit("/", 1)
        value = adapted[prefix].kernel if name == "kernel" and prefix in adapted else source[path].value
        value = stacked.get(path, value)
        # a copy: Keras' compiled steps donate variable buffers, so two models must not share one
        variable.assign(keras.ops.copy(keras.ops.cast(value, variable.dtype)))
    return merged


def _weights_by_path(model, *, skip_lora):
    weights = {}
    for variable in model.weights:
        if skip_lora and is_lora_variable(variable):
            continue
        if variable.path in weights:
            raise ValueError(
                f"model {model.name!r} has two weights at path {variable.path!r}; cannot match weights by path"
            )
        weights[variable.path] = variable
    return weights
