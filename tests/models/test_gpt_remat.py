"""Rematerialisation (``remat``) changes what the backward pass keeps, never the numbers.

Fit parity: a GPT with each ``remat`` policy trains 3 steps with dropout
on to the numbers of the one single-device run *without* remat (the shared ``reference``),
under every layout layout; the set-up (model, data, optimizer, meshes) is
``test_gpt_parity``'s, whose own cases check the layouts without remat.

Memory: what ``jax.checkpoint`` decides is checked on every JAX: the residuals the
forward pass hands to the backward pass (the leaves of ``jax.vjp``'s function, shapes
only, nothing runs). The compiled temporaries are checked where XLA:CPU's
``memory_analysis`` reflects remat (JAX 0.12; JAX 0.10's XLA:CPU schedules the
recomputation with the forward pass, so its temporaries hardly change).
"""

import jax
import jax.numpy as jnp
import keras
import pytest

from tests._remat import remat_shows_in_memory_analysis
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
from zoo.distribution import parity
from zoo.layers import TransformerBlock


@pytest.fixture(scope="module")
def reference():
    """The single-device run without remat, shared by every case below."""
    config = model_config("data", num_layers=TRAIN_LAYERS)
    return parity.reference_run(lambda: build_lm(config), compile_sgd, *language_data(), steps=STEPS, batch_size=BATCH)


@pytest.mark.parametrize(
    "layout, mesh, remat",
    [
        ("single", None, "full"),  # data parallelism adds nothing to remat that fsdp's GSPMD case below does not
        ("fsdp", "data=8", "dots_saveable"),
        ("tp", "data=2,model=4", "full"),
        ("tp+sp", "data=2,model=4", "dots_saveable"),  # fsdp+tp: its two parts are each here (suite budget)
        ("context-ring", "data=2,seq=4", "full"),  # shard_map and the ring's custom VJP under jax.checkpoint
        ("single", None, "save_attention"),  # the kernel's named residuals kept, the rest recomputed
        ("tp", "data=2,model=4", "offload_attention"),  # named inside the shard_map, kept in host memory
    ],
)
def test_fit_with_remat_matches_one_device_without(layout, mesh, remat, reference):
    config = model_config("data" if layout == "single" else layout, num_layers=TRAIN_LAYERS, remat=remat)
    distribution = None if layout == "single" else layout_distribution(layout, mesh, config)
    # One device: the same maths, recomputed, to float rounding (10-100x tighter than across
    # devices). Not bitwise: XLA fuses the recomputed forward pass differently, and JAX
    # 0.10's elemental fusion emitters (the suite's, tests/conftest.py) then round apart
    # by ~1 ulp (gradients 7e-9, outputs 4e-7 relative); its MLIR emitters happen not to.
    tolerances = dict(rtol=1e-6, atol=1e-6) if layout == "single" else {}
    report = parity.check_parity(
        lambda: build_lm(config),
        compile_sgd,
        distribution,
        *language_data(),
        steps=STEPS,
        reference=reference,
        **tolerances,
    )
    assert report.passed, "\n".join(report.format())
    assert report.reference_losses[2] < report.reference_losses[0]  # not vacuous: it trained


# --- what the backward pass keeps ---------------------------------------------------------


def _blocks(remat, batch, length, channels, layers):
    """``layers`` causal blocks with dropout (H = 4, K = 2, F = 2C): (B, T, C) -> (B, T, C)."""
    inputs = keras.Input((length, channels), batch_size=batch)
    x = inputs
    for index in range(layers):
        block = TransformerBlock(
            num_heads=4,
            head_dim=channels // 4,
            hidden_dim=2 * channels,
            num_kv_heads=2,
            causal=True,
            rotary=True,
            mlp="swiglu",
            norm="rms",
            dropout=0.1,
            seed=2 * index,
            remat=remat,
            name=f"block_{index}",
        )
        x = block(x)  # (B, T, C)
    return keras.Model(inputs, x)


def _training_forward(model):
    """``(weights, x) -> y``: the model in training mode, dropout seeds held fixed."""
    frozen = [v.value for v in model.non_trainable_variables]  # the dropout seed generators
    return lambda weights, x: model.stateless_call(weights, frozen, x, training=True)[0]


B, T, C, LAYERS = 2, 16, 32, 2


def _residual_bytes(remat):
    """Bytes the forward pass hands to the backward pass beyond the weights (shapes only)."""
    model = _blocks(remat, B, T, C, LAYERS)
    weights = [v.value for v in model.trainable_variables]
    x = jax.ShapeDtypeStruct((B, T, C), jnp.float32)
    backward = jax.eval_shape(lambda w, x: jax.vjp(_training_forward(model), w, x)[1], weights, x)
    saved = sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree_util.tree_leaves(backward))
    return saved - sum(w.size * w.dtype.itemsize for w in weights)


def test_remat_saves_fewer_residuals():
    saved = {remat: _residual_bytes(remat) for remat in ("none", "dots_saveable", "save_attention", "full")}
    # "full": each block's input f32[B, T, C] and its two dropout seeds u32[2], nothing else
    assert saved["full"] == LAYERS * (B * T * C * 4 + 2 * 2 * 4), saved
    # "save_attention" also q f32[B, T, H, D], k and v f32[B, T, K, D], the kernel's output
    # f32[B, T, H, D] and log-sum-exp f32[B, K, G, T] (H = 4, K = 2, D = C / 4)
    heads, kv_heads, head_dim = 4, 2, C // 4
    attention = B * T * (2 * heads + 2 * kv_heads) * head_dim * 4 + B * heads * T * 4
    assert saved["save_attention"] == saved["full"] + LAYERS * attention, saved
    assert saved["full"] < saved["save_attention"] < saved["dots_saveable"], saved
    # "dots_saveable" also keeps the matmul outputs; "none" keeps every intermediate
    assert saved["full"] < saved["dots_saveable"] < saved["none"], saved
    assert saved["none"] > 8 * saved["full"], saved


def test_offload_attention_moves_the_named_tensors_to_host_memory_and_back():
    """The backward pass gets the tensors save_attention keeps from host memory: one
    device_put to the host and one back per tensor (q, k, v, the output, the log-sum-exp)
    and block; save_attention moves none."""
    moves = {}
    for remat in ("save_attention", "offload_attention"):
        model = _blocks(remat, B, T, C, LAYERS)
        weights = [v.value for v in model.trainable_variables]
        loss = lambda w, x: jnp.sum(_training_forward(model)(w, x) ** 2)  # noqa: B023, E731
        text = str(jax.make_jaxpr(jax.grad(loss))(weights, jnp.ones((B, T, C))))
        moves[remat] = (text.count("device_put"), "Space.Host" in text)
    assert moves == {"save_attention": (0, False), "offload_attention": (2 * 5 * LAYERS, True)}, moves


def test_remat_lowers_compiled_temporaries():
    """Where XLA:CPU's memory analysis shows what jax.checkpoint saves (JAX 0.12; 0.10
    schedules the recomputation with the forward pass): 3 blocks, B=2, T=64, C=64."""
    if not remat_shows_in_memory_analysis():  # asked with XLA's own flags: tests/_remat.py
        pytest.skip("this JAX's XLA:CPU memory analysis does not reflect jax.checkpoint (JAX 0.10)")
    temp = {}
    for remat in ("none", "dots_saveable", "save_attention", "full"):
        model = _blocks(remat, 2, 64, 64, 3)
        forward = _training_forward(model)
        step = jax.jit(jax.grad(lambda w, x: jnp.sum(forward(w, x) ** 2)))  # noqa: B023 (compiled in this iteration)
        weights = [v.value for v in model.trainable_variables]
        compiled = step.lower(weights, jax.ShapeDtypeStruct((2, 64, 64), jnp.float32)).compile()
        temp[remat] = compiled.memory_analysis().temp_size_in_bytes
    # measured on JAX 0.12: none 2.68 MiB, dots_saveable 1.28 MiB, save_attention 1.02 MiB, full 1.03 MiB
    assert temp["full"] < 0.5 * temp["none"] and temp["full"] < temp["dots_saveable"] < temp["none"], temp
    assert temp["save_attention"] < temp["dots_saveable"], temp


# --- the argument -------------------------------------------------------------------------


def test_remat_argument_round_trips_and_bad_values_are_named():
    block = TransformerBlock(num_heads=2, head_dim=4, hidden_dim=8, remat="dots_saveable")
    assert block.get_config()["remat"] == "dots_saveable"
    assert TransformerBlock.from_config(block.get_config()).remat == "dots_saveable"
    assert TransformerBlock(num_heads=2, head_dim=4, hidden_dim=8, remat=None).remat == "none"
    with pytest.raises(
        ValueError,
        match=r"remat must be one of \['none', 'full', 'dots_saveable', 'save_attention', 'offload_attention'\].*got 'save_dots'",
    ):
        TransformerBlock(num_heads=2, head_dim=4, hidden_dim=8, remat="save_dots")
