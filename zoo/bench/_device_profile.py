"""Where an accelerator's step time goes: the JAX profiler's trace, per part of the model.

On a TPU (and a GPU) the profiler records one event per HLO instruction the device ran,
on the device's "XLA Ops" line, and each event carries what XLA knows of it: ``tf_op``
(the JAX op path, e.g. ``jit(train_step)/transpose(jvp(gpt_backbone))/block_3/mlp/up/
dot_general``: Keras names every layer's scope), ``hlo_category`` (``convolution fusion``,
``loop fusion``, ``all-reduce``, ``custom-call`` ...), ``model_flops`` and
``bytes_accessed``. A loop or a conditional is an event too, around the events of its
body: only the innermost events (leaves) are counted, so nothing is counted twice.

Each leaf goes to one part by its op path (``PARTS``, first match wins): attention,
MLP, LM head and loss, optimizer update, embedding, norms, other; and to one kind by its
category (matmul, collective, Pallas kernel, elementwise and other). The time no
device op covered in the measured step is the host's: input, Python, the step's dispatch.
Times are divided by the number of steps the caller traced, not by the ``Steps`` line's
events: that line also holds the other programs ``fit`` runs (on a v5e chip, 10 events for
3 traced steps), which once made every part read 3/10 of its time.
"""

import collections
import re

from zoo.bench._step_profile import TRACE_FILE, read_trace

__all__ = [
    "TRACE_FILE",
    "device_lines",
    "device_profile",
    "format_profile",
    "innermost",
    "kind_of",
    "part_of",
    "read_trace",
]

OPS_LINE = "XLA Ops"
STEPS_LINE = "Steps"
# (part, words any of which in the op path puts an op in it); first match wins.
PARTS = (
    ("optimizer update", ("adam", "optimizer", "sgd", "/lion", "adafactor")),
    ("LM head and loss", ("lm_head", "compile_loss", "crossentropy", "/logits", "chunked_loss", "loss_chunk")),
    ("attention", ("/attention",)),
    ("MLP", ("/mlp", "/moe", "experts")),
    ("embedding", ("token_embedding", "embedding")),
    ("norms", ("norm",)),
)


def part_of(op_path):
    """The part of the model an op path belongs to (``PARTS``), else ``"other"``."""
    path = op_path.lower()
    return next((part for part, words in PARTS if any(word in path for word in words)), "other")


def kind_of(category):
    """matmul, collective, Pallas kernel or elementwise and other, from an ``hlo_category``."""
    category = category.lower()
    if "convolution" in category or "dot" in category:
        return "matmul"
    if any(word in category for word in ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "permute")):
        return "collective"
    if "custom" in category:
        return "Pallas kernel"
    return "elementwise and other"


def _lines(events):
    """``{(pid, tid): line name}`` from the trace's thread-name metadata."""
    return {
        (e["pid"], e["tid"]): e["args"].get("name", "")
        for e in events
        if e.get("ph") == "M" and e.get("name") == "thread_name"
    }


NESTING_SLACK_US = 0.01  # start and end times are rounded: an event ending this much past its parent is inside


def innermost(ops):
    """The events of one line that hold no other event (ops sorted by start): an event
    is a parent when the next one starts and ends inside it; two ops that merely touch,
    by a rounding of their times, are both leaves."""
    ops = sorted(ops, key=lambda e: (e["ts"], -e.get("dur", 0)))
    leaves = []
    for i, event in enumerate(ops):
        end = event["ts"] + event.get("dur", 0)
        following = ops[i + 1] if i + 1 < len(ops) else None
        inside = (
            following is not None
            and following["ts"] < end
            and (following["ts"] + following.get("dur", 0) <= end + NESTING_SLACK_US)
        )
        if not inside:
            leaves.append(event)
    return leaves


SLOWEST = 15  # ops listed by format_profile
_BLOCK_INDEX = re.compile(r"(block)_\d+")


def op_key(op_path, category):
    """An op's row in the slowest list: its path with the block index dropped (the same op of
    every block is one row) and its category."""
    return _BLOCK_INDEX.sub(r"\1_*", op_path), category


class DeviceProfile(collections.namedtuple("DeviceProfile", "steps step_ms parts kinds flops host_ms ops")):
    """Per traced step: ``parts`` {part: ms}, ``kinds`` {kind: ms}, ``flops`` {part: model
    FLOPs XLA counted}, ``host_ms`` the step time no device op covered; ``step_ms`` the
    device's mean step time (the ``Steps`` line); ``ops`` {``op_key``: (ms, model FLOPs,
    bytes accessed)}."""

    @property
    def device_ms(self):
        return sum(self.parts.values())


def device_lines(events, with_op_path=False):
    """``({(pid, tid): [its events]}, [step events])``: the events of each device's "XLA Ops"
    line (with ``with_op_path``, those that carry a JAX op path) and of its "Steps" line."""
    lines = _lines(events)
    ops = collections.defaultdict(list)
    step_events = []
    for event in events:
        if event.get("ph") != "X":
            continue
        line = lines.get((event["pid"], event["tid"]))
        if line == OPS_LINE and (not with_op_path or "tf_op" in event.get("args", {})):
            ops[(event["pid"], event["tid"])].append(event)
        elif line == STEPS_LINE:
            step_events.append(event)
    return ops, step_events


def device_profile(events, steps=None):
    """``DeviceProfile`` of a trace's events (``read_trace``) per step of the ``steps``
    the caller traced (None: the ``Steps`` line's count), or None when the trace names no
    device op (XLA:CPU's events carry no op path)."""
    ops, step_events = device_lines(events, with_op_path=True)
    if not ops:
        return None
    parts, kinds, flops = collections.Counter(), collections.Counter(), collections.Counter()
    by_op = collections.defaultdict(lambda: [0.0, 0.0, 0.0])  # op_key: [ms, flops, bytes]
    for line_ops in ops.values():
        for event in innermost(line_ops):
            args = event["args"]
            part = part_of(args.get("tf_op", ""))
            ms = event.get("dur", 0) / 1e3
            model_flops = float(args.get("model_flops", 0) or 0)
            parts[part] += ms
            kinds[kind_of(args.get("hlo_category", ""))] += ms
            flops[part] += model_flops
            row = by_op[op_key(args.get("tf_op", ""), args.get("hlo_category", ""))]
            row[0] += ms
            row[1] += model_flops
            row[2] += float(args.get("bytes_accessed", 0) or 0)
    count = steps or max(len(step_events), 1)
    step_ms = sum(e.get("dur", 0) for e in step_events) / 1e3 / count if step_events else None
    per_step = lambda counter: {key: value / count for key, value in counter.items()}  # noqa: E731
    parts, kinds, flops = per_step(parts), per_step(kinds), per_step(flops)
    host_ms = max(step_ms - sum(parts.values()), 0.0) if step_ms else None
    ops_per_step = {key: tuple(value / count for value in row) for key, row in by_op.items()}
    return DeviceProfile(count, step_ms, parts, kinds, flops, host_ms, ops_per_step)


def format_profile(profile, step_s):
    """Markdown: ms per step, share of the measured step and TFLOP/s per part, then per kind."""
    step_ms = step_s * 1e3
    lines = [
        f"Where the device's time goes ({profile.steps} traced steps; ms per step, share of the measured "
        f"{step_ms:.1f} ms step, XLA's model FLOPs of the part's ops over their time):",
        "",
        "| part | ms | share | TFLOP/s |",
        "| --- | ---: | ---: | ---: |",
    ]
    for part, ms in sorted(profile.parts.items(), key=lambda item: -item[1]):
        rate = profile.flops.get(part, 0) / (ms / 1e3) / 1e12 if ms else 0.0
        lines.append(f"| {part} | {ms:.1f} | {ms / step_ms:.1%} | {rate:.1f} |")
    idle = step_ms - profile.device_ms
    lines.append(f"| host and idle (no device op) | {max(idle, 0):.1f} | {max(idle, 0) / step_ms:.1%} | |")
    lines += ["", "| kind | ms | share |", "| --- | ---: | ---: |"]
    for kind, ms in sorted(profile.kinds.items(), key=lambda item: -item[1]):
        lines.append(f"| {kind} | {ms:.1f} | {ms / step_ms:.1%} |")
    return "\n".join(lines + ["", *_slowest_lines(profile, step_ms)])


def _slowest_lines(profile, step_ms, count=SLOWEST):
    """Markdown: the ``count`` slowest ops of a step (every block's same op summed), with
    the rate of XLA's model FLOPs and bytes accessed over their time."""
    lines = [
        f"The {count} slowest ops (every block's same op summed; ms per step, share, TFLOP/s, GB/s):",
        "",
        "| op | category | ms | share | TFLOP/s | GB/s |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    slowest = sorted(profile.ops.items(), key=lambda item: -item[1][0])[:count]
    for (path, category), (ms, flops, moved) in slowest:
        seconds = ms / 1e3 if ms else float("inf")
        name = path.removeprefix("jit(train_step)/")
        lines.append(
            f"| `{name}` | {category or '-'} | {ms:.2f} | {ms / step_ms:.1%} | "
            f"{flops / seconds / 1e12:.1f} | {moved / seconds / 1e9:.0f} |"
        )
    return lines
