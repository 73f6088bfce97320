"""Every recipe's abstract plan (mesh, layouts, memory) holds for its target; bad plans
fail naming the file and the numbers; the estimate equals what the devices really hold."""

import math

import keras
import pytest

from tests.recipes._recipes import ALL, CNN, RECIPES, ROOT, checked, ids, plan_of, write
from zoo.distribution import make_mesh
from zoo.training.recipes import (
    JobUnavailableError,
    RecipeError,
    UnsupportedKeyError,
    check_recipe,
    load_recipe,
)


@pytest.mark.parametrize("path", ALL, ids=ids(ALL))
def test_every_recipe_plans_for_its_target(path):
    recipe = load_recipe(path)
    plan, error = checked(path)
    if plan is None:
        pytest.skip(f"job not available yet: {error}")
    target = recipe.target
    assert plan.devices == target.devices and plan.hosts == target.hosts
    assert plan.mesh is None or math.prod(int(axis.split("=")[1]) for axis in plan.mesh.split(",")) == target.devices
    assert plan.parameters > 0 and plan.weight_bytes > 0
    assert plan.batch_size % plan.data_shards == 0 and plan.batch_size % target.hosts == 0
    if target.device_memory_gib:
        assert plan.state_bytes < target.device_memory_gib * 2**30
    if plan.sequence_length is not None:
        assert plan.tokens_per_step == recipe.train.batch_size * recipe.train.sequence_length
    assert plan.format()[0].startswith(f"recipe: {path}")


@pytest.mark.parametrize("path", ALL, ids=ids(ALL))
def test_every_recipe_key_is_supported_by_its_job(path):
    """Skips, naming the missing job config fields, until the jobs take them."""
    plan, error = checked(path)
    if isinstance(error, JobUnavailableError):
        pytest.skip(f"job not available yet: {error}")
    if isinstance(error, UnsupportedKeyError):
        pytest.skip(f"job config fields missing: {error}")
    assert plan is not None and error is None


def test_gpt_1b_under_fsdp_splits_its_state_over_the_data_axis():
    plan = plan_of(load_recipe(RECIPES / "gpu-8" / "pretrain_gpt.toml"))  # the layout map of the real model
    assert plan.parameters == 1_100_048_384 and plan.mesh == "data=8"
    assert plan.weight_bytes == pytest.approx(4 * plan.parameters / 8, rel=1e-3)  # float32 weights, 1/8 each
    assert plan.optimizer_bytes == pytest.approx(3 * plan.weight_bytes, rel=1e-3)  # AdamW m, v + accumulator
    assert plan.tokens_per_step == 32 * 2048 and plan.accumulation == 2
    assert plan.flops_per_step == pytest.approx(6 * plan.parameters * plan.tokens_per_step, rel=0.1)


def test_mesh_that_does_not_match_the_devices_names_both(tmp_path):
    path = write(tmp_path, CNN)
    with pytest.raises(
        RecipeError,
        match=r"recipe.toml: \[parallel\] mesh 'data=2,model=2' \(layout 'model'\) on 8 devices "
        r"\(\[target\] hosts=1 x devices_per_host=8\): mesh data=2,model=2 has 4 devices",
    ):
        check_recipe(load_recipe(path, {"parallel.mesh": "data=2,model=2"}))
    with pytest.raises(RecipeError, match=r"layout 'single' runs on one device but the target has 8"):
        check_recipe(load_recipe(path, {"parallel.layout": "single", "parallel.mesh": "data=1"}))


def test_batch_not_divisible_by_the_data_axis_or_the_hosts(tmp_path):
    path = write(tmp_path, CNN)
    with pytest.raises(
        RecipeError, match=r"recipe.toml: .*\[train\] batch_size 30 is not divisible by the 'data' mesh axis of size 4"
    ):
        check_recipe(load_recipe(path, {"train.batch_size": 30, "parallel.mesh": "data=4,model=2"}))
    recipe = load_recipe(
        path,
        {"target.hosts": 4, "target.devices_per_host": 2, "train.batch_size": 2, "parallel.mesh": "data=2,model=4"},
    )
    with pytest.raises(RecipeError, match=r"batch_size 2 is not divisible by the 4 hosts"):
        check_recipe(recipe)


def test_state_larger_than_device_memory_is_an_error(tmp_path):
    recipe = load_recipe(write(tmp_path, CNN), {"target.device_memory_gib": 0.005, "data.image_size": 128})
    with pytest.raises(
        RecipeError,
        match=r"weights, gradients and optimizer state need 8.10 MiB per device under layout "
        r"'model' on mesh data=2,model=4 but \[target\] device_memory_gib is 0.005",
    ):
        check_recipe(recipe)


def test_device_count_override_and_mesh_inference(tmp_path):
    recipe = load_recipe(write(tmp_path, CNN), {"parallel.mesh": "data=-1,model=4"})
    assert plan_of(recipe).mesh == "data=2,model=4"
    assert plan_of(recipe, device_count=32).mesh == "data=8,model=4"


def test_keys_a_job_does_not_take_are_reported_never_dropped(tmp_path):
    recipe = load_recipe(write(tmp_path, CNN + 'sequence_length = 128\n[finetune]\nmethod = "lora"\n'))
    with pytest.raises(
        UnsupportedKeyError,
        match=r"job 'train_cnn' \(zoo.config.settings.CNNTrainSettings\) does not support "
        r"\[train\] sequence_length \(not a setting of this job\); \[finetune\] method \(not a setting of this job\): "
        r"remove these keys, or add the fields to CNNTrainSettings",
    ) as error:
        check_recipe(recipe)
    assert set(error.value.keys) == {"train.sequence_length", "finetune.method"}
    assert error.value.plan.mesh == "data=2,model=4"  # everything else was checked
    with pytest.raises(UnsupportedKeyError):
        recipe.job_config()
    with pytest.raises(
        UnsupportedKeyError, match=r"does not support \[model\] config_name \(not a setting of this job\)"
    ):
        load_recipe(write(tmp_path, CNN), {"model.config_name": "resnet"}).job_config()


def test_job_config_carries_every_key_the_file_set(tmp_path):
    config = load_recipe(write(tmp_path, CNN + "epochs = 2\n[data]\ntrain_examples = 64\n")).job_config()
    assert (config.layout, config.mesh, config.batch_size, config.epochs, config.train_examples) == (
        "model",
        "data=2,model=4",
        32,
        2,
        64,
    )
    assert config.learning_rate == type(config)().learning_rate  # unset: the job's default


def test_abstract_build_leaves_nothing_for_keras_to_initialise_later(tmp_path):
    from keras.src.backend.common import global_state

    before = list(global_state.get_global_attribute("uninitialized_variables") or [])
    plan_of(load_recipe(write(tmp_path, CNN)))
    assert list(global_state.get_global_attribute("uninitialized_variables") or []) == before
    assert keras.distribution.distribution() is None


def _real_bytes_per_device(variables):
    """Bytes of device 0's shard of each variable, as placed for real."""
    return sum(variable.value.addressable_shards[0].data.nbytes for variable in variables)


@pytest.mark.parametrize("name", ["train_cnn.toml", "pretrain_gpt.toml"])
def test_estimate_equals_what_each_device_holds(name):
    """The abstract per-device estimate against the model and optimizer placed on the 8
    devices: layout-map rules (CNN), and the tensor-parallel layers' own layouts plus
    gradient-accumulation slots (GPT)."""
    recipe = load_recipe(RECIPES / "cpu-sim-8" / name)
    plan = plan_of(recipe)
    module, config, _ = recipe._job_config()
    job = recipe.job
    distribution = job.distribution(module, config, make_mesh(plan.mesh))
    keras.distribution.set_distribution(distribution)
    model = job.build(module, config)
    keras.distribution.set_distribution(None)
    job.compile(module, model, config)
    model.optimizer.build(model.trainable_variables)
    assert plan.weight_bytes == _real_bytes_per_device(model.variables)
    assert plan.gradient_bytes == _real_bytes_per_device(model.trainable_variables)
    assert plan.optimizer_bytes == _real_bytes_per_device(model.optimizer.variables)


def test_numbers_past_their_range_and_a_non_keras_output_are_refused_before_anything_runs(tmp_path):
    """Recipe numbers are range-checked like flags: counts up to 2**31 - 1, devices up to
    4096 (before XLA sees them), per host and hosts x devices_per_host in all; a job that
    saves a .keras file refuses another suffix."""
    path = write(tmp_path, CNN)
    with pytest.raises(
        RecipeError, match=r"\[train\] epochs: expected an integer <= 2,147,483,647, got 100000000000000000000"
    ):
        load_recipe(path, {"train.epochs": 10**20})
    with pytest.raises(RecipeError, match=r"\[target\] devices_per_host: expected an integer <= 4,096, got 1000000"):
        load_recipe(path, {"target.devices_per_host": 10**6})
    # each within its range, the product not: refused naming both (no XLA_FLAGS past the cap)
    with pytest.raises(
        RecipeError,
        match=r"\[target\] hosts = 1,000 x devices_per_host = 4,096 = 4,096,000 devices, above the 4,096 the zoo",
    ):
        load_recipe(path, {"target.hosts": 1000, "target.devices_per_host": 4096})
    assert load_recipe(path, {"target.hosts": 512, "target.devices_per_host": 8}).target.devices == 4096
    with pytest.raises(RecipeError, match=r"\[train\] output = 'model.h5': the job saves a .keras file"):
        check_recipe(load_recipe(path, {"train.output": "model.h5"}))
    (tmp_path / "a_file").write_text("")  # an output under a file: run refuses it, so check does
    with pytest.raises(
        RecipeError, match=r"\[train\] output = '.*a_file/m.keras': cannot be written: .*a_file is a file"
    ):
        check_recipe(load_recipe(path, {"train.output": str(tmp_path / "a_file" / "m.keras")}))
    from zoo.distribution import simulate_cpu_devices

    with pytest.raises(ValueError, match=r"simulated device count 1,000,000 is above the 4,096"):
        simulate_cpu_devices(10**6)


def test_a_causal_lm_fine_tuning_recipe_checks_as_zoo_finetune_runs(tmp_path):
    """A Hugging Face folder as [model] preset with a [data] data_file, as docs/recipes.md
    documents: planned and compiled as zoo finetune would train it (it was refused with
    'has no metadata.json': the job built every preset as a classifier)."""
    from zoo.planning import make_plan
    from zoo.planning.recipes import request_from_recipe

    data = tmp_path / "data.jsonl"
    data.write_text('{"prompt": "a b", "completion": " c d"}\n' * 16)
    folder = ROOT / "tests" / "fixtures" / "hf" / "llama_gqa_rope_scaling"
    text = f"""
[recipe]
job = "finetune"
[target]
platform = "cpu"
hosts = 1
devices_per_host = 8
[model]
preset = "{folder}"
[finetune]
method = "lora"
lora_rank = 2
[parallel]
layout = "fsdp"
mesh = "data=8"
[data]
data_file = "{data}"
[train]
batch_size = 8
sequence_length = 32
"""
    recipe = load_recipe(write(tmp_path, text))
    plan = check_recipe(recipe)
    assert plan.mesh == "data=8" and plan.parameters > 0

    # an output run would refuse (a non-empty folder for a Hugging Face model) is refused
    # by check, with the run's own words, naming the key; and run refuses it before any work
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("mine")
    refused = load_recipe(recipe.path, {"train.output": str(taken)})
    with pytest.raises(RecipeError, match=r"\[train\] output = '.*taken': exists and is not empty"):
        check_recipe(refused)
    module, settings, _ = refused._job_config()
    with pytest.raises(ValueError, match=r"--output '.*taken': exists and is not empty"):
        refused.job.function(module)(settings)
    assert (taken / "notes.txt").read_text() == "mine"
    compiled = make_plan(request_from_recipe(recipe))
    assert compiled.fits and compiled.step.batch_size == 8
    assert compiled.step.memory["gradients"] < compiled.step.memory["weights"]  # LoRA: the factors' gradients only
