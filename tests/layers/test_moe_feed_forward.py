"""MoEFeedForward through the layer harness (config, symbolic and eager calls, weights,
one fit step, .keras round trip), its auxiliary losses in training only, and its bad
settings named. Its parity under the expert layouts: tests/models/test_gpt_moe.py; its
kernel: tests/kernels/test_moe.py."""

import keras
import numpy as np
import pytest

from tests.layers.harness import check_layer_contract
from zoo.kernels import moe
from zoo.layers.moe_feed_forward import MoEFeedForward

B, T, C = 2, 8, 8
SETTINGS = dict(
    num_experts=4,
    num_experts_per_token=2,
    intermediate_dim=12,
    shared_expert_dim=6,
    router_aux_loss_coefficient=0.1,
    router_z_loss_coefficient=0.01,
)


def test_layer_contract(tmp_path):
    check_layer_contract(
        MoEFeedForward,
        init_kwargs=SETTINGS,
        input_shape=(B, T, C),
        expected_output_shape=(B, T, C),
        expected_num_trainable_weights=8,  # router, 3 expert weights, shared gate/up/down, shared gate
        expected_num_non_trainable_weights=1,  # router_statistics
        expected_weight_shapes={
            "router/kernel": (C, 4),
            "expert_gate": (4, C, 12),
            "expert_up": (4, C, 12),
            "expert_down": (4, 12, C),
            "shared_expert/gate/kernel": (C, 6),
            "shared_expert/up/kernel": (C, 6),
            "shared_expert/down/kernel": (6, C),
            "shared_expert_gate/kernel": (C, 1),
            "router_statistics": (2,),
        },
        save_dir=tmp_path,
    )


def test_outputs_losses_and_statistics_equal_the_dense_reference():
    """The routed experts plus the sigmoid-gated shared expert; in training the two
    weighted losses are added and the statistics recorded, at inference neither."""
    layer = MoEFeedForward(**SETTINGS)
    x = np.random.default_rng(0).standard_normal((B, T, C)).astype("float32")
    y = np.asarray(layer(x))
    assert not layer.losses
    tokens = x.reshape(-1, C)
    weights_of = {name: np.asarray(getattr(layer, name)) for name in ("expert_gate", "expert_up", "expert_down")}
    routed = moe.moe_reference(
        tokens, router_kernel=np.asarray(layer.router.kernel), **weights_of, num_experts_per_token=2, normalize=True
    )
    gate = keras.ops.sigmoid(layer.shared_expert_gate(x))
    np.testing.assert_allclose(
        y, np.asarray(routed).reshape(x.shape) + np.asarray(gate * layer.shared_expert(x)), rtol=1e-5, atol=1e-6
    )

    layer(x, training=True)
    logits = tokens @ np.asarray(layer.router.kernel)
    weights, ids, probabilities = moe.route(logits, num_experts_per_token=2, normalize=True)
    want = 0.1 * moe.load_balance_loss(probabilities, ids, num_experts=4) + 0.01 * moe.router_z_loss(logits)
    assert float(sum(layer.losses)) == pytest.approx(float(want), rel=1e-5)
    counts = np.bincount(np.asarray(ids).ravel(), minlength=4)
    assert float(layer.statistics()["max_load"]) == pytest.approx(counts.max() / counts.mean(), rel=1e-6)
    assert float(layer.statistics()["dropped_fraction"]) == 0.0


@pytest.mark.parametrize(
    "change, named",
    [
        (dict(num_experts_per_token=5), "num_experts_per_token 5 exceeds num_experts 4"),
        (dict(capacity_factor=0), "capacity_factor must be a positive number or None"),
        (dict(num_experts=0), "num_experts must be a positive integer, got 0"),
        (dict(router_aux_loss_coefficient=-1.0), "router_aux_loss_coefficient must be a non-negative number"),
        (dict(grouped_matmul="dense"), "grouped_matmul must be None or one of"),
        (dict(expert_exchange="fast"), "expert_exchange must be one of"),
        (dict(expert_exchange="ragged", capacity_factor=1.0), "expert_exchange 'ragged' sends exactly the routed rows"),
    ],
)
def test_bad_settings_are_named(change, named):
    with pytest.raises(ValueError, match=named):
        MoEFeedForward(**(SETTINGS | change))
