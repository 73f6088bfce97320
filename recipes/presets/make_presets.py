"""Train the shipped presets on the embedded offline datasets and save them.

Usage (from the repository root; one CPU is enough, a few minutes for all):

    python recipes/presets/make_presets.py                  # every preset
    python recipes/presets/make_presets.py small_cnn_shapes # only these
    python recipes/presets/make_presets.py --output-dir /tmp/presets

Every run starts from fixed seeds on one device, so rerunning it reproduces the
weights (up to float rounding differences between machines). The presets land in
``zoo/presets/assets/<name>/`` and are listed in ``zoo/presets/registry.py``.
"""

import argparse
import os
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "jax")

import keras  # noqa: E402
import numpy as np  # noqa: E402

from zoo.data import ByteTokenizer, DivisibleBatches, get_spec, load  # noqa: E402
from zoo.presets import save_to_preset  # noqa: E402
from zoo.training.cnn import evaluate_accuracy  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_OUTPUT = os.path.join(ROOT, "zoo", "presets", "assets")
SEED = 0  # weights, dropout and shuffling


def small_cnn_shapes():
    """SmallCNN on the 8 shapes at 32x32: ~40k parameters, 12 epochs."""
    from zoo.models import SmallCNN

    data = _image_data("shapes", image_size=32)
    model = SmallCNN(num_classes=8, image_size=32, channels=3, filters=(8, 16, 32), hidden_units=64, seed=SEED)
    training = dict(epochs=12, batch_size=32, learning_rate=3e-3)  # ~40 s on one CPU core
    return model, data, training, None


def gpt_tiny_python_docs():
    """GPTCausalLM "gpt_tiny" (2 layers, width 32, GQA) predicting the next byte of the
    Python docs, 64-byte windows."""
    from zoo.models.gpt import GPTCausalLM

    data = _text_data("python_docs", sequence_length=64)
    model = GPTCausalLM.from_config_name("gpt_tiny", max_sequence_length=64, seed=SEED)
    training = dict(epochs=3, batch_size=32, learning_rate=3e-3)
    return model, data, training, ByteTokenizer()


def encoder_tiny_topics():
    """TransformerEncoderClassifier "encoder_tiny" telling the 4 pydoc topics apart from
    64-byte windows."""
    from zoo.models.encoder import TransformerEncoderClassifier

    data = _text_data("python_docs_topics", sequence_length=64)
    model = TransformerEncoderClassifier.from_config_name(
        "encoder_tiny", max_sequence_length=64, num_classes=4, seed=SEED
    )
    training = dict(epochs=5, batch_size=32, learning_rate=3e-3)
    return model, data, training, ByteTokenizer(sequence_length=64)


def vit_tiny_shapes():
    """ViTClassifier "vit_tiny" on the 8 shapes at 32x32 (4x4 patches: 64 tokens + class token)."""
    from zoo.models.vit import ViTClassifier

    data = _image_data("shapes", image_size=32)
    model = ViTClassifier.from_config_name(
        "vit_tiny", image_size=32, patch_size=4, num_classes=8, dropout=0.1, seed=SEED
    )
    training = dict(epochs=30, batch_size=32, learning_rate=2e-3)  # a ViT needs many passes over 2,048 images
    return model, data, training, None


RECIPES = {
    "small_cnn_shapes": small_cnn_shapes,
    "gpt_tiny_python_docs": gpt_tiny_python_docs,
    "encoder_tiny_topics": encoder_tiny_topics,
    "vit_tiny_shapes": vit_tiny_shapes,
}


def _image_data(dataset, image_size):
    splits = [load(dataset, split, image_size=image_size) for split in ("train", "validation", "test")]
    return dataset, splits


def _text_data(dataset, sequence_length):
    splits = [load(dataset, split, sequence_length=sequence_length) for split in ("train", "validation", "test")]
    return dataset, splits


def train_and_save(name, output_dir, report=print):
    """Train preset ``name`` from its recipe and save it under ``output_dir/name``."""
    keras.utils.set_random_seed(SEED)
    model, (dataset, splits), training, tokenizer = RECIPES[name]()
    (x, y), (xv, yv), (xt, yt) = splits
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate=training["learning_rate"]),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        weighted_metrics=["accuracy"],
    )
    start = time.time()
    batches = DivisibleBatches(x, y, batch_size=training["batch_size"], remainder="drop", shuffle=True, seed=SEED)
    history = model.fit(batches, epochs=training["epochs"], shuffle=False, verbose=2)
    accuracy = _accuracy(model, xt, yt, training["batch_size"])
    validation = _accuracy(model, xv, yv, training["batch_size"])
    spec = get_spec(dataset)
    metadata = {
        "dataset": dataset,
        "task": spec.task,
        "class_names": list(spec.classes),
        "input_shape": list(x.shape[1:]),
        "test_accuracy": round(accuracy, 4),
        "validation_accuracy": round(validation, 4),
        "training": {
            **training,
            "optimizer": "adam",
            "seed": SEED,
            "train_examples": int(len(x)),
            "final_loss": round(float(history.history["loss"][-1]), 4),
            "seconds": round(time.time() - start, 1),
            "recipe": "recipes/presets/make_presets.py",
        },
    }
    directory = save_to_preset(model, os.path.join(output_dir, name), name=name, tokenizer=tokenizer, metadata=metadata)
    report(f"{name}: {model.count_params():,} parameters, test accuracy {accuracy:.4f} -> {directory}")
    return metadata


def _accuracy(model, x, y, batch_size):
    """Top-1 accuracy (classification), or next-token accuracy (language modelling)."""
    if y.ndim == 1:
        return evaluate_accuracy(model, x, y, batch_size=batch_size, replicas=1)
    logits = model.predict(x, batch_size=batch_size, verbose=0)
    return float(np.mean(np.argmax(logits, axis=-1) == y))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help=f"presets to make (default all: {', '.join(RECIPES)})")
    parser.add_argument(
        "--output-dir", default=DEFAULT_OUTPUT, help="where preset folders go (default zoo/presets/assets)"
    )
    args = parser.parse_args(argv)
    unknown = sorted(set(args.names) - set(RECIPES))
    if unknown:
        parser.error(f"unknown preset(s) {unknown}; choose from {list(RECIPES)}")
    for name in args.names or RECIPES:
        train_and_save(name, args.output_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
