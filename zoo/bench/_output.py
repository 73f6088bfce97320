"""Where a benchmark's markdown report goes besides stdout."""

import os


def write_text(path, text):
    """Write a benchmark's table to ``path``, creating its folder."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    with open(path, "w") as handle:
        handle.write(text + "\n")
