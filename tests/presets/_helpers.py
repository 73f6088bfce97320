"""Shared by the preset tests: a fixed input, a writable copy of a shipped preset, file hashes."""

import hashlib
import pathlib
import shutil

import numpy as np

from zoo.presets import preset_directory


def fixed_images(count=2, size=32, channels=3):
    """A deterministic (count, size, size, channels) float32 image batch in [0, 1)."""
    values = np.arange(count * size * size * channels, dtype=np.float32) * np.float32(0.618034) % np.float32(1.0)
    return values.reshape(count, size, size, channels)


def copy_preset(name, tmp_path):
    """A copy of shipped preset ``name`` under ``tmp_path`` (a ``pathlib.Path``)."""
    target = pathlib.Path(tmp_path) / name
    shutil.copytree(preset_directory(name), target)
    return target


def file_hashes(directory):
    """``{file name: sha256}`` of every file in ``directory``."""
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(pathlib.Path(directory).iterdir())
        if p.is_file()
    }


TEXTS = ["for x in range(3):\n    print(x)", "class C:\n    pass"]


def fixed_text(preset):
    """``TEXTS`` as token ids by the preset's own tokenizer: (2, T) int32."""
    from zoo.data import ByteTokenizer
    from zoo.presets import load_tokenizer

    tokenizer = load_tokenizer(preset)
    if tokenizer.sequence_length is None:
        tokenizer = ByteTokenizer(sequence_length=32)
    return tokenizer.encode(TEXTS)
