"""LoRA adapters in the PEFT format (issue 29 item 3), on the GQA Llama fixture
(tests/fixtures/hf/llama_gqa_rope_scaling: 4 query heads, 2 KV heads, untied head).

- An adapter made by ``peft`` (tests/fixtures/hf/peft_llama_gqa, make_peft_fixture.py)
  loads into the zoo with PEFT's logits, directly and through ``zoo export --lora``.
- An adapter the zoo writes holds PEFT's factors of every adapted layer (``B @ A`` is
  the zoo's update in the file's layout; q/k/v at rank H*r, K*r with the same scale), and
  loads back to the LoRA model's logits. With ``ZOO_PEFT_CHECK_DIR=DIR`` the test also
  writes DIR/base, DIR/adapter and DIR/expected.npz for ``make_peft_fixture.py --check DIR``
  (PEFT on transformers; docs/finetuning.md gives the figure).
- What the zoo does not read is refused, naming the key.

Forward passes only (no gradient programs): a few compiles of one small model.
"""

import json
import os
import pathlib
import shutil

import numpy as np
import pytest

from zoo.config.settings import ExportSettings
from zoo.models import GPTCausalLM
from zoo.models.gpt.hf_checkpoints import weight_views
from zoo.training.export import export
from zoo.training.lora._layers import enable_lora, kernel_path
from zoo.training.lora.peft_adapters import load_peft_adapter, peft_factors, read_peft_adapter, save_peft_adapter

HF = pathlib.Path(__file__).resolve().parents[2] / "fixtures" / "hf"
BASE, ADAPTER = HF / "llama_gqa_rope_scaling", HF / "peft_llama_gqa"
RANK, ALPHA = 2, 3


@pytest.fixture(scope="module")
def expected():
    return np.load(ADAPTER / "expected.npz")


def test_an_adapter_made_by_peft_gives_peft_logits(expected, tmp_path):
    model = GPTCausalLM.from_preset(BASE)
    modules = load_peft_adapter(model, ADAPTER)
    assert len(modules) == 7 * 2  # q, k, v, o, gate, up, down in 2 layers
    logits = np.asarray(model(expected["token_ids"]))
    np.testing.assert_allclose(
        logits, expected["logits"], atol=1e-4, rtol=0
    )  # measured: 6.2e-6 (the adapter moves them by 6.2)
    lines = []
    export(ExportSettings(model=str(BASE), output=str(tmp_path / "merged"), lora=str(ADAPTER)), report=lines.append)
    assert "PEFT adapter " + str(ADAPTER) + ": 14 modules, merged on export" in lines
    exported = {v.path: np.asarray(v.value) for v in GPTCausalLM.from_preset(tmp_path / "merged").weights}
    for variable in model.weights:  # the merged kernels (and the rest) as written; no second forward pass
        np.testing.assert_array_equal(exported[variable.path], np.asarray(variable.value), err_msg=variable.path)


def test_a_zoo_adapter_holds_peft_factors_and_loads_back(expected, tmp_path):
    model = GPTCausalLM.from_preset(BASE)
    layers = enable_lora(model, RANK, alpha=ALPHA)
    rng = np.random.default_rng(0)
    for layer in layers:
        for factor in (layer.lora_kernel_a, layer.lora_kernel_b):
            factor.assign(rng.normal(0, 0.2, factor.shape).astype("float32"))
    token_ids = expected["token_ids"]
    adapted = np.asarray(model(token_ids))
    folder = save_peft_adapter(model, tmp_path / "adapter", base_model_name_or_path=str(BASE))

    config, factors = read_peft_adapter(folder)
    heads, kv_heads = model.backbone.num_query_heads, model.backbone.num_key_value_heads
    assert (config["r"], config["lora_alpha"]) == (RANK, ALPHA)
    assert config["rank_pattern"] == {"q_proj": heads * RANK, "k_proj": kv_heads * RANK, "v_proj": kv_heads * RANK}
    assert config["alpha_pattern"] == {"q_proj": heads * ALPHA, "k_proj": kv_heads * ALPHA, "v_proj": kv_heads * ALPHA}
    assert set(config["target_modules"]) == {
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
        "lm_head",
    }
    views = {path: view for path, view in weight_views(model.backbone.get_config()).items()}
    for layer in layers:  # B @ A is the zoo's a @ b, in the file's (out, in) layout
        view = views[kernel_path(layer)]
        a, b = np.asarray(layer.lora_kernel_a), np.asarray(layer.lora_kernel_b)
        factor_a, factor_b = factors[view.name.removesuffix(".weight")]
        np.testing.assert_allclose(
            factor_b @ factor_a, view.to_file(np.tensordot(a, b, axes=1)), atol=1e-6, err_msg=view.name
        )
        for mine, written in zip(peft_factors(a, b, view), (factor_a, factor_b)):
            np.testing.assert_array_equal(mine, written)

    base = GPTCausalLM.from_preset(BASE)
    load_peft_adapter(base, folder)
    np.testing.assert_allclose(np.asarray(base(token_ids)), adapted, atol=2e-5, rtol=0)
    check_dir = os.environ.get("ZOO_PEFT_CHECK_DIR")
    if check_dir:  # for make_peft_fixture.py --check (PEFT on transformers)
        shutil.copytree(BASE, pathlib.Path(check_dir) / "base", dirs_exist_ok=True)
        shutil.copytree(folder, pathlib.Path(check_dir) / "adapter", dirs_exist_ok=True)
        np.savez(pathlib.Path(check_dir) / "expected.npz", token_ids=token_ids, logits=adapted)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"use_dora": True}, "use_dora = True; the zoo reads PEFT LoRA adapters with use_dora = False"),
        ({"peft_type": "IA3"}, "peft_type = 'IA3'; the zoo reads PEFT LoRA adapters with peft_type = 'LORA'"),
        ({"modules_to_save": ["lm_head"]}, r"modules_to_save = \['lm_head'\]; the zoo reads"),
        ({"r": 3}, "adapter module 'model.layers.0.mlp.down_proj' has rank 2; adapter_config.json gives it r = 3"),
    ],
)
def test_what_the_zoo_does_not_read_is_refused(tmp_path, change, message):
    folder = tmp_path / "adapter"
    shutil.copytree(ADAPTER, folder)
    config = json.loads((folder / "adapter_config.json").read_text())
    (folder / "adapter_config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(ValueError, match=message):
        load_peft_adapter(GPTCausalLM.from_preset(BASE, load_weights=False), folder)


def test_missing_files_and_foreign_modules_are_named(tmp_path):
    with pytest.raises(ValueError, match="holds no PEFT adapter"):
        read_peft_adapter(tmp_path)
    shutil.copytree(ADAPTER, tmp_path / "adapter")
    (tmp_path / "adapter" / "adapter_model.safetensors").unlink()
    with pytest.raises(ValueError, match="has no adapter_model.safetensors"):
        read_peft_adapter(tmp_path / "adapter")
    other = GPTCausalLM.from_preset(
        HF / "llama_mha_tied", load_weights=False
    )  # 4 heads of 8: o_proj (32, 32), not (32, 64)
    with pytest.raises(
        ValueError,
        match=r"adapter module 'model.layers.0.self_attn.o_proj' has lora_A \(2, 64\), lora_B \(32, 2\); "
        r"the model's model.layers.0.self_attn.o_proj is \(32, 32\) "
        r"\(its block_0/attention/output/kernel \(4, 8, 32\)\)",
    ):
        load_peft_adapter(other, ADAPTER)
