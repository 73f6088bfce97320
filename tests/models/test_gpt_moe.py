"""A Mixture-of-Experts GPTCausalLM trains to the single-device numbers under the expert
layouts, its experts are placed 1/E_p per device, and it generates with a KV cache: on one
device as a full forward pass does, and under every expert layout, for batches that divide
data x expert and batches that do not, the one-device tokens. A LoRA-adapted LM head keeps
its gather under fsdp and its fit step compiles (compile-only).

One block (the MoE block; every shape reaches every branch), C=32, 8 query / 4 KV heads,
E=4 experts of width 16, T=16, batch 8, 3 SGD steps with dropout, the router's
load-balancing loss (0.05) and z-loss (0.01) in the loss. Two models, each with its one
single-device reference run shared by its layouts: k=2 with a shared expert
(renormalised, Mixtral + Qwen2-MoE), k=1 without one (not renormalised). Between them
the layouts cover E_p = 2 and 4, k = 1 and 2, shared experts on and off, expert alone,
data x expert, fsdp x expert and expert x model; two more models (k=1 with a shared
expert, k=2 without) take each expert layout in tier 2, so every layout meets k = 1 and 2,
the shared expert on and off, and E_p = 2 and 4 among its cases; and context (the experts replicated,
each device routes its share of the sequence). tp (no expert axis, the experts' F over
model) was checked the same way once and not kept: expert+tp's psum over model and
context's local routing reach its two branches. data, fsdp and fsdp+tp
were checked the same way once (same tolerances), not kept: tp reaches their branch.
"""

import keras
import numpy as np
import pytest

from tests.models._gpt_parity import (
    BATCH,
    LENGTH,
    STEPS,
    as_stacked,
    build_lm,
    compile_sgd,
    language_data,
    model_config,
)
from zoo.distribution import distribution_for, parity
from zoo.measure.compiled_step import abstract_build, compile_fit_step
from zoo.models.gpt import GPTCausalLM
from zoo.training.finetune import enable_lora, is_lora_variable

MOE = dict(
    num_layers=1,
    num_experts=4,
    moe_intermediate_dim=16,
    router_aux_loss_coefficient=0.05,
    router_z_loss_coefficient=0.01,
)
MODELS = {
    "k2_shared": MOE | dict(num_experts_per_token=2, shared_expert_dim=24, normalize_router_weights=True),
    "k1": MOE | dict(num_experts_per_token=1, shared_expert_dim=0, normalize_router_weights=False),
    # tier 2 (tests/_tiers.py): the other pairings of k and the shared expert
    "k1_shared": MOE | dict(num_experts_per_token=1, shared_expert_dim=24, normalize_router_weights=False),
    "k2": MOE | dict(num_experts_per_token=2, shared_expert_dim=0, normalize_router_weights=True),
}


@pytest.fixture(scope="module")
def references():
    """One single-device run per model, computed when a test first asks for it."""
    runs = {}

    def reference(name):
        if name not in runs:
            config = model_config("data", **MODELS[name])
            runs[name] = parity.reference_run(
                lambda: build_lm(config), compile_sgd, *language_data(), steps=STEPS, batch_size=BATCH
            )
        return runs[name]

    return reference


@pytest.mark.parametrize(
    "name, layout, mesh",
    [
        ("k2_shared", "expert", "data=2,expert=4"),  # E_p = 4, batch over data x expert
        ("k2_shared", "fsdp+expert", "data=2,expert=4"),  # dense weights and the experts' C over data
        ("k2_shared", "expert+tp", "data=2,expert=2,model=2"),  # E_p = 2, F over model
        ("k1", "expert", "data=4,expert=2"),  # k = 1, no shared expert
        ("k1", "context", "data=2,seq=4"),  # the sequence split over seq: each device routes its own tokens
        # the matrix (tier 2): every expert layout with k = 1 and 2, shared expert on and off, E_p = 2 and 4
        ("k1_shared", "expert", "data=2,expert=4"),
        ("k1_shared", "fsdp+expert", "data=4,expert=2"),
        ("k1_shared", "expert+tp", "data=1,expert=4,model=2"),
        ("k2", "expert", "data=4,expert=2"),
        ("k2", "fsdp+expert", "data=2,expert=4"),
        ("k2", "expert+tp", "data=2,expert=2,model=2"),
    ],
)
def test_three_steps_of_fit_match_one_device(name, layout, mesh, references):
    config = model_config("data", **MODELS[name])
    distribution = distribution_for(GPTCausalLM, layout, mesh, config=config)
    report = parity.check_parity(
        lambda: build_lm(config), compile_sgd, distribution, *language_data(), steps=STEPS, reference=references(name)
    )
    assert report.passed, "\n".join(report.format())
    assert report.reference_losses[2] < report.reference_losses[0]  # not vacuous: it trained


def test_experts_are_split_and_the_router_statistics_reach_the_logs():
    """E_p = 4: each device holds 1 of the 4 experts of every expert weight; fit's logs
    carry the router statistics (dropless: nothing dropped)."""
    config = model_config("data", **MODELS["k2_shared"])
    distribution = distribution_for(GPTCausalLM, "expert", "data=2,expert=4", config=config)
    keras.distribution.set_distribution(distribution)
    model = build_lm(config)
    experts = [v for v in model.weights if "/expert_" in v.path]
    assert len(experts) == 3
    for variable in experts:
        shard = variable.value.addressable_shards[0].data
        assert tuple(variable.value.sharding.spec)[0] == "expert"
        assert shard.shape[0] == 1 and shard.size * 4 == variable.value.size  # exactly 1/E_p per device
    compile_sgd(model)
    x, y = language_data()
    history = model.fit(x[:BATCH], y[:BATCH], batch_size=BATCH, epochs=1, verbose=0).history
    assert history["router_dropped_fraction"] == [0.0]
    assert 1.0 <= history["router_max_load"][0] <= 4.0 / 2  # at most every assignment on k of E experts


# scan_layers: the MoE blocks stacked (every block sparse), two of them, dropout off (the two forms draw no masks)
SCANNED_MOE = model_config("data", **MODELS["k2_shared"]) | dict(num_layers=2, scan_layers=True, dropout=0.0)


@pytest.fixture(scope="module")
def scanned_reference():
    return parity.reference_run(
        lambda: build_lm(SCANNED_MOE), compile_sgd, *language_data(), steps=STEPS, batch_size=BATCH
    )


def test_stacked_moe_blocks_train_to_the_layers_numbers(scanned_reference):
    """The same weights as two layers compute the same losses (the router's load-balancing
    and z-losses included: each block's, summed), gradients, outputs and weights; fit's
    logs carry the router statistics, the mean over the stacked blocks."""
    layers = parity.reference_run(
        lambda: build_lm(SCANNED_MOE).with_block_form(scan_layers=False),
        compile_sgd,
        *language_data(),
        steps=STEPS,
        batch_size=BATCH,
    )
    report = parity.compare_runs(scanned_reference, as_stacked(layers, 2))
    assert report.passed, "\n".join(report.format())
    model = build_lm(SCANNED_MOE)
    compile_sgd(model)
    x, y = language_data()
    history = model.fit(x[:BATCH], y[:BATCH], batch_size=BATCH, epochs=1, verbose=0).history
    assert history["router_dropped_fraction"] == [0.0]
    assert 1.0 <= history["router_max_load"][0] <= 4.0 / 2
    assert model.backbone.pipelined_blocks.stacked["mlp/router_statistics"].shape == (1, 2, 2)  # (1, L, 2)


@pytest.mark.parametrize(
    "layout, mesh",
    [
        ("expert+tp", "data=2,expert=2,model=2"),  # the exchange and Megatron's shared expert inside the loop
        ("expert", "data=2,expert=4"),
        ("fsdp+expert", "data=2,expert=4"),  # the experts' C over data, gathered by the MoE layer in the loop
    ],
)
def test_stacked_moe_fit_matches_one_device(scanned_reference, layout, mesh):
    distribution = distribution_for(GPTCausalLM, layout, mesh, config=SCANNED_MOE)
    report = parity.check_parity(
        lambda: build_lm(SCANNED_MOE), compile_sgd, distribution, *language_data(), steps=STEPS,
        reference=scanned_reference,
    )  # fmt: skip
    assert report.passed, "\n".join(report.format())
    experts = distribution.get_variable_layout(build_lm(SCANNED_MOE).backbone.pipelined_blocks.stacked["mlp/expert_up"])
    assert tuple(experts.axes)[:3] == (None, None, "expert")  # (1, L, E/N_e, C, F): E split behind (1, L)


def test_bad_meshes_are_named():
    config = model_config("data", **MODELS["k2_shared"])
    with pytest.raises(ValueError, match="num_experts=4 is not divisible by the 'expert' mesh axis of size 8"):
        distribution_for(GPTCausalLM, "expert", "expert=8", config=config)
    with pytest.raises(ValueError, match="num_experts=0"):
        distribution_for(GPTCausalLM, "expert", "data=2,expert=4", config=model_config("data", num_layers=1))
    with pytest.raises(ValueError, match="expert"):
        distribution_for(GPTCausalLM, "expert", "data=8", config=config)
    keras.distribution.set_distribution(distribution_for(GPTCausalLM, "expert", "data=2,expert=4", config=config))
    model = build_lm(config | dict(expert_exchange="ragged"))
    with pytest.raises(
        ValueError, match="expert_exchange 'ragged' needs jax.lax.ragged_all_to_all, which XLA:CPU cannot run"
    ):
        model.predict(language_data(count=BATCH)[0], batch_size=BATCH, verbose=0)


GENERATION = MODELS["k2_shared"] | dict(dropout=0.0)
PROMPT, NEW = 4, 3


@pytest.fixture(scope="module")
def one_device():
    """The generating model's weights, built on one device, and its greedy tokens per
    batch size (the first B prompts), computed when a test first asks for them."""
    keras.utils.set_random_seed(5)
    model = build_lm(model_config("data", **GENERATION))
    prompts = language_data(count=8)[0][:, :PROMPT]
    generated = {}

    def greedy(batch):
        if batch not in generated:
            keras.distribution.set_distribution(None)
            generated[batch] = np.asarray(model.generate(prompts[:batch], NEW))
        return prompts[:batch], generated[batch]

    return model, [np.asarray(v) for v in model.weights], greedy


def test_cached_generation_on_one_device_equals_a_full_forward_pass(one_device):
    """Greedy KV-cache decoding of an MoE model equals the argmax of a full forward pass."""
    model, _, greedy = one_device
    _, generated = greedy(2)
    logits = np.asarray(model(generated[:, :-1]))  # one causal forward pass recomputes every step
    np.testing.assert_array_equal(generated[:, PROMPT:], logits[:, PROMPT - 1 :].argmax(-1))


@pytest.mark.parametrize(
    "layout, mesh, batch",
    [
        ("expert+tp", "data=2,expert=2,model=2", 2),  # over data alone: each device's expert, the shared one over model
        ("expert+tp", "data=2,expert=2,model=2", 1),  # whole on every device, shared expert too
        ("expert+tp", "data=2,expert=2,model=2", 4),  # divides data x expert: the exchange
        ("expert", "data=2,expert=4", 2),  # over data alone, each device runs its expert on its row
        ("fsdp+expert", "data=2,expert=4", 2),  # over data: the experts' C gathered over data in the body
        ("fsdp+expert", "data=2,expert=4", 1),  # whole: the experts arrive whole on C, the output the same everywhere
        ("fsdp+expert", "data=2,expert=4", 8),  # divides data x expert: the exchange
    ],
)
def test_cached_generation_under_the_expert_layouts_equals_one_device(layout, mesh, batch, one_device):
    """Any batch decodes under every expert layout, to the one-device greedy tokens: a
    batch that does not divide data x expert is split over the batch axes it divides
    (ParallelPlan.for_batch) and whole over the others, where each device runs its own
    experts on every token and the outputs are summed over 'expert' (no exchange)."""
    _, weights, greedy = one_device
    prompts, expected = greedy(batch)
    config = model_config("data", **GENERATION)
    keras.distribution.set_distribution(distribution_for(GPTCausalLM, layout, mesh, config=config))
    split = build_lm(config)
    for variable, value in zip(split.weights, weights):
        variable.assign(value)
    np.testing.assert_array_equal(np.asarray(split.generate(prompts, NEW)), expected)


def test_a_lora_adapted_lm_head_keeps_its_gather_under_fsdp():
    """LoRA on the LM head (as fine-tuning and the benchmarks' lora rows enable it) makes
    its ``.kernel`` the merged tensor; the head's gather is chosen from its kernel
    variable's layout, the same choice as unadapted, and the LoRA fit step compiles
    with it (it raised AttributeError: LinearizeTracer has no attribute path)."""
    config = model_config("fsdp", **(MODELS["k2_shared"] | dict(tie_word_embeddings=False)))
    distribution = distribution_for(GPTCausalLM, "fsdp", "data=8", config=config)
    choices = []

    def build():
        model = build_lm(config)
        choices.append(model.lm_head_gather(32, LENGTH))
        enable_lora(model, 4)
        for variable in model.weights:
            variable.trainable = is_lora_variable(variable)
        choices.append(model.lm_head_gather(32, LENGTH))
        return model

    model = abstract_build(build, compile_sgd, distribution)
    assert choices[1] == choices[0] and choices[0].choice == "table"  # B x T = 512 > V = 256: the (C, V) kernel
    tokens = ((32, LENGTH), "int32")
    compile_fit_step(model, distribution, tokens, tokens)
