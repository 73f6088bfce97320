"""LoRA on a GPT whose blocks are stacked (``scan_layers=True``: one ``PipelinedBlocks`` run
by one scan): its factors stacked like the other weights, trained to the numbers of the
same model as L layers, and written as the layers' adapters, merged exports and files.

The reference is the model in the layers form (``with_block_form``) with the same weights
and factors (``in_layers_form``), on one device; the stacked model trains under fsdp on
8 devices."""

import contextlib
from pathlib import Path

import keras
import numpy as np
import pytest

from tests.models._gpt_parity import BATCH, CONFIG, language_data
from zoo.bench.step import random_quantized_weights
from zoo.distribution import build_distributed, distribution_for
from zoo.models import GPTCausalLM
from zoo.models.gpt import GPTBackbone
from zoo.models.gpt._block_form import copy_block_form_weights
from zoo.training.lm_finetune import prepare_causal_lm
from zoo.training.lora import (
    adapted_layer_count,
    in_layers_form,
    is_lora_variable,
    load_lora,
    lora_parameter_count,
    merge_lora,
    save_lora,
)
from zoo.training.lora.quantized import building_quantized

LLAMA = Path(__file__).resolve().parents[2] / "fixtures" / "hf" / "llama_gqa_rope_scaling"

RANK, LAYERS, STEPS = 2, 2, 2
STACKED = CONFIG | dict(num_layers=LAYERS, dropout=0.0, scan_layers=True)


def _random_factors(model, seed=1):
    """Non-zero factors (b starts at zero: the adapters would change nothing)."""
    rng = np.random.default_rng(seed)
    for variable in model.weights:
        if is_lora_variable(variable):
            variable.assign(rng.normal(0, 0.2, variable.shape).astype("float32"))


def _compile(model):
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate=1e-2),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )


def _stacked_lora_model(config=STACKED):
    """The stacked model with LoRA as ``zoo finetune --method lora`` prepares it, random factors."""
    keras.utils.set_random_seed(0)
    model = GPTCausalLM(backbone=GPTBackbone(**config))
    model(language_data(BATCH)[0])  # a batch that splits over data=8
    prepare_causal_lm(model, "lora", lora_rank=RANK)
    _random_factors(model)
    return model


def _as_layers(model):
    """``in_layers_form`` with only the factors trainable, as ``prepare_causal_lm`` leaves them."""
    twin = in_layers_form(model)
    for variable in twin.weights:
        variable.trainable = is_lora_variable(variable)
    return twin


def _factors_by_layer(model):
    """{block_<i>/<path>: factor} of either form."""
    factors = {}
    for variable in model.weights:
        if not is_lora_variable(variable):
            continue
        value = np.asarray(variable.value)
        if variable.path.startswith("blocks/"):  # (1, L, ...): row i is block i
            for index, block in enumerate(value.reshape(-1, *value.shape[2:])):
                factors[f"block_{index}/{variable.path.split('/', 1)[1]}"] = block
        else:
            factors[variable.path] = value
    return factors


def _assert_trains_like(stacked, distribution, reference, expected, x, y):
    """``stacked`` fit under ``distribution`` gives ``expected`` (the reference's losses)
    and, after, the factors the ``reference`` (the layers form, trained) holds."""
    with distribution.scope():
        _compile(stacked)
        losses = stacked.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0).history["loss"]
    keras.distribution.set_distribution(None)
    np.testing.assert_allclose(losses, expected, rtol=2e-5)
    after, want = _factors_by_layer(stacked), _factors_by_layer(reference)
    assert sorted(after) == sorted(want)
    for path, value in want.items():
        np.testing.assert_allclose(after[path], value, atol=2e-5, err_msg=path)


PIPELINED = STACKED | dict(scan_layers=False, schedule="gpipe", micro_batches=2)


@pytest.mark.parametrize(
    "config, layout, mesh",
    [(STACKED, "fsdp", "data=8"), (PIPELINED, "pipeline", "data=4,stage=2")],
    ids=["scanned-fsdp", "pipelined"],
)
def test_lora_on_stacked_blocks_trains_like_the_layers(config, layout, mesh):
    """Factors stacked (R, L/R, ...), the stacked kernels frozen; 2 Adam steps of the stacked
    model (scanned under fsdp on data=8; a gpipe pipeline over 2 stages) give the loss and
    the final factors of the layers form on one device."""
    x, y = language_data(STEPS * BATCH)
    reference = _as_layers(_stacked_lora_model(config))
    assert adapted_layer_count(reference) == 7 * LAYERS  # q, k, v, out, gate, up, down in each block
    _compile(reference)
    expected = reference.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0).history["loss"]

    distribution = distribution_for(GPTCausalLM, layout, mesh, config=config)
    stacked = build_distributed(lambda: _stacked_lora_model(config), distribution)
    assert lora_parameter_count(stacked) == lora_parameter_count(reference)
    assert adapted_layer_count(stacked) == 7 * LAYERS
    trained = stacked.trainable_weights  # the stacked factors alone: kernels, norms, embedding frozen
    assert trained and all(v.path.startswith("blocks/") and is_lora_variable(v) for v in trained), trained
    _assert_trains_like(stacked, distribution, reference, expected, x, y)


def test_a_stacked_lora_model_writes_the_layers_adapter_and_merged_files(tmp_path):
    """The adapter file holds block i's factors as layer i's: loaded onto the model as
    layers, it computes the stacked model's logits; merged, the model stays stacked; a
    ``.keras`` file holds the merged kernels. (PEFT's folder and the merged Hugging Face
    folder: tests/training/test_lm_finetune.py's ``--scan-layers`` job.)"""
    model = _stacked_lora_model()
    x = language_data(2)[0]
    logits = np.asarray(model(x))

    save_lora(model, tmp_path / "lora.weights.h5")
    base = model.with_block_form(scan_layers=False)  # the base's weights as layers, no LoRA
    assert np.abs(np.asarray(base(x)) - logits).max() > 1e-3  # without the adapter: other logits
    load_lora(base, tmp_path / "lora.weights.h5")
    np.testing.assert_allclose(np.asarray(base(x)), logits, atol=1e-5)

    merged = merge_lora(model)
    assert merged.backbone.stacked and not any(is_lora_variable(v) for v in merged.weights)
    np.testing.assert_allclose(np.asarray(merged(x)), logits, atol=1e-5)

    model.save(tmp_path / "lm.keras")  # the kernels merged, the factors left out, as Keras saves a LoRA layer
    reloaded = keras.saving.load_model(tmp_path / "lm.keras")
    assert not any(is_lora_variable(v) for v in reloaded.weights)
    np.testing.assert_allclose(np.asarray(reloaded(x)), logits, atol=1e-5)


def _stacked_qlora_model(mode="int8"):
    """A QLoRA model built quantized (``quantized_policy``), as ``zoo finetune --method
    qlora`` prepares it, its int8 base random (the bench's), its factors random."""
    keras.utils.set_random_seed(0)
    with building_quantized(mode):
        model = GPTCausalLM(backbone=GPTBackbone(**STACKED))
    model(language_data(BATCH)[0])
    random_quantized_weights(model, seed=0)
    prepare_causal_lm(model, "qlora", lora_rank=RANK, quantize=mode)
    _random_factors(model)
    return model


@pytest.mark.parametrize(
    "mode, layout, mesh",
    [("int8", "fsdp", "data=8"), ("int4", "fsdp", "data=8"), ("int4", "fsdp+tp", "data=2,model=4")],
)
def test_qlora_on_stacked_blocks_trains_like_the_layers(mode, layout, mesh):
    """QLoRA over a stacked int8 / int4 base: the template's layers built quantized, so the
    stack holds int8 kernels (1, L, ...; int4 packed two to a byte) and their scales, the
    factors laid out as the kernels
    (their C over data); 2 Adam steps under fsdp on data=8 give
    the loss and the factors of the same int8 weights as layers on one device (``in_layers_form``:
    int8 layers too). The stacked model refuses to merge (no float kernel) and names the
    way: its adapter."""
    x, y = language_data(STEPS * BATCH)
    stacked_reference = _stacked_qlora_model(mode)
    assert str(stacked_reference.backbone.pipelined_blocks.stacked["mlp/up/kernel"].dtype) == "int8"  # int4: packed
    reference = _as_layers(stacked_reference)  # quantized layers: built under the stacked model's policy
    assert {v.path: str(v.dtype) for v in reference.weights}["block_1/mlp/up/kernel"] == "int8"
    _compile(reference)
    expected = reference.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0).history["loss"]

    distribution = distribution_for(GPTCausalLM, layout, mesh, config=STACKED)
    stacked = build_distributed(lambda: _stacked_qlora_model(mode), distribution)
    assert lora_parameter_count(stacked) == lora_parameter_count(reference)
    factors = stacked.backbone.pipelined_blocks.stacked  # laid out as their stacked kernel: C over data
    assert tuple(factors["mlp/up/lora_kernel_a"].value.sharding.spec) == (None, None, "data", None)
    if layout == "fsdp+tp":  # an int4 (C, H x D / 2) kernel: its rows over data, its columns (the heads) over model
        assert tuple(factors["attention/query/kernel"].value.sharding.spec) == (None, None, "data", "model")
    elif mode == "int8":  # int4's packed down kernel splits its rows (F) instead: b whole
        assert tuple(factors["mlp/down/lora_kernel_b"].value.sharding.spec) == (None, None, None, "data")
    _assert_trains_like(stacked, distribution, reference, expected, x, y)
    with pytest.raises(ValueError, match=r"has no float kernel to merge into: save the adapter alone"):
        merge_lora(stacked)


def test_qlora_on_a_stacked_float_base_is_refused_in_one_line():
    model = GPTCausalLM(backbone=GPTBackbone(**STACKED))
    model(language_data(1)[0])
    with pytest.raises(
        ValueError, match=r"^method qlora on a GPT whose blocks are stacked \(blocks: quantized not at all\) needs"
    ):
        prepare_causal_lm(model, "qlora", lora_rank=RANK)
    with building_quantized("int8"):
        quantized = GPTCausalLM(backbone=GPTBackbone(**STACKED))
    with pytest.raises(ValueError, match=r"'block_0/attention/query/kernel': the source holds int8, the .* float32"):
        copy_block_form_weights(quantized, model.with_block_form(scan_layers=False))  # never cast into floats


def test_a_hugging_face_folder_loads_quantized_into_the_stack():
    """Each block's kernel quantized as it is read (one float kernel at a time), into the
    stack: the logits of the same folder loaded quantized as layers, exactly."""
    x = language_data(2)[0] % 100
    with building_quantized("int8"):
        layers = GPTCausalLM.from_preset(LLAMA)
        stacked = GPTCausalLM.from_preset(LLAMA, scan_layers=True)
    assert str(stacked.backbone.pipelined_blocks.stacked["attention/query/kernel"].dtype) == "int8"
    np.testing.assert_array_equal(np.asarray(stacked(x)), np.asarray(layers(x)))


@pytest.mark.parametrize("quantize", [None, "int4"])
def test_lora_on_stacked_blocks_in_an_abstract_build_initialises_nothing(quantize):
    """``zoo plan`` builds a fine-tune's model abstractly (``abstract_build``): enabling LoRA on
    the stack reads each kernel's layout without its value (reading the value initialised
    the whole stack: a 70B int4 base's was 9.4 GB on the host), and the factors are still
    split as their kernels under fsdp, an int4 EinsumDense's (kernel packed in 2-D) as the
    float kernel it stands for."""
    from zoo._compat import deferred_initializer
    from zoo.measure.compiled_step import abstract_build, layout_under

    distribution = distribution_for(GPTCausalLM, "fsdp", "data=8", config=STACKED)

    def build():
        with building_quantized(quantize) if quantize else contextlib.nullcontext():
            model = GPTCausalLM(backbone=GPTBackbone(**STACKED))
        prepare_causal_lm(model, "qlora" if quantize else "lora", lora_rank=RANK, quantize=quantize)
        return model

    stacked = abstract_build(build, _compile, distribution).backbone.pipelined_blocks.stacked
    assert all(deferred_initializer(variable) is not None for variable in stacked.values())
    for layer in ("mlp/gate", "attention/query"):  # a Dense (C, F) and an EinsumDense (C, H, D)
        factor = layout_under(stacked[f"{layer}/lora_kernel_a"], distribution)  # (1, L, C, r), (1, L, C, H, r)
        assert tuple(factor.axes)[:3] == (None, None, "data"), (layer, factor.axes)
