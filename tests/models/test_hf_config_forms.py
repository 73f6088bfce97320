"""config.json in both forms, and the types of what the zoo writes.

transformers 4 writes ``rope_theta`` / ``rope_scaling`` (Gemma 3: ``rope_local_base_freq``);
transformers 5 writes ``rope_parameters`` in their place (Gemma 3's nested by layer type) and
Qwen3-MoE's ``num_experts`` as ``num_local_experts``. Every fixture (written by 4.57.6) must
map to the same ``GPTBackbone`` arguments in both forms (the logits of both forms:
tests/models/test_hf_checkpoints.py::test_both_config_forms_compute_the_same_logits).
transformers 5's configs are strict dataclasses, so every value the zoo writes must have the
type transformers declares for its key.

The tests marked ``needs_transformers`` run only where transformers and torch import (not
in CI: neither is a test dependency); docs/checkpoints-hf.md names the versions they ran with.
"""

import importlib.util
import json
import math
import pathlib

import numpy as np
import pytest

from zoo.models.gpt._hf_config import backbone_arguments
from zoo.models.gpt._hf_export_config import hf_config, written_types
from zoo.models.gpt._hf_keys import (
    NULLABLE,
    ROPE_SCALING_TYPES,
    WRITTEN_TYPES,
    UnsupportedCheckpoint,
    resolved_heads,
    transformers4_keys,
)
from zoo.presets.safetensors_weights import CheckpointError

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "hf"
NAMES = tuple(sorted(path.parent.name for path in FIXTURES.glob("*/config.json")))

needs_transformers = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None or importlib.util.find_spec("torch") is None,
    reason="transformers and torch are not test dependencies (run in a venv that has them)",
)


def fixture_config(name):
    return json.loads((FIXTURES / name / "config.json").read_text())


def transformers5_form(config):
    """``config`` (transformers 4's keys) as transformers 5 writes it: ``rope_theta`` and
    ``rope_scaling`` as ``rope_parameters`` (``rope_type`` ``"default"`` when unscaled), Gemma 3's
    nested by layer type with ``rope_local_base_freq`` as the sliding layers' ``rope_theta``;
    Qwen3-MoE's ``num_experts`` as ``num_local_experts``; Gemma 2's ``use_bidirectional_attention``
    null. (transformers 5.18.0 and 5.25.0 write these for every fixture:
    test_transformers_writes_the_form_the_zoo_reads checks it where transformers imports.)"""
    config = dict(config)
    theta, scaling = config.pop("rope_theta", None), config.pop("rope_scaling", None)
    rope = {"rope_type": "default", "rope_theta": theta} if scaling is None else {**scaling, "rope_theta": theta}
    if config["model_type"] == "gemma3_text":
        local = {"rope_type": "default", "rope_theta": config.pop("rope_local_base_freq")}
        rope = {"full_attention": rope, "sliding_attention": local}
    if config["model_type"] == "gemma2":
        config["use_bidirectional_attention"] = None
    if config["model_type"] == "qwen3_moe":
        config["num_local_experts"] = config.pop("num_experts")
    return {**config, "rope_parameters": rope}


def same_model(arguments):
    """``arguments`` with KV heads and head_dim stated (None means H, C / H to GPTBackbone)."""
    return {**arguments, **resolved_heads(arguments)}


@pytest.mark.parametrize("name", NAMES)
def test_both_forms_map_to_the_same_arguments(name):
    config = fixture_config(name)
    form5 = transformers5_form(config)
    assert not {"rope_theta", "rope_scaling", "rope_local_base_freq"} & set(form5)
    assert backbone_arguments(form5) == backbone_arguments(config)
    assert transformers4_keys(config) == config  # a transformers 4 file comes back as it is


def test_a_llama3_config_as_transformers5_writes_it_loads():
    """The issue's case: rope_parameters in place of rope_theta / rope_scaling; and the two forms mixed,
    as long as they agree (a file carrying both is read by each transformers from its own keys)."""
    config = fixture_config("llama_gqa_rope_scaling")
    rope = {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    form5 = {key: value for key, value in config.items() if key not in ("rope_theta", "rope_scaling")}
    arguments = backbone_arguments({**form5, "rope_parameters": rope})
    assert arguments == backbone_arguments(config)
    assert (arguments["rope_max_wavelength"], arguments["rope_scaling"]["factor"]) == (500000.0, 8.0)
    assert backbone_arguments({**config, "rope_parameters": rope}) == arguments  # both forms, agreeing
    unset = backbone_arguments({**form5, "rope_parameters": {"rope_type": "default"}})  # no rope_theta: the default
    assert (unset["rope_max_wavelength"], unset.get("rope_scaling")) == (10000.0, None)
    kept = backbone_arguments({**form5, "rope_theta": 2e5, "rope_parameters": {"rope_type": "default"}})
    assert kept["rope_max_wavelength"] == 2e5  # transformers 5 takes a lone rope_theta as rope_parameters' default


def llama5(rope):
    config = fixture_config("llama_gqa_rope_scaling")
    return {**{k: v for k, v in config.items() if k not in ("rope_theta", "rope_scaling")}, "rope_parameters": rope}


LLAMA3 = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}


@pytest.mark.parametrize(
    ("config", "named"),
    [
        (llama5({"rope_type": "default", "rope_theta": -1.0}), "rope_parameters: rope_theta = -1.0 must be a finite"),
        (llama5({"rope_type": "default", "rope_theta": 0}), "rope_parameters: rope_theta = 0 must be a finite"),
        (llama5({"rope_theta": math.inf}), "rope_parameters: rope_theta = inf must be a finite number > 0"),
        (llama5({"rope_theta": "1e4"}), "rope_parameters: rope_theta = '1e4' must be a finite number > 0"),
        (llama5({**LLAMA3, "factor": 0.0}), "rope_parameters factor = 0.0 must be a finite number > 0"),
        (llama5({**LLAMA3, "low_freq_factor": math.nan}), "rope_parameters low_freq_factor = nan must be a finite"),
        (llama5({**LLAMA3, "high_freq_factor": 1.0}), "rope_parameters high_freq_factor = 1.0 must exceed"),
        (
            llama5({**LLAMA3, "original_max_position_embeddings": 64.5}),
            "rope_parameters: original_max_position_embeddings = 64.5 must be a positive integer",
        ),
        (
            llama5({k: v for k, v in LLAMA3.items() if k != "factor"}),
            "rope_parameters factor = None must be a finite number > 0",
        ),
        (llama5([10000.0]), "rope_parameters = [10000.0] must be an object of RoPE keys"),
        (
            {**fixture_config("llama_gqa_rope_scaling"), "rope_parameters": {**LLAMA3, "rope_theta": 1e4}},
            "rope_theta = 500000.0 and rope_parameters.rope_theta = 10000.0 disagree",
        ),
        (
            {**transformers5_form(fixture_config("qwen3_moe")), "num_experts": 8},
            "num_experts = 8 and num_local_experts = 4 disagree",
        ),
        (
            {
                **transformers5_form(fixture_config("gemma3_text")),
                "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": -5.0}},
            },
            "rope_parameters.sliding_attention: rope_theta = -5.0 must be a finite number > 0",
        ),
    ],
)
def test_bad_rope_parameters_are_damaged_files_named_by_key(config, named):
    with pytest.raises(CheckpointError) as error:
        backbone_arguments(config)
    assert named in str(error.value)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    ("config", "named"),
    [
        (
            llama5({"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}),
            "rope_parameters rope_type = 'yarn' is not supported for model_type 'llama'",
        ),
        (
            llama5({**LLAMA3, "partial_rotary_factor": 0.5}),
            "rope_parameters key 'partial_rotary_factor' (= 0.5) is not one the zoo GPT knows for rope_type 'llama3'",
        ),
        (
            llama5({"full_attention": {"rope_type": "default"}}),
            "rope_parameters nested by layer type (['full_attention']) is not supported for model_type 'llama'",
        ),
        (
            {**transformers5_form(fixture_config("gemma3_text")), "rope_parameters": {"rope_type": "default"}},
            "rope_parameters key 'rope_type' (= 'default') is not one the zoo GPT knows for model_type 'gemma3_text'",
        ),
        (
            {
                **transformers5_form(fixture_config("gemma3_text")),
                "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 8.0}},
            },  # Gemma 3 4B and larger
            "rope_parameters.full_attention rope_type = 'linear' is not supported for model_type 'gemma3_text'",
        ),
        (
            {**transformers5_form(fixture_config("gemma3_text")), "rope_parameters": {"sliding_attention": None}},
            "rope_parameters.sliding_attention = None (no RoPE in those layers) is not supported",
        ),
        (
            {**transformers5_form(fixture_config("gemma2")), "rope_parameters": LLAMA3},
            "rope_parameters rope_type = 'llama3' is not supported for model_type 'gemma2'",
        ),
    ],
)
def test_rope_parameters_the_zoo_cannot_compute_are_refused_naming_them(config, named):
    with pytest.raises(UnsupportedCheckpoint) as error:
        backbone_arguments(config)
    assert named in str(error.value)


# --- what the zoo writes ------------------------------------------------------------------

SMALL = dict(vocabulary_size=320, num_layers=2, num_query_heads=4, hidden_dim=32, intermediate_dim=48)
GEMMA = dict(mlp="geglu_tanh", norm="rms_offset", post_norms=True, scale_embeddings=True, tie_word_embeddings=True)
# zoo GPT arguments whose numbers are of the other JSON type than transformers declares for their keys
# (ints for floats; Gemma's query_pre_attn_scalar from attention_scale as a float): each is written typed
NATIVE = {
    "gemma2_ints": dict(
        SMALL,
        **GEMMA,
        num_key_value_heads=2,
        head_dim=16,
        attention_scale=144**-0.5,  # (144 ** -0.5) ** -2 is 144.00000000000003
        attention_logit_softcap=50,
        final_logit_softcap=30,
        rope_max_wavelength=10000,
        sliding_window=8,
        sliding_window_layers=[0],
        max_sequence_length=128,
    ),
    "gemma3_ints": dict(
        SMALL,
        **GEMMA,
        num_key_value_heads=1,
        head_dim=16,
        qk_norm=True,
        rope_max_wavelength=1000000,
        local_rope_max_wavelength=10000,
        sliding_window=8,
        sliding_window_layers=[0],
        max_sequence_length=128,
    ),
    "llama3_ints": dict(
        SMALL,
        num_key_value_heads=2,
        rope_max_wavelength=500000,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8,
            "low_freq_factor": 1,
            "high_freq_factor": 4,
            "original_max_position_embeddings": 64,
        },
        max_sequence_length=128,
    ),
    "qwen2_window": dict(
        SMALL, qkv_bias=True, sliding_window=8, sliding_window_layers=[1], rope_max_wavelength=1000000
    ),
    "mixtral_no_aux_loss": dict(
        SMALL,
        intermediate_dim=16,  # the experts' width: Mixtral has one (every block sparse)
        num_key_value_heads=2,
        num_experts=4,
        num_experts_per_token=2,
        moe_intermediate_dim=16,
        router_aux_loss_coefficient=0,
    ),
    "qwen3_moe_dense_first": dict(
        SMALL,
        num_key_value_heads=2,
        head_dim=16,
        qk_norm=True,
        num_experts=4,
        num_experts_per_token=2,
        moe_intermediate_dim=8,
        moe_layers=[1],
        normalize_router_weights=False,
    ),
}


def assert_declared_types(config):
    for key, value in config.items():
        if value is None:
            assert key in NULLABLE, key
        elif key == "rope_scaling":
            assert {inner: type(item) for inner, item in value.items()} == ROPE_SCALING_TYPES, value
        else:
            assert type(value) is WRITTEN_TYPES[key], (key, value)


@pytest.mark.parametrize("case", [*NAMES, *NATIVE])
def test_every_written_value_has_the_type_transformers_declares(case):
    arguments = NATIVE[case] if case in NATIVE else backbone_arguments(fixture_config(case))
    written = hf_config(arguments, special_ids={"bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 2})
    assert_declared_types(written)
    read = backbone_arguments(json.loads(json.dumps(written)))
    assert {key: value for key, value in read.items() if key in arguments} == arguments  # the same numbers


def test_the_issues_values_are_written_as_transformers_declares_them():
    """query_pre_attn_scalar was written 16.0 / 24.0 (transformers 5.18 refused the folder)."""
    for name, scalar in (("gemma2", 24), ("gemma3_text", 16)):
        written = hf_config(backbone_arguments(fixture_config(name)))
        assert type(written["query_pre_attn_scalar"]) is int and written["query_pre_attn_scalar"] == scalar
    gemma2 = hf_config(NATIVE["gemma2_ints"])
    assert (gemma2["query_pre_attn_scalar"], gemma2["attn_logit_softcapping"], gemma2["rope_theta"]) == (144, 50.0, 1e4)
    assert type(gemma2["attn_logit_softcapping"]) is float and type(gemma2["rope_theta"]) is float
    llama = hf_config(NATIVE["llama3_ints"])
    assert llama["rope_scaling"] == {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    assert hf_config(NATIVE["mixtral_no_aux_loss"])["router_aux_loss_coef"] == 0.0
    with pytest.raises(UnsupportedCheckpoint, match=r"attention_scale = 0.3 is not q \*\* -0.5 for an integer q"):
        hf_config({**NATIVE["gemma2_ints"], "attention_scale": 0.3})
    with pytest.raises(UnsupportedCheckpoint, match=r"head_dim = 16.5 cannot be written: .* of type int"):
        written_types({"head_dim": 16.5})
    with pytest.raises(UnsupportedCheckpoint, match=r"tie_word_embeddings = 1 cannot be written: .* of type bool"):
        written_types({"tie_word_embeddings": 1})
    with pytest.raises(KeyError, match="quantization_config"):
        written_types({"quantization_config": {}})


# --- with transformers itself (not in CI) --------------------------------------------------


def transformers_logits(folder, token_ids):
    """transformers' float32 logits of the folder (AutoConfig, then AutoModelForCausalLM, eager attention)."""
    import torch
    import transformers

    config = transformers.AutoConfig.from_pretrained(folder)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    assert model.config.model_type == config.model_type
    with torch.no_grad():
        return model(torch.from_numpy(np.asarray(token_ids)).long()).logits.float().numpy()


@needs_transformers
@pytest.mark.parametrize("case", [*NAMES, *NATIVE])
def test_transformers_loads_what_the_zoo_saves(case, tmp_path):
    """save_to_hf of each fixture and of each NATIVE model: transformers (4.57 and 5.x) loads the
    folder and computes the zoo's logits (float32; 1e-4, as the fixtures' own oracle tests)."""
    from zoo.models import GPTBackbone, GPTCausalLM

    if case in NATIVE:
        model = GPTCausalLM(backbone=GPTBackbone(**NATIVE[case], seed=0))
        token_ids = np.random.default_rng(0).integers(0, 320, (2, 16)).astype("int32")
    else:
        model = GPTCausalLM.from_preset(FIXTURES / case)
        token_ids = np.load(FIXTURES / case / "expected.npz")["token_ids"]
    model.save_to_hf(tmp_path / "out")
    theirs = transformers_logits(tmp_path / "out", token_ids)
    ours = np.asarray(model(token_ids))
    print(f"{case}: max |transformers - zoo| = {np.abs(theirs - ours).max():.3e}")
    np.testing.assert_allclose(theirs, ours, atol=1e-4, rtol=0)


@needs_transformers
@pytest.mark.parametrize("name", NAMES)
def test_transformers_writes_the_form_the_zoo_reads(name, tmp_path):
    """Each fixture's config.json loaded and saved again by the transformers installed: the zoo
    maps it to the fixture's arguments; under transformers 5, rope_parameters as transformers5_form writes it."""
    import transformers

    transformers.AutoConfig.from_pretrained(FIXTURES / name).save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert same_model(backbone_arguments(saved)) == same_model(backbone_arguments(fixture_config(name)))
    if int(transformers.__version__.split(".")[0]) >= 5:
        form5 = transformers5_form(fixture_config(name))
        assert saved["rope_parameters"] == form5["rope_parameters"]
        renamed = {"num_experts"} if name == "qwen3_moe" else set()
        assert not {"rope_theta", "rope_scaling", "rope_local_base_freq", *renamed} & set(saved)
