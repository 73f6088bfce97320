"""Hugging Face Llama-family folders (dense and Mixture-of-Experts) in and out of GPTCausalLM.

The fixtures under tests/fixtures/hf were written by transformers 4.57.6
(tests/fixtures/hf/make_fixtures.py; torch and transformers are not test dependencies),
with the logits transformers computed in float32.
"""

import collections
import json
import math
import os
import pathlib
import re
import shutil

import jax
import keras
import numpy as np
import pytest

from zoo import distribution as zd
from zoo.bench.hf_load import live_bytes_per_device  # per device, from shard shapes (never shard.data)
from zoo.models import GPTCausalLM
from zoo.models.gpt import hf_checkpoints
from zoo.models.gpt._hf_config import backbone_arguments
from zoo.models.gpt._hf_keys import UnsupportedCheckpoint
from zoo.presets.safetensors_weights import CheckpointError

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "hf"
MOE_NAMES = ("mixtral", "qwen2_moe", "qwen3_moe")
WINDOW_NAMES = ("mistral_window",)  # sliding_window 8 < the 16 tokens of expected.npz, the 14 of greedy
QK_NORM_NAMES = ("qwen3",)  # greedy too: qk-norm on the KV-cache path
# Gemma 2 (soft-caps, window on even layers) and Gemma 3 text (qk-norm, local rope base, pattern 3): window 8 < 16
GEMMA_NAMES = ("gemma2", "gemma3_text")
# Qwen2.5-0.5B-Instruct's config.json key set: sliding_window 8 < 16 and max_window_layers 1, use_sliding_window false
PUBLISHED_FORM_NAMES = ("qwen2_5",)
NAMES = (
    "llama_gqa_rope_scaling",
    "llama_mha_tied",
    "qwen2",
    *MOE_NAMES,
    *WINDOW_NAMES,
    *QK_NORM_NAMES,
    *GEMMA_NAMES,
    *PUBLISHED_FORM_NAMES,
)
# transformers' greedy continuation of two prompts of unequal lengths (6 and 3, left-padded, attention mask) by 10:
# past the window of 8 in both rows (16 and 13 tokens)
UNEQUAL_NAMES = ("mistral_window", "gemma2", "gemma3_text", "qwen3", "qwen3_moe", "qwen2_5")


def expected(name):
    data = np.load(FIXTURES / name / "expected.npz")
    return data["token_ids"], data["logits"]


@pytest.fixture(scope="module")
def loaded():
    return {name: GPTCausalLM.from_preset(FIXTURES / name) for name in NAMES}


@pytest.mark.parametrize("name", NAMES)
def test_logits_equal_transformers(loaded, name):
    token_ids, logits = expected(name)
    np.testing.assert_allclose(np.asarray(loaded[name](token_ids)), logits, atol=1e-4, rtol=0)


@pytest.mark.parametrize("name", NAMES)
def test_both_config_forms_compute_the_same_logits(loaded, tmp_path, name):
    """The fixture with its config.json as transformers 5 writes it (rope_parameters, ...:
    tests/models/test_hf_config_forms.py) computes the logits of the fixture as transformers 4.57 wrote it."""
    from tests.models.test_hf_config_forms import transformers5_form

    folder = tmp_path / name
    shutil.copytree(FIXTURES / name, folder)
    (folder / "config.json").write_text(json.dumps(transformers5_form(fixture_config(name)), indent=2))
    token_ids, _ = expected(name)
    model = GPTCausalLM.from_preset(folder)
    np.testing.assert_array_equal(np.asarray(model(token_ids)), np.asarray(loaded[name](token_ids)))


def test_the_config_is_mapped(loaded):
    gqa = loaded["llama_gqa_rope_scaling"].backbone
    assert (gqa.num_query_heads, gqa.num_key_value_heads, gqa.head_dim, gqa.hidden_dim) == (4, 2, 16, 32)
    assert gqa.rope_scaling["rope_type"] == "llama3" and gqa.rope_max_wavelength == 500000.0
    assert not gqa.tie_word_embeddings and gqa.layer_norm_epsilon == 1e-5
    assert loaded["llama_mha_tied"].backbone.tie_word_embeddings
    assert loaded["qwen2"].backbone.qkv_bias and not loaded["llama_mha_tied"].backbone.qkv_bias
    tokenizer = loaded["llama_gqa_rope_scaling"].preprocessor.tokenizer
    assert tokenizer.stop_token_ids == (1, 2)  # generation_config.json's eos list
    mixtral, qwen = loaded["mixtral"].backbone, loaded["qwen2_moe"].backbone
    moe = (
        "num_experts",
        "num_experts_per_token",
        "moe_intermediate_dim",
        "shared_expert_dim",
        "normalize_router_weights",
        "moe_layers",
        "capacity_factor",
        "qkv_bias",
        "tie_word_embeddings",
    )
    assert [getattr(mixtral, key) for key in moe] == [4, 2, 16, 0, True, None, None, False, False]
    assert [getattr(qwen, key) for key in moe] == [4, 2, 8, 24, False, None, None, True, True]  # norm_topk_prob false
    assert (mixtral.router_aux_loss_coefficient, qwen.router_aux_loss_coefficient) == (0.02, 0.001)
    qwen3, qwen3_moe = loaded["qwen3"].backbone, loaded["qwen3_moe"].backbone
    assert [getattr(qwen3_moe, key) for key in moe] == [
        4,
        2,
        8,
        0,
        True,
        None,
        None,
        False,
        False,
    ]  # norm_topk_prob true
    for backbone in (qwen3, qwen3_moe):  # explicit head_dim 16 != 32 / 4, qk-norm, no biases
        assert (backbone.qk_norm, backbone.qkv_bias, backbone.head_dim, backbone.sliding_window) == (
            True,
            False,
            16,
            None,
        )
    assert qwen3.tie_word_embeddings and not any(b.qk_norm for b in loaded["qwen2"].backbone.blocks)
    assert (
        loaded["mistral_window"].backbone.sliding_window,
        loaded["mistral_window"].backbone.sliding_window_layers,
    ) == (8, None)


@pytest.mark.parametrize("name", MOE_NAMES + WINDOW_NAMES + QK_NORM_NAMES + GEMMA_NAMES + PUBLISHED_FORM_NAMES)
def test_greedy_equals_transformers(loaded, name):
    data = np.load(FIXTURES / name / "expected.npz")
    np.testing.assert_array_equal(loaded[name].generate(data["greedy_prompts"], max_new_tokens=8), data["greedy"])


@pytest.mark.parametrize("name", UNEQUAL_NAMES)
def test_greedy_of_unequal_prompts_equals_transformers(loaded, name):
    """Prompts of 6 and 3 tokens in one batch: the zoo left-pads the short one itself (its pad id, 2, is the
    tokenizer's, as transformers was given) and masks it; the result, padding included, is transformers'
    greedy of the left-padded batch with its attention mask (which make_fixtures.py checked equal, row by row,
    to each prompt's continuation alone), 10 tokens on: past the window of 8 in both rows."""
    data = np.load(FIXTURES / name / "expected.npz")
    padded, mask, expected_ids = data["unequal_prompts"], data["unequal_attention_mask"], data["unequal_greedy"]
    prompts = [row[keep == 1].tolist() for row, keep in zip(padded, mask, strict=True)]
    assert [len(prompt) for prompt in prompts] == [6, 3] and expected_ids.shape == (2, 16)
    new = expected_ids.shape[1] - padded.shape[1]
    np.testing.assert_array_equal(loaded[name].generate(prompts, max_new_tokens=new), expected_ids)


def test_qwen2_5_loads_in_its_published_form_with_the_window_off(loaded):
    """The fixture's config.json has exactly Qwen2.5-0.5B-Instruct's keys: a window (8, less than the 16 tokens
    compared) and max_window_layers set, use_sliding_window false: full attention in every block (the logits
    test checks the numbers; transformers with the window on moves them by up to 3.1, make_fixtures.py prints)."""
    config = fixture_config("qwen2_5")
    assert sorted(config) == sorted(QWEN2_5_0_5B_INSTRUCT_KEYS)
    assert (config["use_sliding_window"], config["sliding_window"], config["max_window_layers"]) == (False, 8, 1)
    backbone = loaded["qwen2_5"].backbone
    assert (backbone.sliding_window, backbone.qkv_bias, backbone.tie_word_embeddings) == (None, True, True)
    windowed = backbone_arguments({**config, "use_sliding_window": True})
    assert (windowed["sliding_window"], windowed["sliding_window_layers"]) == (8, [1])  # what it would be: layer 1


# the keys of Qwen/Qwen2.5-0.5B-Instruct's config.json
QWEN2_5_0_5B_INSTRUCT_KEYS = (
    "architectures",
    "attention_dropout",
    "bos_token_id",
    "eos_token_id",
    "hidden_act",
    "hidden_size",
    "initializer_range",
    "intermediate_size",
    "max_position_embeddings",
    "max_window_layers",
    "model_type",
    "num_attention_heads",
    "num_hidden_layers",
    "num_key_value_heads",
    "rms_norm_eps",
    "rope_theta",
    "sliding_window",
    "tie_word_embeddings",
    "torch_dtype",
    "transformers_version",
    "use_cache",
    "use_sliding_window",
    "vocab_size",
)


@pytest.mark.parametrize("name", MOE_NAMES)
def test_moe_save_to_hf_writes_per_expert_tensors_and_round_trips(loaded, tmp_path, name):
    from safetensors import safe_open

    model = loaded[name]
    model.save_to_hf(tmp_path / "out")
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    source = json.loads((FIXTURES / name / "config.json").read_text())
    for key in (
        "model_type",
        "architectures",
        "num_experts_per_tok",
        "intermediate_size",
        "num_local_experts",
        "num_experts",
        "moe_intermediate_size",
        "shared_expert_intermediate_size",
        "norm_topk_prob",
        "mlp_only_layers",
        "decoder_sparse_step",
        "router_aux_loss_coef",
        "qkv_bias",
        "tie_word_embeddings",
    ):
        assert written.get(key) == source.get(key), key
    with safe_open(tmp_path / "out" / "model.safetensors", framework="numpy") as file:
        names = set(file.keys())  # noqa: SIM118 (safe_open has no __iter__)
    with hf_checkpoints.SafetensorsFiles(FIXTURES / name) as files:
        assert names == set(files.names())  # the published per-expert names, nothing more or less
    again = GPTCausalLM.from_preset(tmp_path / "out")
    assert again.backbone.get_config() == model.backbone.get_config()
    for before, after in zip(model.weights, again.weights, strict=True):
        assert before.path == after.path
        np.testing.assert_array_equal(np.asarray(before.value), np.asarray(after.value))


def test_save_to_hf_round_trips_bitwise(loaded, tmp_path):
    model = loaded["qwen2"]
    model.save_to_hf(tmp_path / "out", max_file_bytes=60_000)  # several files and an index
    assert (tmp_path / "out" / "model.safetensors.index.json").is_file()
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["model_type"] == "qwen2" and config["tie_word_embeddings"] is True
    again = GPTCausalLM.from_preset(tmp_path / "out")
    for before, after in zip(model.weights, again.weights, strict=True):
        assert before.path == after.path
        np.testing.assert_array_equal(np.asarray(before.value), np.asarray(after.value))
    assert (
        again.preprocessor.tokenizer.encode("def f(x):").tolist()
        == model.preprocessor.tokenizer.encode("def f(x):").tolist()
    )
    with pytest.raises(FileExistsError, match="not empty"):
        model.save_to_hf(tmp_path / "out")


# config.json keys a dense export must write as the fixture has them (besides model_type, architectures)
DENSE_EXPORT_KEYS = {
    "mistral_window": ("sliding_window",),
    "qwen3": (
        "head_dim",
        "attention_bias",
        "use_sliding_window",
        "sliding_window",
        "max_window_layers",
        "tie_word_embeddings",
    ),
    "gemma2": (
        "head_dim",
        "query_pre_attn_scalar",
        "sliding_window",
        "attn_logit_softcapping",
        "final_logit_softcapping",
    ),
    "gemma3_text": (
        "head_dim",
        "query_pre_attn_scalar",
        "sliding_window",
        "rope_theta",
        "rope_local_base_freq",
        "attn_logit_softcapping",
    ),
    "qwen2_5": ("tie_word_embeddings", "use_sliding_window"),  # the inert window is not written back
}


@pytest.mark.parametrize("name", DENSE_EXPORT_KEYS)
def test_a_dense_model_exports_as_its_model_type_and_round_trips(loaded, tmp_path, name):
    """mistral_window as mistral (its window), qwen3 as qwen3 (qk-norm: q_norm / k_norm tensors)."""
    from safetensors import safe_open

    model = loaded[name]
    model.save_to_hf(tmp_path / "out")
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    source = fixture_config(name)
    for key in ("model_type", "architectures", *DENSE_EXPORT_KEYS[name]):
        assert written[key] == source[key], key
    with safe_open(tmp_path / "out" / "model.safetensors", framework="numpy") as file:
        names = set(file.keys())  # noqa: SIM118 (safe_open has no __iter__)
    with hf_checkpoints.SafetensorsFiles(FIXTURES / name) as files:
        assert names == set(files.names())
    again = GPTCausalLM.from_preset(tmp_path / "out")
    assert again.backbone.get_config() == model.backbone.get_config()
    for before, after in zip(model.weights, again.weights, strict=True):
        np.testing.assert_array_equal(np.asarray(before.value), np.asarray(after.value))


def test_lora_is_merged_on_export(tmp_path):
    from zoo.config.settings import ExportSettings
    from zoo.training.export import export, exported_parameter_count
    from zoo.training.lora._files import save_lora
    from zoo.training.lora._layers import enable_lora

    model = GPTCausalLM.from_preset(FIXTURES / "llama_mha_tied")
    keras.utils.set_random_seed(0)  # the a factors' initialisation: the same merge, and rounding, every run
    layers = enable_lora(model, 2)
    rng = np.random.default_rng(0)
    for layer in layers:  # b starts at zero: make the adapters change the logits
        layer.lora_kernel_b.assign(rng.normal(0, 0.3, layer.lora_kernel_b.shape).astype("float32"))
    token_ids, reference = expected("llama_mha_tied")
    adapted = np.asarray(model(token_ids))
    assert np.abs(adapted - reference).max() > 1e-2
    model.save_to_hf(tmp_path / "merged")
    reloaded = GPTCausalLM.from_preset(tmp_path / "merged")
    assert not any("lora" in w.path for w in reloaded.weights)
    assert exported_parameter_count(model) == reloaded.count_params() < model.count_params()  # factors not counted
    np.testing.assert_allclose(np.asarray(reloaded(token_ids)), adapted, atol=1e-5, rtol=0)
    # zoo export --lora prints what the folder holds (27,808 here), not the rank-2 factors too (30,656)
    save_lora(model, tmp_path / "adapter.h5")
    lines = []
    export(
        ExportSettings(
            model=str(FIXTURES / "llama_mha_tied"), output=str(tmp_path / "cli"), lora=str(tmp_path / "adapter.h5")
        ),
        report=lines.append,
    )
    assert f", {reloaded.count_params():,} parameters" in lines[-1], lines


def test_a_weight_that_is_not_finite_is_refused_before_anything_is_written(loaded, tmp_path):
    model = loaded["llama_mha_tied"]
    weight = model.backbone.get_layer("final_norm").weights[0]
    original = np.asarray(weight.value)
    weight.assign(np.where(np.arange(original.size) == 3, np.nan, original).astype(original.dtype))
    try:
        with pytest.raises(CheckpointError, match=r"weight '.*final_norm.*' of shape \(32,\) holds 1 NaN or infinite"):
            model.save_to_hf(tmp_path / "out")
    finally:
        weight.assign(original)
    assert not os.path.exists(tmp_path / "out") and os.listdir(tmp_path) == []  # no folder, no partial


# --- what is refused ------------------------------------------------------------------


def llama_config():
    return json.loads((FIXTURES / "llama_gqa_rope_scaling" / "config.json").read_text())


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"model_type": "gemma"}, "model_type 'gemma' is not supported"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_scaling"),
        ({"sliding_window": 4096}, "sliding_window = 4096 is not supported for model_type 'llama'"),
        ({"use_sliding_window": True}, "use_sliding_window = True is not supported for model_type 'llama'"),
        ({"attention_bias": True}, "attention_bias = True"),
        ({"hidden_act": "gelu"}, "hidden_act = 'gelu'"),
        ({"num_local_experts": 8}, "key 'num_local_experts'"),
        ({"quantization_config": {"bits": 4}}, "key 'quantization_config'"),
    ],
)
def test_unsupported_configs_are_refused_naming_the_key(change, named):
    with pytest.raises(UnsupportedCheckpoint) as error:
        backbone_arguments({**llama_config(), **change})
    assert named in str(error.value)


def fixture_config(name):
    return json.loads((FIXTURES / name / "config.json").read_text())


@pytest.mark.parametrize(
    ("name", "change", "named"),
    [
        (
            "qwen2",
            {"use_sliding_window": True, "layer_types": ["full_attention", "chunked_attention"]},
            "layer_types = ['full_attention', 'chunked_attention'] must list one of",
        ),
        (
            "mistral_window",
            {"layer_types": ["sliding_attention"] * 2},
            "layer_types ['sliding_attention'] is not supported for model_type 'mistral'",
        ),
        ("mixtral", {"router_jitter_noise": 0.1}, "router_jitter_noise = 0.1"),
        ("qwen2_moe", {"decoder_sparse_step": 0}, "decoder_sparse_step = 0"),
        ("qwen2_moe", {"mlp_only_layers": [0, 5]}, "mlp_only_layers = [0, 5] must list block indices in 0..1"),
        (
            "qwen2_moe",
            {"decoder_sparse_step": 3},
            "decoder_sparse_step = 3 and mlp_only_layers = [] leave none of the 2",
        ),
        ("qwen2_moe", {"shared_expert_intermediate_size": 0}, "shared_expert_intermediate_size = 0"),
        ("qwen2_moe", {"num_local_experts": 4}, "key 'num_local_experts'"),  # Mixtral's key in a Qwen2-MoE config
        ("qwen2", {"num_experts": 4}, "key 'num_experts'"),  # a MoE key in a dense model_type
        ("qwen3", {"attention_bias": True}, "attention_bias = True is not supported"),  # o_proj's bias too
        ("qwen3_moe", {"shared_expert_intermediate_size": 24}, "key 'shared_expert_intermediate_size'"),  # Qwen2-MoE's
        ("qwen3_moe", {"qkv_bias": True}, "key 'qkv_bias'"),
        (
            "qwen3_moe",
            {"layer_types": ["sliding_attention"] * 2},
            "layer_types ['sliding_attention'] is not supported for model_type 'qwen3_moe'",
        ),
        (
            "gemma2",
            {"hidden_activation": "gelu"},
            "hidden_activation = 'gelu' is not supported for model_type 'gemma2'",
        ),
        ("gemma2", {"tie_word_embeddings": False}, "tie_word_embeddings = False"),
        (
            "gemma3_text",
            {"rope_scaling": {"rope_type": "linear", "factor": 8.0}},
            "rope_scaling = {'rope_type': 'linear', 'factor': 8.0} is not supported",
        ),
        ("gemma3_text", {"use_bidirectional_attention": True}, "use_bidirectional_attention = True"),
        ("gemma3_text", {"vision_config": {}}, "key 'vision_config'"),
        (
            "qwen3_moe",
            {"mlp_only_layers": [0, 1]},
            "leave none of the 2 blocks sparse: the zoo's moe_layers needs at least one (a dense model is model_type qwen3)",
        ),
    ],
)
def test_moe_and_window_configs_are_refused_naming_the_values(name, change, named):
    with pytest.raises(UnsupportedCheckpoint) as error:
        backbone_arguments({**fixture_config(name), **change})
    assert named in str(error.value)


def test_an_inert_window_and_qwen_sparse_patterns_are_mapped():
    qwen2 = fixture_config("qwen2")
    published = {**qwen2, "sliding_window": 131072, "max_window_layers": 28}  # Qwen2.5-7B's, use_sliding_window false
    assert backbone_arguments(published) == backbone_arguments(qwen2)
    reaches_no_layer = {**qwen2, "use_sliding_window": True, "sliding_window": 64, "max_window_layers": 2}
    assert backbone_arguments(reaches_no_layer) == backbone_arguments(qwen2)
    moe = fixture_config("qwen2_moe")
    assert backbone_arguments({**moe, "decoder_sparse_step": 2})["moe_layers"] == [1]  # (i + 1) % 2 == 0
    assert backbone_arguments({**moe, "mlp_only_layers": [0]})["moe_layers"] == [1]
    assert backbone_arguments({key: value for key, value in moe.items() if key != "qkv_bias"})[
        "qkv_bias"
    ]  # Qwen1.5-MoE has no key
    qwen3, qwen3_moe = fixture_config("qwen3"), fixture_config("qwen3_moe")
    published = {**qwen3, "max_window_layers": 28, "layer_types": None}  # Qwen3-0.6B's form: no layer_types, 28 layers
    assert backbone_arguments(published) == backbone_arguments(qwen3) and "sliding_window" not in backbone_arguments(
        qwen3
    )
    assert (
        backbone_arguments({key: value for key, value in qwen3.items() if key != "head_dim"})["head_dim"] == 128
    )  # Qwen3Config's
    assert "head_dim" not in backbone_arguments(
        {key: value for key, value in qwen3_moe.items() if key != "head_dim"}
    )  # C / H
    assert backbone_arguments({**qwen3_moe, "mlp_only_layers": [0], "norm_topk_prob": False})["moe_layers"] == [1]


def test_a_moe_gpt_no_hugging_face_model_computes_is_refused_on_export():
    from zoo.models.gpt._hf_export_config import hf_config

    mixtral_like = {
        **backbone_arguments(fixture_config("mixtral")),
        "moe_layers": [1],
        "normalize_router_weights": False,
    }
    with pytest.raises(UnsupportedCheckpoint, match=r"normalize_router_weights=False, moe_layers=\[1\] \(Qwen2-MoE"):
        hf_config(mixtral_like)
    qwen = {**backbone_arguments(fixture_config("qwen2_moe")), "moe_layers": [1]}
    assert hf_config(qwen)["mlp_only_layers"] == [0]  # a dense block 0 of intermediate_size
    qwen3_moe = {
        **backbone_arguments(fixture_config("qwen3_moe")),
        "moe_layers": [1],
        "normalize_router_weights": False,
    }
    written = hf_config(qwen3_moe)
    assert (written["model_type"], written["mlp_only_layers"], written["norm_topk_prob"]) == ("qwen3_moe", [0], False)
    assert "shared_expert_intermediate_size" not in written and "qkv_bias" not in written
    with pytest.raises(UnsupportedCheckpoint, match=r"qk_norm is written as Qwen3 .* this one has shared_expert_dim=8"):
        hf_config({**qwen3_moe, "shared_expert_dim": 8})
    with pytest.raises(UnsupportedCheckpoint, match=r"this one has qkv_bias=True"):
        hf_config({**backbone_arguments(fixture_config("qwen3")), "qkv_bias": True})


def test_window_keys_map_as_transformers_reads_them():
    qwen2 = {**fixture_config("qwen2"), "num_hidden_layers": 4, "sliding_window": 64, "layer_types": None}
    windowed = backbone_arguments({**qwen2, "use_sliding_window": True, "max_window_layers": 1})
    assert (windowed["sliding_window"], windowed["sliding_window_layers"]) == (
        64,
        [1, 2, 3],
    )  # layers >= max_window_layers
    every = backbone_arguments({**qwen2, "use_sliding_window": True, "max_window_layers": 0})
    assert (every["sliding_window"], every["sliding_window_layers"]) == (64, None)
    types = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]  # layer_types wins
    assert backbone_arguments({**qwen2, "use_sliding_window": True, "layer_types": types})["sliding_window_layers"] == [
        0,
        2,
    ]
    assert "sliding_window" not in backbone_arguments({**qwen2, "layer_types": types})  # use_sliding_window false: none
    unset = {key: value for key, value in qwen2.items() if key not in ("sliding_window", "max_window_layers")}
    defaults = backbone_arguments({**unset, "use_sliding_window": True, "num_hidden_layers": 30})
    assert (defaults["sliding_window"], defaults["sliding_window_layers"]) == (4096, [28, 29])  # Qwen2Config's defaults
    moe = backbone_arguments({**fixture_config("qwen2_moe"), "use_sliding_window": True, "max_window_layers": 0})
    assert (moe["sliding_window"], moe["sliding_window_layers"]) == (8, None)  # every layer: transformers' paths agree
    qwen3 = {
        **fixture_config("qwen3"),
        "layer_types": None,
        "use_sliding_window": True,
        "sliding_window": 4,
        "max_window_layers": 1,
    }
    qwen3 = backbone_arguments(qwen3)  # layer_types null: from max_window_layers
    assert (qwen3["sliding_window"], qwen3["sliding_window_layers"]) == (4, [1])  # Qwen3Config: as Qwen2's
    qwen3_moe = backbone_arguments({**fixture_config("qwen3_moe"), "use_sliding_window": True, "sliding_window": 4})
    assert (qwen3_moe["sliding_window"], qwen3_moe["sliding_window_layers"]) == (4, None)  # max_window_layers 2 unread
    with pytest.raises(UnsupportedCheckpoint, match=r"max_window_layers = 1 of 2 layers is ambiguous"):
        backbone_arguments(
            {**fixture_config("qwen2_moe"), "use_sliding_window": True}
        )  # eager windows all, flash layer 1 on
    mixtral = backbone_arguments({**fixture_config("mixtral"), "sliding_window": 4096})
    assert (mixtral["sliding_window"], mixtral["sliding_window_layers"]) == (4096, None)
    mistral = fixture_config("mistral_window")
    v03 = backbone_arguments({**mistral, "sliding_window": None})  # Mistral-7B-v0.3's `sliding_window: null`
    assert "sliding_window" not in v03  # full attention
    absent = backbone_arguments({key: value for key, value in mistral.items() if key != "sliding_window"})
    assert absent["sliding_window"] == 4096  # MistralConfig's default
    with pytest.raises(hf_checkpoints.CheckpointError, match="sliding_window = 0 must be a positive integer"):
        backbone_arguments({**mistral, "sliding_window": 0})


def test_window_patterns_are_written_back_or_refused_naming_them():
    from zoo.models.gpt._hf_export_config import hf_config

    qwen2 = {
        **backbone_arguments(fixture_config("qwen2")),
        "num_layers": 4,
        "sliding_window": 16,
        "sliding_window_layers": [2, 3],
    }
    written = hf_config(qwen2)
    assert (written["use_sliding_window"], written["sliding_window"], written["max_window_layers"]) == (True, 16, 2)
    assert backbone_arguments(written)["sliding_window_layers"] == [2, 3]
    with pytest.raises(UnsupportedCheckpoint, match=r"sliding_window_layers=\[1, 3\] of 4 cannot be written as qwen2"):
        hf_config({**qwen2, "sliding_window_layers": [1, 3]})
    mistral = backbone_arguments(fixture_config("mistral_window"))
    with pytest.raises(UnsupportedCheckpoint, match=r"sliding_window_layers=\[1\] of 2: mistral windows every layer"):
        hf_config({**mistral, "sliding_window_layers": [1]})
    assert hf_config({**mistral, "sliding_window": None})["model_type"] == "llama"


def test_mistral_without_a_sliding_window_maps_as_llama():
    mistral = {
        **llama_config(),
        "model_type": "mistral",
        "sliding_window": None,
        "architectures": ["MistralForCausalLM"],
    }
    for key in ("attention_bias", "mlp_bias", "pretraining_tp"):  # MistralConfig has none of these
        mistral.pop(key)
    assert backbone_arguments(mistral) == backbone_arguments(llama_config())


def test_a_refused_folder_names_its_file_before_building(tmp_path):
    folder = tmp_path / "moe"
    shutil.copytree(FIXTURES / "llama_mha_tied", folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "num_experts_per_tok": 2}))
    with pytest.raises(UnsupportedCheckpoint, match=r"moe/config.json: key 'num_experts_per_tok'"):
        GPTCausalLM.from_preset(folder)


def test_a_tensor_the_model_lacks_is_refused(tmp_path):
    from safetensors.numpy import load_file, save_file

    folder = tmp_path / "extra"
    shutil.copytree(FIXTURES / "llama_mha_tied", folder)
    tensors = load_file(folder / "model.safetensors")
    tensors["model.layers.0.self_attn.o_proj.bias"] = np.zeros(32, np.float32)
    save_file(tensors, folder / "model.safetensors")
    with pytest.raises(UnsupportedCheckpoint, match=r"o_proj.bias"):
        GPTCausalLM.from_preset(folder)


# --- loading under a layout: each device reads its own shard ---------------------------

SHARDED_CONFIG = dict(
    vocabulary_size=256,
    num_layers=4,
    num_query_heads=8,
    num_key_value_heads=4,
    hidden_dim=64,
    intermediate_dim=128,
    max_sequence_length=64,
    tie_word_embeddings=False,
)


@pytest.fixture(scope="module")
def two_file_checkpoint(tmp_path_factory):
    """A zoo GPT saved as two safetensors files, and its weights ({path: array})."""
    from zoo.models import GPTBackbone

    model = GPTCausalLM(backbone=GPTBackbone(**SHARDED_CONFIG, seed=0))
    folder = tmp_path_factory.mktemp("hf") / "two_files"
    total = sum(w.value.nbytes for w in model.weights)
    model.save_to_hf(folder, max_file_bytes=total * 2 // 3)
    assert len(list(folder.glob("*.safetensors"))) == 2
    return folder, {w.path: np.asarray(w.value) for w in model.weights}


@pytest.mark.parametrize(("layout", "mesh"), [("fsdp", "data=8"), ("tp", "data=2,model=4")])
def test_sharded_load_reads_only_shards(two_file_checkpoint, monkeypatch, layout, mesh):
    folder, reference = two_file_checkpoint
    config = json.loads((folder / "config.json").read_text())
    distribution = zd.distribution_for(GPTCausalLM, layout, mesh, config=config)
    earlier = jax.live_arrays()  # held here, so other tests' arrays neither count nor, freed meanwhile, hide ours
    known = frozenset(id(array) for array in earlier)
    model = zd.build_distributed(lambda: GPTCausalLM.from_preset(folder, load_weights=False), distribution)
    sizes = dict(zip(distribution.device_mesh.axis_names, distribution.device_mesh.shape))
    split = lambda v: math.prod(sizes[a] for a in v.value.sharding.spec if a is not None)  # noqa: E731
    sharded = sum(v.value.nbytes // split(v) for v in model.weights)
    assert sharded < 0.3 * sum(v.value.nbytes for v in model.weights)

    reads, peak = [], collections.Counter()
    original = hf_checkpoints.load_into

    def sample():
        for device, nbytes in live_bytes_per_device(exclude=known).items():
            peak[device] = max(peak[device], nbytes)

    class Sampled:
        """The variable, sampling the devices when the new array is handed to ``assign``."""

        def __init__(self, variable):
            self.variable = variable

        def __getattr__(self, name):
            return getattr(self.variable, name)

        def assign(self, value):  # the new array is whole on its devices: the old one must be gone
            sample()
            return self.variable.assign(value)

    def watched(variable, files, view, on_read=None):
        shard = variable.value.nbytes // split(variable)
        original(
            Sampled(variable), files, view, on_read=lambda block: reads.append((variable.path, block.nbytes, shard))
        )
        sample()

    monkeypatch.setattr(hf_checkpoints, "load_into", watched)
    hf_checkpoints.load_hf_weights(model, str(folder))
    assert reads and all(nbytes == shard for _, nbytes, shard in reads), "a device read more than its shard"
    assert max(peak.values()) <= sharded, (
        dict(peak),
        sharded,
    )  # never the old value and the new shard at once (<= 1.1x asked)
    for variable in model.weights:  # the values are the file's, bit for bit, in the layout's shards
        np.testing.assert_array_equal(np.asarray(variable.value), reference[variable.path], err_msg=variable.path)


def test_the_expert_layout_reads_only_each_devices_experts(loaded, monkeypatch):
    """Mixtral under ``expert`` (data=2, expert=4): a device holding expert j of a
    stacked (E, C, F) weight reads expert j's tensor alone, and the values are the file's."""
    folder = FIXTURES / "mixtral"
    distribution = zd.distribution_for(GPTCausalLM, "expert", "data=2,expert=4", config=fixture_config("mixtral"))
    model = zd.build_distributed(lambda: GPTCausalLM.from_preset(folder, load_weights=False), distribution)
    reads, pending = [], []  # reads: (variable path, slice shape, tensors read for that slice)
    original = hf_checkpoints.load_into

    class Counted:
        """The checkpoint's files, noting every tensor a read touches."""

        def __init__(self, files):
            self.files = files

        def shape(self, name):
            return self.files.shape(name)

        def read(self, name, index=()):
            pending.append(name)
            return self.files.read(name, index)

    def watched(variable, files, view, on_read=None):
        def done(block):  # one device's slice, read
            reads.append((variable.path, block.shape, tuple(pending)))
            pending.clear()

        original(variable, Counted(files), view, on_read=done)

    monkeypatch.setattr(hf_checkpoints, "load_into", watched)
    hf_checkpoints.load_hf_weights(model, str(folder))
    experts = [(path, shape, names) for path, shape, names in reads if re.search(r"mlp/expert_(gate|up|down)$", path)]
    assert len(experts) >= 2 * 3 * 4  # 2 blocks x 3 weights x 4 expert slices
    for path, shape, names in experts:
        assert shape[0] == 1 and len(names) == 1 and ".experts." in names[0], (path, shape, names)  # one expert of 4
    read = collections.defaultdict(set)
    for path, _, names in experts:
        read[path].add(int(re.search(r"\.experts\.(\d+)\.", names[0]).group(1)))
    assert all(ids == {0, 1, 2, 3} for ids in read.values()) and len(read) == 6
    reference = {w.path: np.asarray(w.value) for w in loaded["mixtral"].weights}
    for variable in model.weights:  # each device's shard is its own experts' (all distinct random values)
        if variable.path in read:
            assert variable.value.sharding.spec[0] == "expert"
            for shard in variable.value.addressable_shards:
                np.testing.assert_array_equal(
                    np.asarray(shard.data), reference[variable.path][shard.index], err_msg=variable.path
                )


def test_zoo_export_writes_bfloat16_that_reloads(tmp_path):
    from zoo.cli.main import build_parser, run

    assert (
        run(
            build_parser().parse_args(
                ["export", str(FIXTURES / "qwen2"), str(tmp_path / "bf16"), "--dtype", "bfloat16"]
            )
        )
        == 0
    )
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["torch_dtype"] == "bfloat16"
    source, exported = (GPTCausalLM.from_preset(path) for path in (FIXTURES / "qwen2", tmp_path / "bf16"))
    for before, after in zip(source.weights, exported.weights, strict=True):  # float32 weights rounded to bfloat16 once
        np.testing.assert_array_equal(
            np.asarray(after.value), np.asarray(before.value).astype("bfloat16").astype("float32")
        )


def test_a_pipelined_gpt_exports_its_blocks_in_order_and_generates(tmp_path):
    """A circular-schedule backbone (R = 2 repeats of L/R = 2 blocks: block i is entry
    [i // 2, i % 2] of each stacked weight) is written as layers 0..3 in order: the folder
    computes the pipelined model's logits, and the pipelined model generates (through its
    layer-by-layer twin) what the reloaded one generates; the folder loads back into a
    pipelined model weight for weight. A model trained on bytes ships the byte tokenizer."""
    import keras

    from zoo.models import GPTCausalLMPreprocessor
    from zoo.tokenizers import ByteTokenizer

    keras.utils.set_random_seed(0)
    pipelined = GPTCausalLM.from_config_name("gpt_tiny", num_layers=4, schedule="circular", repeats=2)
    pipelined.preprocessor = GPTCausalLMPreprocessor(ByteTokenizer(), sequence_length=32)
    pipelined.save_to_hf(tmp_path / "out")
    layers = GPTCausalLM.from_preset(tmp_path / "out")
    assert layers.backbone.schedule is None and layers.backbone.num_layers == 4
    stacked = np.asarray(
        pipelined.backbone.pipelined_blocks.stacked["attention/query/kernel"].value
    )  # (R, L/R, C, H, D)
    weights = {w.path: np.asarray(w.value) for w in layers.weights}
    for index in range(4):
        np.testing.assert_array_equal(weights[f"block_{index}/attention/query/kernel"], stacked[index // 2, index % 2])
    token_ids = np.random.default_rng(0).integers(1, 256, (2, 12)).astype("int32")
    np.testing.assert_allclose(np.asarray(layers(token_ids)), np.asarray(pipelined(token_ids)), atol=1e-5, rtol=0)
    greedy = pipelined.generate(token_ids[:, :6], max_new_tokens=4, sampler="greedy")
    np.testing.assert_array_equal(greedy, layers.generate(token_ids[:, :6], max_new_tokens=4, sampler="greedy"))
    assert layers.preprocessor.tokenizer.encode("héllo\x00").tolist() == ByteTokenizer().encode("héllo\x00").tolist()
    # and back into a pipelined model: layer i into place [i // 2, i % 2] of each stacked weight
    reloaded = GPTCausalLM.from_preset(tmp_path / "out", schedule="circular", repeats=2)
    for path, variable in pipelined.backbone.pipelined_blocks.stacked.items():
        loaded = reloaded.backbone.pipelined_blocks.stacked[path]
        np.testing.assert_array_equal(np.asarray(loaded.value), np.asarray(variable.value), err_msg=path)


@pytest.mark.parametrize("name", GEMMA_NAMES)
def test_gemma_under_tp_computes_the_same_logits(name):
    """Gemma's pieces under ``tp`` (data=4, model=2): soft-capped scores and qk-norm (offset
    scales) inside the tensor-parallel attention's shard_map, post-norms, scaled embeddings."""
    token_ids, logits = expected(name)
    distribution = zd.distribution_for(GPTCausalLM, "tp", "data=4,model=2", config=fixture_config(name))
    model = zd.build_distributed(lambda: GPTCausalLM.from_preset(FIXTURES / name), distribution)
    rows = np.concatenate([token_ids, token_ids[::-1]])  # (4, 16): a batch the data axis of 4 splits
    np.testing.assert_allclose(np.asarray(model(rows)), np.concatenate([logits, logits[::-1]]), atol=1e-4, rtol=0)


def test_a_gemma3_config_as_transformers_saves_it_loads():
    """transformers 4.57's ``Gemma3TextConfig.save_pretrained`` (a fine-tune, say) writes its
    own ``_sliding_window_pattern`` beside ``layer_types``, which decides the windowed layers."""
    published = fixture_config("gemma3_text")  # sliding_window_pattern 3, 3 layers, no layer_types
    layer_types = ["sliding_attention", "sliding_attention", "full_attention"]
    saved = {**published, "_sliding_window_pattern": 3, "layer_types": layer_types}
    assert backbone_arguments(saved) == backbone_arguments(published)
