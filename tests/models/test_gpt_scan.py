"""``scan_layers``: a GPT whose L blocks are stacked (1, L, ...) and run by one ``lax.scan``
trains to the numbers of the same weights as L layers, under ``context``, ``fsdp``, ``tp``,
``tp+sp`` and ``fsdp+tp`` to the one-device numbers (tp with the blocks split as the
layers'; tp+sp and context with the layers' sequence-parallel collectives), and converts
between the two forms (``GPTCausalLM.with_block_form``).

8 simulated devices; the tiny GPT of ``_gpt_parity`` (2 blocks, dropout off so the two
forms draw no masks), batch 8, T = 16, 3 SGD-with-momentum steps. One reference run of
the scanned model serves both checks. The real-size figures (Llama-3.2-1B dims, fsdp on 8
devices: 5.73 GiB per device vs 7.33 unrolled, with --loss-chunk-size 256, the same bytes): docs/performance.md.
"""

import keras
import numpy as np
import pytest

from tests.models._gpt_parity import BATCH, CONFIG, STEPS, as_stacked, build_lm, compile_sgd, language_data
from zoo.config.settings import GPTTrainSettings, SettingError
from zoo.distribution import distribution_for, make_mesh, parity
from zoo.measure.comms_report import train_step_comms_report
from zoo.models._transformer_layouts import layout_overrides
from zoo.models.gpt import GPTBackbone, GPTCausalLM

LAYERS = 2
SCANNED = CONFIG | dict(num_layers=LAYERS, dropout=0.0, scan_layers=True)


def _data():
    return language_data(count=STEPS * BATCH)


def _reference(build):
    return parity.reference_run(build, compile_sgd, *_data(), steps=STEPS, batch_size=BATCH)


@pytest.fixture(scope="module")
def scanned_reference():
    return _reference(lambda: build_lm(SCANNED))


def test_the_scanned_blocks_train_to_the_numbers_of_the_same_layers(scanned_reference):
    """Losses, first-batch gradients, outputs and weights after 3 steps: the layer form
    built from the scanned model's weights (``with_block_form``) computes the same."""
    layers = _reference(lambda: build_lm(SCANNED).with_block_form(scan_layers=False))
    assert not any(path.startswith("blocks/") for path in layers.weights)  # really the layer form
    report = parity.compare_runs(scanned_reference, as_stacked(layers, LAYERS))
    assert report.passed, "\n".join(report.format())
    assert scanned_reference.loss["step 3"] < scanned_reference.loss["step 1"]  # not vacuous: it trained


@pytest.mark.parametrize(
    "layout, mesh",
    [
        ("context", "data=2,seq=4"),  # the ring attention inside the loop; weights split over seq behind (1, L)
        ("fsdp", "data=8"),
        ("tp", "data=2,model=4"),
        ("tp+sp", "data=2,model=4"),  # Megatron's sequence-parallel layers inside the loop
        ("fsdp+tp", "data=2,model=4"),
    ],
)
def test_scanned_fit_matches_one_device(scanned_reference, layout, mesh):
    config = SCANNED | layout_overrides(layout)  # tp+sp: megatron_sp (the same weights, the same numbers on one device)
    distribution = distribution_for(GPTCausalLM, layout, mesh, config=config)
    report = parity.check_parity(
        lambda: build_lm(config), compile_sgd, distribution, *_data(), steps=STEPS, reference=scanned_reference
    )
    assert report.passed, "\n".join(report.format())
    if layout == "context":  # each block's weights split over seq on a block's own dimension, never on L
        kernel = distribution.get_variable_layout(build_lm(config).backbone.pipelined_blocks.stacked["mlp/up/kernel"])
        assert tuple(kernel.axes) == (None, None, "seq", None)  # (1, L, C/seq, F)


def _step_comms(layout, mesh, scan):
    """The ``CommsReport`` of one compiled fit step of the tiny GPT, scanned or as layers."""
    tokens, targets = _data()
    config = SCANNED | dict(scan_layers=scan) | layout_overrides(layout)
    distribution = distribution_for(GPTCausalLM, layout, mesh, config=config)
    with distribution.scope():
        keras.utils.set_random_seed(0)
        model = build_lm(config)
        compile_sgd(model)
        return train_step_comms_report(model, tokens[:BATCH], targets[:BATCH], mesh=make_mesh(mesh))


def test_a_scanned_tp_step_splits_the_blocks_as_the_layers_do():
    """Under tp the stacked weights are split over model as the layers' (the same bytes per
    device), the loop keeps each block's slice split (no weight gathered over model: the
    matmuls run Megatron's split, its activations all-reduced over model), and it sends at
    most 1.7x the layers' bytes over model: GSPMD all-reduces the q, k, v (and gate, up)
    projections' input gradients one by one where the layers' shard_map sums them first."""
    layers, scanned = (_step_comms("tp", "data=2,model=4", scan) for scan in (False, True))
    assert scanned.memory.argument_bytes == pytest.approx(layers.memory.argument_bytes, rel=0.01)
    assert scanned.count("all-gather", "model") == 0
    assert scanned.count("all-reduce", "model") >= 2 * LAYERS  # each block's attention and MLP outputs
    assert scanned.sent_bytes(axes="model") <= 1.7 * layers.sent_bytes(axes="model")


@pytest.mark.parametrize(
    "layout, mesh, axis, kind, ratio",
    [
        ("tp+sp", "data=2,model=4", "model", "reduce-scatter", 1.0),
        ("context", "data=2,seq=4", "seq", "collective-permute", 1.0),
    ],
)
def test_a_scanned_step_splits_the_tokens_as_the_layers_do(layout, mesh, axis, kind, ratio):
    """Where the tokens are split the loop runs the layers' own kernels: Megatron's
    sequence-parallel all-gathers and reduce-scatters over model (tp+sp: the same bytes
    over model as the layers'), the ring attention's K/V permutes over seq (context), as
    many as the layers' and the same bytes over that axis (within 1%: the context loop
    gathers each block's weights over seq)."""
    layers, scanned = (_step_comms(layout, mesh, scan) for scan in (False, True))
    assert scanned.count(kind, axis) == layers.count(kind, axis) > 0
    assert scanned.count("all-gather", axis) >= layers.count("all-gather", axis)
    assert (
        layers.sent_bytes(axes=axis) * 0.99
        <= scanned.sent_bytes(axes=axis)
        <= ratio * 1.01 * layers.sent_bytes(axes=axis)
    )


def test_a_scanned_fsdp_step_moves_no_more_bytes_than_the_layers():
    """Each block's weights are gathered inside the loop. Without that GSPMD splits the
    loop's matmuls on their contracting dimension and all-reduces activations (at
    Llama-3.2-1B dims: 84 GiB per step instead of 7)."""
    sent = {scan: _step_comms("fsdp", "data=8", scan).sent_bytes() for scan in (False, True)}
    assert sent[True] <= sent[False], sent


def test_either_form_saved_as_keras_loads_and_converts_to_the_other(tmp_path):
    tokens = _data()[0][:BATCH]
    keras.utils.set_random_seed(3)
    layers = build_lm(SCANNED | dict(scan_layers=False))
    layers.save(tmp_path / "layers.keras")
    scanned = keras.saving.load_model(tmp_path / "layers.keras").with_block_form(scan_layers=True)
    assert scanned.backbone.scan_layers and scanned.backbone.stacked
    scanned.save(tmp_path / "scanned.keras")
    loaded = keras.saving.load_model(tmp_path / "scanned.keras")
    assert loaded.backbone.scan_layers  # saved as scanned, loads as scanned
    back = loaded.with_block_form(scan_layers=False)
    expected = layers.predict(tokens, batch_size=BATCH, verbose=0)
    np.testing.assert_allclose(loaded.predict(tokens, batch_size=BATCH, verbose=0), expected, rtol=1e-5, atol=1e-6)
    for before, after in zip(layers.weights, back.weights):  # the round trip is exact
        assert before.path == after.path
        np.testing.assert_array_equal(np.asarray(before.value), np.asarray(after.value))
    # KV-cache decoding runs the scanned blocks one by one: the layers' greedy tokens
    np.testing.assert_array_equal(loaded.generate(tokens[:2, :4], 3), layers.generate(tokens[:2, :4], 3))


def test_scan_layers_names_what_it_cannot_do():
    with pytest.raises(ValueError, match=r"schedule='gpipe' and scan_layers=True"):
        GPTBackbone(**SCANNED, schedule="gpipe")
    with pytest.raises(ValueError, match=r"stacks identical blocks: MoE in 1 of its 2 blocks \(moe_layers\) cannot"):
        GPTBackbone(**SCANNED, num_experts=4, moe_layers=[1])
    with pytest.raises(ValueError, match=r"megatron_sp=True and context_attention=None must be False and None"):
        GPTBackbone(**(SCANNED | dict(scan_layers=False)), schedule="gpipe", megatron_sp=True)  # a pipeline's blocks
    with pytest.raises(
        SettingError,
        match=r"scan_layers \(--scan-layers\) runs the stacked blocks under layouts single, data, fsdp, tp, tp\+sp, "
        r"fsdp\+tp, context, expert, fsdp\+expert, expert\+tp, not 'pipeline'",
    ):
        GPTTrainSettings(scan_layers=True, layout="pipeline")
    with pytest.raises(ValueError, match=r"holds its blocks stacked \(scan_layers=True\)"):
        GPTBackbone(**SCANNED).empty_caches(1, 4)
