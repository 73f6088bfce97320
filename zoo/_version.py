"""The keras-zoo version, in one place (DESIGN.md, convention 14; keras-hub's ``version.py``).

A module of its own, importing nothing, so that code below the command line (presets'
metadata, checkpoints) reads the version without importing the package root, which
imports every part of the zoo. ``zoo.__version__`` re-exports it; ``pyproject.toml``'s
``version`` must say the same (``tests/test_architecture.py`` checks it).
"""

__version__ = "0.1.0"
