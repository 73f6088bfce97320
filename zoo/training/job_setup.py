"""What every training job shares: settings -> distribution, the opening report lines,
data splits and held-out accuracy (helpers used by every job live here, not in one job)."""

import os
import time

import numpy as np

from zoo import distribution as zd
from zoo.config.settings import check_context_settings
from zoo.data import DivisibleBatches
from zoo.file_kinds import write_target
from zoo.training.callbacks import SynchronousSteps
from zoo.training.paths import PathError


def job_distribution(model_class, settings, mesh=None, *, model_config=None):
    """The distribution of a job's ``settings`` (``layout``, ``mesh``, and under the context
    layout ``context_attention`` and ``balance``) for ``model_class``, its layout map fitted
    to ``model_config`` (the model's config dict, e.g. tied embeddings have no head rule);
    ``mesh`` replaces ``settings.mesh`` (an abstract mesh for a compile-only check). None
    for ``single``."""
    check_context_settings(settings)  # again: layout auto may have chosen another layout since
    context = {}
    if settings.layout == "context":
        context = {
            "context_attention": getattr(settings, "context_attention", None),
            "balance": getattr(settings, "balance", None),
        }
    fitted = None if settings.layout in ("single", "data") else model_config
    return zd.distribution_for(
        model_class, settings.layout, settings.mesh if mesh is None else mesh, config=fitted, **context
    )


def report_setup(distribution, report):
    """Print the devices and the distribution (every training job starts with these lines)."""
    report(f"devices: {zd.describe_devices()}")
    if distribution is None:
        report("distribution: single device")
    else:
        report(f"distribution: {type(distribution).__name__} on mesh {zd.describe_mesh(distribution.device_mesh)}")


RUN_FOLDER_SUFFIX = ".run"  # a run's files (metrics.csv, steps.csv, tensorboard/): OUTPUT.run/ beside its --output


def run_dir_of(output, fallback="runs", *, output_is_folder=False):
    """The run's own folder, where ``metrics.csv``, ``steps.csv`` and ``tensorboard/`` go:
    ``OUTPUT.run`` beside the job's ``--output``, for a saved model file without its
    ``.keras`` (``runs/cnn/small_cnn.keras`` -> ``runs/cnn/small_cnn.run``) and for a saved
    folder (a preset, a Hugging Face folder: ``runs/x`` -> ``runs/x.run``). Every job
    (``zoo train cnn|gpt|encoder|vit``, ``zoo finetune``) names it so: two runs whose
    outputs share a folder never write (and overwrite) one another's run files, and a
    folder written whole at the end does not get them inside. Without an output: ``fallback``."""
    if not output:
        return fallback
    output = write_target(output)
    if not output_is_folder and output.endswith(".keras"):
        output = output[: -len(".keras")]
    run = output + RUN_FOLDER_SUFFIX
    if os.path.islink(run):  # its metrics.csv would overwrite another folder's
        write_target(run, error=lambda message: PathError("--output", output, f"its run folder {message}"))
    return run


def new_run_folder(parent):
    """A folder name under ``parent`` that no run has used: ``parent/<date>-<time>-<pid>``
    (``-2``, ``-3`` ... if taken), for a run with no ``--output`` and no checkpoint folder,
    so that its run files never overwrite another run's. Only the name: the run creates it."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    name = os.path.join(parent, f"{stamp}-{os.getpid()}")
    candidate, number = name, 1
    while os.path.lexists(candidate):
        number += 1
        candidate = f"{name}-{number}"
    return candidate


def train_validation_test_splits(spec):
    """A dataset's train, validation and test split names; without a validation split the
    last 10% of train is held out."""
    if "validation" in spec.splits:
        return "train", "validation", "test"
    return "train[:90%]", "train[90%:]", "test"


# Evaluation's batch at least: it holds no gradients or optimizer state, and each batch
# costs a fixed dispatch over every device besides its maths (the CNN's 512 validation
# images on 8 simulated devices: 32 batches of 16 took longer than training's 3 steps).
EVALUATION_BATCH = 256


def evaluation_batches(x, y=None, *, batch_size, replicas):
    """``DivisibleBatches`` of held-out data (padded, never dropped) in batches of
    ``max(batch_size, EVALUATION_BATCH)``: the same weighted means as training's batch size."""
    return DivisibleBatches(x, y, batch_size=max(batch_size, EVALUATION_BATCH), multiple_of=replicas, remainder="pad")


def evaluate_accuracy(model, x, y, *, batch_size, replicas):
    """Top-1 accuracy from ``predict`` over every example (padding trimmed)."""
    batches = evaluation_batches(x, batch_size=batch_size, replicas=replicas)
    logits = batches.trim(model.predict(batches, verbose=0, callbacks=[SynchronousSteps()]))
    return float(np.mean(np.argmax(logits, axis=-1) == y))
