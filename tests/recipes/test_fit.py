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
(JAX 0.12's does, 0.10's does not: ``memory_analysis_reflects_remat``), with XLA's own
scheduler: so the probe is asked (``tests/_remat.py``) and the fits compiled
(``_fit_worker``) in fresh processes without the suite's XLA flags. Where the probe says no, the file skips, saying so
(the two recipes without remat alone would repeat what the newest JAX checks), and
``.ci/run`` runs it on Python 3.12 with the newest JAX.
"""

import dataclasses
import functools
import json
import os
import subprocess
import sys

import jax
import pytest

from tests._remat import remat_shows_in_memory_analysis
from tests.recipes._recipes import RECIPES, ROOT, ids
from zoo.training.recipes import load_recipe
from zoo.training.recipes._compile import RecipeFit, RecipeStep, compile_recipe_step

GPT = sorted(path for path in RECIPES.glob("*/pretrain_gpt.toml") if not path.parent.name.startswith("cpu"))


@functools.cache
def _fits():
    """``{path: RecipeFit}`` of every recipe in ``GPT``, from ``_fit_worker``."""
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
    command = [sys.executable, "-m", "tests.recipes._fit_worker", *map(str, GPT)]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    fits = {}
    for values in json.loads(done.stdout.splitlines()[-1]):
        steps = tuple(RecipeStep(values["path"], None, 0, n, memory=None) for n in values.pop("steps"))
        fits[values["path"]] = RecipeFit(**values, steps=steps)
    return fits


def fit_of(path):
    if not remat_shows_in_memory_analysis():
        pytest.skip(
            "this JAX's XLA:CPU memory analysis does not reflect jax.checkpoint (JAX 0.10), which the remat recipes "
            "need; .ci/run runs this file on Python 3.12 with JAX 0.12 (docs/compatibility.md)"
        )
    return _fits()[str(path)]


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


def test_a_step_compiles_on_the_devices_it_is_given():
    """``devices`` may list the devices to compile on (a TPU topology's compile without the
    chips: recipes/tpu-v5e-8/tpu_compile.py): the mesh is laid over them, in their order,
    and the step is the one compiled on this process' devices."""
    recipe = load_recipe(RECIPES / "cpu-sim-8" / "pretrain_gpt.toml")  # gpt_tiny on data=8
    given = list(reversed(jax.devices()))
    step = compile_recipe_step(recipe, num_layers=1, devices=given)
    meshes = [s.mesh for s in jax.tree.leaves(step.compiled.input_shardings) if hasattr(s, "mesh")]
    assert meshes and all(list(mesh.devices.flat) == given for mesh in meshes)
    assert step.memory == compile_recipe_step(recipe, num_layers=1).memory  # this process' devices, in order
