"""zoo.kernels.moe against the dense computation (every expert on every token, weighted
by the router): outputs and gradients, on one device and expert-parallel over 2 and 4
shards, for k = 1 and 2, a random and an unbalanced routing (every token to expert 0);
the capacity path's drops against a count made by hand; the router's losses."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from zoo.kernels import grouped_matmul, moe

E, C, F, N = 4, 8, 12, 16  # experts, width, expert width, tokens (split over the shards)
AXIS = "expert"


@functools.cache
def experts():
    keys = jax.random.split(jax.random.key(0), 3)
    gate, up = (jax.random.normal(key, (E, C, F)) * 0.4 for key in keys[:2])
    return {"expert_gate": gate, "expert_up": up, "expert_down": jax.random.normal(keys[2], (E, F, C)) * 0.4}


def routing(k, unbalanced):
    """(x [N, C], weights f32[N, k], expert_ids i32[N, k]) from a seeded router; unbalanced:
    every token's first choice is expert 0."""
    x = jax.random.normal(jax.random.key(1), (N, C))
    logits = jax.random.normal(jax.random.key(2), (N, E))
    if unbalanced:
        logits = logits.at[:, 0].add(100.0)
    weights, ids, _ = moe.route(logits, num_experts_per_token=k, normalize=True)
    return x, weights, ids


def expert_parallel(n, **options):
    """expert_parallel_moe over n shards as a function of global arrays (tokens and experts split)."""
    mesh = Mesh(np.array(jax.devices()[:n]), (AXIS,))

    def body(x, weights, ids, weights_of_experts):
        y, dropped = moe.expert_parallel_moe(
            x, weights, ids, **weights_of_experts, axis_name=AXIS, axis_size=n, num_experts=E, **options
        )
        return y, dropped[None]

    spec = P(AXIS)
    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(spec, spec, spec, spec), out_specs=(spec, spec)))


def loss_of(run):
    """A scalar of the outputs that weights every entry differently, so gradients check every entry."""
    probe = jnp.arange(N * C, dtype=jnp.float32).reshape(N, C) / (N * C)
    return lambda x, w, params: jnp.sum(run(x, w, params) * probe)


def check_against_dense(run, k, unbalanced):
    x, weights, ids = routing(k, unbalanced)
    dense = lambda x, w, params: moe.dense_moe(x, w, ids, **params)  # noqa: E731
    sparse = lambda x, w, params: run(x, w, ids, params)  # noqa: E731
    np.testing.assert_allclose(sparse(x, weights, experts()), dense(x, weights, experts()), rtol=1e-5, atol=1e-5)
    got = jax.grad(loss_of(sparse), argnums=(0, 1, 2))(x, weights, experts())
    want = jax.grad(loss_of(dense), argnums=(0, 1, 2))(x, weights, experts())
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("implementation", moe.GROUPED_MATMULS)
@pytest.mark.parametrize("unbalanced", [False, True])
def test_sparse_moe_equals_dense(implementation, unbalanced):
    run = lambda x, w, ids, params: moe.sparse_moe(x, w, ids, **params, implementation=implementation)  # noqa: E731
    check_against_dense(jax.jit(run), k=2, unbalanced=unbalanced)


@pytest.mark.parametrize("n, k", [(2, 1), (4, 2)])
@pytest.mark.parametrize("unbalanced", [False, True])
def test_expert_parallel_dropless_equals_dense(n, k, unbalanced):
    check_dropless_expert_parallel(expert_parallel(n), k, unbalanced)


def test_megablox_refuses_the_expert_parallel_shard_map():
    """JAX's grouped-matmul kernel cannot be traced inside a shard_map that checks varying
    axes: the exchange's received rows get one line naming the axes, not JAX's error."""
    x, weights, ids = routing(2, False)
    with pytest.raises(ValueError, match=r"grouped_matmul='megablox' .* vary over \['expert'\]\); use 'ragged_dot'"):
        expert_parallel(2, implementation="megablox")(x, weights, ids, experts())


@pytest.mark.parametrize(
    "platform, in_shard_map, expected",
    [("cpu", False, "blocks"), ("gpu", False, "ragged_dot"), ("tpu", True, "ragged_dot"), ("tpu", False, "ragged_dot")],
)
def test_the_default_grouped_matmul_per_platform(platform, in_shard_map, expected):
    """megablox only where a TPU runs the program (this CPU compiling a TPU's step gets
    ragged_dot: XLA:CPU cannot compile the Mosaic kernel) and no shard_map holds it."""
    assert moe.grouped_matmul_implementation(platform, in_shard_map=in_shard_map) == expected


def test_the_default_grouped_matmul_on_a_tpu_is_megablox(monkeypatch):
    monkeypatch.setattr(grouped_matmul.jax, "default_backend", lambda: "tpu")
    assert moe.grouped_matmul_implementation("tpu") == "megablox"
    assert moe.grouped_matmul_implementation("tpu", in_shard_map=True) == "ragged_dot"


def test_megablox_under_remat_equals_dense():
    """The Pallas grouped matmul inside ``jax.checkpoint`` (remat traces it again)."""
    run = jax.checkpoint(lambda x, w, ids, params: moe.sparse_moe(x, w, ids, **params, implementation="megablox"))
    check_against_dense(jax.jit(run), k=2, unbalanced=False)


def check_dropless_expert_parallel(kernel, k, unbalanced):
    dropped = []

    def run(x, w, ids, params):
        y, count = kernel(x, w, ids, params)
        dropped.append(count)
        return y

    check_against_dense(run, k=k, unbalanced=unbalanced)
    assert all(int(jnp.sum(count)) == 0 for count in dropped)  # dropless drops nothing


def test_capacity_drops_the_count_made_by_hand():
    """2 shards of 8 tokens, k = 1, every token to expert 0 (on shard 0): capacity factor
    1.0 lets each shard send ceil(8 * 1 / 2) = 4 rows to each device, so 4 of each
    shard's 8 assignments are dropped (its tokens 4..7, in sorted order), 8 in all; the
    kept tokens get their expert's output, the dropped ones 0."""
    x, _, _ = routing(1, False)
    ids = jnp.zeros((N, 1), jnp.int32)
    weights = jnp.ones((N, 1), jnp.float32)
    y, dropped = expert_parallel(2, capacity_factor=1.0)(x, weights, ids, experts())
    assert dropped.tolist() == [4, 4]
    assert int(moe.dropped_assignments(ids[:8], num_experts=E, axis_size=2, capacity=4)) == 4
    kept = np.repeat([[True] * 4 + [False] * 4], 2, axis=0).reshape(N)
    want = np.where(kept[:, None], moe.dense_moe(x, weights, ids, **experts()), 0.0)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)


def test_capacity_and_minimum_bytes():
    assert moe.capacity(8, num_experts_per_token=2, axis_size=4, experts_per_device=2, capacity_factor=None) == 16
    assert moe.capacity(8, num_experts_per_token=2, axis_size=4, experts_per_device=2, capacity_factor=1.0) == 4
    assert moe.capacity(8, num_experts_per_token=2, axis_size=4, experts_per_device=2, capacity_factor=1.25) == 5
    assert (
        moe.minimum_exchange_bytes(8, num_experts_per_token=2, width=4, itemsize=4, axis_size=4)
        == 8 * 2 * 4 * 4 * 3 / 4
    )
    with pytest.raises(ValueError, match="num_experts 6 is not divisible by the 'expert' mesh axis of size 4"):
        moe.check_experts(6, axis_size=4)


def test_routing_and_router_losses():
    logits = jnp.array([[2.0, 1.0, 0.0, -1.0], [0.0, 0.0, 3.0, 0.0]])
    weights, ids, probabilities = moe.route(logits, num_experts_per_token=2, normalize=False)
    np.testing.assert_array_equal(ids, [[0, 1], [2, 0]])
    np.testing.assert_allclose(
        weights, np.take_along_axis(np.asarray(jax.nn.softmax(logits)), np.asarray(ids), 1), rtol=1e-6
    )
    normalized, _, _ = moe.route(logits, num_experts_per_token=2, normalize=True)
    np.testing.assert_allclose(normalized.sum(-1), [1.0, 1.0], rtol=1e-6)
    # a uniform router spreading the assignments evenly: the loss is k
    uniform = jnp.full((4, E), 1.0 / E)
    even = jnp.array([[0, 1], [2, 3], [0, 1], [2, 3]])
    assert float(moe.load_balance_loss(uniform, even, num_experts=E)) == pytest.approx(2.0)
    assert float(moe.load_balance_loss(probabilities, ids, num_experts=E)) > 0
    lse = np.log(np.exp(np.asarray(logits)).sum(-1))
    assert float(moe.router_z_loss(logits)) == pytest.approx(float(np.mean(lse**2)), rel=1e-6)


@pytest.mark.parametrize("n, k", [(2, 1), (4, 2)])
@pytest.mark.parametrize("unbalanced", [False, True])
def test_ragged_exchange_equals_dense(n, k, unbalanced):
    """The ragged exchange's offsets and sizes, run through the emulated collective
    (XLA:CPU has no ragged-all-to-all): the dense numbers, outputs and gradients."""
    mesh = Mesh(np.array(jax.devices()[:n]), (AXIS,))

    def body(x, weights, ids, weights_of_experts):
        y, _ = moe.ragged_expert_parallel_moe(
            x,
            weights,
            ids,
            **weights_of_experts,
            axis_name=AXIS,
            axis_size=n,
            num_experts=E,
            ragged_all_to_all=moe.emulated_ragged_all_to_all,
        )
        return y

    spec = P(AXIS)
    kernel = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(spec, spec, spec, spec), out_specs=spec))
    check_against_dense(kernel, k=k, unbalanced=unbalanced)


def _ragged_on_two_devices():
    """The ragged exchange with ``jax.lax.ragged_all_to_all`` itself on 2 devices, and a routing."""
    mesh = Mesh(np.array(jax.devices()[:2]), (AXIS,))

    def body(x, weights, ids, weights_of_experts):
        return moe.ragged_expert_parallel_moe(
            x, weights, ids, **weights_of_experts, axis_name=AXIS, axis_size=2, num_experts=E
        )[0]

    spec = P(AXIS)
    return jax.shard_map(body, mesh=mesh, in_specs=(spec,) * 4, out_specs=spec), routing(2, False)


def test_the_ragged_exchange_lowers_to_the_collective():
    """With jax.lax.ragged_all_to_all itself the program lowers (shapes and types check);
    XLA:CPU cannot compile it, so it runs on GPU/TPU only."""
    step, (x, weights, ids) = _ragged_on_two_devices()
    lowered = jax.jit(step).lower(x, weights, ids, experts())
    assert lowered.as_text().count("ragged_all_to_all") == 2  # dispatch and combine


def test_replicated_tokens_equal_dense():
    """Every device holding every token (decoding), its own experts only, summed over the
    axis: the dense numbers, outputs and gradients."""
    mesh = Mesh(np.array(jax.devices()[:2]), (AXIS,))

    def body(x, weights, ids, weights_of_experts):
        return moe.replicated_expert_parallel_moe(
            x, weights, ids, **weights_of_experts, axis_name=AXIS, axis_size=2, num_experts=E
        )

    kernel = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P(), P(), P(), P(AXIS)), out_specs=P()))
    check_against_dense(kernel, k=2, unbalanced=False)


def test_the_ragged_exchanges_backward_sums_nothing_over_the_axis():
    """``jax.lax.ragged_all_to_all`` types its result like its ``output`` buffer: zeros made
    on each device are typed as equal on every device, and the backward then sums each
    exchange's gradient over the whole axis (an all-reduce that also makes them wrong). The
    buffers vary like the rows sent: the backward is two reverse exchanges, no all-reduce
    (lowered, as XLA:CPU cannot compile the collective)."""
    step, (x, weights, ids) = _ragged_on_two_devices()
    loss = lambda x, weights_of_experts: jnp.sum(step(x, weights, ids, weights_of_experts) ** 2)  # noqa: E731
    text = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(x, experts()).as_text()
    assert text.count("ragged_all_to_all") == 4  # dispatch, combine and their transposes
    assert text.count("all_reduce") == 0
