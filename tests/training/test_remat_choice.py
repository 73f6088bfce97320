"""``--remat auto`` (``zoo.training.remat_choice``): the fastest policy whose compiled step
fits, tried on the job's one built model (``GPTBackbone.set_remat``).

gpt_tiny at 1 block, T = 32: a choice compiles the same few programs again, which the
session's compilation cache serves."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from zoo.config.settings import GPTTrainSettings
from zoo.data.text_files import LMExamples
from zoo.training.gpt import build_for_training, compile_gpt
from zoo.training.lm_finetune import compile_causal_lm, make_optimizer, prepare_causal_lm, token_batches
from zoo.training.remat_choice import choose_remat, resolve_remat

BATCH = ((2, 32), "int32")


def _model(remat="none", scan_layers=False):
    settings = GPTTrainSettings(
        config_name="gpt_tiny", num_layers=1, layout="single", batch_size=2, sequence_length=32, remat=remat,
        scan_layers=scan_layers,
    )  # fmt: skip
    model = build_for_training(settings)
    compile_gpt(model, 1e-3, 10)
    return model


def _saved_bytes(backbone):
    """Bytes the training forward hands to its backward beyond the weights (shapes only)."""
    weights = [v.value for v in backbone.trainable_variables]
    others = [v.value for v in backbone.non_trainable_variables]

    def forward(w, tokens):
        return backbone.stateless_call(w, others, tokens, training=True)[0]

    tokens = jax.ShapeDtypeStruct(BATCH[0], jnp.int32)
    backward = jax.eval_shape(lambda w, t: jax.vjp(lambda w: forward(w, t), w)[1], weights, tokens)
    saved = sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree_util.tree_leaves(backward))
    return saved - sum(w.size * w.dtype.itemsize for w in weights)


@pytest.mark.parametrize("scan_layers", [False, True], ids=["blocks", "scanned"])
def test_set_remat_saves_what_a_model_built_with_that_policy_saves(scan_layers):
    model = _model("none", scan_layers)
    none = _saved_bytes(model.backbone)
    model.backbone.set_remat("full")
    assert _saved_bytes(model.backbone) == _saved_bytes(_model("full", scan_layers).backbone) < none
    assert model.backbone.get_config()["remat"] == "full"  # saved as set
    model.backbone.set_remat("none")
    assert _saved_bytes(model.backbone) == none
    with pytest.raises(ValueError, match="remat must be one of .* got 'auto'"):
        model.backbone.set_remat("auto")


def test_auto_keeps_the_first_policy_whose_compiled_step_fits():
    """With room for everything, none; with 1 byte less than none's step, the next policy
    whose step is smaller (save_attention, on JAX 0.10 and 0.12 alike); with room for none
    of them, full, and the line says nothing fitted. On CPU with no limit: none, uncompiled."""
    model = _model()
    roomy = choose_remat(model, BATCH, BATCH, memory_limit=1 << 40)
    assert (roomy.remat, list(roomy.peaks)) == ("none", ["none"])
    tight = choose_remat(model, BATCH, BATCH, memory_limit=roomy.peaks["none"] - 1)
    assert (tight.remat, list(tight.peaks)) == ("save_attention", ["none", "save_attention"])
    assert tight.peaks["save_attention"] < roomy.peaks["none"]
    assert tight.why.startswith("the fastest whose step fits ") and "compiled: none " in tight.why
    assert model.backbone.remat == "save_attention" and model.backbone.blocks[0].remat == "save_attention"
    full = choose_remat(model, BATCH, BATCH, memory_limit=1)
    assert (full.remat, list(full.peaks)) == ("full", ["none", "save_attention", "dots_saveable", "full"])
    assert full.why.startswith("no policy's step fits 1 B of this cpu")
    here = choose_remat(model, BATCH, BATCH)
    assert (here.remat, here.peaks) == ("none", {})
    assert model.backbone.remat == "none"


def test_a_packed_lora_batch_is_compiled_as_fit_gets_it():
    """zoo finetune's probe: the step of a LoRA model on packed rows (inputs a dict with
    segment ids, labels, sample weights: one batch of ``token_batches``) compiles under a
    limit, and the model keeps the choice; the same batch then trains under it."""
    model = _model()
    prepare_causal_lm(model, "lora", lora_rank=2)
    compile_causal_lm(model, make_optimizer("adam", method="lora"), loss_chunk_size=None)
    rows = np.arange(4 * 32, dtype="int32").reshape(4, 32) % 256
    segments = np.repeat(np.array([[1] * 20 + [2] * 12]), 4, axis=0).astype("int32")
    examples = LMExamples(rows, (rows + 1) % 256, np.ones((4, 32), "float32"), segments)
    batches = token_batches(examples, batch_size=2)
    inputs, labels, weights = batches[0]
    assert set(inputs) == {"token_ids", "segment_ids"}
    lines = []
    remat = resolve_remat(model, "auto", inputs, labels, weights, report=lines.append, memory_limit=1 << 40)
    assert remat == "none" and model.backbone.remat == "none"
    assert lines[0].startswith("remat none (--remat auto: the fastest whose step fits 1024.00 GiB of this cpu")
    assert np.isfinite(model.fit(batches, epochs=1, verbose=0).history["loss"][-1])
