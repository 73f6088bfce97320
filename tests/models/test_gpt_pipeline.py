"""The pipelined GPT (layout ``pipeline``) trains to the single-device numbers, and its
weights do not depend on the stage count.

8 simulated devices; the tiny GPT of ``_gpt_parity`` with 4 blocks (one
``PipelinedBlocks``: one block per stage and repeat), batch 12, T = 16, 3 SGD-with-momentum steps with dropout on, M = 3
micro-batches (fewer than 4 stages; not a multiple of 2). ``check_parity`` compares
each run with the one-device run (losses per step, first-batch gradients, outputs after
training, final weights): GPipe on ``data=2,stage=4``, the circular schedule (2 repeats)
on ``data=2,stage=2,model=2`` (tensor parallelism inside each stage). Both schedules
compute the same numbers on one device (the blocks in order, the same per-row dropout
masks), so one reference run serves both, its stacked arrays reshaped from (1, 4, ...)
to (2, 2, ...). The layer-level checks of the other meshes and schedules:
tests/layers/test_pipelined_blocks.py.
"""

import dataclasses

import keras
import numpy as np
import pytest

from tests.models._gpt_parity import CONFIG, STEPS, build_lm, compile_sgd, language_data
from zoo.distribution import distribution_for, parity
from zoo.models.gpt import GPTBackbone, GPTCausalLM

BATCH, MICRO_BATCHES, LAYERS = 12, 3, 4  # rows per micro-batch (4) divide over data=2; S*R = 4 divides L


def pipelined_config(schedule="gpipe", repeats=1, **overrides):
    return CONFIG | dict(num_layers=LAYERS, schedule=schedule, micro_batches=MICRO_BATCHES, repeats=repeats) | overrides


def _data():
    return language_data(count=STEPS * BATCH)


@pytest.fixture(scope="module")
def reference():
    """The one-device run of the GPipe model (the circular one computes the same)."""
    config = pipelined_config()
    return parity.reference_run(lambda: build_lm(config), compile_sgd, *_data(), steps=STEPS, batch_size=BATCH)


def with_repeats(run, repeats):
    """``run`` with every stacked (1, L, ...) array reshaped to (R, L/R, ...)."""

    def reshaped(path, array):
        return array.reshape(repeats, -1, *array.shape[2:]) if "blocks/" in path else array

    return dataclasses.replace(
        run,
        initial=[reshaped(path, array) for path, array in zip(run.weights, run.initial)],
        gradients={path: reshaped(path, array) for path, array in run.gradients.items()},
        weights={path: reshaped(path, array) for path, array in run.weights.items()},
    )


@pytest.mark.parametrize(
    "schedule, repeats, mesh", [("gpipe", 1, "data=2,stage=4"), ("circular", 2, "data=2,stage=2,model=2")]
)
def test_three_steps_of_fit_match_one_device(schedule, repeats, mesh, reference):
    config = pipelined_config(schedule, repeats)
    distribution = distribution_for(GPTCausalLM, "pipeline", mesh, config=config)
    report = parity.check_parity(
        lambda: build_lm(config),
        compile_sgd,
        distribution,
        *_data(),
        steps=STEPS,
        reference=with_repeats(reference, repeats),
    )
    assert report.passed, "\n".join(report.format())
    assert report.reference_losses[2] < report.reference_losses[0]  # not vacuous: it trained


def test_saved_on_four_stages_loads_on_two_and_on_one_device_with_the_same_logits(tmp_path):
    """And those logits are the ones of the same weights in ordinary ``block_<i>`` layers."""
    config = pipelined_config(dropout=0.0)
    tokens = _data()[0][:BATCH]
    logits = {}
    keras.utils.set_random_seed(1)
    for mesh in ("data=2,stage=4", "data=4,stage=2", None):
        distribution = None if mesh is None else distribution_for(GPTCausalLM, "pipeline", mesh, config=config)
        keras.distribution.set_distribution(distribution)
        try:
            model = build_lm(config) if mesh == "data=2,stage=4" else keras.saving.load_model(tmp_path / "lm.keras")
            if mesh == "data=2,stage=4":
                model.save(tmp_path / "lm.keras")
            logits[mesh] = np.asarray(model.predict(tokens, batch_size=BATCH, verbose=0))
        finally:
            keras.distribution.set_distribution(None)
    # the same weights, the same blocks in the same order; only float32 rounding of the
    # differently sized per-device batches differs (3.7e-7 at most here)
    np.testing.assert_allclose(logits["data=4,stage=2"], logits["data=2,stage=4"], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(logits[None], logits["data=2,stage=4"], rtol=1e-6, atol=1e-6)

    plain = layer_by_layer(model, CONFIG | dict(num_layers=LAYERS, dropout=0.0))
    np.testing.assert_allclose(plain.predict(tokens, batch_size=BATCH, verbose=0), logits[None], rtol=1e-5, atol=1e-5)


def layer_by_layer(model, config):
    """The LM of ``config`` (no schedule: ``block_0`` .. ``block_<L-1>``) holding the
    pipelined ``model``'s weights (gpipe: stacked (1, L, ...))."""
    plain = build_lm(config)
    stacked = model.backbone.pipelined_blocks.stacked
    for index, block in enumerate(plain.backbone.blocks):
        for variable in block.weights:
            variable.assign(stacked[variable.path.split("/", 1)[1]].numpy()[0, index])
    plain.backbone.token_embedding.set_weights(model.backbone.token_embedding.get_weights())
    plain.backbone.final_norm.set_weights(model.backbone.final_norm.get_weights())
    return plain


def test_a_pipelined_window_with_a_local_rope_base_computes_what_the_layers_do():
    """Every block windowed (W = 4 < T = 16) with Gemma 3's local RoPE base, which differs
    from the global one: the pipeline's blocks take it as block_<i> do. Without it (the
    global base in the pipeline) the logits differed by 0.17."""
    local = dict(dropout=0.0, sliding_window=4, rope_max_wavelength=1e6, local_rope_max_wavelength=1e2)
    config = pipelined_config(**local)
    tokens = _data()[0][:BATCH]
    keras.utils.set_random_seed(2)
    model = build_lm(config)
    assert model.backbone.pipelined_blocks.block["rotary_base"] == 1e2
    plain = layer_by_layer(model, CONFIG | dict(num_layers=LAYERS) | local)
    assert {block.attention.rotary_base for block in plain.backbone.blocks} == {1e2}
    np.testing.assert_allclose(
        plain.predict(tokens, batch_size=BATCH, verbose=0),
        model.predict(tokens, batch_size=BATCH, verbose=0),
        rtol=1e-5,
        atol=1e-5,
    )


def test_a_pipelined_backbone_names_what_it_cannot_do():
    backbone = GPTBackbone(**pipelined_config())
    with pytest.raises(
        ValueError,
        match=r"holds its blocks stacked \(pipelined, schedule='gpipe'\): its 4 blocks are one PipelinedBlocks",
    ):
        backbone.empty_caches(1, 4)  # KV-cache decoding walks the blocks one by one
    with pytest.raises(ValueError, match=r"megatron_sp=True and context_attention=None must be False and None"):
        GPTBackbone(**pipelined_config(megatron_sp=True))
