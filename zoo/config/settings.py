"""The settings of every job: one dataclass each, the single source of its names. The
training jobs' are here; ``zoo finetune``'s, ``zoo generate``'s and ``zoo export``'s in
``finetune_settings``, the fields several share in ``_job_fields``; all import from here.

Each field is a flag (``batch_size`` -> ``--batch-size``) and a recipe key (``[train]
batch_size``) under the same name, with the same default, range and help
(``zoo.config.schema``). Constructing a settings object checks every value, so the
Python API refuses what the command line refuses, in the same words.
"""

import dataclasses

from zoo.config import _job_fields as fields
from zoo.config import choices, renamed, types
from zoo.config._job_fields import (  # noqa: F401 (moved; the old import paths keep working)
    CONTEXT_DEFAULTS,
    DATA_DIR_HELP,
    LAYOUT_HELP,
    MESH_HELP,
    CheckpointSettings,
    check_context_settings,
    check_scan_settings,
    moment_dtype_setting,
    second_moment_setting,
    state_memory_setting,
)
from zoo.config.finetune_settings import ExportSettings, FinetuneSettings, GenerateSettings  # noqa: F401 (moved)
from zoo.config.layouts import pipelined
from zoo.config.schema import SettingError, setting

# layout pipeline's settings and their defaults (micro_batches None: as many as stages, resolved with the mesh)
PIPELINE_DEFAULTS = {"micro_batches": None, "schedule": "gpipe", "repeats": 1}


@dataclasses.dataclass
class CNNTrainSettings(fields.CheckpointSettings, fields.Checked):
    """Settings of ``zoo train cnn`` (recipe job ``train_cnn``)."""

    layout: str = setting("model", fields.LAYOUT_HELP, section="parallel", choices=choices.CNN_LAYOUTS)
    mesh: str | None = fields.mesh()
    dataset: str = setting("shapes", "an image-classification dataset (zoo data list)", section="data")
    data_dir: str | None = fields.data_dir()
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
    seed: int = fields.seed("data, weight initialisation and shuffling")
    output: str = setting(
        "runs/cnn/small_cnn.keras",
        "where the trained model is saved (.keras); its run files (metrics.csv, steps.csv) go to OUTPUT.run beside it, without .keras",
        section="train",
    )


@dataclasses.dataclass
class VerifySettings(fields.Checked):
    """Settings of ``zoo verify cnn``: a distributed run against one device."""

    layout: str = setting("model", fields.LAYOUT_HELP, section="parallel", choices=("data", "model"))
    mesh: str | None = fields.mesh()
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
    seed: int = fields.seed()


@dataclasses.dataclass
class GPTTrainSettings(fields.CheckpointSettings, fields.Checked):
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
    scan_layers: bool = fields.scan_layers()
    layout: str = setting(
        "data",
        fields.LAYOUT_HELP + "; auto: the best that fits, by zoo plan --auto",
        section="parallel",
        choices=choices.TRANSFORMER_JOB_LAYOUTS + (choices.AUTO,),
    )
    mesh: str | None = fields.mesh()
    context_attention: str | None = fields.context_attention()
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
    data_dir: str | None = fields.data_dir()
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
    learning_rate: float = fields.cosine_peak_learning_rate(2e-3)
    weight_decay: float = setting(0.01, "AdamW weight decay", section="train", parse=types.non_negative_float)
    precision: str = setting(
        "float32",
        "mixed_bfloat16: bf16 compute, float32 weights and optimizer; bfloat16: bf16 weights too, AdamW rounding "
        "each update stochastically (docs/performance.md)",
        section="train",
        choices=choices.TRAIN_PRECISIONS,
    )
    remat: str = fields.remat()
    gradient_accumulation_steps: int = setting(
        1, "optimizer update every N batches (global batch x N per update)", section="train", parse=types.positive_int
    )
    moment_dtype: str = fields.moment_dtype_setting("AdamW's")
    second_moment: str = fields.second_moment_setting("AdamW's")
    state_memory: str = fields.state_memory_setting("AdamW's")
    loss_chunk_size: int | str | None = fields.loss_chunk_size()
    seed: int = fields.seed()
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
        fields.check_context_settings(self)
        check_pipeline_settings(self)
        check_scan_settings(self)


def check_pipeline_settings(settings):
    """Raise ``SettingError`` naming the values unless ``micro_batches``, ``schedule`` and
    ``repeats`` fit ``settings.layout``: left at their defaults for any layout but
    ``pipeline``; ``gpipe`` with repeats 1, ``circular`` with repeats >= 2. (Whether M
    divides the batch per data shard, and stages x repeats the layers, is checked once
    the mesh is known: ``zoo.training.gpt``.)"""
    name = type(settings).__name__
    if not pipelined(settings.layout):
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
class ClassifierTrainSettings(fields.Checked):
    """Settings shared by ``zoo train encoder`` and ``zoo train vit``."""

    model = None  # "encoder" | "vit": set by the subclass
    config_name: str | None = setting(None, "named size (zoo.models.*_CONFIGS); default: <model>_tiny", section="model")
    dropout: float = setting(
        0.1, "overrides the named config's dropout, in [0, 1)", section="model", parse=types.dropout
    )
    layout: str = setting("data", fields.LAYOUT_HELP, section="parallel", choices=choices.TRANSFORMER_JOB_LAYOUTS)
    mesh: str | None = fields.mesh()
    context_attention: str | None = fields.context_attention()
    dataset: str | None = setting(
        None, "dataset (zoo data list); default python_docs_topics (encoder), shapes (vit)", section="data"
    )
    data_dir: str | None = fields.data_dir()
    batch_size: int = setting(32, "global batch, split over the data axis", section="train", parse=types.positive_int)
    epochs: int = setting(5, "passes over the training split", section="train", parse=types.positive_int)
    learning_rate: float = setting(1e-3, "AdamW learning rate", section="train", parse=types.positive_float)
    seed: int = fields.seed()
    output: str | None = setting(
        None, "where the trained model is saved (.keras); default runs/<model>/<model>.keras", section="train"
    )

    def __post_init__(self):
        super().__post_init__()
        fields.check_context_settings(self)
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
    learning_rate: float = fields.cosine_peak_learning_rate(2e-3)
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


TRAIN_CONFIGS = {
    "cnn": CNNTrainSettings,
    "gpt": GPTTrainSettings,
    "encoder": EncoderTrainSettings,
    "vit": ViTTrainSettings,
}


def __getattr__(name):
    """An old class name (``GPTTrainConfig``) gets one line naming its new one."""
    raise renamed.missing_attribute(__name__, name)
