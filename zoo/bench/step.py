"""``zoo bench step``: the training step of a named GPT, measured on the devices JAX finds.

The step is the one the jobs run: the model ``zoo train gpt`` builds (its precision,
remat, scan and loss-chunk settings) compiled as ``zoo train gpt`` compiles it (method
``train``) or as ``zoo finetune`` does (``full``, ``lora``), trained by ``model.fit`` on
random tokens: on one device with no distribution (layout ``single``), on several under
layout ``data`` over all of them.

What it reports (one row per model):

- step time: what a fit of 2 x ``steps`` steps takes more than a fit of ``steps``, per
  step (wall clock around ``fit``, its per-step host work included), the median of
  ``repeats`` interleaved pairs after one fit that compiles and one warm fit: a step inside
  a long epoch. A fit's own fixed cost (its data adapter and callbacks, the variables
  written back at the end) is its own column, not spread over the steps;
- tokens/s and MFU: model FLOPs (``zoo.measure.mfu``: 6 x matmul weights + attention,
  causal halved; LoRA 4 x weights, no weight gradients; remat's recomputation not
  counted) over the step time and the devices' peak;
- compile: the first fit's time less one step;
- memory: the device's peak, from its own counters (``memory_stats()``: the buffers in
  use plus what the runtime reserved for the program's temporaries, ``_step_timing.
  device_memory``), and the compiled step's footprint as the device's own compiler lays
  it out (``zoo.measure.compiled_step.compile_fit_step``: arguments + outputs not aliased
  to them + temporaries, per device; one more compile of the same step). ``--plan``
  compares the plan's peak with both;
- with ``--profile``, where the device's time goes (``_device_profile``);
- with ``--plan``, what ``zoo plan`` says of the same step on this device kind;
- with ``--peer keras-hub``, the same sizes in keras-hub's Llama, in a subprocess
  (``_step_peer``) run before this process opens the devices, parameter counts checked equal.
"""

import dataclasses
import functools
import math
import tempfile

from zoo._compat import hlo_text_with_constants
from zoo.bench._output import publish, size_text
from zoo.bench._step_timing import device_memory, random_tokens, step_row, time_fits
from zoo.config.choices import AUTO


def run_benchmark(settings, report=print):
    """Measure ``settings`` (``StepBenchSettings``); report the markdown; return the rows."""
    # The peer first, in its subprocess, before this process opens the devices: a TPU chip
    # is held by one process at a time (with the zoo's row first, the peer found it taken).
    from zoo.bench._step_peer import check_same_parameters, measure_peer  # pure Python until a peer runs

    peer = measure_peer(settings, report) if settings.peer else None
    row = measure_zoo(settings, report)
    rows = [row]
    if peer:
        check_same_parameters(peer, row)
        rows.append(peer)
    plan = None
    if settings.plan:  # the step measured: zoo plan of the job, or the plan's time of this step's own program
        plan = row.pop("own_plan", None) or plan_row(dataclasses.replace(settings, remat=row["remat"]), report)
    text = format_report(settings, rows, plan)
    publish(text, settings, report)
    return rows


# --- the zoo's model -----------------------------------------------------------------


def train_settings(settings):
    """The ``GPTTrainSettings`` of the job whose model and step ``settings`` measure."""
    import jax

    from zoo.config.settings import GPTTrainSettings

    devices = jax.device_count()
    if settings.batch_size % devices:
        raise ValueError(
            f"--batch-size {settings.batch_size} does not split over this host's {devices} devices (layout data): "
            f"use a multiple of {devices}" + (", or --simulate-devices 1" if jax.default_backend() == "cpu" else "")
        )
    return GPTTrainSettings(
        config_name=settings.config_name,
        num_layers=settings.num_layers,
        layout="single" if devices == 1 else "data",
        precision=settings.precision,
        remat=settings.remat,
        scan_layers=settings.scan_layers,
        sequence_length=settings.sequence_length,
        batch_size=settings.batch_size,
        loss_chunk_size=settings.loss_chunk_size,
        seed=settings.seed,
    )


def build_zoo(settings, report=print):
    """``(model, RematChoice)``: the job's GPT, compiled for ``settings.method``, its
    distribution set globally, its remat applied (``--remat auto``:
    ``zoo.training.remat_choice``, the choice reported)."""
    import keras

    from zoo import distribution as zd
    from zoo.training.gpt import build_for_training, compile_gpt, resolve_distribution
    from zoo.training.lm_finetune import compile_causal_lm, make_optimizer, prepare_causal_lm
    from zoo.training.lora.quantized import quantized_policy
    from zoo.training.loss_chunk_choice import resolve_loss_chunk
    from zoo.training.optimizers import state_options
    from zoo.training.remat_choice import apply_remat

    job = train_settings(settings)
    distribution = resolve_distribution(job)
    keras.utils.set_random_seed(settings.seed)
    policy = None
    if settings.method == "qlora":  # the base built quantized, its values random (random_quantized_weights)
        policy = quantized_policy(settings.precision, settings.quantize or "int8")
    model = zd.build_distributed(lambda: build_for_training(job, policy), distribution)  # stays set: fit reads it
    if policy is not None:
        random_quantized_weights(model, settings.seed)
    chunk = resolve_loss_chunk(
        settings.loss_chunk_size, model, settings.batch_size, settings.sequence_length, report=report
    )  # --loss-chunk-size auto: reported
    if settings.method == "train":
        compile_gpt(model, 1e-4, 1000, loss_chunk_size=chunk, **state_options(settings))
    else:
        prepare_causal_lm(model, settings.method, lora_rank=settings.lora_rank, quantize=settings.quantize)
        optimizer = make_optimizer("adam", method=settings.method, **state_options(settings))
        compile_causal_lm(model, optimizer, chunk)
    batch = ((settings.batch_size, settings.sequence_length), "int32")
    return model, apply_remat(model, settings.remat, batch, batch, report=report)


WEIGHT_STD = 0.02  # the random base's weights: uniform with this standard deviation


def random_quantized_weights(model, seed):
    """Random values for the int8 / int4 kernels of ``model`` (or a layer; built quantized, zeros: a
    layer's, or a stack's of every block, ``blocks/.../kernel`` (1, L, ...)), made on the
    device: the step's time does not depend on them, and quantizing 8B float weights
    through Keras' host-side quantizer (``fill_quantized``) takes minutes. int8: q uniform
    in [-127, 127], w = q / scale; int4 (a kernel with a ``kernel_zero``): two nibbles a
    byte, each uniform in [-8, 7], zero point 0, w = q * scale; scales so that w has std
    ``WEIGHT_STD``."""
    import jax.numpy as jnp

    for index, weights in enumerate(_quantized_kernels(model)):
        int4 = "kernel_zero" in weights
        kernel = weights["kernel"]
        values = hashed_bytes(tuple(kernel.shape), jnp.uint32((seed * 1_000_003 + index) % 2**32))
        kernel.assign(values if int4 else jnp.maximum(values, -127))
        half_range = WEIGHT_STD * 3**0.5  # uniform on [-a, a] has std a / sqrt(3)
        scale = half_range / 8 if int4 else 127 / half_range
        weights["kernel_scale"].assign(jnp.full(weights["kernel_scale"].shape, scale, weights["kernel_scale"].dtype))
        if "kernel_zero" in weights:
            weights["kernel_zero"].assign(jnp.zeros(weights["kernel_zero"].shape, weights["kernel_zero"].dtype))


def _quantized_kernels(model):
    """``[{name: variable}]``: each quantized kernel of ``model`` (an int8 ``.../kernel``)
    with its siblings (``kernel_scale``, and int4's ``kernel_zero``), in ``model.weights``' order."""
    groups = {}
    for variable in model.weights:
        prefix, _, name = variable.path.rpartition("/")
        groups.setdefault(prefix, {})[name] = variable
    return [group for group in groups.values() if "kernel" in group and "kernel_scale" in group]


def hashed_bytes(shape, seed):
    """int8 (``shape``), each byte uniform over [-128, 127]: the top byte of the murmur3
    finalizer of the element's index mixed with ``seed`` (uint32). An integer hash, not
    ``jax.random``: on a TPU v5e, XLA took 27-52 s to compile each ``jax.random.randint``
    at qwen3_8b's kernel shapes (183 s for five of them); this compiles like any
    elementwise program, once a shape."""
    return _hash_program(tuple(shape))(seed)


@functools.cache
def _hash_program(shape):
    import jax
    import jax.numpy as jnp

    @jax.jit
    def draw(seed):
        h = jax.lax.iota(jnp.uint32, math.prod(shape)) * jnp.uint32(0x9E3779B1) + seed  # (size,) u32
        for shift, factor in ((16, 0x85EBCA6B), (13, 0xC2B2AE35)):
            h = (h ^ (h >> shift)) * jnp.uint32(factor)
        h = h ^ (h >> 16)
        return jax.lax.bitcast_convert_type((h >> 24).astype(jnp.uint8), jnp.int8).reshape(shape)

    return draw


def flops_per_step(settings, model):
    """Model FLOPs of one step (``zoo.measure.mfu``; LoRA: the 4 x parameters convention)."""
    from zoo.measure import mfu

    config, length = model.get_config(), settings.sequence_length
    per_token = (
        mfu.gpt_lora_flops_per_token(config, length)
        if settings.method in ("lora", "qlora")
        else mfu.gpt_flops_per_token(config, length)
    )
    return per_token * settings.batch_size * length


def compiled_step(model, settings):
    """``(compiled, StepMemory)``: the step as this backend compiles it (its per-device
    footprint: ``StepMemory.peak``)."""
    import keras

    from zoo.measure.compiled_step import compile_fit_step

    batch = (settings.batch_size, settings.sequence_length)
    return compile_fit_step(model, keras.distribution.distribution(), (batch, "int32"), (batch, "int32"))


def measure_zoo(settings, report=print):
    """One row: the zoo's GPT step (the module docstring's figures)."""
    from zoo.layers import float_parameter_count

    model, remat = build_zoo(settings, report)
    x, y = random_tokens(settings, model.backbone.vocabulary_size, 2 * settings.steps * settings.batch_size)

    def fit(steps):
        rows = steps * settings.batch_size
        model.fit(x[:rows], y[:rows], batch_size=settings.batch_size, epochs=1, shuffle=False, verbose=0)

    parameters = float_parameter_count(model)  # a QLoRA base as its float model counts it
    report(f"zoo: {settings.config_name}, {parameters:,} parameters; compiling and timing ...")
    compile_s, steps, fit_overhead = time_fits(fit, settings)
    row = step_row("zoo", parameters, compile_s, steps, flops_per_step(settings, model), settings)
    row["fit_overhead_s"] = fit_overhead
    # --remat auto compiled this very step (model, batch) to choose: its footprint, not one more compile,
    # unless the plan of a fine-tune reads the compiled program itself
    own_plan = settings.plan and settings.method != "train"
    peak, compiled = remat.peaks.get(remat.remat), None
    if peak is None or own_plan:
        compiled, memory = compiled_step(model, settings)
        peak = peak or memory.peak
    row.update(device_memory(report), compiled_bytes=peak)
    row["attention"] = _attention_words(model, settings)
    row["remat"] = remat.remat
    row["loss_chunk"] = model.loss_chunk_size
    if own_plan:
        row["own_plan"] = own_step_plan(hlo_text_with_constants(compiled), settings, peak)
    if settings.profile:
        row["profile"] = profile_steps(fit)
    return row


def _attention_words(model, settings):
    """What the blocks' attention runs, in words: the first block's, or a stack's template's."""
    backbone = model.backbone
    block = backbone.pipelined_blocks.template[0] if backbone.stacked else backbone.get_layer("block_0")
    return block.attention.describe_implementation(settings.sequence_length)


def profile_steps(fit, steps=3):
    """``DeviceProfile`` of ``steps`` traced steps (None where the trace names no op)."""
    import jax

    from zoo.bench._device_profile import device_profile, read_trace
    from zoo.training.logs.profile import trace_options

    folder = tempfile.mkdtemp(prefix="zoo-bench-step-trace-")
    with jax.profiler.trace(folder, create_perfetto_trace=True, profiler_options=trace_options()):
        fit(steps)
    return device_profile(read_trace(folder), steps=steps)


# --- zoo plan beside it ---------------------------------------------------------------


def plan_row(settings, report=print):
    """What ``zoo plan`` says of the same step (method train: the pretrain_gpt job) on this
    host's device kind, or ``{"error": ...}``."""
    import jax

    from zoo.measure.hardware import local_device
    from zoo.planning.plan import PlanRequest, make_plan
    from zoo.training.optimizers import state_options

    if settings.method != "train":
        return {"error": f"zoo plan sizes the pre-training step; method {settings.method!r} is not planned"}
    try:
        device, _ = local_device()
    except ValueError as error:
        return {"error": str(error)}
    job = train_settings(settings)
    fields = ("config_name", "num_layers", "layout", "precision", "remat", "scan_layers", "sequence_length")
    config = {name: getattr(job, name) for name in fields} | {"batch_size": job.batch_size}
    config |= state_options(settings)  # the optimizer state the bench's step holds (bfloat16, factored ...)
    if job.loss_chunk_size:
        config["loss_chunk_size"] = job.loss_chunk_size
    where = "here" if device != "cpu" else "on CPU"  # compiles_here: by the chip's own compiler
    report(f"zoo plan: compiling the same step for {jax.device_count()} x {device} {where} ...")
    plan = make_plan(PlanRequest("pretrain_gpt", config, jax.device_count(), device=device, depth="full"))
    return {"peak_bytes": plan.peak, "step_s": plan.time.step_s, "mfu": plan.mfu, "notes": list(plan.notes)}


def own_step_plan(hlo_text, settings, peak_bytes):
    """What ``zoo plan``'s time model says of this very step where ``zoo plan`` has no job for
    it (a fine-tune of a named config): the ops of its compiled program (``hlo_text``) at the
    measured rates of this device (``roofline.op_step_time``), or ``{"error": ...}`` where
    none were measured."""
    from zoo.measure.hardware import UnknownDeviceError, local_device
    from zoo.measure.hlo_ops import executed_ops
    from zoo.planning.roofline import MEASURED_RATES, op_step_time

    try:
        rates = MEASURED_RATES.get(local_device()[0])
    except (UnknownDeviceError, ValueError):
        rates = None
    if rates is None:
        return {"error": "no measured rates for this device (zoo.planning.roofline.MEASURED_RATES)"}
    op_time = op_step_time(executed_ops(hlo_text), rates)
    note = (
        f"method {settings.method}: the plan's op-by-op time of this step's own compiled program ({op_time.ops:,} ops)"
    )
    return {"peak_bytes": peak_bytes, "step_s": op_time.step_s, "mfu": None, "notes": [note]}


# --- the report -------------------------------------------------------------------------


def _optimizer_words(settings):
    """ ", moments bfloat16, second moment factored" where they are not the defaults; else nothing."""
    words = [f"moments {settings.moment_dtype}"] if settings.moment_dtype != "float32" else []
    words += [f"second moment {settings.second_moment}"] if settings.second_moment != "full" else []
    words += [f"moments in {settings.state_memory} memory"] if settings.state_memory != "device" else []
    return "".join(f", {word}" for word in words)


def _remat_words(settings, rows):
    """The zoo row's remat policy, "(auto)" after it when ``--remat auto`` chose it."""
    chosen = rows[0].get("remat", settings.remat)
    return f"{chosen} (auto)" if settings.remat == "auto" else chosen


def _loss_words(settings, rows):
    """ ", loss in chunks of 512" (", ... (auto)" when --loss-chunk-size auto chose it); nothing for the whole."""
    chunk, auto = rows[0].get("loss_chunk"), " (auto)" if settings.loss_chunk_size == AUTO else ""
    return f", loss in chunks of {chunk}{auto}" if chunk else (f", loss from the whole logits{auto}" if auto else "")


def format_report(settings, rows, plan=None):
    """Markdown: the settings line, one table row per model, then the plan and profile."""
    import jax
    import keras

    devices = jax.devices()
    lines = [
        f"{len(devices)} x {devices[0].device_kind} ({jax.default_backend()}); {settings.config_name}"
        + (f" at {settings.num_layers} layers" if settings.num_layers else "")
        + f", method {settings.method}"
        + (f" (rank {settings.lora_rank})" if settings.method in ("lora", "qlora") else "")
        + (f", base {settings.quantize or 'int8'}" if settings.method == "qlora" else "")
        + f", batch {settings.batch_size} x T {settings.sequence_length}, {settings.precision}, remat {_remat_words(settings, rows)}"
        + (", scanned blocks" if settings.scan_layers else "")
        + _loss_words(settings, rows)
        + _optimizer_words(settings)
        + f"; a step: what a fit of {2 * settings.steps} steps adds over one of {settings.steps}, median of"
        + f" {settings.repeats} interleaved pairs; jax {jax.__version__}, keras {keras.__version__}",
        "",
        "| model | parameters | step | tokens/s | MFU | compile | a fit's start and end | device peak | compiled step | attention |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for row in rows:
        lines.append(_table_line(row))
    if plan is not None:
        lines += ["", _plan_line(rows[0], plan)]
    for row in rows:
        if row.get("profile"):
            from zoo.bench._device_profile import format_profile

            lines += ["", f"{row['model']}: " + format_profile(row["profile"], row["step_s"])]
        elif settings.profile and "error" not in row:
            lines += ["", f"{row['model']}: the trace names no device op on this backend (no profile table)."]
    return "\n".join(lines)


def _table_line(row):
    if "error" in row:
        return f"| {row['model']} | | | | | | | | | {row['error']} |"
    mfu = f"{row['mfu']:.1%}" if row.get("mfu") else "-"
    sizes = [size_text(row[key]) if row.get(key) else "-" for key in ("peak_bytes", "compiled_bytes")]
    return (
        f"| {row['model']} | {row['parameters']:,} | {row['step_s'] * 1e3:.1f} ms | {row['tokens_per_s']:,.0f} | "
        f"{mfu} | {row['compile_s']:.1f} s | {row.get('fit_overhead_s', 0) * 1e3:.0f} ms | {sizes[0]} | {sizes[1]} | "
        f"{row.get('attention', '')} |"
    )


def _plan_line(row, plan):
    if "error" in plan:
        return f"zoo plan: {plan['error']}"
    against = [
        f"{plan['peak_bytes'] / row[key] - 1:+.1%} against the {size_text(row[key])} {words}"
        for key, words in (("compiled_bytes", "compiled"), ("peak_bytes", "the device's counters read"))
        if row.get(key)
    ]
    memory = f"peak {size_text(plan['peak_bytes'])}" + (f" ({', '.join(against)})" if against else "")
    time_text = f"step {plan['step_s'] * 1e3:.1f} ms ({plan['step_s'] / row['step_s'] - 1:+.1%} against the measured)"
    return f"zoo plan for this step: {memory}, {time_text}" + "".join(f"; {note}" for note in plan["notes"])
