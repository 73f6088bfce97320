"""The layout table (zoo/config/layouts.py): each record agrees with itself and with the
distributions built from it."""

import math

import pytest

from zoo import distribution as zd
from zoo.config.layouts import DATA, LAYOUT_TABLE, MODEL, SEQ, layout_record
from zoo.distribution.mesh import resolve_mesh_shape


def _spec_axes(spec):
    return tuple(part.split("=")[0] for part in spec.split(",")) if spec else ()


@pytest.mark.parametrize("name", list(LAYOUT_TABLE))
def test_each_record_names_only_axes_its_mesh_has(name):
    layout = layout_record(name)
    assert set(_spec_axes(layout.default_mesh)) == set(layout.axes), layout.default_mesh
    for field in ("fsdp_axis", "model_axis", "sequence_axis", "expert_axis", "stage_axis"):
        axis = getattr(layout, field)
        assert axis is None or axis in layout.axes, (field, axis)
    assert layout.axes == () or layout.axes[0] == DATA  # the batch is split over data first


@pytest.mark.parametrize("name", [name for name in LAYOUT_TABLE if name != "single"])
def test_the_default_mesh_on_8_devices_is_the_distributions(name):
    """``zd.default_mesh_spec`` reads the record: its mesh has the record's axes, 8 devices in all."""
    sizes = dict(resolve_mesh_shape(zd.parse_mesh_spec(zd.default_mesh_spec(name, 8)), 8))
    assert tuple(sizes) == layout_record(name).axes
    assert math.prod(sizes.values()) == 8


def test_the_splits_the_planner_reads():
    sizes = {DATA: 2, MODEL: 4, SEQ: 4}
    fsdp_tp, tp_sp, context = (layout_record(name) for name in ("fsdp+tp", "tp+sp", "context"))
    assert fsdp_tp.split(sizes, fsdp_tp.fsdp_axis, fsdp_tp.model_axis) == 8  # weights over data x model
    assert fsdp_tp.heads_split and not fsdp_tp.sequence_over_model and not fsdp_tp.gradients_all_reduced
    assert tp_sp.split(sizes, tp_sp.sequence_axis) == 4 and tp_sp.sequence_over_model and not tp_sp.heads_split
    assert tp_sp.gradients_all_reduced and dict(tp_sp.model_options) == {"megatron_sp": True}
    assert context.split(sizes, context.sequence_axis) == 4 and context.fsdp_axis == SEQ


def test_an_unknown_layout_is_named_with_the_choices():
    with pytest.raises(ValueError, match=r"unknown layout 'tp-sp'; choose one of \['single', 'data'"):
        layout_record("tp-sp")
