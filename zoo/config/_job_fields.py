"""Pieces the jobs' settings share (``zoo.config.settings``, ``finetune_settings``): the
help lines, the fields several jobs take (mesh, seed, remat, the optimizer's state, the
loss in chunks), the checkpoint settings and the context-layout check. Pure Python."""

import dataclasses

from zoo.config import choices, types
from zoo.config.schema import SettingError, check_settings, setting

DATA_DIR_HELP = "TFDS data folder (default $ZOO_DATA_DIR, $TFDS_DATA_DIR, ~/tensorflow_datasets)"
MESH_HELP = "mesh spec such as data=2,model=4 or data=2,seq=4 (one axis may be -1); default: the layout's"
LAYOUT_HELP = "how weights and inputs are split over the devices (docs/distribution.md)"
# layout context's settings and their defaults (context_attention None: ring, the distribution's default)
CONTEXT_DEFAULTS = {"context_attention": None, "balance": None}


class Checked:
    def __post_init__(self):
        check_settings(self)


# --- pieces several jobs share ---------------------------------------------------------


def mesh():
    return setting(None, MESH_HELP, section="parallel")


def data_dir():
    return setting(None, DATA_DIR_HELP, section="data", metavar="DIR")


def seed(help="weight initialisation, dropout and shuffling"):
    return setting(0, help, section="train", parse=types.non_negative_int)


def cosine_peak_learning_rate(default):
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


def loss_chunk_size(who=""):
    return setting(
        choices.AUTO,
        f"{who}compute the loss from the hidden states t positions of every row at a time, never the whole "
        "(B, T, V) float32 logits (memory at long context, or at a large vocabulary); whole: from the whole logits; "
        "auto: on a TPU or GPU chunks of 512 where the float32 logits per device exceed 1/8 of its memory, else "
        "whole (printed)",
        section="train",
        parse=types.loss_chunk,
    )


def context_attention():
    return setting(
        None,
        f"layout context: the sequence-parallel attention kernel; default {choices.DEFAULT_CONTEXT_ATTENTION}",
        section="parallel",
        choices=choices.CONTEXT_ATTENTIONS,
    )


SCAN_JOB_LAYOUTS = ("single", *choices.SCANNED_LAYOUTS)  # where a job's --scan-layers runs


def scan_layers(who=""):
    return setting(
        False,
        f"{who}hold the blocks stacked and run them in one lax.scan (one block's program: compile time flat in "
        "depth; under fsdp each block's weights are gathered inside the loop, under tp each keeps Megatron's split, "
        "under tp+sp and context the loop runs the layers' sequence-parallel kernels, under the expert layouts "
        "the MoE exchange, every block sparse); "
        f"layouts {', '.join(SCAN_JOB_LAYOUTS)}",
        section="model",
        store_true=True,
    )


def check_scan_settings(settings):
    """Raise ``SettingError`` naming the layout unless ``scan_layers`` is off or the
    layout runs a scanned stack (single and ``choices.SCANNED_LAYOUTS``)."""
    if settings.scan_layers and settings.layout not in SCAN_JOB_LAYOUTS:
        raise SettingError(
            f"{type(settings).__name__}.scan_layers (--scan-layers) runs the stacked blocks under layouts "
            f"{', '.join(SCAN_JOB_LAYOUTS)}, not {settings.layout!r} (its blocks run as layers; "
            f"layout pipeline already stacks them): leave it out, or use one of those"
        )


def remat(who=""):
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
