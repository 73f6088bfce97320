"""The small-CNN jobs behind ``zoo train cnn`` and ``zoo verify cnn``."""

import keras

from zoo import distribution as zd
from zoo.config.settings import CNNTrainSettings, VerifySettings  # noqa: F401 (the settings of these jobs)
from zoo.data import SHAPE_CLASSES, DivisibleBatches, get_spec, load, load_shapes
from zoo.data.catalog import IMAGE_CLASSIFICATION
from zoo.distribution.parity import check_parity
from zoo.models import SmallCNN
from zoo.training._checkpointed_fit import check_checkpoint_options, checkpointed_fit
from zoo.training.callbacks import Throughput
from zoo.training.job_setup import (
    evaluate_accuracy,
    evaluation_batches,
    job_distribution,
    report_setup,
    run_dir_of,
    train_validation_test_splits,
)
from zoo.training.paths import check_job_paths, save_model_atomically


def build_cnn(image_size, seed, num_classes=len(SHAPE_CLASSES), channels=3, dropout=0.0):  # noqa: B008 (a constant)
    return SmallCNN(num_classes=num_classes, image_size=image_size, channels=channels, dropout=dropout, seed=seed)


def compile_cnn(model, optimizer="adam", learning_rate=1e-3):
    optimizers = {"adam": keras.optimizers.Adam, "sgd": keras.optimizers.SGD}
    if optimizer not in optimizers:
        raise ValueError(f"unknown optimizer {optimizer!r}; choose one of {sorted(optimizers)}")
    model.compile(
        optimizer=optimizers[optimizer](learning_rate=learning_rate),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        # weighted: padding rows of the last batch (sample weight 0) must not count
        weighted_metrics=["accuracy"],
    )


def resolve_distribution(settings, mesh=None):
    """The distribution of ``settings.layout``, with the SmallCNN layout map for ``"model"``."""
    return job_distribution(SmallCNN, settings, mesh)


def train(settings, report=print, callbacks=()):
    """Train the small CNN; returns a dict of results. ``callbacks`` are added to ``fit``'s.

    With ``settings.checkpoint_dir`` a checkpoint is saved every ``checkpoint_every`` steps
    and at the end; with ``settings.resume`` training continues from the newest usable one,
    seeing exactly the batches the uninterrupted run would have seen.
    """
    check_checkpoint_options(settings)
    check_job_paths(settings)  # before any work, not after it
    spec = _image_dataset(settings.dataset)
    distribution = resolve_distribution(settings)
    replicas = zd.data_parallel_size(distribution)
    report_setup(distribution, report)
    train_data, validation_data, test_data = _datasets(settings, replicas)
    report(f"dataset: {spec.name} ({spec.description}); {train_data.num_examples} training images")
    image_shape = test_data[0].shape[1:]  # (S, S, C)
    keras.utils.set_random_seed(settings.seed)
    model = zd.build_distributed(
        lambda: build_cnn(image_shape[0], settings.seed, len(spec.classes), image_shape[2], settings.dropout),
        distribution,
    )
    compile_cnn(model, "adam", settings.learning_rate)
    report("weights (path, shape, sharding):")
    for line in zd.format_sharding_summary(model):
        report("  " + line)

    throughput = Throughput(
        settings.batch_size, report, log_steps=True
    )  # steps.csv: one row per step (no StepReport here)
    data = {  # what the saved data position refers to; a resume under other data is refused
        "dataset": settings.dataset,
        "image_shape": list(image_shape),
        "examples": train_data.num_examples,
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
        callbacks=[throughput, *callbacks],
        report=report,
        run_dir=run_dir_of(settings.output),
    )
    accuracy = evaluate_accuracy(model, *test_data, batch_size=settings.batch_size, replicas=replicas)
    report(f"held-out test accuracy: {accuracy:.4f} ({len(test_data[1])} images, chance {1 / len(spec.classes):.4f})")
    save_model_atomically(model, settings.output, fallback_folders=[settings.checkpoint_dir])
    report(f"saved model to {settings.output}")
    return {"history": history, "test_accuracy": accuracy, "images_per_second": throughput.per_epoch, "model": model}


def _image_dataset(name):
    spec = get_spec(name)
    if spec.task != IMAGE_CLASSIFICATION:
        raise ValueError(f"the CNN trains on image classification data; {name!r} is {spec.task}")
    return spec


def _datasets(settings, replicas):
    """Train (shuffled, last partial batch dropped), validation and test (padded) data."""
    train_split, validation_split, _ = train_validation_test_splits(get_spec(settings.dataset))
    options = {"data_dir": settings.data_dir, "image_size": settings.image_size}
    x, y = load(settings.dataset, train_split, num_examples=settings.train_examples, **options)
    xv, yv = load(settings.dataset, validation_split, **options)
    test = load(settings.dataset, "test", **options)
    train_data = DivisibleBatches(
        x, y, batch_size=settings.batch_size, multiple_of=replicas, remainder="drop", shuffle=True, seed=settings.seed
    )
    validation_data = evaluation_batches(xv, yv, batch_size=settings.batch_size, replicas=replicas)
    return train_data, validation_data, test


def verify(settings, report=print):
    """Parity of the small CNN under a distribution against one device; returns the report."""
    if settings.layout == "single":
        raise ValueError("verify compares a distribution with one device: choose --layout data or model")
    distribution = resolve_distribution(settings)
    report_setup(distribution, report)
    x, y = load_shapes(
        "train", image_size=settings.image_size, num_examples=settings.steps * settings.batch_size, seed=settings.seed
    )
    result = check_parity(
        lambda: SmallCNN(
            num_classes=len(SHAPE_CLASSES), image_size=settings.image_size, dropout=0.25, seed=settings.seed
        ),
        lambda model: compile_cnn(
            model, settings.optimizer, learning_rate=1e-2 if settings.optimizer == "sgd" else 1e-3
        ),
        distribution,
        x,
        y,
        steps=settings.steps,
        batch_size=settings.batch_size,
        seed=settings.seed,
        rtol=settings.rtol,
        atol=settings.atol,
    )
    report(f"per-step loss, one device:  {', '.join(f'{v:.6f}' for v in result.reference_losses)}")
    report(f"per-step loss, distributed: {', '.join(f'{v:.6f}' for v in result.distributed_losses)}")
    for line in result.format():
        report(line)
    report("PASS" if result.passed else "FAIL: differences beyond tolerance")
    return result
