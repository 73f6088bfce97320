"""The small-CNN jobs behind ``zoo train cnn`` and ``zoo verify cnn``."""

import dataclasses
import os
import tempfile

import keras
import numpy as np

from zoo import distribution as zd
from zoo.data import DivisibleBatches, SHAPE_CLASSES, load_shapes
from zoo.distribution.parity import DEFAULT_ATOL, DEFAULT_RTOL, check_parity
from zoo.models import SmallCNN
from zoo.training.callbacks import Throughput


@dataclasses.dataclass
class TrainConfig:
    """Settings of ``zoo train cnn``; every default is the CLI's default."""

    distribution: str = "model"  # single | data | model (see zoo.distribution.strategies)
    mesh: str | None = None  # e.g. "data=2,model=4"; None: the strategy's default mesh
    epochs: int = 5  # passes over the training split (~90% test accuracy on 2 CPU cores in ~40 s)
    batch_size: int = 32  # global batch, split over the data axis; must divide by its size
    image_size: int = 32  # square images; small for a fast CPU demo (the model's own default is 128)
    train_examples: int = 2048  # size of the procedural training split
    learning_rate: float = 1e-3  # Adam
    seed: int = 0  # data, weight initialisation and shuffling
    output: str = "runs/cnn/small_cnn.keras"  # where the trained model is saved (.keras)


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


def build_cnn(image_size, seed):
    return SmallCNN(num_classes=len(SHAPE_CLASSES), image_size=image_size, seed=seed)


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


def train(config, report=print):
    """Train the small CNN on the procedural shapes; returns a dict of results."""
    distribution = resolve_distribution(config.distribution, config.mesh)
    replicas = zd.data_parallel_size(distribution)
    _report_setup(distribution, report)
    keras.utils.set_random_seed(config.seed)
    model = zd.build_distributed(lambda: build_cnn(config.image_size, config.seed), distribution)
    compile_cnn(model, "adam", config.learning_rate)
    report("weights (path, shape, sharding):")
    for line in zd.format_sharding_summary(model):
        report("  " + line)

    train_data, validation_data, test_data = _datasets(config, replicas)
    throughput = Throughput(config.batch_size, report)
    # shuffle=False: DivisibleBatches reshuffles itself, seeded; Keras' own batch shuffle is not.
    history = model.fit(
        train_data, validation_data=validation_data, epochs=config.epochs, shuffle=False, callbacks=[throughput], verbose=1
    )
    accuracy = evaluate_accuracy(model, *test_data, batch_size=config.batch_size, replicas=replicas)
    report(f"held-out test accuracy: {accuracy:.4f} ({len(test_data[1])} images, chance {1 / len(SHAPE_CLASSES):.4f})")
    save_model_atomically(model, config.output)
    report(f"saved model to {config.output}")
    return {"history": history.history, "test_accuracy": accuracy, "images_per_second": throughput.per_epoch, "model": model}


def _report_setup(distribution, report):
    report(f"devices: {zd.describe_devices()}")
    if distribution is None:
        report("distribution: single device")
    else:
        report(f"distribution: {type(distribution).__name__} on mesh {zd.describe_mesh(distribution.device_mesh)}")


def _datasets(config, replicas):
    x, y = load_shapes("train", image_size=config.image_size, num_examples=config.train_examples, seed=config.seed)
    xv, yv = load_shapes("validation", image_size=config.image_size, seed=config.seed)
    test = load_shapes("test", image_size=config.image_size, seed=config.seed)
    train_data = DivisibleBatches(x, y, batch_size=config.batch_size, multiple_of=replicas, remainder="drop", shuffle=True, seed=config.seed)
    validation_data = DivisibleBatches(xv, yv, batch_size=config.batch_size, multiple_of=replicas, remainder="pad")
    return train_data, validation_data, test


def evaluate_accuracy(model, x, y, *, batch_size, replicas):
    """Top-1 accuracy from ``predict`` over every example (padding trimmed)."""
    batches = DivisibleBatches(x, batch_size=batch_size, multiple_of=replicas, remainder="pad")
    logits = batches.trim(model.predict(batches, verbose=0))
    return float(np.mean(np.argmax(logits, axis=-1) == y))


def save_model_atomically(model, path):
    """Save a ``.keras`` file so that a crash mid-write never leaves a broken file at ``path``."""
    if not path.endswith(".keras"):
        raise ValueError(f"model path must end in .keras, got {path!r}")
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    handle, partial = tempfile.mkstemp(suffix=".keras", dir=directory, prefix=".partial-")
    os.close(handle)
    try:
        model.save(partial)
        os.replace(partial, path)
    finally:
        if os.path.exists(partial):
            os.remove(partial)


def verify(config, report=print):
    """Parity of the small CNN under a distribution against one device; returns the report."""
    if config.distribution == "single":
        raise ValueError("verify compares a distribution with one device: choose --distribution data or model")
    distribution = resolve_distribution(config.distribution, config.mesh)
    _report_setup(distribution, report)
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
