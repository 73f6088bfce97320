"""Meshes, layouts and distributions (no model-specific code here)."""

from zoo.distribution.context_parallel import ContextParallel
from zoo.distribution.describe import describe, print_description
from zoo.distribution.devices import (
    DeviceCountError,
    describe_devices,
    simulate_cpu_devices,
)
from zoo.distribution.distributions import (
    build_distributed,
    data_parallel_size,
    default_mesh_candidates,
    default_mesh_spec,
    distribution_for,
    global_distribution,
    make_distribution,
    place_batch,
)
from zoo.distribution.expert_parallel import ExpertParallel
from zoo.distribution.layouts import (
    CheckedModelParallel,
    LayoutError,
    check_layout_map,
    format_sharding_summary,
    sharding_summary,
)
from zoo.distribution.mesh import (
    MeshError,
    describe_mesh,
    make_mesh,
    mesh_axis_size,
    parse_mesh_spec,
)

__all__ = [
    "ContextParallel",
    "CheckedModelParallel",
    "DeviceCountError",
    "ExpertParallel",
    "LayoutError",
    "MeshError",
    "build_distributed",
    "global_distribution",
    "check_layout_map",
    "data_parallel_size",
    "default_mesh_candidates",
    "default_mesh_spec",
    "describe",
    "describe_devices",
    "describe_mesh",
    "distribution_for",
    "format_sharding_summary",
    "make_distribution",
    "make_mesh",
    "mesh_axis_size",
    "parse_mesh_spec",
    "place_batch",
    "print_description",
    "sharding_summary",
    "simulate_cpu_devices",
]
