"""The GPT jobs behind ``zoo train gpt`` and ``zoo generate``."""

import keras
import numpy as np

from zoo import distribution as zd
from zoo.config.choices import AUTO
from zoo.config.layouts import pipelined
from zoo.config.settings import GenerateSettings, GPTTrainSettings  # noqa: F401 (the settings of these jobs)
from zoo.data import (
    ByteTokenizer,
    DivisibleBatches,
    load,
    local_batching,
    process_rows,
    unigram_entropy,
)
from zoo.distribution import multihost
from zoo.distribution.axes import STAGE
from zoo.distribution.mesh import resolve_mesh_shape
from zoo.kernels.pipeline import check_schedule, num_ticks
from zoo.measure import mfu
from zoo.models import GPTCausalLM, GPTCausalLMPreprocessor
from zoo.models.dtype_policy import dtype_policy_scope
from zoo.models.gpt import non_finite_error
from zoo.training._checkpointed_fit import check_checkpoint_options, checkpointed_fit
from zoo.training.job_setup import (
    job_distribution,
    report_setup,
    run_dir_of,
)
from zoo.training.logs.profile import ProfileSteps
from zoo.training.logs.report import StepReport
from zoo.training.loss_chunk_choice import resolve_loss_chunk
from zoo.training.optimizers import AdamW, state_options
from zoo.training.paths import check_job_paths, save_model_atomically
from zoo.training.remat_choice import resolve_remat
from zoo.training.saving import check_prompt_fits, load_causal_lm


def resolve_distribution(settings, mesh=None):
    """The job's distribution for ``settings`` (on ``mesh``, default ``settings.mesh``), its
    layout map fitted to the named model (e.g. no ``lm_head`` rule for tied embeddings).
    Layout ``pipeline``: the layers must split into stages x repeats groups, and the
    batch per data shard into the micro-batches (``ValueError`` naming the flags); with
    no mesh, the default's stage axis is fitted to the layers like any layout's split
    axis (``zd.distribution_for``)."""
    mesh = settings.mesh if mesh is None else mesh
    if pipelined(settings.layout) and mesh is not None:
        _check_pipeline_depth(
            settings, _stage_count(mesh, settings.layout)
        )  # naming the flags, before the layout map's check
    model_config = GPTCausalLM.named_config(settings.config_name, settings.layout, **_model_overrides(settings))
    distribution = job_distribution(GPTCausalLM, settings, mesh, model_config=model_config)
    if pipelined(settings.layout):
        check_pipeline_batch(settings, distribution)
    return distribution


def _model_overrides(settings, distribution=None, num_layers=None):
    """The named config's entries the job replaces: depth (``num_layers``, default
    ``settings.num_layers``; ``named_config`` fits the per-layer pattern to it: Gemma's
    windowed blocks, sparse blocks), and layout pipeline's schedule, repeats and (once the
    mesh is known) micro-batches."""
    num_layers = settings.num_layers if num_layers is None else num_layers
    overrides = {} if num_layers is None else {"num_layers": num_layers}
    overrides.update(moe_overrides(settings))
    if getattr(settings, "scan_layers", False):
        overrides["scan_layers"] = True
    if pipelined(settings.layout):
        overrides.update(schedule=settings.schedule, repeats=settings.repeats)
        if distribution is not None:
            overrides["micro_batches"] = micro_batches_of(settings, distribution)
    return overrides


MOE_SETTINGS = ("capacity_factor", "expert_exchange", "router_aux_loss_coefficient", "router_z_loss_coefficient")


def moe_overrides(settings):
    """The Mixture-of-Experts fields ``settings`` gives (``MOE_SETTINGS`` not None), as
    model overrides; ``ValueError`` naming them when the named config has no experts."""
    given = {key: getattr(settings, key) for key in MOE_SETTINGS if getattr(settings, key, None) is not None}
    if given and not GPTCausalLM.named_config(settings.config_name).get("num_experts"):
        flags = ", ".join(f"--{key.replace('_', '-')} {value}" for key, value in given.items())
        raise ValueError(
            f"{flags}: settings of a Mixture-of-Experts model, but --config-name {settings.config_name} has no experts; "
            f"leave them out or use an MoE config (e.g. gpt_tiny_moe)"
        )
    return given


def _stage_count(mesh, layout=None):
    """S: the ``stage`` axis of ``mesh`` (a spec, None for ``layout``'s default, or a mesh)."""
    import jax

    if mesh is None or isinstance(mesh, str):
        spec = mesh or zd.default_mesh_spec(layout, len(jax.devices()))
        return dict(resolve_mesh_shape(zd.parse_mesh_spec(spec), len(jax.devices()))).get(STAGE, 1)
    return zd.mesh_axis_size(mesh, STAGE) if STAGE in mesh.axis_names else 1


def micro_batches_of(settings, distribution):
    """M: ``settings.micro_batches``, or as many as the distribution's mesh has stages."""
    if settings.micro_batches is not None:
        return settings.micro_batches
    mesh = getattr(distribution, "device_mesh", None)
    return _stage_count(mesh) if mesh is not None else 1


def _check_pipeline_depth(settings, stages):
    layers = settings.num_layers or GPTCausalLM.named_config(settings.config_name)["num_layers"]
    groups = stages * settings.repeats
    if layers % groups:
        given = (
            f"--num-layers {layers}"
            if settings.num_layers
            else f"--config-name {settings.config_name} has {layers} layers, which"
        )
        raise ValueError(
            f"layout pipeline: {given} do not split into --repeats {settings.repeats} x {stages} stages = {groups} equal groups of blocks; "
            f"give --num-layers a multiple of {groups}, or fewer stages (--mesh) or repeats"
        )


def check_pipeline_batch(settings, distribution, batch_size=None):
    """Raise ``ValueError`` naming the numbers unless the batch per data shard
    (``batch_size``, default ``settings.batch_size``, over the data axis) divides into the
    micro-batches, and the schedule can run (``zoo.kernels.pipeline.check_schedule``)."""
    batch_size = settings.batch_size if batch_size is None else batch_size
    data, micro = zd.data_parallel_size(distribution), micro_batches_of(settings, distribution)
    stages = _stage_count(distribution.device_mesh)
    check_schedule(num_stages=stages, micro_batches=micro, repeats=settings.repeats)
    per_shard = batch_size // data
    if batch_size % data or per_shard % micro:
        raise ValueError(
            f"layout pipeline: --batch-size {batch_size} is {batch_size / data:g} rows per data shard ({data} data shards), which do "
            f"not divide into --micro-batches {micro}; use a batch that is a multiple of {data * micro}, or fewer micro-batches"
        )


def build_gpt(settings, overrides=None):
    """``GPTCausalLM`` from a named config with the job's overrides (depth, dropout, seed,
    remat) and what its layout needs (``tp+sp``: ``megatron_sp=True``; ``pipeline``: the
    schedule, repeats and micro-batches, M defaulting to the current distribution's stages)."""
    overrides = overrides or {}
    pipeline = _model_overrides(settings, keras.distribution.distribution(), overrides.get("num_layers"))
    return GPTCausalLM.from_config_name(
        settings.config_name,
        settings.layout,
        dropout=settings.dropout,
        seed=settings.seed,
        # auto is decided on the built model (remat_choice.resolve_remat); until then nothing is recomputed
        remat="none" if settings.remat == AUTO else settings.remat,
        **{**pipeline, **overrides},
    )


def build_for_training(settings, policy=None, **model_overrides):
    """The GPT under the job's precision policy (or ``policy``: a QLoRA base's
    ``zoo.training.lora.quantized.quantized_policy``), with its blocks rematerialised as
    ``settings.remat`` says (``TransformerBlock``'s ``remat``). ``model_overrides``
    replace config entries (e.g. ``num_layers=2`` for a compile-only memory check)."""
    with dtype_policy_scope(settings.precision if policy is None else policy):
        return build_gpt(settings, model_overrides)


def compile_gpt(
    model,
    learning_rate,
    total_steps,
    weight_decay=0.01,
    gradient_accumulation_steps=1,
    loss_chunk_size=None,
    **state,
):
    """AdamW with a cosine schedule over ``total_steps`` updates, global-norm clipping at 1,
    its state shaped by ``state`` (``moment_dtype``, ``second_moment``, ``state_memory``:
    ``zoo.training.optimizers.AdamW``, ``state_options``); ``loss_chunk_size``
    t: the loss from the hidden states, t positions of every row at a time, never the whole
    (B, T, V) float32 logits (``GPTCausalLM(loss_chunk_size=...)``)."""
    if loss_chunk_size is not None:
        model.loss_chunk_size = loss_chunk_size  # checked by the model
    schedule = keras.optimizers.schedules.CosineDecay(learning_rate, decay_steps=max(total_steps, 1), alpha=0.1)
    accumulate = gradient_accumulation_steps if gradient_accumulation_steps > 1 else None
    model.compile(
        optimizer=AdamW(
            learning_rate=schedule,
            weight_decay=weight_decay,
            global_clipnorm=1.0,
            gradient_accumulation_steps=accumulate,
            **state,
        ),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )


def train(settings, report=print):
    """Train a GPT on a byte-level corpus; returns a dict of results.

    Reports the validation loss (nats per byte) after each epoch next to the corpus'
    unigram entropy, the loss of a model that ignores context. Under multi-host
    training (``zoo.distribution.multihost.initialize`` first) each process reads and
    feeds only its own rows; only process 0 prints and saves.
    """
    _check_dataset(settings.dataset)
    check_checkpoint_options(settings)
    check_job_paths(settings)
    report = report if multihost.is_primary() else (lambda *_: None)
    distribution = multihost.feed_process_local_data(resolve_distribution(settings))
    report_setup(distribution, report)
    x, y, xv, yv, entropy = _load_corpus(settings)
    report(
        f"dataset: {settings.dataset}: {x.shape[0]} training windows of {settings.sequence_length} bytes per process; unigram entropy {entropy:.3f} nats/byte"
    )
    train_data, validation_data = _batches(settings, distribution, x, y, xv, yv)
    steps = len(train_data)
    keras.utils.set_random_seed(settings.seed)
    model = zd.build_distributed(lambda: build_for_training(settings), distribution)
    updates = steps * settings.epochs // settings.gradient_accumulation_steps
    compile_gpt(
        model,
        settings.learning_rate,
        updates,
        settings.weight_decay,
        settings.gradient_accumulation_steps,
        resolve_loss_chunk(
            settings.loss_chunk_size, model, settings.batch_size, settings.sequence_length, report=report
        ),
        **state_options(settings),
    )
    batch = ((settings.batch_size, settings.sequence_length), "int32")
    remat = resolve_remat(model, settings.remat, batch, batch, report=report)
    report(f"model: {settings.config_name}, {model.count_params():,} parameters, remat {remat}")
    for line in zd.format_sharding_summary(model):
        report("  " + line)
    report(_blocks_line(settings, model, distribution))
    callbacks = _callbacks(settings, model, entropy, report)
    verbose = 2 if multihost.is_primary() else 0
    data = {
        "dataset": settings.dataset,
        "sequence_length": settings.sequence_length,
        "windows": len(x),
        "batch_size": settings.batch_size,
        "seed": settings.seed,
        "steps_per_epoch": len(train_data),
    }
    history = checkpointed_fit(
        model,
        train_data,
        settings=settings,
        data=data,
        epochs=settings.epochs,
        validation_data=validation_data,
        callbacks=callbacks,
        report=report,
        verbose=verbose,
        run_dir=run_dir_of(settings.output),
    )
    _save(model, settings, report)
    return {"history": history, "unigram_entropy": entropy, "model": model}


def _save(model, settings, report):
    """The trained model to ``settings.output`` from process 0, refused (and the run's
    folder kept) where a weight is not finite; every process runs the probe."""
    problem = non_finite_error(model, settings.output)  # every process runs the probe (its collectives)
    if multihost.is_primary():
        save_model_atomically(
            model,
            settings.output,
            fallback_folders=[settings.checkpoint_dir, run_dir_of(settings.output)],  # beside the run, not in cwd
            refused=problem,
        )
        report(f"saved model to {settings.output}")
    elif problem is not None:
        raise problem


# Why blocks stay layers unless --scan-layers (docs/performance.md, sixth session): on one TPU v5e a scanned
# step was 7% (qwen3_0.6b, 28 blocks) to 17% (gpt_1b, 8 blocks) slower and compiled 2.9-8.9x faster.
SCAN_TRADE = "--scan-layers stacks them: compile time flat in depth, a step 7-17% slower on a TPU v5e"


def _blocks_line(settings, model, distribution):
    """How the blocks run: the attention kernel, or under layout pipeline the schedule,
    its micro-batches and the share of stage-ticks that do work, R*M / (R*M + S - 1)."""
    backbone = model.backbone
    if not backbone.stacked:
        return (
            f"attention: {backbone.blocks[0].attention.describe_implementation(settings.sequence_length)}; "
            f"blocks as {backbone.num_layers} layers ({SCAN_TRADE})"
        )
    if backbone.schedule is None:
        return f"blocks: {backbone.num_layers} stacked, run by one scan (scan_layers)"
    stages, micro, repeats = _stage_count(distribution.device_mesh), backbone.micro_batches, backbone.repeats
    ticks = num_ticks(num_stages=stages, micro_batches=micro, repeats=repeats)
    rows = settings.batch_size // zd.data_parallel_size(distribution) // micro
    return (
        f"pipeline: schedule {backbone.schedule}, {stages} stages x {repeats} repeat(s) of {backbone.num_layers // (stages * repeats)} "
        f"block(s), {micro} micro-batches of {rows} row(s) per data shard; {ticks} ticks, useful {repeats * micro}/{ticks} "
        f"= {100 * repeats * micro / ticks:.0f}%"
    )


def _check_dataset(name):
    """A language-modelling dataset, before any work (an image dataset fails deep in the model otherwise)."""
    from zoo.data import catalog

    task = catalog.get_spec(name).task
    if task != catalog.LANGUAGE_MODELING:
        corpora = [spec.name for spec in catalog.DATASETS.values() if spec.task == catalog.LANGUAGE_MODELING]
        raise ValueError(
            f"--dataset {name!r} is {task} data; zoo train gpt needs {catalog.LANGUAGE_MODELING} data: {', '.join(corpora)}"
        )


def _load_corpus(settings):
    """This process's training rows and the validation rows: int32 (N, T) windows and
    their next-byte labels, plus the unigram entropy of the training bytes."""
    x, y = load(settings.dataset, "train", data_dir=settings.data_dir, sequence_length=settings.sequence_length)
    xv, yv = load(settings.dataset, "validation", data_dir=settings.data_dir, sequence_length=settings.sequence_length)
    entropy = unigram_entropy(x)
    rows = process_rows(len(x))
    return x[rows.start : rows.stop], y[rows.start : rows.stop], xv, yv, entropy


def _batches(settings, distribution, x, y, xv, yv):
    """Training (shuffled, last partial batch dropped) and validation (padded) batches of
    this process's share of the global batch, in the distribution's sequence order."""
    multiple = zd.data_parallel_size(distribution)
    if pipelined(settings.layout):  # a padded last batch still divides into the micro-batches on every data shard
        multiple *= micro_batches_of(settings, distribution)
    batch_size, multiple_of = local_batching(settings.batch_size, multiple)
    if settings.steps_per_epoch is not None:  # a fixed subset, so an epoch (and a resumable data position) is N steps
        x, y = x[: settings.steps_per_epoch * batch_size], y[: settings.steps_per_epoch * batch_size]
    x, y, xv, yv = _prepare_for(distribution, x, y, xv, yv)
    train_data = DivisibleBatches(
        x, y, batch_size=batch_size, multiple_of=multiple_of, remainder="drop", shuffle=True, seed=settings.seed
    )
    validation_data = DivisibleBatches(xv, yv, batch_size=batch_size, multiple_of=multiple_of, remainder="pad")
    return train_data, validation_data


def _callbacks(settings, model, entropy, report):
    tokens_per_step = settings.batch_size * settings.sequence_length
    flops_per_step = mfu.gpt_flops_per_token(model.get_config(), settings.sequence_length) * tokens_per_step
    peak = _peak_flops(settings.peak_tflops)
    callbacks = [
        StepReport(
            tokens_per_step,
            unit="tokens",
            flops_per_step=flops_per_step,
            peak_flops_per_device=peak,
            every=settings.report_every,
            report=report,
        ),
        _ValidationVsEntropy(entropy, report),
    ]
    if settings.profile_dir:
        callbacks.append(ProfileSteps(settings.profile_dir, num_steps=settings.profile_steps))
    return callbacks


def _peak_flops(peak_tflops):
    """Device peak FLOP/s for MFU, or None where unknown (CPU): MFU is then left out."""
    try:
        return mfu.resolve_peak_flops(peak_tflops)
    except mfu.UnknownDeviceError:
        return None


def _prepare_for(distribution, *arrays):
    """Token arrays in the order the distribution's input pipeline wants (load-balanced
    sequence order under a balancing context-parallel distribution)."""
    prepare = getattr(distribution, "prepare", None)
    if prepare is None:
        return arrays
    return [np.asarray(prepare(array)) for array in arrays]


class _ValidationVsEntropy(keras.callbacks.Callback):
    def __init__(self, entropy, report):
        super().__init__()
        self.entropy, self.report = entropy, report

    def on_epoch_end(self, epoch, logs=None):
        loss = (logs or {}).get("val_loss")
        if loss is not None:
            self.report(
                f"epoch {epoch + 1}: validation loss {loss:.3f} nats/byte ({loss / self.entropy:.2f}x the unigram entropy {self.entropy:.3f})"
            )


def generate(settings, report=print):
    """Continue ``settings.prompt`` with a saved GPT, printing the text as it is generated;
    returns it (prompt + continuation). With ``settings.chat`` the prompt is a user's message
    through the model's chat template, and the reply alone is printed and returned.

    ``settings.model``: a ``.keras`` file, a shipped preset's name, a preset folder, or a
    Hugging Face folder / ``hf://org/name`` (``GPTCausalLM.from_preset``). The text goes
    through the model's preprocessor; a model without one gets a ``GPTCausalLMPreprocessor``
    on the preset's tokenizer, else on bytes (``ByteTokenizer``, what ``zoo train gpt``
    trains on). ``report`` is print-like: it takes ``end=`` and ``flush=``.
    """
    if not settings.chat:  # a chat prompt's length depends on the template: checked once the model is loaded
        check_prompt_fits(
            settings.model, settings.prompt, settings.max_new_tokens
        )  # from the config: before a slow load
    model = load_causal_lm(settings.model)  # with its preset's tokenizer when it has one
    if model.preprocessor is None:
        tokenizer = ByteTokenizer()
        if tokenizer.vocabulary_size != model.backbone.vocabulary_size:
            raise ValueError(
                f"{settings.model} has no tokenizer for its vocabulary of {model.backbone.vocabulary_size} "
                f"(bytes are {tokenizer.vocabulary_size}): give a folder with its tokenizer"
            )
        model.preprocessor = GPTCausalLMPreprocessor(tokenizer, sequence_length=model.backbone.max_sequence_length)
    prompt = (
        {"messages": [{"role": "user", "content": settings.prompt}]} if settings.chat else {"prompts": settings.prompt}
    )
    model.check_prompt_length(max_new_tokens=settings.max_new_tokens, **prompt)  # before the prompt is printed
    if not settings.chat:  # the text goes on from the prompt; a chat reply stands alone
        report(settings.prompt, end="", flush=True)
    text = model.generate(
        max_new_tokens=settings.max_new_tokens,
        sampler=settings.sampler,
        temperature=settings.temperature,
        top_k=settings.top_k,
        top_p=settings.top_p,
        seed=settings.seed,
        stop_token_ids=settings.stop_ids(),
        stream=lambda pieces: report(pieces[0], end="", flush=True),
        **prompt,
    )
    report("")
    return text
