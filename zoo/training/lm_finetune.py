"""Fine-tune a causal language model (``GPTCausalLM``) with LoRA or fully, under any layout.

The model: a zoo preset holding a ``GPTCausalLM`` (``gpt_tiny_python_docs``), a Hugging
Face Llama-family folder, or ``hf://org/name``. The data: ``{"messages": [...]}`` JSONL
through the tokenizer's chat template with the loss on the assistant turns only
(``zoo.data.chat_files``), ``zoo.data.text_files`` (``{"prompt", "completion"}`` JSONL
with the loss on the completion only, ``{"text"}`` JSONL or plain text packed into
sequences) or a language-modelling dataset's text.

Methods (what the optimizer updates):

======  =========================================================================
lora    rank-r LoRA factors on every Dense / EinsumDense of the backbone (attention
        query, key, value, output; MLP gate, up, down); everything else frozen,
        embeddings and LM head included
qlora   the same factors over those layers' kernels stored in int8 or int4
        (``quantize``; ``zoo.training.lora.quantized``), under layouts single, data
        and fsdp; the job writes the adapter, merged onto the float base by
        ``zoo export BASE OUT --lora ADAPTER``
full    every weight
frozen  refused: it trains a classifier's new head, and a causal LM has none
======  =========================================================================

Python::

    from zoo import distribution as zd
    from zoo.data.text_files import load_text_file, split_held_out
    from zoo.models import GPTCausalLM
    from zoo.training.lm_finetune import causal_lm_config, finetune_causal_lm, load_causal_lm, lm_preprocessor

    path = "Llama-3.2-1B"  # a Hugging Face folder
    distribution = zd.distribution_for(GPTCausalLM, "context", "data=2,seq=4", context_attention="ring",
                                       config=causal_lm_config(path, "context"))
    model = zd.build_distributed(lambda: load_causal_lm(path, "context"), distribution)
    examples = load_text_file("train.jsonl", lm_preprocessor(model, sequence_length=8192))
    train, held_out = split_held_out(examples, 0.1)
    result = finetune_causal_lm(model, train, held_out, method="lora", batch_size=2, epochs=1)
    model.save_to_hf("tuned")  # LoRA merged

The loss is the token mean of the next-token cross-entropy over the labels whose weight
is 1 (``reduction="mean_with_sample_weight"``), in nats; the held-out loss is that mean
over every held-out label that counts.
"""

import functools
import os

import keras
import numpy as np

from zoo import distribution as zd
from zoo.data import DivisibleBatches, get_spec
from zoo.data.catalog import LANGUAGE_MODELING
from zoo.data.text_files import (
    LMExamples,
)
from zoo.file_kinds import regular_file
from zoo.models import GPTCausalLM
from zoo.models.dtype_policy import dtype_policy_scope
from zoo.models.gpt import check_finite_logits
from zoo.presets import save_to_preset
from zoo.presets.save import check_preset_destination
from zoo.training import optimizers
from zoo.training._checkpointed_fit import checkpointed_fit
from zoo.training.callbacks import SynchronousSteps
from zoo.training.causal_lm import (  # noqa: F401 (the model's pieces: imported from here by the jobs and tests)
    FROZEN_REFUSED,
    LM_LEARNING_RATES,
    base_policy,
    causal_lm_config,
    compile_causal_lm,
    is_causal_lm,
    is_hf_folder,
    lm_preprocessor,
    local_preset,
    make_optimizer,
    prepare_causal_lm,
)
from zoo.training.job_setup import job_distribution, new_run_folder, report_setup, run_dir_of
from zoo.training.lm_data import data_source, lm_data, load_lm_file, use_chat_template  # noqa: F401 (load_lm_file: moved)
from zoo.training.logs.report import StepReport
from zoo.training.lora import (
    adapted_layer_count,
    lora_parameter_count,
    merge_lora,
    save_lora,
    save_peft_adapter,
)
from zoo.training.loss_chunk_choice import resolve_loss_chunk
from zoo.training.paths import PathError, check_job_paths, write_or_rescue
from zoo.training.remat_choice import resolve_remat
from zoo.training.saving import load_causal_lm

LORA_FILE = "lora.weights.h5"  # the adapter, written beside the merged model
PEFT_FOLDER = "adapter"  # --adapter-format peft: the adapter's folder inside the output (not its top: transformers
# would read a top-level adapter_config.json as "load the base model, then this adapter")
__all__ = [
    "LMExamples",
    "causal_lm_config",
    "compile_causal_lm",
    "finetune_causal_lm",
    "finetune_lm",
    "heldout_loss",
    "is_causal_lm",
    "lm_preprocessor",
    "load_causal_lm",
    "make_optimizer",
    "prepare_causal_lm",
    "token_batches",
]


# --- batches and the held-out loss ----------------------------------------------------------


class _TokenBatches(DivisibleBatches):
    """Full batches ``(inputs, labels, sample_weight)``, each ``(B, T)``; inputs token_ids,
    or ``{"token_ids", "segment_ids"}`` for packed rows."""

    def __getitem__(self, index):
        inputs, (labels, sample_weight) = super().__getitem__(index)
        return inputs, labels, sample_weight


def token_batches(examples, *, batch_size, distribution=None, shuffle=False, seed=0):
    """``LMExamples`` as full batches of ``batch_size`` for ``fit`` under ``distribution``
    (default: the current one): checked against its data layout (the batch axis, and under
    the context layout the sequence axis) and in its sequence order (load balancing)."""
    distribution = keras.distribution.distribution() if distribution is None else distribution
    replicas = zd.data_parallel_size(distribution)
    if hasattr(distribution, "check_data_shape"):
        distribution.check_data_shape((batch_size, examples.sequence_length))
    if len(examples) < batch_size:
        raise ValueError(
            f"{len(examples)} training example(s) do not fill one batch of {batch_size}; lower the batch size or give more data"
        )
    arrays = (examples.inputs(), examples.labels, examples.sample_weight)
    if getattr(distribution, "prepare", None) is not None:  # the balanced sequence order, segment ids too
        arrays = keras.tree.map_structure(np.asarray, tuple(distribution.prepare(*arrays)))
    inputs, labels, sample_weight = arrays
    return _TokenBatches(
        inputs,
        (labels, sample_weight),
        batch_size=batch_size,
        multiple_of=replicas,
        remainder="drop",
        shuffle=shuffle,
        seed=seed,
    )


def heldout_loss(model, examples, *, batch_size, distribution=None):
    """The compiled loss over ``examples``: the mean over every label that counts, in
    nats (batches padded with weight-0 rows to one shape, each batch's mean weighted by
    its count of labels in the loss). With the model's ``loss_chunk_size`` set, each
    batch's loss is computed in chunks, without the whole logits (``test_on_batch``)."""
    batches = token_batches(examples.padded_to(batch_size), batch_size=batch_size, distribution=distribution)
    total, count = 0.0, 0.0
    for index in range(len(batches)):
        inputs, labels, sample_weight = batches[index]
        tokens = float(sample_weight.sum())
        if tokens:
            total += tokens * float(model.test_on_batch(inputs, labels, sample_weight=sample_weight))
            count += tokens
    if not count:
        raise ValueError("the held-out examples have no label in the loss")
    return total / count


# --- fine-tuning -----------------------------------------------------------------------


def _plain_fit(model, batches, *, epochs, callbacks):
    # shuffle=False: the batches reshuffle their examples from the job's seed (DivisibleBatches);
    # Keras' own shuffle of a PyDataset's batch order draws from the global random state
    return model.fit(
        batches, epochs=epochs, shuffle=False, callbacks=[*callbacks, SynchronousSteps()], verbose=0
    ).history


def finetune_causal_lm(
    model,
    train,
    held_out=None,
    *,
    method="lora",
    lora_rank=4,
    lora_alpha=None,
    optimizer=None,
    loss_chunk_size=None,
    epochs=1,
    batch_size=8,
    seed=0,
    callbacks=(),
    report=print,
    fit=None,
    remat=None,
    quantize=None,
):
    """Fine-tune a freshly loaded ``GPTCausalLM`` on ``train`` (``LMExamples``) under the
    distribution it was built with; returns a dict of results.

    Args:
        model: a ``GPTCausalLM`` (``load_causal_lm`` under ``zd.build_distributed``), not
            yet prepared or compiled.
        train, held_out: ``LMExamples`` (``zoo.data.text_files``); ``held_out`` None skips
            the held-out loss.
        method: ``"lora"``, ``"qlora"`` or ``"full"`` (``prepare_causal_lm``).
        lora_rank, lora_alpha: the LoRA factors' rank r and scale alpha (default r).
        quantize: ``qlora``'s base, ``"int8"`` (default) or ``"int4"``.
        optimizer: a Keras optimizer; default Adam at ``LM_LEARNING_RATES[method]``.
        loss_chunk_size: the loss in chunks of this many positions per row
            (``compile_causal_lm``); default the model's own (None: whole logits).
        epochs, batch_size: passes over ``train`` (reshuffled each, from ``seed``) and the
            global batch (divisible by the data axis; the last partial batch is dropped).
        seed: seeds the LoRA factors' initialisation and the shuffling.
        callbacks: Keras callbacks for ``fit``.
        fit: ``fit(model, batches, epochs=, callbacks=) -> history dict``; default
            ``model.fit`` (the ``zoo finetune`` job passes its checkpointed fit).
        remat: what each block keeps for the backward pass (``GPTBackbone``'s choices),
            or ``"auto"``: ``zoo.training.remat_choice`` compiles the step to choose;
            None leaves the model's own.

    Returns ``{"heldout_loss_before", "heldout_loss", "history", "trainable_parameters",
    "adapted_layers", "model"}`` (held-out losses None without ``held_out``).
    """
    keras.utils.set_random_seed(seed)
    adapted = prepare_causal_lm(model, method, lora_rank=lora_rank, lora_alpha=lora_alpha, quantize=quantize)
    trainable = int(sum(np.prod(v.shape) for v in model.trainable_weights))
    report(
        f"method {method}: {trainable:,} trainable parameters"
        + (f" ({lora_parameter_count(model):,} LoRA in {adapted_layer_count(model)} layers)" if adapted else "")
    )
    compile_causal_lm(model, optimizer or make_optimizer("adam", method=method), loss_chunk_size=loss_chunk_size)
    batches = token_batches(train, batch_size=batch_size, shuffle=True, seed=seed)
    if remat is not None:
        resolve_remat(model, remat, *batches[0], report=report)  # one batch's arrays: the shapes fit will see
    measure = (
        functools.partial(heldout_loss, model, held_out, batch_size=batch_size)
        if held_out is not None
        else (lambda: None)
    )
    before = measure()  # LoRA's b factors start at zero: the loaded model's loss
    if before is not None:
        report(f"held-out loss before: {before:.4f} nats/token ({held_out.loss_tokens:,} tokens)")
    history = (fit or _plain_fit)(model, batches, epochs=epochs, callbacks=callbacks)
    after = measure()
    if after is not None:
        report(f"held-out loss after: {after:.4f} nats/token (before {before:.4f})")
    return {
        "heldout_loss_before": before,
        "heldout_loss": after,
        "history": history,
        "trainable_parameters": trainable,
        "adapted_layers": adapted,
        "model": model,
    }


# --- the zoo finetune job ------------------------------------------------------------------


def _save_adapter_alone(settings, adapter, adapter_path, report):
    """``--method qlora``: the adapter alone in ``settings.output``, and the command that
    merges it onto the float base (the quantized kernels are not the base's weights)."""

    def write(folder):
        os.makedirs(folder, exist_ok=True)
        adapter(folder)
        return folder

    directory = write_or_rescue(write, settings.output, fallback_folders=[settings.checkpoint_dir])
    report(
        f"saved the LoRA adapter to {adapter_path(directory)} (the base stays as {settings.preset}); merge it "
        f"with: zoo export {settings.preset} MERGED --lora {adapter_path(directory)}"
    )
    return directory


def finetune_lm(settings, report=print):
    """``zoo finetune`` for a causal LM (``settings``: ``FinetuneSettings``); returns
    ``finetune_causal_lm``'s dict, plus ``"output"`` (where the model went, or None)."""
    _check_options(settings)
    check_paths(settings)
    preset = local_preset(settings.preset)
    hf = is_hf_folder(preset)
    config = causal_lm_config(preset, settings.layout, scan_layers=settings.scan_layers)
    distribution = job_distribution(GPTCausalLM, settings, model_config=config)
    report_setup(distribution, report)
    model = zd.build_distributed(lambda: _load_base(preset, settings), distribution)
    preprocessor = lm_preprocessor(model, settings.sequence_length)
    if settings.chat_template:
        use_chat_template(preprocessor.tokenizer, settings.chat_template)
    report(
        f"model {settings.preset!r}: {model.count_params():,} parameters; sequence length {preprocessor.sequence_length}"
    )
    train, held_out = lm_data(settings, preprocessor, report)
    steps = len(train) // settings.batch_size
    data = {
        "preset": str(settings.preset),
        "data": data_source(settings),
        "examples": len(train),
        "batch_size": settings.batch_size,
        "sequence_length": preprocessor.sequence_length,
        "seed": settings.seed,
        "steps_per_epoch": steps,
    }
    fit = functools.partial(_checkpointed, settings=settings, data=data, report=report)
    progress = StepReport(
        settings.batch_size * preprocessor.sequence_length, unit="tokens", every=settings.report_every, report=report
    )
    result = finetune_causal_lm(
        model,
        train,
        held_out,
        method=settings.method,
        lora_rank=settings.lora_rank,
        lora_alpha=settings.lora_alpha,
        optimizer=make_optimizer(
            settings.optimizer, settings.learning_rate, settings.method, **optimizers.state_options(settings)
        ),
        loss_chunk_size=resolve_loss_chunk(
            settings.loss_chunk_size, model, settings.batch_size, preprocessor.sequence_length, report=report
        ),
        epochs=settings.epochs,
        batch_size=settings.batch_size,
        seed=settings.seed,
        callbacks=[progress],
        report=report,
        fit=fit,
        remat=settings.remat,
        quantize=settings.quantize,
    )
    result["output"] = _save(settings, result, hf, preprocessor, report) if settings.output else None
    return result


def _load_base(preset, settings):
    with dtype_policy_scope(base_policy(settings)):
        return load_causal_lm(preset, settings.layout, **({"scan_layers": True} if settings.scan_layers else {}))


def _check_options(settings):
    if settings.method == "frozen":
        raise ValueError(FROZEN_REFUSED)
    if settings.optimizer == "sgd" and settings.learning_rate is None:
        raise ValueError("--optimizer sgd has no default learning rate; give --learning-rate")
    if settings.validation_file and not settings.data_file:
        raise ValueError("--validation-file holds the held-out part of --data-file; give --data-file too")
    if not settings.data_file:
        spec = get_spec(settings.dataset)
        if spec.task != LANGUAGE_MODELING:
            raise ValueError(
                f"a causal LM fine-tunes on --data-file FILE (JSONL or text) or a {LANGUAGE_MODELING} --dataset; "
                f"{spec.name!r} is {spec.task} data"
            )


def check_paths(settings):
    """Refuse, before any work, the paths ``finetune_lm`` would refuse (``zoo recipe
    check`` calls it too): output, checkpoint and data folders, and an output folder the
    fine-tuned model cannot be saved into."""
    check_job_paths(settings, output_is_folder=True)
    for flag in ("data_file", "validation_file", "chat_template"):  # a FIFO or /dev/zero: refused now, unopened
        path = getattr(settings, flag, None)
        if path and os.path.exists(path):
            try:
                regular_file(path)
            except ValueError as error:
                raise PathError(f"--{flag.replace('_', '-')}", path, str(error).removeprefix(f"{path} ")) from None
    _check_output(settings.output, is_hf_folder(local_preset(settings.preset)))


def _check_output(output, hf):
    """Refuse, before training, an output folder the model cannot be saved into."""
    if not output:
        return
    directory = os.path.abspath(output)
    if not hf:
        check_preset_destination(directory)
    elif os.path.isdir(directory) and os.listdir(directory):
        raise PathError(
            "--output", output, "exists and is not empty; the fine-tuned Hugging Face folder is written into a new one"
        )


def _checkpointed(model, batches, *, epochs, callbacks, settings, data, report):
    return checkpointed_fit(
        model,
        batches,
        settings=settings,
        data=data,
        epochs=epochs,
        validation_data=None,
        callbacks=callbacks,
        report=report,
        verbose=0,
        run_dir=run_dir_of(
            settings.output, fallback=settings.checkpoint_dir or new_run_folder("runs/finetune"), output_is_folder=True
        ),
    )


def _save(settings, result, hf, preprocessor, report):
    """The model with LoRA merged (a Hugging Face folder when the base was one, else a zoo
    preset) at ``settings.output``, and the LoRA adapter alone in it (``lora.weights.h5``, or
    ``adapter/`` in the PEFT format: ``settings.adapter_format``). A Hugging Face folder is
    written whole, adapter included, or not at all (``save_to_hf``)."""
    model, adapted = result["model"], result["adapted_layers"]
    adapter_path = lambda folder: os.path.join(folder, PEFT_FOLDER if settings.adapter_format == "peft" else LORA_FILE)
    if settings.adapter_format == "peft":
        adapter = lambda folder: save_peft_adapter(
            model, adapter_path(folder), base_model_name_or_path=str(settings.preset)
        )
    else:
        adapter = lambda folder: save_lora(model, adapter_path(folder))
    adapter = adapter if adapted else None
    if settings.method == "qlora":  # the base is int8 / int4 here: merged onto the float one by zoo export
        return _save_adapter_alone(settings, adapter, adapter_path, report)
    if hf:  # save_to_hf merges the LoRA factors into the kernels it writes
        save = lambda target: model.save_to_hf(target, extra_files=adapter, report=report)
        directory = write_or_rescue(save, settings.output, fallback_folders=[settings.checkpoint_dir])
    else:
        final = merge_lora(model) if adapted else model
        check_finite_logits(final, settings.output)  # before anything is written (save_to_hf does the same)
        metadata = {
            "dataset": data_source(settings),
            "task": LANGUAGE_MODELING,
            "input_shape": [preprocessor.sequence_length],
            "finetuned_from": str(settings.preset),
            "heldout_loss": result["heldout_loss"],
            "training": {
                "method": settings.method,
                "epochs": settings.epochs,
                "optimizer": settings.optimizer,
                "learning_rate": settings.learning_rate or LM_LEARNING_RATES[settings.method],
                "lora_rank": settings.lora_rank if adapted else None,
                "seed": settings.seed,
            },
        }
        save = lambda target: save_to_preset(final, target, tokenizer=preprocessor.tokenizer, metadata=metadata)
        directory = write_or_rescue(save, settings.output, fallback_folders=[settings.checkpoint_dir])
    report(f"saved the fine-tuned model to {directory}" + (" (LoRA merged)" if adapted else ""))
    if adapted and not hf:  # beside the preset's files, once they are in place
        adapter(directory)
    if adapted:
        report(f"saved the LoRA adapter alone to {adapter_path(directory)}")
    return directory
