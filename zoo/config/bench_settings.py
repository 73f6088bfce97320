"""The settings of the ``zoo bench`` commands: one dataclass each (``zoo.config.schema``);
``moe``, ``peers`` and ``step`` have theirs in ``bench_moe_settings``,
``bench_peers_settings`` and ``bench_step_settings``. Each field is the flag of the same name (``head_dim`` -> ``--head-dim``) with the same
default, range and help; ``zoo.bench.<module>.run_benchmark(settings)`` takes the
instance. Pure Python (no JAX, no Keras): ``zoo bench X --help`` builds from here.
"""

import argparse
import dataclasses

from zoo.config import _bench_fields as fields
from zoo.config import choices, layouts, renamed, types
from zoo.config.bench_moe_settings import MOE_SECTIONS, MoEBenchSettings, capacity_factor_list  # noqa: F401 (moved)
from zoo.config.bench_peers_settings import PEERS_LAYOUTS, PeersBenchSettings  # noqa: F401 (moved)
from zoo.config.schema import setting

# The benchmarks' own closed sets (defined here once; zoo.bench imports them).
GPT_BENCH_LAYOUTS = ("data", "tp", "context")  # zoo bench gpt: the layouts it measures
TP_VARIANTS = (
    "mlp",
    "gated",
    "sp",
    "gated-sp",
)  # zoo bench tp: MLPs; "sp" = Megatron sequence parallelism (megatron_sp)
SCALE_SECTIONS = ("recipes", "attention", layouts.FSDP_TP, layouts.TP)  # zoo bench scale: its tables
PLAN_SECTIONS = ("recipes", "scale", "auto", "depth")  # zoo bench plan: its tables
PIPELINE_SECTIONS = ("bubble", "memory")  # zoo bench pipeline: its tables
WINDOW_SECTIONS = ("blockwise", "context")  # zoo bench window: its tables
SCALE_RECIPES = (
    "recipes/gpu-1/pretrain_gpt.toml",
    "recipes/gpu-8/pretrain_gpt.toml",
    "recipes/gpu-multihost/pretrain_gpt.toml",
    "recipes/tpu-v4-8/pretrain_gpt.toml",
    "recipes/tpu-v5e-8/pretrain_gpt.toml",
    "recipes/tpu-multihost/pretrain_gpt.toml",
)


def context_runs(text):
    """``"data=8:8;data=1,seq=8:1"`` -> ``("data=8:8", "data=1,seq=8:1")``: ``<mesh>:<global batch>`` runs."""
    runs = tuple(part.strip() for part in text.split(";") if part.strip())
    if not runs or any(":" not in run for run in runs):
        raise argparse.ArgumentTypeError(
            f"expected ';'-separated '<mesh>:<global batch>' runs such as 'data=8:8;data=1,seq=8:1', got {text!r}"
        )
    return runs


def layout_runs(text):
    """``"fsdp:data=8;tp:data=2,model=4"`` -> ``("fsdp:data=8", "tp:data=2,model=4")``:
    ``<layout>:<mesh>`` runs, each layout one a Transformer's layout map describes."""
    runs = tuple(part.strip() for part in text.split(";") if part.strip())
    layouts = [run.split(":", 1)[0] for run in runs]
    if not runs or any(":" not in run or layout not in choices.WEIGHT_LAYOUTS for run, layout in zip(runs, layouts)):
        raise argparse.ArgumentTypeError(
            f"expected ';'-separated '<layout>:<mesh>' runs such as 'fsdp:data=8;tp:data=2,model=4', each layout one of "
            f"{','.join(choices.WEIGHT_LAYOUTS)}, got {text!r}"
        )
    return runs


@dataclasses.dataclass
class CNNBenchSettings:
    """Settings of ``zoo bench cnn``: images/s of ``model.fit`` vs a hand-written ``jax.jit`` step."""

    image_size: int = setting(
        64, "square images drawn in memory, any size >= 16", section="bench", parse=types.generated_image_size
    )
    batch_size: int = fields.count(64, "global batch; divides by the data axis (8 and 2 here)")
    steps: int = fields.count(20, "timed optimizer steps per measurement (= one fit epoch)")
    repeats: int = fields.count(3, "alternating fit / jit measurements; the median of each is reported")
    output: str | None = fields.output()


@dataclasses.dataclass
class GPTBenchSettings:
    """Settings of ``zoo bench gpt``: tokens/s of ``model.fit`` vs a hand-written ``jax.jit`` step."""

    config_name: str = setting("gpt_small", "named size (zoo.models.GPT_CONFIGS)", section="bench")
    sequence_length: int = setting(
        128, "tokens per example (T); divides by the seq axis", section="bench", parse=types.sequence_length
    )
    batch_size: int = fields.count(32, "global batch; divides by the data axis")
    steps: int = fields.count(10, "timed optimizer steps per measurement (= one fit epoch)")
    repeats: int = fields.count(3, "alternating fit / jit measurements; the median of each is reported")
    layouts: tuple = setting(
        GPT_BENCH_LAYOUTS,
        f"comma-separated layouts measured, of {','.join(GPT_BENCH_LAYOUTS)}",
        section="bench",
        parse=types.comma_separated(GPT_BENCH_LAYOUTS, "layout"),
        metavar="LAYOUTS",
    )
    output: str | None = fields.output()


@dataclasses.dataclass
class AttentionBenchSettings:
    """Settings of ``zoo bench attention``: per-device memory and time of sequence-parallel attention."""

    lengths: tuple = setting(
        (4096, 16384, 65536),
        "comma-separated sequence lengths T of the memory table (compiled only, never run)",
        section="bench",
        parse=types.positive_ints,
        metavar="T,T",
    )
    devices: tuple = setting(
        (4, 8),
        "comma-separated sizes N of the 'seq' mesh axis",
        section="bench",
        parse=types.positive_ints,
        metavar="N,N",
    )
    heads: int = fields.count(8, "attention heads H = K (MHA)")
    head_dim: int = fields.count(64, "head dim D")
    batch: int = fields.count(1, "batch size B")
    causal: bool = setting(
        True, "causal attention (--no-causal: full; the ring then visits every tile)", section="bench"
    )
    block_size: int = fields.count(512, "ring tile edge (MultiHeadAttention's ring_block_size)")
    balance: str | None = setting("zigzag", "ring's causal load balancing", section="bench", choices=choices.BALANCES)
    time_lengths: tuple = setting(
        (4096,),
        "comma-separated T timed for every kernel and N, at --heads heads",
        section="bench",
        parse=types.positive_ints,
        metavar="T,T",
    )
    goal_length: int = fields.count(16384, "T of the goal 'ring time <= all-gather time'")
    goal_heads: int = fields.count(1, "heads of that timing (all-gather at 8 heads needs ~40 GiB of host memory)")
    goal_devices: int = fields.count(8, "N of that timing")
    repeats: int = fields.count(3, "timed runs per kernel after one warm-up; the median is kept")
    memory_limit_gib: float = setting(
        8.0,
        "skip a timing whose N devices together need more host memory (GiB)",
        section="bench",
        parse=types.positive_float,
    )
    output: str | None = fields.output()
    plot: str | None = fields.plot("per-device memory against T, one line per kernel and N")


@dataclasses.dataclass
class ContextBenchSettings:
    """Settings of ``zoo bench context``: per-device memory of a GPT training step, data- vs context-parallel."""

    sequence_length: int = setting(16384, "tokens per sequence (T)", section="bench", parse=types.sequence_length)
    runs: tuple = setting(
        ("data=8:8", "data=1,seq=8:1", "data=2,seq=4:2", "data=1,seq=8:8"),
        "';'-separated '<mesh>:<global batch>' runs; a mesh with a 'seq' axis is context-parallel",
        section="bench",
        parse=context_runs,
        metavar="RUNS",
    )
    layers: int = fields.count(2, "Transformer blocks L")
    width: int = fields.count(256, "model width C")
    heads: int = fields.count(8, "attention heads H = K (MHA)")
    head_dim: int = fields.count(32, "head dim D")
    hidden_dim: int = fields.count(1024, "MLP hidden features F (4C)")
    vocab: int = fields.count(256, "vocabulary size V (byte-level)")
    context_attention: str = setting(
        choices.DEFAULT_CONTEXT_ATTENTION,
        "the context-parallel runs' attention kernel",
        section="bench",
        choices=choices.CONTEXT_ATTENTIONS,
    )
    balance: str | None = setting(
        "zigzag", "causal load balancing of the context-parallel runs", section="bench", choices=choices.BALANCES
    )
    output: str | None = fields.output()
    plot: str | None = fields.plot("per-device temporary memory and bytes sent per run (layout)")


@dataclasses.dataclass
class TPBenchSettings:
    """Settings of ``zoo bench tp``: bytes moved by the explicit tensor-parallel MLP vs GSPMD vs Megatron's minimum."""

    mesh: str = setting("data=2,model=4", "mesh with axes data and model (model > 1)", section="bench")
    batch_size: int = fields.count(8, "global batch B; divides by the data axis")
    sequence_length: int = fields.count(256, "T; divides by the model axis (Megatron sequence parallelism)")
    dim: int = fields.count(256, "model width C (MLP input and output)")
    hidden: int = fields.count(1024, "hidden features F; divides by the model axis")
    steps: int = fields.count(5, "forward + backward passes per timed measurement")
    repeats: int = fields.count(3, "alternating explicit / GSPMD measurements; the median of each")
    variants: tuple = setting(
        TP_VARIANTS,
        f"comma-separated MLPs, of {','.join(TP_VARIANTS)} (sp: Megatron sequence parallelism)",
        section="bench",
        parse=types.comma_separated(TP_VARIANTS, "variant"),
        metavar="VARIANTS",
    )
    fast_compile: bool = setting(
        False, "skip LLVM optimisation: same bytes and memory, times meaningless", section="bench"
    )
    output: str | None = fields.output()
    plot: str | None = fields.plot(
        "bytes each device sends over 'model' per implementation, against Megatron's minimum"
    )


@dataclasses.dataclass
class ScaleBenchSettings:
    """Settings of ``zoo bench scale``: gpt_1b at real size, compile-only (one process per device count)."""

    recipes: tuple = setting(
        SCALE_RECIPES,
        "comma-separated recipe files whose step is compiled at full depth",
        section="bench",
        parse=fields.separated(",", "comma-separated recipe files", "recipes/gpu-8/pretrain_gpt.toml"),
        metavar="FILES",
    )
    fsdp_tp_meshes: tuple = setting(
        ("data=16,model=4", "data=64,model=4"),
        "';'-separated meshes of the fsdp+tp weights table",
        section="bench",
        parse=fields.separated(";", "';'-separated meshes", "data=16,model=4;data=64,model=4"),
        metavar="MESHES",
    )
    attention_seq: int = fields.count(4, "'seq' axis size of the sequence-parallel attention rows")
    tp_mesh: str = setting("data=2,model=4", "mesh of the tensor-parallel bytes table", section="bench")
    tp_layers: int = fields.count(4, "tensor-parallel bytes table: Transformer blocks L")
    tp_width: int = fields.count(512, "tensor-parallel bytes table: model width C")
    tp_length: int = fields.count(1024, "tensor-parallel bytes table: sequence length T")
    tp_batch: int = fields.count(8, "tensor-parallel bytes table: global batch B")
    sections: tuple = setting(
        SCALE_SECTIONS,
        f"comma-separated tables, of {','.join(SCALE_SECTIONS)}",
        section="bench",
        parse=types.comma_separated(SCALE_SECTIONS, "section"),
        metavar="SECTIONS",
    )
    output: str | None = fields.output()


@dataclasses.dataclass
class PlanBenchSettings:
    """Settings of ``zoo bench plan``: zoo plan on every recipe, gpt_1b at 64/256 devices, the planner's scenarios."""

    sections: tuple = setting(
        PLAN_SECTIONS,
        f"comma-separated tables, of {','.join(PLAN_SECTIONS)}",
        section="bench",
        parse=types.comma_separated(PLAN_SECTIONS, "section"),
        metavar="SECTIONS",
    )
    recipes: str = setting("recipes/*/*.toml", "glob of the recipe files planned", section="bench")
    top: int = fields.count(3, "auto: candidates compiled per scenario")
    output: str | None = fields.output()


@dataclasses.dataclass
class Llama32Sizes:
    """Llama-3.2-1B's sizes (its config.json), the model of the long-context and loading
    benchmarks; tied embeddings and llama3 RoPE are fixed in the benchmarks."""

    vocabulary_size: int = fields.count(128256, "vocabulary V (Llama 3)")
    num_layers: int = fields.count(16, "Transformer blocks L")
    hidden_dim: int = fields.count(2048, "model width C")
    num_query_heads: int = fields.count(32, "query heads H")
    num_key_value_heads: int = fields.count(8, "key/value heads K (GQA)")
    head_dim: int = fields.count(64, "head dim D")
    intermediate_dim: int = fields.count(8192, "SwiGLU hidden features F")
    output: str | None = fields.output()


@dataclasses.dataclass
class LMHeadBenchSettings(Llama32Sizes):
    """Settings of ``zoo bench lm-head``: under fsdp, the LM head's gather (its weight or the batch's activations) chosen by size vs each forced, compile-only."""

    num_layers: int = fields.count(2, "Transformer blocks L (the head's collectives do not depend on depth)")
    devices: tuple = setting(
        (8, 64),
        "comma-separated device counts N of the data axis (simulated CPU devices)",
        section="bench",
        parse=types.positive_ints,
        metavar="N,N",
    )
    per_device_batches: tuple = setting(
        (1, 4), "comma-separated sequences per device b", section="bench", parse=types.positive_ints, metavar="B,B"
    )
    heads: tuple = setting(
        ("tied", "untied"),
        "comma-separated LM heads: tied (the token table, x @ E^T) and untied (a (C, V) kernel)",
        section="bench",
        parse=types.comma_separated(("tied", "untied"), "head"),
        metavar="HEADS",
    )
    sequence_length: int = fields.count(2048, "tokens per sequence T")
    precision: str = fields.precision()
    output: str | None = fields.output()


@dataclasses.dataclass
class LoraContextBenchSettings(Llama32Sizes):
    """Settings of ``zoo bench lora-context``: per-device memory of LoRA fine-tuning a Llama-3.2-1B-sized GPT at long context, compile-only."""

    sequence_lengths: tuple = setting(
        (8192, 32768, 131072),
        "comma-separated sequence lengths T; each divides by 2 x the seq axis (zigzag)",
        section="bench",
        parse=types.positive_ints,
        metavar="T,T",
    )
    layouts: tuple = setting(
        ("context", "fsdp"),
        "comma-separated layouts compared: context (mesh data=1,seq=N, batch 1) and fsdp "
        "(mesh data=N, batch N: one sequence per device)",
        section="bench",
        parse=types.comma_separated(choices.LAYOUTS, "layout"),
        metavar="LAYOUTS",
    )
    devices: int = fields.count(8, "devices N the step is compiled for (simulated CPU devices)")
    remats: tuple = setting(
        ("full", "none"),
        f"comma-separated remat policies of the blocks, of {','.join(choices.REMATS)}",
        section="bench",
        parse=types.comma_separated(choices.REMATS, "remat"),
        metavar="REMATS",
    )
    precision: str = fields.precision()
    lora_rank: int = fields.count(16, "LoRA rank r on every Dense / EinsumDense (only the LoRA factors train)")
    context_attention: str = setting(
        choices.DEFAULT_CONTEXT_ATTENTION,
        "layout context: the sequence-parallel attention kernel",
        section="bench",
        choices=choices.CONTEXT_ATTENTIONS,
    )
    balance: str | None = setting(
        "zigzag",
        "layout context: causal load balancing of the sequence order",
        section="bench",
        choices=choices.BALANCES,
    )
    loss_chunk_size: int | None = setting(
        None,
        "the loss in chunks of t positions per row (GPTCausalLM loss_chunk_size; under context a "
        "multiple of the seq axis); default: from the whole logits",
        section="bench",
        parse=types.positive_int,
    )


@dataclasses.dataclass
class HFLoadBenchSettings(Llama32Sizes):
    """Settings of ``zoo bench hf-load``: per-device and host memory while a Llama-3.2-1B-sized Hugging Face checkpoint loads under a layout."""

    runs: tuple = setting(
        ("fsdp:data=8", "tp:data=2,model=4"),
        "';'-separated '<layout>:<mesh>' runs, each loading the checkpoint once",
        section="bench",
        parse=layout_runs,
        metavar="RUNS",
    )
    checkpoint: str | None = setting(
        None,
        "a Hugging Face folder to load (a downloaded Llama-3.2-1B, say); default: write a synthetic one "
        "of the sizes below (random bfloat16) into a temporary folder, deleted after",
        section="bench",
        metavar="DIR",
    )
    max_file_size_mb: float = setting(
        1024.0,
        "the synthetic checkpoint: files of at most this many MiB, with an index (zoo export's flag)",
        section="bench",
        parse=types.positive_float,
    )
    dtype: str | None = setting(
        None,
        "the dtype the model holds its weights in (Keras dtype policy); default Keras' float32",
        section="bench",
        choices=choices.EXPORT_DTYPES,
    )


@dataclasses.dataclass
class PipelineBenchSettings(Llama32Sizes):
    """Settings of ``zoo bench pipeline``: the pipeline's bubble measured through the kernel, and the per-device memory of a pipelined Llama-3.2-1B-sized GPT, compile-only."""

    sections: tuple = setting(
        PIPELINE_SECTIONS,
        f"comma-separated tables, of {','.join(PIPELINE_SECTIONS)}",
        section="bench",
        parse=types.comma_separated(PIPELINE_SECTIONS, "section"),
        metavar="SECTIONS",
    )
    # bubble: the table is S = 4, M = 4..32; R = 4 costs nothing here (a tiny array)
    stages: int = fields.count(4, "bubble: stages S (a 'stage' mesh axis of S simulated devices)")
    micro_batches: tuple = setting(
        (4, 8, 16, 32),
        "bubble: comma-separated micro-batch counts M (circular: M >= S)",
        section="bench",
        parse=types.positive_ints,
        metavar="M,M",
    )
    repeats: tuple = setting(
        (1, 2, 4),
        "bubble: comma-separated repeats R (1: GPipe, >= 2: circular)",
        section="bench",
        parse=types.positive_ints,
        metavar="R,R",
    )
    # memory: the mesh the issue names; 8 simulated devices
    mesh: str = setting("data=2,stage=4", "memory: mesh of the pipelined rows (axes data and stage)", section="bench")
    # data=2: the pipelined rows' data axis, so each device holds the same rows (B/2) with all L blocks instead of L/S
    reference_mesh: str = setting(
        "data=2",
        "memory: mesh of the unpipelined reference (layout data: every weight on every device)",
        section="bench",
    )
    memory_micro_batches: tuple = setting(
        (4, 8, 16, 32),
        "memory: comma-separated micro-batch counts M; each divides the rows per data shard",
        section="bench",
        parse=types.positive_ints,
        metavar="M,M",
    )
    memory_repeats: tuple = setting(
        (1, 2),
        "memory: comma-separated repeats R (1: GPipe, 2: circular); S x R divides num_layers",
        section="bench",
        parse=types.positive_ints,
        metavar="R,R",
    )
    # 64 = 32 rows per data shard (data=2): M = 32 still gives each micro-batch a row per shard
    batch_size: int = fields.count(64, "memory: global batch B; B / data divides by every M")
    # T = 1024: a modest training context; the logits (B/2 x T x V) are already the largest activation
    sequence_length: int = setting(1024, "memory: tokens per example T", section="bench", parse=types.sequence_length)
    # none: JAX 0.10's XLA:CPU memory analysis does not show remat (compiled_step.memory_analysis_reflects_remat)
    remats: tuple = setting(
        ("none",),
        f"memory: comma-separated remat policies of the blocks, of {','.join(choices.REMATS)}",
        section="bench",
        parse=types.comma_separated(choices.REMATS, "remat"),
        metavar="REMATS",
    )
    # float32: under mixed_bfloat16 the pipelined step carries its micro-batches in float32 and the reference does not (docs/performance.md)
    precision: str = setting(
        "float32",
        "memory: Keras dtype policy of the model (float32 weights and AdamW slots either way)",
        section="bench",
        choices=choices.PRECISIONS,
    )


@dataclasses.dataclass
class WindowBenchSettings:
    """Settings of ``zoo bench window``: what a sliding window W saves in every attention kernel (tiles, memory, ring hops and bytes), compile-only and counted through the kernels' code paths."""

    sections: tuple = setting(
        WINDOW_SECTIONS,
        f"comma-separated tables, of {','.join(WINDOW_SECTIONS)}",
        section="bench",
        parse=types.comma_separated(WINDOW_SECTIONS, "section"),
        metavar="SECTIONS",
    )
    # W = 4096: Mistral v0.1's window; both tables compare it with full causal attention
    sliding_window: int = fields.count(4096, "the window W: a query at p sees keys p - W < k <= p")
    # one head config for both tables: a shard of 8 heads of 128 (Mistral's head dim), bf16 as trained
    batch: int = fields.count(1, "batch size B")
    heads: int = fields.count(8, "query heads H; Ulysses needs H divisible by --devices")
    kv_heads: int = fields.count(8, "key/value heads K (divides H; K = H: MHA)")
    head_dim: int = fields.count(128, "head dim D")
    dtype: str = setting(
        "bfloat16", "dtype of q, k, v (softmax in float32 either way)", section="bench", choices=choices.FLOAT_DTYPES
    )
    # 512: the default block_size of every kernel (blockwise_attention, ring_attention, gather, Ulysses)
    block_size: int = fields.count(512, "tile edge of every kernel (their default)")
    # blockwise: one device, the whole sequence (issue 28: T = 32k, W = 4k)
    blockwise_length: int = setting(
        32768, "blockwise: sequence length T on one device", section="bench", parse=types.sequence_length
    )
    # context: the sequence split over a seq axis of N simulated devices (issue 28: T = 128k on 8)
    context_length: int = setting(
        131072,
        "context: sequence length T split over --devices; divides by 2N (zigzag)",
        section="bench",
        parse=types.sequence_length,
    )
    devices: int = fields.count(8, "context: devices N of the seq mesh axis (simulated CPU devices)")
    context_attentions: tuple = setting(
        choices.CONTEXT_ATTENTIONS,
        f"context: comma-separated kernels, of {','.join(choices.CONTEXT_ATTENTIONS)}",
        section="bench",
        parse=types.comma_separated(choices.CONTEXT_ATTENTIONS, "kernel"),
        metavar="KERNELS",
    )
    # none and zigzag: the ring's two schedules of issue 28 (contiguous shards; causal load balancing)
    balances: tuple = setting(
        (None, "zigzag"),
        "context: comma-separated causal load balancings, of none,zigzag,striped",
        section="bench",
        parse=types.comma_separated(choices.BALANCES, "balance"),
        metavar="BALANCES",
    )
    output: str | None = fields.output()


def __getattr__(name):
    """An old class name (``GPTTrainConfig``) gets one line naming its new one."""
    raise renamed.missing_attribute(__name__, name)
