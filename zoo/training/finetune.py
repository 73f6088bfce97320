"""Fine-tune a preset on another dataset: ``zoo finetune PRESET --dataset NAME --method ...``.

A causal language model (a zoo ``GPTCausalLM`` preset, a Hugging Face folder, ``hf://``)
is fine-tuned on text instead: ``zoo finetune PATH --data-file train.jsonl``, see
``zoo.training.lm_finetune``. What follows is about the classifier presets.

Methods (what the optimizer updates):

======  =========================================================================
frozen  the classification head only; the backbone is frozen (batch norm in
        inference mode)
lora    the head and rank-r LoRA factors on every backbone Dense / EinsumDense
        layer (``layer.enable_lora``); all other backbone weights frozen
full    every weight
======  =========================================================================

When the dataset has a different number of classes from the preset, the head layer
(``HEADS``) is rebuilt with the new size and freshly initialised, everything else comes
from the preset. Under ``--layout model`` the preset's layout map splits the
weights, LoRA factors included (laid out like their kernels, see ``_lora``).
"""

import os

import keras
import numpy as np

from zoo import distribution as zd
from zoo._compat import sublayers
from zoo.config.choices import AUTO, CLASSIFIER_FINETUNE_LAYOUTS, CLASSIFIER_METHODS
from zoo.config.settings import FinetuneSettings
from zoo.data import DivisibleBatches, get_spec, load
from zoo.data.catalog import IMAGE_CLASSIFICATION, TEXT_CLASSIFICATION
from zoo.presets import (
    from_preset,
    load_preset_config,
    load_preset_metadata,
    load_tokenizer,
    save_to_preset,
)
from zoo.presets.save import check_preset_destination
from zoo.training import optimizers
from zoo.training._checkpointed_fit import checkpointed_fit
from zoo.training.job_setup import evaluate_accuracy, job_distribution, new_run_folder, run_dir_of
from zoo.training.lm_finetune import check_paths as lm_check_paths
from zoo.training.lm_finetune import finetune_causal_lm, finetune_lm, is_causal_lm
from zoo.training.logs.report import StepReport
from zoo.training.lora import enable_lora, is_lora_variable, load_lora, lora_parameter_count, merge_lora, save_lora
from zoo.training.paths import check_job_paths, write_or_rescue

# model class -> (head layer, config entry giving its output size)
HEADS = {
    "SmallCNN": ("logits", "num_classes"),
    "TransformerEncoderClassifier": ("classifier_head", "num_classes"),
    "ViTClassifier": ("classifier_head", "num_classes"),
}
# Adam learning rates that fine-tune small_cnn_shapes on digits in a few epochs: the
# head (zero-initialised) and the LoRA factors take larger steps than a whole network.
LEARNING_RATES = {"frozen": 1e-2, "lora": 1e-2, "full": 3e-3}
LORA_FILE = "lora.weights.h5"  # the adapter, written beside the merged preset

__all__ = [
    "FinetuneSettings",
    "enable_lora",
    "finetune",
    "finetune_causal_lm",
    "is_lora_variable",
    "load_for_finetuning",
    "load_lora",
    "lora_parameter_count",
    "merge_lora",
    "needs_new_head",
    "prepare_finetuning",
    "save_lora",
    "trainable_parameter_count",
]


def head_of(class_name):
    """``(head layer name, config key)`` of a preset's model class; raises naming the supported ones."""
    if class_name not in HEADS:
        raise ValueError(
            f"fine-tuning supports classifier presets of {sorted(HEADS)}; this preset holds a {class_name}"
        )
    return HEADS[class_name]


def needs_new_head(preset, num_classes):
    """Whether ``num_classes`` differs from the preset's head size (None: keep the head)."""
    _, key = head_of(load_preset_metadata(preset)["class_name"])
    return num_classes is not None and num_classes != load_preset_config(preset)["config"].get(key)


def load_for_finetuning(preset, num_classes=None):
    """The preset's model, with a new ``num_classes`` head when that differs from the
    preset's (``needs_new_head``). A new head starts at zero (as in BiT, Kolesnikov et
    al. 2020): every class equally likely, so the first steps are well scaled whatever
    the features' size. Build it under the distribution to train with."""
    head, key = head_of(load_preset_metadata(preset)["class_name"])
    if not needs_new_head(preset, num_classes):
        return from_preset(preset)
    model = from_preset(preset, skip_layers=(head,), **{key: num_classes})
    for variable in model.get_layer(head).weights:  # zero head (BiT): uniform predictions, a well-scaled start
        variable.assign(keras.ops.zeros_like(variable.value))
    return model


def prepare_finetuning(model, method, *, head, lora_rank=4, lora_alpha=None):
    """Set which weights train under ``method`` (see the module doc); call once, on a
    freshly loaded model, under the distribution it was built with. Returns the
    LoRA-adapted layers (empty unless ``method == "lora"``)."""
    if method not in CLASSIFIER_METHODS:
        raise ValueError(
            f"fine-tuning method {method!r} is not one a classifier takes; choose one of {list(CLASSIFIER_METHODS)}"
            + (" (qlora fine-tunes a causal LM)" if method == "qlora" else "")
        )
    head_layer = model.get_layer(head)
    trainable_by_design = list(model.trainable_weights)  # not batch-norm statistics, say
    adapted = enable_lora(model, lora_rank, alpha=lora_alpha, exclude=[head_layer]) if method == "lora" else []
    head_variables = {id(v) for v in head_layer.weights}
    for variable in trainable_by_design:
        variable.trainable = method == "full" or id(variable) in head_variables
    if method != "full":
        _freeze_idle_layers(model, head_layer)
    return adapted


def _freeze_idle_layers(model, head_layer):
    """``trainable = False`` on backbone leaf layers left with nothing to train, so batch
    norm runs in inference mode (its statistics stay the preset's)."""
    for layer in sublayers(model):
        leaf = not sublayers(layer)
        if leaf and layer is not head_layer and not any(v.trainable for v in layer.weights):
            layer.trainable = False


def trainable_parameter_count(model):
    return int(sum(np.prod(v.shape) for v in model.trainable_weights))


def check_paths(settings):
    """Refuse, before any work, the paths ``finetune`` would refuse (``zoo recipe check``
    calls it too): the output folder, checkpoint folder and data folder; for a classifier,
    an output that is not a new, empty or preset folder; for a causal LM,
    ``lm_finetune.check_paths``."""
    if is_causal_lm(settings.preset):
        return lm_check_paths(settings)
    check_job_paths(settings, output_is_folder=True)
    if settings.output:
        check_preset_destination(os.path.abspath(settings.output))  # refused now, not after training


def finetune(settings, report=print):
    """Fine-tune ``settings.preset``: a classifier on ``settings.dataset``, or a causal LM on
    ``settings.data_file`` (``lm_finetune.finetune_lm``); returns a dict of results."""
    if is_causal_lm(settings.preset):
        return finetune_lm(settings, report)
    _check_classifier_options(settings)
    check_paths(settings)
    metadata, spec, head = _check_job(settings)
    distribution = resolve_distribution(metadata["class_name"], settings)
    replicas = zd.data_parallel_size(distribution)
    model = zd.build_distributed(lambda: load_for_finetuning(settings.preset, len(spec.classes)), distribution)
    new_head = needs_new_head(settings.preset, len(spec.classes))
    report(
        f"preset {settings.preset!r}: {metadata['class_name']}, {model.count_params():,} parameters"
        + (f"; new {len(spec.classes)}-class head {head!r}" if new_head else "")
    )
    input_shape = example_shape(model, metadata)
    (x, y), (xt, yt) = (_load_adapted(settings, spec, input_shape, split) for split in ("train", "test"))
    keras.utils.set_random_seed(settings.seed)
    adapted = prepare_finetuning(
        model, settings.method, head=head, lora_rank=settings.lora_rank, lora_alpha=settings.lora_alpha
    )
    trainable = _report_trainable(model, settings.method, adapted, report)
    _compile(model, settings)
    # Evaluated after compile() so one predict function serves both evaluations; LoRA's
    # b factors start at zero, so this is still the preset's (new head's) output.
    zero_shot = evaluate_accuracy(model, xt, yt, batch_size=settings.batch_size, replicas=replicas)
    report(f"zero-shot test accuracy: {zero_shot:.4f} (chance {1 / len(spec.classes):.4f})")
    history = _fit(model, x, y, settings, replicas, report)
    accuracy = evaluate_accuracy(model, xt, yt, batch_size=settings.batch_size, replicas=replicas)
    report(f"fine-tuned test accuracy: {accuracy:.4f} ({len(yt)} examples; zero-shot {zero_shot:.4f})")
    result = {
        "zero_shot_accuracy": zero_shot,
        "test_accuracy": accuracy,
        "trainable_parameters": trainable,
        "history": history,
        "model": model,
        "adapted_layers": adapted,
    }
    if settings.output:
        _save(settings, spec, model, input_shape, adapted, result, report)
    return result


def _report_trainable(model, method, adapted, report):
    """Reports and returns the trainable parameter count (the LoRA factors' where adapted)."""
    trainable = trainable_parameter_count(model)
    lora = (
        f" ({lora_parameter_count(model):,} LoRA in {len(adapted)} layer{'s' * (len(adapted) > 1)})" if adapted else ""
    )
    report(f"method {method}: {trainable:,} trainable parameters{lora}")
    return trainable


def _fit(model, x, y, settings, replicas, report):
    """The classifier's fit over batches that split over ``replicas``, checkpointed as the
    settings say; returns its history."""
    batches = DivisibleBatches(
        x, y, batch_size=settings.batch_size, multiple_of=replicas, remainder="drop", shuffle=True, seed=settings.seed
    )
    data = {
        "preset": settings.preset,
        "dataset": settings.dataset,
        "examples": batches.num_examples,
        "batch_size": settings.batch_size,
        "seed": settings.seed,
        "steps_per_epoch": len(batches),
    }
    progress = StepReport(settings.batch_size, unit="examples", every=settings.report_every, report=report)
    return checkpointed_fit(
        model,
        batches,
        settings=settings,
        data=data,
        epochs=settings.epochs,
        validation_data=None,
        callbacks=[progress],
        report=report,
        verbose=0,
        run_dir=run_dir_of(
            settings.output, fallback=settings.checkpoint_dir or new_run_folder("runs/finetune"), output_is_folder=True
        ),
    )


def _check_classifier_options(settings):
    """Settings only a causal LM takes, refused for a classifier rather than ignored."""
    given = [
        flag
        for flag, value in (
            ("--data-file", settings.data_file),
            ("--validation-file", settings.validation_file),
            ("--sequence-length", settings.sequence_length),
            ("--chat-template", settings.chat_template),
        )
        if value is not None
    ]
    if settings.loss_chunk_size != AUTO:
        given.append(f"--loss-chunk-size {settings.loss_chunk_size}")
    if settings.adapter_format != "zoo":
        given.append(f"--adapter-format {settings.adapter_format}")
    if settings.packing:
        given.append("--packing")
    if settings.remat != AUTO:
        given.append(f"--remat {settings.remat}")
    if settings.precision != "float32":
        given.append(f"--precision {settings.precision}")
    if settings.scan_layers:
        given.append("--scan-layers")
    if given:
        raise ValueError(
            f"{', '.join(given)}: for causal LMs; preset {settings.preset!r} is a classifier, fine-tuned on --dataset"
        )
    if settings.layout not in CLASSIFIER_FINETUNE_LAYOUTS:
        raise ValueError(
            f"--layout {settings.layout}: a classifier preset fine-tunes under {', '.join(CLASSIFIER_FINETUNE_LAYOUTS)}; "
            f"{settings.layout} is for causal LMs (zoo train encoder|vit trains a classifier under it)"
        )
    if settings.optimizer == "sgd" and settings.learning_rate is None:
        raise ValueError("--optimizer sgd has no default learning rate; give --learning-rate")


def _check_job(settings):
    """``(preset metadata, dataset spec, head layer name)``, or a clear error."""
    metadata = load_preset_metadata(settings.preset)
    head, _ = head_of(metadata["class_name"])
    spec = get_spec(settings.dataset)
    if spec.task not in (IMAGE_CLASSIFICATION, TEXT_CLASSIFICATION):
        raise ValueError(f"fine-tuning needs a classification dataset; {settings.dataset!r} is {spec.task}")
    takes = metadata.get("task") or (
        TEXT_CLASSIFICATION if metadata["class_name"] == "TransformerEncoderClassifier" else IMAGE_CLASSIFICATION
    )
    if spec.task != takes:  # else Keras fails later on the input shape
        from zoo.data.catalog import DATASETS

        fitting = [name for name, other in DATASETS.items() if other.task == takes]
        raise ValueError(
            f"preset {settings.preset!r} ({metadata['class_name']}) takes {takes} input; --dataset {settings.dataset!r} is "
            f"{spec.task} data; choose {' or '.join(fitting)}"
        )
    return metadata, spec, head


def _compile(model, settings):
    learning_rate = settings.learning_rate
    if settings.optimizer == "adam":
        learning_rate = learning_rate or LEARNING_RATES[settings.method]
    optimizer = optimizers.make_optimizer(settings.optimizer, learning_rate, **optimizers.state_options(settings))
    model.compile(
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        weighted_metrics=["accuracy"],
    )


def resolve_distribution(class_name, settings, mesh=None):
    """The distribution of ``settings.layout`` with the preset class's layout map; ``mesh``
    replaces ``settings.mesh`` (an abstract mesh for a compile-only check)."""
    return job_distribution(keras.saving.get_registered_object(f"zoo>{class_name}"), settings, mesh)


def example_shape(model, metadata):
    """One example's shape: the preset's recorded ``input_shape``, else the model's input
    (a text model's length from its ``max_sequence_length``)."""
    shape = list(metadata.get("input_shape") or model.inputs[0].shape[1:])
    if len(shape) == 1 and shape[0] is None:
        shape = [getattr(model, "max_sequence_length", None)]
    if any(size is None for size in shape):
        raise ValueError(
            f"the preset's input shape {shape} is not fully known; save it with metadata input_shape=[...]"
        )
    return tuple(shape)


def _load_adapted(settings, spec, input_shape, split):
    """A split shaped for the model: images at its size and channel count, text at its
    sequence length."""
    count = settings.train_examples if split == "train" else settings.test_examples
    if spec.task == TEXT_CLASSIFICATION:
        return load(spec.name, split, data_dir=settings.data_dir, sequence_length=input_shape[0], num_examples=count)
    x, y = load(spec.name, split, data_dir=settings.data_dir, image_size=input_shape[0], num_examples=count)
    return _match_channels(x, input_shape[-1], spec.name), y


def _match_channels(images, channels, name):
    """Grey -> RGB by repeating the channel; RGB -> grey by averaging."""
    if images.shape[-1] == channels:
        return images
    if images.shape[-1] == 1:
        return np.repeat(images, channels, axis=-1)
    if channels == 1:
        return images.mean(axis=-1, keepdims=True)
    raise ValueError(f"{name} images have {images.shape[-1]} channels; the preset takes {channels}")


def _save(settings, spec, model, input_shape, adapted, result, report):
    final = merge_lora(model) if adapted else model
    metadata = {
        "dataset": spec.name,
        "task": spec.task,
        "class_names": list(spec.classes),
        "input_shape": list(input_shape),
        "test_accuracy": round(result["test_accuracy"], 4),
        "finetuned_from": str(settings.preset),
        "training": {
            "method": settings.method,
            "epochs": settings.epochs,
            "optimizer": settings.optimizer,
            "learning_rate": settings.learning_rate or LEARNING_RATES[settings.method],
            "lora_rank": settings.lora_rank if adapted else None,
            "seed": settings.seed,
        },
    }
    save = lambda target: save_to_preset(final, target, tokenizer=load_tokenizer(settings.preset), metadata=metadata)
    directory = write_or_rescue(save, settings.output, fallback_folders=[settings.checkpoint_dir])
    report(f"saved the fine-tuned preset to {directory}" + (" (LoRA merged)" if adapted else ""))
    if adapted:
        report(f"saved the LoRA adapter alone to {save_lora(model, os.path.join(directory, LORA_FILE))}")
