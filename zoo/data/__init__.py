"""Datasets: one ``load`` for embedded and TFDS datasets, divisible batching, and ``ByteTokenizer``
(whose home is ``zoo.tokenizers``; kept here for ``zoo.data`` users)."""

from zoo.data.catalog import DATASETS, DatasetSpec, get_spec
from zoo.data.digits import DIGIT_CLASSES, load_digits
from zoo.data.divisible_batches import DivisibleBatches
from zoo.data.load import load
from zoo.data.packing import pack_examples, padding_fraction
from zoo.data.process_shard import current_process, local_batching, process_rows
from zoo.data.python_docs import TOPIC_CLASSES, unigram_entropy
from zoo.data.shapes import SHAPE_CLASSES, load_shapes
from zoo.data.text_files import LMExamples, load_text_file, split_held_out
from zoo.tokenizers import ByteTokenizer

__all__ = [
    "DATASETS",
    "DIGIT_CLASSES",
    "SHAPE_CLASSES",
    "TOPIC_CLASSES",
    "ByteTokenizer",
    "DatasetSpec",
    "DivisibleBatches",
    "LMExamples",
    "current_process",
    "get_spec",
    "load",
    "load_digits",
    "load_shapes",
    "load_text_file",
    "local_batching",
    "pack_examples",
    "padding_fraction",
    "process_rows",
    "split_held_out",
    "unigram_entropy",
]
