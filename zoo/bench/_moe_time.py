"""``zoo bench moe``'s time section: the sparse MoE layer against the dense-masked computation.

On one device, a jitted forward + backward (gradients of every weight and of x) of
``MoEFeedForward`` (through each grouped matmul asked for, else its default on this
backend) against the dense-masked computation (``zoo.kernels.moe.dense_moe``: every
expert on every token, weighted by the same router: keras-hub's way) at the same shapes,
weights and dtype policy; their outputs and gradients must agree (``check_agreement``,
else ``TimingMismatch``). Timed in turns (sparse, dense, sparse, dense, ...), ``steps``
calls a turn; the ratio dense / sparse per pair, the median of ``repeats`` pairs.
"""

import dataclasses
import statistics
import time

import jax
import jax.numpy as jnp
import keras
import numpy as np

from zoo import distribution as zd
from zoo.kernels import moe
from zoo.layers.moe_feed_forward import MoEFeedForward

SEED = 0
MISMATCH = {"float32": 2e-3, "mixed_bfloat16": 5e-2}  # the time rows' sparse vs dense agreement, of the largest value


class TimingMismatch(AssertionError):
    """The sparse layer and the dense-masked computation gave different outputs."""


@dataclasses.dataclass
class TimeRow:
    tokens: int
    width: int
    hidden: int
    experts: int
    k: int
    grouped_matmul: str
    ratios: tuple = ()  # dense / sparse per pair of turns
    sparse_s: float = 0.0  # median seconds per forward + backward (this CPU; for the log only)
    dense_s: float = 0.0

    @property
    def ratio(self):
        return statistics.median(self.ratios)

    @property
    def goal(self):
        """E / (2k): the issue's bound on dense / sparse."""
        return self.experts / (2 * self.k)


def time_layer(settings, grouped_matmul=None):
    """The ``MoEFeedForward`` of the time rows (its grouped matmul ``grouped_matmul``, None:
    its default), built on one device under ``settings.time_precision``, and its input
    x (1, N, C) in the compute dtype."""
    keras.backend.clear_session()
    keras.utils.set_random_seed(SEED)
    with zd.global_distribution(None):
        layer = MoEFeedForward(
            settings.time_experts,
            settings.time_experts_per_token,
            settings.time_intermediate_dim,
            grouped_matmul=grouped_matmul,
            dtype=settings.time_precision,
            name="moe",
        )
        layer.build((1, settings.time_tokens, settings.time_width))
    x = jax.random.normal(jax.random.key(SEED), (1, settings.time_tokens, settings.time_width), jnp.float32)
    return layer, x.astype(
        layer.compute_dtype
    )  # as a model's previous layer hands it over (the layer follows x's dtype)


def dense_masked(layer):
    """keras-hub's way at the layer's weights: route as the layer does (float32 router),
    then every expert on every token in the layer's compute dtype, weighted by the router
    (``moe.dense_moe``). (weights, x (1, N, C)) -> (1, N, C) in the compute dtype."""
    names = [
        variable.path.rsplit("/", 2)[-2] if variable.path.endswith("/kernel") else variable.path.rsplit("/", 1)[-1]
        for variable in layer.trainable_variables
    ]
    compute = layer.compute_dtype

    def forward(weights, x):
        named = dict(zip(names, weights))
        tokens = x.reshape(-1, x.shape[-1]).astype(compute)  # [N, C]
        logits = tokens.astype(jnp.float32) @ named["router"].astype(jnp.float32)  # f32[N, E]
        routing, expert_ids, _ = moe.route(
            logits, num_experts_per_token=layer.num_experts_per_token, normalize=layer.normalize_router_weights
        )
        y = moe.dense_moe(
            tokens,
            routing,
            expert_ids,
            **{name: named[name].astype(compute) for name in ("expert_gate", "expert_up", "expert_down")},
        )
        return y.reshape(x.shape)

    return forward


def forward_backward(forward, x):
    """jit of (weights, x) -> (y, d(weights), d(x)) of sum(y * cotangent), a fixed cotangent."""
    cotangent = jax.random.normal(jax.random.key(SEED + 1), x.shape, x.dtype)

    def step(weights, x):
        y, pullback = jax.vjp(forward, weights, x)
        return y, *pullback(cotangent.astype(y.dtype))

    return jax.jit(step)


def check_agreement(sparse, dense, precision):
    """The sparse layer's outputs and gradients against the dense-masked ones: within
    ``MISMATCH[precision]`` of each array's largest magnitude (bf16 sums in other orders)."""
    for a, b in zip(jax.tree.leaves(sparse), jax.tree.leaves(dense)):
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        error, scale = float(np.max(np.abs(a - b))), float(np.max(np.abs(b)))
        if error > MISMATCH[precision] * max(scale, 1.0):
            raise TimingMismatch(
                f"sparse and dense-masked results differ by up to {error:.3g} (largest {scale:.3g}, shape {a.shape}, {precision})"
            )


def measure_time(settings, layer, x, dense):
    """One ``TimeRow``: ``layer`` (its grouped matmul) against ``dense``, the dense-masked
    (step, outputs) at the same weights, timed in alternating turns."""
    weights = [variable.value for variable in layer.trainable_variables]
    non_trainable = [variable.value for variable in layer.non_trainable_variables]
    sparse = forward_backward(lambda w, x: layer.stateless_call(w, non_trainable, x)[0], x)
    check_agreement(jax.block_until_ready(sparse(weights, x)), dense[1], settings.time_precision)  # and compiles it
    times = alternating_times(settings, {"sparse": sparse, "dense": dense[0]}, weights, x)
    row = TimeRow(
        settings.time_tokens,
        settings.time_width,
        settings.time_intermediate_dim,
        settings.time_experts,
        settings.time_experts_per_token,
        layer.grouped_matmul or moe.grouped_matmul_implementation(),
    )
    row.ratios = tuple(d / s for s, d in zip(times["sparse"], times["dense"]))
    row.sparse_s, row.dense_s = statistics.median(times["sparse"]), statistics.median(times["dense"])
    return row


def alternating_times(settings, steps, weights, x):
    """{name: [seconds per call of each turn]}: ``repeats`` turns of ``steps`` calls per
    step, the steps alternating within each turn."""
    times = {name: [] for name in steps}
    for _ in range(settings.repeats):
        for name, step in steps.items():
            start = time.perf_counter()
            for _ in range(settings.steps):
                jax.block_until_ready(step(weights, x))
            times[name].append((time.perf_counter() - start) / settings.steps)
    return times


def time_rows(settings, report=print):
    """A ``TimeRow`` per grouped matmul of ``settings.time_grouped_matmuls`` (none: the
    layer's default). Every row's layer is built from the same seed, so the dense-masked
    program is compiled and run for its outputs once, for the first row, and serves all."""
    rows, dense = [], None
    for grouped_matmul in settings.time_grouped_matmuls or (None,):
        layer, x = time_layer(settings, grouped_matmul)
        if dense is None:
            step = forward_backward(dense_masked(layer), x)
            dense = (step, jax.block_until_ready(step([variable.value for variable in layer.trainable_variables], x)))
        row = measure_time(settings, layer, x, dense)
        report(
            f"time: {row.grouped_matmul} {row.sparse_s * 1e3:.2f} ms, dense-masked {row.dense_s * 1e3:.2f} ms per "
            "forward + backward (medians)"
        )
        rows.append(row)
    return rows


def format_time(settings, rows):
    return [
        (
            f"Time: one {jax.devices()[0].platform} device, jitted forward + backward (gradients of every weight and of x), "
            f"{settings.time_precision}; sparse = MoEFeedForward through the grouped matmul named (ragged_dot: "
            "jax.lax.ragged_dot; megablox: JAX's Pallas grouped matmul; blocks: a loop over row blocks); dense-masked = "
            "every expert on every token weighted by the same router (zoo.kernels.moe.dense_moe, keras-hub's way); "
            f"outputs and gradients checked equal; ms: medians of {settings.repeats} turns of {settings.steps} passes, "
            f"sparse and dense alternating; jax {jax.__version__}."
        ),
        "",
        "| N tokens | C | F | E | k | sparse path | sparse ms | dense ms | dense / sparse (median of pairs) | range | E/k (FLOP ratio) | goal E/(2k) | met |",
        "| ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | --- | ---: | ---: | --- |",
        *(
            f"| {row.tokens:,} | {row.width} | {row.hidden} | {row.experts} | {row.k} | {row.grouped_matmul} | "
            f"{row.sparse_s * 1e3:.2f} | {row.dense_s * 1e3:.2f} | **{row.ratio:.2f}** | {min(row.ratios):.2f} to "
            f"{max(row.ratios):.2f} | {row.experts / row.k:g} | {row.goal:g} | {'yes' if row.ratio >= row.goal else 'no'} |"
            for row in rows
        ),
    ]
