"""Which modules a PEFT adapter adapts, asked of ``peft`` itself (issue 46: "``target_modules``
is honoured exactly as peft honours it, tested against peft on the fixtures").

Optional: skipped unless ``torch``, ``transformers`` and ``peft`` import (none is a test
dependency; run in a side environment with the zoo installed, e.g.
``/tmp/tf5/bin/python -m pytest -q -n 0 tests/training/lora/test_peft_oracle.py``).

- For every Hugging Face fixture (tests/fixtures/hf/) and every row of ``ROWS`` (a
  ``LoraConfig``'s targeting keys: ``target_modules`` as a list, one name, a regex string,
  ``"all-linear"`` or null, ``exclude_modules``, ``layers_to_transform`` with and without
  ``layers_pattern``), ``peft.get_peft_model`` on the transformers model says which
  ``nn.Linear`` modules it wraps (or raises: nothing matched, a config peft refuses), and the
  zoo's ``is_targeted`` is asked about the same module names (the transformers model's
  ``nn.Linear`` modules, the only ones whose ``lora_A`` / ``lora_B`` factors the zoo reads):
  the two sets are equal, and where peft raises the zoo targets nothing or raises too.
- End to end: an adapter ``peft`` saves with nonzero ``lora_B`` merges in the zoo
  (``load_peft_adapter``, what ``zoo export --lora`` calls) to the logits of peft's
  ``merge_and_unload`` (float32, 1e-4 as the fixtures' other oracle tests), for an adapter on
  q_proj alone and for one whose file holds all seven projections but whose config (rewritten
  after saving) names fewer, loaded by ``PeftModel.from_pretrained``.
"""

import copy
import json
import pathlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from zoo.models import GPTCausalLM  # noqa: E402
from zoo.models.gpt.hf_checkpoints import backbone_arguments, read_config, weight_views  # noqa: E402
from zoo.presets.safetensors_weights import TensorView  # noqa: E402
from zoo.training.lora.peft_adapters import is_targeted, load_peft_adapter  # noqa: E402

HF = pathlib.Path(__file__).resolve().parents[2] / "fixtures" / "hf"
FIXTURES = [
    "llama_gqa_rope_scaling",
    "llama_mha_tied",
    "mistral_window",
    "qwen2",
    "qwen2_5",
    "qwen3",
    "gemma2",
    "gemma3_text",
    "mixtral",
    "qwen2_moe",
    "qwen3_moe",
]
DENSE = [name for name in FIXTURES if not name.endswith(("mixtral", "_moe"))]
SEVEN = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

# id -> the targeting keys of a LoraConfig (adapter_config.json's keys, the same names)
ROWS = {
    "list-one": {"target_modules": ["q_proj"]},
    "list-three": {"target_modules": ["q_proj", "v_proj", "down_proj"]},
    "list-seven": {"target_modules": SEVEN},
    "list-two-parts": {"target_modules": ["self_attn.q_proj"]},
    "list-part-of-a-part": {"target_modules": ["proj"]},  # no module's last part: peft raises
    "list-full-name": {"target_modules": ["model.layers.1.mlp.up_proj"]},
    "list-lm_head": {"target_modules": ["lm_head"]},
    "list-unknown": {"target_modules": ["nonexistent"]},  # peft raises
    "list-empty": {"target_modules": []},  # peft raises
    "list-moe-names": {"target_modules": ["w1", "shared_expert.up_proj", "gate"]},
    "string-one-name": {"target_modules": "q_proj"},  # a regex matched whole: nothing
    "string-regex": {"target_modules": r".*\.(q|v)_proj"},
    "string-regex-one-layer": {"target_modules": r"model\.layers\.1\.self_attn\.(k|o)_proj"},
    "string-regex-alternatives": {"target_modules": r"lm_head|.*down_proj"},
    "string-regex-a-prefix": {"target_modules": r"model\.layers\.0\.self_attn\.q"},  # fullmatch: nothing
    "string-empty": {"target_modules": ""},
    "all-linear": {"target_modules": "all-linear"},
    "all-linear-capitals": {"target_modules": "All-Linear"},
    "all-linear-excluding": {"target_modules": "all-linear", "exclude_modules": ["down_proj", "lm_head"]},
    "all-linear-layers": {"target_modules": "all-linear", "layers_to_transform": [0]},  # peft refuses
    "regex-layers": {"target_modules": r".*q_proj", "layers_to_transform": [0]},  # peft refuses
    "null": {"target_modules": None},  # peft's default for the model type
    "null-layers": {"target_modules": None, "layers_to_transform": [1]},
    "exclude-name": {"target_modules": SEVEN, "exclude_modules": ["k_proj"]},
    "exclude-full-name": {"target_modules": ["q_proj"], "exclude_modules": ["model.layers.0.self_attn.q_proj"]},
    "exclude-two-parts": {"target_modules": SEVEN, "exclude_modules": ["mlp.up_proj", "self_attn.v_proj"]},
    "exclude-regex": {"target_modules": SEVEN, "exclude_modules": r".*layers\.0\..*"},
    "exclude-regex-partial": {"target_modules": SEVEN, "exclude_modules": r"mlp"},  # fullmatch: excludes nothing
    "exclude-everything": {"target_modules": ["q_proj"], "exclude_modules": ["q_proj"]},  # peft raises
    "exclude-with-regex-target": {"target_modules": r".*_proj", "exclude_modules": ["o_proj"]},
    "layers-list": {"target_modules": ["q_proj", "down_proj"], "layers_to_transform": [1]},
    "layers-int": {"target_modules": SEVEN, "layers_to_transform": 0},
    "layers-all": {"target_modules": ["v_proj"], "layers_to_transform": [0, 1]},
    "layers-empty-list": {"target_modules": ["v_proj"], "layers_to_transform": []},
    "layers-out-of-range": {"target_modules": ["q_proj"], "layers_to_transform": [5]},  # peft raises
    "layers-full-name-bypasses": {
        "target_modules": ["model.layers.1.mlp.up_proj", "q_proj"],
        "layers_to_transform": [0],
    },
    # the block's index, not the expert's (model.layers.1.block_sparse_moe.experts.0.w2 is in block 1)
    "layers-first-index": {"target_modules": ["w2", "down_proj", "q_proj"], "layers_to_transform": [1]},
    "layers-pattern": {"target_modules": ["q_proj", "up_proj"], "layers_to_transform": [1], "layers_pattern": "layers"},
    "layers-pattern-list": {
        "target_modules": ["o_proj"],
        "layers_to_transform": [0],
        "layers_pattern": ["blocks", "layers"],
    },
    "layers-pattern-absent": {"target_modules": ["q_proj"], "layers_to_transform": [0], "layers_pattern": "blocks"},
    "layers-pattern-at-start": {
        "target_modules": ["k_proj"],
        "layers_to_transform": [1],
        "layers_pattern": r"model\.layers",
    },
    "layers-pattern-regex": {"target_modules": ["k_proj"], "layers_to_transform": [0], "layers_pattern": "lay.rs"},
    "layers-pattern-empty": {"target_modules": ["k_proj"], "layers_to_transform": [1], "layers_pattern": ""},
    "layers-pattern-alone": {"target_modules": ["q_proj"], "layers_pattern": "layers"},  # peft refuses
}


TRANSFORMERS_5 = int(transformers.__version__.split(".")[0]) >= 5
FUSED_EXPERTS = (
    "transformers 5 fuses a MoE block's experts into stacked parameters, and peft rewrites the "
    "config for them (peft.utils.transformers_weight_conversion: expert names to target_parameters, "
    "which the zoo refuses, and a regex target_modules to the last parts it matches, in every layer); "
    "the MoE fixtures are checked under transformers 4, whose experts are nn.Linear modules"
)


def _hf_model(name):
    return transformers.AutoModelForCausalLM.from_pretrained(
        HF / name, dtype=torch.float32, attn_implementation="eager"
    ).eval()


@pytest.fixture(scope="module")
def hf_models():
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = _hf_model(name)
        return copy.deepcopy(cache[name])

    return get


def _linear_names(model):
    return sorted(name for name, module in model.named_modules() if isinstance(module, torch.nn.Linear))


def _peft_targets(model, row):
    """The names of the modules peft wraps in LoRA, or the ValueError it raises."""
    try:
        config = peft.LoraConfig(r=2, lora_alpha=4, task_type="CAUSAL_LM", **row)
        wrapped = peft.get_peft_model(model, config).base_model.model
    except ValueError as error:
        return error
    return {name for name, module in wrapped.named_modules() if isinstance(module, peft.tuners.lora.LoraLayer)}


def _zoo_targets(folder, names, row):
    model_type = read_config(folder)["model_type"]
    try:
        return {name for name in names if is_targeted(row, name, model_type=model_type)}
    except ValueError as error:
        return error


@pytest.mark.parametrize("fixture", FIXTURES)
def test_the_zoo_names_modules_as_transformers_does(hf_models, fixture):
    """The module names the zoo reads factors for (its ``weight_views``' kernels) are
    ``nn.Linear`` modules of the transformers model, so the table below asks about them."""
    arguments = backbone_arguments(read_config(HF / fixture), where=fixture)
    zoo_modules = {
        view.name.removesuffix(".weight")
        for path, view in weight_views(arguments).items()
        if path.endswith("/kernel") and isinstance(view, TensorView)  # stacked experts: not one module each
    }
    linear = set(_linear_names(hf_models(fixture)))
    routers = {m for m in zoo_modules if m.endswith(".gate")} if fixture not in DENSE else set()
    # transformers 5 holds a MoE router as a router module with a weight, not an nn.Linear
    # (and renames mixtral's block_sparse_moe to mlp): peft cannot put LoRA on it there
    assert zoo_modules - linear <= routers, sorted(zoo_modules - linear)


@pytest.mark.parametrize("row", list(ROWS), ids=list(ROWS))
@pytest.mark.parametrize("fixture", FIXTURES)
def test_the_zoo_targets_the_modules_peft_targets(hf_models, fixture, row):
    if fixture not in DENSE and TRANSFORMERS_5:
        pytest.skip(FUSED_EXPERTS)
    model = hf_models(fixture)
    names = _linear_names(model)
    expected = _peft_targets(model, ROWS[row])
    found = _zoo_targets(HF / fixture, names, ROWS[row])
    if isinstance(expected, ValueError):  # peft adapts nothing: the zoo merges nothing
        assert isinstance(found, ValueError) or found == set(), (str(expected)[:200], sorted(found))
    else:
        assert not isinstance(found, ValueError), found
        assert expected, "peft wrapped nothing without raising"
        assert sorted(found) == sorted(expected)


def _logits(model, token_ids):
    with torch.no_grad():
        return model(torch.tensor(np.asarray(token_ids), dtype=torch.long)).logits.float().numpy()


def _zoo_logits(fixture, adapter, token_ids):
    model = GPTCausalLM.from_preset(HF / fixture)
    merged = load_peft_adapter(model, adapter)
    return merged, np.asarray(model(token_ids))


@pytest.mark.parametrize("fixture", DENSE)
def test_a_peft_adapter_on_q_proj_merges_to_peft_logits(hf_models, fixture, tmp_path):
    token_ids = np.load(HF / fixture / "expected.npz")["token_ids"]
    torch.manual_seed(0)
    config = peft.LoraConfig(r=2, lora_alpha=3, target_modules=["q_proj"], init_lora_weights=False)
    model = peft.get_peft_model(hf_models(fixture), config).eval()
    model.save_pretrained(tmp_path / "adapter")
    base = _logits(hf_models(fixture), token_ids)
    expected = _logits(model.merge_and_unload(), token_ids)
    assert np.abs(expected - base).max() > 1e-2  # the adapter moves the logits
    merged, logits = _zoo_logits(fixture, tmp_path / "adapter", token_ids)
    assert merged == [name for name in _linear_names(hf_models(fixture)) if name.endswith(".q_proj")]
    np.testing.assert_allclose(logits, expected, atol=1e-4, rtol=0)


NARROWED = {
    "layers": {"target_modules": ["q_proj", "v_proj", "down_proj"], "layers_to_transform": [1]},
    "exclude": {"target_modules": ".*_proj", "exclude_modules": ["o_proj", "model.layers.0.mlp.up_proj"]},
    "null": {"target_modules": None},  # peft's default for the model type (q_proj, v_proj)
}


@pytest.mark.parametrize("narrowed", list(NARROWED))
@pytest.mark.parametrize("fixture", ["llama_gqa_rope_scaling", "gemma2"])
def test_a_narrowed_config_merges_what_peft_loads(hf_models, fixture, narrowed, tmp_path):
    """The file holds factors for all seven projections of both layers; the config,
    rewritten after saving, names fewer (or none: null): ``PeftModel.from_pretrained``
    loads those alone, and the zoo merges those alone."""
    token_ids = np.load(HF / fixture / "expected.npz")["token_ids"]
    torch.manual_seed(0)
    config = peft.LoraConfig(r=2, lora_alpha=3, target_modules=SEVEN, init_lora_weights=False)
    peft.get_peft_model(hf_models(fixture), config).save_pretrained(tmp_path / "adapter")
    config_file = tmp_path / "adapter" / "adapter_config.json"
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()), **NARROWED[narrowed]}))
    loaded = peft.PeftModel.from_pretrained(hf_models(fixture), tmp_path / "adapter").eval()
    wrapped = sorted(
        name
        for name, module in loaded.base_model.model.named_modules()
        if isinstance(module, peft.tuners.lora.LoraLayer)
    )
    expected = _logits(loaded.merge_and_unload(), token_ids)
    merged, logits = _zoo_logits(fixture, tmp_path / "adapter", token_ids)
    assert merged == wrapped and 0 < len(merged) < 14
    np.testing.assert_allclose(logits, expected, atol=1e-4, rtol=0)
