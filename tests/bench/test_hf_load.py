"""``zoo bench hf-load`` on a tiny synthetic checkpoint: the per-device bytes it reports
are the model's shards counted by hand, the peak is those plus the one transient the
loader has (the largest weight's shard, old value and new array both alive at its
assign), every device read exactly its shard, and the loaded weights are the file's."""

import os

from zoo.bench import hf_load as bench
from zoo.config.bench_settings import HFLoadBenchSettings

# V=64, C=16, H=K=4, D=4, F=32, one block, tied embeddings
TINY = {
    "runs": ("fsdp:data=8",),
    "vocabulary_size": 64,
    "num_layers": 1,
    "hidden_dim": 16,
    "num_query_heads": 4,
    "num_key_value_heads": 4,
    "head_dim": 4,
    "intermediate_dim": 32,
    "max_file_size_mb": 0.004,
}


def test_fsdp_load_reports_shards_peak_and_reads(tmp_path):
    output = tmp_path / "hf_load.md"
    lines = []
    results = bench.run_benchmark(HFLoadBenchSettings(**TINY, output=str(output)), report=lines.append)
    (row,) = results["rows"]
    assert results["failures"] == [] and (row.compared, row.mismatches) == (
        10,
        0,
    )  # 5 weights x 2 device shards, bit for bit
    # float32 bytes per device under fsdp (data=8): embedding (64,16)/8 = 512; query/key/value
    # (16,4,4)/8 = 128 each; output (4,4,16)/8 = 128; gate/up (16,32)/8 = 256 each; down
    # (32,16)/8 = 256; three norms (16,) replicated = 192. Sum 1,984; 3,632 parameters.
    assert (row.parameters, row.sharded, row.largest_shard) == (3632, 1984, 512)
    w = row.watch
    assert w.after_tensor == 1984  # after each assign only the weights are alive
    assert w.before_assign == 1984 and row.peak == 1984  # load_into frees each old value before the new shard arrives
    assert (w.largest_slice, w.oversize, w.slices, row.read_ratio) == (
        512,
        0,
        8 * 8 + 3,
        1.0,
    )  # 8 split weights x 8 devices + 3 norms read once
    scratch = lines[0].split(" to ")[1].split(" in ")[0]
    assert "synthetic (random), 2 safetensors file(s), 7.1 KiB of BF16" in lines[-1] and not os.path.exists(
        scratch
    )  # removed
    line = output.read_text().splitlines()[-1]
    assert line == bench.format_row(row)
    assert line.startswith(
        "| fsdp | data=8 | 3,632 | 1.9 KiB | 1.9 KiB | 1.9 KiB | **1.000x** | yes | 0.5 KiB / 0.5 KiB | 0 of 67 | 1.00x | "
    )
