"""Settings of ``zoo bench moe``: the expert exchange's bytes, the memory of a real-size MoE
step and the sparse layer's time (``zoo.bench.moe``). Pure Python (no JAX, no Keras)."""

import argparse
import dataclasses

from zoo.config import _bench_fields as fields
from zoo.config import choices, types
from zoo.config.schema import setting

MOE_SECTIONS = ("exchange", "memory", "time")  # zoo bench moe: its tables
MOE_METHODS = ("lora", "full")  # zoo bench moe --memory-runs: what the real-size step trains


def capacity_factor_list(text):
    """``"1.0,1.25,dropless"`` -> ``(1.0, 1.25, None)``: MoE capacity factors, each > 0 or
    ``dropless`` (None: the exchange's buffers hold every assignment)."""
    parts = [part.strip() for part in text.split(",") if part.strip()]
    values = []
    for part in parts:
        try:
            values.append(None if part == "dropless" else types.positive_float(part))
        except argparse.ArgumentTypeError:
            break
    if not parts or len(values) != len(parts):
        raise argparse.ArgumentTypeError(
            f"expected comma-separated capacity factors > 0 or 'dropless', such as 1.0,1.25,dropless, got {text!r}"
        )
    return tuple(values)


def moe_memory_runs(text):
    """``"lora:expert:data=1,expert=8;full:fsdp+expert:data=8,expert=8"`` -> the
    ``<method>:<layout>:<mesh>`` runs, method one of ``MOE_METHODS``, layout an expert layout."""
    runs = tuple(part.strip() for part in text.split(";") if part.strip())
    parts = [run.split(":", 2) for run in runs]
    if not runs or any(len(p) != 3 or p[0] not in MOE_METHODS or p[1] not in choices.EXPERT_LAYOUTS for p in parts):
        raise argparse.ArgumentTypeError(
            f"expected ';'-separated '<method>:<layout>:<mesh>' runs such as 'lora:expert:data=1,expert=8', method one of "
            f"{','.join(MOE_METHODS)} and layout one of {','.join(choices.EXPERT_LAYOUTS)}, got {text!r}"
        )
    return runs


@dataclasses.dataclass
class MoEBenchSettings:
    """Settings of ``zoo bench moe``: all-to-all bytes against the analytic minimum, expert weights per device, tokens dropped, a Mixtral-8x7B step at real size (compile-only) and the sparse layer's time against the dense-masked one."""

    sections: tuple = setting(
        MOE_SECTIONS,
        f"comma-separated tables, of {','.join(MOE_SECTIONS)}",
        section="bench",
        parse=types.comma_separated(MOE_SECTIONS, "section"),
        metavar="SECTIONS",
    )
    # exchange: a GPT MoE fit step (compile_fit_step) under layout expert, run once for the drops
    meshes: tuple = setting(
        ("data=2,expert=4", "data=1,expert=8"),
        "exchange: ';'-separated meshes of layout expert (axes data and expert)",
        section="bench",
        parse=fields.separated(";", "';'-separated meshes", "data=2,expert=4;data=1,expert=8"),
        metavar="MESHES",
    )
    capacity_factors: tuple = setting(
        (1.0, 1.25, None),
        "exchange: comma-separated capacity factors (dropless: buffers for every assignment)",
        section="bench",
        parse=capacity_factor_list,
        metavar="CF,CF",
    )
    # small but not tiny: C = 256, 8 experts of width 512, 512 tokens per device on data=2,expert=4
    num_layers: int = fields.count(2, "exchange: Transformer blocks L, each a MoE block")
    hidden_dim: int = fields.count(256, "exchange: model width C")
    num_query_heads: int = fields.count(4, "exchange: query heads H")
    num_key_value_heads: int = fields.count(2, "exchange: key/value heads K")
    num_experts: int = fields.count(8, "exchange: experts E; divides by every mesh's expert axis")
    num_experts_per_token: int = fields.count(2, "exchange: experts per token k")
    moe_intermediate_dim: int = fields.count(512, "exchange: each expert's hidden width F")
    vocabulary_size: int = fields.count(256, "exchange: vocabulary V (byte-level)")
    sequence_length: int = setting(256, "exchange: tokens per example T", section="bench", parse=types.sequence_length)
    batch_size: int = fields.count(16, "exchange: global batch B; divides by data x expert of every mesh")
    precision: str = setting(
        "float32",
        "exchange: Keras dtype policy (the exchange moves the compute dtype)",
        section="bench",
        choices=choices.PRECISIONS,
    )
    # memory: Mixtral-8x7B at real size, compiled, never run; one sequence of T tokens per device of data x expert
    memory_config: str = setting("mixtral_8x7b", "memory: named MoE size (zoo.models.GPT_CONFIGS)", section="bench")
    # LoRA on 8 devices two ways (experts 1/8 each: over expert, or over expert and F over model), full training on 64
    memory_runs: tuple = setting(
        ("lora:expert:data=1,expert=8", "lora:expert+tp:data=1,expert=4,model=2", "full:fsdp+expert:data=8,expert=8"),
        "memory: ';'-separated '<method>:<layout>:<mesh>' runs (method lora or full)",
        section="bench",
        parse=moe_memory_runs,
        metavar="RUNS",
    )
    memory_sequence_length: int = setting(
        4096, "memory: tokens per sequence T", section="bench", parse=types.sequence_length
    )
    memory_capacity_factors: tuple = setting(
        (1.0, None),
        "memory: comma-separated capacity factors (dropless: buffers for every assignment)",
        section="bench",
        parse=capacity_factor_list,
        metavar="CF,CF",
    )
    memory_partial_layers: tuple = setting(
        (),
        "memory: comma-separated block counts also compiled (flagged partial), or none; "
        "the whole depth is always compiled",
        section="bench",
        parse=fields.block_counts,
        metavar="L,L",
    )
    # full: JAX 0.10's XLA:CPU memory analysis does not show it (compiled_step.memory_analysis_reflects_remat; the report warns)
    memory_remat: str = setting("full", "memory: remat policy of the blocks", section="bench", choices=choices.REMATS)
    memory_precision: str = setting(
        "mixed_bfloat16",
        "memory: Keras dtype policy (bf16 compute, float32 weights)",
        section="bench",
        choices=choices.PRECISIONS,
    )
    # h100: 80 GiB; the MoE layers trace its grouped matmul (ragged_dot), not XLA:CPU's block loop (zoo.kernels.moe.compile_for)
    memory_target: str = setting(
        "h100",
        "memory: the device kind the step is compiled for (zoo.measure.hardware): the fits column and "
        "the grouped matmul traced",
        section="bench",
    )
    lora_rank: int = fields.count(
        16,
        "memory: LoRA rank r on every Dense / EinsumDense of the lora runs but the routers (the experts stay frozen)",
    )
    # time: one device, forward + backward, the layer's own grouped matmul against every expert on every token
    time_tokens: int = fields.count(4096, "time: tokens N of one forward + backward")
    time_width: int = fields.count(512, "time: model width C")
    time_intermediate_dim: int = fields.count(1024, "time: each expert's hidden width F")
    time_experts: int = fields.count(8, "time: experts E")
    time_experts_per_token: int = fields.count(2, "time: experts per token k")
    time_grouped_matmuls: tuple = setting(
        (),
        "time: comma-separated grouped matmuls of the sparse layer, each a row "
        f"(of {','.join(choices.GROUPED_MATMULS)}; none given: the layer's default on this backend)",
        section="bench",
        parse=types.comma_separated(choices.GROUPED_MATMULS, "grouped matmul"),
        metavar="MATMULS",
    )
    time_precision: str = setting(
        "float32",
        "time: Keras dtype policy of the layer and the dense-masked computation (bf16 compute, float32 weights)",
        section="bench",
        choices=choices.PRECISIONS,
    )
    steps: int = fields.count(2, "time: forward + backward passes per timed measurement")
    repeats: int = fields.count(5, "time: alternating sparse / dense measurements; the median of their ratios")
    output: str | None = fields.output()
