"""``zoo plan --auto``: the candidates, and a scenario where plain data parallelism does not
fit, scaled down so it compiles in seconds: gpt_tiny (T=64, batch 16) on 8 simulated
devices of 1.5 MiB. The planner's choice fits once compiled, and trains (3 fit steps with
dropout, one block) to the single-device numbers. The real-size scenarios (gpt_1b on
8 x 16 GiB, T=32k, gpt_350m at batch 1024) are in ``test_realsize.py``
(``pytest -m realsize``) and ``zoo bench plan``.
"""

import dataclasses
import math

import keras
import pytest

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
from zoo.planning.search import Candidate, Ranking, _rank_key, candidates, search

SCENARIO = dict(
    config_name="gpt_tiny",
    layout="data",
    mesh="data=8",
    batch_size=16,
    sequence_length=64,
    precision="float32",
    remat="none",
)
MEMORY_GIB = 1.5 / 1024  # 1.5 MiB per device: data=8 needs ~1.9 MiB (compiled)


def _request(**overrides):
    return PlanRequest(
        "pretrain_gpt",
        {**SCENARIO, **overrides},
        devices=8,
        device="cpu",
        device_memory_gib=MEMORY_GIB,
        label="gpt_tiny",
    )


def test_every_candidate_divides_the_devices_the_model_and_the_batch():
    request = _request(config_name="gpt_1b", batch_size=32, sequence_length=2048)
    found = candidates(request)
    assert len(found) == len(set(found)) > 100
    for c in found:
        sizes = dict((p.split("=")[0], int(p.split("=")[1])) for p in c.mesh.split(","))
        assert (
            math.prod(sizes.values()) == 8
            and c.micro_batch * c.accumulation == 32
            and c.micro_batch % sizes["data"] == 0
        )
        assert 32 % sizes.get("model", 1) == 0 and 2048 % sizes.get("seq", 1) == 0  # 32 heads, T
    assert {c.layout for c in found} == {"data", "fsdp", "tp", "tp+sp", "fsdp+tp", "context", "pipeline"}
    assert {c.remat for c in found} == {"none", "dots_saveable", "full"}


def test_a_resumed_run_keeps_its_batch_split_and_searches_the_rest():
    """``--layout auto --resume``: the checkpoint's position counts batches of its size,
    so only the layout, mesh and remat are searched (on whatever devices there are now)."""
    request = _request(config_name="gpt_1b", batch_size=16, gradient_accumulation_steps=2, sequence_length=2048)
    free, kept = candidates(request), candidates(request, keep_batch_split=True)
    assert {(c.micro_batch, c.accumulation) for c in kept} == {(16, 2)}
    assert {(c.micro_batch, c.accumulation) for c in free} > {(16, 2), (32, 1), (8, 4)}
    assert {c.layout for c in kept} == {c.layout for c in free} and {c.remat for c in kept} == {c.remat for c in free}
    assert set(kept) == {c for c in free if c.accumulation == 2}


@pytest.fixture(scope="module")
def ranking():
    return search(_request(), top=2)


def test_plain_data_parallelism_does_not_fit_the_scenario():
    assert not make_plan(_request()).fits


def test_the_planner_picks_a_layout_that_fits_and_ranks_deterministically(ranking):
    best = ranking.best
    assert best.fits and best.plan.peak <= MEMORY_GIB * 2**30
    assert best.candidate.micro_batch * best.candidate.accumulation == 16
    order = {row.candidate: i for i, row in enumerate(ranking.rows)}
    shuffled = sorted(ranking.rows, key=lambda row: -order[row.candidate])
    assert (
        sorted(shuffled, key=lambda row: _rank_key(row, order)) == ranking.rows
    )  # the order does not depend on input order
    keys = [_rank_key(row, order) for row in ranking.rows]
    assert keys == sorted(keys)  # fitting first, then time per update
    command = ranking.command()
    assert (
        command.startswith(f"zoo train gpt --config-name gpt_tiny --layout {best.candidate.layout}")
        and f"--remat {best.candidate.remat}" in command
    )


def test_the_top_choice_trains_like_one_device(ranking):
    """The chosen layout (strategy, mesh, remat, gradient accumulation) on the parity
    model at one block: 3 fit steps with dropout against one device."""
    choice = ranking.best.candidate
    config = model_config(choice.layout, num_layers=TRAIN_LAYERS, remat=choice.remat)
    distribution = layout_distribution(
        choice.layout if choice.layout != "context" else "context-ring", choice.mesh, config
    )

    def compile_model(model):
        model.compile(
            optimizer=keras.optimizers.SGD(
                learning_rate=0.5,
                momentum=0.9,
                gradient_accumulation_steps=choice.accumulation if choice.accumulation > 1 else None,
            ),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )

    report = parity.check_parity(
        lambda: build_lm(config), compile_model, distribution, *language_data(), steps=STEPS, batch_size=8
    )
    assert report.passed, "\n".join(report.format())
    assert report.reference_losses[-1] < report.reference_losses[0]


def test_when_nothing_fits_analytically_the_message_says_so():
    assert Ranking(_request(), [], 7, 0).why_none() == "none of 7 candidates fits 8 x cpu by the analytic model"


@pytest.mark.parametrize("resume", [False, True], ids=["fresh", "resumed"])
def test_zoo_train_gpt_strategy_auto_trains_the_first_row(ranking, monkeypatch, capsys, tmp_path, resume):
    """``zoo train gpt --layout auto`` on these 8 devices (taken as 1.5 MiB each): the
    planner is asked about this job on them, and the job is called with the first row
    (the planner's search is the fixture's, checked above; the job under each layout is
    tested elsewhere). With ``--resume`` the search keeps the batch split."""
    from zoo.cli import main as cli
    from zoo.measure import hardware
    from zoo.planning import search as planner
    from zoo.training import gpt

    asked, trained = [], []
    monkeypatch.setattr(planner, "search", lambda request, **kw: asked.append((request, kw)) or ranking)
    monkeypatch.setattr(hardware, "local_device", lambda: ("cpu", MEMORY_GIB))
    monkeypatch.setattr(gpt, "train", trained.append)
    code = cli.main(
        [
            "train",
            "gpt",
            "--config-name",
            "gpt_tiny",
            "--layout",
            "auto",
            "--sequence-length",
            "64",
            "--batch-size",
            "16",
            "--precision",
            "float32",
            *(["--checkpoint-dir", str(tmp_path), "--resume"] if resume else []),
        ]
    )
    out = capsys.readouterr().out
    (((request, options),), (config,)) = asked, trained
    assert options["keep_batch_split"] is resume  # a fresh run searches the batch split too
    assert (request.devices, request.device, request.device_memory_gib) == (8, "cpu", MEMORY_GIB)
    searched = ("layout", "mesh", "remat")  # remat auto, the default: the search picks each candidate's
    assert {k: request.config[k] for k in SCENARIO if k not in searched} == {
        k: v for k, v in SCENARIO.items() if k not in searched
    }
    assert request.config["remat"] == "auto"
    best = ranking.best.candidate
    assert code == 0 and (config.layout, config.mesh, config.remat) == (best.layout, best.mesh, best.remat)
    assert (config.batch_size, config.gradient_accumulation_steps) == (best.micro_batch, best.accumulation)
    assert f"layout auto: {best.describe()}" in out and f"| 1 | {best.layout} | {best.mesh} | {best.remat} |" in out


def test_pipeline_candidates_split_layers_and_batch_and_price_the_bubble():
    """Layout pipeline: meshes data=N/S,stage=S with S dividing the layers; M = S, 2S, 4S
    dividing the rows per data shard; circular (R=2) where 2S divides the layers. More
    stages hold less state; more micro-batches shrink the bubble; the command carries the
    pipeline's flags."""
    from zoo.planning.analytic import estimate

    request = _request(num_layers=8, batch_size=32)
    pipelined = [c for c in candidates(request) if c.layout == "pipeline" and c.accumulation == 1 and c.remat == "none"]
    assert {(c.mesh, c.micro_batches, c.repeats) for c in pipelined} == {
        ("data=4,stage=2", 2, 1),
        ("data=4,stage=2", 2, 2),
        ("data=4,stage=2", 4, 1),
        ("data=4,stage=2", 4, 2),
        ("data=4,stage=2", 8, 1),
        ("data=4,stage=2", 8, 2),
        ("data=2,stage=4", 4, 1),
        ("data=2,stage=4", 4, 2),
        ("data=2,stage=4", 8, 1),
        ("data=2,stage=4", 8, 2),
        ("data=2,stage=4", 16, 1),
        ("data=2,stage=4", 16, 2),
        ("data=1,stage=8", 8, 1),
        ("data=1,stage=8", 16, 1),
        ("data=1,stage=8", 32, 1),
    }
    by = {(c.mesh, c.micro_batches, c.repeats): c for c in pipelined}
    big = _request(config_name="gpt_350m", batch_size=32)  # 24 layers: the weights dominate
    two = estimate(Candidate("pipeline", "data=4,stage=2", "none", 8, 1, micro_batches=2), big)
    four = estimate(Candidate("pipeline", "data=2,stage=4", "none", 8, 1, micro_batches=4), big)
    assert four[0] < 0.75 * two[0]  # the blocks' state split 4 ways, not 2 (the embedding on every stage)
    few, many = (
        estimate(Candidate("pipeline", "data=2,stage=4", "none", 32, 1, micro_batches=m), big) for m in (4, 16)
    )
    assert many[1] < 0.7 * few[1]  # compute-bound: useful 16/19 of the ticks, not 4/7
    ranking = Ranking(request, [], 0, 0)
    command = ranking.command(type("Row", (), {"candidate": by[("data=2,stage=4", 8, 2)]})())
    assert "--layout pipeline --mesh data=2,stage=4 --micro-batches 8 --schedule circular --repeats 2" in command


def test_a_pipelined_plan_compiles_depths_in_steps_of_stages_x_repeats():
    from zoo.planning._depth import depths_to_compile as _depths
    from zoo.planning.measure import StepMeasure, extrapolate

    auto = PlanRequest("pretrain_gpt", {}, devices=8)
    assert (
        _depths(auto, 24, False, unit=4) == (4, 8)
        and _depths(auto, 8, False, unit=4) == (8,)
        and _depths(auto, 22, False) == (1, 2)
    )
    with pytest.raises(ValueError, match="compile at 8..24 blocks a multiple of 4"):
        _depths(dataclasses.replace(auto, depth=6), 24, False, unit=4)
    memory = {name: 0 for name in ("weights", "gradients", "optimizer", "argument", "output", "alias")}

    def step(layers, temp):
        return StepMeasure(layers, "data=2,stage=4", 16, {**memory, "temp": temp}, 0.0, 0.0, [], True, 0.0)

    assert extrapolate(step(4, 100), step(8, 180), 24).memory["temp"] == 180 + 4 * 80  # 20 bytes per block


def test_a_mixture_of_experts_model_gets_the_expert_layouts_priced_by_their_exchange():
    """gpt_tiny_moe (E = 4, k = 2) on 8 devices: the expert layouts on meshes whose expert
    axis divides the experts, the batch split over data x expert; no tp+sp or pipeline (an
    MoE block refuses them); each device sends 4 exchanges per sparse block of Q =
    ceil(1.25 x tokens x k / E_p) rows of C to each other device (the kernel's buffers);
    fsdp+expert holds less state than expert."""
    from zoo.planning.analytic import estimate, expert_figures

    request = _request(config_name="gpt_tiny_moe", batch_size=16, precision="mixed_bfloat16", capacity_factor=1.25)
    found = candidates(request)
    assert {c.layout for c in found} == {
        "data",
        "fsdp",
        "tp",
        "fsdp+tp",
        "context",
        "expert",
        "fsdp+expert",
        "expert+tp",
    }
    assert {c.mesh for c in found if c.layout == "expert"} == {
        "data=4,expert=2",
        "data=2,expert=4",
    }  # 8 does not divide E
    assert {c.mesh for c in found if c.layout == "expert+tp"} == {
        "data=2,expert=2,model=2",
        "data=1,expert=4,model=2",
        "data=1,expert=2,model=4",
    }
    for c in found:
        sizes = dict((p.split("=")[0], int(p.split("=")[1])) for p in c.mesh.split(","))
        assert c.micro_batch % (sizes["data"] * (sizes.get("expert", 1) if "expert" in c.layout else 1)) == 0
    expert = Candidate("expert", "data=2,expert=4", "none", 16, 1)
    figures = expert_figures(expert, request)
    assert (
        figures["tokens"] == 16 // 8 * 64 and figures["sent"] == 4 * 2 * 80 * 32 * 2 * 3
    )  # Q = ceil(1.25 * 128 * 2 / 4) = 80
    assert (
        estimate(Candidate("fsdp+expert", "data=2,expert=4", "none", 16, 1), request)[0] < estimate(expert, request)[0]
    )
    command = Ranking(request, [], 0, 0).command(type("Row", (), {"candidate": expert})())
    assert "--layout expert --mesh data=2,expert=4" in command and command.endswith("--capacity-factor 1.25")
