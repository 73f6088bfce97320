"""The MoE exchange compiled for a TPU v5e-8 slice ahead of time, on any machine with libtpu.

    python recipes/tpu-v5e-8/moe_exchange_aot.py [--topology v5e:2x4] [--meshes "data=2,expert=4;data=1,expert=8"]
        [--exchanges ragged,dropless,1.0] [--precision float32] [--output FILE] [--hlo-dir DIR]

``zoo bench moe``'s exchange rows (the same GPT of MoE blocks, settings' defaults, fit
step under layout ``expert``), compiled by the TPU compiler for the 8 chips of
``--topology`` (``jax.experimental.topologies``: compile-only devices; nothing runs on
them, no chip memory is used, the process needs one TPU host's libtpu, not the slice).
Each ``--exchanges`` entry is a row per mesh: ``ragged`` (``expert_exchange="ragged"``,
``jax.lax.ragged_all_to_all``, dropless), ``dropless`` (the fixed all_to_all sized for
every assignment) or a capacity factor. From the compiled HLO: the token exchanges over
``expert``, their buffers and bytes; from ``memory_analysis()``: the memory per device.
A ragged all-to-all's HLO holds its worst case, not what it sends, so its routed bytes
come from the routing itself: the model's routing of the exchange table's random tokens
at its initial weights, computed on the attached device (``zoo.bench.moe.recorded_routing``,
``ragged_rows_sent``). docs/performance.md ("Mixture of Experts") shows the table.
"""

import argparse
import os
import sys

import jax
from jax.experimental import topologies

from zoo.bench import moe as bench
from zoo.bench._output import write_text
from zoo.config.bench_moe_settings import MoEBenchSettings, capacity_factor_list


def exchanges(text):
    """``"ragged,dropless,1.0"`` -> ``[("ragged", None), ("all_to_all", None), ("all_to_all", 1.0)]``."""
    rows = []
    for entry in text.split(","):
        if entry.strip() == "ragged":
            rows.append(("ragged", None))
        else:
            rows.append(("all_to_all", capacity_factor_list(entry)[0]))
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--topology", default="v5e:2x4", help="jax.experimental.topologies name (8 chips)")
    parser.add_argument("--meshes", default="data=2,expert=4;data=1,expert=8", help="';'-separated meshes")
    parser.add_argument("--exchanges", default="ragged,dropless,1.0", help="ragged, dropless or capacity factors")
    parser.add_argument("--precision", default="float32", help="Keras dtype policy (mixed_bfloat16: bf16 exchanges)")
    parser.add_argument("--output", help="write the table here")
    parser.add_argument("--hlo-dir", help="write each row's compiled HLO text here")
    args = parser.parse_args(argv)
    topology = topologies.get_topology_desc(topology_name=args.topology, platform="tpu")
    devices = topology.devices
    print(f"attached: {jax.devices()}; topology {args.topology}: {len(devices)} devices, {devices}", flush=True)
    meshes = tuple(args.meshes.split(";"))
    settings = MoEBenchSettings(sections=("exchange",), meshes=meshes, precision=args.precision)
    routings = bench.recorded_routing(settings)  # on the attached device
    rows = []
    for mesh in meshes:
        for exchange, capacity_factor in exchanges(args.exchanges):
            row = bench.compile_exchange(
                settings, mesh, capacity_factor, devices=devices, platform=devices[0].platform, exchange=exchange
            )
            if exchange == "ragged":
                row.routed = bench.routed_exchange_bytes(settings, row, routings)
            if args.hlo_dir:
                os.makedirs(args.hlo_dir, exist_ok=True)
                name = f"{mesh}_{exchange}_{capacity_factor}_{args.precision}".replace("=", "").replace(",", "_")
                with open(os.path.join(args.hlo_dir, name + ".hlo.txt"), "w") as file:
                    file.write(row.compiled.as_text())
            mean, most = row.routed_ratios
            print(
                f"{mesh} {exchange} {capacity_factor}: sent / minimum {mean:.3f} ({most:.3f}), compiled in {row.compile_s:.0f} s",
                flush=True,
            )
            rows.append(row)
    text = "\n".join(bench.format_topology_exchange(settings, rows, (args.topology, devices)))
    print(text)
    if args.output:
        write_text(args.output, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
