"""Every GPU/TPU GPT recipe's training step fits its target's memory, compiled (never run).

Each recipe's model is built abstractly with its own precision, remat, accumulation and
layout, and Keras' ``train_step`` is compiled at 1 and 2 blocks of full width for the
recipe's per-device shapes (``zoo.training.recipes._compile``): the difference is one
block's cost, which must stay within the per-block budget the target's memory leaves
once the rest (embedding, head, logits, optimizer scalars) is paid. Recipes for more
devices than the test has (32 and 64) compile a tensor-parallel mesh with a smaller
data axis and batch: the same per-device shapes. The full-depth steps are in
``zoo bench scale`` (docs/performance.md).

Recipes with remat need an XLA:CPU whose memory analysis reflects ``jax.checkpoint``
(JAX 0.12's does, 0.10's does not: ``memory_analysis_reflects_remat``); elsewhere the
file skips, saying so (the two recipes without remat alone would repeat what the newest
JAX checks), and ``.ci/run`` runs it on Python 3.12 with the newest JAX.
"""

import dataclasses
import functools

import pytest

from tests.recipes._recipes import RECIPES, ids
from zoo.measure.comms_report import FAST_COMPILE
from zoo.measure.compiled_step import memory_analysis_reflects_remat
from zoo.training.recipes import load_recipe
from zoo.training.recipes._compile import compile_recipe_step, recipe_fit

GPT = sorted(path for path in RECIPES.glob("*/pretrain_gpt.toml") if not path.parent.name.startswith("cpu"))


@pytest.fixture(autouse=True)
def _newest_xla():
    if not memory_analysis_reflects_remat():
        pytest.skip(
            "this JAX's XLA:CPU memory analysis does not reflect jax.checkpoint (JAX 0.10), which the remat recipes need; .ci/run runs this file on Python 3.12 with JAX 0.12 (docs/compatibility.md)"
        )


@functools.cache
def fit_of(path):
    return recipe_fit(load_recipe(path), num_layers=2, compiler_options=FAST_COMPILE)


@pytest.mark.parametrize("path", GPT, ids=ids(GPT))
def test_recipe_step_fits_its_target(path):
    fit = fit_of(path)
    assert fit.fits, fit.format()
    one, two = fit.steps
    assert (one.num_layers, two.num_layers) == (1, 2)
    assert fit.per_block > 0 and fit.fixed > 0  # a block costs something; so does the rest


def test_a_step_that_cannot_fit_is_reported():
    """The same check fails, naming the numbers, when the target's memory is too small."""
    fit = dataclasses.replace(fit_of(RECIPES / "gpu-8" / "pretrain_gpt.toml"), target_bytes=4 * 2**30)
    assert not fit.fits
    assert "DOES NOT FIT" in fit.format() and "of 4 GiB at 22 blocks" in fit.format()


def test_a_recipe_needing_all_its_devices_is_refused_on_fewer():
    with pytest.raises(ValueError, match=r"layout 'fsdp' on mesh data=8 needs its 8 devices .* this process has 4"):
        compile_recipe_step(load_recipe(RECIPES / "gpu-8" / "pretrain_gpt.toml"), num_layers=1, devices=4)
