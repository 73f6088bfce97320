"""The collectives and memory of a compiled program, read from its optimised HLO.

Given a compiled step (``zoo.measure.comms_report`` builds and compiles them), read the
**optimised** HLO, i.e. the
program the devices run after GSPMD partitioning and XLA's passes, and list every
collective in it:

=====================  ============================================================
field                  meaning (all per device: SPMD programs are the same on each)
=====================  ============================================================
kind                   all-reduce, all-gather, reduce-scatter, all-to-all,
                       ragged-all-to-all, collective-permute (async ``*-start`` ops
                       count as their kind)
shape                  the result type, e.g. ``f32[2,16,32]``
bytes                  the full buffer the collective works on: the result of an
                       all-reduce / all-gather / all-to-all / collective-permute, the
                       *operand* of a reduce-scatter (result x group size), the
                       *receive buffer* of a ragged-all-to-all (its result: sized for
                       the most a device can receive, not what it does)
operand_bytes          ragged-all-to-all only: its send buffer (first operand, its type
                       looked up in the text; None where the text lacks it)
sent_bytes             what a device sends with the usual ring algorithms:
                       all-reduce 2(n-1)/n x bytes, all-gather, reduce-scatter and
                       all-to-all (n-1)/n x bytes, collective-permute 1 x bytes; a
                       ragged-all-to-all: an upper bound, its whole send buffer
                       (``operand_bytes``; the receive buffer where that is unknown):
                       the rows it sends are its ``send_sizes`` operand, known only
                       when it runs (zoo.bench.moe counts them from the routing)
replica_groups         the device groups (logical ids = positions in the mesh)
axes                   the mesh axes those groups span, e.g. ``('model',)``
executions             how often it runs per call of the program (loop trip counts)
=====================  ============================================================

and the compiler's memory analysis (argument, output, temporary bytes per device).

A collective inside a loop body (``while``, e.g. a ``jax.lax.fori_loop`` or ``scan``
of a ring kernel) is listed once, with ``executions``: how often it runs per call of
the program, the product of XLA's known trip counts of the loops around it
(``loop_multiplicities``). Every total of ``CommsReport`` (``count``, ``buffers``,
``total_bytes``, ``sent_bytes``, ``summary``, ``per_axis``) counts executions. Where
a loop around a collective has no known trip count it counts once, and
``CommsReport.exact`` is False: the totals are lower bounds.
"""

import dataclasses
import importlib.metadata
import math
import re

import numpy as np

from zoo.measure.hlo_text import ARRAY, DTYPE_BYTES, called_computations, computation_lines, loop_multiplicities
from zoo.units import format_bytes

__all__ = [
    "COLLECTIVE_KINDS",
    "FAST_COMPILE",
    "CollectiveOp",
    "CommsReport",
    "MemoryUsage",
    "called_computations",
    "computation_lines",
    "loop_multiplicities",
    "parse_collectives",
    "report_of",
]


def _has_legacy_cpu_emitters():
    """JAX 0.10's XLA:CPU can still emit fusions with its elemental emitters; JAX 0.12's
    has only the MLIR fusion emitters and refuses the option that chooses."""
    jaxlib = tuple(int(part) for part in importlib.metadata.version("jaxlib").split(".")[:2])
    return jaxlib < (0, 12)


# Compiler options that skip LLVM's optimisations: the HLO passes (partitioning,
# collective combining, buffer assignment) still run, so collectives and memory are
# those of the optimised program; the machine code is slower. On JAX 0.10 also the
# elemental fusion emitters, which compile in about two thirds of the time (gpt_small
# tp step: 3.6 -> 2.5 s) to the same memory (peak within 128 bytes of 37.3 MB), FLOPs
# (within 0.005%) and collectives. For tests, compile-only plans and benchmarks.
FAST_COMPILE = {
    "xla_backend_optimization_level": 0,
    "xla_llvm_disable_expensive_passes": True,
    **({"xla_cpu_use_fusion_emitters": False} if _has_legacy_cpu_emitters() else {}),
}

COLLECTIVE_KINDS = (
    "all-reduce",
    "all-gather",
    "reduce-scatter",
    "all-to-all",
    "ragged-all-to-all",
    "collective-permute",
)


_INSTRUCTION = re.compile(
    r"^\s*(?:ROOT\s+)?%?(?P<name>[\w.\-]+)\s*=\s*(?P<type>.+?)\s+"
    r"(?P<kind>all-reduce|all-gather|reduce-scatter|all-to-all|ragged-all-to-all|collective-permute)(?P<start>-start)?\("
)
# a ragged-all-to-all's first operand (its send buffer): its type where printed, its name
_FIRST_OPERAND = re.compile(
    r"ragged-all-to-all(?:-start)?\(\s*(?:(?P<type>[a-z]+[0-9a-z]*\[[0-9,]*\])\S*\s+)?%?(?P<name>[\w.\-]+)"
)


@dataclasses.dataclass(frozen=True)
class CollectiveOp:
    """One collective instruction of the optimised HLO (sizes per device, per execution)."""

    name: str  # HLO instruction name
    kind: str  # one of COLLECTIVE_KINDS
    shape: str  # result type, e.g. "f32[2,16,32]" (several for a combined collective)
    buffers: int  # arrays it moves: XLA combines independent collectives into one op
    elements: int  # elements of ``bytes`` below
    bytes: int  # the full buffer: see the module docstring
    group_size: int  # devices per replica group (n)
    replica_groups: tuple  # ((0, 1, 2, 3), (4, 5, 6, 7)); source-target pairs for a permute
    axes: tuple | None  # mesh axes the groups span; None without a mesh
    executions: int = 1  # times it runs per call of the program, loop trip counts included
    exact: bool = True  # False: a loop around it has no known trip count (executions is a lower bound)
    operand_bytes: int | None = None  # ragged-all-to-all: its send buffer (None: not in the text, or another kind)

    @property
    def sent_bytes(self):
        """Bytes one device sends for this collective (ring algorithms); for a
        ragged-all-to-all the most it can send: its whole send buffer."""
        n = self.group_size
        if self.kind == "ragged-all-to-all":
            return float(self.bytes if self.operand_bytes is None else self.operand_bytes)
        if self.kind == "collective-permute":
            return float(self.bytes)
        factor = 2.0 if self.kind == "all-reduce" else 1.0
        return factor * (n - 1) / n * self.bytes if n > 1 else 0.0


@dataclasses.dataclass(frozen=True)
class MemoryUsage:
    """``compiled.memory_analysis()`` in bytes per device (None where the backend has none)."""

    argument_bytes: int | None
    output_bytes: int | None
    temp_bytes: int | None
    alias_bytes: int | None

    @property
    def peak_bytes(self):
        """Arguments + outputs + temporaries - outputs aliasing (donated) arguments."""
        parts = (self.argument_bytes, self.output_bytes, self.temp_bytes)
        if any(p is None for p in parts):
            return None
        return sum(parts) - (self.alias_bytes or 0)


@dataclasses.dataclass
class CommsReport:
    """Every collective of one compiled program, and its memory analysis; totals are per call,
    each collective counted as often as it runs (``CollectiveOp.executions``)."""

    collectives: list  # [CollectiveOp] in program order
    memory: MemoryUsage
    mesh_axes: dict  # {axis name: size}, empty without a mesh
    compiled: object = dataclasses.field(default=None, repr=False, compare=False)  # the program, callable

    def select(self, kind=None, axes=None):
        """The collectives of ``kind`` (or all) spanning exactly ``axes`` (a tuple, or a name)."""
        if isinstance(axes, str):
            axes = (axes,)
        return [
            op
            for op in self.collectives
            if (kind is None or op.kind == kind) and (axes is None or op.axes == tuple(axes))
        ]

    @property
    def exact(self):
        """False if a loop around some collective has no known trip count: totals are lower bounds."""
        return all(op.exact for op in self.collectives)

    def count(self, kind=None, axes=None):
        """Number of collectives executed per call (an instruction in a loop counts once per trip)."""
        return sum(op.executions for op in self.select(kind, axes))

    def instructions(self, kind=None, axes=None):
        """Number of collective instructions in the program, however often each runs."""
        return len(self.select(kind, axes))

    def buffers(self, kind=None, axes=None):
        """Number of arrays moved per call (a combined all-reduce of two arrays counts 2 each time it runs)."""
        return sum(op.buffers * op.executions for op in self.select(kind, axes))

    def total_bytes(self, kind=None, axes=None):
        """Bytes of the buffers worked on per call (see ``CollectiveOp.bytes``), executions included."""
        return sum(op.bytes * op.executions for op in self.select(kind, axes))

    def sent_bytes(self, kind=None, axes=None):
        """Bytes one device sends per call (ring algorithms), executions included."""
        return sum(op.sent_bytes * op.executions for op in self.select(kind, axes))

    def summary(self):
        """Rows ``{kind, axes, shape, count, bytes, sent_bytes, replica_groups}`` grouping identical ops;
        ``count`` is executions, ``bytes`` those of one, ``sent_bytes`` of all."""
        rows = {}
        for op in self.collectives:
            key = (op.kind, op.axes, op.shape, op.replica_groups)
            row = rows.setdefault(
                key,
                {
                    "kind": op.kind,
                    "axes": op.axes,
                    "shape": op.shape,
                    "count": 0,
                    "bytes": op.bytes,
                    "sent_bytes": 0.0,
                    "replica_groups": op.replica_groups,
                },
            )
            row["count"] += op.executions
            row["sent_bytes"] += op.sent_bytes * op.executions
        return list(rows.values())

    def per_axis(self):
        """Rows ``{axes, kind, count, bytes, sent_bytes}`` per (mesh axes, kind), in program order:
        executions, the bytes of their buffers and what one device sends, all per call."""
        rows = {}
        for op in self.collectives:
            row = rows.setdefault(
                (op.axes, op.kind), {"axes": op.axes, "kind": op.kind, "count": 0, "bytes": 0, "sent_bytes": 0.0}
            )
            row["count"] += op.executions
            row["bytes"] += op.bytes * op.executions
            row["sent_bytes"] += op.sent_bytes * op.executions
        return list(rows.values())

    def format(self):
        """The report as text lines: a table of collectives, totals per axis, memory."""
        lines = []
        if self.mesh_axes:
            lines.append("mesh: " + ",".join(f"{k}={v}" for k, v in self.mesh_axes.items()))
        lines += [
            "collectives in the optimised program (bytes per device):",
            "| kind | mesh axes | count | result shape | bytes each | sent in all | replica groups |",
            "| --- | --- | ---: | --- | ---: | ---: | --- |",
        ]
        for row in self.summary():
            lines.append(
                f"| {row['kind']} | {_axes_text(row['axes'])} | {row['count']} | {row['shape']} | "
                f"{format_bytes(row['bytes'])} | {format_bytes(row['sent_bytes'])} | {_groups_text(row['replica_groups'])} |"
            )
        if not self.collectives:
            lines.append("| (none) | | 0 | | | | |")
        looped = sum(op.executions != 1 or not op.exact for op in self.collectives)
        if looped:
            lines.append(f"count: executions per call; {looped} instruction(s) in `while` loops counted once per trip")
        if not self.exact:
            lines.append("lower bound: a loop around a collective has no known trip count (counted once)")
        totals, bounded = {}, {op.axes for op in self.collectives if not op.exact}
        for row in self.per_axis():
            total = totals.setdefault(row["axes"], [0, 0.0])
            total[0] += row["count"]
            total[1] += row["sent_bytes"]
        for axes in sorted(totals, key=_axes_text):
            lines.append(
                f"total over {_axes_text(axes)}: {totals[axes][0]} collective(s), "
                f"{format_bytes(totals[axes][1])} sent per device{' (lower bound)' if axes in bounded else ''}"
            )
        m = self.memory
        lines.append(
            f"memory per device: arguments {format_bytes(m.argument_bytes)}, outputs {format_bytes(m.output_bytes)}, "
            f"temporaries {format_bytes(m.temp_bytes)}, aliased {format_bytes(m.alias_bytes)}, "
            f"peak {format_bytes(m.peak_bytes)}"
        )
        return lines


def _axes_text(axes):
    if axes is None:
        return "?"
    return ",".join(axes) if axes else "(none)"


def _groups_text(groups, limit=4):
    shown = ",".join("{" + ",".join(map(str, g)) + "}" for g in groups[:limit])
    return shown + (",..." if len(groups) > limit else "")


# --- parsing ---------------------------------------------------------------------------


def parse_collectives(hlo_text, mesh=None):
    """Every collective in optimised HLO text, as ``CollectiveOp``s in program order.

    Args:
        hlo_text: ``compiled.as_text()``.
        mesh: the ``keras.distribution.DeviceMesh`` or ``jax.sharding.Mesh`` the program
            was partitioned for; names the axes each collective spans (else ``axes=None``).
    """
    num_devices = _num_partitions(hlo_text, mesh)
    grid = _mesh_grid(mesh)
    times, lower_bounds = loop_multiplicities(hlo_text)
    ops = []
    for line in hlo_text.splitlines():
        match = _INSTRUCTION.match(line)
        if not match:
            continue
        kind = match["kind"]
        arrays = _result_arrays(match["type"], kind, bool(match["start"]))
        if kind == "collective-permute":
            groups = _pairs(line)
            group_size = 2
        else:
            groups = _replica_groups(line, num_devices)
            group_size = len(groups[0]) if groups else 1
        elements = sum(math.prod(dims) for _, dims in arrays)
        size = sum(math.prod(dims) * DTYPE_BYTES.get(dtype, 4) for dtype, dims in arrays)
        if kind == "reduce-scatter":  # the result is 1/n of the buffer reduced
            elements, size = elements * group_size, size * group_size
        operand = _operand_bytes(hlo_text, line) if kind == "ragged-all-to-all" else None
        ops.append(
            CollectiveOp(
                name=match["name"],
                kind=kind,
                shape=", ".join(f"{d}[{','.join(map(str, s))}]" for d, s in arrays),
                buffers=len(arrays),
                elements=int(elements),
                bytes=int(size),
                group_size=group_size,
                replica_groups=groups,
                axes=None if grid is None else _axes_of(groups, grid),
                executions=times.get(match["name"], 1),
                exact=match["name"] not in lower_bounds,
                operand_bytes=operand,
            )
        )
    return ops


def _operand_bytes(hlo_text, line):
    """Bytes of a ragged-all-to-all's first operand (its send buffer): the type printed
    beside the operand, else the result type of the instruction that defines it; None
    where neither is in the text."""
    match = _FIRST_OPERAND.search(line)
    if match is None:
        return None
    type_text = match["type"]
    if type_text is None:
        definition = re.search(
            r"^\s*(?:ROOT\s+)?%?" + re.escape(match["name"]) + r"\s*=\s*(.+?)\s+[\w\-]+\(", hlo_text, re.M
        )
        if definition is None:
            return None
        type_text = definition.group(1)
    arrays = ARRAY.findall(type_text)
    return int(sum(math.prod(int(x) for x in dims.split(",") if x) * DTYPE_BYTES.get(d, 4) for d, dims in arrays))


def _result_arrays(type_text, kind, is_start):
    """[(dtype, dims)] of the data a collective produces (async starts also list inputs)."""
    arrays = [(d, tuple(int(x) for x in s.split(",") if x)) for d, s in ARRAY.findall(type_text)]
    if is_start and kind in ("all-gather", "collective-permute"):
        arrays = [a for a in arrays if a[1]]  # drop u32[] context scalars
        arrays = arrays[len(arrays) // 2 :]  # (inputs..., outputs...)
    return arrays


def _num_partitions(hlo_text, mesh):
    match = re.search(r"num_partitions=(\d+)", hlo_text)
    if match:
        return int(match.group(1))
    grid = _mesh_grid(mesh)
    return None if grid is None else grid[0].size


def _replica_groups(line, num_devices):
    """Tuple of device-id tuples, from any of XLA's printed forms: explicit
    ``{{0,1},{2,3}}``, iota ``[2,4]<=[8]`` / ``[4,2]<=[2,4]T(1,0)``, or mesh axes
    ``mesh['axis_0'=2,'axis_1'=4] {'axis_1'}``. ``{}`` (or none) means all devices."""
    text = line.split("replica_groups=", 1)[1] if "replica_groups=" in line else ""
    if text.startswith("{"):
        match = re.match(r"\{((?:\{[0-9,]*\},?)*)\}", text)
        groups = tuple(tuple(int(x) for x in g.split(",") if x) for g in re.findall(r"\{([0-9,]*)\}", match.group(1)))
        if groups:
            return groups
    elif text.startswith("["):
        match = re.match(r"\[([0-9,]+)\]<=\[([0-9,]+)\](?:T\(([0-9,]+)\))?", text)
        dims = [int(x) for x in match.group(2).split(",")]
        ids = np.arange(math.prod(dims)).reshape(dims)
        if match.group(3):
            ids = ids.transpose([int(x) for x in match.group(3).split(",")])
        return _rows(ids, [int(x) for x in match.group(1).split(",")][-1])
    elif text.startswith("mesh["):
        return _mesh_axes_groups(text)
    elif text:
        raise ValueError(f"unrecognised replica_groups format: {text[:80]!r}")
    return (tuple(range(num_devices)),) if num_devices else ()


def _mesh_axes_groups(text):
    """Groups of the mesh-axes form: devices varying along the named axes, the rest fixed."""
    match = re.match(
        r"mesh\[([^\]]*)\](?:,?\s*device_ids=(\[[0-9,]+\]|\(\[[0-9,]+\](?:<=\[[0-9,]+\])?(?:T\([0-9,]+\))?\)))?\s*\{([^}]*)\}",
        text,
    )
    axes = re.findall(r"'([^']+)'=(\d+)", match.group(1)) if match else []
    grouped = re.findall(r"'([^']+)'(:\S+)?", match.group(3)) if match else []
    if not axes or not grouped or any(sub for _, sub in grouped):
        raise ValueError(f"unrecognised replica_groups format: {text[:80]!r}")
    names, sizes = [a for a, _ in axes], [int(s) for _, s in axes]
    ids = _device_ids(match.group(2)) if match.group(2) else np.arange(math.prod(sizes))
    picked = [names.index(a) for a, _ in grouped]
    order = [k for k in range(len(names)) if k not in picked] + picked
    return _rows(ids.reshape(sizes).transpose(order), math.prod(sizes[k] for k in picked))


def _device_ids(text):
    """Logical device order of the mesh-axes form: explicit ``[0,2,1,3]`` or iota
    ``([8,4]T(1,0))`` (``arange`` reshaped to the dims, transposed, flattened)."""
    if text.startswith("["):
        return np.array([int(x) for x in text.strip("[]").split(",")])
    match = re.match(r"\(\[([0-9,]+)\](?:<=\[([0-9,]+)\])?(?:T\(([0-9,]+)\))?\)", text)
    dims = [int(x) for x in match.group(1).split(",")]
    source = [int(x) for x in match.group(2).split(",")] if match.group(2) else dims
    ids = np.arange(math.prod(source)).reshape(source)
    if match.group(3):
        ids = ids.transpose([int(x) for x in match.group(3).split(",")])
    return ids.reshape(-1)


def _rows(ids, group_size):
    return tuple(tuple(int(i) for i in row) for row in np.asarray(ids).reshape(-1, group_size))


def _pairs(line):
    match = re.search(r"source_target_pairs=\{((?:\{[0-9,]*\},?)*)\}", line)
    if not match:
        return ()
    return tuple(tuple(int(x) for x in p.split(",")) for p in re.findall(r"\{([0-9,]+)\}", match.group(1)))


def _mesh_grid(mesh):
    """(logical ids laid out as the mesh, axis names), or None."""
    if mesh is None:
        return None
    names = tuple(mesh.axis_names)
    shape = tuple(mesh.shape.values()) if isinstance(mesh.shape, dict) else tuple(mesh.shape)
    return np.arange(math.prod(shape)).reshape(shape), names


def _axes_of(groups, grid):
    """The mesh axes along which the devices of each group (or source-target pair) differ."""
    ids, names = grid
    varying = set()
    for group in groups:
        first = np.unravel_index(group[0], ids.shape)
        for member in group[1:]:
            varying |= {k for k, (a, b) in enumerate(zip(first, np.unravel_index(member, ids.shape))) if a != b}
    return tuple(names[k] for k in sorted(varying))


def report_of(compiled, mesh=None, *, hlo_text=None):
    """``CommsReport`` of a compiled program (``jax.jit(f).lower(...).compile()``) whose
    device groups are named by ``mesh``'s axes (None: no axis names); ``hlo_text``: its
    ``as_text()`` when the caller already has it (printing is not free for a large program)."""
    analysis = compiled.memory_analysis()
    memory = MemoryUsage(
        *(getattr(analysis, f"{part}_size_in_bytes", None) for part in ("argument", "output", "temp", "alias"))
    )
    axes = {} if mesh is None else dict(zip(mesh.axis_names, _mesh_grid(mesh)[0].shape))
    return CommsReport(parse_collectives(hlo_text or compiled.as_text(), mesh), memory, axes, compiled)
