"""MFU: the FLOP formula against a hand-computed example, the peak table and device detection."""

import jax.numpy as jnp
import pytest

from zoo.measure import mfu

# A small GQA decoder, the example worked by hand below.
EXAMPLE = {
    "num_layers": 2,  # L
    "hidden_dim": 64,  # C
    "num_query_heads": 4,  # H
    "num_key_value_heads": 2,  # K
    "head_dim": 16,  # D
    "intermediate_dim": 128,  # F (swiglu: 3 matrices)
    "vocabulary_size": 256,  # V
}
T = 128


def test_matmul_params_by_hand():
    # per layer: attention C*D*(2H + 2K) = 64*16*(8 + 4) = 12,288
    #            MLP 3*C*F = 3*64*128 = 24,576            -> 36,864 per layer
    # 2 layers = 73,728; LM head C*V = 64*256 = 16,384     -> 90,112
    assert mfu.transformer_matmul_params(**EXAMPLE) == 90_112


def test_training_flops_per_token_by_hand():
    # 6 * N_matmul = 6 * 90,112 = 540,672
    # causal attention: 12 * L * T * H * D / 2 = 12 * 2 * 128 * 4 * 16 / 2 = 98,304
    # total 638,976 FLOPs per token
    assert mfu.transformer_flops_per_token(**EXAMPLE, sequence_length=T) == 638_976
    # non-causal attention is twice as much: 540,672 + 196,608
    assert mfu.transformer_flops_per_token(**EXAMPLE, sequence_length=T, causal=False) == 737_280
    # forward only: 2 * 90,112 + 4 * 2 * 128 * 4 * 16 / 2 = 180,224 + 32,768
    assert mfu.transformer_flops_per_token(**EXAMPLE, sequence_length=T, training=False) == 212_992


def test_lora_flops_per_token_by_hand():
    # frozen weights forward and back to their inputs: 4 * N_matmul = 360,448; attention
    # forward and backward as in training: 98,304 -> 458,752 (the "4 x parameters" convention)
    config = {**EXAMPLE, "mlp": "swiglu"}
    assert mfu.gpt_lora_flops_per_token(config, T) == 458_752
    assert mfu.gpt_flops_per_token(config, T) - mfu.gpt_lora_flops_per_token(config, T) == 2 * 90_112


def test_gpt_config_matches_the_explicit_arguments():
    config = {**EXAMPLE, "mlp": "swiglu", "head_dim": None}  # head_dim None: C / H = 16
    assert mfu.gpt_flops_per_token(config, T) == 638_976
    plain = {**config, "mlp": "gelu"}  # 2 MLP matrices: 2 layers * 64*128 fewer weights, times 6
    assert mfu.gpt_flops_per_token(plain, T) == 638_976 - 6 * 2 * 64 * 128
    nested = {
        "name": "gpt_causal_lm",
        "backbone": {"class_name": "GPTBackbone", "config": config},
    }  # GPTCausalLM.get_config()
    assert mfu.gpt_flops_per_token(nested, T) == 638_976
    old = {**EXAMPLE, "num_heads": 4, "num_kv_heads": 2, "mlp": "swiglu"}  # keys saved before issue 16
    del old["num_query_heads"], old["num_key_value_heads"]
    assert mfu.gpt_flops_per_token(old, T) == 638_976


def test_mfu_by_hand():
    # a step of 32 sequences of 128 tokens: 4,096 tokens * 638,976 = 2,617,245,696 FLOPs
    flops_per_step = 32 * T * 638_976
    assert flops_per_step == 2_617_245_696
    # in 10 ms on 8 devices of 1 TFLOP/s peak: 2.617e9 / 0.01 / 8e12 = 0.0327155712
    assert mfu.mfu(flops_per_step, 0.01, 8, 1e12) == pytest.approx(0.0327155712, rel=1e-12)


@pytest.mark.parametrize("argument", ["flops_per_step", "step_time_s", "num_devices", "peak_flops_per_device"])
def test_mfu_rejects_non_positive_inputs(argument):
    values = {"flops_per_step": 1.0, "step_time_s": 1.0, "num_devices": 1, "peak_flops_per_device": 1.0, argument: 0}
    with pytest.raises(ValueError, match=f"{argument} must be positive, got 0"):
        mfu.mfu(**values)


def test_flops_formula_rejects_bad_sizes():
    with pytest.raises(ValueError, match="sequence_length must be a positive integer, got 0"):
        mfu.transformer_flops_per_token(**EXAMPLE, sequence_length=0)


@pytest.mark.parametrize(
    "device_kind, name",
    [
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H100 NVL", "H100 NVL"),
        ("NVIDIA H200", "H200 SXM"),
        ("NVIDIA GH200 480GB", "GH200"),
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("NVIDIA A100 80GB PCIe", "A100"),
        ("NVIDIA B200", "B200"),
        ("NVIDIA L4", "L4"),
        ("TPU v4", "TPU v4"),
        ("TPU v5 lite", "TPU v5e"),
        ("TPU v5e", "TPU v5e"),
        ("TPU v5", "TPU v5p"),
        ("TPU v5p", "TPU v5p"),
        ("TPU v6 lite", "TPU v6e"),
    ],
)
def test_device_kinds_map_to_their_peak(device_kind, name):
    assert mfu.peak_flops_for(device_kind) == (name, mfu.PEAK_FLOPS[name])


def test_peak_table_values():
    assert mfu.PEAK_FLOPS["H100 SXM"] == 989e12 and mfu.PEAK_FLOPS["TPU v5p"] == 459e12
    assert mfu.PEAK_FLOPS["A100"] == 312e12 and mfu.PEAK_FLOPS["TPU v6e"] == 918e12


def test_unknown_device_kind_says_what_to_pass():
    with pytest.raises(mfu.UnknownDeviceError, match="unknown device kind 'cpu'; pass --peak-tflops"):
        mfu.resolve_peak_flops()  # the test devices are CPUs


def test_explicit_peak_wins_over_detection():
    assert mfu.resolve_peak_flops(peak_tflops=2.5) == 2.5e12
    with pytest.raises(ValueError, match="peak TFLOP/s must be positive, got -1"):
        mfu.resolve_peak_flops(peak_tflops=-1)


def test_compiled_flops_of_a_matmul():
    # (8 x 16) @ (16 x 32): 8 * 32 outputs, 16 multiply-adds each = 2 * 8 * 16 * 32 FLOPs
    assert mfu.compiled_flops(jnp.matmul, jnp.ones((8, 16)), jnp.ones((16, 32))) == 2 * 8 * 16 * 32


def test_a_mixture_of_experts_counts_the_weights_a_token_meets():
    """Mixtral-8x7B: 46.7B parameters, 12.9B active (its model card); the FLOPs per token
    are the dense formula's with k = 2 of the 8 experts' MLP weights, plus the router."""
    from zoo.models.gpt.gpt_configs import config_by_name, count_parameters

    mixtral = config_by_name("mixtral_8x7b")
    c, layers, f, e = (
        mixtral["hidden_dim"],
        mixtral["num_layers"],
        mixtral["moe_intermediate_dim"],
        mixtral["num_experts"],
    )
    inactive = layers * (e - 2) * 3 * c * f
    assert (
        round(count_parameters(mixtral) / 1e9, 1) == 46.7
        and round((count_parameters(mixtral) - inactive) / 1e9, 1) == 12.9
    )
    dense_twin = {
        **mixtral,
        "num_experts": 0,
        "intermediate_dim": 2 * f,
    }  # the same matmuls as k = 2 experts, no router
    assert mfu.gpt_flops_per_token(mixtral, 4096) - mfu.gpt_flops_per_token(dense_twin, 4096) == 6 * layers * c * e
