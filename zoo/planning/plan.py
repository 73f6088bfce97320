"""``zoo plan``: will a training step fit, how fast will it run, and what to change.

A ``PlanRequest`` names a job and its settings (a recipe, or a GPT config with a layout)
and the target: a device count and kind (``zoo.measure.hardware``). ``make_plan``
compiles, never runs, the exact step ``model.fit`` runs there (``measure``), in a
subprocess with that many simulated CPU devices when this process has another count,
and returns a ``Plan``: per-device memory by part, collectives per mesh axis, the
roofline step time and MFU (``roofline``), and whether it fits.

Depth: a deep model is compiled at two reduced depths (1 and 2 blocks) and every figure
is extrapolated per block to the full depth (``depth="auto"`` does this above
``FULL_DEPTH_UP_TO`` blocks, except under remat, where the whole model's temporaries
grow faster than per block and auto compiles it whole; ``depth="full"`` always compiles
the whole model). The plan says which it did. Under layout pipeline the two depths are
stages x repeats apart, and for a model whose blocks follow a periodic pattern (Gemma 2's
local/global alternation, Gemma 3's 5:1) whole periods of it (``_depth``).

Remat on an XLA whose CPU memory analysis does not show it (JAX 0.10:
``compiled_step.memory_analysis_reflects_remat``): the compiled per-block temporaries
keep every activation, so the plan replaces them with what the remat policy saves per
block (``remat_saved_per_block``) plus one block's recomputation, and says so.
"""

import dataclasses
import json
import os
import subprocess
import sys

from zoo.config.choices import AUTO, REMATS_FASTEST_FIRST
from zoo.config.layouts import pipelined
from zoo.kernels.moe import compile_for
from zoo.measure.hardware import device_spec, host_cpu_spec, platform_of
from zoo.planning import roofline
from zoo.planning._activations import remat_caveat, remat_correction, remat_notes, remat_saved_per_block
from zoo.planning._depth import FULL_DEPTH_UP_TO, depth_notes, depth_unit, depths_to_compile
from zoo.planning._where import compiler_caveat, compiles_here, host_state_note, with_simulated_cost
from zoo.planning.measure import StepMeasure, extrapolate, measure_step
from zoo.training.loss_chunk_choice import describe as describe_chunk
from zoo.training.loss_chunk_choice import sized_for
from zoo.units import GIB, format_bytes

__all__ = [
    "FULL_DEPTH_UP_TO",
    "Plan",
    "PlanRequest",
    "compiles_here",
    "make_plan",
    "make_plans",
    "plan_in_process",
    "remat_saved_per_block",
    "with_simulated_cost",
]

RESULT = "PLAN "  # prefix of the worker's result line on stdout


@dataclasses.dataclass(frozen=True)
class PlanRequest:
    """What to compile and for which target; plain values (sent to the worker as JSON)."""

    job: str  # a recipe job: pretrain_gpt | train_cnn | finetune
    config: dict  # fields of the job's settings dataclass (e.g. GPTTrainSettings)
    devices: int  # the target's device count
    device: str = "h100"  # a zoo.measure.hardware.DEVICES name (or cpu)
    device_memory_gib: float | None = None  # None: the device's own
    hosts: int = 1  # the target's hosts: a GPU's NVLink domain is at most one host (devices / hosts)
    depth: str | int = "auto"  # auto | full | a block count to compile at (then extrapolated)
    label: str = ""  # what is planned, in words (a recipe path, "gpt_1b")


@dataclasses.dataclass(frozen=True)
class Plan:
    """A compiled step at the target's size, per device (bytes, seconds)."""

    request: PlanRequest
    step: StepMeasure  # at full depth (extrapolated or compiled whole)
    compiled_depths: tuple  # the depths actually compiled
    full_depth: int | None
    remat_correction: int  # bytes added to the temporaries (negative: removed); 0: none applied
    model_flops: float | None  # per step, whole model, all devices (zoo.measure.mfu); None: no formula
    notes: tuple = ()
    # what the peak means where this XLA's memory analysis cannot show remat, or where a
    # TPU's step was compiled by XLA:CPU ("" where neither): the verdict carries it, so no
    # "fits" or "does not fit" is read as exact
    caveat: str = ""

    @property
    def spec(self):
        """The device kind, its fast-link domain no larger than a host of the target."""
        return target_spec(self.request)

    @property
    def device_memory(self):
        gib = self.request.device_memory_gib
        return int(gib * GIB) if gib else self.spec.memory_bytes

    @property
    def temp(self):
        return self.step.memory["temp"] + self.remat_correction

    @property
    def peak(self):
        return self.step.peak + self.remat_correction

    @property
    def fits(self):
        return self.peak <= self.device_memory

    def parts(self):
        """``{part: bytes}`` per device: the state, and activations + workspace (temporaries less gradients)."""
        m = self.step.memory
        return {
            "weights": m["weights"],
            "gradients": m["gradients"],
            "optimizer state": m["optimizer"] - m.get("host", 0),
            "activations and workspace": max(self.temp - m["gradients"], 0),
        }

    @property
    def time(self):
        return roofline.estimate_step_time(
            flops=self.step.flops,
            bytes_accessed=self.step.bytes_accessed,
            collectives=self.step.collectives,
            mesh_axes=self.step.mesh_axes,
            spec=self.spec,
            op_time=self.step.op_time,
        )

    @property
    def mfu(self):
        return roofline.mfu(self.model_flops, self.time.step_s, self.request.devices, self.spec)

    def sent_per_axis(self):
        """``{"data": bytes, ...}`` each device sends per step over each set of mesh axes."""
        sent = {}
        for row in self.step.collectives:
            if row["axes"]:
                key = ",".join(row["axes"])
                sent[key] = sent.get(key, 0.0) + row["sent_bytes"]
        return sent

    def to_dict(self):
        return {
            "request": dataclasses.asdict(self.request),
            "step": self.step.to_dict(),
            "compiled_depths": list(self.compiled_depths),
            "full_depth": self.full_depth,
            "remat_correction": self.remat_correction,
            "model_flops": self.model_flops,
            "notes": list(self.notes),
            "caveat": self.caveat,
        }

    @classmethod
    def from_dict(cls, values):
        return cls(
            request=PlanRequest(**values["request"]),
            step=StepMeasure.from_dict(values["step"]),
            compiled_depths=tuple(values["compiled_depths"]),
            full_depth=values["full_depth"],
            remat_correction=values["remat_correction"],
            model_flops=values["model_flops"],
            notes=tuple(values["notes"]),
            caveat=values.get("caveat", ""),
        )


def target_spec(request):
    """``request``'s ``DeviceSpec``: the CPU split into its devices, or a GPU whose NVLink
    domain is no larger than one of the target's hosts (4-GPU hosts: 4)."""
    spec = device_spec(request.device)
    if spec.name == "cpu":
        return host_cpu_spec(request.devices)
    per_host = request.devices // max(request.hosts, 1)
    if spec.link_domain and per_host < spec.link_domain:
        return dataclasses.replace(spec, link_domain=per_host)
    return spec


# --- making a plan -----------------------------------------------------------------------


def make_plan(request, *, compiler_options=None):
    """The ``Plan`` of ``request`` (``make_plans``)."""
    return make_plans([request], compiler_options=compiler_options)[0]


def make_plans(requests, *, compiler_options=None):
    """The plans of ``requests`` (one device count): compiled here when ``compiles_here`` (on
    an accelerator by its own compiler, with ``with_simulated_cost`` from one CPU subprocess
    for them all), else in one fresh process that simulates the devices on CPU."""
    import jax

    if not compiles_here(requests[0]):
        return plans_in_subprocess(requests)
    plans = [plan_in_process(request, compiler_options=compiler_options) for request in requests]
    if jax.default_backend() == "cpu" or all(plan.step.op_time is not None for plan in plans):
        return plans  # timed op by op at this device's measured rates: XLA:CPU's count is not needed
    return [with_simulated_cost(plan, cpu) for plan, cpu in zip(plans, plans_in_subprocess(requests), strict=True)]


def plans_in_subprocess(requests):
    """The plans of ``requests`` (one device count) compiled in one fresh process."""
    devices = {r.devices for r in requests}
    if len(devices) != 1:
        raise ValueError(f"one subprocess compiles for one device count, got {sorted(devices)}")
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices.pop()}", JAX_PLATFORMS="cpu")
    payload = json.dumps([dataclasses.asdict(r) for r in requests])
    done = subprocess.run([sys.executable, "-m", "zoo.planning.plan", payload], env=env, capture_output=True, text=True)
    lines = [line[len(RESULT) :] for line in done.stdout.splitlines() if line.startswith(RESULT)]
    if done.returncode or not lines:
        error = next(
            (line for line in reversed(done.stderr.splitlines()) if line.strip()), f"exit status {done.returncode}"
        )
        raise RuntimeError(f"compiling the plan failed: {error.removeprefix('zoo: error: ')}")
    return [_plan_or_raise(json.loads(line)) for line in lines]


def _plan_or_raise(values):
    if "error" in values:
        raise ValueError(values["error"])
    return Plan.from_dict(values)


def _job_and_config(request):
    from zoo.training.recipes import JOBS

    if request.job not in JOBS:
        raise ValueError(f"unknown job {request.job!r}; choose one of {sorted(JOBS)}")
    job = JOBS[request.job]
    module, config_class, _ = job.load()
    known = {f.name for f in dataclasses.fields(config_class)}
    unknown = sorted(set(request.config) - known)
    if unknown:
        raise ValueError(f"job {request.job!r} has no setting(s) {unknown}")
    return job, module, config_class(**request.config)


def plan_in_process(request, *, compiler_options=None):
    """The ``Plan`` of ``request`` compiled on this process' devices (see the module docstring).

    ``compiler_options`` default to ``comms_report.FAST_COMPILE`` on CPU: the HLO passes that
    decide memory, collectives and FLOPs all run; only machine-code optimisation is skipped.
    On an accelerator the device's compiler runs as ``fit``'s does."""
    import jax

    from zoo.measure.comms_report import FAST_COMPILE
    from zoo.measure.compiled_step import memory_analysis_reflects_remat

    if compiler_options is None:  # FAST_COMPILE's flags are XLA:CPU's
        compiler_options = FAST_COMPILE if jax.default_backend() == "cpu" else {}
    spec = device_spec(request.device)  # an unknown device is refused before compiling
    # on the device itself its ops are timed at the rates it was measured to reach (XLA:CPU's program is not the device's)
    rates = roofline.MEASURED_RATES.get(spec.name) if jax.default_backend() != "cpu" else None
    job, module, settings = _job_and_config(request)
    if getattr(settings, "remat", None) == AUTO:
        return _plan_remat_auto(request, compiler_options)
    full_depth = job.num_layers(module, settings)
    remat = getattr(settings, "remat", "none")
    # Blocks that differ (Gemma's local and global layers) are compiled in whole periods of
    # their pattern; a pattern with no period (None) is compiled whole.
    stages, period, unit, why = depth_unit(request, job, settings)
    # remat inside a pipeline's loop: the per-block correction below is not calibrated there (a note says so)
    correct_remat = (
        remat != "none"
        and not memory_analysis_reflects_remat()
        and stages == 1
        and not pipelined(settings.layout)
        and period is not None
    )
    # With remat, the whole model's temporaries grow faster than per block (the gradients'
    # all-reduces, combined, hold more of them at once): 1 and 2 blocks extrapolated
    # under-counted by 16-34% (docs/planning.md), so depth auto compiles every block.
    whole_for_remat = remat != "none" and not correct_remat
    _check_depth(request, settings, period)
    depths = depths_to_compile(
        request, full_depth, needs_two=correct_remat, unit=unit, whole=whole_for_remat or period is None, why=why
    )
    steps, loss_notes = _measure_sized(
        job, settings, request, depths, spec=spec, compiler_options=compiler_options, rates=rates
    )
    step = steps[0] if len(steps) == 1 else extrapolate(steps[0], steps[1], full_depth)
    notes = depth_notes(request, settings, depths, full_depth, period=period, unit=unit, whole=whole_for_remat)
    notes += loss_notes + remat_notes(settings, corrected=correct_remat and len(steps) == 2)
    if note := host_state_note(request.device, getattr(settings, "state_memory", "device")):
        notes.append(note)
    correction = 0
    if correct_remat and len(steps) == 2:
        correction = remat_correction(steps, settings, full_depth, step)
        notes.append(
            f"this XLA's CPU memory analysis does not show remat={remat!r} (JAX 0.10); temporaries corrected by "
            f"{correction / GIB:+.2f} GiB: per block, what the policy saves instead of every activation (docs/planning.md)"
        )
    return Plan(
        request,
        step,
        tuple(d for d in depths if d is not None),
        full_depth,
        correction,
        _model_flops(job, settings, full_depth),
        tuple(notes),
        "; ".join(part for part in (remat_caveat(remat, correction), compiler_caveat(request.device)) if part),
    )


def _check_depth(request, settings, period):
    """Refuse a block count to compile at where the blocks repeat no period (each block does
    not add the same)."""
    if period is None and request.depth not in ("auto", "full"):
        raise ValueError(
            f"depth {request.depth!r}: {settings.config_name}'s per-layer pattern (which blocks are windowed or "
            f"sparse) repeats no period, so its blocks do not each add the same; --depth auto or full compiles the "
            f"whole model"
        )


def _measure_sized(job, settings, request, depths, *, spec, compiler_options, rates):
    """``(steps, notes)``: ``_measure_depths`` with ``--loss-chunk-size auto`` sized for the
    planned device ``spec`` (``sized_for``), not this process' one; a note names auto's choice."""
    with sized_for(None if spec.name == "cpu" else spec.memory_bytes, request.devices) as sizing:
        steps = _measure_depths(job, settings, request, depths, compiler_options=compiler_options, rates=rates)
    return steps, [f"loss_chunk_size auto: {describe_chunk(c.chunk)} ({c.why})" for c in sizing.choices[:1]]


def _measure_depths(job, settings, request, depths, *, compiler_options, rates):
    """The ``StepMeasure`` of ``job``'s step at each of ``depths`` blocks."""
    with compile_for(platform_of(request.device)):  # an MoE layer traces the target's grouped matmul, not the CPU's
        return [
            measure_step(
                job,
                settings,
                target_devices=request.devices,
                label=request.label or request.job,
                num_layers=depth,
                compiler_options=compiler_options,
                rates=rates,
            )
            for depth in depths
        ]


def _plan_remat_auto(request, compiler_options):
    """``remat = "auto"`` planned as the job decides it on its device
    (``zoo.training.remat_choice``): the first of ``REMATS_FASTEST_FIRST`` whose plan fits
    the target, else the last; a note names the policy and what each tried needed."""
    tried = []
    for remat in REMATS_FASTEST_FIRST:
        plan = plan_in_process(
            dataclasses.replace(request, config={**request.config, "remat": remat}), compiler_options=compiler_options
        )
        tried.append(f"{remat} {format_bytes(plan.peak, 2)}")
        if plan.fits:
            break
    verdict = "the fastest that fits" if plan.fits else "none fits: the lightest"
    note = f"remat auto: {remat}, {verdict} (planned: {', '.join(tried)})"
    return dataclasses.replace(plan, notes=(note, *plan.notes))


def _model_flops(job, settings, full_depth):
    """Model FLOPs of one step of the full model, or None where the job has no formula."""
    if job.name != "pretrain_gpt":
        return None
    from zoo.measure.mfu import gpt_flops_per_token
    from zoo.models.gpt.gpt_configs import at_depth, config_by_name

    model_config = at_depth(config_by_name(settings.config_name), full_depth)
    return gpt_flops_per_token(model_config, settings.sequence_length) * settings.batch_size * settings.sequence_length


def main(argv=None):
    """Worker: ``python -m zoo.planning.plan '[request, ...]'`` prints one ``PLAN {json}`` line each."""
    requests = [PlanRequest(**values) for values in json.loads((argv or sys.argv[1:])[0])]
    for request in requests:
        try:
            values = plan_in_process(request).to_dict()
        except (ValueError, RuntimeError) as error:
            values = {"error": str(error)}
        print(RESULT + json.dumps(values), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
