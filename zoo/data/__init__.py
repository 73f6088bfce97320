"""Datasets: one ``load`` for embedded and TFDS datasets, divisible batching, and ``ByteTokenizer``
(whose home is ``zoo.tokenizers``; kept here for ``zoo.data`` users)."""

from zoo.data.catalog import DATASETS, DatasetSpec, get_spec
from zoo.data.digits import DIGIT_CLASSES, load_digits
from zoo.data.divisible_batches import DivisibleBatches
from zoo.data.load import load
from zoo.data.process_shard import current_process, local_batching, process_rows
from zoo.data.python_docs import TOPIC_CLASSES, unigram_entropy
from zoo.data.shapes import SHAPE_CLASSES, load_shapes
from zoo.tokenizers import ByteTokenizer

__all__ = [
    "DATASETS",
    "DIGIT_CLASSES",
    "SHAPE_CLASSES",
    "TOPIC_CLASSES",
    "ByteTokenizer",
    "DatasetSpec",
    "DivisibleBatches",
    "current_process",
    "get_spec",
    "load",
    "load_digits",
    "load_shapes",
    "local_batching",
    "process_rows",
    "unigram_entropy",
]
