"""A recipe's training step compiled (never run) for its target's devices, and whether it fits.

``compile_job_step(job, settings, ...)`` (``compile_recipe_step(recipe)`` for a recipe) builds the model abstractly with the job's own
builder (precision, remat, layout overrides) under the job's own distribution on a
real mesh of this process' devices (simulated CPU devices work), compiles the step
``fit`` runs for one global batch (``compiled_step.compile_fit_step``) and returns the
per-device memory next to the target's.

Fewer devices than the target: a layout that splits no weight over the data axis
(``data``, ``tp``, ``tp+sp``) holds the same per device on a mesh with a smaller data
axis and a proportionally smaller global batch, so the step is compiled there (the
data axis shrinks by the factor the device count falls short). Layouts that split
weights over the data axis (``fsdp``, ``fsdp+tp``, ``context``) need the full count.

Reduced depth (``num_layers``): the per-block cost is the difference of the steps
compiled at ``num_layers`` and ``num_layers - 1`` blocks; the full model's footprint is
extrapolated as ``step(n) + (L - n) x per block`` (``RecipeFit``).
"""

import dataclasses
import math

import jax

from zoo.config.layouts import layout_record
from zoo.distribution.mesh import make_mesh
from zoo.measure.compiled_step import StepMemory, abstract_build, compile_fit_step
from zoo.training.recipes import _budget as plans
from zoo.units import GIB


@dataclasses.dataclass(frozen=True)
class RecipeStep:
    """One compiled step of a recipe: where it was compiled and what it needs per device."""

    path: str
    mesh: str | None  # the mesh compiled on, e.g. "data=2,model=4"
    batch_size: int  # the global batch compiled (scaled with a shrunk data axis)
    num_layers: int  # Transformer blocks compiled
    memory: StepMemory
    compiled: object = dataclasses.field(repr=False, default=None)


@dataclasses.dataclass(frozen=True)
class RecipeFit:
    """A recipe's full-depth per-device footprint extrapolated from two reduced-depth steps."""

    path: str
    target_bytes: int  # [target] device_memory_gib
    num_layers: int  # the model's L
    per_block: int  # peak bytes one more block adds
    fixed: int  # peak bytes of everything but the blocks (embedding, head, logits, optimizer scalars)
    steps: tuple  # (RecipeStep at n - 1 blocks, RecipeStep at n blocks)

    @property
    def estimated_peak(self):
        return self.fixed + self.num_layers * self.per_block

    @property
    def per_block_budget(self):
        """What each block may take: the target's memory less the fixed part, over L."""
        return (self.target_bytes - self.fixed) / self.num_layers

    @property
    def fits(self):
        return self.per_block <= self.per_block_budget

    def format(self):
        return (
            f"{self.path}: per block {self.per_block / GIB:.2f} GiB (budget {self.per_block_budget / GIB:.2f} GiB), "
            f"fixed {self.fixed / GIB:.2f} GiB, estimated peak {self.estimated_peak / GIB:.2f} GiB of "
            f"{self.target_bytes / GIB:.0f} GiB at {self.num_layers} blocks: {'fits' if self.fits else 'DOES NOT FIT'}"
        )


def _mesh_axes(job, settings, target_devices, devices, label):
    """``([(axis, size)] or None, global batch)`` for compiling on ``devices`` devices."""
    layout = job.layout(settings)
    axes = plans.resolve_axes(job.mesh_spec(settings), layout, target_devices)
    batch = settings.batch_size
    if axes is None or devices >= target_devices:
        return axes, batch
    shrink = target_devices // devices
    sizes = dict(axes)
    if layout_record(layout).fsdp_axis or target_devices % devices or sizes.get("data", 1) % shrink:
        raise ValueError(
            f"{label}: layout {layout!r} on mesh {plans.describe_axes(axes)} needs its "
            f"{target_devices} devices to be compiled faithfully; this process has {devices}"
        )
    return [(name, size // shrink if name == "data" else size) for name, size in axes], batch // shrink


def compile_job_step(job, settings, *, target_devices, label, num_layers=None, devices=None, compiler_options=None):
    """``RecipeStep``: ``job``'s training step for ``settings`` (the job's settings dataclass),
    sized for ``target_devices``, compiled on this process' devices.

    ``num_layers`` overrides the model's depth (None: the model as it is; only jobs whose
    ``num_layers`` is known take it); ``devices`` caps the devices used (default all of
    this process'; see the module docstring for compiling on fewer than the target has),
    or lists them: e.g. a TPU topology's, which compile without the chips
    (``jax.experimental.topologies``; ``recipes/tpu-v5e-8/tpu_compile.py``);
    ``label`` names the job in errors (a recipe's path).
    """
    module, _, _ = job.load()
    pool = list(devices) if isinstance(devices, (list, tuple)) else jax.devices()[: devices or None]
    axes, batch = _mesh_axes(job, settings, target_devices, len(pool), label)
    spec = plans.describe_axes(axes)
    mesh = None if axes is None else make_mesh(spec, devices=pool[: math.prod(size for _, size in axes)])
    distribution = job.distribution(module, settings, mesh)
    depth = job.num_layers(module, settings) if num_layers is None else num_layers
    overrides = {} if depth is None else {"num_layers": depth}
    model = abstract_build(
        lambda: job.build(module, settings, **overrides), lambda m: job.compile(module, m, settings), distribution
    )
    x, y = job.batch_shapes(module, settings, model, batch)
    compiled, memory = compile_fit_step(model, distribution, x, y, compiler_options=compiler_options)
    return RecipeStep(label, spec, batch, depth, memory, compiled)


def compile_recipe_step(recipe, *, num_layers=None, devices=None, compiler_options=None):
    """``compile_job_step`` for a recipe: its job, its settings, its target's device count."""
    return compile_job_step(
        recipe.job,
        recipe.job_config(),
        target_devices=recipe.target.devices,
        label=recipe.path,
        num_layers=num_layers,
        devices=devices,
        compiler_options=compiler_options,
    )


def recipe_fit(recipe, *, num_layers=2, devices=None, compiler_options=None):
    """``RecipeFit`` from the steps compiled at ``num_layers - 1`` and ``num_layers`` blocks."""
    if num_layers < 2:
        raise ValueError(
            f"num_layers must be >= 2 (the per-block cost is a difference of two depths), got {num_layers}"
        )
    module, _, _ = recipe.job.load()
    full_depth = recipe.job.num_layers(module, recipe.job_config())
    steps = tuple(
        compile_recipe_step(recipe, num_layers=n, devices=devices, compiler_options=compiler_options)
        for n in (num_layers - 1, num_layers)
    )
    per_block = steps[1].memory.peak - steps[0].memory.peak
    fixed = steps[1].memory.peak - num_layers * per_block
    target = int(recipe.target.device_memory_gib * GIB)
    return RecipeFit(recipe.path, target, full_depth, per_block, fixed, steps)
