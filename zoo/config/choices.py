"""Every closed set of names the zoo accepts, defined once (docs/architecture.md, "Vocabulary").

Code, command-line flags, recipe keys and docs all take their choices from here.
"""

from zoo.config.layouts import (
    BASIC,
    CLASSIFIER_FINETUNE,
    DATA,
    LAYOUT_TABLE,
    PLANNED,
    SCANNED,
    TRANSFORMER,
    WEIGHT_MAP,
    layouts_in,
    layouts_where,
)

# layout: how the weights and the inputs are split over the devices (zoo.distribution); each
# layout's meaning is its record in zoo.config.layouts.LAYOUT_TABLE, and these sets come from it.
BASIC_LAYOUTS = layouts_in(BASIC)  # every model; "model" uses its own layout map
TRANSFORMER_LAYOUTS = layouts_in(TRANSFORMER)  # get_layout_map(mesh, layout=...) of the Transformer models
# the GPT's Mixture-of-Experts layouts: experts over an "expert" mesh axis, the batch over data x expert
EXPERT_LAYOUTS = layouts_where(lambda layout: layout.expert_axis is not None)
# expert_exchange: how an MoE layer's tokens travel over the expert axis: padded all_to_all
# buffers (any backend), or exactly the routed rows (ragged_all_to_all: GPU/TPU, dropless)
EXPERT_EXCHANGES = ("all_to_all", "ragged")
# grouped_matmul: how the expert MLPs run over their token groups (blocks: a loop over row blocks, for XLA:CPU)
GROUPED_MATMULS = ("ragged_dot", "megablox", "blocks")
LAYOUTS = tuple(LAYOUT_TABLE)
CNN_LAYOUTS = BASIC_LAYOUTS  # zoo train cnn
COMMS_MODELS = ("mlp", "cnn")  # zoo comms: a tensor-parallel MLP block, SmallCNN
COMMS_STEPS = ("forward", "backward", "train")  # zoo comms --step
TRANSFORMER_JOB_LAYOUTS = ("single", "data") + TRANSFORMER_LAYOUTS  # zoo train gpt | encoder | vit
WEIGHT_LAYOUTS = layouts_in(WEIGHT_MAP)  # layouts a Transformer's layout map describes
CLASSIFIER_FINETUNE_LAYOUTS = layouts_in(CLASSIFIER_FINETUNE)  # zoo finetune of a classifier preset
PLANNED_LAYOUTS = layouts_in(PLANNED)  # what zoo plan --auto searches
AUTO = "auto"  # zoo train gpt --layout auto: the planner's choice
WHOLE = "whole"  # --loss-chunk-size whole: the loss from the whole logits (auto may chunk them)

# context_attention: the sequence-parallel attention kernel under the context layout.
CONTEXT_ATTENTIONS = ("gather", "ring", "ulysses")
DEFAULT_CONTEXT_ATTENTION = "ring"  # what runs under the context layout when no kernel is named
# balance: causal load balancing of the sequence order under the context layout (None: none).
BALANCES = (None, "zigzag", "striped")

# method: what a fine-tune trains (qlora: LoRA over a base quantized to int8 or int4; causal LMs).
METHODS = ("frozen", "lora", "qlora", "full")
CLASSIFIER_METHODS = ("frozen", "lora", "full")
QUANTIZATIONS = ("int8", "int4")  # --quantize: how qlora stores the frozen base's kernels
ADAPTER_FORMATS = ("zoo", "peft")  # zoo finetune's LoRA adapter file: lora.weights.h5, or a PEFT folder
LORA_WEIGHTS = ("lora_kernel_a", "lora_kernel_b")  # the LoRA factors Keras adds to Dense / EinsumDense

# precision: the Keras dtype policy a job trains under: float32, or mixed_bfloat16 (bf16 compute,
# float32 weights); a GPT's pre-training also bfloat16 (bf16 weights and compute, the zoo's
# AdamW rounding each update stochastically: zoo.training.optimizers).
PRECISIONS = ("float32", "mixed_bfloat16")
TRAIN_PRECISIONS = (*PRECISIONS, "bfloat16")


def compute_bytes(precision):
    """Bytes an activation element takes under ``precision``: 2 in bfloat16 compute, else 4."""
    return 4 if precision == "float32" else 2


def weight_bytes(precision):
    """Bytes a weight takes under ``precision``: 2 for bfloat16 weights, else 4 (float32 master weights)."""
    return 2 if precision == "bfloat16" else 4


FLOAT_DTYPES = ("float32", "bfloat16")  # AdamW's moments (--moment-dtype); zoo bench window's q, k, v
SECOND_MOMENTS = ("full", "factored")  # AdamW's second moment (--second-moment): whole, or row and column means
# where AdamW's moments live between steps (--state-memory): the device's memory, or the host's
# (pinned host memory, JAX's memory kinds), moved to the device for each update and back
STATE_MEMORIES = ("device", "host")
PINNED_HOST = "pinned_host"  # JAX's memory kind of the host memory "host" means (a device reaches it directly)
# remat: what each Transformer block keeps for the backward pass (zoo.layers._remat.REMAT_POLICIES).
REMATS = ("none", "full", "dots_saveable", "save_attention", "offload_attention")
PLANNED_REMATS = ("none", "dots_saveable", "full")  # what zoo plan --auto tries (the attention policies: by hand)
# --remat auto (zoo.training.remat_choice): the policies a job tries on an accelerator, fastest first as
# measured on a TPU v5e (docs/performance.md); the first whose compiled step fits the device is kept.
REMATS_FASTEST_FIRST = ("none", "save_attention", "dots_saveable", "full")
JOB_REMATS = (AUTO, *REMATS)  # what zoo train gpt, zoo finetune and zoo bench step take
# The names a block gives the tensors a remat policy keeps (jax.ad_checkpoint.checkpoint_name):
ATTENTION_QKV = "attention_qkv"  # the q, k, v projections (B, T, H or K, D), before rotary
ATTENTION_OUT = "attention_out"  # the attention kernel's output (B, T, H, D) and its log-sum-exp
# schedule: how a pipeline (the pipeline layout) orders its micro-batches over the stages.
SCHEDULES = ("gpipe", "circular")
DATA_AXIS_LAYOUTS = layouts_where(lambda layout: layout.axes == (DATA,))  # a mesh of data alone
# the layouts a scan_layers GPT (one loop over its stacked blocks) runs under: the block's
# weights placed by layout rules on the stack, a model axis GSPMD's (Megatron's split), and
# where the tokens or experts are split (tp+sp, context, the expert layouts) the layers' own kernels
SCANNED_LAYOUTS = layouts_in(SCANNED)

# Transformer architecture.
MLPS = ("swiglu", "geglu", "geglu_tanh", "gelu", "gelu_tanh", "relu")  # *_tanh: tanh-approximate GELU (Gemma, GPT-2)
GATED_MLPS = ("swiglu", "geglu", "geglu_tanh")  # the MLPS with a gate: three weight matrices
NORMS = ("rms", "layer", "rms_offset")  # rms_offset: RMSNorm times (1 + weight), Gemma's
POOLINGS = ("cls", "mean")  # how a classifier reduces its tokens to one vector
POSITION_EMBEDDINGS = ("learned", "rotary")  # the encoder classifier's positions
# Hugging Face config.json model_types the zoo GPT loads and exports (docs/checkpoints-hf.md)
HF_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "mixtral", "qwen2_moe", "qwen3_moe", "gemma2", "gemma3_text")
# zoo export --dtype: how the exported safetensors store the weights (None: as the model holds them)
EXPORT_DTYPES = (None, "float32", "bfloat16", "float16")

# generation
SAMPLERS = ("greedy", "top_k", "top_p")
# zoo verify's optimizers
OPTIMIZERS = ("sgd", "adam")
# recipes
PLATFORMS = ("cpu", "gpu", "tpu")
