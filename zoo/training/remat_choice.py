"""``--remat auto``: the fastest rematerialisation policy whose training step fits the
device, found by compiling that step.

What a block keeps for its backward pass trades memory for recomputation, and the less a
step recomputes the faster it runs. On one TPU v5e chip (docs/performance.md, T = 2,048):
llama_3_2_1b's LoRA at batch 4 took 438.0 ms with remat none, 534.5 ms with
save_attention and 562.6 ms with full; qwen3_0.6b's full fine-tune at batch 4 took
377.1 ms (save_attention), 384.9 ms (dots_saveable) and 386.7 ms (full); at batch 8 the
TPU compiler refused every policy but full. So ``auto`` tries ``REMATS_FASTEST_FIRST`` in that order on the job's own built model
(``GPTBackbone.set_remat``; no weight is copied) and keeps the first policy whose step
fits:

- on a TPU, the step compiles: the TPU compiler refuses (``RESOURCE_EXHAUSTED``) a program
  whose buffers exceed the chip's HBM. Its ``memory_analysis()`` sum is not used there:
  qwen3_0.6b's dots_saveable step read 16.50 GiB and ran on the 15.75 GiB chip;
- on a GPU (or wherever ``memory_limit`` is given), the compiled footprint
  (``StepMemory.peak``: arguments + outputs not aliased + temporaries) is at most the
  device's memory (JAX's ``bytes_limit``);
- on CPU with no ``memory_limit``: none, and nothing is compiled (the step runs in host
  memory; this is what the jobs did before ``auto``).

Each policy tried costs one compile of the step (``compile_fit_step``, the program fit
jits), and fit then compiles the kept one again: on the chip, llama_3_2_1b's LoRA step
took 48.1 s to compile in fit after its probe, with JAX's persistent compilation cache on
(on one CPU device the cache serves fit the probe's program; on the TPU it did not).
"""

import dataclasses

import jax
import keras

from zoo.config.choices import AUTO, REMATS_FASTEST_FIRST
from zoo.measure.compiled_step import compile_fit_step
from zoo.measure.hardware import memory_limit as device_memory_limit
from zoo.units import format_bytes

__all__ = ["RematChoice", "apply_remat", "choose_remat", "resolve_remat"]


@dataclasses.dataclass(frozen=True)
class RematChoice:
    remat: str
    why: str  # one line: what was compiled and what fitted
    peaks: dict = dataclasses.field(default_factory=dict)  # policy tried -> compiled bytes (None: refused)


def resolve_remat(model, remat, x, y, sample_weight=None, *, report=print, memory_limit=None):
    """``apply_remat``'s policy: the name the model is now rematerialised by."""
    return apply_remat(model, remat, x, y, sample_weight, report=report, memory_limit=memory_limit).remat


def apply_remat(model, remat, x, y, sample_weight=None, *, report=print, memory_limit=None):
    """Set ``model``'s remat (a ``GPTCausalLM``, compiled with its optimizer) to ``remat``,
    or to ``choose_remat``'s when it is ``"auto"`` (reported); return the ``RematChoice``
    (its ``peaks`` hold the compiled footprints auto measured; none for a given policy).

    ``x``, ``y``, ``sample_weight``: one global batch as ``compile_fit_step`` takes it
    (``(shape, dtype)`` or arrays)."""
    if remat != AUTO:
        model.backbone.set_remat(remat)
        return RematChoice(remat, "given")
    choice = choose_remat(model, x, y, sample_weight, memory_limit=memory_limit)  # leaves the model as chosen
    report(f"remat {choice.remat} (--remat auto: {choice.why}; --remat chooses)")
    return choice


def choose_remat(model, x, y, sample_weight=None, *, memory_limit=None):
    """The first of ``REMATS_FASTEST_FIRST`` whose step fits this process' first device (the
    module docstring); the last (full) when none fits, so the job's own compile names what
    does not fit. Leaves ``model`` rematerialised as chosen."""
    device = jax.devices()[0]
    if memory_limit is None and device.platform == "cpu":
        model.backbone.set_remat("none")
        return RematChoice("none", "on CPU the step runs in host memory: nothing recomputed")
    limit = memory_limit if memory_limit is not None else device_memory_limit(device)
    by_compiler = memory_limit is None and device.platform == "tpu"  # the TPU compiler refuses what does not fit
    peaks = {}
    for remat in REMATS_FASTEST_FIRST:
        model.backbone.set_remat(remat)
        peak = peaks[remat] = _compiled_peak(model, x, y, sample_weight)
        tried = ", ".join(f"{name} {_size(size)}" for name, size in peaks.items())
        if peak is not None and (by_compiler or limit is None or peak <= limit):
            return RematChoice(remat, f"the fastest whose step fits {_where(device, limit)}; compiled: {tried}", peaks)
    return RematChoice(remat, f"no policy's step fits {_where(device, limit)} ({tried}): kept the lightest", peaks)


def _compiled_peak(model, x, y, sample_weight):
    """The step's compiled footprint in bytes, or None when the compiler refused it for memory."""
    try:
        _, memory = compile_fit_step(model, keras.distribution.distribution(), x, y, sample_weight=sample_weight)
    except Exception as error:  # noqa: BLE001 (jax's XlaRuntimeError; only an out-of-memory refusal is kept)
        if "RESOURCE_EXHAUSTED" not in str(error):
            raise
        return None
    return memory.peak


def _where(device, limit):
    memory = format_bytes(limit, 2) if limit else "its memory"
    return f"{memory} of this {device.device_kind}"


def _size(peak):
    return "out of memory" if peak is None else format_bytes(peak, 2)
