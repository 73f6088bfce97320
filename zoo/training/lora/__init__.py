"""LoRA: low-rank adapters on a model's Dense / EinsumDense layers, their files, and
PEFT's format.

- ``enable_lora`` puts rank-r factors on the layers (``zoo.training.lora._layers``: which
  layers, how each factor is laid out, the factored call), ``merge_lora`` folds them into
  the kernels, ``is_lora_variable`` / ``lora_parameter_count`` / ``lora_layers`` read them.
- ``save_lora`` / ``load_lora``: the zoo's adapter file (``lora.weights.h5``).
- ``zoo.training.lora.peft_adapters``: ``adapter_config.json`` + ``adapter_model.safetensors``,
  as ``peft.PeftModel.from_pretrained`` reads them, written and read.
"""

from zoo.training.lora._files import check_lora_file, load_lora, save_lora
from zoo.training.lora._layers import (
    LORA_WEIGHTS,
    adapted_layer_count,
    enable_lora,
    in_layers_form,
    is_lora_variable,
    kernel_path,
    layer_prefix,
    lora_layers,
    lora_parameter_count,
    lora_target_layers,
    merge_lora,
)
from zoo.training.lora.peft_adapters import is_peft_adapter, load_peft_adapter, save_peft_adapter

__all__ = [
    "LORA_WEIGHTS",
    "adapted_layer_count",
    "check_lora_file",
    "enable_lora",
    "in_layers_form",
    "is_lora_variable",
    "is_peft_adapter",
    "kernel_path",
    "layer_prefix",
    "load_lora",
    "load_peft_adapter",
    "lora_layers",
    "lora_parameter_count",
    "lora_target_layers",
    "merge_lora",
    "save_lora",
    "save_peft_adapter",
]
