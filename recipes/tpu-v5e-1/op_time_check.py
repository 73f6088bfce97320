"""zoo plan's op-by-op step time against steps measured on the chip, from XLA's dumps.

    python3 recipes/tpu-v5e-1/op_time_check.py DIR TAG=MS [TAG=MS ...]

DIR holds what ``issue43_rows.sh 29`` brings back, unpacked (``tar -xzf hlo.tar.gz``): one
folder per row, named TAG, with the step's optimised HLO as XLA dumped it on the chip
(``*after_optimizations.txt``); MS is the step ``zoo bench step`` measured for that row.
Prints, per row, the time ``zoo.planning.roofline.op_step_time`` gives the dumped program
at the TPU v5e's measured rates (``MEASURED_RATES``), by kind, against the measured step.
No device is needed: this is how the rates were checked (docs/planning.md).
"""

import glob
import os
import sys

from zoo.measure.hlo_ops import executed_ops
from zoo.planning.roofline import MEASURED_RATES, op_step_time


def main(folder, pairs):
    rates = MEASURED_RATES["tpu-v5e"]
    print("| row | matmuls | memory-bound | kernels | gaps (ops) | planned | measured | planned / measured |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for pair in pairs:
        tag, measured_ms = pair.split("=")
        (path,) = glob.glob(os.path.join(folder, "**", tag, "*after_optimizations.txt"), recursive=True)
        with open(path) as handle:
            time = op_step_time(executed_ops(handle.read()), rates)
        ms = {key: getattr(time, key) * 1e3 for key in ("matmul_s", "memory_s", "kernel_s", "gaps_s", "step_s")}
        print(
            f"| {tag} | {ms['matmul_s']:.1f} | {ms['memory_s']:.1f} | {ms['kernel_s']:.1f} | "
            f"{ms['gaps_s']:.1f} ({time.ops:,}) | {ms['step_s']:.1f} ms | {float(measured_ms):.1f} ms | "
            f"{ms['step_s'] / float(measured_ms):.3f} |"
        )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
