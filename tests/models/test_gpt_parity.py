"""GPTCausalLM trains to the single-device numbers under every layout, and its
weights (and optimizer state) are really placed as ``get_layout_map`` says.

8 simulated devices; a tiny model (1 block for training, 2 for placement; C=32, 8 heads
/ 4 KV heads, F=64, V=256, tied embeddings), T=16, batch 8, 3 SGD-with-momentum steps with dropout on. Each layout's
run is compared by ``zoo.distribution.parity.check_parity`` with the single-device run
on per-step losses, first-batch gradients, outputs after training and final weights; the
single-device run is done once for all layouts (``reference=``; the same model:
``megatron_sp`` changes nothing on one device), which saves a third of the
compile time. One more model, 8 query / 2 KV heads, trains under ``tp`` on model=4:
fewer KV heads than the model axis, replicated (Megatron's rule).
"""

import keras
import numpy as np
import pytest

from tests.models._gpt_parity import (
    BATCH,
    STEPS,
    TRAIN_LAYERS,
    build_lm,
    compile_sgd,
    language_data,
    layout_distribution,
    model_config,
)
from zoo.distribution import build_distributed, parity


@pytest.fixture(scope="module")
def reference():
    """The single-device run, shared by the layouts (``check_parity(reference=...)``)."""
    config = model_config("data", num_layers=TRAIN_LAYERS)
    return parity.reference_run(lambda: build_lm(config), compile_sgd, *language_data(), steps=STEPS, batch_size=BATCH)


@pytest.fixture(scope="module")
def reference_kv2():
    """The single-device run of the 8 query / 2 KV head model."""
    config = model_config("data", num_layers=TRAIN_LAYERS, num_key_value_heads=2)
    return parity.reference_run(lambda: build_lm(config), compile_sgd, *language_data(), steps=STEPS, batch_size=BATCH)


def _parity_report(layout, mesh, reference, **overrides):
    config = model_config(layout, **{"num_layers": TRAIN_LAYERS, **overrides})
    distribution = layout_distribution(layout, mesh, config)
    return parity.check_parity(
        lambda: build_lm(config), compile_sgd, distribution, *language_data(), steps=STEPS, reference=reference
    )


@pytest.mark.parametrize(
    "layout, mesh",
    [
        ("data", "data=8"),
        ("fsdp", "data=8"),
        ("tp", "data=2,model=4"),
        ("tp+sp", "data=2,model=4"),
        ("fsdp+tp", "data=2,model=4"),
        (
            "context-ring",
            "data=2,seq=4",
        ),  # gather and Ulysses under fit: tests/distribution/test_context_parallel.py, tests/layers
    ],
)
def test_three_steps_of_fit_match_one_device(layout, mesh, reference):
    report = _parity_report(layout, mesh, reference)
    assert report.passed, "\n".join(report.format())
    assert len(report.reference_losses) == STEPS
    assert report.reference_losses[2] < report.reference_losses[0]  # not vacuous: it trained


def test_fewer_kv_heads_than_the_model_axis_match_one_device(reference_kv2):
    """2 KV heads on model=4: key/value kernels replicated, each device uses one KV head
    (under tp+sp too: tests/layers/test_multi_head_attention_parallel.py)."""
    report = _parity_report("tp", "data=2,model=4", reference_kv2, num_key_value_heads=2)
    assert report.passed, "\n".join(report.format())


# path -> expected PartitionSpec per layout (None entries written out)
EXPECTED_SPECS = {
    "fsdp": {
        "token_embedding/embeddings": ("data", None),
        "block_0/attention/query/kernel": ("data", None, None),
        "block_1/attention/key/kernel": ("data", None, None),
        "block_0/attention/output/kernel": (None, None, "data"),
        "block_1/mlp/up/kernel": ("data", None),
        "block_0/mlp/down/kernel": (None, "data"),
        "lm_head/kernel": (None, "data"),  # untied models only (see model_config); V split, as the table
    },
    "tp": {
        "token_embedding/embeddings": ("model", None),
        "block_0/attention/query/kernel": (None, "model", None),
        "block_1/attention/value/kernel": (None, "model", None),
        "block_0/attention/output/kernel": ("model", None, None),
        "block_1/mlp/gate/kernel": (None, "model"),
        "block_0/mlp/down/kernel": ("model", None),
        "lm_head/kernel": (None, "model"),
    },
    "fsdp+tp": {  # the blocks' layers split their own weights over data too (FSDP inside TP)
        "token_embedding/embeddings": ("model", "data"),
        "block_0/attention/key/kernel": ("data", "model", None),
        "block_1/attention/output/kernel": ("model", None, "data"),
        "block_0/mlp/up/kernel": ("data", "model"),
        "block_1/mlp/down/kernel": ("model", "data"),
        "lm_head/kernel": ("data", "model"),
    },
}
EXPECTED_SPECS["tp+sp"] = EXPECTED_SPECS["tp"]
MESHES = {"fsdp": "data=8", "tp": "data=2,model=4", "tp+sp": "data=2,model=4", "fsdp+tp": "data=2,model=4"}


@pytest.mark.parametrize("layout", sorted(EXPECTED_SPECS))
def test_weights_are_really_sharded(layout):
    config = model_config(layout, tie_word_embeddings=False)
    model = build_distributed(lambda: build_lm(config), layout_distribution(layout, MESHES[layout], config))
    specs = {v.path: tuple(v.value.sharding.spec) for v in model.weights}
    for path, spec in EXPECTED_SPECS[layout].items():
        assert specs[path] + (None,) * (len(spec) - len(specs[path])) == spec, (path, specs[path])
    for path in ("final_norm/scale", "block_0/attention_norm/scale"):
        assert all(entry is None for entry in specs[path]), (path, specs[path])
    assert model.backbone.megatron_sp == (layout == "tp+sp")


def test_fsdp_shards_the_optimizer_state_too():
    config = model_config("fsdp", num_key_value_heads=2)  # GQA 8/2: fsdp does not split heads
    model = build_distributed(lambda: build_lm(config), layout_distribution("fsdp", "data=8", config))
    optimizer = keras.optimizers.Adam(1e-3)
    optimizer.build(model.trainable_variables)
    slots = {v.path: v for v in optimizer.variables}
    embedding_slots = [v for path, v in slots.items() if "token_embedding_embeddings" in path]
    assert len(embedding_slots) == 2, sorted(slots)  # Adam's momentum and velocity
    for slot in embedding_slots:
        assert tuple(slot.value.sharding.spec) == ("data", None)
        assert {shard.data.shape for shard in slot.value.addressable_shards} == {(256 // 8, 32)}
    query_slots = [v for path, v in slots.items() if "block_0_attention_query_kernel" in path]
    assert query_slots and all(tuple(s.value.sharding.spec)[0] == "data" for s in query_slots)


# Gemma 2/3's pieces on the tiny model: offset RMSNorm before and after each sublayer,
# tanh-GeGLU, sqrt(C)-scaled embeddings, qk-norm, attention and final logit soft-capping
# (caps small enough to bite), a query scale of its own, and a window of 4 on block 0 only
# (block 1 global) with a local RoPE base of its own: T = 16 runs past the window.
GEMMA_PIECES = dict(
    num_layers=2,
    mlp="geglu_tanh",
    norm="rms_offset",
    post_norms=True,
    scale_embeddings=True,
    qk_norm=True,
    attention_scale=0.3,
    attention_logit_softcap=2.0,
    final_logit_softcap=4.0,
    sliding_window=4,
    sliding_window_layers=[0],
    rope_max_wavelength=10000.0,
    local_rope_max_wavelength=100.0,
)


@pytest.fixture(scope="module")
def reference_gemma():
    """The single-device run of the Gemma-style model."""
    config = model_config("data", **GEMMA_PIECES)
    return parity.reference_run(lambda: build_lm(config), compile_sgd, *language_data(), steps=STEPS, batch_size=BATCH)


@pytest.mark.parametrize(
    "layout, mesh",
    [
        ("tp", "data=2,model=4"),
        ("fsdp+tp", "data=2,model=4"),
        ("tp+sp", "data=2,model=4"),
        ("context-ring", "data=2,seq=4"),
    ],
)
def test_gemma_pieces_train_to_the_one_device_numbers(layout, mesh, reference_gemma):
    """The Gemma 2/3 pieces under the layouts that split what they touch (heads and the
    MLP over model, the sequence under tp+sp and context): losses, gradients, outputs and
    weights of 3 fit steps equal one device's."""
    report = _parity_report(layout, mesh, reference_gemma, **GEMMA_PIECES)
    assert report.passed, "\n".join(report.format())
    assert report.reference_losses[2] < report.reference_losses[0]


PROMPT, NEW = 4, 3


@pytest.fixture(scope="module")
def one_device_generation():
    """The generating model's weights, built on one device, and its greedy tokens per batch
    size (the first B prompts)."""
    keras.utils.set_random_seed(5)
    config = model_config("data", num_layers=TRAIN_LAYERS, dropout=0.0)
    model = build_lm(config)
    prompts = language_data(count=4)[0][:, :PROMPT]
    generated = {batch: np.asarray(model.generate(prompts[:batch], NEW)) for batch in (1, 2)}
    return [np.asarray(v) for v in model.weights], prompts, generated


@pytest.mark.parametrize("layout, batch", [("fsdp+tp", 1), ("tp", 1), ("fsdp+tp", 2)])
def test_cached_generation_under_the_tensor_parallel_layouts_equals_one_device(layout, batch, one_device_generation):
    """A prompt or two decode on data=2,model=4 to the one-device greedy tokens: a batch that
    does not divide 'data' runs whole on every device (ParallelPlan.for_batch), the FSDP
    weights gathered before the MLP's shard_map (it refused 1 prompt: 'batch size 1 is not
    divisible by the data mesh axis')."""
    weights, prompts, generated = one_device_generation
    config = model_config(layout, num_layers=TRAIN_LAYERS, dropout=0.0)
    keras.distribution.set_distribution(layout_distribution(layout, "data=2,model=4", config))
    split = build_lm(config)
    for variable, value in zip(split.weights, weights):
        variable.assign(value)
    np.testing.assert_array_equal(np.asarray(split.generate(prompts[:batch], NEW)), generated[batch])
