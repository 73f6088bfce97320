"""``ParallelMLP``: Megatron's MLP block, column-parallel up (and gate), row-parallel down."""

import keras

from zoo.config.renamed import TENSOR_PARALLEL_KEYS, renamed_keys
from zoo.distribution.axes import MODEL
from zoo.kernels.collective_matmul import vary_over
from zoo.kernels.tensor_parallel import (
    mlp_activation,
    mlp_down_projection,
    mlp_up_projections,
)
from zoo.layers._parallel_plan import run_sharded
from zoo.layers._tensor_parallel import (
    activation_spec,
    check_input,
    column_lora,
    describe_split,
    row_matmul_with_lora,
    sequence_collective,
    tensor_parallel_plan,
)
from zoo.layers.column_parallel_dense import ColumnParallelDense
from zoo.layers.row_parallel_dense import RowParallelDense


@keras.saving.register_keras_serializable(package="zoo")
class ParallelMLP(keras.layers.Layer):
    """Transformer MLP whose forward pass needs a single collective.

    ``down(activation(up(x)))``, or with ``gated=True`` (GLU, e.g. GeGLU/SwiGLU)
    ``down(activation(gate(x)) * up(x))``. ``up``/``gate`` are ``ColumnParallelDense``
    and ``down`` a ``RowParallelDense``: under a distribution whose mesh has
    ``model_axis`` (size N > 1) each device keeps 1/N of the hidden features, from
    the up projection to the down projection (``zoo.kernels.tensor_parallel_mlp``, in
    two ``shard_map``s with the elementwise activation between them, where it moves
    nothing): one all-reduce of the (B, T, C) output forward, one of d(input)
    backward. With ``megatron_sp=True`` the input and output are split over the
    sequence instead: one all-gather and one reduce-scatter
    (the same bytes), overlapped with the matmuls when ``collective_matmul=True``.
    Without a distribution, or N = 1, it is the same maths with plain Dense layers.
    A batch that does not divide the batch split, such as a few prompts decoding (1 on
    ``data=2``; 2 on ``data`` x ``expert`` under ``expert+tp``), is split over the batch axes
    it divides and whole over the others, as in ``MoEFeedForward``; FSDP-split weights then
    arrive whole when the batch is not split over their axis
    (``ParallelPlan.weights_whole_unless_tokens_split``).

    Args:
        hidden_dim: hidden features F; must divide by the model-axis size.
        output_dim: output features; defaults to the input features C.
        activation: applied to the up (or, gated, the gate) projection.
        gated: add a gate projection (GLU variants).
        use_bias: biases on every projection.
        kernel_initializer, bias_initializer: for every projection.
        megatron_sp, collective_matmul, model_axis: as in ``ColumnParallelDense``.
        lora_rank, lora_alpha: enable Keras LoRA on every projection when built.

    Shapes: (B, T, C) -> (B, T, output_dim) (or any (B, ..., C) without sequence
    parallelism). Sublayers and weights (F = hidden_dim, N = model-axis size):

    ===================  ==========  ===========
    path                 shape       layout
    ===================  ==========  ===========
    <name>/gate/kernel   (C, F)      (-, model)   (gated only)
    <name>/gate/bias     (F,)        (model,)     (gated only)
    <name>/up/kernel     (C, F)      (-, model)
    <name>/up/bias       (F,)        (model,)
    <name>/down/kernel   (F, C_out)  (model, -)
    <name>/down/bias     (C_out,)    replicated
    ===================  ==========  ===========

    Under ``fsdp+tp`` (the distribution's ``weight_shard_axis``, see
    ``ColumnParallelDense``) the kernels are also split over ``data`` on their other
    dimension, (data, model) and (model, data), and all-gathered over it inside the
    ``shard_map``s just before their matmuls.
    """

    def __init__(
        self,
        hidden_dim,
        output_dim=None,
        activation="gelu",
        gated=False,
        use_bias=True,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        megatron_sp=False,
        collective_matmul=False,
        model_axis=MODEL,
        lora_rank=None,
        lora_alpha=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if not isinstance(hidden_dim, int) or hidden_dim < 1:
            raise ValueError(f"hidden_dim must be a positive integer, got {hidden_dim!r}")
        if collective_matmul and not megatron_sp:
            raise ValueError(f"ParallelMLP {self.name!r}: collective_matmul needs megatron_sp=True")
        self.hidden_dim = hidden_dim
        self.output_dim = output_dim
        self.activation = keras.activations.get(activation)
        self.gated = bool(gated)
        self.use_bias = bool(use_bias)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.megatron_sp = bool(megatron_sp)
        self.collective_matmul = bool(collective_matmul)
        self.model_axis = model_axis
        self.lora_rank = lora_rank
        self.lora_alpha = lora_alpha
        self.supports_masking = True

    def build(self, input_shape):
        options = dict(
            use_bias=self.use_bias,
            kernel_initializer=self.kernel_initializer,
            bias_initializer=self.bias_initializer,
            megatron_sp=self.megatron_sp,
            collective_matmul=self.collective_matmul,
            model_axis=self.model_axis,
            dtype=self.dtype_policy,
        )
        self.gate = (
            ColumnParallelDense(self.hidden_dim, activation=self.activation, name="gate", **options)
            if self.gated
            else None
        )
        self.up = ColumnParallelDense(
            self.hidden_dim, activation=None if self.gated else self.activation, name="up", **options
        )
        self.down = RowParallelDense(self.output_dim or input_shape[-1], name="down", **options)
        for layer in self.projections:
            layer.build(input_shape if layer is not self.down else (*input_shape[:-1], self.hidden_dim))
        if self.lora_rank:
            self.enable_lora(self.lora_rank, self.lora_alpha)

    @property
    def projections(self):
        """The Dense sublayers, in order: [gate,] up, down."""
        return [layer for layer in (self.gate, self.up, self.down) if layer is not None]

    def enable_lora(self, rank, lora_alpha=None):
        """Keras LoRA on every projection (``Dense.enable_lora``); the kernels freeze."""
        for layer in self.projections:
            layer.enable_lora(rank, lora_alpha=lora_alpha)
        self.lora_rank, self.lora_alpha = rank, lora_alpha

    def compute_output_shape(self, input_shape):
        return (*input_shape[:-1], self.output_dim or input_shape[-1])

    def compute_output_spec(self, inputs, *args, **kwargs):
        return keras.KerasTensor(self.compute_output_shape(inputs.shape), dtype=self.compute_dtype)

    def call(self, inputs, training=None):
        plan = tensor_parallel_plan(self.model_axis)
        if plan is None:
            hidden = self.up(inputs) if self.gate is None else self.gate(inputs) * self.up(inputs)  # (B, T, F)
            return self.down(hidden)  # (B, T, C_out)
        # a batch that does not divide the batch split (a few prompts decoding: 1 on data=2, 2 on data x expert)
        # is split over the batch axes it divides and whole over the others
        plan = plan.for_batch(inputs.shape[0]).weights_whole_unless_tokens_split()
        check_input(self, plan, inputs.shape, sequence=self.megatron_sp)
        for layer in self.projections:
            layer.check_features(inputs.shape[-1] if layer is not self.down else self.hidden_dim, plan)
        weights, specs = zip(*(layer.sharded_weights(plan) for layer in self.projections))
        rank = len(inputs.shape)
        spec = activation_spec(plan, rank, sequence=self.megatron_sp)  # (B, T[/N], ..., C)
        hidden_spec = activation_spec(plan, rank, features=True)  # (B, T, ..., F/N)
        ups = len(self.projections) - 1
        hidden = run_sharded(
            plan,
            self._local_up,
            (inputs, list(weights[:ups])),
            (spec, list(specs[:ups])),
            [hidden_spec] * ups,
            plan=plan,
        )  # [gate,] up: (B, T, F) each, split over the model axis on F
        # Elementwise, outside the shard_maps: the sharding carries through with no
        # collective, and any activation differentiates (see ``mlp_activation``).
        h = mlp_activation(hidden, activation=self.activation)  # (B, T, F)
        return run_sharded(plan, self._local_down, (h, weights[ups]), (hidden_spec, specs[ups]), spec, plan=plan)

    def _local_up(self, x, weights, plan):
        """One shard: x [B, T, C] (or [B, T/N, C]) -> [[gate,] up], each [B, T, F/N].
        With LoRA each adds its factored update (``column_lora``)."""
        named = dict(zip([layer.name for layer in self.projections], weights))
        kernels = {name: layer.local_kernel(named[name], plan) for name, layer in zip(named, self.projections)}
        loras = [layer.local_lora(named[name]) for name, layer in zip(named, self.projections)]  # [gate,] up
        if not self.megatron_sp and any(lora is not None for lora in loras):
            x = vary_over(x, self.model_axis)  # one cast for every matmul of x: one all-reduce of d(x)
        hidden = mlp_up_projections(
            x,
            up_kernel=kernels["up"],  # [C, F/N]
            gate_kernel=kernels.get("gate"),  # [C, F/N] or None
            up_bias=named["up"].get("bias"),
            gate_bias=named["gate"].get("bias") if "gate" in named else None,
            axis_name=self.model_axis,
            megatron_sp=self.megatron_sp,
            collective=self.collective_matmul,
        )
        return [
            y if lora is None else y + column_lora(x, lora, axis_name=self.model_axis, megatron_sp=self.megatron_sp)
            for y, lora in zip(hidden, loras)
        ]

    def _local_down(self, h, weights, plan):
        """One shard: h [B, T, F/N] -> [B, T, C_out] (or [B, T/N, C_out]); with LoRA the
        factored update joins the partial sums before their one reduction."""
        lora = self.down.local_lora(weights)
        if lora is not None:
            return row_matmul_with_lora(
                h,
                self.down.local_kernel(weights, plan),
                lora,
                axis_name=self.model_axis,
                bias=weights.get("bias"),
                megatron_sp=self.megatron_sp,
                collective=self.collective_matmul,
            )
        return mlp_down_projection(
            h,
            down_kernel=self.down.local_kernel(weights, plan),  # [F/N, C_out]
            down_bias=weights.get("bias"),
            axis_name=self.model_axis,
            megatron_sp=self.megatron_sp,
            collective=self.collective_matmul,
        )

    def get_config(self):
        config = super().get_config()
        config.update(
            hidden_dim=self.hidden_dim,
            output_dim=self.output_dim,
            activation=keras.activations.serialize(self.activation),
            gated=self.gated,
            use_bias=self.use_bias,
            kernel_initializer=keras.initializers.serialize(self.kernel_initializer),
            bias_initializer=keras.initializers.serialize(self.bias_initializer),
            megatron_sp=self.megatron_sp,
            collective_matmul=self.collective_matmul,
            model_axis=self.model_axis,
            lora_rank=self.lora_rank,
            lora_alpha=self.lora_alpha,
        )
        return config

    @classmethod
    def from_config(cls, config):
        return super().from_config(renamed_keys(config, TENSOR_PARALLEL_KEYS))

    def describe_parallelism(self):
        """What a call runs under the current distribution, in words (``zoo.distribution.describe``)."""
        plan = tensor_parallel_plan(self.model_axis)
        if plan is None:
            return f"plain MLP, GSPMD (no {self.model_axis!r} axis to split over)"
        hidden = f"{self.hidden_dim // plan.model_size} of {self.hidden_dim} hidden features per device"
        if self.megatron_sp:
            collectives = sequence_collective("one all-gather and one reduce-scatter", self.collective_matmul)
        else:
            collectives = "one all-reduce of the output per call (one of d(input) backward)"
        return describe_split("tensor-parallel MLP", plan, f"{hidden}, {collectives}")
