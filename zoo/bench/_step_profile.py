"""Where a step's time goes on XLA:CPU: its profiler trace read against its optimised HLO
(no JAX: the HLO read by ``zoo.measure.hlo``; ``zoo bench peers --profile DIR``).

XLA:CPU runs a compiled program as a sequence of thunks, one per HLO instruction of the
entry computation and of the loops' bodies (a fusion, a collective, a copy ...), and the
JAX profiler records one event per thunk run, named after its instruction. Read with the
HLO the program was compiled to, each event gets a category:

- ``matmul bf16 (YNNPACK)``, ``matmul f32 (generic)``, ...: an instruction that is a dot
  or a fusion whose computation holds one, by its result type and by whether XLA:CPU
  handed it to YNNPACK (a ``__ynn_fusion``) or to its own emitter;
- ``collectives``: all-reduce, all-gather, reduce-scatter, all-to-all,
  collective-permute (their time includes waiting for the other devices);
- ``elementwise and other``: every other instruction.

Loops and calls (``while``, ``conditional``, ``call``) are left out: their bodies'
thunks carry the time. Times are summed over the devices and divided by their number.
On simulated devices the threads of all devices share the machine's cores, so a thunk's
duration includes time spent waiting for a core: compare two programs' shares side by
side (run on the same machine), not their absolute milliseconds.
"""

import collections
import glob
import gzip
import json
import os
import re

from zoo.measure import hlo

CONTAINERS = ("while", "conditional", "call")
TRACE_FILE = "perfetto_trace.json.gz"
HLO_SUFFIX = "after_optimizations.txt"  # what --xla_dump_to writes for the optimised module (XLA:CPU: cpu_after_...)

_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = (\(.*?\)|\S+) ([\w\-]+)\(")


class Instruction(collections.namedtuple("Instruction", "name type opcode calls ynn op_name")):
    """One HLO instruction: its result type text, opcode, the computations it calls, whether
    it is a YNNPACK fusion, and the JAX op it came from (``metadata.op_name``)."""


def read_hlo(text):
    """``(instructions by name, {computation: [Instruction]})`` of optimised HLO text."""
    instructions, computations = {}, {}
    for computation, lines in hlo.computation_lines(text)[0].items():
        computations[computation] = []
        for line in lines:
            match = _INSTRUCTION.match(line)
            if not match:
                continue
            name, type_text, opcode = match.groups()
            calls = tuple(callee for _, callee in hlo.called_computations(line))
            op_name = re.search(r'op_name="([^"]*)"', line)
            instruction = Instruction(
                name, type_text, opcode, calls, "__ynn_fusion" in line, op_name.group(1) if op_name else ""
            )
            instructions[name] = instruction
            computations[computation].append(instruction)
    return instructions, computations


def _dot_type(instruction, computations):
    """The element type of the dot ``instruction`` is or holds (e.g. ``bf16``), else None."""
    if instruction.opcode == "dot":
        return instruction.type.split("[")[0]
    for called in instruction.calls if instruction.opcode == "fusion" else ():
        for inner in computations.get(called, ()):
            found = _dot_type(inner, computations)
            if found:
                return found
    return None


def category(instruction, computations):
    """The category of one instruction's thunk (module docstring); None for loops and calls."""
    opcode = instruction.opcode.removesuffix("-start").removesuffix("-done")
    if opcode in CONTAINERS:
        return None
    if opcode in hlo.COLLECTIVE_KINDS:
        return "collectives"
    dot = _dot_type(instruction, computations)
    if dot:
        return f"matmul {dot} ({'YNNPACK' if instruction.ynn else 'generic'})"
    return "elementwise and other"


def read_trace(trace_dir):
    """The ``traceEvents`` of the newest perfetto trace under ``trace_dir``."""
    paths = sorted(glob.glob(os.path.join(trace_dir, "**", TRACE_FILE), recursive=True), key=os.path.getmtime)
    if not paths:
        raise FileNotFoundError(f"no {TRACE_FILE} under {trace_dir}")
    with gzip.open(paths[-1], "rt") as handle:
        trace = json.load(handle)
    return trace["traceEvents"] if isinstance(trace, dict) else trace


def thunk_times(trace_dir):
    """``{event name: (total microseconds, runs)}`` of the newest perfetto trace under ``trace_dir``."""
    events = read_trace(trace_dir)
    totals = collections.defaultdict(lambda: [0.0, 0])
    for event in events:
        if event.get("ph") == "X":
            total = totals[event["name"]]
            total[0] += event.get("dur", 0.0)
            total[1] += 1
    return {name: tuple(value) for name, value in totals.items()}


def find_hlo(dump_dir, module="train_step"):
    """The optimised HLO text of the newest dumped module whose name holds ``module``."""
    paths = sorted(glob.glob(os.path.join(dump_dir, f"*{module}*{HLO_SUFFIX}")), key=lambda p: (os.path.getmtime(p), p))
    if not paths:
        raise FileNotFoundError(f"no *{module}*{HLO_SUFFIX} under {dump_dir}")
    with open(paths[-1]) as handle:
        return handle.read()


class StepProfile(collections.namedtuple("StepProfile", "categories ops")):
    """Milliseconds per device per step: ``categories`` {category: ms}; ``ops`` a list of
    ``(ms, runs per device, Instruction, category)``, slowest first."""


def step_profile(times, hlo_text, devices, steps=1):
    """``StepProfile`` of ``thunk_times`` read against the program's ``hlo_text``."""
    instructions, computations = read_hlo(hlo_text)
    scale = 1e-3 / (devices * steps)  # microseconds summed over devices -> ms per device per step
    categories, ops = collections.Counter(), []
    for name, (micros, runs) in times.items():
        instruction = instructions.get(name)
        kind = category(instruction, computations) if instruction else None
        if kind is None:
            continue
        categories[kind] += micros * scale
        ops.append((micros * scale, runs // devices, instruction, kind))
    return StepProfile(dict(categories), sorted(ops, key=lambda op: -op[0]))


def format_profiles(layout, profiles, top=8):
    """Markdown: the categories of each side (``profiles``: {side: StepProfile}) side by
    side, then each side's ``top`` slowest instructions."""
    sides = list(profiles)
    kinds = sorted({kind for p in profiles.values() for kind in p.categories}, key=_category_order)
    lines = [
        f"Where the step's time goes under {layout} (XLA:CPU thunks, one profiled step, ms per device; threads "
        "share the cores, so compare shares side by side):",
        "",
        "| category | " + " | ".join(f"{side} ms | {side} share" for side in sides) + " |",
        "|---|" + "---|---|" * len(sides),
    ]
    for kind in kinds + ["all"]:
        cells = []
        for side in sides:
            total = sum(profiles[side].categories.values())
            ms = total if kind == "all" else profiles[side].categories.get(kind, 0.0)
            cells.append(f"{ms:,.0f} | {ms / total:.1%}" if total else "0 | -")
        lines.append(f"| {kind} | " + " | ".join(cells) + " |")
    for side in sides:
        lines += [
            "",
            f"{side}: the {top} slowest instructions",
            "",
            "| ms | runs | instruction | type | category | from |",
        ]
        lines.append("|---|---|---|---|---|---|")
        for ms, runs, instruction, kind in profiles[side].ops[:top]:
            source = instruction.op_name[-70:]
            lines.append(f"| {ms:,.1f} | {runs} | {instruction.name} | {instruction.type[:40]} | {kind} | {source} |")
    return "\n".join(lines)


def _category_order(kind):
    return (not kind.startswith("matmul"), kind != "collectives", kind)
