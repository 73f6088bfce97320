"""Every dataset ``zoo.data.load`` knows: the embedded ones and the named TFDS ones."""

import dataclasses

from zoo.data.digits import DIGIT_CLASSES
from zoo.data.python_docs import TOPIC_CLASSES
from zoo.data.shapes import SHAPE_CLASSES

IMAGE_CLASSIFICATION = "image classification"
TEXT_CLASSIFICATION = "text classification"
LANGUAGE_MODELING = "language modelling"


@dataclasses.dataclass(frozen=True)
class DatasetSpec:
    """What a dataset is and where it comes from."""

    name: str  # the name given to zoo.data.load
    task: str  # IMAGE_CLASSIFICATION | TEXT_CLASSIFICATION | LANGUAGE_MODELING
    embedded: bool  # True: built on this machine from what ships with keras-zoo / Python
    builder: str  # TFDS builder name (ours start with "zoo_")
    splits: tuple  # split names
    classes: tuple = ()  # class names (classification tasks)
    default_image_size: int | None = None  # images: side length load() returns by default
    description: str = ""
    attribution: str = ""


DATASETS = {
    spec.name: spec
    for spec in (
        DatasetSpec(
            "shapes",
            IMAGE_CLASSIFICATION,
            True,
            "zoo_shapes",
            ("train", "validation", "test"),
            SHAPE_CLASSES,
            32,
            "procedural RGB images of 8 shapes varying in position, size, colour and noise; 2048/512/512",
        ),
        DatasetSpec(
            "digits",
            IMAGE_CLASSIFICATION,
            True,
            "zoo_digits",
            ("train", "validation", "test"),
            DIGIT_CLASSES,
            16,
            "1,797 real hand-written digits, 8x8 grey levels 0..16; 1437/180/180",
            "UCI optdigits test set, E. Alpaydin and C. Kaynak (1998), CC BY 4.0 (as shipped with scikit-learn)",
        ),
        DatasetSpec(
            "python_docs",
            LANGUAGE_MODELING,
            True,
            "zoo_python_docs",
            ("train", "validation", "test"),
            description="next-byte prediction on CPython's pydoc topic help (~465k characters of English)",
            attribution="Python documentation, Python Software Foundation License",
        ),
        DatasetSpec(
            "python_docs_topics",
            TEXT_CLASSIFICATION,
            True,
            "zoo_python_docs",
            ("train", "validation", "test"),
            TOPIC_CLASSES,
            description="which part of the language reference a window of pydoc topic help comes from (4 classes)",
            attribution="Python documentation, Python Software Foundation License",
        ),
        DatasetSpec(
            "mnist",
            IMAGE_CLASSIFICATION,
            False,
            "mnist",
            ("train", "test"),
            DIGIT_CLASSES,
            28,
            "TFDS mnist: 28x28 grey digits",
        ),
        DatasetSpec(
            "cifar10",
            IMAGE_CLASSIFICATION,
            False,
            "cifar10",
            ("train", "test"),
            ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"),
            32,
            "TFDS cifar10: 32x32 RGB images in 10 classes",
        ),
        DatasetSpec(
            "imdb_reviews",
            TEXT_CLASSIFICATION,
            False,
            "imdb_reviews",
            ("train", "test"),
            ("negative", "positive"),
            description="TFDS imdb_reviews: movie review sentiment",
        ),
        DatasetSpec(
            "tiny_shakespeare",
            LANGUAGE_MODELING,
            False,
            "tiny_shakespeare",
            ("train", "validation", "test"),
            description="TFDS tiny_shakespeare: ~1M characters of Shakespeare",
        ),
    )
}


def get_spec(name):
    """The ``DatasetSpec`` of ``name``; an unknown name lists the known ones."""
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; available: {', '.join(DATASETS)}")
    return DATASETS[name]
