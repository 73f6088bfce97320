"""Pipeline parallelism over one mesh axis (``stage``), run on one shard inside ``jax.shard_map``.

The L blocks of a model are cut into G = S * R groups of L / G consecutive blocks
(S = the stage axis' size, R = ``repeats``); group g lives on stage g mod S, so stage s
holds groups s, S + s, 2S + s, ... (one group per repeat: GPipe when R = 1, the
circular / interleaved schedule of MaxText when R > 1). The batch is cut into M
micro-batches. At every tick each stage runs one of its groups on one micro-batch,
then passes the result to the next stage with one ``ppermute`` around the ring
(s -> s + 1 mod S; the wrap S-1 -> 0 carries a micro-batch into its next repeat).

Schedule: stage s does its k-th unit of work (k = 0 .. R*M - 1: repeat r = k // M,
micro-batch m = k % M) at tick t = k + s. A micro-batch leaves stage S-1 at tick
r*M + m + S - 1 and re-enters stage 0 at tick (r+1)*M + m, so R > 1 needs M >= S
(stage 0 keeps the returning micro-batches in a buffer of M until their turn). The
loop runs R*M + S - 1 ticks, of which each stage works R*M: the useful fraction is

    R*M / (R*M + S - 1)        (GPipe: M / (M + S - 1))

``pipeline`` counts it through its own loop (``pipeline_work``), not from the formula.
The backward pass is JAX's autodiff of the loop: all forward ticks, then all backward
ticks in reverse, the ``ppermute``s transposed (s + 1 -> s), as in GPipe.

Shapes: M micro-batches, b rows each, S stages, R repeats, Lg = L / (S*R) blocks per group.
"""

import jax
import jax.numpy as jnp

from zoo.kernels.collective_matmul import _varying_axes, vary_over


def check_schedule(*, num_stages, micro_batches, repeats):
    """Raise ``ValueError`` naming the numbers unless the schedule can run."""
    for name, value in (("num_stages", num_stages), ("micro_batches", micro_batches), ("repeats", repeats)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if repeats > 1 and num_stages > 1 and micro_batches < num_stages:
        raise ValueError(
            f"the circular schedule with repeats={repeats} needs at least as many micro-batches as stages: "
            f"micro_batches={micro_batches} < {num_stages} stages (a micro-batch leaving the last stage would "
            f"re-enter stage 0 before stage 0 is free); use micro_batches >= {num_stages} or repeats=1 (GPipe)"
        )


def num_ticks(*, num_stages, micro_batches, repeats=1):
    """R*M + S - 1: the ticks of the pipeline loop."""
    return repeats * micro_batches + num_stages - 1


def pipeline(stage_fn, params, x, extras=None, *, axis_name=None, repeats=1, scatter_dimension=None):
    """Run ``stage_fn`` over the micro-batches ``x`` through the pipeline on ``axis_name``.

    stage_fn(group_params, x_m, extras_m, group) -> y_m: runs one group of blocks
        (``group_params``: ``params`` at one repeat, leaves [Lg, ...]) on one
        micro-batch x_m [b, ...] (``extras_m``: ``extras`` at the same micro-batch, e.g.
        row ids and masks; ``group``: i32 index g = r*S + s of the group, for the
        blocks' global indices); y_m has x_m's shape and dtype.
    params: pytree of this stage's weights, leaves [R, Lg, ...].
    x: [M, b, ...] micro-batches; every stage gets them, stage 0 reads them.
    extras: pytree of [M, ...] arrays (or None).
    axis_name: the stage mesh axis (None: one stage, the whole loop on this device,
        which is also the single-device reference).
    scatter_dimension: None (every stage gets all of y: a psum over the stages), or a
        dimension of y (e.g. 2, the sequence of [M, b, T, C]) that the stages split
        instead (a reduce-scatter: stage s gets the s-th 1/S of it, so whatever follows
        the pipeline, the LM head say, runs on 1/S of it per stage, not S times).

    Other manual axes (a batch split over ``data``) may be in force: x then varies over
    them and the weights are cast to vary over them once, so their gradients are summed
    once per step, after the loop.

    Returns (y [M, b, ...] on every stage, useful i32: ticks this stage did work).
    """
    num_stages = 1 if axis_name is None else jax.lax.axis_size(axis_name)
    stage = 0 if axis_name is None else jax.lax.axis_index(axis_name)
    micro_batches = x.shape[0]
    check_schedule(num_stages=num_stages, micro_batches=micro_batches, repeats=repeats)
    work = repeats * micro_batches  # units of work per stage
    dtype = x.dtype
    if axis_name is not None:
        x, extras, params = _vary_once(x, extras, params, axis_name)
    zeros = jnp.zeros_like(x[0])  # [b, ...]
    ring = [(s, (s + 1) % num_stages) for s in range(num_stages)]
    run_group = _group_runner(stage_fn, repeats)

    def tick(t, state):
        carry, returning, outputs, useful = state  # [b, ...], [M, b, ...] or None, [M, b, ...], i32
        k = t - stage  # this stage's unit of work at tick t
        valid = (k >= 0) & (k < work)
        unit = jnp.clip(k, 0, work - 1)  # (bubble ticks compute on a valid index; their results are dropped)
        repeat, m = unit // micro_batches, unit % micro_batches
        first_input = x[m] if returning is None else jnp.where(repeat == 0, x[m], returning[m])  # [b, ...]
        x_in = jnp.where(stage == 0, first_input, carry)  # [b, ...]
        extras_m = jax.tree.map(lambda e: e[m], extras)
        y = run_group(params, repeat, x_in, extras_m, repeat * num_stages + stage)  # [b, ...]
        y = jnp.where(valid, y, zeros)  # the bubble's results are dropped
        done = valid & (stage == num_stages - 1) & (repeat == repeats - 1)
        outputs = outputs.at[m].set(jnp.where(done, y, outputs[m]))
        carry = y if num_stages == 1 else jax.lax.ppermute(y, axis_name, ring)  # from stage s - 1
        if returning is not None:  # stage 0 keeps what came back from stage S-1 for its next repeat
            k_back = t - (num_stages - 1)  # the unit stage S-1 did at tick t
            back = (stage == 0) & (k_back >= 0) & (k_back < work - micro_batches)
            m_back = jnp.clip(k_back, 0, work - 1) % micro_batches
            returning = returning.at[m_back].set(jnp.where(back, carry, returning[m_back]))
        return carry, returning, outputs, useful + valid.astype(jnp.int32)

    returning = jnp.zeros_like(x) if repeats > 1 else None  # [M, b, ...]
    useful = jnp.int32(0) if axis_name is None else vary_over(jnp.int32(0), axis_name)  # differs by stage
    state = (zeros, returning, jnp.zeros_like(x), useful)
    ticks = num_ticks(num_stages=num_stages, micro_batches=micro_batches, repeats=repeats)
    _, _, outputs, useful = jax.lax.fori_loop(0, ticks, tick, state)
    if axis_name is not None and num_stages > 1:  # only the last stage's are nonzero; summed in float32
        wide = outputs.astype(jnp.promote_types(dtype, jnp.float32))
        if scatter_dimension is None:
            outputs = jax.lax.psum(wide, axis_name)
        else:
            outputs = jax.lax.psum_scatter(wide, axis_name, scatter_dimension=scatter_dimension, tiled=True)
    return outputs.astype(dtype), useful


def _group_runner(stage_fn, repeats):
    """``(params, repeat, x, extras, group) -> stage_fn(params[repeat], ...)``.

    The backward pass needs each tick's group weights. With one repeat they are the
    same every tick (``params[0]``, a loop invariant: kept once). With R > 1 the slice
    depends on the tick, and autodiff would keep a copy of the group's weights for
    every one of the R*M + S - 1 ticks; the slice and the elementwise work are
    recomputed in the backward instead (``jax.checkpoint``, keeping the weight matmuls'
    outputs: ``dots_with_no_batch_dims_saveable``)."""

    def run(params, repeat, x, extras, group):
        return stage_fn(jax.tree.map(lambda p: p[repeat], params), x, extras, group)

    if repeats == 1:
        return lambda params, repeat, x, extras, group: stage_fn(jax.tree.map(lambda p: p[0], params), x, extras, group)
    return jax.checkpoint(run, policy=jax.checkpoint_policies.dots_with_no_batch_dims_saveable)


def _vary_once(x, extras, params, axis_name):
    """Cast the inputs to varying over the stage axis, and the weights over every axis the
    inputs vary over (a manual batch axis), once, before the loop: the backward then sums
    each cotangent once after the loop (one psum of the weight gradients over the batch
    axis per step), not once per tick. Floating inputs are cast in float32 (their
    cotangents' psum: XLA:CPU cannot all-reduce bfloat16 here) and returned to ``x``'s dtype."""
    dtype = x.dtype
    wide = jnp.promote_types(dtype, jnp.float32)
    x = vary_over(x.astype(wide), axis_name).astype(dtype)
    extras = jax.tree.map(lambda a: vary_over(a, axis_name), extras)
    batch_axes = _varying_axes(x) - {axis_name}
    params = jax.tree.map(lambda p: vary_over(p, batch_axes) if batch_axes else p, params)
    return x, extras, params
