"""``--loss-chunk-size auto``: the loss from the whole logits where they are small beside the
device's memory, in chunks where they are not.

The loss of a causal LM needs the (B, T, V) logits in float32, and their gradient as much
again. At a vocabulary of 128-152k they outweigh the model: llama_3_2_1b's at batch 4 x
2,048 are 3.9 GiB (4 x 2,048 x 128,256 x 4 bytes), a quarter of a TPU v5e's 15.75 GiB.
``GPTCausalLM(loss_chunk_size=t)`` computes the same loss t positions of every row at a time
and never holds them whole. What was measured on one TPU v5e chip (docs/performance.md,
"The training step on one TPU v5e chip"):

- gpt_1b (V = 32,000) at batch 4 x 2,048, logits 0.98 GiB: the whole loss was faster
  (0.2691 s a step against 0.2798 s in chunks of 512, at 2847a1b: before the chunks took
  their gradient in the forward pass, which saved one head matmul per chunk; not measured
  since);
- llama_3_2_1b (V = 128,256) and qwen3_0.6b (V = 151,936) at batch 4 x 2,048, logits
  3.9 and 4.6 GiB: every fast row ran in chunks of 512 (the LoRA at 391.9 ms, 56.7% MFU;
  the full fine-tune at 335.1 ms, 53.1%); the LoRA's whole-logits row did not finish
  compiling in 560 s.

So ``auto`` keeps the whole logits while their float32 bytes per device are at most
1/``LOGITS_SHARE`` of the device's memory (gpt_1b's 0.98 GiB of 15.75), and takes chunks of
``AUTO_CHUNK`` above it. On CPU (host memory, no device limit) it keeps the whole logits.
``whole`` and a number are taken as given.

The device is the process' first one, or what ``sized_for`` names: ``zoo plan`` sizes a
job for its target (a TPU's memory) while it compiles on CPU.
"""

import contextlib
import contextvars
import dataclasses

from zoo.config.choices import AUTO, WHOLE
from zoo.units import format_bytes

__all__ = ["AUTO_CHUNK", "LOGITS_SHARE", "LossChunkChoice", "choose_loss_chunk", "resolve_loss_chunk", "sized_for"]

AUTO_CHUNK = 512  # positions per row per chunk: the chunk every measured row above ran
LOGITS_SHARE = 8  # chunks once the float32 logits per device exceed 1/8 of its memory
FLOAT32_BYTES = 4


@dataclasses.dataclass(frozen=True)
class LossChunkChoice:
    chunk: int | None  # positions per chunk, or None: the whole logits
    why: str  # one line: "given", or what auto weighed


@dataclasses.dataclass
class Sizing:
    """The device a job's loss is sized for: its memory (None: host memory) and the device
    count the batch splits over; ``choices`` collects what ``auto`` chose under it."""

    memory_bytes: int | None
    devices: int
    choices: list = dataclasses.field(default_factory=list)


_SIZING = contextvars.ContextVar("zoo_loss_chunk_sizing", default=None)


@contextlib.contextmanager
def sized_for(memory_bytes, devices):
    """Inside it ``resolve_loss_chunk`` sizes for ``devices`` devices of ``memory_bytes``
    each (None: host memory), not this process' devices; yields the ``Sizing``."""
    sizing = Sizing(memory_bytes, devices)
    token = _SIZING.set(sizing)
    try:
        yield sizing
    finally:
        _SIZING.reset(token)


def _local_sizing():
    import jax

    from zoo.measure.hardware import memory_limit

    device = jax.devices()[0]
    return Sizing(None if device.platform == "cpu" else memory_limit(device), jax.device_count())


def choose_loss_chunk(setting, *, batch_size, length, vocabulary, memory_bytes, devices):
    """The ``LossChunkChoice`` for ``setting`` (``auto``, ``whole``, None or positions per
    chunk) of a global batch of ``batch_size`` x ``length`` tokens over ``vocabulary`` words,
    split over ``devices`` devices of ``memory_bytes`` each (None: host memory)."""
    if setting is None or setting == WHOLE:
        return LossChunkChoice(None, "given")
    if setting != AUTO:
        return LossChunkChoice(setting, "given")
    if memory_bytes is None:
        return LossChunkChoice(None, "on CPU, in host memory: no device memory to weigh the logits against")
    logits = FLOAT32_BYTES * batch_size * length * vocabulary / devices
    small = logits * LOGITS_SHARE <= memory_bytes
    weighed = (
        f"float32 logits of {batch_size} x {length:,} x {vocabulary:,} tokens x words are {format_bytes(logits, 2)} "
        f"per device, {'at most' if small else 'over'} 1/{LOGITS_SHARE} of its {format_bytes(memory_bytes, 2)}"
    )
    return LossChunkChoice(None if small else AUTO_CHUNK, weighed)


def resolve_loss_chunk(setting, model, batch_size, length, *, report=None):
    """Positions per chunk (None: the whole logits) for ``setting`` and ``model`` (a
    ``GPTCausalLM``) on a global batch of ``batch_size`` x ``length`` tokens, sized for this
    process' devices or ``sized_for``'s; ``auto``'s choice is reported."""
    sizing = _SIZING.get() or _local_sizing()
    choice = choose_loss_chunk(
        setting,
        batch_size=batch_size,
        length=length,
        vocabulary=model.backbone.vocabulary_size,
        memory_bytes=sizing.memory_bytes,
        devices=sizing.devices,
    )
    if setting == AUTO:
        sizing.choices.append(choice)
        if report is not None:
            report(f"loss {describe(choice.chunk)} (--loss-chunk-size auto: {choice.why}; --loss-chunk-size chooses)")
    return choice.chunk


def describe(chunk):
    """``"in chunks of 512"`` or ``"from the whole logits"``."""
    return f"in chunks of {chunk}" if chunk else "from the whole logits"
