"""Device meshes from spec strings such as ``"data=2,model=4"``.

A spec is a comma-separated list of ``name=size``. At most one size may be ``-1``; it is
inferred from the device count. Every error names the numbers involved.
"""

import math
import re

import jax
import keras

_AXIS_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class MeshError(ValueError):
    """A mesh spec or mesh that cannot be used with the devices or layout at hand."""


def parse_mesh_spec(spec):
    """Parse ``"data=2,model=-1"`` into ``[("data", 2), ("model", -1)]``.

    Only the syntax is checked here; sizes against the device count in ``resolve_mesh_shape``.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise MeshError(f"mesh spec must be a non-empty string like 'data=2,model=4', got {spec!r}")
    axes = [_parse_axis(part, spec) for part in spec.split(",")]
    _check_unique_names([name for name, _ in axes], spec)
    inferred = [name for name, size in axes if size == -1]
    if len(inferred) > 1:
        raise MeshError(f"mesh spec {spec!r}: only one axis may be -1 (inferred), got {inferred}")
    return axes


def _parse_axis(part, spec):
    name, sep, size_text = part.strip().partition("=")
    name = name.strip()
    if not name:
        raise MeshError(f"mesh spec {spec!r}: empty axis name in {part.strip()!r}")
    if not _AXIS_NAME.match(name):
        raise MeshError(f"mesh spec {spec!r}: axis name {name!r} is not an identifier")
    if not sep:
        raise MeshError(f"mesh spec {spec!r}: axis {name!r} has no size (write {name}=N or {name}=-1)")
    try:
        size = int(size_text.strip())
    except ValueError:
        raise MeshError(f"mesh spec {spec!r}: size {size_text.strip()!r} of axis {name!r} is not an integer") from None
    if size == 0 or size < -1:
        raise MeshError(f"mesh spec {spec!r}: size {size} of axis {name!r} must be positive or -1")
    return name, size


def _check_unique_names(names, spec):
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise MeshError(f"mesh spec {spec!r}: duplicate axis name(s) {duplicates}")


def resolve_mesh_shape(axes, device_count):
    """Fill in the ``-1`` axis and check that the sizes multiply to ``device_count``."""
    known = math.prod(size for _, size in axes if size != -1)
    described = ",".join(f"{n}={s}" for n, s in axes)
    if any(size == -1 for _, size in axes):
        if device_count % known:
            raise MeshError(
                f"mesh {described}: cannot infer the -1 axis, {device_count} devices "
                f"are not divisible by the product {known} of the other axes"
            )
        return [(n, device_count // known if s == -1 else s) for n, s in axes]
    if known != device_count:
        raise MeshError(
            f"mesh {described} has {known} devices (product of axis sizes) but {device_count} devices are available"
        )
    return list(axes)


def make_mesh(spec, devices=None):
    """Build a ``keras.distribution.DeviceMesh`` from a spec string.

    Args:
        spec: e.g. ``"data=8"``, ``"data=2,model=4"``, ``"data=-1,model=2"``.
        devices: the devices to lay out; all of ``jax.devices()`` by default.
    """
    devices = list(jax.devices() if devices is None else devices)
    axes = resolve_mesh_shape(parse_mesh_spec(spec), len(devices))
    names = [n for n, _ in axes]
    shape = tuple(s for _, s in axes)
    return keras.distribution.DeviceMesh(shape=shape, axis_names=names, devices=devices)


def mesh_axis_size(mesh, axis):
    """Size of ``axis`` in ``mesh``, or 1 when the mesh has no such axis."""
    names = list(mesh.axis_names)
    return mesh.shape[names.index(axis)] if axis in names else 1


def require_axes(mesh, axes, purpose):
    """Raise if ``mesh`` lacks any of ``axes``, which ``purpose`` needs."""
    missing = [a for a in axes if a not in mesh.axis_names]
    if missing:
        raise MeshError(
            f"{purpose} needs mesh axes {list(axes)}, but the mesh "
            f"{describe_mesh(mesh)} has no {missing}; add them to the mesh spec "
            f"(an axis of size 1 is allowed)"
        )


def describe_mesh(mesh):
    """``'data=2,model=4'`` for a DeviceMesh."""
    return ",".join(f"{n}={s}" for n, s in zip(mesh.axis_names, mesh.shape))
