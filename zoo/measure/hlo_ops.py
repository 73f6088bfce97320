"""The ops a compiled program runs, each with its FLOPs and bytes, read from optimised HLO.

A device runs the instructions of the entry computation and of the computations that
control flow calls (a ``while`` body and condition, a ``conditional``'s branches, a
``call``); everything else a fusion or a reduction calls runs inside that instruction.
``executed_ops`` lists the instructions that do work, each once with ``runs``: how often
it runs per call of the program (``hlo_text.loop_multiplicities``: loop trip counts
included). Per op:

- ``flops``: 2 x output elements x contracted size of every ``dot`` and ``convolution``
  it holds (a fusion: those of its fused computation; a convolution over a padded window,
  a TPU's way to write a projection, counts the taps that land on its input); elementwise
  work is not counted, as XLA's model FLOPs do not count it;
- ``bytes``: what it reads and writes, as XLA's cost analysis counts it (its operands and
  its result), except that an operand a fusion only slices (``dynamic-slice``, ``slice``,
  ``gather``: a scanned stack's one block, an embedding's rows) counts the slices, a result
  updated in place (``dynamic-update-slice`` at the fusion's root) counts the update, and
  each array is counted as its layout's tiles hold it (a TPU pads a minor dimension to 128);
- ``kind``: ``matmul`` (a dot or convolution in it), ``kernel`` (a custom call: a Pallas
  kernel, a library call), ``collective``, ``async`` (``copy-start``, ``async-start`` or
  the printer's ``slice-start``: a DMA beside the compute), else ``memory`` (elementwise,
  copies, reductions, gathers: bound by HBM);
- ``op_name``: the JAX op path from its metadata (``jit(train_step)/.../attention/...``);
  ``operands`` and ``results``: their arrays' shapes as written (a kernel's cost is read
  from them); ``block_fraction``: for a splash-style kernel, the share of its block mask
  it visits.

``zoo.planning.roofline.op_step_time`` turns these into a step time.
"""

import collections
import dataclasses
import math
import re

from zoo.measure.hlo_text import ARRAY, DTYPE_BYTES, called_computations, computation_lines, multiplicities_of

__all__ = ["HloOp", "executed_ops"]

# instructions that move no data of their own, or whose called computations carry the work
FREE = frozenset(
    (
        "parameter", "constant", "get-tuple-element", "tuple", "bitcast", "while", "conditional", "call",
        "after-all", "add-dependency", "opt-barrier", "partition-id", "replica-id", "domain",
    )
)  # fmt: skip
FREE_TARGETS = (
    "ConcatBitcast",
    "AllocateBuffer",
    "Sharding",
    "SPMDFullToShardShape",
    "SPMDShardToFullShape",
)  # custom calls that run nothing
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "ragged-all-to-all", "collective-permute")
CONTROL_ROLES = ("body", "condition", "branch_computations")  # and a call's to_apply

_DEFINITION = re.compile(
    r"^\s*(?:ROOT\s+)?%?(?P<name>[\w.\-]+)\s*=\s*(?P<type>.+?)\s+(?P<opcode>[a-z][\w\-]*)\((?P<args>.*)$"
)
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_CONTRACTING = re.compile(r"lhs_contracting_dims=\{([0-9,]*)\}")
_TYPED_ARRAY = re.compile(
    r"\b(?P<dtype>[a-z]+[0-9a-z]*)\[(?P<dims>[0-9,]*)\]"
    r"(?:\{(?P<order>[0-9,]*)(?::T\((?P<tile>\d+,\d+)\)(?:\((?P<rows>\d+),1\))?)?[^}]*\})?"
)
_WINDOW = re.compile(r"window=\{size=(?P<size>[0-9x]+)(?: pad=(?P<pad>[0-9_x\-]+))?")
_DIM_LABELS = re.compile(r"dim_labels=([\w?]+)_([\w?]+)->([\w?]+)")


@dataclasses.dataclass(frozen=True)
class HloOp:
    """One instruction the device runs (the module docstring)."""

    name: str
    opcode: str
    kind: str  # matmul | kernel | collective | async | memory
    flops: float  # per run
    bytes: float  # per run
    runs: int
    op_name: str
    operands: tuple  # ((dtype, dims), ...) of its array operands, as their shapes say
    results: tuple = ()  # ((dtype, dims), ...) of its result (a tuple's arrays in order)
    target: str = ""  # a custom call's custom_call_target
    block_fraction: float | None = None  # a splash-style kernel: the share of its block mask not skipped


@dataclasses.dataclass(frozen=True)
class _Instruction:
    name: str
    type: str
    opcode: str
    operands: tuple  # operand names
    line: str


def _arrays(type_text):
    """[(dtype, dims)] of a type, a tuple's arrays in order, each as its layout's tiles hold
    it: where the layout names tiles (a TPU's ``{3,1,2,0:T(8,128)(2,1)}``), the most minor
    dimension is padded to the tile's width and the next to its height (times a packed
    sub-tile's rows), so a D = 32 minor dimension moves 128's bytes, as the chip moves it."""
    arrays = []
    for match in _TYPED_ARRAY.finditer(type_text):
        dims = [int(x) for x in match["dims"].split(",") if x]
        order, tile = match["order"], match["tile"]
        if order and tile and len(dims) >= 2:
            minor = [int(x) for x in order.split(",") if x]
            height, width = (int(x) for x in tile.split(","))
            rows = int(match["rows"]) if match["rows"] else 1
            dims[minor[0]] = -(-dims[minor[0]] // width) * width
            dims[minor[1]] = -(-dims[minor[1]] // (height * rows)) * (height * rows)
        arrays.append((match["dtype"], tuple(dims)))
    return arrays


def _logical_arrays(type_text):
    """[(dtype, dims)] of a type as its shape says (no tile padding): what a dot multiplies."""
    return [(dtype, tuple(int(x) for x in dims.split(",") if x)) for dtype, dims in ARRAY.findall(type_text)]


def _size(arrays):
    return sum(math.prod(dims) * DTYPE_BYTES.get(dtype, 4) for dtype, dims in arrays)


def _bytes(instruction):
    """The bytes of an instruction's result as its layout's tiles hold them."""
    return _size(_arrays(instruction.type))


def _fused_computation(instruction):
    """The computation a fusion calls (None for other instructions)."""
    return next((callee for role, callee in called_computations(instruction.line) if role == "calls"), None)


def _operand_names(args):
    """The operand names of an instruction's argument text (up to its closing parenthesis)."""
    depth, end = 1, len(args)
    for i, char in enumerate(args):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0:
            end = i
            break
    return tuple(re.findall(r"%([\w.\-]+)", args[:end]))


def _parse(hlo_text):
    """``({computation: [_Instruction]}, entry, {name: _Instruction}, {name: runs})``: the text
    split into computations once, for the instructions and their loop trip counts alike."""
    lines, entry = computation_lines(hlo_text)
    computations, by_name = {}, {}
    for computation, body in lines.items():
        computations[computation] = []
        for line in body:
            match = _DEFINITION.match(line)
            if match is None:
                continue
            instruction = _Instruction(
                match["name"], match["type"], match["opcode"], _operand_names(match["args"]), line
            )
            computations[computation].append(instruction)
            by_name[instruction.name] = instruction
    return computations, entry, by_name, multiplicities_of(lines, entry)[0]


def _control_computations(computations, entry):
    """The computations the device runs as control flow (the module docstring), entry first."""
    seen, pending = [], [entry]
    while pending:
        name = pending.pop()
        if name in seen or name not in computations:
            continue
        seen.append(name)
        for instruction in computations[name]:
            for role, callee in called_computations(instruction.line):
                if role in CONTROL_ROLES or (instruction.opcode == "call" and role == "to_apply"):
                    pending.append(callee)
    return seen


def _dot_flops(instruction, by_name):
    """2 x output elements x contracted size of a ``dot`` or ``convolution`` (0 for others)."""
    if instruction.opcode not in ("dot", "convolution"):
        return 0.0
    result = _logical_arrays(instruction.type)
    out = math.prod(result[0][1]) if result else 0
    operands = [by_name.get(name) for name in instruction.operands[:2]]
    if len(operands) < 2 or any(operand is None or not _logical_arrays(operand.type) for operand in operands):
        return 0.0
    lhs, rhs = (_logical_arrays(operand.type)[0][1] for operand in operands)
    if instruction.opcode == "dot":
        contracting = _CONTRACTING.search(instruction.line)
        dims = [int(k) for k in contracting.group(1).split(",") if k] if contracting else []
        return 2.0 * out * math.prod(lhs[k] for k in dims)
    return _convolution_flops(instruction.line, lhs, rhs, out)


def _convolution_flops(line, lhs, rhs, out):
    """2 x output elements x input features x the taps per output that land on the input,
    not on its padding (a TPU writes a projection as a convolution over a padded window);
    0 where the dimension labels do not read."""
    labels = _DIM_LABELS.search(line)
    if labels is None or "o" not in labels.group(2) or len(labels.group(2)) != len(rhs):
        return 0.0
    lhs_labels, rhs_labels = labels.group(1), labels.group(2)
    macs = out * rhs[rhs_labels.index("i")]
    window = _WINDOW.search(line)
    sizes = [int(x) for x in window["size"].split("x")] if window else []
    pads = (
        [tuple(int(p) for p in pad.split("_")) for pad in window["pad"].split("x")] if window and window["pad"] else []
    )
    for d, w in enumerate(sizes):
        n = lhs[lhs_labels.index(str(d))] if str(d) in lhs_labels else 1
        lo, hi = pads[d] if d < len(pads) else (0, 0)
        macs *= _valid_taps(n, w, lo, hi)
    groups = re.search(r"batch_group_count=(\d+)", line)
    return 2.0 * macs / (int(groups.group(1)) if groups else 1)


def _valid_taps(n, w, lo, hi):
    """Taps of a window of ``w`` over ``n`` inputs padded ``lo``/``hi`` (stride 1) that land on
    an input, per output position: a window over padding (a dot written as a convolution)
    does one multiply per output, not ``w``."""
    m = n + lo + hi - w + 1  # output positions
    if m <= 0:
        return 0.0
    pairs = sum(max(0, min(m, n + lo - t) - max(0, lo - t)) for t in range(w))
    return pairs / m


def _fused_flops(computation, computations, by_name, depth=0):
    """The dot and convolution FLOPs of a fused computation (nested fusions included)."""
    flops = 0.0
    for instruction in computations.get(computation, ()):
        flops += _dot_flops(instruction, by_name)
        if depth < 4:
            for role, callee in called_computations(instruction.line):
                if role == "calls":
                    flops += _fused_flops(callee, computations, by_name, depth + 1)
    return flops


def _fusion_bytes(instruction, computations, by_name):
    """A fusion's operand and result bytes, slices and in-place updates counted as such."""
    body = computations.get(_fused_computation(instruction), [])
    parameters = {}  # parameter number -> instruction in the fused computation
    users = collections.defaultdict(list)
    for inner in body:
        if inner.opcode == "parameter":
            number = re.search(r"parameter\((\d+)\)", inner.line)
            if number:
                parameters[int(number.group(1))] = inner
        for operand in inner.operands:
            users[operand].append(inner)
    total = 0.0
    for number, name in enumerate(instruction.operands):
        operand = by_name.get(name)
        if operand is None:
            continue
        inner = parameters.get(number)
        uses = users.get(inner.name, []) if inner is not None else []
        sliced = ("dynamic-slice", "slice", "gather")  # of their first operand (the others are indices)
        if uses and all(use.opcode in sliced and use.operands[0] == inner.name for use in uses):
            total += sum(_bytes(use) for use in uses)
        elif uses and all(use.opcode == "dynamic-update-slice" and use.operands[0] == inner.name for use in uses):
            continue  # the buffer updated in place: its update is counted below
        else:
            total += _bytes(operand)
    root = next((inner for inner in body if inner.line.lstrip().startswith("ROOT")), None)
    if root is not None and root.opcode == "dynamic-update-slice":
        update = by_name.get(root.operands[1]) if len(root.operands) > 1 else None
        return total + (2 * _bytes(update) if update is not None else 0)
    return total + _bytes(instruction)


def _target(instruction):
    """A custom call's ``custom_call_target`` ("" for other instructions)."""
    if instruction.opcode != "custom-call":
        return ""
    target = re.search(r'custom_call_target="([^"]*)"', instruction.line)
    return target.group(1) if target else ""


COPIES = ("copy-done", "copy-start", "copy", "bitcast")  # what stands between a constant and its reader


def _block_fraction(operands, by_name):
    """The share of non-zero entries of a kernel's second operand where it is an s8 constant
    of rank 3: splash attention's block mask ([heads, query blocks, key blocks]; 0 skips a
    pair of blocks, 1 masks part of it, 2 runs it whole), else None. The constant may reach
    the kernel through a copy into the core's memory (``copy-start`` / ``copy-done``), and
    its values must be printed (a large one is ``{...}`` unless printed whole:
    ``zoo._compat.hlo_text_with_constants``)."""
    if len(operands) < 2:
        return None
    mask = operands[1]
    while mask.opcode in COPIES and mask.operands[:1] and mask.operands[0] in by_name:
        mask = by_name[mask.operands[0]]  # the copy's source
    if mask.opcode != "constant":
        return None
    arrays = _logical_arrays(mask.type)
    if not arrays or arrays[0][0] != "s8" or len(arrays[0][1]) != 3:
        return None
    values = re.search(r"constant\((.*)\)", mask.line)
    numbers = [int(x) for x in re.findall(r"-?\d+", values.group(1))] if values else []
    if len(numbers) != math.prod(arrays[0][1]) or not numbers:
        return None
    return sum(1 for x in numbers if x) / len(numbers)


def _is_free(instruction):
    """Whether an instruction moves no data of its own: ``FREE``'s, a custom call that runs
    nothing (``FREE_TARGETS``), or the end of an asynchronous op (``*-done``, ``*-update``:
    an async op is printed as ``async-start`` / ``async-done``, or as ``slice-start`` /
    ``slice-done`` where the printer's syntax sugar names the op it wraps)."""
    opcode = instruction.opcode
    return opcode in FREE or opcode.endswith(("-done", "-update")) or _target(instruction) in FREE_TARGETS


def _kind(instruction, flops):
    if flops:
        return "matmul"
    if instruction.opcode == "custom-call":
        return "kernel"
    base = instruction.opcode.removesuffix("-start")
    if base in COLLECTIVES:
        return "collective"
    if instruction.opcode.endswith("-start"):
        return "async"  # copy-start, async-start, or its sugar (slice-start ...): a DMA beside the compute
    return "memory"


def executed_ops(hlo_text):
    """[``HloOp``] of optimised HLO text: the instructions that do work (module docstring)."""
    computations, entry, by_name, runs = _parse(hlo_text)
    ops = []
    for computation in _control_computations(computations, entry):
        for instruction in computations[computation]:
            if _is_free(instruction):
                continue
            operands = [by_name[name] for name in instruction.operands if name in by_name]
            if instruction.opcode == "fusion":
                flops = _fused_flops(_fused_computation(instruction), computations, by_name)
                moved = _fusion_bytes(instruction, computations, by_name)
            else:
                flops = _dot_flops(instruction, by_name)
                moved = _bytes(instruction) + sum(_bytes(operand) for operand in operands)
            op_name = _OP_NAME.search(instruction.line)
            ops.append(
                HloOp(
                    name=instruction.name,
                    opcode=instruction.opcode,
                    kind=_kind(instruction, flops),
                    flops=flops,
                    bytes=moved,
                    runs=runs.get(instruction.name, 1),
                    op_name=op_name.group(1) if op_name else "",
                    operands=tuple(array for operand in operands for array in _logical_arrays(operand.type)[:1]),
                    results=tuple(_logical_arrays(instruction.type)),
                    target=_target(instruction),
                    block_fraction=_block_fraction(operands, by_name) if instruction.opcode == "custom-call" else None,
                )
            )
    return ops
