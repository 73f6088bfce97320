"""Packing (issue 29 item 2): several examples per row with segment ids.

The data side (numpy, no compile): ``pack_examples`` places each example whole, with its
own labels and loss weights, into as few rows as best-fit decreasing finds, and says the
padding; ``pack_texts(segments=True)`` keeps documents apart in its windows and drops the
label across each boundary. The model side, on the tiny Llama fixture (V 320, C 32, 2
blocks, T = 16): the logits of a packed row equal each example's alone (one device), and
one SGD step on the packed rows computes the loss and the gradients (the updated weights)
of the step on one example a row, under one device, ``context`` (ring, zigzag: the ids
reordered with the tokens), ``tp`` and ``pipeline`` (the fixture loaded into stacked
blocks); tier 1 runs the context case, tier 2 the others.
"""

import contextlib
import pathlib

import keras
import numpy as np
import pytest

from zoo import distribution as zd
from zoo.data import LMExamples, pack_examples, padding_fraction
from zoo.data.packing import example_lengths
from zoo.data.text_files import pack_ids
from zoo.distribution.parity import compare
from zoo.models import GPTCausalLM
from zoo.training.lm_finetune import causal_lm_config, compile_causal_lm, heldout_loss, load_causal_lm, token_batches

FIXTURE = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "hf" / "llama_mha_tied"
LENGTH, VOCABULARY, LEARNING_RATE = 16, 320, 1.0
LENGTHS = (9, 7, 6, 5, 4)  # best-fit decreasing in rows of 16: [9, 7] and [6, 5, 4]
LAYOUTS = {
    "single": (None, {}),
    "context": ("data=2,seq=4", {"context_attention": "ring", "balance": "zigzag"}),
    "tp": ("data=2,model=4", {}),
    "pipeline": ("data=4,stage=2", {}),  # 2 stages of the fixture's 2 blocks, GPipe
}


def _examples(lengths, seed=0):
    """One example a row: random tokens, labels the next ones, the loss on the second half."""
    rng = np.random.default_rng(seed)
    shape = (len(lengths), LENGTH)
    token_ids, labels, weight = np.zeros(shape, np.int32), np.zeros(shape, np.int32), np.zeros(shape, np.float32)
    for row, length in enumerate(lengths):
        tokens = rng.integers(1, VOCABULARY, length + 1)
        token_ids[row, :length], labels[row, :length] = tokens[:-1], tokens[1:]
        weight[row, length // 2 : length] = 1.0
    return LMExamples(token_ids, labels, weight)


# --- the data side ---------------------------------------------------------------------


def test_pack_examples_places_each_example_whole_with_its_own_loss():
    examples = _examples(LENGTHS)
    packed = pack_examples(examples)
    assert packed.segment_ids.tolist()[0] == [1] * 9 + [2] * 7
    assert packed.segment_ids.tolist()[1] == [1] * 6 + [2] * 5 + [3] * 4 + [0]
    placed = {0: (0, 0), 1: (0, 9), 2: (1, 0), 3: (1, 6), 4: (1, 11)}  # example -> (row, start)
    for index, (row, start) in placed.items():
        length = LENGTHS[index]
        for packed_array, array in zip(packed.arrays(), examples.arrays()):
            np.testing.assert_array_equal(packed_array[row, start : start + length], array[index, :length])
    assert packed.loss_tokens == examples.loss_tokens
    assert example_lengths(packed).tolist() == [16, 15]
    assert padding_fraction(examples) == pytest.approx(1 - 31 / 80) and padding_fraction(packed) == 1 / 32
    assert packed[1:].segment_ids.shape == (1, LENGTH) and packed.padded_to(4).segment_ids[2:].max() == 0
    assert set(packed.inputs()) == {"token_ids", "segment_ids"} and examples.inputs() is examples.token_ids
    with pytest.raises(ValueError, match="packed already"):
        pack_examples(packed)


def test_pack_texts_with_segments_drops_the_label_across_each_document():
    from zoo.data.text_files import _with_document_ids

    stream = np.arange(1, 12, dtype=np.int32)  # documents of 4, 5 and 2 tokens in windows of 4
    document = np.repeat([1, 2, 3], [4, 5, 2])
    windows = _with_document_ids(pack_ids(stream, 4), document)
    assert windows.segment_ids.tolist() == [[1, 1, 1, 1], [1, 1, 1, 1], [1, 2, 2, 0]]
    # the last token of a document does not predict the next document's first
    assert windows.sample_weight.tolist() == [[1, 1, 1, 0], [1, 1, 1, 1], [0, 1, 0, 0]]
    assert windows.labels[0].tolist() == [2, 3, 4, 5] and windows.labels[2].tolist() == [10, 11, 0, 0]


# --- the model side --------------------------------------------------------------------


def _model(layout):
    """(model, distribution): the fixture under ``layout``, compiled with SGD, full weights."""
    mesh, options = LAYOUTS[layout]
    distribution = None
    if mesh is not None:
        distribution = zd.distribution_for(
            GPTCausalLM, layout, mesh, config=causal_lm_config(FIXTURE, layout), **options
        )
    model = zd.build_distributed(lambda: load_causal_lm(FIXTURE, layout), distribution)
    compile_causal_lm(model, keras.optimizers.SGD(LEARNING_RATE))
    return model, distribution


def _one_step(layout, examples):
    """(loss, weights after, largest change of a weight) of one SGD step on all of
    ``examples`` as one batch."""
    model, distribution = _model(layout)
    before = {variable.path: np.asarray(variable.value) for variable in model.trainable_weights}
    with distribution.scope() if distribution is not None else contextlib.nullcontext():
        batch = token_batches(examples, batch_size=len(examples), distribution=distribution)[0]
        loss = float(model.train_on_batch(*batch[:2], sample_weight=batch[2]))
    weights = {variable.path: np.asarray(variable.value) for variable in model.trainable_weights}
    keras.distribution.set_distribution(None)
    return loss, weights, max(np.abs(weights[path] - before[path]).max() for path in before)


def test_a_packed_row_gives_each_example_its_logits_alone():
    model, _ = _model("single")
    examples = _examples(LENGTHS)
    packed = pack_examples(examples)
    logits = np.asarray(model(packed.inputs()))  # (2, T, V)
    alone = np.asarray(model(examples.token_ids))  # (5, T, V)
    for index, (row, start) in {0: (0, 0), 1: (0, 9), 2: (1, 0), 3: (1, 6), 4: (1, 11)}.items():
        length = LENGTHS[index]
        np.testing.assert_allclose(logits[row, start : start + length], alone[index, :length], atol=2e-5)
    assert heldout_loss(model, packed, batch_size=2) == pytest.approx(
        heldout_loss(model, examples, batch_size=5), rel=1e-6
    )
    unmasked = np.asarray(model(packed.token_ids))  # the same row, documents not told apart
    assert np.abs(unmasked[0, 9:16] - alone[1, :7]).max() > 1e-2


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_a_step_on_packed_rows_computes_the_step_on_one_example_a_row(layout):
    rows = 4 if layout == "pipeline" else 2  # what the data axis divides
    examples = _examples(LENGTHS * (rows // 2))
    packed = pack_examples(examples)  # 2 (4) rows
    assert len(packed) == rows
    loss, weights, moved = _one_step(layout, examples.padded_to(rows))  # 6 (12) rows, some of weight 0
    packed_loss, packed_weights, _ = _one_step(layout, packed)
    assert packed_loss == pytest.approx(loss, rel=1e-5) and moved > 1e-2
    result = compare(weights, packed_weights, rtol=1e-4, atol=1e-6)
    assert result.within_tolerance, result
