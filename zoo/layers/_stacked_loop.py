"""The one-stage loop of ``PipelinedBlocks`` (and each stage's, in a pipeline): the
template block run on each block's slice of the stacked weights by one ``lax.scan``
(``StageFunction``), where those slices and the hidden states sit under a distribution
(``LoopShardings``), and each block's dropout seeds."""

import contextlib

import jax
import jax.numpy as jnp
import keras
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from zoo.distribution.distributions import global_distribution
from zoo.kernels.pipeline import pipeline
from zoo.layers._remat import REMAT_POLICIES
from zoo.layers._tensor_parallel import tensor_parallel_plan


class LoopShardings:
    """Where one block's values sit inside the one-stage loop under a distribution: each
    weight slice as the layout splits it but whole over the batch axes and the FSDP axis
    (FSDP's split, gathered one block per iteration, as MaxText's scanned layers are), and
    the hidden states as the layer form leaves them between blocks: rows over the batch
    axes, and the tokens over the sequence axis (context) or the model axis (Megatron's
    sequence parallelism, tp+sp). Without them GSPMD splits the loop's matmuls on their
    contracting dimension and all-reduces activations instead (Llama-3.2-1B dims, fsdp on
    8 devices: 84 GiB all-reduced per step instead of 7).

    ``own_kernels``: the tokens are split (context, tp+sp) or the experts (the expert
    layouts), so the block's layers run their layer form's kernels inside the loop, under
    the distribution (the context attention's ring or gather, the Megatron layers'
    sequence-parallel collectives, the MoE layer's exchange; the experts' weights arrive
    as the MoE layer takes them, which gathers their C itself); otherwise the loop runs
    under none and GSPMD splits the blocks by the weights' layout."""

    def __init__(self, weights, rows, own_kernels):
        self.weights, self.rows = weights, rows  # {path: NamedSharding of one block's slice}, NamedSharding or None
        self.own_kernels = own_kernels

    @classmethod
    def under(cls, layer, plan):
        """The shardings under the global distribution (None without one)."""
        distribution = keras.distribution.distribution()
        if distribution is None or plan.mesh is None:
            return None
        split = tensor_parallel_plan(layer.template[0].model_axis)  # None: no model axis splits the blocks
        megatron = split if layer.block.get("megatron_sp") else None
        tokens = megatron.model_axis if megatron is not None else plan.sequence_axis  # None: whole
        # a quantized stack split over the model axis: each device dequantizes its own shard
        # (the tensor-parallel layers' kernels), never GSPMD's reading of the packed kernels
        quantized = split is not None and bool(layer.quantized_layers())
        own_kernels = tokens is not None or plan.expert_axis is not None or quantized
        # FSDP's axes, gathered per block by the loop: the batch axes, context's seq; not the experts'
        gathered = (set(plan.batch_axes) | {plan.weight_shard_axis}) - {plan.expert_axis, None}
        weights = {}
        for path, variable in layer.stacked.items():
            layout = distribution.get_variable_layout(variable)
            axes = [None] * (variable.ndim - 2) if layout is None else list(layout.axes[2:])
            if plan.expert_axis is None or plan.expert_axis not in axes:  # the experts' C: their MoE layer gathers it
                axes = [_without(axis, gathered) for axis in axes]  # one block's dims
            weights[path] = NamedSharding(plan.mesh, P(*axes))
        spec = P(plan.batch_axis, tokens)  # (b, T[/N], C)
        rows = NamedSharding(plan.mesh, spec) if plan.batch_axis is not None or tokens is not None else None
        return cls(weights, rows, own_kernels)

    def place(self, params, h):
        """One block's weights gathered, and its input's rows split."""
        params = {path: jax.lax.with_sharding_constraint(value, self.weights[path]) for path, value in params.items()}
        if self.rows is not None:
            h = jax.lax.with_sharding_constraint(h, self.rows)  # (b, T, C)
        return params, h


def _without(axis, dropped):
    """A layout entry (None, a mesh axis or a tuple of them) without the axes in ``dropped``."""
    if axis is None:
        return None
    kept = tuple(a for a in (axis if isinstance(axis, tuple) else (axis,)) if a not in dropped)
    return None if not kept else kept[0] if len(kept) == 1 else kept


class StageFunction:
    """``stage_fn`` of ``zoo.kernels.pipeline``: a group of blocks on one micro-batch.

    Equal (and hashed) by (layer, training), so the bridge's program cache keeps one pipeline
    program per layer and mode; runs the template ``TransformerBlock`` on each block's slice
    of the stacked weights (``keras.StatelessScope``), under no distribution (the
    data and model axes are GSPMD's inside the pipeline's shard_map), but for a
    one-stage loop whose ``loop`` runs the layers' own kernels (``own_kernels``).
    ``loop``: the ``LoopShardings`` of a one-stage loop under a distribution (None: none
    placed)."""

    def __init__(self, layer, training, loop=None):
        self.layer, self.training, self.loop = layer, training, loop

    def __eq__(self, other):
        return isinstance(other, StageFunction) and (other.layer, other.training, other.loop) == (
            self.layer,
            self.training,
            self.loop,
        )

    def __hash__(self):
        return hash((id(self.layer), self.training))

    def __call__(self, group_params, x, extras, group):
        return self.with_aux(group_params, x, extras, group)[0]  # dense blocks (MoE: _one_group)

    def with_aux(self, group_params, x, extras, group):
        """(y, aux): the group's output, and a MoE block's aux per block (Lg, ...) or None."""
        layer, seed = self.layer, extras.get("seed")  # extras: this micro-batch's rows, key_mask, segment_ids, seed
        template, variables = layer.template
        per_group = jax.tree.leaves(group_params)[0].shape[0]  # Lg

        def block_forward(h, params, seeds):  # (b, T, C) -> ((b, T, C), aux): one block on its weights
            if self.loop is not None:
                params, h = self.loop.place(params, h)  # inside remat: the saved slice stays split
            with keras.StatelessScope(state_mapping=[(variables[path], value) for path, value in params.items()]):
                return template.forward_with_aux(h, extras.get("key_mask"), seeds, extras.get("segment_ids"))

        def one_block(h, params_and_index):
            params, index = params_and_index  # leaves of one block; i32 block index within the group
            block_index = group * per_group + index  # the block's place in the whole stack
            seeds = None if seed is None else _dropout_seeds(seed, block_index, extras["rows"])
            return forward(h, params, seeds)  # (h, aux: stacked by the scan)

        forward = block_forward
        if self.training and template.remat != "none":
            forward = jax.checkpoint(forward, policy=REMAT_POLICIES[template.remat])
        own = self.loop is not None and self.loop.own_kernels  # the layers' own parallel kernels, as layers
        with contextlib.nullcontext() if own else global_distribution(None):
            return jax.lax.scan(one_block, x, (group_params, jnp.arange(per_group)))


def stages_body(params, micro, extras, *, stage_fn, axis_name, repeats, scatter_dimension):
    """The ``shard_map`` body: this stage's blocks of every repeat on this device's rows;
    returns (outputs, i32[1] the ticks this stage did useful work)."""
    y, useful = pipeline(
        stage_fn, params, micro, extras, axis_name=axis_name, repeats=repeats, scatter_dimension=scatter_dimension
    )
    return y, useful[None]


def _dropout_seeds(seed, block_index, rows):
    """(attention, mlp) seeds u32[b, 2]: one per row of the micro-batch, from the layer's
    seed, the block and the row's index in the whole batch."""
    block_seed = jax.random.fold_in(seed, block_index)
    branch = [jax.random.fold_in(block_seed, j) for j in (0, 1)]
    return tuple(jax.vmap(lambda row, key=key: jax.random.fold_in(key, row))(rows) for key in branch)
