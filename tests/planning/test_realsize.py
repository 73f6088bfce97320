"""The planner at real size (``pytest -m realsize tests/planning``; minutes of compiling, so
not in the default run; ``zoo bench plan`` prints the same figures as tables).

- Three scenarios where plain data parallelism does not fit 8 devices: gpt_1b on
  8 x 16 GiB; gpt_1b at T = 32,768 on 8 x H100; gpt_350m with a batch of 1,024 on
  8 x H100. The planner's choice fits once compiled, data=8 alone does not, and the
  choice (layout, mesh, remat, gradient accumulation) trains to the single-device
  numbers at reduced size (the parity model: one block, T=16).
- Extrapolation per block: gpt_small (4 blocks) and the gpu-8 gpt_1b recipe (22), the
  plan's peak (1 and 2 blocks, extrapolated) within 5% of the whole step compiled; gemma3_1b
  from 6 and 12 blocks (whole periods of its local/global pattern) within 1%; under
  remat (the tpu-v5e-8 recipe) depth auto compiles the whole model.
- gpt_1b at 64 and 256 simulated devices compiles and fits (fsdp, remat full, H100).
"""

import dataclasses

import keras
import pytest

from tests._remat import remat_shows_in_memory_analysis
from tests.models._gpt_parity import (
    STEPS,
    TRAIN_LAYERS,
    build_lm,
    language_data,
    layout_distribution,
    model_config,
)
from zoo.distribution import parity
from zoo.planning import PlanRequest, make_plan
from zoo.planning.plan import plan_in_process, plans_in_subprocess
from zoo.planning.recipes import request_from_recipe
from zoo.planning.search import _rank_key, search
from zoo.training.recipes import load_recipe

pytestmark = pytest.mark.realsize

BASE = dict(layout="data", mesh="data=8", precision="mixed_bfloat16", remat="none", gradient_accumulation_steps=1)
SCENARIOS = {
    "gpt_1b on 8 x 16 GiB": (dict(config_name="gpt_1b", batch_size=32, sequence_length=2048), "tpu-v5e"),
    "gpt_1b at T=32k": (dict(config_name="gpt_1b", batch_size=8, sequence_length=32768), "h100"),
    "gpt_350m batch 1024": (dict(config_name="gpt_350m", batch_size=1024, sequence_length=1024), "h100"),
}


def _request(name):
    settings, device = SCENARIOS[name]
    return PlanRequest("pretrain_gpt", {**BASE, **settings}, devices=8, device=device, label=name)


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_the_planner_fits_what_data_parallelism_does_not_and_its_choice_trains(name):
    request = _request(name)
    assert not make_plan(request).fits  # the premise: data=8 alone, compiled
    ranking = search(request, top=2)
    best = ranking.best
    assert best.fits, ranking.why_none()
    order = {row.candidate: i for i, row in enumerate(ranking.rows)}
    assert [_rank_key(row, order) for row in ranking.rows] == sorted(_rank_key(row, order) for row in ranking.rows)
    _check_trains_like_one_device(best.candidate)


def _check_trains_like_one_device(choice):
    config = model_config(choice.layout, num_layers=TRAIN_LAYERS, remat=choice.remat)
    strategy = "context-ring" if choice.layout == "context" else choice.layout
    distribution = layout_distribution(strategy, choice.mesh, config)
    accumulation = choice.accumulation if choice.accumulation > 1 else None

    def compile_model(model):
        model.compile(
            optimizer=keras.optimizers.SGD(learning_rate=0.5, momentum=0.9, gradient_accumulation_steps=accumulation),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )

    report = parity.check_parity(
        lambda: build_lm(config), compile_model, distribution, *language_data(), steps=STEPS, batch_size=8
    )
    assert report.passed, "\n".join(report.format())


def test_extrapolated_plan_matches_the_whole_model_compiled():
    """gpt_small (4 blocks) compiled at 1 and 2 blocks and extrapolated vs compiled whole:
    peak, FLOPs and bytes sent per axis within 5%."""
    small = dict(
        config_name="gpt_small",
        layout="tp",
        mesh="data=2,model=4",
        batch_size=8,
        sequence_length=32,
        precision="float32",
        remat="none",
    )
    request = PlanRequest("pretrain_gpt", small, devices=8, device="h100")
    whole = plan_in_process(dataclasses.replace(request, depth="full"))
    extrapolated = plan_in_process(dataclasses.replace(request, depth=2))
    assert whole.compiled_depths == (4,) and extrapolated.compiled_depths == (1, 2)
    assert extrapolated.peak == pytest.approx(whole.peak, rel=0.05)
    assert extrapolated.step.flops == pytest.approx(whole.step.flops, rel=0.05)
    sent, expected = extrapolated.sent_per_axis(), whole.sent_per_axis()
    assert sent.keys() == expected.keys() and all(sent[k] == pytest.approx(expected[k], rel=0.05) for k in expected)


def _plans_at_depths(request, depths):
    """The plans of ``request`` at each of ``depths``, compiled as ``zoo plan`` compiles them:
    in a fresh process with XLA's own flags. In this process the suite's fast-compile flags
    (tests/conftest.py) change the peak: the gpu-8 recipe planned 26.17 GiB at depth auto
    against 29.15 whole under them, 33.99 against 34.05 (JAX 0.12) with XLA's own."""
    return plans_in_subprocess([dataclasses.replace(request, depth=depth) for depth in depths])


def test_the_gpu8_recipe_plan_is_within_5_percent_of_the_whole_step():
    request = request_from_recipe(load_recipe("recipes/gpu-8/pretrain_gpt.toml"))
    whole, extrapolated = _plans_at_depths(request, ("full", "auto"))
    assert extrapolated.compiled_depths == (1, 2) and whole.compiled_depths == (22,)
    assert extrapolated.peak == pytest.approx(whole.peak, rel=0.05)


def test_gemma3_1b_extrapolated_from_whole_periods_matches_the_whole_model():
    """gemma3_1b past its window (T = 2,048, W = 512; 22 local and 4 global blocks) on 8 x
    H100: compiled at 6 and 12 blocks (whole periods of its 5:1 pattern) and extrapolated,
    against the 26 blocks compiled whole: peak and FLOPs within 1% (measured: 33.00 GiB
    both, FLOPs +0.12%; 1 and 2 blocks, both local, under-counted the FLOPs by 1.4%)."""
    gemma = dict(BASE, config_name="gemma3_1b", batch_size=8, sequence_length=2048)
    request = PlanRequest("pretrain_gpt", gemma, devices=8, device="h100")
    whole, extrapolated = _plans_at_depths(request, ("full", "auto"))
    assert extrapolated.compiled_depths == (6, 12) and whole.compiled_depths == (26,)
    assert extrapolated.peak == pytest.approx(whole.peak, rel=0.01)
    assert extrapolated.step.flops == pytest.approx(whole.step.flops, rel=0.01)


def test_a_remat_recipe_is_planned_whole_under_depth_auto():
    """With remat the whole model's temporaries grow faster than per block: the tpu-v5e-8
    recipe (gpt_1b, fsdp, remat) extrapolated from 1 and 2 blocks was 10.52 GiB against
    12.56 compiled whole (-16%), so depth auto compiles it whole (JAX 0.12; on JAX 0.10
    remat is corrected from two depths instead)."""
    if not remat_shows_in_memory_analysis():
        pytest.skip("this JAX's CPU memory analysis does not show remat: the plan corrects two depths")
    request = request_from_recipe(load_recipe("recipes/tpu-v5e-8/pretrain_gpt.toml"))
    auto, quick = _plans_at_depths(request, ("auto", 2))
    assert auto.compiled_depths == (22,) and quick.compiled_depths == (1, 2)
    assert quick.peak < 0.9 * auto.peak  # what extrapolating missed
    assert any("under-counts" in note for note in auto.notes + quick.notes)


@pytest.mark.parametrize("devices, mesh, batch", [(64, "data=64", 256), (256, "data=256", 1024)])
def test_gpt_1b_plans_at_64_and_256_devices(devices, mesh, batch):
    config = {
        **BASE,
        "config_name": "gpt_1b",
        "layout": "fsdp",
        "mesh": mesh,
        "batch_size": batch,
        "sequence_length": 2048,
        "remat": "full",
    }
    (plan,) = plans_in_subprocess([PlanRequest("pretrain_gpt", config, devices=devices, device="h100")])
    assert plan.fits and plan.step.mesh == mesh and plan.step.batch_size == batch
