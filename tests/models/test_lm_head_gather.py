"""Under ``fsdp`` the LM head gathers its weight or the global batch's activations,
whichever is smaller (``zoo/layers/lm_head_gather.py``), and trains to the one-device numbers.

One untied 1-block model (C=32, V=256, T=16) on the 8 simulated devices: at a global
batch of 8, B x T = 128 < V and the head gathers the activations; at 32, 512 > V and it
gathers its (C, V) kernel. The compiled ``fit`` step's collectives (read by
``zoo.measure.comms_report``) show which; compile-only, nothing allocated. The tied
head with the activations under ``fit``: tests/models/test_gpt_parity.py [fsdp-data=8];
both parity runs are tier 2 (tests/_tiers.py: 12-14 s of compiling each).
"""

import keras
import pytest

from tests.models._gpt_parity import build_lm, compile_sgd, language_data, layout_distribution, model_config
from zoo.distribution import parity
from zoo.distribution.axes import DATA
from zoo.measure.comms_report import compiled_report
from zoo.measure.compiled_step import abstract_build, compile_fit_step
from zoo.models.gpt import GPTBackbone, GPTCausalLM

LENGTH, VOCABULARY, WIDTH = 16, 256, 32
CONFIG = dict(
    vocabulary_size=VOCABULARY, num_layers=1, num_query_heads=4, num_key_value_heads=2, hidden_dim=WIDTH,
    intermediate_dim=64, mlp="swiglu", norm="rms", max_sequence_length=LENGTH, tie_word_embeddings=False,
)  # fmt: skip


@pytest.fixture(scope="module")
def fsdp_model():
    """The untied model built abstractly under fsdp on data=8, with its distribution."""
    distribution = layout_distribution("fsdp", "data=8", CONFIG)
    model = abstract_build(lambda: GPTCausalLM(backbone=GPTBackbone(**CONFIG)), compile_sgd, distribution)
    return model, distribution


def _gathers(report, shape):
    """All-gathers over data whose result is ``shape`` (any float dtype)."""
    dims = "[" + ",".join(map(str, shape)) + "]"
    return [op for op in report.select("all-gather", DATA) if op.shape.endswith(dims) and op.shape[0] in "fb"]


@pytest.mark.parametrize("batch, choice", [(8, "activations"), (32, "table")])
def test_the_compiled_step_gathers_what_the_sizes_choose(fsdp_model, batch, choice):
    model, distribution = fsdp_model
    keras.distribution.set_distribution(distribution)
    try:
        gather = model.lm_head_gather(batch, LENGTH)
    finally:
        keras.distribution.set_distribution(None)
    assert (gather.choice, gather.axis, gather.axis_size) == (choice, DATA, 8)
    assert (gather.activation_elements, gather.table_elements) == (batch * LENGTH * WIDTH, VOCABULARY * WIDTH)
    assert f"gathers the {choice} over data (8)" in gather.describe()
    tokens = ((batch, LENGTH), "int32")
    compiled, _ = compile_fit_step(model, distribution, tokens, tokens)
    report = compiled_report(compiled, distribution.device_mesh)
    kernel = _gathers(report, (WIDTH, VOCABULARY))  # the (C, V) head kernel, whole
    activations = _gathers(report, (batch, LENGTH, WIDTH))  # the global batch's (B, T, C)
    if choice == "table":
        assert len(kernel) == 1, report.format()
    else:
        assert not kernel and activations, report.format()
    assert model.lm_head_gather(batch, LENGTH).choice is None  # no distribution: nothing to choose


def test_fit_gathering_the_table_matches_one_device():
    """The untied head split on V, gathering its kernel (B x T = 512 > V): 2 steps of
    fit, losses, gradients, outputs and weights as on one device."""
    config = model_config("fsdp", num_layers=1, tie_word_embeddings=False)
    report = parity.check_parity(
        lambda: build_lm(config),
        compile_sgd,
        layout_distribution("fsdp", "data=8", config),
        *language_data(count=64),
        steps=2,
        batch_size=32,
    )
    assert report.passed, "\n".join(report.format())
