"""The settings of every job: one dataclass each, the single source of its names.

Each field is a flag (``batch_size`` -> ``--batch-size``) and a recipe key (``[train]
batch_size``) under the same name, with the same default, range and help
(``zoo.config.schema``). Constructing a settings object checks every value, so the
Python API refuses what the command line refuses, in the same words.
"""

import dataclasses

from zoo.config import choices, renamed, types
from zoo.config.schema import SettingError, check_settings, setting

DATA_DIR_HELP = "TFDS data folder (default $ZOO_DATA_DIR, $TFDS_DATA_DIR, ~/tensorflow_datasets)"
MESH_HELP = "mesh spec such as data=2,model=4 or data=2,seq=4 (one axis may be -1); default: the layout's"
LAYOUT_HELP = "how weights and inputs are split over the devices (docs/distribution.md)"
# layout pipeline's settings and their defaults (micro_batches None: as many as stages, resolved with the mesh)
PIPELINE_DEFAULTS = {"micro_batches": None, "schedule": "gpipe", "repeats": 1}
# layout context's settings and their defaults (context_attention None: ring, the distribution's default)
CONTEXT_DEFAULTS = {"context_attention": None, "balance": None}


class _Checked:
    def __post_init__(self):
        check_settings(self)


# --- pieces several jobs share ---------------------------------------------------------


def _mesh():
    return setting(None, MESH_HELP, section="parallel")


def _data_dir():
    return setting(None, DATA_DIR_HELP, section="data", metavar="DIR")


def _seed(help="weight initialisation, dropout and shuffling"):
    return setting(0, help, section="train", parse=types.non_negative_int)


def _cosine_peak_learning_rate(default):
    return setting(
        default, "AdamW peak, cosine-decayed to 10% over the run", section="train", parse=types.positive_float
    )


def moment_dtype_setting(whose, section="train"):
    """The setting of an Adam optimizer's moment dtype (``zoo.training.optimizers``); ``whose``
    begins its help, e.g. "AdamW's"."""
    return setting(
        "float32",
        f"{whose} moments: float32, or bfloat16 stored with stochastic rounding (4 bytes a trained parameter less)",
        section=section,
        choices=choices.FLOAT_DTYPES,
    )


def second_moment_setting(whose, section="train"):
    """The setting of an Adam optimizer's second moment (``zoo.training.optimizers``);
    ``whose`` begins its help, e.g. "AdamW's"."""
    return setting(
        "full",
        f"{whose} second moment: full, or factored into row and column means as Adafactor keeps it "
        "(4 bytes a trained parameter less for every weight of 2 or more dimensions)",
        section=section,
        choices=choices.SECOND_MOMENTS,
    )


def state_memory_setting(whose, section="train"):
    """The setting of where an Adam optimizer's moments live between steps
    (``zoo.training.optimizers``); ``whose`` begins its help, e.g. "AdamW's"."""
    return setting(
        "device",
        f"{whose} moments between steps: device, or host (pinned host memory, moved to the device for each "
        "update and back; TPU and GPU). On a TPU v5e with JAX 0.10.2 host did not lower the step's footprint and "
        "added 190 ms a step to a 1B fine-tune: shrink the state first (--moment-dtype, --second-moment; docs/models.md)",
        section=section,
        choices=choices.STATE_MEMORIES,
    )


def _loss_chunk_size(who=""):
    return setting(
        None,
        f"{who}compute the loss from the hidden states t positions of every row at a time, never the whole "
        "(B, T, V) float32 logits (memory at long context, or at a large vocabulary); default: whole",
        section="train",
        parse=types.positive_int,
    )


def _context_attention():
    return setting(
        None,
        f"layout context: the sequence-parallel attention kernel; default {choices.DEFAULT_CONTEXT_ATTENTION}",
        section="parallel",
        choices=choices.CONTEXT_ATTENTIONS,
    )


def _remat(who=""):
    return setting(
        choices.AUTO,
        f"{who}what each block keeps for the backward pass: none (everything), full (only its input; ~1/3 more "
        "compute), dots_saveable (matmul outputs), save_attention (the attention's q, k, v, output and log-sum-exp: "
        "the attention is never recomputed), offload_attention (the same, in host memory), or auto: on a TPU or "
        "GPU the first of none, save_attention, dots_saveable, full whose compiled step fits the device (printed), "
        "on CPU none; --remat alone means full",
        section="train",
        choices=choices.JOB_REMATS,
        const="full",
        booleans={True: "full", False: "none"},
    )


@dataclasses.dataclass
class CheckpointSettings:
    """Orbax checkpoints during fit (docs/checkpoints.md): shared by every training job."""

    checkpoint_dir: str | None = setting(
        None, "save checkpoints during fit here (default: none)", section="checkpoint", metavar="DIR"
    )
    checkpoint_every: int = setting(
        100, "optimizer steps between checkpoints, plus one at the end", section="checkpoint", parse=types.positive_int
    )
    keep: int = setting(
        3, "newest complete checkpoints kept; older ones are deleted", section="checkpoint", parse=types.positive_int
    )
    resume: bool = setting(
        False,
        "continue from the newest usable checkpoint in checkpoint_dir (none there: start)",
        section="checkpoint",
        store_true=True,
    )


# --- the jobs ------------------------------------------------------------------------------


@dataclasses.dataclass
class CNNTrainSettings(CheckpointSettings, _Checked):
    """Settings of ``zoo train cnn`` (recipe job ``train_cnn``)."""

    layout: str = setting("model", LAYOUT_HELP, section="parallel", choices=choices.CNN_LAYOUTS)
    mesh: str | None = _mesh()
    dataset: str = setting("shapes", "an image-classification dataset (zoo data list)", section="data")
    data_dir: str | None = _data_dir()
    image_size: int | None = setting(
        None,
        "image side; default: the dataset's own (shapes: 16, 32, 64 or 128)",
        section="data",
        parse=types.image_size,
    )
    train_examples: int | None = setting(
        None,
        "use only the first N training examples; default: the whole split",
        section="data",
        parse=types.positive_int,
    )
    dropout: float = setting(0.0, "dropout before the logits layer, in [0, 1)", section="model", parse=types.dropout)
    epochs: int = setting(5, "passes over the training split", section="train", parse=types.positive_int)
    batch_size: int = setting(
        32, "global batch: examples per step over all devices", section="train", parse=types.positive_int
    )
    learning_rate: float = setting(1e-3, "Adam learning rate", section="train", parse=types.positive_float)
    seed: int = _seed("data, weight initialisation and shuffling")
    output: str = setting(
        "runs/cnn/small_cnn.keras",
        "where the trained model is saved (.keras); its run files (metrics.csv, steps.csv) go to OUTPUT.run beside it, without .keras",
        section="train",
    )


@dataclasses.dataclass
class VerifySettings(_Checked):
    """Settings of ``zoo verify cnn``: a distributed run against one device."""

    layout: str = setting("model", LAYOUT_HELP, section="parallel", choices=("data", "model"))
    mesh: str | None = _mesh()
    steps: int = setting(3, "optimizer steps compared", section="verify", parse=types.positive_int)
    batch_size: int = setting(32, "global batch", section="verify", parse=types.positive_int)
    image_size: int = setting(
        32, "shapes drawn in memory, any size >= 16", section="verify", parse=types.generated_image_size
    )
    optimizer: str = setting(
        "sgd",
        "adam turns rounding-level gradient noise into learning-rate-sized steps",
        section="verify",
        choices=choices.OPTIMIZERS,
    )
    rtol: float = setting(
        1e-4,
        "relative tolerance: |d - r| <= atol + rtol * |r| elementwise",
        section="verify",
        parse=types.non_negative_float,
    )
    atol: float = setting(1e-5, "absolute tolerance", section="verify", parse=types.non_negative_float)
    seed: int = _seed()


@dataclasses.dataclass
class GPTTrainSettings(CheckpointSettings, _Checked):
    """Settings of ``zoo train gpt`` (recipe job ``pretrain_gpt``)."""

    config_name: str = setting(
        "gpt_small", "named size (zoo.models.GPT_CONFIGS; byte-level vocabulary of 256)", section="model"
    )
    num_layers: int | None = setting(
        None,
        "overrides the named config's depth L (e.g. a multiple of stages x repeats for layout pipeline); "
        "default: the config's",
        section="model",
        parse=types.positive_int,
    )
    dropout: float = setting(
        0.0, "overrides the named config's dropout, in [0, 1)", section="model", parse=types.dropout
    )
    capacity_factor: float | None = setting(
        None,
        "MoE configs: each expert takes at most capacity_factor x tokens x k / E rows, the rest "
        "are dropped and counted (router_dropped_fraction in the logs); default: dropless",
        section="model",
        parse=types.positive_float,
    )
    expert_exchange: str | None = setting(
        None,
        "MoE configs under an expert layout: all_to_all (fixed-size buffers, any backend) or ragged "
        "(exactly the routed rows; GPU/TPU, dropless); default all_to_all",
        section="model",
        choices=choices.EXPERT_EXCHANGES,
    )
    router_aux_loss_coefficient: float | None = setting(
        None,
        "MoE configs: weight of the load-balancing loss added to the LM loss; default: the config's (0.01)",
        section="model",
        parse=types.non_negative_float,
    )
    router_z_loss_coefficient: float | None = setting(
        None,
        "MoE configs: weight of the router z-loss; default: the config's (0)",
        section="model",
        parse=types.non_negative_float,
    )
    scan_layers: bool = setting(
        False,
        "hold the blocks stacked and run them in one lax.scan (one block's program: compile time flat in depth; "
        "under fsdp each block's weights are gathered inside the loop, under tp each keeps Megatron's split); "
        "layouts single, data, fsdp, tp and fsdp+tp",
        section="model",
        store_true=True,
    )
    layout: str = setting(
        "data",
        LAYOUT_HELP + "; auto: the best that fits, by zoo plan --auto",
        section="parallel",
        choices=choices.TRANSFORMER_JOB_LAYOUTS + (choices.AUTO,),
    )
    mesh: str | None = _mesh()
    context_attention: str | None = _context_attention()
    balance: str | None = setting(
        None,
        "layout context: causal load balancing of the sequence order",
        section="parallel",
        choices=choices.BALANCES,
    )
    micro_batches: int | None = setting(
        None,
        "layout pipeline: M, the micro-batches each batch is cut into (M divides the batch per data "
        "shard); default: as many as the mesh has stages",
        section="parallel",
        parse=types.positive_int,
    )
    schedule: str = setting(
        PIPELINE_DEFAULTS["schedule"],
        "layout pipeline: gpipe (each stage runs its blocks once per micro-batch) or "
        "circular (each stage holds --repeats non-adjacent groups of blocks: the bubble shrinks that many times)",
        section="parallel",
        choices=choices.SCHEDULES,
    )
    repeats: int = setting(
        PIPELINE_DEFAULTS["repeats"],
        "layout pipeline: R, the times a micro-batch goes round the stages "
        "(gpipe: 1, circular: >= 2; stages x R divides the layers)",
        section="parallel",
        parse=types.positive_int,
    )
    dataset: str = setting("python_docs", "a language-modelling dataset (zoo data list)", section="data")
    data_dir: str | None = _data_dir()
    sequence_length: int = setting(128, "tokens per example (T)", section="train", parse=types.sequence_length)
    batch_size: int = setting(
        32,
        "global batch: examples per step over all devices (divides by the data axis)",
        section="train",
        parse=types.positive_int,
    )
    epochs: int = setting(2, "passes over the training split", section="train", parse=types.positive_int)
    steps_per_epoch: int | None = setting(
        None,
        "epochs over the first N batches' windows; default: the whole split",
        section="train",
        parse=types.positive_int,
    )
    learning_rate: float = _cosine_peak_learning_rate(2e-3)
    weight_decay: float = setting(0.01, "AdamW weight decay", section="train", parse=types.non_negative_float)
    precision: str = setting(
        "float32",
        "mixed_bfloat16: bf16 compute, float32 weights and optimizer",
        section="train",
        choices=choices.PRECISIONS,
    )
    remat: str = _remat()
    gradient_accumulation_steps: int = setting(
        1, "optimizer update every N batches (global batch x N per update)", section="train", parse=types.positive_int
    )
    moment_dtype: str = moment_dtype_setting("AdamW's")
    second_moment: str = second_moment_setting("AdamW's")
    state_memory: str = state_memory_setting("AdamW's")
    loss_chunk_size: int | None = _loss_chunk_size()
    seed: int = _seed()
    output: str = setting(
        "runs/gpt/gpt.keras",
        "where the trained model is saved (.keras); its run files (metrics.csv, steps.csv) go to OUTPUT.run beside it, without .keras",
        section="train",
    )
    report_every: int = setting(
        50,
        "print step time, tokens/s and MFU every N steps (also into the Keras logs)",
        section="logging",
        parse=types.positive_int,
    )
    peak_tflops: float | None = setting(
        None,
        "device peak dense TFLOP/s for MFU; default: looked up from the device kind (none on CPU)",
        section="logging",
        parse=types.positive_float,
    )
    profile_dir: str | None = setting(
        None, "write a jax.profiler trace of a few steps here", section="logging", metavar="DIR"
    )
    profile_steps: int = setting(
        3, "steps the trace covers (from step 2, after compilation)", section="logging", parse=types.positive_int
    )

    def __post_init__(self):
        super().__post_init__()
        check_context_settings(self)
        check_pipeline_settings(self)
        check_scan_settings(self)


def check_context_settings(settings):
    """Raise ``SettingError`` naming the value unless ``context_attention`` and ``balance``
    (where the job has it) are left out under every layout but ``context`` (and ``auto``,
    which may choose it): off the context layout nothing splits the sequence, so a kernel
    or a balance there would be silently ignored."""
    if settings.layout in ("context", choices.AUTO):
        return
    for key in CONTEXT_DEFAULTS:
        value = getattr(settings, key, None)
        if value is not None:
            raise SettingError(
                f"{type(settings).__name__}.{key} (--{key.replace('_', '-')}) = {value!r} is a setting of layout "
                f"'context', not of layout {settings.layout!r}: leave it out, or use layout context"
            )


def check_scan_settings(settings):
    """Raise ``SettingError`` naming the layout unless ``scan_layers`` is off or the
    layout runs a scanned stack (single and ``choices.SCANNED_LAYOUTS``)."""
    if settings.scan_layers and settings.layout not in ("single", *choices.SCANNED_LAYOUTS):
        raise SettingError(
            f"{type(settings).__name__}.scan_layers (--scan-layers) runs the stacked blocks under layouts "
            f"{', '.join(('single', *choices.SCANNED_LAYOUTS))}, not {settings.layout!r} (its blocks run as layers; "
            f"layout pipeline already stacks them): leave it out, or use one of those"
        )


def check_pipeline_settings(settings):
    """Raise ``SettingError`` naming the values unless ``micro_batches``, ``schedule`` and
    ``repeats`` fit ``settings.layout``: left at their defaults for any layout but
    ``pipeline``; ``gpipe`` with repeats 1, ``circular`` with repeats >= 2. (Whether M
    divides the batch per data shard, and stages x repeats the layers, is checked once
    the mesh is known: ``zoo.training.gpt``.)"""
    name = type(settings).__name__
    if settings.layout != "pipeline":
        for key, default in PIPELINE_DEFAULTS.items():
            value = getattr(settings, key)
            if value != default:
                raise SettingError(
                    f"{name}.{key} (--{key.replace('_', '-')}) = {value!r} is a setting of layout 'pipeline', not of layout "
                    f"{settings.layout!r}: leave it out, or use layout pipeline"
                )
        return
    if settings.schedule == "gpipe" and settings.repeats != 1:
        raise SettingError(
            f"{name}: schedule 'gpipe' runs each stage's blocks once per micro-batch, so repeats must be 1, got "
            f"repeats={settings.repeats}; use schedule 'circular' for repeats >= 2"
        )
    if settings.schedule == "circular" and settings.repeats < 2:
        raise SettingError(
            f"{name}: schedule 'circular' needs repeats >= 2 (repeats=1 is 'gpipe'), got repeats={settings.repeats}"
        )


@dataclasses.dataclass
class ClassifierTrainSettings(_Checked):
    """Settings shared by ``zoo train encoder`` and ``zoo train vit``."""

    model = None  # "encoder" | "vit": set by the subclass
    config_name: str | None = setting(None, "named size (zoo.models.*_CONFIGS); default: <model>_tiny", section="model")
    dropout: float = setting(
        0.1, "overrides the named config's dropout, in [0, 1)", section="model", parse=types.dropout
    )
    layout: str = setting("data", LAYOUT_HELP, section="parallel", choices=choices.TRANSFORMER_JOB_LAYOUTS)
    mesh: str | None = _mesh()
    context_attention: str | None = _context_attention()
    dataset: str | None = setting(
        None, "dataset (zoo data list); default python_docs_topics (encoder), shapes (vit)", section="data"
    )
    data_dir: str | None = _data_dir()
    batch_size: int = setting(32, "global batch, split over the data axis", section="train", parse=types.positive_int)
    epochs: int = setting(5, "passes over the training split", section="train", parse=types.positive_int)
    learning_rate: float = setting(1e-3, "AdamW learning rate", section="train", parse=types.positive_float)
    seed: int = _seed()
    output: str | None = setting(
        None, "where the trained model is saved (.keras); default runs/<model>/<model>.keras", section="train"
    )

    def __post_init__(self):
        super().__post_init__()
        check_context_settings(self)
        self.config_name = self.config_name or f"{self.model}_tiny"
        self.dataset = self.dataset or ("python_docs_topics" if self.model == "encoder" else "shapes")
        self.output = self.output or f"runs/{self.model}/{self.model}.keras"


@dataclasses.dataclass
class EncoderTrainSettings(ClassifierTrainSettings):
    """Settings of ``zoo train encoder`` (text classification)."""

    model = "encoder"
    sequence_length: int = setting(128, "tokens per example", section="train", parse=types.sequence_length)


@dataclasses.dataclass
class ViTTrainSettings(ClassifierTrainSettings):
    """Settings of ``zoo train vit`` (image classification).

    The defaults are the ViT's own, not the encoder's (docs/models.md, "Training the ViT"):
    a ViT has no convolution, so it learns that a moved shape is the same shape only from
    seeing shapes moved (``random_shift``); it leaves its first loss plateau, near
    ln(classes), only after about 200 steps (``epochs``); and at vit_tiny's 21k parameters
    it underfits once the images move (``dropout`` 0). With them ``zoo train vit`` reaches
    0.773 held-out accuracy on ``shapes`` (chance 0.125); the encoder's defaults gave 0.156.
    """

    model = "vit"
    dropout: float = setting(
        0.0,
        "overrides the named config's dropout, in [0, 1)",
        section="model",
        parse=types.dropout,
    )
    epochs: int = setting(40, "passes over the training split", section="train", parse=types.positive_int)
    learning_rate: float = _cosine_peak_learning_rate(2e-3)
    image_size: int | None = setting(
        None,
        "image side; default: the dataset's own (shapes: 16, 32, 64 or 128)",
        section="data",
        parse=types.image_size,
    )
    random_shift: int | None = setting(
        None,
        "move each training image by up to N pixels each way, new shifts every step (edge pixels repeated; "
        "at most half the image side); default: an eighth of the image side (4 at 32); 0: no shifts",
        section="train",
        parse=types.non_negative_int,
    )


@dataclasses.dataclass
class FinetuneSettings(CheckpointSettings, _Checked):
    """Settings of ``zoo finetune`` (recipe job ``finetune``)."""

    preset: str = setting(
        "small_cnn_shapes",
        "a shipped preset's name (e.g. small_cnn_shapes, gpt_tiny_python_docs), a preset folder (a path with '/'), "
        "or for a causal LM a Hugging Face folder or hf://org/name",
        section="model",
        positional=True,
    )
    method: str = setting(
        "lora",
        "what trains: frozen (a classifier's head), lora (LoRA factors, and a classifier's head), full (everything); "
        "a causal LM takes lora or full",
        section="finetune",
        choices=choices.METHODS,
    )
    lora_rank: int = setting(4, "rank r of the LoRA factors", section="finetune", parse=types.positive_int)
    lora_alpha: float | None = setting(
        None,
        "LoRA scale alpha (the update is scaled by alpha / r); default alpha = r",
        section="finetune",
        parse=types.positive_float,
    )
    layout: str = setting(
        "single",
        LAYOUT_HELP + "; model uses the preset's layout map, the others the Transformer presets'; "
        "tp+sp, fsdp+tp and context are for causal LMs",
        section="parallel",
        choices=choices.LAYOUTS,
    )
    mesh: str | None = _mesh()
    context_attention: str | None = _context_attention()
    balance: str | None = setting(
        None,
        "layout context: causal load balancing of the sequence order",
        section="parallel",
        choices=choices.BALANCES,
    )
    dataset: str = setting(
        "digits",
        "a classification dataset (zoo data list); a causal LM without --data-file: a language-modelling one",
        section="data",
    )
    data_dir: str | None = _data_dir()
    data_file: str | None = setting(
        None,
        'causal LMs: train on this file: .jsonl with {"messages": [...]} a line (through the chat template, '
        'loss on the assistant turns), {"prompt", "completion"} a line (loss on the completion) '
        'or {"text"} a line (packed), or plain text (packed); docs/finetuning.md',
        section="data",
        metavar="FILE",
    )
    chat_template: str | None = setting(
        None,
        'causal LMs: a Jinja chat template file (as chat_template.jinja) for {"messages"} data, '
        "used and saved instead of the tokenizer's own; default: the tokenizer's",
        section="data",
        metavar="FILE",
    )
    validation_file: str | None = setting(
        None,
        "causal LMs: the held-out examples, a file like --data-file; default: the last "
        "--validation-fraction of --data-file",
        section="data",
        metavar="FILE",
    )
    validation_fraction: float = setting(
        0.1,
        "causal LMs without --validation-file: the share of --data-file's examples held out (the last), in [0, 1)",
        section="data",
        parse=types.dropout,
    )
    train_examples: int | None = setting(
        None,
        "use only the first N training examples; default: the whole split",
        section="data",
        parse=types.positive_int,
    )
    test_examples: int | None = setting(
        None, "evaluate on the first N test (held-out) examples; default: all", section="data", parse=types.positive_int
    )
    sequence_length: int | None = setting(
        None,
        "causal LMs: tokens per example T; default: the model's preprocessor's, else min(1024, max_sequence_length)",
        section="train",
        parse=types.sequence_length,
    )
    loss_chunk_size: int | None = _loss_chunk_size("causal LMs: ")
    remat: str = _remat("causal LMs: ")
    packing: bool = setting(
        False,
        "causal LMs: several examples per row of T tokens (best-fit decreasing), attention and the loss within each "
        "(segment ids); plain text: documents kept apart in its windows; prints the padding before and after",
        section="data",
        store_true=True,
    )
    epochs: int = setting(3, "passes over the training examples", section="train", parse=types.positive_int)
    batch_size: int = setting(32, "global batch, split over the data axis", section="train", parse=types.positive_int)
    optimizer: str = setting(
        "adam",
        "adam, or sgd (w -= lr * gradient: steps that are the gradients, to compare layouts; needs --learning-rate)",
        section="train",
        choices=choices.OPTIMIZERS,
    )
    learning_rate: float | None = setting(
        None,
        "learning rate; default for adam per method: classifiers frozen, lora 1e-2, full 3e-3; "
        "causal LMs lora 2e-4, full 2e-5",
        section="train",
        parse=types.positive_float,
    )
    moment_dtype: str = moment_dtype_setting("optimizer adam: Adam's")
    second_moment: str = second_moment_setting("optimizer adam: Adam's")
    state_memory: str = state_memory_setting("optimizer adam: Adam's")
    seed: int = _seed("LoRA factors' initialisation and shuffling")
    adapter_format: str = setting(
        "zoo",
        "method lora: the adapter saved beside the merged model: zoo (OUTPUT/lora.weights.h5) or peft "
        "(OUTPUT/adapter/: adapter_config.json, adapter_model.safetensors, for peft.PeftModel.from_pretrained)",
        section="finetune",
        choices=choices.ADAPTER_FORMATS,
    )
    output: str | None = setting(
        None,
        "save the fine-tuned model here (LoRA merged; the adapter beside it, --adapter-format; metrics.csv in OUTPUT.run): "
        "a preset, or a Hugging Face folder when the model came from one",
        section="train",
    )
    report_every: int = setting(
        50,
        "print step time and examples/s every N steps (also into the Keras logs)",
        section="logging",
        parse=types.positive_int,
    )

    def __post_init__(self):
        super().__post_init__()
        check_context_settings(self)


@dataclasses.dataclass
class GenerateSettings(_Checked):
    """Settings of ``zoo generate``."""

    model: str = setting(
        "runs/gpt/gpt.keras",
        "a .keras file saved by zoo train gpt, a shipped preset's name, a preset folder, "
        "or a Hugging Face folder or hf://org/name",
        section="generate",
    )
    prompt: str = setting("def ", "UTF-8 text, at least one character", section="generate", parse=types.text)
    chat: bool = setting(
        False,
        "the prompt is a user's message: through the model's chat template with the generation prompt; "
        "prints the assistant's reply",
        section="generate",
        store_true=True,
    )
    max_new_tokens: int = setting(
        200, "tokens generated after the prompt", section="generate", parse=types.positive_int
    )
    sampler: str = setting(
        "top_k", "greedy (argmax), top_k or top_p sampling", section="generate", choices=choices.SAMPLERS
    )
    temperature: float = setting(
        0.8, "divides the logits before sampling", section="generate", parse=types.positive_float
    )
    top_k: int = setting(
        10, "top_k sampler: sample among the k most likely tokens", section="generate", parse=types.positive_int
    )
    top_p: float = setting(
        0.9,
        "top_p sampler: the smallest set holding this probability, in (0, 1]",
        section="generate",
        parse=types.probability,
    )
    seed: int = setting(0, "sampling is reproducible for a seed", section="generate", parse=types.non_negative_int)
    stop_token_ids: str | None = setting(
        None,
        "comma-separated token ids that end generation, e.g. 2,32000 ('' for none); "
        "default: the tokenizer's stop tokens",
        section="generate",
        metavar="ID,ID",
    )

    def __post_init__(self):
        super().__post_init__()
        self.stop_ids()  # a malformed list is refused here, as the other settings are

    def stop_ids(self):
        """``stop_token_ids`` as ``GPTCausalLM.generate`` takes it: a tuple of ints, or None
        (the tokenizer's stop tokens); ``""`` is ``()``, no stop token."""
        if self.stop_token_ids is None:
            return None
        parts = [part.strip() for part in self.stop_token_ids.split(",") if part.strip()]
        if not all(part.isdigit() for part in parts):
            raise ValueError(
                f"GenerateSettings.stop_token_ids: expected comma-separated token ids >= 0 such as 2,32000 (or '' for none), "
                f"got {self.stop_token_ids!r}"
            )
        return tuple(int(part) for part in parts)


@dataclasses.dataclass
class ExportSettings(_Checked):
    """Settings of ``zoo export``."""

    model: str = setting(
        "runs/gpt/gpt.keras",
        "a .keras file, a zoo preset or a Hugging Face folder holding a GPTCausalLM",
        section="export",
        positional=True,
    )
    output: str = setting(
        "runs/gpt/hf",
        "the new Hugging Face folder (config.json, safetensors, tokenizer); must not exist or be empty",
        section="export",
        positional=True,
    )
    lora: str | None = setting(
        None,
        "a LoRA adapter to merge into the exported weights: lora.weights.h5 from zoo finetune, "
        "or a PEFT adapter folder (adapter_config.json, adapter_model.safetensors)",
        section="export",
    )
    dtype: str | None = setting(
        None,
        "store the weights as this dtype; default: as the model holds them",
        section="export",
        choices=choices.EXPORT_DTYPES,
    )
    max_file_size_mb: float | None = setting(
        None,
        "cut the weights into files of at most this many MiB, with an index (transformers' max_shard_size)",
        section="export",
        parse=types.positive_float,
    )


TRAIN_CONFIGS = {
    "cnn": CNNTrainSettings,
    "gpt": GPTTrainSettings,
    "encoder": EncoderTrainSettings,
    "vit": ViTTrainSettings,
}


def __getattr__(name):
    """An old class name (``GPTTrainConfig``) gets one line naming its new one."""
    raise renamed.missing_attribute(__name__, name)
