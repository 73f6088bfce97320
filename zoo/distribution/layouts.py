"""Checked layouts: a layout rule must match a variable and split it evenly.

Keras' ``ModelParallel`` silently replicates a variable whose path no rule matches, and
leaves an unused rule unnoticed (keras-hub#2806: a renamed layer quietly trains
unsharded). ``CheckedModelParallel`` checks every variable as Keras creates it (rank
and divisibility, naming the numbers) and remembers which rules matched, so
``check_layout_map`` can reject rules that matched nothing.
"""

import re

import keras

INT4_PARTS = ("kernel", "kernel_scale", "kernel_zero")  # Keras' int4 kernel, flattened to 2-D, and its blocks' scales


class LayoutError(ValueError):
    """A layout rule that matches nothing, or a layout that does not fit its variable."""


def rule_for_path(layout_map, path):
    """The key of ``layout_map`` whose rule Keras applies to ``path``, or None.

    Uses the LayoutMap's own lookup (exact key, else regex), so it agrees with Keras.
    """
    layout = layout_map[path]
    if layout is None:
        return None
    return next(key for key in layout_map if layout_map[key] is layout)


def check_variable_layout(path, shape, layout, mesh, rule=None):
    """Raise unless ``layout`` has one entry per dimension and splits each evenly."""
    where = f"variable {path!r} {tuple(shape)}" + (f" (rule {rule!r})" if rule else "")
    if len(layout.axes) != len(shape):
        raise LayoutError(
            f"{where}: layout {layout.axes} has {len(layout.axes)} entries for a rank-{len(shape)} variable"
        )
    sizes = dict(zip(mesh.axis_names, mesh.shape))
    for dim, (size, axis) in enumerate(zip(shape, layout.axes)):
        for name in _axis_names(axis):
            if name not in sizes:
                raise LayoutError(f"{where}: mesh axis {name!r} is not in the mesh {sizes}")
        split = _split_count(axis, sizes)
        if size % split:
            raise LayoutError(
                f"{where}: dimension {dim} of size {size} is not divisible by mesh axis {axis!r} of size {split}"
            )


def _axis_names(axis):
    if axis is None:
        return ()
    return tuple(axis) if isinstance(axis, (tuple, list)) else (axis,)


def _split_count(axis, sizes):
    count = 1
    for name in _axis_names(axis):
        count *= sizes[name]
    return count


def mark_weight_shard_axis(layout_map, axis):
    """Record on ``layout_map`` that its layout also splits weights over mesh axis
    ``axis`` (FSDP), e.g. ``"data"`` for ``fsdp+tp``; returns ``layout_map``.

    Rules place the weights that layout rules place. The zoo's tensor-parallel layers
    place their own weights over the model axis and read this mark (through the
    distribution's ``weight_shard_axis``) to split them over ``axis`` as well. Any
    distribution built on the map carries it, whoever builds it."""
    setattr(layout_map, _WEIGHT_SHARD_AXIS, axis)
    return layout_map


def marked_weight_shard_axis(layout_map):
    """The axis ``mark_weight_shard_axis`` recorded on ``layout_map``, or None."""
    return getattr(layout_map, _WEIGHT_SHARD_AXIS, None)


_WEIGHT_SHARD_AXIS = "zoo_weight_shard_axis"  # attribute name on a keras LayoutMap


def mark_stacked_weights(layout_map, pattern, lead):
    """Record on ``layout_map`` that the weights whose path matches ``pattern`` (a regex,
    as a rule's) are stacked blocks', each ``lead`` stacking dimensions ((R, L/R) of a
    ``PipelinedBlocks``) before a block's own; returns ``layout_map``. A split that a
    distribution adds by itself (``ContextParallel``'s FSDP over ``seq``) then lands on
    a block's own dimensions, never on one the loop over the blocks slices."""
    setattr(layout_map, _STACKED_WEIGHTS, (re.compile(pattern), lead))
    return layout_map


def stacking_dimensions(layout_map, path):
    """How many leading stacking dimensions the weight at ``path`` has, as marked by
    ``mark_stacked_weights`` on ``layout_map`` (0: not stacked, or no mark, or no map)."""
    mark = getattr(layout_map, _STACKED_WEIGHTS, None)
    return mark[1] if mark is not None and mark[0].match(path) else 0


_STACKED_WEIGHTS = "zoo_stacked_weights"  # attribute name on a keras LayoutMap


class CheckedModelParallel(keras.distribution.ModelParallel):
    """``keras.distribution.ModelParallel`` that checks each variable's layout.

    Behaves exactly like ``ModelParallel``; in addition, when Keras asks for a
    variable's layout it raises ``LayoutError`` if the rule does not fit the variable,
    and it records which rules matched (see ``unmatched_rules``).

    ``weight_shard_axis``: a mesh axis the layout also splits weights over (FSDP),
    e.g. ``"data"`` under ``fsdp+tp``; None (the default) takes the one the layout map
    is marked with (``mark_weight_shard_axis``; the Transformer models' ``fsdp+tp``
    maps are). The zoo's tensor-parallel layers, which place their own weights, read it.
    """

    def __init__(self, *, layout_map, batch_dim_name=None, weight_shard_axis=None, **kwargs):
        _check_rules_use_mesh_axes(layout_map)
        super().__init__(layout_map=layout_map, batch_dim_name=batch_dim_name, **kwargs)
        self.matched_rules = set()
        weight_shard_axis = weight_shard_axis or marked_weight_shard_axis(layout_map)
        if weight_shard_axis is not None and weight_shard_axis not in self.device_mesh.axis_names:
            raise LayoutError(
                f"weight_shard_axis {weight_shard_axis!r} is not an axis of the mesh, which has axes "
                f"{list(self.device_mesh.axis_names)}"
            )
        self._weight_shard_axis = weight_shard_axis

    @property
    def weight_shard_axis(self):
        """The mesh axis weights are also split over (FSDP), or None."""
        return self._weight_shard_axis

    def get_variable_layout(self, variable):
        layout = super().get_variable_layout(variable)
        rule = rule_for_path(self._layout_map, variable.path)
        if rule is not None:
            self.matched_rules.add(rule)
        packed = self._packed_int4_layout(variable)
        if packed is not None:
            return packed
        check_variable_layout(variable.path, variable.shape, layout, self.device_mesh, rule)
        return layout

    def _packed_int4_layout(self, variable):
        """The layout of a part of Keras' int4 kernel, or None for any other variable.

        Keras stores an int4 kernel flattened to 2-D, (input rows, output columns packed two
        to a byte), with its scales and zero points (row blocks, output columns), where the
        layout rule was written for the float kernel (e.g. FSDP's (C, H, D) ->
        ``("data", None, None)``). Each part is split on its row dimension over the rule's
        first axis and on its columns over a second one (``fsdp+tp``'s (C, H, D) ->
        ``("data", "model", None)``: the rows over data, the columns over model), each where
        it divides them, else whole: the input rows carry FSDP's split, and no part is whole
        on every device (a Dense's packed kernel keeps its float kernel's 2-D layout; its
        scales and zero points are split so too).
        A stacked block's parts (``mark_stacked_weights``) are the same behind their
        stacking dimensions, which stay whole."""
        base, _, name = variable.path.rpartition("/")
        lead = stacking_dimensions(self._layout_map, variable.path)  # (R, L/R) of a stack, else none
        if name not in INT4_PARTS or len(variable.shape) != lead + 2 or (name == "kernel" and variable.dtype != "int8"):
            return None  # a float kernel of the wrong rank stays an error (check_variable_layout)
        rule = rule_for_path(self._layout_map, f"{base}/kernel")
        if rule is None or (name == "kernel" and len(self._layout_map[rule].axes) == lead + 2):
            return None  # no rule, or a Dense's packed kernel: the float kernel's 2-D layout fits it as it is
        self.matched_rules.add(rule)
        axes = tuple(axis_name for axis in self._layout_map[rule].axes[lead:] for axis_name in _axis_names(axis))
        sizes = dict(zip(self.device_mesh.axis_names, self.device_mesh.shape))
        # (rows, columns): the rule's first axis on the rows, a second (tensor parallelism inside
        # FSDP: the float kernel's other split) on the columns, each where it divides them
        parts = [axis if variable.shape[lead + i] % sizes[axis] == 0 else None for i, axis in enumerate(axes[:2])]
        return keras.distribution.TensorLayout(
            [*self._layout_map[rule].axes[:lead], *parts, *[None] * (2 - len(parts))], self.device_mesh
        )

    @property
    def layout_map(self):
        return self._layout_map

    def unmatched_rules(self):
        """Rules no variable created under this distribution has matched (in order)."""
        return [key for key in self._layout_map if key not in self.matched_rules]


def _check_rules_use_mesh_axes(layout_map):
    mesh = layout_map.device_mesh
    for key in layout_map:
        for axis in layout_map[key].axes:
            for name in _axis_names(axis):
                if name not in mesh.axis_names:
                    raise LayoutError(
                        f"layout rule {key!r} -> {layout_map[key].axes} uses mesh axis "
                        f"{name!r}, but the mesh has axes {list(mesh.axis_names)}"
                    )


def check_layout_map(layout_map, model):
    """Raise ``LayoutError`` if a rule matches none of ``model``'s variables.

    Also checks every matched variable's rank and divisibility. Returns a dict
    ``{rule: [variable paths]}``.
    """
    matches = {key: [] for key in layout_map}
    for variable in model.variables:
        rule = rule_for_path(layout_map, variable.path)
        if rule is None:
            continue
        matches[rule].append(variable.path)
        check_variable_layout(variable.path, variable.shape, layout_map[rule], layout_map.device_mesh, rule)
    raise_if_unmatched([key for key, paths in matches.items() if not paths], model)
    return matches


def raise_if_unmatched(rules, model):
    """Raise ``LayoutError`` naming ``rules`` (which matched nothing) and the model's paths."""
    if rules:
        paths = ", ".join(v.path for v in model.variables)
        raise LayoutError(
            f"layout rule(s) {rules} match no variable of model {model.name!r}; its variable paths are: {paths}"
        )


def sharding_summary(model):
    """Rows ``(path, shape, spec)`` giving how each of ``model``'s weights is placed."""
    rows = []
    for variable in model.weights:
        sharding = getattr(variable.value, "sharding", None)
        spec = getattr(sharding, "spec", None)
        rows.append((variable.path, tuple(variable.shape), _format_spec(spec)))
    return rows


def _format_spec(spec):
    if spec is None:
        return "single device"
    if all(entry is None for entry in spec):
        return "replicated"
    return "(" + ", ".join("-" if e is None else str(e) for e in spec) + ")"


def format_sharding_summary(model):
    """The sharding summary as aligned text lines."""
    rows = sharding_summary(model)
    width = max(len(path) for path, _, _ in rows)
    return [f"{path:<{width}}  {str(shape):<20} {spec}" for path, shape, spec in rows]
