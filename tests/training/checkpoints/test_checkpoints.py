"""Checkpoints: exact resume (weights, optimizer, dropout RNG, data position), sharded
restore, keep-last-N, and clear refusals of incomplete, damaged or foreign checkpoints."""

import glob
import os
import pathlib
import shutil

import keras
import numpy as np
import pytest
from jax.sharding import PartitionSpec

from tests.training._tiny import BATCH, EXAMPLES, assert_bitwise_equal, batches, build, values
from zoo.distribution import build_distributed, distribution_for
from zoo.models import SmallCNN
from zoo.training.callbacks import PeriodicCheckpoint
from zoo.training.checkpoints import CheckpointError, Checkpoints, ResumableBatches, TrainingPosition, fit_from

DATA = {"examples": EXAMPLES, "batch_size": BATCH, "seed": 0}
STEPS_PER_EPOCH = EXAMPLES // BATCH  # 4


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """2 epochs (8 steps) of fit saving every 2 steps, all kept; returns (directory, final values)."""
    directory = str(tmp_path_factory.mktemp("uninterrupted") / "checkpoints")
    model = build()
    with Checkpoints(directory, keep=None, data=DATA) as checkpoints:
        saver = PeriodicCheckpoint(checkpoints, every=2, steps_per_epoch=STEPS_PER_EPOCH)
        fit_from(model, ResumableBatches(batches()), epochs=2, callbacks=[saver], verbose=0)
    return directory, values(model)


def test_resume_mid_epoch_is_bitwise_equal_to_an_uninterrupted_run(uninterrupted):
    directory, expected = uninterrupted
    checkpoints = Checkpoints(directory, keep=None, data=DATA)
    assert checkpoints.steps() == [2, 4, 6, 8]
    _, final = checkpoints.read(checkpoints.latest_complete())
    assert_bitwise_equal(final, expected, "the last checkpoint")

    model = build()  # fresh weights, optimizer at step 0, dropout RNG at its start
    position = checkpoints.restore(model, os.path.join(directory, "6"))
    assert position == TrainingPosition(epoch=1, batch=2, step=6)
    assert int(model.optimizer.iterations) == 6
    fit_from(model, ResumableBatches(batches(), epoch=position.epoch, start_batch=position.batch), epochs=2, verbose=0)
    assert_bitwise_equal(values(model), expected, "resumed at epoch 2, batch 2")


def _saved(directory, steps, keep=None, model=None):
    """Save distinct, recognisable values at each step; returns {step: values}."""
    model = model or build()
    saved = {}
    with Checkpoints(directory, keep=keep, data=DATA) as checkpoints:
        for step in steps:
            rng = np.random.default_rng(step)
            for variable in model.variables + model.optimizer.variables:
                if "float" in str(variable.dtype) and "learning_rate" not in variable.path:
                    variable.assign(rng.standard_normal(variable.shape).astype(variable.dtype))
            model.optimizer.iterations.assign(step)
            checkpoints.save(model, TrainingPosition.after(step, STEPS_PER_EPOCH))
            saved[step] = values(model)
    return saved


def test_restore_puts_arrays_back_in_their_sharded_layout(tmp_path):
    distribution = distribution_for(SmallCNN, "model", "data=2,model=4")
    saved = _saved(str(tmp_path), [3], model=build_distributed(build, distribution))[3]

    model = build_distributed(build, distribution)
    layouts = {v.path: v.value.sharding for v in model.variables + model.optimizer.variables}
    Checkpoints(str(tmp_path), data=DATA).restore(model)
    assert_bitwise_equal(values(model), saved, "restored under ModelParallel")
    for variable in model.variables + model.optimizer.variables:
        assert variable.value.sharding == layouts[variable.path], variable.path
    assert model.get_layer("block1_conv").kernel.value.sharding.spec == PartitionSpec(None, None, None, "model")
    momentum = next(v for v in model.optimizer.variables if v.path.endswith("hidden_dense_kernel_momentum"))
    assert momentum.value.sharding.spec == PartitionSpec(None, "model")
    assert len(momentum.value.addressable_shards) == 8

    keras.distribution.set_distribution(None)  # the same checkpoint onto one device: resharded on restore
    single = build()
    Checkpoints(str(tmp_path), data=DATA).restore(single)
    assert_bitwise_equal(values(single), saved, "restored on one device")
    assert len(single.get_layer("block1_conv").kernel.value.devices()) == 1


def test_keep_last_n_leaves_only_the_newest(tmp_path):
    _saved(str(tmp_path), [1, 2, 3, 4, 5], keep=2)
    assert Checkpoints(str(tmp_path)).steps() == [4, 5]
    assert sorted(os.listdir(tmp_path)) == ["4", "5", "trash"]
    assert os.listdir(tmp_path / "trash") == []


def _truncate(path):
    with open(path, "r+b") as handle:
        handle.truncate(os.path.getsize(path) // 2)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # Orbax's abandoned read coroutines
def test_no_truncated_file_loads_as_valid_but_wrong(tmp_path):
    """Truncate each file of a checkpoint's arrays in turn: the restore fails naming the
    path, or (a file the OCDBT merge left unused) gives exactly the saved values."""
    saved = _saved(str(tmp_path), [4])[4]
    checkpoints, model, refused = Checkpoints(str(tmp_path), data=DATA), build(), []
    for path in filter(os.path.isfile, sorted(glob.glob(str(tmp_path / "4" / "state" / "**" / "*"), recursive=True))):
        content = pathlib.Path(path).read_bytes()
        _truncate(path)
        before = values(model)
        try:
            checkpoints.restore(model)
        except CheckpointError as error:
            assert f"checkpoint {tmp_path}/4: its array data in state/ cannot be read" in str(error)
            assert_bitwise_equal(values(model), before, "a model after a failed restore")
            refused.append(os.path.relpath(path, tmp_path / "4"))
        else:
            assert_bitwise_equal(values(model), saved, f"restored with {path} truncated")
        pathlib.Path(path).write_bytes(content)
    assert "state/manifest.ocdbt" in refused and "state/_METADATA" in refused
    assert any("/d/" in path for path in refused)  # array chunks


def test_a_damaged_newest_checkpoint_falls_back_with_a_warning(tmp_path):
    directory = str(tmp_path)
    saved = _saved(directory, [2, 4])
    _truncate(os.path.join(directory, "4", "state", "manifest.ocdbt"))
    checkpoints = Checkpoints(directory, data=DATA)
    assert checkpoints.latest_complete() == os.path.join(directory, "4")  # looks complete: only reading finds it
    model = build()
    with pytest.warns(
        UserWarning, match=r"/4: its array data in state/ cannot be read .* trying the previous checkpoint"
    ):
        position = checkpoints.resume(model, report=lambda line: None)
    assert position.step == 2
    assert_bitwise_equal(values(model), saved[2], "fallen back to step 2")
    assert checkpoints.steps() == [2]
    assert os.path.isdir(os.path.join(directory, "quarantine", "4"))  # set aside, not deleted


@pytest.mark.parametrize(
    "damage, problem",
    [
        (
            lambda path: os.remove(os.path.join(path, "zoo", "checkpoint.json")),
            "the metadata file zoo/checkpoint.json is missing",
        ),
        (lambda path: os.remove(os.path.join(path, "commit_success.txt")), "no commit marker commit_success.txt"),
        (
            lambda path: open(os.path.join(path, "zoo", "checkpoint.json"), "w").write('{"format": "zoo-ch'),
            "is unreadable",
        ),
        (lambda path: shutil.rmtree(os.path.join(path, "state")), "the array data folder state/ is missing"),
    ],
    ids=["metadata missing", "commit marker missing", "metadata truncated", "arrays missing"],
)
def test_incomplete_checkpoint_is_skipped_and_named(tmp_path, damage, problem):
    directory = str(tmp_path)
    saved = _saved(directory, [2, 4])
    damage(os.path.join(directory, "4"))
    checkpoints = Checkpoints(directory, data=DATA)
    model = build()
    with pytest.raises(CheckpointError, match=rf"checkpoint {directory}/4: .*{problem}"):
        checkpoints.restore(model, os.path.join(directory, "4"))
    if problem != "is unreadable":  # completeness is judged without parsing the JSON
        assert checkpoints.latest_complete() == os.path.join(directory, "2")
    with pytest.warns(UserWarning, match=problem):
        assert checkpoints.resume(model, report=lambda line: None).step == 2
    assert_bitwise_equal(values(model), saved[2], "fallen back to step 2")


def test_checkpoint_of_another_model_config_is_refused(tmp_path):
    directory = str(tmp_path)
    _saved(directory, [2, 4])
    other = build(hidden_units=16)
    checkpoints = Checkpoints(directory, data=DATA)
    with pytest.raises(
        CheckpointError,
        match=r"/4: was written by a different model .*'hidden_units' is 8 in the checkpoint but 16 now",
    ):
        checkpoints.restore(other)
    with (
        pytest.warns(UserWarning),
        pytest.raises(CheckpointError, match=r"no checkpoint could be restored:\n.*/4: .*\n.*/2: "),
    ):
        checkpoints.resume(other, report=lambda line: None)
    assert sorted(os.listdir(directory)) == ["2", "4"]  # nothing set aside when nothing restored


def test_checkpoint_of_other_data_is_refused(tmp_path):
    _saved(str(tmp_path), [2])
    with pytest.raises(CheckpointError, match=r"/2: was written for other training data: .*'seed': 0.*'seed': 1"):
        Checkpoints(str(tmp_path), data={**DATA, "seed": 1}).restore(build())


def test_arrays_of_another_step_than_the_metadata_are_refused(tmp_path):
    model = build()
    model.optimizer.iterations.assign(3)  # the arrays are of step 3 ...
    checkpoints = Checkpoints(str(tmp_path), data=DATA)
    checkpoints.save(model, TrainingPosition.after(5, STEPS_PER_EPOCH))  # ... the metadata says 5
    with pytest.raises(CheckpointError, match=r"/5: its optimizer has taken 3 steps but its metadata says step 5"):
        checkpoints.restore(build())


def test_a_step_is_never_saved_over(tmp_path):
    _saved(str(tmp_path), [2])
    model = build()
    model.optimizer.iterations.assign(2)
    with pytest.raises(CheckpointError, match=r"/2: already exists"):
        Checkpoints(str(tmp_path), data=DATA).save(model, TrainingPosition.after(2, STEPS_PER_EPOCH))


def test_resume_from_an_empty_directory_starts_fresh(tmp_path):
    assert Checkpoints(str(tmp_path / "none"), data=DATA).resume(build(), report=lambda line: None) is None
    assert not os.path.exists(tmp_path / "none")  # reading creates nothing


def test_how_a_run_computes_does_not_make_a_checkpoint_another_model():
    """A GPT written under one layout resumes under another: the attention kernel the
    distribution chose (context_attention), Megatron SP and remat are not compared;
    a width still is."""
    from zoo.models import GPTCausalLM
    from zoo.training.checkpoints._state import describe, differences

    def described(**overrides):
        model = GPTCausalLM.from_config_name("gpt_tiny", num_layers=1, **overrides)
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
        return describe(model)

    written = described()
    assert differences(written, described(context_attention="ring", remat="full")) == []
    assert differences(written, described(hidden_dim=64, intermediate_dim=64)) != []


def _gpt(schedule=None, repeats=1, seed=0):
    """gpt_tiny with 4 blocks as layers (schedule None) or stacked (R, 4/R, ...); AdamW built."""
    from zoo.models import GPTCausalLM

    keras.utils.set_random_seed(seed)
    stacked = {"schedule": schedule, "micro_batches": 1, "repeats": repeats} if schedule else {}
    model = GPTCausalLM.from_config_name("gpt_tiny", num_layers=4, **stacked)
    model.compile(optimizer=keras.optimizers.AdamW(1e-3), loss="sparse_categorical_crossentropy")
    model.optimizer.build(model.trainable_variables)
    rng = np.random.default_rng(seed)
    for variable in model.optimizer.variables[2:]:  # moments made non-zero, so a mix-up shows
        variable.assign(rng.standard_normal(variable.shape).astype("float32"))
    model.optimizer.iterations.assign(2)
    return model


def _by_layer(model):
    """{(group, name, layer): array}: a stacked (R, L/R, ...) weight or slot as its L layers."""
    from zoo.training.checkpoints._block_forms import _key

    found = {}
    for group, variables in (("model", model.variables), ("optimizer", model.optimizer.variables)):
        for variable in variables:
            key, value = _key(group, variable.path), np.asarray(variable.value)
            if key.kind == "stacked":
                for layer, block in enumerate(value.reshape(-1, *value.shape[2:])):
                    found[group, key.name, layer] = block
            elif "seed_generator" not in key.name:
                found[group, key.name, key.layer] = value
    return found


@pytest.mark.parametrize(
    ("written", "restored"),
    [((None, 1), ("gpipe", 1)), (("circular", 2), (None, 1)), (("gpipe", 1), ("circular", 2))],
    ids=["layers-to-stacked", "stacked-to-layers", "restacked"],
)
def test_a_gpt_checkpoint_restores_into_the_other_block_form(tmp_path, written, restored):
    """Blocks as L layers <-> stacked (R, L/R, ...) (layout pipeline): every weight and
    optimizer slot lands at its layer (stack place (r, j) is layer r * L/R + j)."""
    saved = _gpt(*written, seed=1)
    Checkpoints(str(tmp_path), data=DATA).save(saved, TrainingPosition.after(2, STEPS_PER_EPOCH))
    model = _gpt(*restored, seed=2)
    position = Checkpoints(str(tmp_path), data=DATA).restore(model)
    assert position.step == 2 and int(model.optimizer.iterations) == 2
    expected, found = _by_layer(saved), _by_layer(model)
    assert sorted(found, key=str) == sorted(expected, key=str)
    for key, value in expected.items():
        np.testing.assert_array_equal(found[key], value, err_msg=str(key))


def test_a_block_form_change_matches_every_variable_or_nothing():
    """A stack whose layers the checkpoint lacks, or a layer of another shape, is no form
    change: the checkpoint stays "a different model"."""
    from zoo.training.checkpoints._block_forms import BlockFormConversion

    layers = {"model": [["block_0/w", [2, 3], "float32"], ["block_1/w", [2, 3], "float32"], ["e", [5], "float32"]]}
    assert BlockFormConversion.between(
        layers, {"model": [["blocks/w", [1, 2, 2, 3], "float32"], ["e", [5], "float32"]]}
    )
    for current in (
        [["blocks/w", [1, 3, 2, 3], "float32"], ["e", [5], "float32"]],  # 3 layers, the checkpoint has 2
        [["blocks/w", [1, 2, 3, 2], "float32"], ["e", [5], "float32"]],  # a layer of another shape
        [["blocks/w", [1, 2, 2, 3], "bfloat16"], ["e", [5], "float32"]],  # another dtype
        [["blocks/w", [1, 2, 2, 3], "float32"]],  # "e" left over in the checkpoint
        [["blocks/w", [1, 2, 2, 3], "float32"], ["e", [5], "float32"], ["f", [1], "float32"]],  # "f" not in it
    ):
        assert BlockFormConversion.between(layers, {"model": current}) is None, current
    assert BlockFormConversion.between(layers, layers) is None  # one form: nothing to convert
