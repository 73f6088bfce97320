"""``zoo bench lora-context`` on a tiny model: one fsdp row compiled (never run), its
table against ``memory_analysis``, the LoRA factors split as a concrete build splits
them, and the flags."""

import dataclasses

import pytest

from tests.bench._cli import parse_bench_args
from zoo.bench import lora_context_memory as bench
from zoo.cli import bench as bench_cli
from zoo.config.bench_settings import LoraContextBenchSettings

TINY = {
    "sequence_lengths": (32,),
    "layouts": ("fsdp",),
    "remats": ("none",),
    "vocabulary_size": 64,
    "num_layers": 1,
    "hidden_dim": 16,
    "num_query_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "intermediate_dim": 32,
    "lora_rank": 2,
}


def test_fsdp_row_reports_memory_analysis_and_splits_lora_factors_as_fit_does(tmp_path):
    output = tmp_path / "lora.md"
    settings = LoraContextBenchSettings(**TINY, output=str(output))
    (row,) = bench.run_benchmark(settings, report=lambda line: None)["rows"]
    analysis = row.compiled.memory_analysis()
    m = row.memory
    assert (m.temp, m.argument, m.output, m.alias) == (
        analysis.temp_size_in_bytes,
        analysis.argument_size_in_bytes,
        analysis.output_size_in_bytes,
        analysis.alias_size_in_bytes,
    )
    assert row.total == m.argument + m.output - m.alias + m.temp and (row.mesh, row.batch, row.tokens_per_device) == (
        "data=8",
        8,
        32,
    )
    # Only the LoRA factors train (r = 2), each laid out like its kernel, as enable_lora lays
    # them out in a concrete build under fsdp (data=8): a split where the kernel's input dims
    # are, b where its output dim is. Elements per device: query/key/value a (16,2,2)/8 + b (2,8)
    # = 24 each; output a (2,8,2) + b (2,16)/8 = 36; gate/up a (16,2)/8 + b (2,32) = 68 each;
    # down a (32,2) + b (2,16)/8 = 68: 312 float32. Replicated (the abstract build without
    # pin_factor_layouts): 592.
    assert m.gradients == 312 * 4
    assert row.collectives["all-gather"] >= 1 and "collective-permute" not in row.collectives
    line = output.read_text().splitlines()[-1]
    assert line == bench.format_row(row)
    assert line.startswith(
        f"| fsdp | data=8 | none | 32 | 8 | 32 | {m.temp / 1024:,.1f} KiB | {m.argument / 1024:,.1f} KiB | "
    )
    assert f"**{row.total / 1024:,.1f} KiB** | yes / yes |" in line


def _parse(argv):
    return parse_bench_args("lora-context", argv)


def test_cli_flags_cover_the_config_and_keep_its_defaults():
    assert bench_cli.settings_from_args("lora-context", _parse([])) == LoraContextBenchSettings()
    settings = bench_cli.settings_from_args(
        "lora-context", _parse(["--sequence-lengths", "4096", "--layouts", "fsdp", "--remats", "full"])
    )
    assert (settings.sequence_lengths, settings.layouts, settings.remats) == ((4096,), ("fsdp",), ("full",))
    assert set(vars(_parse([]))) - {"bench", "func", "simulate_devices"} == {
        f.name for f in dataclasses.fields(LoraContextBenchSettings)
    }


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"layouts": ("tp",)}, "layout 'tp' is not measured here"),
        ({"sequence_lengths": (40,), "layouts": ("context",)}, "sequence length 40 is not divisible by 16"),
        ({"devices": 16}, "16 devices asked for but JAX has 8"),
    ],
)
def test_bad_settings_are_refused_before_compiling(settings, message):
    with pytest.raises(ValueError, match=message):
        bench.run_benchmark(LoraContextBenchSettings(**{**TINY, **settings}), report=lambda line: None)
