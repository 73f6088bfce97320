"""The device ops of a JAX profiler trace, one JSON line each, for reading off the chip.

    python3 recipes/tpu-v5e-1/trace_ops.py TRACE_DIR OUT.jsonl.gz

Writes every innermost event of the device's "XLA Ops" line (``_device_profile.innermost``:
a loop's events are inside its own), with its start, duration and all the arguments the TPU's profiler gives it (``tf_op``, ``hlo_category``, ``model_flops``,
``bytes_accessed`` ...), then one line per ``Steps`` event. A perfetto trace of a few
steps is tens of MB; these lines are what ``zoo.planning``'s per-op time model is checked
against (docs/planning.md), at a tenth of the size.
"""

import gzip
import json
import sys

from zoo.bench._device_profile import device_lines, innermost, read_trace


def main(trace_dir, out_path):
    ops, steps = device_lines(read_trace(trace_dir))
    with gzip.open(out_path, "wt") as handle:
        for line_ops in ops.values():
            for event in innermost(line_ops):
                row = {"line": "op", "name": event["name"], "ts": event["ts"], "dur": event.get("dur", 0)}
                handle.write(json.dumps({**row, **event.get("args", {})}) + "\n")
        for event in steps:
            row = {"line": "step", "name": event["name"], "ts": event["ts"], "dur": event.get("dur", 0)}
            handle.write(json.dumps({**row, **event.get("args", {})}) + "\n")
    print(f"{out_path}: {sum(len(v) for v in ops.values())} op events, {len(steps)} steps")


if __name__ == "__main__":
    main(*sys.argv[1:3])
