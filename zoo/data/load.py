"""``zoo.data.load``: one call for every dataset, giving arrays ``model.fit`` takes directly.

| task | ``x`` | ``y`` |
| --- | --- | --- |
| image classification | float32 ``(N, S, S, C)`` in [0, 1] | int32 ``(N,)`` |
| text classification | int32 ``(N, T)`` byte ids (``ByteTokenizer``) | int32 ``(N,)`` |
| language modelling | int32 ``(N, T)`` byte ids | int32 ``(N, T)``, next byte |
"""

import numpy as np

from zoo.data import catalog, tfds_source
from zoo.data._windows import check_sequence_length, next_token_windows
from zoo.data.process_shard import process_rows
from zoo.data.python_docs import topic_windows
from zoo.tokenizers import ByteTokenizer

DEFAULT_SEQUENCE_LENGTH = 128


def load(
    name,
    split="train",
    *,
    data_dir=None,
    download=False,
    image_size=None,
    sequence_length=None,
    num_examples=None,
    process_index=0,
    process_count=1,
):
    """Load one split of a dataset as ``(x, y)`` numpy arrays.

    Args:
        name: a name from ``zoo.data.DATASETS`` (``zoo data list``).
        split: a split of that dataset (``train``, ``validation``, ``test``).
        data_dir: TFDS data folder; default ``$ZOO_DATA_DIR``, ``$TFDS_DATA_DIR`` or
            ``~/tensorflow_datasets``. Embedded datasets are prepared there on first use.
        download: allow TFDS to download and prepare a public dataset (needs internet).
            Without it a dataset that is not prepared fails at once, saying how to prepare it.
        image_size: images: side length, the native size or an integer multiple of it
            (enlarged by pixel repetition); shapes: 16, 32, 64 or 128.
        sequence_length: text: tokens per example (default 128).
        num_examples: keep only the first ``num_examples`` examples (before sharding).
        process_index, process_count: return only this process's contiguous 1/P of the
            examples (``process_rows``); image and text-classification datasets then
            read only those rows from disk. Pass ``*zoo.data.current_process()`` under
            multi-host training.
    """
    spec = catalog.get_spec(name)
    _check_split(spec, split)
    shard = (process_index, process_count, num_examples)
    if spec.task == catalog.IMAGE_CLASSIFICATION:
        return _load_images(
            spec, split, data_dir, download, spec.default_image_size if image_size is None else image_size, shard
        )
    sequence_length = DEFAULT_SEQUENCE_LENGTH if sequence_length is None else sequence_length
    check_sequence_length(sequence_length)
    x, y = _load_text(spec, split, data_dir, download, sequence_length)
    rows = _shard_rows(len(x), *shard)
    return x[rows.start : rows.stop], y[rows.start : rows.stop]


def _check_split(spec, split):
    base = split.split("[")[0]
    if base not in spec.splits:
        raise ValueError(f"dataset {spec.name!r} has no split {split!r}; its splits are {list(spec.splits)}")


def _shard_rows(available, process_index, process_count, num_examples):
    """Rows to read: the first ``num_examples``, then this process's share of them."""
    if num_examples is not None and not 1 <= num_examples <= available:
        raise ValueError(f"num_examples must be in [1, {available}], got {num_examples}")
    return process_rows(num_examples or available, process_index, process_count)


def _load_images(spec, split, data_dir, download, image_size, shard):
    builder = _shapes_builder(image_size) if spec.name == "shapes" else spec.builder
    source = tfds_source.read_split(builder, split, data_dir=data_dir, download=download)
    rows = _shard_rows(len(source), *shard)
    images, labels = tfds_source.to_numpy([source[i] for i in rows], ["image", "label"])
    if images.ndim == 3:
        images = images[..., None]  # (N, H, W) -> (N, H, W, 1)
    scale = 16.0 if spec.name == "digits" else 255.0
    images = images.astype(np.float32) / scale  # (N, H, W, C) in [0, 1]
    return _enlarge(images, image_size, spec.name), labels.astype(np.int32)


def prepared_image_sizes(name):
    """The image sizes ``name`` is prepared at (shapes: one folder per size), or None when
    any multiple of its native size is taken (enlarged on loading)."""
    from zoo.data.builders.shapes_builder import IMAGE_SIZES

    return IMAGE_SIZES if name == "shapes" else None


def _shapes_builder(image_size):
    sizes = prepared_image_sizes("shapes")
    if image_size not in sizes:
        raise ValueError(
            f"shapes is prepared at image sizes {list(sizes)}, got {image_size}; zoo.data.load_shapes generates any size in memory"
        )
    return f"zoo_shapes/{image_size}"


def _enlarge(images, image_size, name):
    native = images.shape[1]
    if image_size == native:
        return images
    if image_size < 1 or image_size % native:
        raise ValueError(f"{name}: image_size must be {native} or a multiple of it, got {image_size}")
    factor = image_size // native
    return images.repeat(factor, axis=1).repeat(factor, axis=2)


def _corpus_windows(ids, sequence_length, spec, split):
    """``next_token_windows``, or an error naming the corpus' size when not one window fits."""
    if len(ids) - 1 < sequence_length:
        raise ValueError(
            f"the {spec.name} {split} split has {len(ids):,} bytes; the sequence length must be below that, got {sequence_length:,}"
        )
    return next_token_windows(ids, sequence_length)


def _load_text(spec, split, data_dir, download, sequence_length):
    source = tfds_source.read_split(spec.builder, split, data_dir=data_dir, download=download)
    if spec.name.startswith("python_docs"):
        topics, texts = tfds_source.to_numpy(source, ["topic", "text"])
        by_topic = dict(sorted(zip(topics, texts)))  # to_numpy gives text as str
        if spec.task == catalog.TEXT_CLASSIFICATION:
            return topic_windows(by_topic, sequence_length)
        return _corpus_windows(ByteTokenizer().encode("\n\n".join(by_topic.values())), sequence_length, spec, split)
    if spec.task == catalog.LANGUAGE_MODELING:  # tiny_shakespeare: one long text per split
        (texts,) = tfds_source.to_numpy(source, ["text"])
        return _corpus_windows(ByteTokenizer().encode("".join(texts)), sequence_length, spec, split)
    texts, labels = tfds_source.to_numpy(source, ["text", "label"])  # imdb_reviews
    return ByteTokenizer(sequence_length).encode(list(texts)), labels.astype(np.int32)
