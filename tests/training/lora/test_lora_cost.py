"""LoRA that costs what LoRA should (issue 29 item 5): the zoo computes a LoRA layer as
``x @ kernel + (alpha / r) (x @ a) @ b``, never with the merged kernel, so the frozen
kernel's (C, F) weight gradient is not formed.

- Outputs and gradients (input and factors) equal Keras' merged-kernel LoRA: plain
  Dense / EinsumDense (the attention projections' equations) on one device and under a
  tp layout map on the 8 simulated devices (GSPMD), and the zoo's tensor-parallel layers
  (column / row, Megatron SP, collective matmul, the gated MLP) on data=2,model=4.
- FLOPs of value_and_grad over the factors of gpt_tiny fall by the frozen dW matmuls,
  derived from the shapes below (``expected_saving``).
- In an abstract build under fsdp the factors are laid out like their kernels.

Keras' merged form is what a layer computes with ``Dense.call`` / ``EinsumDense.call``
after ``layer.enable_lora``; the zoo's Dense subclasses factor in their own ``call``, so
the merged reference sets Keras' ``call`` on the instance (``_merged``).
"""

import functools
import types

import jax
import keras
import numpy as np
import pytest

from tests.layers.test_tensor_parallel_layers import (
    LAYERS,
    assert_same,
    build,
    inputs,
    output_and_grads,
    tensor_parallel,
)
from zoo.distribution import CheckedModelParallel, make_mesh
from zoo.layers._tensor_parallel import factored_lora_call, kernel_variable
from zoo.layers.parallel_mlp import ParallelMLP
from zoo.measure.comms_report import FAST_COMPILE
from zoo.measure.compiled_step import abstract_build, layout_under
from zoo.models import GPTCausalLM
from zoo.training.lora._layers import enable_lora, is_lora_variable, lora_target_layers

RANK = 2
B, T, C, H, D = 2, 8, 16, 4, 8  # the plain-layer model: batch, sequence, width, heads, head dim


def _merged(layer):
    """Make ``layer`` (LoRA enabled) compute as Keras does: ``Dense.call`` / ``EinsumDense.call``
    with the merged kernel ``layer.kernel``."""
    kind = keras.layers.EinsumDense if isinstance(layer, keras.layers.EinsumDense) else keras.layers.Dense
    layer.call = types.MethodType(kind.call, layer)


def _factors_nonzero(layers, seed=3):
    """LoRA b starts at zero: give every factor values so the update counts."""
    rng = np.random.default_rng(seed)
    for layer in layers:
        for variable in (layer.lora_kernel_a, layer.lora_kernel_b):
            variable.assign(rng.normal(0, 0.3, variable.shape).astype("float32"))


# --- plain Dense / EinsumDense ----------------------------------------------------------------


def _plain_model():
    """x (B, T, C) -> Dense -> query-like "btc,chd->bthd" -> output-like "bthd,hdc->btc"."""
    keras.utils.set_random_seed(0)
    x = keras.Input((T, C), batch_size=B)
    h = keras.layers.Dense(C, activation="tanh", name="dense")(x)
    q = keras.layers.EinsumDense("btc,chd->bthd", (T, H, D), bias_axes="hd", name="query")(h)
    y = keras.layers.EinsumDense("bthd,hdc->btc", (T, C), name="output")(q)
    return keras.Model(x, y)


PLAIN_RULES = {
    "dense/kernel": (None, "model"),
    "query/kernel": (None, "model", None),
    "output/kernel": ("model", None, None),
}


def _tp_distribution():
    layout_map = keras.distribution.LayoutMap(make_mesh("data=2,model=4"))
    for key, axes in PLAIN_RULES.items():
        layout_map[key] = axes
    return CheckedModelParallel(layout_map=layout_map, batch_dim_name="data")


def _enable_lora(model, layers, merged):
    """LoRA of rank RANK: on ``layers`` computing through Keras' own call (``merged``), or as fine-tuning enables it."""
    if merged:
        for layer in layers:
            layer.enable_lora(RANK)
            _merged(layer)
    else:
        enable_lora(model, RANK)


def _plain_lora(distribution, merged):
    keras.distribution.set_distribution(distribution)
    model = _plain_model()
    layers = [model.get_layer(name) for name in ("dense", "query", "output")]
    _enable_lora(model, layers, merged)
    _factors_nonzero(layers)
    return model


def _model_output_and_grads(model, x, cotangent):
    """(out, d trainable (the factors, the biases), d x) of sum(model(x) * cotangent)."""
    distribution = keras.distribution.distribution()
    if distribution is not None:
        x = keras.distribution.distribute_tensor(x, distribution.get_data_layout(x.shape))
    trainable = [v.value for v in model.trainable_variables]
    non_trainable = [v.value for v in model.non_trainable_variables]

    @functools.partial(jax.jit, compiler_options=FAST_COMPILE)
    def run(trainable, x, cotangent):
        out, pullback = jax.vjp(lambda t, x: model.stateless_call(t, non_trainable, x)[0], trainable, x)
        return out, *pullback(cotangent)

    return jax.tree.map(np.asarray, run(trainable, x, cotangent))


@functools.cache
def _plain_reference():
    model = _plain_lora(None, merged=True)
    x, cotangent = inputs((B, T, C), 1), inputs((B, T, C), 2)
    return x, cotangent, [v.path for v in model.trainable_variables], _model_output_and_grads(model, x, cotangent)


@pytest.mark.parametrize("layout", ["one device", "tp"])
def test_plain_layers_match_keras_merged_lora(layout):
    x, cotangent, paths, expected = _plain_reference()
    model = _plain_lora(_tp_distribution() if layout == "tp" else None, merged=False)
    assert [v.path for v in model.trainable_variables] == paths
    assert all(
        layer.call.__func__ is factored_lora_call for layer in map(model.get_layer, ("dense", "query", "output"))
    )
    if layout == "tp":  # the factors follow their kernels' layouts
        query = model.get_layer("query")
        assert tuple(query.lora_kernel_a.value.sharding.spec) == (None, "model", None)
        assert tuple(model.get_layer("dense").lora_kernel_b.value.sharding.spec) == (None, "model")
    assert_same(_model_output_and_grads(model, x, cotangent), expected, paths)


# --- the zoo's tensor-parallel layers -------------------------------------------------------


TP_KINDS = ["column-sp", "row-sp", "gated-mlp", "mlp-sp-collective"]


def _dense_layers(layer):
    return layer.projections if isinstance(layer, ParallelMLP) else [layer]


@pytest.mark.parametrize("kind", TP_KINDS)
def test_tensor_parallel_layers_match_keras_merged_lora(kind):
    make_layer, shape = LAYERS[kind]
    reference = build(make_layer, shape, lora_rank=RANK)
    _factors_nonzero(_dense_layers(reference))
    for layer in _dense_layers(reference):
        _merged(layer)
    x = inputs(shape, 4)
    cotangent = inputs(reference.compute_output_shape(shape), 5)
    expected = output_and_grads(reference, x, cotangent)
    layer = build(make_layer, shape, tensor_parallel("data=2,model=4"), reference.get_weights(), lora_rank=RANK)
    assert_same(output_and_grads(layer, x, cotangent), expected, [v.path for v in layer.trainable_variables])


# --- FLOPs ------------------------------------------------------------------------------------


GPT_BATCH, GPT_LENGTH = 2, 16  # N = 32 tokens


def _gpt_lora(merged):
    keras.utils.set_random_seed(0)
    model = GPTCausalLM.from_config_name("gpt_tiny")  # C 32, F 64, 4 heads of 8, 2 KV heads, V 256, untied lm_head
    model(np.zeros((GPT_BATCH, GPT_LENGTH), "int32"))
    layers = lora_target_layers(model)  # q, k, v, output, gate, up, down per block; lm_head
    _enable_lora(model, layers, merged)
    for variable in model.weights:
        variable.trainable = is_lora_variable(variable)
    return model, layers


def _step_flops(model):
    """(lowered, compiled) ``cost_analysis()["flops"]`` of jit(value_and_grad) of a loss
    of the logits over the trainable variables (the factors)."""
    non_trainable = [v.value for v in model.non_trainable_variables]
    tokens = np.zeros((GPT_BATCH, GPT_LENGTH), "int32")

    def loss(trainable):
        logits, _ = model.stateless_call(trainable, non_trainable, tokens)
        return keras.ops.sum(keras.ops.square(logits))

    lowered = jax.jit(jax.value_and_grad(loss)).lower([v.value for v in model.trainable_variables])
    return lowered.cost_analysis()["flops"], lowered.compile().cost_analysis()["flops"]


def _in_out(layer):
    """(I, O, L) of a layer's kernel: the product of the dims it contracts with the input,
    of those it keeps in the output, and its last dim (b's width)."""
    shape = tuple(kernel_variable(layer).shape)
    if not isinstance(layer, keras.layers.EinsumDense):
        return shape[0], shape[1], shape[1]
    inputs_, output = layer.equation.split("->")
    letters = inputs_.split(",")[1]
    kept = [size for letter, size in zip(letters, shape) if letter in output]
    return int(np.prod(shape)) // int(np.prod(kept)), int(np.prod(kept)), shape[-1]


def expected_saving(layers, tokens, rank, dead_input_gradient=()):
    """Matmul FLOPs (2 per multiply-add) Keras' merged LoRA spends beyond the factored form.

    Per layer, kernel I x O (L its last dim, O / L the other kept dims), N tokens:
    merged: the merge a @ b (2 I O r), d(merged kernel) = x^T dy (2 N I O: the frozen
    kernel's dW), its projections d(a) = dW b^T and d(b) = a^T dW (2 I O r each);
    factored: x @ a (2 N I (O/L) r), (x a) @ b (2 N O r), d(x a) = dy b^T (2 N O r),
    d(b) = (x a)^T dy (2 N O r), d(a) = x^T d(x a) and d(x) += d(x a) a^T
    (2 N I (O/L) r each). Both compute x @ kernel and d(x) through the kernel. Layers
    in ``dead_input_gradient`` (no trainable weight upstream) skip d(x) in both forms.
    """
    total = 0
    for layer in layers:
        i, o, last = _in_out(layer)
        low = 2 * tokens * i * (o // last) * rank  # one x @ a -shaped matmul
        factored = 2 * low + 3 * 2 * tokens * o * rank + (0 if layer in dead_input_gradient else low)
        total += 2 * tokens * i * o + 3 * 2 * i * o * rank - factored
    return total


def test_gpt_step_flops_fall_by_the_frozen_weight_gradients():
    merged_lowered, merged_compiled = _step_flops(_gpt_lora(merged=True)[0])
    model, layers = _gpt_lora(merged=False)
    lowered, compiled = _step_flops(model)
    # block_0's query/key/value read the frozen embeddings: nothing upstream needs d(x)
    dead = [
        layer
        for layer in layers
        if layer.name in ("query", "key", "value") and kernel_variable(layer).path.startswith("block_0/")
    ]
    saving = expected_saving(layers, GPT_BATCH * GPT_LENGTH, RANK, dead)
    assert saving == 1_429_504  # of which the frozen kernels' dW, 2 N I O summed: 1,703,936
    # As JAX emits the step (before XLA), the drop is the matmuls derived above, within
    # 1% (the rest: the elementwise scale and add of each form).
    assert merged_lowered - lowered == pytest.approx(saving, rel=0.02)
    # Compiled, XLA:CPU keeps a few more matmuls in the merged form (it recomputes the
    # merged-kernel forward products rather than reuse them): the drop is at least the saving.
    assert merged_compiled - compiled >= 0.98 * saving
    assert compiled < 0.75 * merged_compiled


# --- abstract builds ----------------------------------------------------------------------


def test_factors_follow_their_kernels_in_an_abstract_build():
    """No weight allocated (``abstract_build``): the kernels' layouts come from the
    distribution, and each factor gets its layout before the exact keys are removed."""
    mesh = make_mesh("data=8")
    layout_map = keras.distribution.LayoutMap(mesh)
    layout_map["dense/kernel"] = ("data", None)  # fsdp-style: the input dim split
    layout_map["output/kernel"] = (None, None, "data")  # (H, D, C/N): the output dim split
    distribution = CheckedModelParallel(layout_map=layout_map, batch_dim_name="data")

    def build_model():
        model = _plain_model()
        enable_lora(model, RANK)
        return model

    model = abstract_build(build_model, lambda m: m.compile(optimizer="sgd", loss="mse"), distribution)
    axes = {v.path: tuple(layout_under(v, distribution).axes) for v in model.weights if is_lora_variable(v)}
    assert axes == {
        "dense/lora_kernel_a": ("data", None),
        "dense/lora_kernel_b": (None, None),
        "query/lora_kernel_a": (None, None, None),
        "query/lora_kernel_b": (None, None),
        "output/lora_kernel_a": (None, None, None),
        "output/lora_kernel_b": (None, "data"),
    }
