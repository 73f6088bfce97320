"""Under a split sequence (a ``ContextParallel`` distribution: the long-context layouts), a
training call of ``TransformerBlock`` passes its weights through one
``optimization_barrier`` with the block's input, so no all-gather or cast of a weight can
be scheduled before the block is reached (issue 29: XLA:CPU ran every block's weight
all-gathers at the start of the LoRA long-context step and held them through the forward
pass). The barrier changes no number: output and gradients equal the untied
``forward_with_aux`` on the same weights, with and without remat, in float32 and under
``mixed_bfloat16``. Without a split sequence there is no barrier (XLA may gather the next
block's weights during this one: FSDP's prefetch).
"""

import jax
import jax.numpy as jnp
import keras
import numpy as np
import pytest

from zoo.distribution import ContextParallel
from zoo.layers import TransformerBlock

B, T, C = 2, 8, 16


@pytest.fixture
def context():
    """The sequence split over seq=4 (ring attention), the batch over data=2."""
    keras.distribution.set_distribution(ContextParallel("data=2,seq=4", context_attention="ring"))
    yield
    keras.distribution.set_distribution(None)


def _block(remat, precision):
    block = TransformerBlock(
        num_heads=4, head_dim=4, hidden_dim=32, num_kv_heads=2, causal=True, rotary=True,
        mlp="swiglu", norm="rms", qk_norm=True, remat=remat, dtype=precision, name="block",
    )  # fmt: skip
    block.build((B, T, C))
    return block


def _losses(block):
    """``(tied, untied)``: ``(weights, x) -> sum(y^2)`` through the training call, and
    through ``forward_with_aux`` on the same weights (no barrier, no remat)."""
    variables = block.trainable_variables

    def tied(weights, x):
        with keras.StatelessScope(state_mapping=list(zip(variables, weights))):
            return jnp.sum(jnp.square(block(x, training=True).astype(jnp.float32)))

    def untied(weights, x):
        with keras.StatelessScope(state_mapping=list(zip(variables, weights))):
            y, _ = block.forward_with_aux(x.astype(block.compute_dtype), None, None)
            return jnp.sum(jnp.square(y.astype(jnp.float32)))

    return tied, untied


@pytest.mark.parametrize("precision", ["float32", "mixed_bfloat16"])
@pytest.mark.parametrize("remat", ["none", "full"])
def test_training_call_equals_the_untied_forward(remat, precision, context):
    block = _block(remat, precision)
    weights = [v.value for v in block.trainable_variables]
    x = jax.random.normal(jax.random.key(0), (B, T, C))
    tied, untied = _losses(block)
    (loss, (grads, dx)), (expected, (expected_grads, expected_dx)) = (
        jax.jit(jax.value_and_grad(f, argnums=(0, 1)))(weights, x) for f in (tied, untied)
    )
    # float32: the same numbers to float rounding (XLA fuses the two programs apart);
    # mixed_bfloat16: the loss and every weight's gradient bitwise, d(input) to within one
    # bf16 ulp of its largest value (measured: 0.26-0.32 of one: the barrier keeps each
    # weight's bf16 copy whole, where XLA:CPU otherwise fuses the cast into the matmuls
    # of the backward pass)
    if precision == "float32":
        same, same_dx = dict(rtol=1e-6, atol=1e-6), dict(rtol=1e-6, atol=1e-6)
    else:
        same, same_dx = dict(rtol=0, atol=0), dict(rtol=0, atol=2.0**-7 * float(jnp.abs(expected_dx).max()))
    np.testing.assert_allclose(loss, expected, **same)
    for got, want in zip(grads, expected_grads):
        np.testing.assert_allclose(got, want, **same)
    np.testing.assert_allclose(dx, expected_dx, **same_dx)
    assert float(jnp.abs(dx).sum()) > 0 and all(float(jnp.abs(g).sum()) > 0 for g in grads)  # not vacuous


def _barriers(jaxpr):
    """Every optimization_barrier equation in ``jaxpr`` and the jaxprs nested in it."""
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "optimization_barrier":
            yield eqn
        for param in eqn.params.values():
            for sub in param if isinstance(param, (list, tuple)) else [param]:
                inner = getattr(sub, "jaxpr", sub)  # a ClosedJaxpr's jaxpr, or a Jaxpr
                if hasattr(inner, "eqns"):
                    yield from _barriers(inner)


@pytest.mark.parametrize("remat", ["none", "full"])
def test_every_weight_waits_for_the_block_input(remat, context):
    block = _block(remat, "float32")
    weights = [v.value for v in block.trainable_variables]
    tied, _ = _losses(block)
    jaxpr = jax.make_jaxpr(tied)(weights, jnp.ones((B, T, C)))
    # one barrier over x and the block's 12 weights (q, k, v, output, two qk-norms, two norms, gate, up, down)
    widths = [len(eqn.invars) for eqn in _barriers(jaxpr.jaxpr)]
    assert 1 + len(block.weights) in widths, (widths, len(block.weights))


def test_without_a_split_sequence_the_weights_do_not_wait():
    """No distribution (or one that keeps the sequence whole): no barrier in the training call."""
    block = _block("none", "float32")
    tied, _ = _losses(block)
    jaxpr = jax.make_jaxpr(tied)([v.value for v in block.trainable_variables], jnp.ones((B, T, C)))
    assert not list(_barriers(jaxpr.jaxpr))
