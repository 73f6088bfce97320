"""What one compiled training step needs per device: memory, FLOPs, bytes, collectives.

``measure_step`` compiles the step ``fit`` runs (``zoo.training.recipes._compile``:
the job's own model builder, optimizer, precision, remat and distribution, built
abstractly) and reads the compiled program:

- memory: ``memory_analysis()`` (``compiled_step.StepMemory``);
- FLOPs and bytes accessed: ``cost_analysis()``, which counts a ``while`` body once; the
  dot products inside loops (the blockwise and ring attention kernels' tiles) are added
  for their remaining trip counts from the optimised HLO (``loop_dot_flops``);
- collectives per mesh axis and kind, loop trip counts included
  (``comms_report.CommsReport.per_axis``).

``extrapolate`` takes two steps compiled at depths n - g and n (g = 1, or under layout
pipeline g = stages x repeats, the smallest step the layers split into) and returns the
step at depth L: every figure (state, temporaries, FLOPs, bytes, collectives) grows by
the same amount per Transformer block, so ``value(L) = value(n) + (L - n) / g x
(value(n) - value(n - g))``.
"""

import dataclasses
import math
import re
import time

from zoo._compat import hlo_text_with_constants
from zoo.distribution.mesh import parse_mesh_spec
from zoo.measure.comms_report import compiled_report, loop_multiplicities

__all__ = ["StepMeasure", "compiled_cost", "extrapolate", "loop_dot_flops", "measure_step"]

MEMORY_FIELDS = ("weights", "gradients", "optimizer", "temp", "argument", "output", "alias", "host")


@dataclasses.dataclass(frozen=True)
class StepMeasure:
    """One compiled step, per device; plain values (it crosses process boundaries as JSON)."""

    num_layers: int | None  # blocks compiled (None: a model without a depth setting)
    mesh: str | None  # the mesh compiled on, e.g. "data=2,model=4"
    batch_size: int
    memory: dict  # MEMORY_FIELDS -> bytes (StepMemory's fields)
    flops: float  # per device, loop trip counts included
    bytes_accessed: float  # per device (loops counted once: XLA's figure)
    collectives: list  # CommsReport.per_axis() rows: {"axes", "kind", "count", "bytes", "sent_bytes"}
    collectives_exact: bool  # False: some loop around a collective had no known trip count
    compile_s: float  # seconds to build and compile
    # the step's ops at the measured rates of the device that compiled it (roofline.OpTime's
    # fields), None where this device's rates were never measured (roofline.MEASURED_RATES)
    op_time: dict | None = None

    @property
    def mesh_axes(self):
        """``[(axis, size)]`` of the mesh compiled on, in mesh order ([] for one device)."""
        return parse_mesh_spec(self.mesh) if self.mesh else []

    @property
    def axis_sizes(self):
        return dict(self.mesh_axes)

    @property
    def peak(self):
        m = self.memory
        return m["argument"] + m["output"] - m["alias"] + m["temp"]

    def to_dict(self):
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values):
        values = dict(values)
        values["collectives"] = [{**row, "axes": tuple(row["axes"] or ())} for row in values["collectives"]]
        return cls(**values)


def measure_step(job, settings, *, target_devices, label, num_layers=None, compiler_options=None, rates=None):
    """``StepMeasure`` of ``job``'s step for ``settings`` compiled for ``target_devices``;
    with ``rates`` (``roofline.OpRates`` of the device compiling it), its ops timed at them."""
    from zoo.training.recipes import compile_job_step

    start = time.perf_counter()
    step = compile_job_step(
        job,
        settings,
        target_devices=target_devices,
        label=label,
        num_layers=num_layers,
        compiler_options=compiler_options,
    )
    text = hlo_text_with_constants(step.compiled)  # printed once: the collectives and the loop FLOPs both read it
    report = compiled_report(step.compiled, _mesh_of(step.mesh), hlo_text=text)
    times, _ = loop_multiplicities(text)
    flops, accessed = compiled_cost(step.compiled)
    return StepMeasure(
        num_layers=step.num_layers,
        mesh=step.mesh,
        batch_size=step.batch_size,
        memory={name: int(getattr(step.memory, name)) for name in MEMORY_FIELDS},
        flops=flops + loop_dot_flops(text, times),
        bytes_accessed=accessed,
        collectives=report.per_axis(),
        collectives_exact=report.exact,
        compile_s=time.perf_counter() - start,
        op_time=timed_ops(text, rates),
    )


def timed_ops(hlo_text, rates):
    """``roofline.op_step_time`` of a program's optimised HLO as a plain dict, or None without rates."""
    if rates is None:
        return None
    from zoo.measure.hlo_ops import executed_ops
    from zoo.planning.roofline import op_step_time

    return dataclasses.asdict(op_step_time(executed_ops(hlo_text), rates))


def _mesh_of(spec):
    """A ``jax.sharding.AbstractMesh`` naming the axes of ``"data=2,model=4"`` (None: one device)."""
    if not spec:
        return None
    import jax

    axes = parse_mesh_spec(spec)
    return jax.sharding.AbstractMesh(tuple(size for _, size in axes), tuple(name for name, _ in axes))


def compiled_cost(compiled):
    """``(flops, bytes accessed)`` per device from XLA's cost analysis (loops counted once)."""
    analysis = compiled.cost_analysis()
    if isinstance(analysis, (list, tuple)):  # older JAX: one dict per program
        analysis = analysis[0] if analysis else {}
    analysis = analysis or {}
    return float(analysis.get("flops", 0.0)), float(analysis.get("bytes accessed", 0.0))


_DEFINITION = re.compile(r"^\s*(?:ROOT\s+)?%?(?P<name>[\w.\-]+)\s*=\s*(?P<type>\w+\[[0-9,]*\])")
_DOT_OPERAND = re.compile(r"\sdot\(\s*(?:\w+\[[0-9,]*\]\S*\s+)?%?(?P<lhs>[\w.\-]+)")
_CONTRACTING = re.compile(r"lhs_contracting_dims=\{([0-9,]*)\}")


def _dims(type_text):
    return [int(x) for x in type_text[type_text.index("[") + 1 : -1].split(",") if x]


def loop_dot_flops(hlo_text, times):
    """FLOPs that ``cost_analysis`` leaves out: each dot product's executions beyond the
    first (``times``: ``loop_multiplicities``), at 2 x output elements x contracted size."""
    shapes, dots = {}, []
    for line in hlo_text.splitlines():
        definition = _DEFINITION.match(line)
        if definition is None:
            continue
        shapes[definition["name"]] = definition["type"]
        operand = _DOT_OPERAND.search(line)
        if operand and times.get(definition["name"], 1) > 1:
            dots.append((definition["name"], definition["type"], operand["lhs"], _CONTRACTING.search(line)))
    extra = 0.0
    for name, result, lhs, contracting in dots:
        lhs_dims = _dims(shapes[lhs]) if lhs in shapes else []
        contracted = (
            math.prod(lhs_dims[int(k)] for k in contracting.group(1).split(",") if k) if contracting and lhs_dims else 1
        )
        extra += (times[name] - 1) * 2.0 * math.prod(_dims(result)) * contracted
    return extra


def _linear(low, high, steps):
    return high + steps * (high - low)


def extrapolate(low, high, num_layers):
    """The step at ``num_layers`` blocks from steps at ``low.num_layers`` and
    ``high.num_layers`` blocks (every figure linear in the depth)."""
    gap = high.num_layers - low.num_layers
    if gap < 1:
        raise ValueError(f"extrapolation needs a deeper second step, got {low.num_layers} and {high.num_layers} blocks")
    steps = (num_layers - high.num_layers) / gap
    steps = int(steps) if steps == int(steps) else steps  # whole steps keep counts integers
    memory = {  # "host": 0 where a step measured before it was a field leaves it out
        name: int(_linear(low.memory.get(name, 0), high.memory.get(name, 0), steps)) for name in MEMORY_FIELDS
    }
    rows = {(tuple(r["axes"]), r["kind"]): r for r in high.collectives}
    lows = {(tuple(r["axes"]), r["kind"]): r for r in low.collectives}
    zero = {"count": 0, "bytes": 0, "sent_bytes": 0.0}
    collectives = [
        {
            "axes": key[0],
            "kind": key[1],
            **{f: _linear(lows.get(key, zero)[f], row[f], steps) for f in ("count", "bytes", "sent_bytes")},
        }
        for key, row in rows.items()
    ]
    return dataclasses.replace(
        high,
        num_layers=num_layers,
        memory=memory,
        collectives=collectives,
        flops=_linear(low.flops, high.flops, steps),
        bytes_accessed=_linear(low.bytes_accessed, high.bytes_accessed, steps),
        collectives_exact=low.collectives_exact and high.collectives_exact,
        compile_s=low.compile_s + high.compile_s,
        op_time=_extrapolated_op_time(low.op_time, high.op_time, steps),
    )


def _extrapolated_op_time(low, high, steps):
    if low is None or high is None:
        return None
    values = {key: _linear(low[key], high[key], steps) for key in low if key != "unknown_kernels"}
    return {
        **values,
        "ops": int(values["ops"]),
        "unknown_kernels": sorted({*low["unknown_kernels"], *high["unknown_kernels"]}),
    }
