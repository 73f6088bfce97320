"""Reading optimised HLO text: its computations, what an instruction calls, how often each
instruction runs, and the bytes of its arrays' element types.

``zoo.measure.hlo`` (the collectives and memory of a program) and ``zoo.measure.hlo_ops``
(the ops it runs, with their FLOPs and bytes) both read programs through these.
"""

import collections
import re

__all__ = [
    "ARRAY",
    "DTYPE_BYTES",
    "called_computations",
    "computation_lines",
    "loop_multiplicities",
    "multiplicities_of",
]

DTYPE_BYTES = {  # bytes per element
    "pred": 1, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1, "f8e4m3fnuz": 1, "f8e5m2fnuz": 1,
    "s16": 2, "u16": 2, "f16": 2, "bf16": 2,
    "s32": 4, "u32": 4, "f32": 4,
    "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16,
    "s4": 0.5, "u4": 0.5,
}  # fmt: skip
ARRAY = re.compile(r"\b([a-z]+[0-9a-z]*)\[([0-9,]*)\]")  # (element type, dims) of each array in a type
_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s*\(")
_NAME = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=")
_CALLED = re.compile(r"\b(body|condition|calls|to_apply|branch_computations)=(\{[^}]*\}|%?[\w.\-]+)")
_TRIP_COUNT = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')


def loop_multiplicities(hlo_text):
    """``({instruction name: executions per call}, {names whose count is a lower bound})``
    from optimised HLO text.

    The entry computation runs once; a computation called by an instruction (``calls``,
    ``to_apply``, a conditional's branches, a ``while`` condition) runs as often as that
    instruction, a ``while`` body ``known_trip_count`` times as often. A body without a
    known trip count counts once, and its instructions (and those of the computations
    they call) are lower bounds. Text without computations (bare instructions) gives ``({}, set())``.
    """
    return multiplicities_of(*computation_lines(hlo_text))


def multiplicities_of(computations, entry):
    """``loop_multiplicities`` of text already split by ``computation_lines``."""
    times, lower_bounds = collections.Counter(), set()
    pending = [(entry, 1, True)]
    while pending:
        name, count, exact = pending.pop()
        for line in computations.get(name, ()):
            instruction = _NAME.match(line)
            if instruction is None:
                continue
            times[instruction.group(1)] += count
            if not exact:
                lower_bounds.add(instruction.group(1))
            trip = _TRIP_COUNT.search(line)
            for role, callee in called_computations(line):
                repeat, known = count, exact
                if role == "body":
                    repeat, known = count * (int(trip.group(1)) if trip else 1), exact and trip is not None
                pending.append((callee, repeat, known))
    return dict(times), lower_bounds


def computation_lines(hlo_text):
    """``({computation name: [its instruction lines]}, the entry computation's name)`` of HLO text."""
    computations, entry, current = {}, None, None
    for line in hlo_text.splitlines():
        header = _COMPUTATION.match(line) if line and not line[0].isspace() else None
        if header and line.rstrip().endswith("{"):
            current = header.group(1)
            computations[current] = []
            entry = current if line.startswith("ENTRY") else entry
        elif current is not None and line.strip() and line.strip() != "}":
            computations[current].append(line)
    return computations, entry


def called_computations(line):
    """``[(role, computation)]`` an instruction line calls: role ``body``, ``condition``,
    ``calls``, ``to_apply`` or ``branch_computations``."""
    return [
        (role, callee)
        for role, called in _CALLED.findall(line)
        for callee in re.findall(r"[\w.\-]+", called.replace("%", " "))
    ]
