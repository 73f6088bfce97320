"""What the recipe tests share: the recipe files, and plans that skip only for a missing job."""

import functools
import pathlib

import pytest

from zoo.training.recipes import (
    JobUnavailableError,
    UnsupportedKeyError,
    check_recipe,
    load_recipe,
)

ROOT = pathlib.Path(__file__).resolve().parents[2]
RECIPES = ROOT / "recipes"
TARGETS = ("cpu-sim-8", "gpu-1", "gpu-8", "gpu-multihost", "tpu-v4-8", "tpu-v5e-8", "tpu-multihost")
ALL = sorted(path for target in TARGETS for path in (RECIPES / target).glob("*.toml"))
CPU = sorted((RECIPES / "cpu-sim-8").glob("*.toml"))


def ids(paths):
    return [str(path.relative_to(RECIPES)) for path in paths]


def plan_of(recipe, **kwargs):
    """``check_recipe``'s plan, also when only job config fields are missing (the plan is
    then attached to the error); skips, naming it, when the job module cannot be imported."""
    try:
        return check_recipe(recipe, **kwargs)
    except JobUnavailableError as error:
        pytest.skip(f"job not available yet: {error}")
    except UnsupportedKeyError as error:
        assert error.plan is not None, str(error)
        return error.plan


@functools.cache
def checked(path):
    """``(plan, error)`` of ``check_recipe`` on a recipe file, computed once per session."""
    try:
        return check_recipe(load_recipe(path)), None
    except UnsupportedKeyError as error:
        return error.plan, error
    except JobUnavailableError as error:
        return None, error


def write(tmp_path, text, name="recipe.toml"):
    path = tmp_path / name
    path.write_text(text)
    return path


# A small valid recipe the error tests vary (train_cnn: its job is always importable).
CNN = """
[recipe]
job = "train_cnn"
[target]
platform = "cpu"
hosts = 1
devices_per_host = 8
[parallel]
layout = "model"
mesh = "data=2,model=4"
[train]
batch_size = 32
"""
