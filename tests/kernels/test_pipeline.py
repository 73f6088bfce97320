"""``zoo.kernels.pipeline`` against running the blocks one after another on one device.

The stage function is a residual tanh layer per block plus the group index and a
per-micro-batch term from ``extras`` (so a wrong group index, micro-batch or block order
changes the numbers). Checked: outputs, gradients with respect to the stacked weights
and the inputs, and the useful ticks each stage counts in its own loop, whose fraction
of the R*M + S - 1 ticks is R*M / (R*M + S - 1).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from zoo.kernels.pipeline import check_schedule, num_ticks, pipeline

AXIS = "stage"
WIDTH, ROWS, BLOCKS_PER_GROUP = 8, 2, 1


def block(weight, h):
    return h + jnp.tanh(h @ weight)  # [b, C]


def stage_fn(group_params, x, extras, group):
    """Lg blocks of one group on one micro-batch, then the group's and the micro-batch's marks."""
    h, _ = jax.lax.scan(lambda h, weight: (block(weight, h), None), x, group_params)
    return h + 0.01 * group + extras  # [b, C]


def reference(weights, x, offsets):
    """Every micro-batch through the L blocks in order: weights [L, C, C], x [M, b, C]."""
    h = x  # [M, b, C]
    for index in range(weights.shape[0]):
        h = block(weights[index], h)
        if index % BLOCKS_PER_GROUP == BLOCKS_PER_GROUP - 1:  # a group ends: its marks
            h = h + 0.01 * (index // BLOCKS_PER_GROUP) + offsets
    return h


def pipelined(weights, x, offsets, *, stages, repeats):
    mesh = Mesh(np.array(jax.devices()[:stages]), (AXIS,))
    stacked = weights.reshape(repeats, -1, WIDTH, WIDTH)  # [R, L/R, C, C]: block l at [l // (L/R), l % (L/R)]

    def body(stacked, x, offsets):
        y, useful = pipeline(stage_fn, stacked, x, offsets, axis_name=AXIS, repeats=repeats)
        return y, useful[None]

    return jax.shard_map(body, mesh=mesh, in_specs=(P(None, AXIS), P(), P()), out_specs=(P(), P(AXIS)))(
        stacked, x, offsets
    )


@pytest.mark.parametrize(
    "stages, micro_batches, repeats",
    [(4, 3, 1), (2, 3, 2)],  # GPipe with M < S; circular with M not a multiple of S (S = 4: tests/layers)
)
def test_outputs_gradients_and_useful_ticks_match(stages, micro_batches, repeats):
    blocks = stages * repeats * BLOCKS_PER_GROUP
    keys = jax.random.split(jax.random.key(stages * 100 + micro_batches * 10 + repeats), 4)
    weights = jax.random.normal(keys[0], (blocks, WIDTH, WIDTH)) / np.sqrt(WIDTH)
    x = jax.random.normal(keys[1], (micro_batches, ROWS, WIDTH))
    offsets = jax.random.normal(keys[2], (micro_batches, 1, 1))
    cotangent = jax.random.normal(keys[3], x.shape)

    def loss(run):
        return lambda weights, x: jnp.sum(run(weights, x) * cotangent)

    expected = jax.jit(jax.value_and_grad(loss(lambda w, x: reference(w, x, offsets)), argnums=(0, 1)))(weights, x)
    run = lambda w, x: pipelined(w, x, offsets, stages=stages, repeats=repeats)  # noqa: E731
    got = jax.jit(jax.value_and_grad(loss(lambda w, x: run(w, x)[0]), argnums=(0, 1)))(weights, x)
    np.testing.assert_allclose(got[0], expected[0], rtol=1e-5)
    for name, a, b in zip(("weights", "inputs"), got[1], expected[1]):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5, err_msg=f"gradient of the {name}")

    useful = np.asarray(jax.jit(run)(weights, x)[1])  # i32[S]: ticks each stage worked, counted in the loop
    ticks = num_ticks(num_stages=stages, micro_batches=micro_batches, repeats=repeats)
    assert ticks == repeats * micro_batches + stages - 1
    assert useful.tolist() == [repeats * micro_batches] * stages
    assert useful.sum() / (stages * ticks) == pytest.approx(
        repeats * micro_batches / (repeats * micro_batches + stages - 1)
    )


def test_one_stage_is_the_sequential_loop():
    """axis_name None: the loop on one device (the layer's single-device path), no bubble."""
    weights = jax.random.normal(jax.random.key(0), (2, WIDTH, WIDTH)) / np.sqrt(WIDTH)
    x, offsets = jax.random.normal(jax.random.key(1), (3, ROWS, WIDTH)), jnp.zeros((3, 1, 1))
    y, useful = jax.jit(lambda w, x: pipeline(stage_fn, w, x, offsets, repeats=2))(
        weights.reshape(2, 1, WIDTH, WIDTH), x
    )
    np.testing.assert_allclose(y, reference(weights, x, offsets), rtol=1e-6, atol=1e-6)
    assert int(useful) == num_ticks(num_stages=1, micro_batches=3, repeats=2) == 6


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(num_stages=4, micro_batches=3, repeats=2), r"micro_batches=3 < 4 stages"),
        (dict(num_stages=4, micro_batches=0, repeats=1), r"micro_batches must be a positive integer, got 0"),
        (dict(num_stages=2, micro_batches=2, repeats=1.5), r"repeats must be a positive integer, got 1.5"),
    ],
)
def test_schedules_that_cannot_run_are_refused_naming_the_numbers(settings, message):
    with pytest.raises(ValueError, match=message):
        check_schedule(**settings)
