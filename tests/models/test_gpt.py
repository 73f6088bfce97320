"""GPTBackbone / GPTCausalLM: config and ``.keras`` round trips, named sizes, variable paths,
parameter counts, and configuration / layout errors that name the offending numbers."""

import inspect
import json

import keras
import numpy as np
import pytest

from tests.models.harness import check_model_contract
from zoo.distribution import (
    CheckedModelParallel,
    LayoutError,
    build_distributed,
    make_mesh,
)
from zoo.models._transformer_layouts import layout_overrides
from zoo.models.gpt import GPT_CONFIGS, GPTBackbone, GPTCausalLM, count_parameters
from zoo.training import gpt

TINY = dict(GPT_CONFIGS["gpt_tiny"])


def _lm(config):
    return GPTCausalLM(backbone=GPTBackbone(**config))


def _tokens(batch=2, length=12, seed=0):
    return np.random.default_rng(seed).integers(0, 256, size=(batch, length)).astype("int32")


def test_config_keeps_every_argument_and_round_trips():
    model = GPTCausalLM.from_config_name(
        "gpt_tiny", dropout=0.1, seed=3, rope_max_wavelength=500.0, norm="layer", context_attention="ring",
        remat="dots_saveable",
    )  # fmt: skip
    config = model.get_config()
    arguments = set(inspect.signature(GPTCausalLM.__init__).parameters) - {"self", "kwargs"}
    assert arguments <= set(config), arguments - set(config)
    assert config["backbone"]["registered_name"] == "zoo>GPTBackbone"  # nested as keras-hub does
    backbone = config["backbone"]["config"]
    assert (
        backbone["head_dim"] == 8 and backbone["num_key_value_heads"] == 2 and backbone["rope_max_wavelength"] == 500.0
    )
    assert backbone["context_attention"] == "ring" and model.backbone.blocks[1].attention.context_attention == "ring"
    assert backbone["remat"] == "dots_saveable" and model.backbone.blocks[1].remat == "dots_saveable"
    assert model.backbone.blocks[1].mlp_dropout.seed == 3 + 1 + 2 + 1  # block i: seed + 1 + 2i (and + 1)
    clone = GPTCausalLM.from_config(config)
    assert clone.get_config() == config
    json.dumps(keras.saving.serialize_keras_object(model))
    backbone_arguments = set(inspect.signature(GPTBackbone.__init__).parameters) - {"self", "kwargs"}
    assert backbone_arguments <= set(model.backbone.get_config())


def test_configs_saved_with_the_old_keys_load_into_the_new_names():
    """A .keras file or preset written before issue 16: GPTCausalLM's config flat, old keys."""
    old = {
        "name": "lm", "trainable": True, "vocabulary_size": 256, "num_layers": 1, "num_heads": 4, "num_kv_heads": 2,
        "hidden_dim": 32, "intermediate_dim": 64, "norm_epsilon": 1e-6, "rotary_base": 500.0, "tie_embeddings": True,
        "tp_sequence_parallel": True, "sequence_parallel": "ring",
    }  # fmt: skip
    model = GPTCausalLM.from_config(old)
    backbone = model.backbone
    assert model.name == "lm" and backbone.name == "gpt_backbone"
    assert (backbone.num_query_heads, backbone.num_key_value_heads, backbone.layer_norm_epsilon) == (4, 2, 1e-6)
    assert (backbone.rope_max_wavelength, backbone.tie_word_embeddings, backbone.megatron_sp) == (500.0, True, True)
    assert backbone.context_attention == "ring" and backbone.blocks[0].megatron_sp is True
    assert GPTBackbone.from_config({**old, "name": "gpt_backbone"}).get_config() == backbone.get_config()
    assert count_parameters(old) == model.count_params()
    with pytest.raises(ValueError, match="config has both 'num_heads' .* and 'num_query_heads'"):
        GPTBackbone.from_config(TINY | {"num_heads": 4})


@pytest.mark.parametrize(
    "overrides",
    [dict(tie_word_embeddings=True), dict(mlp="gelu", norm="layer", dropout=0.2, seed=1, remat="full")],
    ids=["tied", "gelu-layernorm-remat"],
)
def test_model_contract(overrides, tmp_path):
    """The model harness on the causal LM (tied: also its preset); its backbone round-trips
    nested in its config."""
    model = GPTCausalLM.from_config_name("gpt_tiny", **overrides)
    preset = tmp_path / "preset" if overrides.get("tie_word_embeddings") else None
    check_model_contract(model, _tokens(), expected_output_shape=(2, 12, 256), save_dir=tmp_path, preset_dir=preset)


def test_backbone_takes_any_sequence_length():
    backbone = GPTBackbone(**TINY)
    assert tuple(backbone.input.shape) == (None, None) and tuple(backbone.output.shape) == (None, None, 32)
    tokens = _tokens(2, 12)
    hidden = np.asarray(backbone.predict_on_batch(tokens))
    assert hidden.shape == (2, 12, 32) and np.all(np.isfinite(hidden))
    # another length, and causality: the first 5 positions do not depend on what follows
    np.testing.assert_allclose(
        np.asarray(backbone.predict_on_batch(tokens[:, :5])), hidden[:, :5], rtol=1e-5, atol=1e-5
    )


def test_variable_paths_are_stable():
    model = GPTCausalLM.from_config_name("gpt_tiny", num_layers=1)
    block = [
        "attention/query",
        "attention/key",
        "attention/value",
        "attention/output",
        "mlp/gate",
        "mlp/up",
        "mlp/down",
    ]
    expected = (
        ["token_embedding/embeddings"]
        + [f"block_0/{name}/kernel" for name in block]
        + ["block_0/attention_norm/scale", "block_0/mlp_norm/scale", "final_norm/scale", "lm_head/kernel"]
    )
    assert [v.path for v in model.weights] == expected
    tied = GPTCausalLM.from_config_name("gpt_tiny", num_layers=1, tie_word_embeddings=True)
    assert [v.path for v in tied.weights] == expected[:-1]


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        dict(tie_word_embeddings=True),
        dict(mlp="gelu", norm="layer", num_key_value_heads=4, head_dim=4),
        dict(qk_norm=True, head_dim=16),
    ],
)
def test_parameter_count_formula_matches_the_model(overrides):
    config = TINY | overrides
    model = _lm(config)
    assert model.count_params() == count_parameters(config) == count_parameters(model.get_config())


def test_named_configs_and_their_sizes():
    assert GPTCausalLM.from_config_name("gpt_tiny").count_params() == count_parameters(TINY) == 34_976
    millions = {name: count_parameters(config) / 1e6 for name, config in GPT_CONFIGS.items()}
    assert 120 < millions["gpt_125m"] < 130 and 340 < millions["gpt_350m"] < 370 and 1000 < millions["gpt_1b"] < 1200
    # Qwen3's model cards: 0.6B (0.596B with the tied embedding), 8.2B, 30.5B of which 3.3B active (8 of 128 experts)
    qwen3_moe = GPT_CONFIGS["qwen3_30b_a3b"]
    inactive = qwen3_moe["num_layers"] * (128 - 8) * 3 * qwen3_moe["hidden_dim"] * qwen3_moe["moe_intermediate_dim"]
    assert (round(millions["qwen3_0.6b"]), round(millions["qwen3_8b"] / 10)) == (596, 819)
    assert round(millions["llama_3_2_1b"]) == 1236  # Llama-3.2-1B: 1.24B, the embedding tied
    assert round(millions["qwen3_30b_a3b"] / 100) == 305 and 3300 < millions["qwen3_30b_a3b"] - inactive / 1e6 < 3400
    with pytest.raises(ValueError) as error:
        GPTCausalLM.from_config_name("gpt_huge")
    assert "unknown GPTBackbone config 'gpt_huge'" in str(error.value)  # the named sizes are the backbone's
    assert str(list(GPT_CONFIGS)) in str(error.value)


def test_layout_config_entries():
    assert GPTCausalLM.from_config_name("gpt_tiny", layout="tp+sp").backbone.megatron_sp is True
    assert GPTCausalLM.from_config_name("gpt_tiny", layout="tp").backbone.megatron_sp is False
    assert layout_overrides("tp+sp") == {"megatron_sp": True} and layout_overrides("tp") == {}
    with pytest.raises(ValueError, match="unknown layout 'zero3'"):
        GPTCausalLM.get_layout_map(make_mesh("data=8"), "zero3")


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(hidden_dim=30), "hidden_dim 30 is not divisible by num_query_heads 4; pass head_dim explicitly"),
        (dict(num_key_value_heads=3), "num_key_value_heads 3 does not divide num_query_heads 4"),
        (dict(head_dim=5), "rotary embedding needs an even head_dim, got head_dim 5"),
        (dict(num_layers=0), "num_layers must be a positive integer, got 0"),
        (dict(vocabulary_size=2.5), "vocabulary_size must be a positive integer, got 2.5"),
        (
            dict(mlp="swish"),
            "mlp must be one of ['swiglu', 'geglu', 'geglu_tanh', 'gelu', 'gelu_tanh', 'relu'], got 'swish'",
        ),
        (dict(norm="batch"), "norm must be one of ['rms', 'layer', 'rms_offset'], got 'batch'"),
        (dict(dropout=1.0), "dropout must be in [0, 1), got 1.0"),
        (
            dict(remat=True),
            "remat must be one of ['none', 'full', 'dots_saveable', 'save_attention', 'offload_attention'] (or None for 'none'), got True",
        ),
    ],
)
def test_bad_config_names_the_numbers(overrides, message):
    with pytest.raises(ValueError) as error:
        _lm(TINY | overrides)
    assert message in str(error.value)


# --- layout maps: divisibility checked up front (keras-hub#1613, #2826) ------------------


def test_kv_heads_and_model_axis_that_do_not_divide_each_other_are_refused_up_front():
    mesh = make_mesh("data=2,model=4")
    odd = TINY | dict(num_query_heads=12, num_key_value_heads=3, hidden_dim=48)  # 3 KV heads on a model axis of 4
    for layout in ("tp", "tp+sp", "fsdp+tp"):
        with pytest.raises(LayoutError) as error:
            GPTCausalLM.get_layout_map(mesh, layout, config=odd | layout_overrides(layout))
        assert (
            "num_key_value_heads=3 and the 'model' mesh axis of size 4 (mesh data=2,model=4) do not divide each other"
            in str(error.value)
        )
        GPTCausalLM.get_layout_map(mesh, layout, config=TINY | layout_overrides(layout))  # 2 KV heads: replicated
    GPTCausalLM.get_layout_map(mesh, "fsdp", config=odd | {"hidden_dim": 48})  # heads are not split by fsdp


def test_kv_heads_fewer_than_the_model_axis_are_replicated_and_others_refused_at_creation():
    """Megatron's rule: K=2 KV heads on a model axis of 4 are replicated over it; K=3 fails
    when the attention is built, even without a config given to the layout map."""
    mesh = make_mesh("data=2,model=4")
    distribution = CheckedModelParallel(layout_map=GPTCausalLM.get_layout_map(mesh, "tp"), batch_dim_name="data")
    model = build_distributed(lambda: _lm(TINY), distribution)
    specs = {v.path: tuple(v.value.sharding.spec) for v in model.weights}
    assert all(entry is None for entry in specs["block_0/attention/key/kernel"]), specs["block_0/attention/key/kernel"]
    assert specs["block_0/attention/query/kernel"][1] == "model"
    with pytest.raises(
        ValueError, match=r"num_kv_heads 3 and the 'model' mesh axis of size 4 do not divide each other"
    ):
        build_distributed(
            lambda: _lm(TINY | dict(num_query_heads=12, num_key_value_heads=3, hidden_dim=48)), distribution
        )


@pytest.mark.parametrize(
    "layout, mesh, overrides, message",
    [
        (
            "fsdp",
            "data=8",
            dict(hidden_dim=36, head_dim=8),
            "hidden_dim=36 is not divisible by the 'data' mesh axis of size 8",
        ),
        (
            "fsdp",
            "data=8",
            dict(vocabulary_size=260),
            "vocabulary_size=260 is not divisible by the 'data' mesh axis of size 8",
        ),
        (
            "tp",
            "data=2,model=4",
            dict(num_query_heads=6, num_key_value_heads=6, hidden_dim=48),
            "num_query_heads=6 is not divisible by the 'model' mesh axis of size 4",
        ),
        (
            "tp",
            "data=2,model=4",
            dict(num_key_value_heads=4, intermediate_dim=66),
            "intermediate_dim=66 is not divisible by the 'model' mesh axis of size 4",
        ),
        (
            "tp",
            "data=2,model=4",
            dict(num_key_value_heads=4, vocabulary_size=254),
            "vocabulary_size=254 is not divisible by the 'model' mesh axis of size 4",
        ),
        ("tp+sp", "data=2,model=4", dict(num_key_value_heads=4), "needs a model built with megatron_sp=True"),
    ],
)
def test_layout_config_errors_name_the_numbers(layout, mesh, overrides, message):
    with pytest.raises(ValueError) as error:
        GPTCausalLM.get_layout_map(make_mesh(mesh), layout, config=TINY | overrides)
    assert message in str(error.value)


def test_layout_rules_per_strategy():
    mesh = make_mesh("data=2,model=4")
    assert len(GPTCausalLM.get_layout_map(mesh, "data")) == 0
    tp = GPTCausalLM.get_layout_map(mesh, "tp")
    assert tp[r".*token_embedding/embeddings"].axes == ("model", None)
    assert tp[r".*lm_head/kernel"].axes == (None, "model")
    tied = _lm(TINY | dict(num_key_value_heads=4, tie_word_embeddings=True))
    assert r".*lm_head/kernel" not in list(GPTCausalLM.get_layout_map(mesh, "tp", config=tied.get_config()))
    assert r".*lm_head/kernel" not in list(GPTBackbone.get_layout_map(mesh, "fsdp+tp"))
    with pytest.raises(ValueError, match="needs mesh axes"):
        GPTCausalLM.get_layout_map(make_mesh("data=8"), layout="tp")
    qk_norm = TINY | dict(qk_norm=True, schedule="gpipe")  # Qwen3's (D,) scales, stacked (R, L/R, D) in a pipeline
    pipelined = GPTCausalLM.get_layout_map(make_mesh("data=4,stage=2"), "pipeline", config=qk_norm)
    assert pipelined[r".*blocks/attention/(query|key)_norm/scale"].axes == (None, "stage", None)


def test_a_gpt_built_under_ring_context_parallelism_saves_ring_and_reloads_on_one_device():
    """The kernel in use is in the config (not None): a model built under
    ContextParallel(ring) saves ``context_attention: "ring"``; on one device the same
    config runs plain attention, and ``describe`` says so."""
    from zoo import distribution as zd

    distribution = zd.make_distribution("context", "data=2,seq=4", context_attention="ring")
    try:
        model = zd.build_distributed(lambda: GPTCausalLM.from_config_name("gpt_tiny", num_layers=1), distribution)
        assert zd.describe(model)[0].startswith("block_0/attention: ring attention over seq (4)")
    finally:
        keras.distribution.set_distribution(None)
    config = model.get_config()
    assert config["backbone"]["config"]["context_attention"] == "ring"
    alone = GPTCausalLM.from_config(config)
    assert alone.backbone.blocks[0].attention.context_attention == "ring"
    assert (
        zd.describe(alone)[0]
        == "block_0/attention: plain attention, no collective (context_attention 'ring' runs only over a 'seq' mesh axis of size > 1)"
    )


# --- sliding window -------------------------------------------------------------------


def test_a_sliding_window_round_trips_and_applies_to_its_layers_only(tmp_path):
    model = GPTCausalLM.from_config_name("gpt_tiny", num_layers=3, sliding_window=4, sliding_window_layers=[1, 2])
    assert [block.sliding_window for block in model.backbone.blocks] == [None, 4, 4]
    x = _tokens(2, 12)
    expected = np.asarray(model(x))
    model.save(tmp_path / "gpt.keras")
    loaded = keras.saving.load_model(tmp_path / "gpt.keras", safe_mode=True)
    assert loaded.backbone.get_config()["sliding_window_layers"] == [1, 2] and loaded.get_config() == model.get_config()
    np.testing.assert_allclose(np.asarray(loaded(x)), expected, rtol=1e-6, atol=1e-6)
    full = GPTCausalLM.from_config_name("gpt_tiny", num_layers=3)
    full.set_weights(model.get_weights())
    logits = np.asarray(full(x))
    np.testing.assert_allclose(logits[:, :4], expected[:, :4], rtol=1e-5, atol=1e-5)  # within the window: the same
    assert np.abs(logits[:, 4:] - expected[:, 4:]).max() > 1e-3  # beyond it: the window matters
    every = GPTBackbone(**TINY, sliding_window=4, sliding_window_layers=[0, 1])
    assert every.sliding_window_layers is None  # every block: saved as None
    # KV caches: the windowed blocks' are window-sized ring buffers, the global block's the whole length
    assert [cache.shape[2] for cache in model.backbone.empty_caches(2, 12)] == [12, 4, 4]
    assert [cache.shape[2] for cache in model.backbone.empty_caches(2, 3)] == [3, 3, 3]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (dict(sliding_window=0), "sliding_window must be >= 1"),
        (dict(sliding_window_layers=[0]), r"sliding_window_layers \[0\] needs sliding_window"),
        (dict(sliding_window=4, sliding_window_layers=[5]), r"must list block indices in 0..1 .*not \[5\]"),
        (dict(sliding_window=4, sliding_window_layers=[1], schedule="gpipe"), r"sliding_window_layers=\[1\] of 2"),
    ],
)
def test_bad_sliding_windows_name_the_values(overrides, message):
    with pytest.raises(ValueError, match=message):
        GPTBackbone(**TINY | overrides)


# Gemma's widths cut to a CPU's (the per-layer pattern and RoPE bases kept): a block as built
SHRUNK = dict(vocabulary_size=256, hidden_dim=32, intermediate_dim=64, head_dim=8, num_query_heads=4)


@pytest.mark.parametrize(
    ("name", "num_layers", "windowed"),
    [
        ("gemma2_2b", 2, [0]),  # 1:1 local/global: block 0 local, block 1 global
        ("gemma2_2b", 5, [0, 2, 4]),
        ("gemma3_1b", 2, [0, 1]),  # the first two of a 5:1 period: both local
        ("gemma3_1b", 12, [0, 1, 2, 3, 4, 6, 7, 8, 9, 10]),  # two whole periods: blocks 5 and 11 global
        ("gemma3_4b", 1, [0]),
    ],
)
def test_a_named_config_at_another_depth_keeps_its_local_global_pattern(name, num_layers, windowed):
    """``num_layers`` overriding a Gemma config tiles its pattern (before: sliding_window_layers
    [0, 2, ...] must list block indices in 0..1), through the model's own from_config_name and
    zoo train gpt's overrides; the local RoPE base goes with the window, an explicit pattern wins."""
    config = GPT_CONFIGS[name]
    backbone = GPTBackbone.from_config_name(name, num_layers=num_layers, **SHRUNK)
    window = [block.sliding_window for block in backbone.blocks]
    assert window == [config["sliding_window"] if i in windowed else None for i in range(num_layers)]
    local = config.get("local_rope_max_wavelength") or config["rope_max_wavelength"]
    bases = [block.attention.rotary_base for block in backbone.blocks]
    assert bases == [local if i in windowed else config["rope_max_wavelength"] for i in range(num_layers)]
    settings = gpt.GPTTrainSettings(config_name=name, num_layers=num_layers, layout="fsdp", mesh="data=8")
    model_config = GPTCausalLM.named_config(name, "fsdp", **gpt._model_overrides(settings))
    assert model_config == GPTBackbone.named_config(name, "fsdp", num_layers=num_layers)
    assert gpt.resolve_distribution(settings).layout_map  # the job's layout map, fitted to that config
    explicit = GPTBackbone.named_config(name, num_layers=num_layers, sliding_window_layers=[0])
    assert explicit["sliding_window_layers"] == [0]


def test_a_pattern_is_tiled_by_its_period_or_trimmed():
    from zoo.models.gpt.gpt_configs import at_depth, layer_period

    assert [layer_period(GPT_CONFIGS[n]) for n in ("gemma2_2b", "gemma3_1b", "gemma3_4b", "gpt_1b")] == [2, 6, 6, 1]
    qwen2 = dict(TINY, num_layers=6, sliding_window=4, sliding_window_layers=[4, 5])  # max_window_layers 4: no period
    assert layer_period(qwen2) is None
    assert at_depth(qwen2, 5)["sliding_window_layers"] == [4]  # the blocks kept
    assert (at_depth(qwen2, 2)["sliding_window"], at_depth(qwen2, 2)["sliding_window_layers"]) == (None, None)
    moe = dict(GPT_CONFIGS["gpt_tiny_moe"], num_layers=4, moe_layers=[1, 3])  # every other block sparse
    assert layer_period(moe) == 2 and at_depth(moe, 6)["moe_layers"] == [1, 3, 5]
    assert at_depth(moe, 1) | {"num_layers": 4} == dict(moe, num_experts=0, moe_layers=None)  # no sparse block left


def test_decoding_with_a_window_matches_the_full_forward_pass():
    """A cached decode at position p attends only to cache positions p - W < k <= p: the
    cached logits of every step equal the uncached forward pass's (which windows too)."""
    model = GPTCausalLM.from_config_name("gpt_tiny", num_layers=1, sliding_window=3)
    tokens = _tokens(2, 7)
    expected = np.asarray(model(tokens))  # (B, T, V)
    caches = model.backbone.empty_caches(2, 7)
    logits, caches = model.call_with_cache(tokens[:, :4], caches, 0)  # prefill 4 (> W) tokens
    steps = [logits]
    for index in range(4, 7):  # then one token at a time, past the window
        logits, caches = model.call_with_cache(tokens[:, index : index + 1], caches, index)
        steps.append(logits)
    np.testing.assert_allclose(np.concatenate(steps, axis=1), expected, rtol=1e-4, atol=1e-4)


def test_a_windowed_gpt_trains_under_ring_context_parallelism_as_on_one_device():
    """W = 5 > T/N = 4 tokens per shard (data=2,seq=4, ring): a query's window reaches
    into the previous shard and not beyond; 3 steps of fit, losses, gradients, outputs."""
    from tests.models._gpt_parity import (
        BATCH,
        STEPS,
        build_lm,
        compile_sgd,
        language_data,
        layout_distribution,
        model_config,
    )
    from zoo.distribution import parity

    config = model_config("context-ring", num_layers=1, sliding_window=5)
    report = parity.check_parity(
        lambda: build_lm(config), compile_sgd, layout_distribution("context-ring", "data=2,seq=4", config),
        *language_data(), steps=STEPS, batch_size=BATCH,
    )  # fmt: skip
    assert report.passed, "\n".join(report.format())
    assert report.reference_losses[2] < report.reference_losses[0]
