"""Datasets: the embedded offline shapes dataset and divisible batching."""

from zoo.data.divisible_batches import DivisibleBatches
from zoo.data.shapes import SHAPE_CLASSES, load_shapes

__all__ = ["DivisibleBatches", "SHAPE_CLASSES", "load_shapes"]
