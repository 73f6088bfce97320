"""Recipes: a TOML file that says what to run where (``recipes/<target>/<job>.toml``).

``load_recipe(path)`` reads and validates a file into a ``Recipe`` (the schema, one
dataclass per section, is in ``zoo/training/recipes/_schema.py`` and described key by
key in ``docs/recipes.md``); ``check_recipe(recipe)`` works out its plan without the
target's devices (mesh, layouts, parameter count, memory per device, tokens per step;
see ``_budget.py``); ``run_recipe(recipe)`` joins the processes of a multi-host job
and calls the job function with the job's own settings dataclass
(``recipe.job_config()``). ``compile_recipe_step`` / ``compile_job_step`` compile (never
run) the step for the target's devices (``_compile.py``); ``JOBS`` and
``resolve_axes`` are the jobs a recipe can drive and the mesh a layout gets, which the
planner reads too.

Every error names the file, the ``[section] key`` and the values involved.
"""

import contextlib
import dataclasses
import math

from zoo.training.recipes import _budget as plans
from zoo.training.recipes._budget import RecipeBudget, resolve_axes
from zoo.training.recipes._compile import compile_job_step, compile_recipe_step
from zoo.training.recipes._jobs import JOBS, JobUnavailableError, UnsupportedKeyError
from zoo.training.recipes._schema import (
    SECTIONS,
    MultihostSection,
    RecipeError,
    RecipeSection,
    TargetSection,
    apply_overrides,
    parse_override,
    parse_sections,
    read_toml,
)
from zoo.units import GIB

__all__ = [
    "JOBS",
    "JobUnavailableError",
    "Recipe",
    "RecipeBudget",
    "RecipeError",
    "UnsupportedKeyError",
    "check_recipe",
    "compile_job_step",
    "compile_recipe_step",
    "load_recipe",
    "parse_override",
    "resolve_axes",
    "run_recipe",
]


@dataclasses.dataclass(frozen=True)
class Recipe:
    """A validated recipe file; ``given`` holds the ``"section.key"`` names the file set
    (a key left out takes the job's default)."""

    path: str
    recipe: RecipeSection
    target: TargetSection
    multihost: MultihostSection
    sections: dict  # job section name -> its generated dataclass (zoo.training.recipes._schema.job_sections)
    given: frozenset

    def __getattr__(self, name):
        """``recipe.train``, ``recipe.parallel``, ...: the job sections by name."""
        sections = self.__dict__.get("sections", {})
        if name in sections:
            return sections[name]
        raise AttributeError(f"Recipe has no section or attribute {name!r}")

    @property
    def job(self):
        """The job adapter (``zoo.training.recipes._jobs``) for ``[recipe] job``."""
        return JOBS[self.recipe.job]

    def values(self):
        """``{"section.key": value}`` of every key the file set."""
        split = {dotted: dotted.partition(".") for dotted in self.given}
        return {dotted: getattr(getattr(self, section), key) for dotted, (section, _, key) in split.items()}

    def job_config(self):
        """The job's settings dataclass with every key the file set.

        Raises:
            JobUnavailableError: the job's module or settings class cannot be found.
            UnsupportedKeyError: a key the job's settings have no field for (never dropped).
        """
        _, settings, problems = self._job_config()
        if problems:
            raise _unsupported(self, problems)
        return settings

    def _job_config(self):
        """``(job module, settings from the supported keys, [("section.key", why)])``."""
        with _named(self, f"job {self.job.name!r}"):
            module, config_class, _ = self.job.load()
            values, problems = self.job.config_values(self.given, self.values())
            return module, config_class(**values), problems

    def fingerprint_data(self):
        """Everything but the path, for checking that every process runs the same recipe."""
        return {name: dataclasses.asdict(getattr(self, name)) for name in SECTIONS}


def load_recipe(path, overrides=None):
    """Read and validate the recipe at ``path``.

    Args:
        path: a ``.toml`` recipe file.
        overrides: ``{"section.key": value}`` applied on top of the file (the CLI's
            ``--set train.epochs=1``); checked like the file's own values.

    Raises:
        RecipeError: naming the file, the section and key, the value and what is allowed.
    """
    path = str(path)
    document = apply_overrides(read_toml(path), dict(overrides or {}), path)
    sections, given = parse_sections(document, path)
    own = {name: sections.pop(name) for name in ("recipe", "target", "multihost")}
    return Recipe(path=path, given=given, sections=sections, **own)


def check_recipe(recipe, device_count=None):
    """The recipe's ``RecipeBudget``, worked out without its devices; raises if it cannot run.

    Checks, naming the file and values: the mesh against the device count (``[target]
    hosts x devices_per_host``, or ``device_count``), the global batch against the data
    axis and the hosts, the sequence length against the axes that split it, the model's
    layout rules against its variables (built abstractly, nothing allocated), the
    training state against ``[target] device_memory_gib``, and that the job supports
    every key set.

    Raises:
        RecipeError: any of the above; ``UnsupportedKeyError`` (with the plan attached,
            when everything else passed) for keys the job's settings lack;
            ``JobUnavailableError`` when the job's module cannot be imported.
    """
    module, settings, problems = recipe._job_config()
    _check_output(recipe, settings)
    _check_paths(recipe, module, settings)
    plan = _plan(recipe, module, settings, device_count or recipe.target.devices)
    if problems:
        raise _unsupported(recipe, problems, plan)
    return plan


def _check_output(recipe, settings):
    """A job that saves one ``.keras`` file (its default output is one) needs an output
    path ending in .keras: refused here, before the job runs, naming the key."""
    default = getattr(type(settings)(), "output", None) if dataclasses.is_dataclass(settings) else None
    output = getattr(settings, "output", None)
    if (
        isinstance(default, str)
        and default.endswith(".keras")
        and output is not None
        and not str(output).endswith(".keras")
    ):
        raise RecipeError(
            f"{recipe.path}: [train] output = {output!r}: the job saves a .keras file; give a path ending in .keras"
        )


def _check_paths(recipe, module, settings):
    """What ``zoo recipe run`` would refuse of the job's paths, refused here by the job's
    own check (``Job.check_paths``), naming the file and the recipe key."""
    from zoo.presets import PresetError
    from zoo.training.paths import PathError

    try:
        recipe.job.check_paths(module, settings)
    except PathError as error:
        raise RecipeError(f"{recipe.path}: {_key_of(recipe, error.flag)} = {error.path!r}: {error.problem}") from None
    except PresetError as error:
        raise RecipeError(f"{recipe.path}: {_key_of(recipe, '--output')}: {error}") from None


def _key_of(recipe, flag):
    """``[section] key`` of the recipe key a job flag (``--checkpoint-dir``) stands for."""
    field = flag.lstrip("-$").lower().replace("-", "_")
    dotted = next((key for key, name in recipe.job.fields().items() if name == field), None)
    if dotted is None:
        return flag
    section, key = dotted.split(".", 1)
    return f"[{section}] {key}"


def _plan(recipe, module, settings, devices):
    job, target = recipe.job, recipe.target
    layout, spec = job.layout(settings), job.mesh_spec(settings)
    with _named(recipe, f"[parallel] mesh {spec!r} (layout {layout!r}) on {_devices_text(recipe, devices)}"):
        axes = resolve_axes(spec, layout, devices)
    mesh = None if axes is None else plans.AbstractDeviceMesh(axes)
    context = f"layout {layout!r} on mesh {plans.describe_axes(axes)}, model {job.describe_model(settings)}"
    with _named(recipe, context):
        distribution = job.distribution(module, settings, mesh)
        batch, sequence = settings.batch_size, job.sequence_length(settings)
        data_shards, sequence_shards = plans.check_batch(distribution, axes, layout, batch, sequence, target.hosts)
        from zoo.layers import float_parameter_count  # Keras: imported once a model is built

        model, slots, layout_axes = plans.build_abstract(job, module, settings, distribution)
        job.check_inputs(settings, model)
        weights, gradients, optimizer = plans.memory_per_device(model, slots, layout_axes, dict(axes or []))
        plans.check_memory(target, weights + gradients + optimizer, layout, plans.describe_axes(axes))
    return RecipeBudget(
        path=recipe.path,
        job=job.name,
        description=recipe.recipe.description,
        model=job.describe_model(settings),
        layout=layout,
        mesh=plans.describe_axes(axes),
        platform=target.platform,
        hosts=target.hosts,
        devices=devices,
        parameters=float_parameter_count(model),  # a quantized kernel as its float one
        trainable_parameters=int(sum(math.prod(v.shape) for v in model.trainable_variables)),
        weight_bytes=weights,
        gradient_bytes=gradients,
        optimizer_bytes=optimizer,
        device_memory_bytes=int(target.device_memory_gib * GIB) if target.device_memory_gib else None,
        batch_size=batch,
        data_shards=data_shards,
        sequence_length=sequence,
        sequence_shards=sequence_shards,
        accumulation=job.accumulation(settings),
        flops_per_step=job.flops_per_step(settings, model),
        peak_flops_per_device=recipe.logging.peak_tflops * 1e12 if recipe.logging.peak_tflops else None,
        notes=tuple(plans.notes_for(axes, target, weights + gradients + optimizer)),
    )


def _devices_text(recipe, devices):
    target = recipe.target
    if devices == target.devices:
        return f"{devices} devices ([target] hosts={target.hosts} x devices_per_host={target.devices_per_host})"
    return f"{devices} devices"


def _unsupported(recipe, problems, plan=None):
    job, sections = recipe.job, {}
    for dotted, why in problems:
        sections.setdefault(dotted.split(".")[0], []).append(why)
    listed = "; ".join(f"[{section}] " + ", ".join(whys) for section, whys in sections.items())
    settings = job.settings_class.__name__
    return UnsupportedKeyError(
        f"{recipe.path}: job {job.name!r} (zoo.config.settings.{settings}) does not support {listed}: "
        f"remove these keys, or add the fields to {settings}",
        [dotted for dotted, _ in problems],
        plan,
    )


@contextlib.contextmanager
def _named(recipe, context):
    """Re-raise a library ``ValueError`` as ``RecipeError`` naming the file and ``context``."""
    try:
        yield
    except RecipeError as error:
        if not str(error).startswith(recipe.path):
            error.args = (f"{recipe.path}: {error}",)  # keep the class (JobUnavailableError, ...)
        raise
    except ValueError as error:
        raise RecipeError(f"{recipe.path}: {context}: {error}") from error


def run_recipe(recipe, *, coordinator_address=None, process_id=None, report=print):
    """Run the recipe's job on this process's share of the target; returns the job's result.

    Joins the multi-host job first (``zoo.distribution.multihost.initialize``, before
    anything touches the devices; a no-op for one host), checks the platform and device
    count JAX found against ``[target]``, prints the plan on process 0, checks every
    process runs the same recipe, then calls the job function with ``job_config()``.

    Args:
        coordinator_address: overrides ``[multihost] coordinator_address``; both absent,
            the environment or the cluster (SLURM, Cloud TPU) provide it.
        process_id: this process's index; absent, the environment or cluster provide it.
        report: where process 0's lines go (other processes stay quiet).
    """
    from zoo.distribution import multihost

    _join(recipe, coordinator_address, process_id)
    _check_devices(recipe)
    settings = recipe.job_config()
    plan = check_recipe(recipe, device_count=recipe.target.devices)
    say = report if multihost.is_primary() else _quiet
    for line in plan.format():
        say(line)
    multihost.check_processes_agree(recipe=multihost.fingerprint(recipe.fingerprint_data()))
    _, _, function = recipe.job.load()
    return function(settings, report=say)


def _quiet(*_):
    pass


def _join(recipe, coordinator_address, process_id):
    from zoo.distribution import multihost

    target = recipe.target
    # One process per host sees all of its GPUs; JAX's SLURM/Open MPI default is one GPU per process.
    local_ids = list(range(target.devices_per_host)) if target.platform == "gpu" and target.hosts > 1 else None
    multihost.initialize(
        coordinator_address or recipe.multihost.coordinator_address,
        target.hosts,
        process_id,
        timeout_s=recipe.multihost.timeout_s,
        local_device_ids=local_ids,
    )


def _check_devices(recipe):
    import jax

    from zoo.distribution import describe_devices

    target, devices = recipe.target, jax.devices()
    found = f"JAX found {len(devices)} {devices[0].platform} device(s) in {jax.process_count()} process(es) ({describe_devices()})"
    if devices[0].platform != target.platform:
        raise RecipeError(f"{recipe.path}: [target] platform is {target.platform!r} but {found}")
    if len(devices) != target.devices or jax.process_count() != target.hosts:
        raise RecipeError(
            f"{recipe.path}: [target] hosts={target.hosts} x devices_per_host={target.devices_per_host} = "
            f"{target.devices} devices, but {found}; expose exactly those (CUDA_VISIBLE_DEVICES, "
            f"TPU_VISIBLE_CHIPS) or use the recipe of the target you have"
        )
