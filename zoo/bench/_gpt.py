"""What the GPT memory benchmarks (LoRA context, pipeline, MoE) share: the Llama-3.2-1B
arguments without its sizes (each benchmark's settings give those), the model built
under a dtype policy, and the one way they compile it (AdamW, one step)."""

import keras

from zoo.models import GPTCausalLM
from zoo.models.gpt import GPT_CONFIGS
from zoo.models.gpt.gpt_backbone import GPTBackbone

# The size arguments a benchmark's settings set (its Llama32Sizes fields)
SIZES = (
    "vocabulary_size",
    "num_layers",
    "hidden_dim",
    "num_query_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_dim",
)
# Llama-3.2-1B's arguments but its sizes: the named config
LLAMA_3_2_1B = {name: value for name, value in GPT_CONFIGS["llama_3_2_1b"].items() if name not in SIZES}


def build_model(arguments, precision):
    """``GPTCausalLM(backbone=GPTBackbone(**arguments))`` under the dtype policy ``precision``."""
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(precision)
    try:
        return GPTCausalLM(backbone=GPTBackbone(**arguments))
    finally:
        keras.config.set_dtype_policy(previous)


def compile_model(model):
    """The training job's own compile (``zoo.training.gpt.compile_gpt``: AdamW, clipping), one step."""
    from zoo.training.gpt import compile_gpt

    compile_gpt(model, learning_rate=1e-4, total_steps=1)
