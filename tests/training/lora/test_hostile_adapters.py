"""Adapters are data from elsewhere (issue 46, items 3 and 4): a PEFT adapter folder gets the
checks a Hugging Face model folder gets (containment, special files, dtype, finiteness),
``target_modules`` is honoured as PEFT honours it, and an adapter whose merged model computes
NaN (``lora_alpha: 1e38``: finite weights of 1.7e36) is refused by ``zoo export`` before
anything is written. Each refusal is one line naming the file.

The base is the GQA Llama fixture (no weights read where a header check suffices: one
model is built for the module, one forward pass per export case).
"""

import json
import os
import pathlib
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from tests.presets.test_hostile_folders import link_outside
from zoo.config.settings import ExportSettings
from zoo.models import GPTCausalLM
from zoo.models.gpt import NonFiniteModelError
from zoo.training.export import export
from zoo.training.lora.peft_adapters import is_targeted, load_peft_adapter, read_peft_adapter

HF = pathlib.Path(__file__).resolve().parents[2] / "fixtures" / "hf"
BASE, ADAPTER = HF / "llama_gqa_rope_scaling", HF / "peft_llama_gqa"
WEIGHTS, CONFIG = "adapter_model.safetensors", "adapter_config.json"
Q0_A = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"


def set_config(**changes):
    def damage(folder, outside):
        config = json.loads((folder / CONFIG).read_text())
        (folder / CONFIG).write_text(json.dumps({**config, **changes}))

    return damage


def set_tensor(name, change):
    def damage(folder, outside):
        tensors = load_file(folder / WEIGHTS)
        tensors[name] = change(tensors[name])
        save_file(tensors, folder / WEIGHTS)

    return damage


def fifo(name):
    def damage(folder, outside):
        os.remove(folder / name)
        os.mkfifo(folder / name)

    return damage


def with_nan(tensor):
    tensor = tensor.copy()
    tensor.flat[3] = np.nan
    return tensor


CASES = [
    ("weights-symlink-outside", link_outside(WEIGHTS), r"names 'adapter_model.safetensors', a symlink to '.*/outside/adapter_model.safetensors' outside the folder"),
    ("config-symlink-outside", link_outside(CONFIG), r"names 'adapter_config.json', a symlink to .* outside the folder"),
    ("weights-fifo", fifo(WEIGHTS), r"/adapter/adapter_model.safetensors is a FIFO \(named pipe\), not a safetensors file"),
    ("config-fifo", fifo(CONFIG), r"/adapter/adapter_config.json is a FIFO \(named pipe\), not a JSON file"),
    ("factor-int8", set_tensor(Q0_A, lambda t: t.astype(np.int8)), rf"adapter_model.safetensors: tensor '{Q0_A}' is stored as I8"),
    ("factor-nan", set_tensor(Q0_A, with_nan), rf"adapter_model.safetensors: tensor '{Q0_A}' holds 1 NaN or infinite"),
    ("alpha-infinite", set_config(lora_alpha=float("inf")), r"adapter_config.json: lora_alpha = inf must be a finite number > 0"),
    ("alpha-negative", set_config(alpha_pattern={"q_proj": -1}), r"alpha_pattern\['q_proj'\] = -1 must be a finite number > 0"),
    ("rank-zero", set_config(r=0), r"adapter_config.json: r = 0 must be a positive integer"),
    ("config-array", lambda folder, outside: (folder / CONFIG).write_text("[1, 2]"), r"adapter_config.json: holds a JSON list"),
    ("targets-nothing-held", set_config(target_modules=["embed_tokens"]), r"target_modules = \['embed_tokens'\] names none"),
    ("regex-with-layers", set_config(target_modules=".*q_proj", layers_to_transform=[0]), r"adapter_config.json: layers_to_transform = \[0\] with target_modules = '.\*q_proj', a string; peft refuses"),
    ("pattern-without-layers", set_config(layers_pattern="layers"), r"adapter_config.json: layers_pattern = 'layers' without layers_to_transform; peft refuses it"),
]  # fmt: skip


def damaged(tmp_path, damage):
    folder, outside = tmp_path / "adapter", tmp_path / "outside"
    shutil.copytree(ADAPTER, folder)
    shutil.copytree(ADAPTER, outside)
    damage(folder, outside)
    return folder


@pytest.fixture(scope="module")
def base():
    return GPTCausalLM.from_preset(BASE, load_weights=False)


@pytest.mark.parametrize(("damage", "message"), [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_a_hostile_adapter_is_refused_naming_the_file(tmp_path, base, damage, message):
    folder = damaged(tmp_path, damage)
    with pytest.raises(ValueError, match=message) as raised:
        load_peft_adapter(base, folder)
    assert "\n" not in str(raised.value)


def test_an_alpha_of_1e38_is_refused_by_export_before_anything_is_written(tmp_path):
    folder = damaged(tmp_path, set_config(lora_alpha=1e38))
    with pytest.raises(NonFiniteModelError, match=r"/merged: not written: the model's logits on a probe batch"):
        export(ExportSettings(model=str(BASE), output=str(tmp_path / "merged"), lora=str(folder)), report=print)
    assert sorted(os.listdir(tmp_path)) == ["adapter", "outside"]  # no folder, no partial


def test_target_modules_is_honoured_as_peft_honours_it(tmp_path, base):
    """The fixture's file holds factors for all 7 modules of each block; PEFT with
    ``target_modules: ["q_proj"]`` puts LoRA on q_proj only, and ignores the other factors."""
    folder = damaged(tmp_path, set_config(target_modules=["q_proj"]))
    model = GPTCausalLM.from_preset(BASE, load_weights=False)
    before = {w.path: np.asarray(w.value) for w in model.weights}
    merged = load_peft_adapter(model, folder)
    layers = model.backbone.num_layers
    assert merged == [f"model.layers.{i}.self_attn.q_proj" for i in range(layers)]
    changed = sorted(w.path for w in model.weights if not np.array_equal(np.asarray(w.value), before[w.path]))
    assert changed == [f"block_{i}/attention/query/kernel" for i in range(layers)]


EXPERT_W1 = "model.layers.1.block_sparse_moe.experts.0.w1"  # mixtral's (transformers 4): block 1, expert 0


@pytest.mark.parametrize(
    ("config", "module", "targeted"),
    [
        ({"target_modules": ["q_proj"]}, "model.layers.0.self_attn.q_proj", True),
        ({"target_modules": ["q_proj"]}, "model.layers.0.self_attn.k_proj", False),
        ({"target_modules": ["proj"]}, "model.layers.0.self_attn.q_proj", False),  # a whole last part, not a suffix
        ({"target_modules": ["self_attn.q_proj"]}, "model.layers.1.self_attn.q_proj", True),
        ({"target_modules": ".*\\.(q|v)_proj"}, "model.layers.3.self_attn.v_proj", True),
        ({"target_modules": "q_proj"}, "model.layers.3.self_attn.q_proj", False),  # a string is a regex matched whole
        ({"target_modules": "all-linear"}, "model.layers.0.mlp.down_proj", True),
        ({"target_modules": "All-Linear"}, "model.layers.0.mlp.down_proj", True),  # any case
        ({"target_modules": "all-linear"}, "lm_head", False),
        ({"target_modules": ["q_proj"], "layers_to_transform": [1]}, "model.layers.0.self_attn.q_proj", False),
        ({"target_modules": ["q_proj"], "layers_to_transform": 1}, "model.layers.1.self_attn.q_proj", True),
        ({"target_modules": ["q_proj"], "layers_to_transform": []}, "model.layers.1.self_attn.q_proj", True),  # unset
        ({"target_modules": ["q_proj"], "layers_to_transform": [0], "layers_pattern": "blocks"}, "model.layers.0.self_attn.q_proj", False),
        ({"target_modules": ["q_proj"], "layers_to_transform": [1], "layers_pattern": "model\\.layers"}, "model.layers.1.self_attn.q_proj", True),  # a pattern at the start
        ({"target_modules": ["q_proj"], "layers_to_transform": [1], "layers_pattern": ""}, "model.layers.1.self_attn.q_proj", True),  # empty: none
        ({"target_modules": ["w1"], "layers_to_transform": [1]}, EXPERT_W1, True),  # the first index, not the expert's
        ({"target_modules": ["w1"], "layers_to_transform": [0]}, EXPERT_W1, False),
        ({"target_modules": ["w1"], "layers_to_transform": [1], "layers_pattern": "layers"}, EXPERT_W1, True),
        ({"target_modules": ["model.layers.1.self_attn.q_proj"], "layers_to_transform": [0]}, "model.layers.1.self_attn.q_proj", True),  # a full name: no layer check
        ({"target_modules": ["q_proj"], "exclude_modules": ["model.layers.0.self_attn.q_proj"]}, "model.layers.0.self_attn.q_proj", False),
        ({"target_modules": ["q_proj"], "exclude_modules": ".*layers\\.0\\..*"}, "model.layers.0.self_attn.q_proj", False),
        ({"target_modules": ["q_proj"], "exclude_modules": "layers"}, "model.layers.0.self_attn.q_proj", True),  # matched whole
        ({"target_modules": "all-linear", "exclude_modules": ["down_proj"]}, "model.layers.0.mlp.down_proj", False),
        ({"target_modules": ["lm_head"]}, "lm_head", True),
        ({"target_modules": []}, "model.layers.0.self_attn.q_proj", False),
        ({"target_modules": None}, "model.layers.0.self_attn.q_proj", True),  # peft's default for llama: q_proj, v_proj
        ({"target_modules": None}, "model.layers.0.self_attn.k_proj", False),
        ({"target_modules": None, "layers_to_transform": [1]}, "model.layers.0.self_attn.v_proj", False),
    ],
)  # fmt: skip
def test_which_modules_peft_targets(config, module, targeted):
    """Rows as peft 0.21.2 decides them (tests/training/lora/test_peft_oracle.py asks peft itself)."""
    assert is_targeted(config, module, model_type="llama") is targeted


@pytest.mark.parametrize(
    ("config", "model_type", "message"),
    [
        ({"target_modules": ".*q_proj", "layers_to_transform": [0]}, "llama", r"layers_to_transform = \[0\] with target_modules = '.\*q_proj', a string"),
        ({"target_modules": "all-linear", "layers_pattern": "layers"}, "llama", r"layers_pattern = 'layers' with target_modules = 'all-linear'"),
        ({"target_modules": ["q_proj"], "layers_pattern": "layers"}, "llama", r"layers_pattern = 'layers' without layers_to_transform"),
        ({"target_modules": None}, "qwen2_moe", r"target_modules is null and peft has no default target_modules for model type 'qwen2_moe'"),
    ],
)  # fmt: skip
def test_a_config_peft_refuses_is_refused(config, model_type, message):
    with pytest.raises(ValueError, match=message):
        is_targeted(config, "model.layers.0.self_attn.q_proj", model_type=model_type)


def test_the_fixture_reads_whole(tmp_path):
    config, factors = read_peft_adapter(ADAPTER)
    assert len(factors) == 7 * 2 and all(is_targeted(config, module) for module in factors)
