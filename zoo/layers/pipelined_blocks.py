"""``PipelinedBlocks``: L identical ``TransformerBlock``s with stacked weights, run as a
pipeline over the mesh's ``stage`` axis (``zoo.kernels.pipeline``)."""

import contextlib
import functools

import jax
import jax.numpy as jnp
import keras
import numpy as np
from jax.sharding import PartitionSpec as P

from zoo._compat import (
    adding_state_after_build,
    deferred_initializer,
    saved_variables,
    sublayers,
)
from zoo.config.choices import SCHEDULES
from zoo.distribution.axes import STAGE
from zoo.distribution.mesh import mesh_axis_size
from zoo.kernels.pipeline import check_schedule, pipeline
from zoo.layers._lora import (
    check_lora_rank,
    enable_layer_lora,
    lora_target_layers,
)
from zoo.layers._parallel_plan import resolve_plan, run_manual_over
from zoo.layers._quantized import is_built_quantized, quantized_weights
from zoo.layers._stacked_loop import LoopShardings, StageFunction, stages_body
from zoo.layers._stacked_template import (
    TEMPLATE,
    StackedInitializer,
    Untracked,
    abstract_scope,
    block_variables,
    factors_laid_out_like_kernels,
    is_factor,
    template_block,
)
from zoo.layers.moe_feed_forward import router_statistics

ROUTER_STATISTICS_PATH = "mlp/router_statistics"  # a MoE block's per-step statistics, stacked (R, L/R, 2)


@keras.saving.register_keras_serializable(package="zoo")
class PipelinedBlocks(keras.layers.Layer):
    """``num_blocks`` ``TransformerBlock``s applied in order, their weights stacked.

    Every weight of a ``TransformerBlock`` (``attention/query/kernel`` (C, H, D), ...)
    becomes one variable of shape (R, L/R, C, H, D) at the same path under this layer
    (``<name>/attention/query/kernel``): block l is entry ``[l // (L/R), l % (L/R)]``,
    the natural order of the blocks read row by row. The shape depends on
    ``repeats`` (R) but not on the number of stages, so weights saved under one mesh
    load under any other and on one device (and ``load_own_variables`` reshapes weights
    saved with another R).

    Under a distribution whose mesh has a ``stage`` axis of size S > 1, the blocks run
    as a pipeline (``zoo.kernels.pipeline``): the layout map splits dimension 1 over
    ``stage`` (stage s holds blocks ``[r, s*L/(S*R) : (s+1)*L/(S*R)]`` of every repeat r),
    the batch is cut into ``micro_batches`` micro-batches (rows m, m + M, m + 2M, ...,
    so a batch split over ``data`` stays where it is) and activations move stage to
    stage with ``ppermute``. Without a stage axis the same loop runs on each device, one
    stage: the single-device reference, with the same numbers. The ``data`` and
    ``model`` axes stay GSPMD's: the blocks inside run as plain layers on weights split
    by the layout map (Megatron's split over ``model``). One stage under a distribution
    that splits the tokens (a ``ContextParallel``'s ``seq``, or ``megatron_sp`` blocks
    over ``model``) or the experts (``ExpertParallel``), the loop runs under it: each
    block's layers run their layer form's kernels (the ring, gather or Ulysses attention;
    Megatron's sequence-parallel matmuls; the MoE exchange). MoE blocks (every block
    sparse) stack as one group on the whole batch, their router losses and statistics
    recorded once after the loop; a quantized template (QLoRA's base, built under a
    quantized dtype policy) makes an int8 / int4 stack (``fill_quantized``).

    Args:
        num_blocks: L.
        block: the ``TransformerBlock`` arguments of every block (a dict; no ``name``,
            ``seed``); its ``remat`` is applied to each block in the loop.
        schedule: ``"gpipe"`` (``repeats`` 1) or ``"circular"`` (``repeats`` >= 2: stage s
            holds R non-adjacent groups of blocks, the bubble shrinks R times).
        micro_batches: M, how many pieces the batch is cut into (it must divide the batch,
            and the rows per data shard). The circular schedule needs M >= S.
        repeats: R, how many times each micro-batch goes round the stages; divides L.
        stage_axis: the mesh axis of the stages.
        seed: seed of the dropout stream. Dropout masks depend on (block, row of the
            batch) only, so they are the same whatever M, S or data split.

    LoRA (``enable_lora``): the template block's Dense / EinsumDense layers get their
    factors, stacked like every other weight (``<name>/attention/query/lora_kernel_a``
    (R, L/R, C, H, r)), each block's update computed factored on its slice; the stacked
    kernels are frozen. Saved (``.keras``) with each kernel merged, ``kernel + (alpha / r)
    a @ b``, as Keras saves a LoRA layer (``merged_weights``).

    Call: ``blocks(x, key_mask=None, training=None, segment_ids=None)``; x (B, T, C) ->
    (B, T, C); segment_ids int (B, T) or None: document ids of packed rows (0 = padding),
    cut into micro-batches like key_mask and passed to every block's attention.
    """

    def __init__(
        self, num_blocks, block, schedule="gpipe", micro_batches=1, repeats=1, stage_axis=STAGE, seed=None, **kwargs
    ):
        super().__init__(**kwargs)
        _check_arguments(num_blocks, block, schedule, micro_batches, repeats)
        self.num_blocks = num_blocks
        self.block = dict(block)
        self.schedule = schedule
        self.micro_batches = micro_batches
        self.repeats = repeats
        self.stage_axis = stage_axis
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed, name="seed_generator")
        self._template = None  # (TransformerBlock, {relative path: its variable}), made in build
        self.stacked = {}  # relative path -> variable (R, L/R, *block shape)
        self.lora = None  # (rank, alpha) once enable_lora ran

    # --- weights ----------------------------------------------------------------------

    def build(self, input_shape):
        self._num_stages()  # blocks that do not split over the stages are named before any weight is made
        template, variables = template_block(self.block, input_shape, self.dtype_policy)
        self._template = Untracked((template, variables))
        self._stack_new_variables()

    def _stack_new_variables(self):
        """A stacked weight for each template variable that has none yet."""
        per_repeat = self.num_blocks // self.repeats
        for path, variable in self.template[1].items():
            if path not in self.stacked:
                self.stacked[path] = self._stacked_weight(path, variable, per_repeat)

    def _stacked_weight(self, path, variable, per_repeat):
        """A variable (R, L/R, *variable.shape) at ``<name>/<path>``, each block's slice
        initialised as the block's own variable would be."""
        *scopes, name = path.split("/")
        initializer = StackedInitializer(deferred_initializer(variable), (self.repeats, per_repeat))
        with contextlib.ExitStack() as stack:
            stack.enter_context(keras.name_scope(self.name, caller=self))
            for scope in scopes:
                stack.enter_context(keras.name_scope(scope))
            weight = keras.Variable(
                initializer=initializer,
                shape=(self.repeats, per_repeat, *variable.shape),
                dtype=variable.dtype,
                trainable=variable.trainable,
                name=name,
            )
        return weight

    @property
    def template(self):
        """``(TransformerBlock, {path under the block: its variable})``: the block whose
        computation runs on each block's slice (built abstractly, its variables never
        initialised; not the layer's weights)."""
        return self._template.value

    def enable_lora(self, rank, alpha=None):
        """LoRA of ``rank`` (scale ``alpha / rank``; Keras' default alpha = rank) on every
        block's Dense / EinsumDense layers but MoE routers (``lora_target_layers``), as
        Keras' ``layer.enable_lora`` does on one layer: the factors stacked and trainable
        (``lora_kernel_a`` initialised as Keras does, ``lora_kernel_b`` zeros, so the
        blocks compute what they did), the stacked kernels frozen."""
        check_lora_rank(rank)
        if self.lora is not None:
            raise ValueError(f"{self.name}: LoRA is already enabled (rank {self.lora[0]}); load a fresh model")
        if not self.built:
            raise ValueError(f"{self.name}: build the layer (call the model once) before enabling LoRA")
        template, variables = self.template
        with abstract_scope():
            targets = lora_target_layers(template)
            for layer in targets:
                enable_layer_lora(layer, rank, alpha)
        variables.update(block_variables(template))
        with adding_state_after_build(self), factors_laid_out_like_kernels(self, variables):
            self._stack_new_variables()
        for path, variable in variables.items():  # the kernels Keras froze in the template, frozen here
            self.stacked[path].trainable = variable.trainable
        self.lora = (rank, targets[0].lora_alpha if targets else alpha)

    def quantized_layers(self):
        """``{relative path of a kernel: the template's layer}`` for the template's layers
        built quantized (int8 / int4: the stack of a QLoRA base, built under
        ``zoo.training.lora.quantized.quantized_policy``)."""
        prefix = TEMPLATE + "/"
        return {
            f"{layer.path.split(prefix, 1)[-1]}/kernel": layer
            for layer in sublayers(self.template[0])
            if is_built_quantized(layer)
        }

    def fill_quantized(self, path, kernel):
        """Give the quantized stack at ``path`` (``"attention/query/kernel"``: a key of
        ``quantized_layers``) the quantized form of each block's float kernel,
        ``kernel(l)`` for block l (a checkpoint's tensor), as ``zoo.layers.fill_quantized``
        gives a layer its: quantized block by block on the host (one float kernel at a
        time), then stacked into the kernel and its scales (R, L/R, ...)."""
        layer = self.quantized_layers()[path]
        blocks = [  # [{name: host array}]: each block's quantized weights off the device before the next
            {name: np.asarray(value) for name, value in quantized_weights(layer, kernel(index)).items()}
            for index in range(self.num_blocks)
        ]
        prefix = path.rsplit("/", 1)[0]
        for name in blocks[0]:
            stacked = self.stacked[f"{prefix}/{name}"]
            stacked.assign(np.stack([block[name] for block in blocks]).reshape(stacked.shape))

    def merged_weights(self):
        """``{relative path: array (R, L/R, ...)}`` of every stacked weight but the LoRA
        factors, each adapted kernel ``kernel + (alpha / r) a @ b`` (the blocks' weights as
        one model without LoRA holds them)."""
        weights = {path: variable.value for path, variable in self.stacked.items() if not is_factor(path)}
        if self.lora is None:
            return weights
        rank, alpha = self.lora
        if self.quantized_layers():
            raise ValueError(
                f"{self.name}: LoRA over a quantized stack (QLoRA) has no float kernel to merge into: save the "
                "adapter alone (zoo.training.lora.save_lora / save_peft_adapter) and merge it onto the float base "
                "(zoo export), as zoo finetune --method qlora does"
            )
        for path in weights:
            prefix = path.rsplit("/", 1)[0]
            if path.endswith("/kernel") and f"{prefix}/lora_kernel_a" in self.stacked:
                a, b = (self.stacked[f"{prefix}/lora_kernel_{name}"].value for name in ("a", "b"))
                update = jnp.einsum("rl...k,rlko->rl...o", a, b) * (alpha / rank)  # (R, L/R, *kernel shape)
                weights[path] = (weights[path] + update).astype(weights[path].dtype)
        return weights

    def save_own_variables(self, store):
        """Keras' saving, LoRA merged into the kernels and its factors left out (a model
        without LoRA loads the file, as from a LoRA Dense layer's)."""
        merged = self.merged_weights()
        paths = {id(variable): path for path, variable in self.stacked.items()}
        kept = [v for v in saved_variables(self) if not is_factor(paths.get(id(v), ""))]
        for index, variable in enumerate(kept):
            path = paths.get(id(variable))
            store[str(index)] = merged[path] if path is not None else variable

    def load_own_variables(self, store):
        """Keras' loading, with weights saved under another ``repeats`` reshaped (same
        blocks in the same order)."""
        variables = saved_variables(self)  # the order Keras saves them in
        saved = {key: store[key][...] for key in store.keys()}
        for index, variable in enumerate(variables):
            value = saved.get(str(index))
            if (
                value is not None
                and tuple(value.shape) != tuple(variable.shape)
                and value.size == np.prod(variable.shape)
            ):
                saved[str(index)] = value.reshape(variable.shape)
        super().load_own_variables(saved)

    # --- the forward pass -------------------------------------------------------------

    def call(self, x, key_mask=None, training=None, segment_ids=None):
        batch = x.shape[0]
        plan = resolve_plan(model_axis=None)  # the mesh and its batch axis (a model axis stays GSPMD's)
        stages = self._num_stages(plan)
        check_schedule(num_stages=stages, micro_batches=self.micro_batches, repeats=self.repeats)
        self._check_rows_split(batch, plan)
        seed = self.seed_generator.next() if training and self.block.get("dropout", 0.0) > 0 else None
        micro = _to_micro_batches(x, self.micro_batches, self.name)  # (M, B/M, T, C)
        extras = {"rows": _to_micro_batches(jnp.arange(batch, dtype=jnp.int32), self.micro_batches, self.name)}
        if key_mask is not None:
            extras["key_mask"] = _to_micro_batches(key_mask, self.micro_batches, self.name)  # (M, B/M, T)
        if segment_ids is not None:  # i32 (M, B/M, T), checked by each block's attention
            extras["segment_ids"] = _to_micro_batches(segment_ids, self.micro_batches, self.name)
        if seed is not None:  # the same u32[2] for every micro-batch
            extras["seed"] = jnp.broadcast_to(seed, (self.micro_batches, *seed.shape))
        params = {path: variable.value for path, variable in self.stacked.items()}
        aux = None  # a MoE stack's router losses and statistics, one entry per block (L, ...)
        if self._one_group(stages):  # the blocks' loop on the whole batch, a MoE stack's aux out
            loop = LoopShardings.under(self, plan.for_batch(batch))
            first = functools.partial(jax.tree.map, lambda value: value[0])  # (1, ...) -> (...): the one group
            y, aux = StageFunction(self, bool(training), loop).with_aux(first(params), first(micro), first(extras), 0)
            y = y[None]  # (M=1, B, T, C)
        elif stages == 1:  # one loop over the micro-batches and repeats on every device
            loop = LoopShardings.under(self, plan.for_batch(batch // self.micro_batches))
            y, _ = pipeline(StageFunction(self, bool(training), loop), params, micro, extras, repeats=self.repeats)
        else:
            y = self._run_on_stages(StageFunction(self, bool(training)), params, micro, extras, plan, stages)
        if training and aux is not None:
            self._record_router(aux)
        return _from_micro_batches(y)  # (B, T, C)

    def _one_group(self, stages):
        """Whether the blocks run as one group on the whole batch (one stage, one
        micro-batch, one repeat: a scanned stack): the blocks' loop alone, without
        ``pipeline``'s schedule around it. MoE blocks must (their router losses leave the
        loop once)."""
        one = (stages, self.micro_batches, self.repeats) == (1, 1, 1)
        if self.block.get("num_experts") and not one:
            raise ValueError(
                f"{self.name}: Mixture-of-Experts blocks (num_experts={self.block['num_experts']}) stack as one loop "
                f"on the whole batch (scan_layers), not in a pipeline: stages={stages}, micro_batches="
                f"{self.micro_batches}, repeats={self.repeats} must all be 1"
            )
        return one

    def _record_router(self, aux):
        """A MoE stack's router losses, each block's summed (as the layers add theirs), and
        each block's statistics into the stacked ``router_statistics`` (R, L/R, 2)."""
        mlp = self.template[0].mlp
        for loss in mlp.router_losses(aux):
            self.add_loss(loss)
        statistics = self.stacked[ROUTER_STATISTICS_PATH]
        statistics.assign(router_statistics(aux).reshape(statistics.shape))

    def _run_on_stages(self, stage_fn, params, micro, extras, plan, stages):
        """The pipeline in a ``shard_map`` manual over the stage axis and the batch axis
        (each device runs its rows: the weight gradients are summed over the batch axis
        once per step); a ``model`` axis stays GSPMD's."""
        batch = plan.batch_axis
        rows = P(None, batch)  # (M, B/M, ...): the micro-batches' rows over the batch axis
        stacked_spec = jax.tree.map(lambda _: P(None, self.stage_axis), params)
        extras_spec = {key: P() if key == "seed" else rows for key in extras}
        # The outputs split on the sequence over the stages when it divides (what follows,
        # the final norm and the LM head, then runs on T/S tokens per stage instead of all
        # T on every stage); else every stage gets them whole.
        split_sequence = micro.ndim >= 3 and micro.shape[2] % stages == 0
        outputs = P(None, batch, self.stage_axis) if split_sequence else rows
        manual = {self.stage_axis} | ({batch} if batch else set())  # the model axis stays GSPMD's
        y, _ = run_manual_over(
            plan,
            manual,
            stages_body,
            (params, micro, extras),
            (stacked_spec, rows, extras_spec),
            (outputs, P(self.stage_axis)),
            stage_fn=stage_fn,
            axis_name=self.stage_axis,
            repeats=self.repeats,
            scatter_dimension=2 if split_sequence else None,
        )
        return y

    def _check_rows_split(self, batch, plan):
        """Each micro-batch's B/M rows must divide over the plan's batch axis."""
        axis, split = plan.batch_axis, plan.batch_size
        if axis is None or batch % self.micro_batches:
            return  # no batch axis; an indivisible batch is named by _to_micro_batches
        rows = batch // self.micro_batches
        if rows % split:
            raise ValueError(
                f"{self.name}: batch size {batch} in micro_batches={self.micro_batches} gives {rows} rows per "
                f"micro-batch, which do not divide over the {axis!r} mesh axis of size {split}; use a batch "
                f"divisible by {self.micro_batches * split}"
            )

    def _num_stages(self, plan=None):
        """S: the size of the plan's stage axis (1 without one)."""
        mesh = (plan or resolve_plan(model_axis=None)).keras_mesh
        if mesh is None or self.stage_axis not in mesh.axis_names:
            return 1
        stages = mesh_axis_size(mesh, self.stage_axis)
        groups = stages * self.repeats
        if self.num_blocks % groups:
            raise ValueError(
                f"{self.name}: {self.num_blocks} blocks do not split into {self.repeats} repeat(s) x {stages} "
                f"stages ({groups} equal groups); use a stage count and repeats whose product divides {self.num_blocks}"
            )
        return stages

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def set_remat(self, remat):
        """Rematerialise every block in the loop as ``remat`` from the next traced step on
        (``TransformerBlock``'s choices; weights untouched)."""
        self.block["remat"] = remat
        if self._template is not None:
            self._template.value[0].remat = remat

    def get_config(self):
        config = super().get_config()
        config.update(
            num_blocks=self.num_blocks,
            block=dict(self.block),
            schedule=self.schedule,
            micro_batches=self.micro_batches,
            repeats=self.repeats,
            stage_axis=self.stage_axis,
            seed=self.seed,
        )
        return config


def _to_micro_batches(x, micro_batches, name):
    """(B, ...) -> (M, B/M, ...), micro-batch m = rows m, m + M, ...: a reshape that keeps
    a batch split over ``data`` on its devices (B/M rows divide over the data axis)."""
    batch = x.shape[0]
    if batch % micro_batches:
        raise ValueError(f"{name}: batch size {batch} is not divisible by micro_batches={micro_batches}")
    return jnp.swapaxes(x.reshape(batch // micro_batches, micro_batches, *x.shape[1:]), 0, 1)


def _from_micro_batches(y):
    """(M, B/M, ...) -> (B, ...), the inverse of ``_to_micro_batches``."""
    return jnp.swapaxes(y, 0, 1).reshape(-1, *y.shape[2:])


def _check_arguments(num_blocks, block, schedule, micro_batches, repeats):
    if not isinstance(num_blocks, int) or num_blocks < 1:
        raise ValueError(f"num_blocks must be a positive integer, got {num_blocks!r}")
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {list(SCHEDULES)}, got {schedule!r}")
    check_schedule(num_stages=1, micro_batches=micro_batches, repeats=repeats)
    if schedule == "gpipe" and repeats != 1:
        raise ValueError(
            f"schedule 'gpipe' runs each stage's blocks once: repeats must be 1, got {repeats}; use schedule 'circular'"
        )
    if schedule == "circular" and repeats < 2:
        raise ValueError(f"schedule 'circular' needs repeats >= 2 (repeats=1 is 'gpipe'), got {repeats}")
    if num_blocks % repeats:
        raise ValueError(f"repeats={repeats} does not divide num_blocks={num_blocks}")
    for key in ("name", "seed"):
        if key in block:
            raise ValueError(
                f"block arguments must not set {key!r} (PipelinedBlocks sets it), got {key}={block[key]!r}"
            )
