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


def resolve_distribution(config, mesh=None):
    """The distribution of ``config.layout``, with the SmallCNN layout map for ``"model"``."""
    return job_distribution(SmallCNN, config, mesh)


def train(config, report=print, callbacks=()):
    """Train the small CNN; returns a dict of results. ``callbacks`` are added to ``fit``'s.

    With ``config.checkpoint_dir`` a checkpoint is saved every ``checkpoint_every`` steps
    and at the end; with ``config.resume`` training continues from the newest usable one,
    seeing exactly the batches the uninterrupted run would have seen.
    """
    check_checkpoint_options(config)
    check_job_paths(config)  # before any work, not after it
    spec = _image_dataset(config.dataset)
    distribution = resolve_distribution(config)
    replicas = zd.data_parallel_size(distribution)
    report_setup(distribution, report)
    train_data, validation_data, test_data = _datasets(config, replicas)
    report(f"dataset: {spec.name} ({spec.description}); {train_data.num_examples} training images")
    image_shape = test_data[0].shape[1:]  # (S, S, C)
    keras.utils.set_random_seed(config.seed)
    model = zd.build_distributed(
        lambda: build_cnn(image_shape[0], config.seed, len(spec.classes), image_shape[2], config.dropout), distribution
    )
    compile_cnn(model, "adam", config.learning_rate)
    report("weights (path, shape, sharding):")
    for line in zd.format_sharding_summary(model):
        report("  " + line)

    throughput = Throughput(
        config.batch_size, report, log_steps=True
    )  # steps.csv: one row per step (no StepReport here)
    data = {  # what the saved data position refers to; a resume under other data is refused
        "dataset": config.dataset,
        "image_shape": list(image_shape),
        "examples": train_data.num_examples,
        "batch_size": config.batch_size,
        "seed": config.seed,
        "steps_per_epoch": len(train_data),
    }
    history = checkpointed_fit(
        model,
        train_data,
        config=config,
        data=data,
        epochs=config.epochs,
        validation_data=validation_data,
        callbacks=[throughput, *callbacks],
        report=report,
        run_dir=run_dir_of(config.output),
    )
    accuracy = evaluate_accuracy(model, *test_data, batch_size=config.batch_size, replicas=replicas)
    report(f"held-out test accuracy: {accuracy:.4f} ({len(test_data[1])} images, chance {1 / len(spec.classes):.4f})")
    save_model_atomically(model, config.output, fallback_folders=[config.checkpoint_dir])
    report(f"saved model to {config.output}")
    return {"history": history, "test_accuracy": accuracy, "images_per_second": throughput.per_epoch, "model": model}


def _image_dataset(name):
    spec = get_spec(name)
    if spec.task != IMAGE_CLASSIFICATION:
        raise ValueError(f"the CNN trains on image classification data; {name!r} is {spec.task}")
    return spec


def _datasets(config, replicas):
    """Train (shuffled, last partial batch dropped), validation and test (padded) data."""
    train_split, validation_split, _ = train_validation_test_splits(get_spec(config.dataset))
    options = {"data_dir": config.data_dir, "image_size": config.image_size}
    x, y = load(config.dataset, train_split, num_examples=config.train_examples, **options)
    xv, yv = load(config.dataset, validation_split, **options)
    test = load(config.dataset, "test", **options)
    train_data = DivisibleBatches(
        x, y, batch_size=config.batch_size, multiple_of=replicas, remainder="drop", shuffle=True, seed=config.seed
    )
    validation_data = DivisibleBatches(xv, yv, batch_size=config.batch_size, multiple_of=replicas, remainder="pad")
    return train_data, validation_data, test


def verify(config, report=print):
    """Parity of the small CNN under a distribution against one device; returns the report."""
    if config.layout == "single":
        raise ValueError("verify compares a distribution with one device: choose --layout data or model")
    distribution = resolve_distribution(config)
    report_setup(distribution, report)
    x, y = load_shapes(
        "train", image_size=config.image_size, num_examples=config.steps * config.batch_size, seed=config.seed
    )
    result = check_parity(
        lambda: SmallCNN(num_classes=len(SHAPE_CLASSES), image_size=config.image_size, dropout=0.25, seed=config.seed),
        lambda model: compile_cnn(model, config.optimizer, learning_rate=1e-2 if config.optimizer == "sgd" else 1e-3),
        distribution,
        x,
        y,
        steps=config.steps,
        batch_size=config.batch_size,
        seed=config.seed,
        rtol=config.rtol,
        atol=config.atol,
    )
    report(f"per-step loss, one device:  {', '.join(f'{v:.6f}' for v in result.reference_losses)}")
    report(f"per-step loss, distributed: {', '.join(f'{v:.6f}' for v in result.distributed_losses)}")
    for line in result.format():
        report(line)
    report("PASS" if result.passed else "FAIL: differences beyond tolerance")
    return result
