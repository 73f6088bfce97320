"""Recipe files parse; every key carries a comment; bad files fail naming file, key and values."""

import re

import pytest

from tests.recipes._recipes import ALL, CNN, RECIPES, ids, write
from zoo.training.recipes import RecipeError, load_recipe, parse_override


@pytest.mark.parametrize("path", ALL, ids=ids(ALL))
def test_every_recipe_parses_and_comments_every_key(path):
    recipe = load_recipe(path)
    assert recipe.recipe.job in ("train_cnn", "pretrain_gpt", "finetune")
    assert recipe.target.devices == recipe.target.hosts * recipe.target.devices_per_host
    assert path.parent.name.startswith(recipe.target.platform if recipe.target.platform != "cpu" else "cpu-sim")
    assigned = [line for line in path.read_text().splitlines() if re.match(r"\s*#?\s*[a-z_]+ = ", line)]
    uncommented = [line for line in assigned if not re.search(r"\S\s+#\s+\S", line)]
    assert assigned and not uncommented, f"{path}: keys without a comment: {uncommented}"


def test_the_index_lists_every_recipe():
    index = (RECIPES / "README.md").read_text()
    missing = [name for name in ids(ALL) if name not in index]
    assert not missing, f"recipes/README.md does not list {missing}"


def test_accelerator_recipes_pretrain_a_large_gpt_in_bfloat16():
    for target in ("gpu-1", "gpu-8", "gpu-multihost", "tpu-v4-8", "tpu-v5e-8", "tpu-multihost"):
        recipe = load_recipe(RECIPES / target / "pretrain_gpt.toml")
        assert (recipe.model.config_name, recipe.train.precision) == ("gpt_1b", "mixed_bfloat16"), target


@pytest.mark.parametrize(
    "change, expected",
    [
        (
            {"train.global_batchsize": 8},
            r"unknown key 'global_batchsize' in \[train\] \(did you mean 'batch_size'\?\); allowed: epochs, batch_size,",
        ),
        ({"trian.epochs": 1}, r"unknown section 'trian' \(did you mean 'train'\?\); allowed: recipe, target,"),
        (
            {"parallel.layout": "zero3"},
            r"\[parallel\] layout: 'zero3' is not one of the allowed values \['single', 'data', 'model', 'fsdp'",
        ),
        (
            {"train.precision": "float16"},
            r"\[train\] precision: 'float16' is not one of the allowed values \['float32', 'mixed_bfloat16', 'bfloat16'\]",
        ),
        ({"train.batch_size": "32"}, r"\[train\] batch_size: expected an integer >= 1, got '32' \(str\)"),
        ({"train.batch_size": 0}, r"\[train\] batch_size: expected an integer >= 1, got 0"),
        ({"train.epochs": True}, r"\[train\] epochs: expected an integer >= 1, got True \(bool\)"),
        (
            {"train.remat": 1},
            r"\[train\] remat: expected one of auto, none, full, dots_saveable, save_attention, offload_attention, or true \(= 'full'\), or false \(= 'none'\), got 1 \(int\)",
        ),
        (
            {"train.remat": "save_dots"},
            r"\[train\] remat: 'save_dots' is not one of the allowed values \['auto', 'none', 'full', 'dots_saveable', 'save_attention', 'offload_attention'\]",
        ),
        (
            {"multihost.process_id": 3},
            r"unknown key 'process_id' in \[multihost\]; allowed: coordinator_address, timeout_s",
        ),
    ],
)
def test_bad_values_name_the_file_key_value_and_allowed_values(tmp_path, change, expected):
    path = write(tmp_path, CNN)
    with pytest.raises(RecipeError, match=re.escape(str(path)) + ": " + expected):
        load_recipe(path, change)


def test_missing_required_key_and_table_errors(tmp_path):
    path = write(tmp_path, CNN.replace("devices_per_host = 8\n", ""))
    with pytest.raises(
        RecipeError, match=r"recipe.toml: \[target\] needs the key 'devices_per_host' \(an integer in \[1, 4,096\]\)"
    ):
        load_recipe(path)
    path = write(tmp_path, 'train = 3\n[recipe]\njob = "train_cnn"\n[target]\nplatform = "cpu"\ndevices_per_host = 1\n')
    with pytest.raises(RecipeError, match=r"\[train\] must be a table"):
        load_recipe(path)
    with pytest.raises(RecipeError, match=r"not valid TOML"):
        load_recipe(write(tmp_path, "[recipe\n", "broken.toml"))
    with pytest.raises(RecipeError, match=r"nowhere.toml: no such recipe file"):
        load_recipe(tmp_path / "nowhere.toml")


def test_values_convert_and_record_what_the_file_set(tmp_path):
    recipe = load_recipe(write(tmp_path, CNN + "learning_rate = 1\n"))
    assert recipe.train.learning_rate == 1.0 and isinstance(recipe.train.learning_rate, float)
    assert recipe.train.epochs is None  # left out: the job's default
    assert recipe.multihost.timeout_s == 300.0  # recipe-only keys carry their own default
    assert "train.learning_rate" in recipe.given and "train.epochs" not in recipe.given
    remats = [
        load_recipe(write(tmp_path, CNN), {"train.remat": value}).train.remat
        for value in (True, False, "dots_saveable")
    ]
    assert remats == ["full", "none", "dots_saveable"]  # true and false are read as the policy names


def test_overrides_are_parsed_as_toml_and_checked(tmp_path):
    assert parse_override("train.epochs=2") == ("train.epochs", 2)
    assert parse_override("parallel.mesh=data=8") == ("parallel.mesh", "data=8")
    assert parse_override("train.remat = true") == ("train.remat", True)
    with pytest.raises(RecipeError, match=r"override 'train.epochs' must be written section.key=value"):
        parse_override("train.epochs")
    recipe = load_recipe(write(tmp_path, CNN), dict([parse_override("train.epochs=3")]))
    assert recipe.train.epochs == 3 and "train.epochs" in recipe.given
    with pytest.raises(RecipeError, match=r"override 'epochs' must be written section.key"):
        load_recipe(write(tmp_path, CNN), {"epochs": 3})
