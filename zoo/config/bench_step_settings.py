"""Settings of ``zoo bench step``: one training step of a named GPT measured on the devices JAX finds.

Pure Python (no JAX, no Keras), like every ``zoo.config`` module. The model fields carry
the training job's names (``zoo train gpt``, ``zoo finetune``): ``config_name``,
``num_layers``, ``sequence_length``, ``batch_size``, ``precision``, ``remat``,
``scan_layers``, ``loss_chunk_size``, ``method``, ``lora_rank``.
"""

import dataclasses

from zoo.config import choices, types
from zoo.config.schema import SettingError, setting
from zoo.config.settings import moment_dtype_setting, second_moment_setting, state_memory_setting

# What the measured step trains: the pre-training job's step (AdamW, cosine schedule,
# clipping: zoo train gpt), or zoo finetune's (Adam) of every weight or of LoRA factors.
STEP_METHODS = ("train", "full", "lora", "qlora")
# keras-hub backbones the same sizes can be run in, beside the zoo's GPT (--peer).
STEP_PEERS = ("keras-hub",)


@dataclasses.dataclass
class StepBenchSettings:
    """Settings of ``zoo bench step``: the training step of a named GPT on this host's devices (TPU, GPU or CPU)."""

    config_name: str = setting("gpt_1b", "named size (zoo.models.GPT_CONFIGS)", section="bench")
    num_layers: int | None = setting(
        None, "overrides the named config's depth L; default: the config's", section="bench", parse=types.positive_int
    )
    method: str = setting(
        "train",
        "train: zoo train gpt's step (AdamW, every weight); full: zoo finetune --method full (Adam); "
        "lora: zoo finetune --method lora (Adam on the LoRA factors, the rest frozen); qlora: the same over a base "
        "built quantized (--quantize)",
        section="bench",
        choices=STEP_METHODS,
    )
    lora_rank: int = setting(
        16, "methods lora, qlora: rank r of the factors", section="bench", parse=types.positive_int
    )
    quantize: str | None = setting(
        None,
        "method qlora: the base's kernels built in int8 or int4 (random values drawn on the device, std 0.02), the "
        "embedding and LM head in the compute dtype; default int8",
        section="bench",
        choices=choices.QUANTIZATIONS,
    )
    sequence_length: int = setting(2048, "tokens per example (T)", section="bench", parse=types.sequence_length)
    batch_size: int = setting(
        2, "global batch (examples per step over all devices)", section="bench", parse=types.positive_int
    )
    precision: str = setting(
        "mixed_bfloat16",
        "Keras dtype policy: mixed_bfloat16 (bf16 compute, float32 weights and optimizer), bfloat16 (bf16 weights "
        "too, AdamW rounding each update stochastically) or float32",
        section="bench",
        choices=choices.TRAIN_PRECISIONS,
    )
    remat: str = setting(
        "none",
        "what each block keeps for the backward pass (zoo train gpt --remat; auto: the first of none, "
        "save_attention, dots_saveable, full whose compiled step fits the device)",
        section="bench",
        choices=choices.JOB_REMATS,
    )
    scan_layers: bool = setting(
        False, "hold the blocks stacked and run them in one lax.scan", section="bench", store_true=True
    )
    loss_chunk_size: int | str | None = setting(
        choices.AUTO,
        "compute the loss t positions of every row at a time (never the whole float32 logits); whole: from the "
        "whole logits; auto: as zoo train gpt chooses (chunks of 512 on a TPU or GPU where the float32 logits per "
        "device exceed 1/8 of its memory)",
        section="bench",
        parse=types.loss_chunk,
    )
    moment_dtype: str = moment_dtype_setting(
        "the optimizer's (AdamW for method train, Adam for full and lora)", "bench"
    )
    second_moment: str = second_moment_setting("the optimizer's", "bench")
    state_memory: str = state_memory_setting("the optimizer's", "bench")
    steps: int = setting(
        10,
        "N: a step is timed as what a fit of 2N steps takes more than a fit of N",
        section="bench",
        parse=types.positive_int,
    )
    repeats: int = setting(
        3,
        "interleaved pairs of timed fits (N and 2N steps); the median step is reported",
        section="bench",
        parse=types.positive_int,
    )
    profile: bool = setting(
        False,
        "also trace 3 steps with the JAX profiler and say where the device's time goes, per part of the model "
        "(accelerators: the trace names each op)",
        section="bench",
        store_true=True,
    )
    plan: bool = setting(
        False,
        "also ask zoo plan for the same step on this device kind (compiled on CPU in a subprocess): its peak "
        "memory and step time beside the measured ones",
        section="bench",
        store_true=True,
    )
    peer: str | None = setting(
        None,
        "also run the same sizes in this library's Llama (keras-hub: LlamaBackbone + LlamaCausalLM, its best of "
        "flash attention on/off), parameter counts checked equal, in a subprocess after the zoo's",
        section="bench",
        choices=STEP_PEERS,
    )
    peak_tflops: float | None = setting(
        None,
        "device peak dense TFLOP/s for MFU; default: looked up from the device kind",
        section="bench",
        parse=types.positive_float,
    )
    seed: int = setting(0, "seed of the weights and the random tokens", section="bench", parse=types.non_negative_int)
    output: str | None = setting(None, "also write the markdown report to this file", section="bench", metavar="FILE")

    def __post_init__(self):
        if self.precision not in choices.PRECISIONS and self.method != "train":
            raise SettingError(
                f"StepBenchSettings.precision (--precision) = {self.precision!r} trains bfloat16 weights with the zoo's "
                f"AdamW (method train); method {self.method!r} takes {' or '.join(choices.PRECISIONS)}"
            )
        if self.quantize is not None and self.method != "qlora":
            raise SettingError(
                f"StepBenchSettings.quantize (--quantize) = {self.quantize!r} is a setting of method qlora, not of "
                f"method {self.method!r}: leave it out, or use --method qlora"
            )
