"""The jobs behind ``zoo train encoder`` (text classification) and ``zoo train vit`` (images)."""

import keras

from zoo import distribution as zd
from zoo.config.settings import (  # noqa: F401 (the settings of these jobs)
    ClassifierTrainSettings,
    EncoderTrainSettings,
    ViTTrainSettings,
)
from zoo.data import DivisibleBatches, get_spec, load
from zoo.data.catalog import IMAGE_CLASSIFICATION, TEXT_CLASSIFICATION
from zoo.models import TransformerEncoderClassifier, ViTClassifier
from zoo.training.callbacks import SynchronousSteps, Throughput
from zoo.training.interrupts import StopAtSignal, stop_on_signals
from zoo.training.job_setup import (
    evaluate_accuracy,
    evaluation_batches,
    job_distribution,
    report_setup,
    run_dir_of,
    train_validation_test_splits,
)
from zoo.training.logs.run_logs import run_log_callbacks
from zoo.training.paths import check_job_paths, save_model_atomically
from zoo.training.shifted_batches import ShiftedBatches

# model name -> (class, task its dataset must have, unit of throughput)
MODELS = {
    "encoder": (TransformerEncoderClassifier, TEXT_CLASSIFICATION, "tokens"),
    "vit": (ViTClassifier, IMAGE_CLASSIFICATION, "images"),
}


def train(settings, report=print):
    """Train the encoder or the ViT; returns a dict with the history and test accuracy."""
    model_class, task, unit = MODELS[settings.model]
    check_job_paths(settings)
    spec = get_spec(settings.dataset)
    if spec.task != task:
        raise ValueError(f"zoo train {settings.model} needs {task} data; {settings.dataset!r} is {spec.task}")
    distribution = job_distribution(model_class, settings)
    report_setup(distribution, report)
    replicas = zd.data_parallel_size(distribution)
    (x, y), (xv, yv), (xt, yt) = (_load(settings, split) for split in train_validation_test_splits(spec))
    report(f"dataset: {spec.name}: {len(x)} training examples of shape {x.shape[1:]}, {len(spec.classes)} classes")
    batches = DivisibleBatches(
        x, y, batch_size=settings.batch_size, multiple_of=replicas, remainder="drop", shuffle=True, seed=settings.seed
    )
    if settings.model == "vit":
        batches = _shifted(settings, batches, x.shape[1:3], report)
    keras.utils.set_random_seed(settings.seed)
    model = zd.build_distributed(lambda: _build(settings, model_class, spec, x.shape[1:], distribution), distribution)
    model.compile(
        optimizer=keras.optimizers.AdamW(learning_rate=_learning_rate(settings, settings.epochs * len(batches))),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        weighted_metrics=["accuracy"],
    )
    report(f"model: {settings.config_name}, {model.count_params():,} parameters")
    for line in zd.format_sharding_summary(model):
        report("  " + line)
    per_example = x.shape[1] if unit == "tokens" else 1
    throughput = Throughput(
        settings.batch_size * per_example, report, unit=unit, log_steps=True
    )  # steps.csv: one row per step
    with stop_on_signals() as signals:  # Ctrl-C / SIGTERM: stop at a step boundary (no checkpoints here)
        history = model.fit(
            batches,
            validation_data=evaluation_batches(xv, yv, batch_size=settings.batch_size, replicas=replicas),
            epochs=settings.epochs,
            shuffle=False,
            callbacks=[
                throughput,
                *run_log_callbacks(run_dir_of(settings.output)),
                StopAtSignal(signals),
                SynchronousSteps(),
            ],
            verbose=2,
        )
    accuracy = evaluate_accuracy(model, xt, yt, batch_size=settings.batch_size, replicas=replicas)
    report(f"held-out test accuracy: {accuracy:.4f} ({len(yt)} examples, chance {1 / len(spec.classes):.4f})")
    save_model_atomically(model, settings.output)
    report(f"saved model to {settings.output}")
    return {"history": history.history, "test_accuracy": accuracy, "model": model}


def _learning_rate(settings, total_steps):
    """The encoder's: ``learning_rate`` throughout. The ViT's: ``learning_rate`` cosine-decayed
    to 10% over the run's ``total_steps`` (as ``zoo train gpt``'s), which ends it steadier."""
    if settings.model != "vit":
        return settings.learning_rate
    return keras.optimizers.schedules.CosineDecay(settings.learning_rate, decay_steps=max(total_steps, 1), alpha=0.1)


def _shifted(settings, batches, image_shape, report):
    """The ViT's training batches with random shifts of up to ``random_shift`` pixels
    (default: an eighth of the image's shorter side), checked against the image."""
    side = min(image_shape)
    shift = side // 8 if settings.random_shift is None else settings.random_shift
    if shift > side // 2:
        raise ValueError(f"random_shift {shift} is more than half the image side {side}: at most {side // 2} pixels")
    report(f"augmentation: training images shifted by up to {shift} pixels each way" if shift else "augmentation: none")
    return ShiftedBatches(batches, shift, seed=settings.seed)


def _load(settings, split):
    if settings.model == "encoder":
        return load(settings.dataset, split, data_dir=settings.data_dir, sequence_length=settings.sequence_length)
    return load(settings.dataset, split, data_dir=settings.data_dir, image_size=settings.image_size)


def _build(settings, model_class, spec, example_shape, distribution):
    overrides = dict(num_classes=len(spec.classes), dropout=settings.dropout, seed=settings.seed)
    if settings.model == "encoder":
        overrides["max_sequence_length"] = example_shape[0]
    else:
        overrides["image_size"] = example_shape[0]
        overrides["channels"] = example_shape[2]
    return model_class.from_config_name(settings.config_name, settings.layout, **overrides)
