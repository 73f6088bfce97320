"""The pipelined GPT (layout ``pipeline``) trains to the single-device numbers.

8 simulated devices; the tiny GPT of ``_gpt_parity`` with 8 blocks (one
``PipelinedBlocks``: the blocks run in a ``lax.scan``, so 8 compile as fast as 1),
batch 12, T = 16, 3 SGD-with-momentum steps with dropout on. Each run is compared by
``zoo.distribution.parity.check_parity`` with the one-device run of the same model
(losses per step, first-batch gradients, outputs after training, final weights): GPipe
with M = 3 micro-batches (fewer than 4 stages, and not a multiple of 2) and the circular
schedule with R = 2 repeats and M = 6 (not a multiple of 4), on S = 2 and 4 stages, with
and without ``data`` and ``model`` (tensor parallelism inside each stage) axes.
"""

import keras
import numpy as np
import pytest

from tests.models._gpt_parity import CONFIG, LENGTH, STEPS, build_lm, compile_sgd, language_data
from zoo.distribution import distribution_for, parity
from zoo.models.gpt import GPTBackbone, GPTCausalLM

BATCH = 12  # M = 3 and M = 6 divide it, and each micro-batch's rows divide over data=2
LAYERS = 8  # S * R = 4 and 8 divide it
SCHEDULES = {"gpipe": dict(schedule="gpipe", micro_batches=3, repeats=1), "circular": dict(schedule="circular", micro_batches=6, repeats=2)}


def pipelined_config(schedule):
    return CONFIG | dict(num_layers=LAYERS) | SCHEDULES[schedule]


def _data():
    return language_data(count=STEPS * BATCH)


@pytest.fixture(scope="module", params=list(SCHEDULES))
def reference(request):
    """(schedule, the one-device run of its pipelined model)."""
    config = pipelined_config(request.param)
    run = parity.reference_run(lambda: build_lm(config), compile_sgd, *_data(), steps=STEPS, batch_size=BATCH)
    return request.param, run


@pytest.mark.parametrize("mesh", ["data=2,stage=4", "data=2,stage=2,model=2", "stage=2,model=4"])
def test_three_steps_of_fit_match_one_device(mesh, reference):
    schedule, run = reference
    config = pipelined_config(schedule)
    distribution = distribution_for(GPTCausalLM, "pipeline", mesh, config=config)
    report = parity.check_parity(lambda: build_lm(config), compile_sgd, distribution, *_data(), steps=STEPS, reference=run)
    assert report.passed, "\n".join(report.format())
    assert report.reference_losses[2] < report.reference_losses[0]  # not vacuous: it trained
