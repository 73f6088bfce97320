"""``ColumnParallelDense``: a Dense layer whose kernel is split on its output features."""

import keras

from zoo.kernels.collective_matmul import vary_over
from zoo.kernels.tensor_parallel import (
    column_parallel_matmul,
    sequence_parallel_column_matmul,
)
from zoo.layers._tensor_parallel import (
    _TensorParallelDense,
    activation_spec,
    column_lora,
    sequence_collective,
)


@keras.saving.register_keras_serializable(package="zoo")
class ColumnParallelDense(_TensorParallelDense):
    """Megatron's column-parallel linear layer, as a ``keras.layers.Dense``.

    Under a distribution whose mesh has ``model_axis`` (size N > 1) each device holds
    kernel [C, units/N] and bias [units/N] and computes its slice of the output
    features: no communication forward, an all-reduce of d(input) backward. Feed the
    feature-split output to a ``RowParallelDense`` (``ParallelMLP`` pairs them). With
    no distribution, or no such axis, or N = 1, it is a ``Dense`` with the same numbers.

    Shapes (global): inputs (B, ..., C) -> outputs (B, ..., units), split over the
    model axis on the last dimension. With ``megatron_sp=True``, inputs arrive
    split on the sequence (dim 1) instead and are all-gathered first:
    (B, T/N, C) per device -> (B, T, units/N).

    Args:
        units: output features; must divide by the model-axis size.
        megatron_sp: inputs are split over the model axis on the sequence
            (Megatron sequence parallelism; needs inputs (B, T, ..., C)).
        collective_matmul: overlap the sequence all-gather with the matmul in N chunks
            (``zoo.kernels.all_gather_matmul``); needs ``megatron_sp``.
        model_axis: the mesh axis the kernel is split over.
        **kwargs: everything ``keras.layers.Dense`` takes (activation, use_bias,
            initializers, regularizers, constraints, lora_rank, lora_alpha, name, ...).

    Weights and their layouts (set when created, see ``zoo.layers._tensor_parallel``):

    =============  ===========  ==================
    weight         shape        layout
    =============  ===========  ==================
    kernel         (C, units)   (-, model) [1]
    bias           (units,)     (model,)
    lora_kernel_a  (C, r)       replicated
    lora_kernel_b  (r, units)   (-, model)
    =============  ===========  ==================

    so the LoRA update is split like the kernel; it is computed factored, x @ kernel +
    (alpha / r) (x @ a) @ b, with no (C, units) update or gradient formed
    (``zoo.layers._tensor_parallel``).

    [1] (data, model) under ``fsdp+tp`` (the distribution's ``weight_shard_axis``): the
    kernel is also split over ``data`` on C and all-gathered over it inside the
    ``shard_map`` just before the matmul; its gradient is reduce-scattered back.
    """

    WEIGHT_AXES = {
        "kernel": ("shard", "model"),
        "bias": ("model",),
        "lora_kernel_a": (None, None),
        "lora_kernel_b": (None, "model"),
    }
    SPLIT = "units"
    KIND = "column-parallel Dense"

    def activation_specs(self, plan, rank):
        inputs = activation_spec(plan, rank, sequence=self.megatron_sp)  # (B, T[/N], ..., C)
        return inputs, activation_spec(plan, rank, features=True)  # (B, T, ..., units/N)

    def _local_call(self, x, weights, plan):
        kernel, bias = self.local_kernel(weights, plan), weights.get("bias")  # [C, units/N], [units/N]
        lora = self.local_lora(weights)  # (a [C, r], b [r, units/N], alpha / r) or None
        if lora is not None and not self.megatron_sp:
            x = vary_over(x, self.model_axis)  # one cast: d(x) of both matmuls is all-reduced once
        if self.megatron_sp:
            y = sequence_parallel_column_matmul(
                x, kernel, axis_name=self.model_axis, bias=bias, collective=self.collective_matmul
            )  # [B, T, units/N]
        else:
            y = column_parallel_matmul(x, kernel, axis_name=self.model_axis, bias=bias)  # [B, ..., units/N]
        if lora is None:
            return y
        return y + column_lora(x, lora, axis_name=self.model_axis, megatron_sp=self.megatron_sp)  # factored

    def collectives(self):
        """The collectives a call runs over the model axis, in words."""
        if self.megatron_sp:
            return sequence_collective("all-gather of the input", self.collective_matmul)
        return "no collective forward, all-reduce of d(input) backward"
