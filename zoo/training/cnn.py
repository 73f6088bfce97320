"""The small-CNN jobs behind ``zoo train cnn`` and ``zoo verify cnn``."""

import dataclasses

import keras
import numpy as np

from zoo import distribution as zd
from zoo.data import DivisibleBatches, SHAPE_CLASSES, get_spec, load, load_shapes
from zoo.data.catalog import IMAGE_CLASSIFICATION
from zoo.distribution.parity import DEFAULT_ATOL, DEFAULT_RTOL, check_parity
from zoo.models import SmallCNN
from zoo.training._checkpointed_fit import check_checkpoint_options, checkpointed_fit
from zoo.training.callbacks import Throughput
from zoo.training.paths import check_job_paths, save_model_atomically
from zoo.training.transformer_setup import report_setup


@dataclasses.dataclass
class TrainConfig:
    """Settings of ``zoo train cnn``; every default is the CLI's default."""

    distribution: str = "model"  # single | data | model (see zoo.distribution.strategies)
    mesh: str | None = None  # e.g. "data=2,model=4"; None: the strategy's default mesh
    dataset: str = "shapes"  # an image-classification dataset of zoo.data (zoo data list)
    epochs: int = 5  # passes over the training split (shapes: ~90% test accuracy in ~40 s on 2 cores)
    batch_size: int = 32  # global batch, split over the data axis; must divide by its size
    image_size: int | None = None  # None: the dataset's default (shapes 32, digits 16, mnist 28)
    train_examples: int | None = None  # None: the whole training split
    data_dir: str | None = None  # TFDS data folder (default $ZOO_DATA_DIR, $TFDS_DATA_DIR, ~/tensorflow_datasets)
    learning_rate: float = 1e-3  # Adam
    seed: int = 0  # data, weight initialisation and shuffling
    output: str = "runs/cnn/small_cnn.keras"  # where the trained model is saved (.keras)
    dropout: float = 0.0  # before the logits layer; its RNG state is part of every checkpoint
    checkpoint_dir: str | None = None  # Orbax checkpoints during fit go here (docs/checkpoints.md); None: none
    checkpoint_every: int = 100  # optimizer steps between checkpoints (one more is saved at the end)
    keep: int = 3  # the newest complete checkpoints kept; older ones are deleted
    resume: bool = False  # continue from the newest usable checkpoint in checkpoint_dir (none there: start)


@dataclasses.dataclass
class VerifyConfig:
    """Settings of ``zoo verify cnn``."""

    distribution: str = "model"  # data | model
    mesh: str | None = None  # None: the strategy's default mesh
    steps: int = 3  # optimizer steps compared
    batch_size: int = 32  # global batch
    image_size: int = 32  # small images keep the check fast
    optimizer: str = "sgd"  # sgd | adam: Adam turns rounding-level gradient noise into lr-sized steps
    rtol: float = DEFAULT_RTOL  # elementwise: |d - r| <= atol + rtol * |r|
    atol: float = DEFAULT_ATOL
    seed: int = 0


def build_cnn(image_size, seed, num_classes=len(SHAPE_CLASSES), channels=3, dropout=0.0):
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


def resolve_distribution(strategy, mesh_spec):
    """The distribution for a strategy, with the SmallCNN layout map for ``"model"``."""
    if strategy == "single":
        if mesh_spec:
            raise zd.MeshError(f"--distribution single runs on one device; drop --mesh {mesh_spec!r}")
        return None
    return zd.distribution_for(SmallCNN, strategy, mesh_spec)


def train(config, report=print, callbacks=()):
    """Train the small CNN; returns a dict of results. ``callbacks`` are added to ``fit``'s.

    With ``config.checkpoint_dir`` a checkpoint is saved every ``checkpoint_every`` steps
    and at the end; with ``config.resume`` training continues from the newest usable one,
    seeing exactly the batches the uninterrupted run would have seen.
    """
    check_checkpoint_options(config)
    check_job_paths(config)  # before any work, not after it
    spec = _image_dataset(config.dataset)
    distribution = resolve_distribution(config.distribution, config.mesh)
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

    throughput = Throughput(config.batch_size, report)
    data = {  # what the saved data position refers to; a resume under other data is refused
        "dataset": config.dataset,
        "image_shape": list(image_shape),
        "examples": train_data.num_examples,
        "batch_size": config.batch_size,
        "seed": config.seed,
        "steps_per_epoch": len(train_data),
    }
    history = checkpointed_fit(model, train_data, config=config, data=data, epochs=config.epochs, validation_data=validation_data,
                               callbacks=[throughput, *callbacks], report=report)  # fmt: skip
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
    train_split, validation_split = _train_validation_splits(get_spec(config.dataset))
    options = {"data_dir": config.data_dir, "image_size": config.image_size}
    x, y = load(config.dataset, train_split, num_examples=config.train_examples, **options)
    xv, yv = load(config.dataset, validation_split, **options)
    test = load(config.dataset, "test", **options)
    train_data = DivisibleBatches(x, y, batch_size=config.batch_size, multiple_of=replicas, remainder="drop", shuffle=True, seed=config.seed)
    validation_data = DivisibleBatches(xv, yv, batch_size=config.batch_size, multiple_of=replicas, remainder="pad")
    return train_data, validation_data, test


def _train_validation_splits(spec):
    """Datasets without a validation split hold out the last 10% of train."""
    if "validation" in spec.splits:
        return "train", "validation"
    return "train[:90%]", "train[90%:]"


def evaluate_accuracy(model, x, y, *, batch_size, replicas):
    """Top-1 accuracy from ``predict`` over every example (padding trimmed)."""
    batches = DivisibleBatches(x, batch_size=batch_size, multiple_of=replicas, remainder="pad")
    logits = batches.trim(model.predict(batches, verbose=0))
    return float(np.mean(np.argmax(logits, axis=-1) == y))


def verify(config, report=print):
    """Parity of the small CNN under a distribution against one device; returns the report."""
    if config.distribution == "single":
        raise ValueError("verify compares a distribution with one device: choose --distribution data or model")
    distribution = resolve_distribution(config.distribution, config.mesh)
    report_setup(distribution, report)
    x, y = load_shapes("train", image_size=config.image_size, num_examples=config.steps * config.batch_size, seed=config.seed)
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
