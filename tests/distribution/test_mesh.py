import jax
import pytest

from zoo.distribution import (
    MeshError,
    describe_mesh,
    make_distribution,
    make_mesh,
    parse_mesh_spec,
)
from zoo.distribution.mesh import resolve_mesh_shape


def test_parse_and_infer_axis():
    assert parse_mesh_spec("data=2, model=-1") == [("data", 2), ("model", -1)]
    assert resolve_mesh_shape([("data", 2), ("model", -1)], 8) == [("data", 2), ("model", 4)]
    assert resolve_mesh_shape([("data", -1)], 8) == [("data", 8)]


def test_make_mesh_uses_all_devices():
    mesh = make_mesh("data=2,model=4")
    assert tuple(mesh.axis_names) == ("data", "model")
    assert tuple(mesh.shape) == (2, 4)
    assert sorted(d.id for d in mesh.devices.flatten()) == sorted(d.id for d in jax.devices())
    assert describe_mesh(make_mesh("data=-1,model=2")) == "data=4,model=2"


@pytest.mark.parametrize(
    "spec, message",
    [
        ("data=2,model=2", "has 4 devices (product of axis sizes) but 8 devices are available"),
        ("data=3,model=4", "has 12 devices"),
        ("data=2,data=4", "duplicate axis name(s) ['data']"),
        ("=8", "empty axis name"),
        ("data=2,,model=4", "empty axis name"),
        ("data=-1,model=-1", "only one axis may be -1"),
        ("data=3,model=-1", "8 devices are not divisible by the product 3"),
        ("data=two", "size 'two' of axis 'data' is not an integer"),
        ("data=0,model=8", "size 0 of axis 'data' must be positive"),
        ("data", "axis 'data' has no size"),
        ("2data=8", "is not an identifier"),
        ("", "non-empty string"),
    ],
)
def test_bad_specs_name_the_numbers(spec, message):
    with pytest.raises(MeshError) as error:
        make_mesh(spec)
    assert message in str(error.value)


def test_strategy_needs_its_axes():
    with pytest.raises(MeshError, match=r"layout 'model' needs mesh axes \['data', 'model'\].*has no \['model'\]"):
        make_distribution("model", "data=8", layout_map=None)
    with pytest.raises(MeshError, match=r"layout 'data' needs mesh axes \['data'\].*has no \['data'\]"):
        make_distribution("data", "batch=8")
    with pytest.raises(MeshError, match="needs a 1-D mesh with axis 'data', got data=2,model=4"):
        make_distribution("data", "data=2,model=4")


def test_unknown_strategy():
    with pytest.raises(ValueError, match=r"unknown layout 'zero'; choose one of \['single', 'data', 'model'\]"):
        make_distribution("zero", "data=8")
    assert make_distribution("single") is None
