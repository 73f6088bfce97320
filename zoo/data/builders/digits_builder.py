"""TFDS builder for the embedded UCI optdigits images (``zoo.data.digits``)."""

import numpy as np
import tensorflow_datasets as tfds

from zoo.data.digits import DIGIT_CLASSES, NATIVE_SIZE, SPLIT_FRACTIONS, read_digits, split_rows

MAX_PIXEL = 16  # stored pixels are counts 0..16, not 0..255

CITATION = """\
@misc{alpaydin1998optdigits,
  author = {Alpaydin, E. and Kaynak, C.},
  title = {{Optical Recognition of Handwritten Digits}},
  year = {1998},
  howpublished = {UCI Machine Learning Repository},
  note = {{DOI}: https://doi.org/10.24432/C50P49}
}"""


class DigitsBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    """``zoo_digits``: 1,797 real hand-written 8x8 digits shipped with keras-zoo."""

    name = "zoo_digits"
    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "Initial release: fixed 1,437 / 180 / 180 split (seed 1998)."}

    def _info(self):
        return tfds.core.DatasetInfo(
            builder=self,
            description=(
                "Hand-written digits, 8x8 pixels with integer values 0..16 (a count of "
                "set pixels in 4x4 blocks of a 32x32 bitmap): the test set of the UCI "
                "Optical Recognition of Handwritten Digits data set by E. Alpaydin and "
                "C. Kaynak (1998), as distributed with scikit-learn. Splits are a fixed "
                "seeded permutation of the 1,797 rows, stored in row order."
            ),
            features=tfds.features.FeaturesDict(
                {
                    "image": tfds.features.Tensor(shape=(NATIVE_SIZE, NATIVE_SIZE, 1), dtype=np.uint8),
                    "label": tfds.features.ClassLabel(names=DIGIT_CLASSES),
                }
            ),
            supervised_keys=("image", "label"),
            disable_shuffling=True,  # keep row order
            homepage="https://archive.ics.uci.edu/dataset/80/optical+recognition+of+handwritten+digits",
            citation=CITATION,
            license="CC BY 4.0",
        )

    def _split_generators(self, dl_manager):
        del dl_manager  # the data ship inside the package
        return {split: self._generate_examples(split) for split in SPLIT_FRACTIONS}

    def _generate_examples(self, split):
        pixels, labels = read_digits()  # (N, 8, 8) uint8, (N,) int32
        for row in split_rows(len(labels), split):
            # Key: the row of read_digits(), a stable id for the example.
            yield int(row), {"image": pixels[row, :, :, None], "label": int(labels[row])}
