"""``RowParallelDense``: a Dense layer whose kernel is split on its input features."""

import keras

from zoo.kernels.tensor_parallel import (
    row_parallel_matmul,
    sequence_parallel_row_matmul,
)
from zoo.layers._tensor_parallel import (
    _TensorParallelDense,
    activation_spec,
    row_matmul_with_lora,
    sequence_collective,
)


@keras.saving.register_keras_serializable(package="zoo")
class RowParallelDense(_TensorParallelDense):
    """Megatron's row-parallel linear layer, as a ``keras.layers.Dense``.

    Under a distribution whose mesh has ``model_axis`` (size N > 1) each device holds
    kernel [C_in/N, units] and multiplies its slice of the input features, e.g. a
    ``ColumnParallelDense`` output that never left its device; the partial sums are
    all-reduced over the model axis (one collective forward, none backward), then the
    bias (replicated) is added. With no distribution, or no such axis, or N = 1, it
    is a ``Dense`` with the same numbers.

    Shapes (global): inputs (B, ..., C_in), split over the model axis on the last
    dimension (a replicated input is sliced locally, no communication) -> outputs
    (B, ..., units), replicated over the model axis. With ``megatron_sp=True``
    the sum is reduce-scattered over the sequence instead: (B, T, C_in/N) per device
    -> (B, T/N, units).

    Args:
        units: output features.
        megatron_sp: reduce-scatter the output over the sequence (dim 1).
        collective_matmul: overlap that reduce-scatter with the matmul in N chunks
            (``zoo.kernels.matmul_reduce_scatter``); needs ``megatron_sp``.
        model_axis: the mesh axis the kernel is split over.
        **kwargs: everything ``keras.layers.Dense`` takes.

    Weights and their layouts (set when created):

    =============  =============  ==========
    weight         shape          layout
    =============  =============  ==========
    kernel         (C_in, units)  (model, -)
    bias           (units,)       replicated
    lora_kernel_a  (C_in, r)      (model, -)
    lora_kernel_b  (r, units)     replicated
    =============  =============  ==========

    Input features C_in must divide by the model-axis size. Under ``fsdp+tp`` (the
    distribution's ``weight_shard_axis``) the kernel is (model, data): also split over
    ``data`` on its units, all-gathered over it inside the ``shard_map`` just in time.
    """

    WEIGHT_AXES = {
        "kernel": ("model", "shard"),
        "bias": (None,),
        "lora_kernel_a": ("model", None),
        "lora_kernel_b": (None, None),
    }
    SPLIT = "input features"
    KIND = "row-parallel Dense"

    def activation_specs(self, plan, rank):
        inputs = activation_spec(plan, rank, features=True)  # (B, T, ..., C_in/N)
        return inputs, activation_spec(plan, rank, sequence=self.megatron_sp)  # (B, T[/N], ..., units)

    def _local_call(self, x, weights, plan):
        kernel, bias = self.local_kernel(weights, plan), weights.get("bias")  # [C_in/N, units], [units]
        lora = self.local_lora(weights)  # (a [C_in/N, r], b [r, units], alpha / r) or None
        if lora is not None:  # factored, summed with the partial products: no extra collective
            return row_matmul_with_lora(
                x,
                kernel,
                lora,
                axis_name=self.model_axis,
                bias=bias,
                megatron_sp=self.megatron_sp,
                collective=self.collective_matmul,
            )
        if self.megatron_sp:
            return sequence_parallel_row_matmul(
                x, kernel, axis_name=self.model_axis, bias=bias, collective=self.collective_matmul
            )  # [B, T/N, units]
        return row_parallel_matmul(x, kernel, axis_name=self.model_axis, bias=bias)  # [B, ..., units]

    def collectives(self):
        """The collectives a call runs over the model axis, in words."""
        if self.megatron_sp:
            return sequence_collective("reduce-scatter of the output", self.collective_matmul)
        return "all-reduce of the output per call"
