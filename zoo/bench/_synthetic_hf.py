"""``zoo bench hf-load``'s checkpoint: Llama-3.2-1B's ``config.json`` with the settings'
sizes, and random bfloat16 safetensors of every tensor it names, written once per size
into a folder of its own (``checkpoint_folder``)."""

import contextlib
import json
import math
import os
import shutil
import tempfile
import time
from collections.abc import Mapping

import ml_dtypes
import numpy as np

from zoo.models.gpt import hf_checkpoints
from zoo.models.gpt.hf_checkpoints import backbone_arguments
from zoo.presets.safetensors_weights import write_safetensors
from zoo.units import MIB

# Llama-3.2-1B's config.json (meta-llama/Llama-3.2-1B), less the sizes (SIZES: the settings).
LLAMA_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "hidden_act": "silu",
    "initializer_range": 0.02,
    "max_position_embeddings": 131072,
    "mlp_bias": False,
    "model_type": "llama",
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "factor": 32.0,
        "high_freq_factor": 4.0,
        "low_freq_factor": 1.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "rope_theta": 500000.0,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.45.0.dev0",
    "use_cache": True,
}
SIZES = {  # setting -> config.json key
    "vocabulary_size": "vocab_size",
    "num_layers": "num_hidden_layers",
    "hidden_dim": "hidden_size",
    "num_query_heads": "num_attention_heads",
    "num_key_value_heads": "num_key_value_heads",
    "head_dim": "head_dim",
    "intermediate_dim": "intermediate_size",
}
SEED = 0


def synthetic_config(settings):
    """Llama-3.2-1B's ``config.json`` with the settings' sizes."""
    return {**LLAMA_CONFIG, **{key: getattr(settings, name) for name, key in SIZES.items()}}


def weight_shapes(arguments):
    """``{zoo variable path: shape}`` of a ``GPTBackbone`` (hf_checkpoints' table), from
    its arguments, without building it; ``load_into`` checks each against the model's."""
    return {path: hf_checkpoints.weight_shape(path, arguments) for path in hf_checkpoints.weight_views(arguments)}


def random_bfloat16(shape, seed):
    """Random bfloat16 in +-[2^-7, 2^-5) (Llama-like magnitudes; no inf or NaN), from random
    bits: a sign, exponent 120 or 121, a mantissa."""
    bits = np.frombuffer(np.random.default_rng(seed).bytes(2 * math.prod(shape)), np.uint16).reshape(shape)
    return ((bits & 0x80FF) | 0x3C00).view(ml_dtypes.bfloat16)


class SyntheticTensors(Mapping):
    """``{Hugging Face name: bfloat16 file tensor}``, each made when asked for (the same
    values every time: seeded by its position), so ``write_safetensors`` holds one file's
    tensors at a time. A tensor is the view's file shape of a random zoo-shaped weight
    (``TensorView.to_file``)."""

    def __init__(self, arguments, seed=SEED):
        shapes = weight_shapes(arguments)
        views = hf_checkpoints.weight_views(arguments)
        self._tensors = {view.name: (index, view, shapes[path]) for index, (path, view) in enumerate(views.items())}
        self.seed = seed

    def __getitem__(self, name):
        index, view, shape = self._tensors[name]
        return view.to_file(random_bfloat16(shape, (self.seed, index)))

    def __iter__(self):
        return iter(self._tensors)

    def __len__(self):
        return len(self._tensors)


def write_checkpoint(settings, directory):
    """A synthetic Hugging Face folder of the settings' sizes in ``directory``; returns its path."""
    hf = synthetic_config(settings)
    os.makedirs(directory, exist_ok=True)
    write_safetensors(
        SyntheticTensors(backbone_arguments(hf)), directory, max_file_bytes=int(settings.max_file_size_mb * MIB)
    )
    with open(os.path.join(directory, hf_checkpoints.CONFIG_FILE), "w", encoding="utf-8") as file:
        json.dump(hf, file, indent=2, sort_keys=True)
    return directory


@contextlib.contextmanager
def checkpoint_folder(settings, report):
    """The folder to load: ``settings.checkpoint``, or a synthetic one, deleted on exit."""
    if settings.checkpoint:
        yield settings.checkpoint
        return
    scratch = tempfile.mkdtemp(prefix="zoo-hf-load-")
    try:
        start = time.perf_counter()
        write_checkpoint(settings, scratch)
        report(f"wrote a synthetic checkpoint to {scratch} in {time.perf_counter() - start:.0f} s")
        yield scratch
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def describe_checkpoint(folder):
    """``(files, bytes, elements, dtypes)`` of the folder's safetensors."""
    names = sorted(n for n in os.listdir(folder) if n.endswith(".safetensors"))
    nbytes, elements, dtypes = 0, 0, set()
    for name in names:
        header = _safetensors_header(os.path.join(folder, name))
        for key, entry in header.items():
            if key != "__metadata__":
                nbytes += entry["data_offsets"][1] - entry["data_offsets"][0]
                elements += math.prod(entry["shape"])
                dtypes.add(entry["dtype"])
    return len(names), nbytes, elements, sorted(dtypes)


def _safetensors_header(path):
    """The JSON header of a safetensors file (8-byte little-endian length, then JSON)."""
    with open(path, "rb") as file:
        length = int.from_bytes(file.read(8), "little")
        return json.loads(file.read(length))
