"""What the GPT parity tests share (``test_gpt_parity.py``, ``test_gpt_remat.py``): the
tiny model, its layouts' distributions, the optimizer and the data."""

import dataclasses

import keras
import numpy as np

from zoo.distribution import CheckedModelParallel, distribution_for, make_mesh
from zoo.models._transformer_layouts import layout_overrides
from zoo.models.gpt import GPT_CONFIGS, GPTBackbone, GPTCausalLM

LENGTH, BATCH, STEPS = 16, 8, 3  # T = 16 splits 4 ways over 'seq' under context parallelism
TRAIN_LAYERS = 1  # each compile of a block's forward and backward costs seconds on CPU
# gpt_tiny with 8 query / 4 KV heads (head_dim 4) so heads split over a model axis of 4
CONFIG = GPT_CONFIGS["gpt_tiny"] | dict(
    num_query_heads=8, num_key_value_heads=4, dropout=0.1, seed=11, tie_word_embeddings=True
)


def model_config(layout, **overrides):
    """``GPTBackbone`` arguments for ``layout``: ``CONFIG``, ``overrides`` and what the layout needs."""
    return CONFIG | overrides | layout_overrides(layout)  # context: the distribution picks the attention kernel


def build_lm(config):
    return GPTCausalLM(backbone=GPTBackbone(**config))


def layout_distribution(layout, mesh, config):
    if layout.startswith("context"):  # "context-<kernel>": inputs split on batch and sequence
        return distribution_for(GPTCausalLM, "context", mesh, context_attention=layout.split("-")[1])
    mesh = make_mesh(mesh)
    if layout == "data":
        return keras.distribution.DataParallel(device_mesh=mesh)
    layout_map = GPTCausalLM.get_layout_map(mesh, layout, config=config)
    return CheckedModelParallel(layout_map=layout_map, batch_dim_name="data")


def compile_sgd(model):
    model.compile(
        optimizer=keras.optimizers.SGD(learning_rate=0.5, momentum=0.9),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )


def language_data(count=STEPS * BATCH, seed=0):
    """(tokens, next tokens), both i32[N, T]: byte sequences with a learnable pattern."""
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, 200, size=(count, 1))
    sequence = (starts + np.arange(LENGTH + 1)[None, :] * rng.integers(1, 4, size=(count, 1))) % 256
    return sequence[:, :-1].astype("int32"), sequence[:, 1:].astype("int32")


def as_stacked(run, layers):
    """``run`` (a ``parity`` run of the L-layer form) with its per-block arrays stacked as
    the scanned form holds them: ``block_<l>/<path>`` -> ``blocks/<path>`` (1, L, ...)."""

    def stacked(arrays):
        out = {path: array for path, array in arrays.items() if not path.startswith("block_")}
        for path in arrays:
            if path.startswith("block_0/"):
                relative = path.split("/", 1)[1]
                blocks = [arrays[f"block_{index}/{relative}"] for index in range(layers)]
                out[f"blocks/{relative}"] = np.stack(blocks)[None]  # (1, L, ...)
        return out

    return dataclasses.replace(run, gradients=stacked(run.gradients), weights=stacked(run.weights))
