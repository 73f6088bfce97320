import keras
import pytest

from zoo.distribution import (
    LayoutError,
    build_distributed,
    check_layout_map,
    distribution_for,
    make_distribution,
    make_mesh,
)
from zoo.models import SmallCNN


def _small_cnn(**kwargs):
    return lambda: SmallCNN(num_classes=4, image_size=16, **kwargs)


def test_rule_matching_no_variable_is_an_error():
    mesh = make_mesh("data=2,model=4")
    layout_map = SmallCNN.get_layout_map(mesh)
    layout_map[r".*block9_conv/kernel"] = (None, None, None, "model")
    with pytest.raises(
        LayoutError, match=r"layout rule\(s\) \['\.\*block9_conv/kernel'\] match no variable of model 'small_cnn'"
    ):
        build_distributed(_small_cnn(), make_distribution("model", mesh, layout_map))


def test_check_layout_map_on_a_built_model():
    mesh = make_mesh("data=2,model=4")
    model = SmallCNN(num_classes=4, image_size=16)
    matches = check_layout_map(SmallCNN.get_layout_map(mesh), model)
    assert matches[r".*block\d+_conv/kernel"] == ["block1_conv/kernel", "block2_conv/kernel", "block3_conv/kernel"]
    layout_map = SmallCNN.get_layout_map(mesh)
    layout_map["renamed_dense/kernel"] = (None, "model")
    with pytest.raises(LayoutError, match="renamed_dense/kernel"):
        check_layout_map(layout_map, model)


def test_indivisible_weight_names_variable_dimension_and_axis():
    distribution = distribution_for(SmallCNN, "model", "data=2,model=4")
    with pytest.raises(LayoutError) as error:
        build_distributed(_small_cnn(filters=(16, 30, 64)), distribution)
    message = str(error.value)
    assert "variable 'block2_conv/kernel' (3, 3, 16, 30)" in message
    assert "dimension 3 of size 30 is not divisible by mesh axis 'model' of size 4" in message


def test_rank_mismatch_is_an_error():
    mesh = make_mesh("data=2,model=4")
    layout_map = keras.distribution.LayoutMap(mesh)
    layout_map[r".*logits/bias"] = (None, "model")
    with pytest.raises(LayoutError, match=r"layout \(None, 'model'\) has 2 entries for a rank-1 variable"):
        build_distributed(_small_cnn(), make_distribution("model", mesh, layout_map))


def test_rule_naming_an_axis_the_mesh_lacks():
    mesh = make_mesh("data=2,model=4")
    layout_map = keras.distribution.LayoutMap(mesh)
    with pytest.raises(
        ValueError, match=r"Valid axis names: \{'data', 'model'\}|\{'model', 'data'\}, Got \{'tensor'\}"
    ):
        layout_map[r".*logits/kernel"] = ("tensor", None)
    bare = keras.distribution.LayoutMap(None)
    bare[r".*logits/kernel"] = ("tensor", None)
    bare._device_mesh = mesh  # a map filled before its mesh was known
    with pytest.raises(LayoutError, match=r"uses mesh axis 'tensor', but the mesh has axes \['data', 'model'\]"):
        make_distribution("model", mesh, bare)


def test_layout_map_for_another_mesh():
    layout_map = SmallCNN.get_layout_map(make_mesh("data=2,model=4"))
    with pytest.raises(LayoutError, match="built for mesh data=2,model=4, not for the mesh data=1,model=8"):
        make_distribution("model", make_mesh("data=1,model=8"), layout_map)
