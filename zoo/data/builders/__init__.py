"""TFDS builders for the embedded offline datasets (no download, no TensorFlow).

The builders are deliberately *not* entered in TFDS's global registry
(``skip_registration=True``): re-importing or reloading these modules never clashes
with it, and ``tfds.builder("zoo_...")`` is not how they are reached. Use
``zoo.data.tfds_source.get_builder(name)``, which looks names up in
``EMBEDDED_BUILDERS``.
"""

from zoo.data.builders.digits_builder import DigitsBuilder
from zoo.data.builders.python_docs_builder import PythonDocsBuilder
from zoo.data.builders.shapes_builder import ShapesBuilder

EMBEDDED_BUILDERS = {cls.name: cls for cls in (ShapesBuilder, DigitsBuilder, PythonDocsBuilder)}

__all__ = ["DigitsBuilder", "EMBEDDED_BUILDERS", "PythonDocsBuilder", "ShapesBuilder"]
