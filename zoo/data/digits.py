"""Real hand-written digits that ship with keras-zoo (UCI optdigits, CC BY 4.0).

See ``zoo/data/resources/README.md`` for the source and attribution.
"""

import gzip
import importlib.resources

import numpy as np

DIGIT_CLASSES = tuple(str(d) for d in range(10))
NATIVE_SIZE = 8
# Fixed, disjoint split of the 1,797 images (a seeded permutation): 1,437 / 180 / 180.
SPLIT_FRACTIONS = {"train": (0.0, 0.8), "validation": (0.8, 0.9), "test": (0.9, 1.0)}
SPLIT_SEED = 1998


def read_digits():
    """All 1,797 digits: ``(pixels uint8 (N, 8, 8) in 0..16, labels int32 (N,))``."""
    raw = importlib.resources.files("zoo.data").joinpath("resources/optdigits.csv.gz").read_bytes()
    table = np.loadtxt(gzip.decompress(raw).decode().splitlines(), delimiter=",", dtype=np.int64)
    return table[:, :64].reshape(-1, NATIVE_SIZE, NATIVE_SIZE).astype(np.uint8), table[:, 64].astype(np.int32)


def load_digits(split="train", image_size=16):
    """Digits of one split as float images in [0, 1]: ``(x (N, S, S, 1) float32, y (N,) int32)``.

    ``image_size`` must be a multiple of 8; images are enlarged by pixel repetition.
    """
    if split not in SPLIT_FRACTIONS:
        raise ValueError(f"unknown digits split {split!r}; choose one of {list(SPLIT_FRACTIONS)}")
    if image_size < NATIVE_SIZE or image_size % NATIVE_SIZE:
        raise ValueError(f"digits image_size must be a multiple of {NATIVE_SIZE}, got {image_size}")
    pixels, labels = read_digits()
    rows = split_rows(len(labels), split)
    factor = image_size // NATIVE_SIZE
    images = pixels[rows].astype(np.float32) / 16.0  # (N, 8, 8)
    images = images.repeat(factor, axis=1).repeat(factor, axis=2)  # (N, S, S)
    return images[..., None], labels[rows]


def split_rows(count, split):
    """Row indices of ``split`` in a fixed permutation of ``count`` rows."""
    order = np.random.default_rng(SPLIT_SEED).permutation(count)
    start, stop = SPLIT_FRACTIONS[split]
    return np.sort(order[int(start * count) : int(stop * count)])
