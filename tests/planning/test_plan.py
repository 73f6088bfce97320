"""``zoo.planning.make_plan``: the compiled step's memory against a real run, and ``zoo
plan``'s exit status and one-line verdict.

gpt_tiny at T=32 on the 8 simulated devices (in-process compiles); one plan for 4 devices
goes through the worker subprocess. The extrapolation from 1 and 2 blocks against a
whole-model compile is checked in ``test_realsize.py`` (gpt_small and the gpu-8 gpt_1b
recipe, within 5%); its arithmetic in ``test_roofline.py``.
"""

import jax
import numpy as np
import pytest

from zoo.cli import main as cli
from zoo.distribution import build_distributed
from zoo.planning import PlanRequest, make_plan
from zoo.training import gpt

TINY = dict(
    config_name="gpt_tiny",
    layout="fsdp",
    mesh="data=8",
    batch_size=8,
    sequence_length=32,
    precision="float32",
    remat="none",
)


def _device_bytes(variables, device):
    return sum(shard.data.nbytes for v in variables for shard in v.value.addressable_shards if shard.device == device)


def test_plan_state_equals_what_a_real_run_holds_per_device():
    """The plan's weights + optimizer state per device equal the bytes the job's model,
    built and trained for real (one ``fit`` step), holds on each device (exactly: both come
    from the layouts; the real run places them). Temporaries are the compiler's and cannot
    be read on a CPU."""
    plan = make_plan(PlanRequest("pretrain_gpt", TINY, devices=8, device="cpu"))
    config = gpt.GPTTrainSettings(**TINY)
    model = build_distributed(lambda: gpt.build_for_training(config), gpt.resolve_distribution(config))
    gpt.compile_gpt(model, config.learning_rate, 1)
    tokens = np.random.default_rng(0).integers(0, 256, size=(8, 33), dtype="int32")
    model.fit(tokens[:, :-1], tokens[:, 1:], batch_size=8, epochs=1, verbose=0)
    for device in jax.devices():
        assert (
            _device_bytes(model.trainable_variables + model.non_trainable_variables, device)
            == plan.step.memory["weights"]
        )
        assert _device_bytes(model.optimizer.variables, device) == plan.step.memory["optimizer"]
    assert plan.step.memory["temp"] > plan.step.memory["gradients"] > 0


def test_remat_auto_is_planned_as_the_fastest_policy_that_fits():
    """remat auto (zoo train gpt's default) plans what the job would run: none, where it fits."""
    plan = make_plan(PlanRequest("pretrain_gpt", {**TINY, "remat": "auto"}, devices=8, device="cpu"))
    assert plan.request.config["remat"] == "none" and plan.fits
    assert plan.notes[0].startswith("remat auto: none, the fastest that fits (planned: none ")


def test_zoo_plan_exits_1_with_one_line_naming_the_largest_part(capsys):
    """A plan for 4 devices (a subprocess: this process has 8) on devices of 256 KiB."""
    code = cli.main(
        [
            "plan",
            "--config-name",
            "gpt_tiny",
            "--devices",
            "4",
            "--device",
            "cpu",
            "--device-memory-gib",
            "0.000244140625",
            "--layout",
            "data",
            "--batch-size",
            "8",
            "--sequence-length",
            "32",
            "--precision",
            "float32",
            "--remat",
            "none",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 1
    assert "compiled: the fit step on data=4, global batch 8, 2 blocks (whole model)" in out
    assert "| **peak** (of 256.00 KiB) |" in out
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("zoo: does not fit: peak ")
    assert "largest part activations and workspace" in lines[0] and "remat full" in lines[0]


def test_bad_input_is_named_before_anything_compiles(capsys):
    assert cli.main(["plan", "--config-name", "gpt_tiny", "--device", "h300"]) == 2
    assert "unknown device 'h300'" in capsys.readouterr().err
    assert cli.main(["plan", "--config-name", "gpt_nano", "--device", "h100"]) == 2
    assert "unknown GPT config name 'gpt_nano'" in capsys.readouterr().err
    assert cli.main(["plan", "recipes/gpu-8/pretrain_gpt.toml", "--layout", "tp", "--remat"]) == 2
    assert (
        "--layout, --remat describe a GPT without a recipe; with recipes/gpu-8/pretrain_gpt.toml use --set"
        in capsys.readouterr().err
    )


def test_zoo_plan_takes_the_gpt_flags_of_zoo_train_gpt_with_their_defaults():
    """zoo plan FLAGS sizes the step zoo train gpt FLAGS runs: the flags are generated from
    GPTTrainSettings, so the same names, defaults and checks (before: gpt_1b, mixed_bfloat16
    and the config's whole length by default, against zoo train gpt's gpt_small, float32, 128)."""
    from zoo.cli import plan

    parser = cli.build_parser()
    request = plan.request_from(parser.parse_args(["plan"]))
    defaults = gpt.GPTTrainSettings()
    assert request.config == {name: getattr(defaults, name) for name in plan.PLANNED_SETTINGS}
    given = ["--config-name", "gpt_tiny", "--layout", "context", "--context-attention", "ulysses", "--remat"]
    request = plan.request_from(parser.parse_args(["plan", *given]))
    trained = gpt.GPTTrainSettings(config_name="gpt_tiny", layout="context", context_attention="ulysses", remat="full")
    assert request.config == {name: getattr(trained, name) for name in plan.PLANNED_SETTINGS}


@pytest.mark.parametrize(
    "depth, remat, needs_two, expected",
    [
        ("auto", "none", False, (1, 2)),  # deep: extrapolated per block (within 0.2% without remat)
        ("auto", "full", False, (22,)),  # remat: the whole model (extrapolating under-counted by 16-34%)
        ("auto", "full", True, (1, 2)),  # JAX 0.10's remat correction needs two depths
        ("full", "none", False, (22,)),
        (4, "full", False, (3, 4)),  # asked for: a quick estimate, with a note
    ],
)
def test_depth_auto_compiles_the_whole_model_under_remat(depth, remat, needs_two, expected):
    from zoo.planning._depth import depths_to_compile as _depths

    request = PlanRequest("pretrain_gpt", {}, devices=8, depth=depth)
    assert _depths(request, 22, needs_two=needs_two, whole=remat != "none" and not needs_two) == expected


@pytest.mark.parametrize("strategy, mesh", [("fsdp", "data=8"), ("tp", "data=2,model=4")])
def test_the_gpt_job_fits_its_layout_map_to_tied_embeddings(strategy, mesh):
    """gpt_125m/gpt_350m tie the LM head to the embedding: the job's distribution has no
    lm_head rule for them (before, zoo train gpt --config-name gpt_350m --layout fsdp failed
    with "layout rule(s) ['.*lm_head/kernel'] match no variable")."""
    tied = gpt.resolve_distribution(gpt.GPTTrainSettings(config_name="gpt_350m", layout=strategy, mesh=mesh))
    untied = gpt.resolve_distribution(gpt.GPTTrainSettings(config_name="gpt_1b", layout=strategy, mesh=mesh))
    assert not any("lm_head" in rule for rule in tied.layout_map) and any(
        "lm_head" in rule for rule in untied.layout_map
    )


def test_a_plan_compiles_here_on_its_own_devices_and_takes_its_cost_from_xla_cpu(monkeypatch):
    """Simulated CPU devices compile a plan of their count for any target; an accelerator
    host compiles only a plan for its own kind and count (its device kind stood in for
    here), and such a plan keeps its memory and takes XLA:CPU's FLOPs and bytes."""
    from zoo.measure import hardware
    from zoo.planning.measure import StepMeasure
    from zoo.planning.plan import Plan, compiles_here, with_simulated_cost

    assert compiles_here(PlanRequest("pretrain_gpt", TINY, devices=8, device="tpu-v5e"))
    assert not compiles_here(PlanRequest("pretrain_gpt", TINY, devices=4, device="cpu"))
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
    monkeypatch.setattr(hardware, "local_device", lambda: ("tpu-v5e", 15.75))
    assert compiles_here(PlanRequest("pretrain_gpt", TINY, devices=8, device="tpu-v5e"))
    assert not compiles_here(PlanRequest("pretrain_gpt", TINY, devices=8, device="h100"))
    assert not compiles_here(PlanRequest("pretrain_gpt", TINY, devices=4, device="tpu-v5e"))

    def plan(temp, flops, bytes_accessed):
        memory = dict(weights=1, gradients=1, optimizer=2, temp=temp, argument=4, output=4, alias=4)
        step = StepMeasure(1, None, 2, memory, flops, bytes_accessed, [], True, 1.0)
        return Plan(PlanRequest("pretrain_gpt", TINY, devices=1, device="tpu-v5e"), step, (1,), 1, 0, 3e12, ("n",))

    merged = with_simulated_cost(
        plan(temp=7, flops=1e12, bytes_accessed=1e9), plan(temp=99, flops=3e12, bytes_accessed=5e10)
    )
    assert (merged.step.memory["temp"], merged.step.flops, merged.step.bytes_accessed) == (7, 3e12, 5e10)
    assert merged.peak == 11 and merged.notes[0] == "n" and "XLA:CPU" in merged.notes[1]


@pytest.mark.parametrize(
    ("layout", "mesh", "batch", "method", "expected"),
    [
        ("fsdp", "data=8", 16, "lora", "halve the batch per step (8)"),
        ("fsdp", "data=8", 8, "lora", "split the sequence over devices (layout context)"),  # 1 a shard: cannot halve
        ("fsdp", "data=8", 8, "qlora", "split the sequence over devices (layout context)"),  # a quantized base too
        ("expert", "data=2,expert=4", 8, "full", "split the sequence over devices (layout context)"),  # data x expert
        ("tp", "data=2,model=4", 4, "full", "halve the batch per step (2)"),  # the model axis does not cut the batch
    ],
)
def test_the_advice_halves_the_batch_only_where_half_still_splits_over_its_shards(
    layout, mesh, batch, method, expected
):
    """A peak led by the activations is told to halve the batch only where half of it still
    divides by the pieces the layout cuts the batch into (a 70B QLoRA at 1 example a chip
    was told to halve 8 to 4 over data=8)."""
    from types import SimpleNamespace

    from zoo.distribution.mesh import parse_mesh_spec
    from zoo.planning.report import advice

    plan = SimpleNamespace(  # what advice reads of a Plan: its request's config, its mesh, its parts
        request=SimpleNamespace(
            config={"layout": layout, "batch_size": batch, "sequence_length": 2048, "remat": "full", "method": method}
        ),
        step=SimpleNamespace(axis_sizes=dict(parse_mesh_spec(mesh))),
        parts=lambda: {"weights": 1, "activations and workspace": 2},
    )
    assert advice(plan) == expected
