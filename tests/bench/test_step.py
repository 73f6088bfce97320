"""``zoo bench step`` in-process on a tiny config (CPU, the suite's 8 simulated devices): the
row's figures against the model and the FLOP formula, the compiled footprint, the table;
the accelerator profile's reading of a trace; no timing thresholds."""

import dataclasses
import gzip
import json
import math
import re
import types

import jax
import keras
import numpy as np
import pytest

from tests.bench._cli import parse_bench_args
from zoo.bench import _device_profile as profile
from zoo.bench._output import size_text
from zoo.bench.step import (
    WEIGHT_STD,
    _attention_words,
    flops_per_step,
    format_report,
    random_quantized_weights,
    run_benchmark,
)
from zoo.cli.bench import settings_from_args
from zoo.layers import ColumnParallelDense
from zoo.measure import mfu
from zoo.models import GPTCausalLM
from zoo.models.gpt.gpt_configs import at_depth, config_by_name, count_parameters
from zoo.planning.roofline import MEASURED_RATES, OpRates


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_the_random_quantized_base_has_weights_of_the_stated_spread(mode):
    """``random_quantized_weights``: a layer built quantized gets weights (as its own
    quantized call dequantizes them) uniform with standard deviation 0.02."""
    layer = ColumnParallelDense(96, dtype=f"{mode}_from_float32")
    layer.build((None, 256))
    random_quantized_weights(layer, seed=0)
    weights = np.asarray(layer(np.eye(256, dtype="float32")))  # (256, 96): x = I gives the kernel
    step = WEIGHT_STD * 3**0.5 / (127 if mode == "int8" else 8)  # one quantization level
    assert weights.std() == pytest.approx(WEIGHT_STD, rel=0.05)
    assert abs(weights.mean()) < 0.6 * step + 0.001  # int4's levels -8..7 sit half a level low
    assert np.abs(weights).max() <= WEIGHT_STD * 3**0.5 * 1.01  # uniform on [-a, a]


def test_a_scanned_row_names_the_attention_its_blocks_run():
    """The attention column of a ``--scan-layers`` row: the stacked blocks' template's kernel,
    as the layers' row names its first block's (not just "scanned blocks")."""
    settings = types.SimpleNamespace(sequence_length=32)
    words = {}
    for scan in (False, True):
        model = GPTCausalLM.from_config_name("gpt_tiny", scan_layers=scan)
        model(np.zeros((1, 32), "int32"))
        words[scan] = _attention_words(model, settings)
    assert words[True] == words[False] == "blockwise (tile 32)"


def test_the_row_measures_the_jobs_step(tmp_path, monkeypatch):
    """A QLoRA step (int4 base) under remat and the loss in chunks: the row against the model
    and the formula (LoRA's); the train step's FLOPs are the training formula (its row is
    the same code); ``--plan`` times a fine-tune's own program op by op (rates where every op
    costs 1 ms: the planned step is its op count in ms)."""
    rates = OpRates(matmul_flops=math.inf, bandwidth=math.inf, op_gap_s=1e-3, kernel_score_s=(), source="test")
    monkeypatch.setitem(MEASURED_RATES, "cpu", rates)
    output = tmp_path / "step.md"
    args = ["--config-name", "gpt_tiny", "--sequence-length", "32", "--batch-size", "8", "--steps", "1"]
    args += ["--repeats", "2", "--method", "qlora", "--quantize", "int4", "--lora-rank", "2", "--remat", "full"]
    args += ["--loss-chunk-size", "16", "--plan"]
    settings = settings_from_args("step", parse_bench_args("step", args + ["--output", str(output)]))
    (row,) = run_benchmark(settings, report=lambda line: None)
    plan_line = next(line for line in output.read_text().splitlines() if line.startswith("zoo plan for this step"))
    ops = int(re.search(r"own compiled program \(([0-9,]+) ops\)", plan_line).group(1).replace(",", ""))
    assert ops > 100 and f"step {ops:.1f} ms" in plan_line
    compiled = size_text(row["compiled_bytes"])  # the plan's peak against the compiled one; CPU keeps no counters
    assert re.search(rf"peak [0-9.]+ [KMG]iB \([+-][0-9.]+% against the {re.escape(compiled)} compiled\)", plan_line)

    config = config_by_name("gpt_tiny")
    assert row["flops_per_step"] == mfu.gpt_lora_flops_per_token(config, 32) * 8 * 32
    train = dataclasses.replace(settings, method="train", quantize=None)
    assert (
        flops_per_step(train, GPTCausalLM.from_config_name("gpt_tiny")) == mfu.gpt_flops_per_token(config, 32) * 8 * 32
    )
    assert len(row["steps_s"]) == 2 and row["step_s"] == pytest.approx(sum(row["steps_s"]) / 2)  # the median
    assert row["tokens_per_s"] == pytest.approx(8 * 32 / row["step_s"])
    assert row["mfu"] is None  # CPU: no peak to divide by
    assert row["parameters"] > count_parameters(config)  # gpt_tiny's float count and the LoRA factors beside it
    assert 0 < row["compiled_bytes"] < 64 * 2**20  # the compiled step's footprint per device, a tiny model's
    table = output.read_text()
    assert f"| zoo | {row['parameters']:,} |" in table and "method qlora (rank 2), base int4" in table
    assert keras.distribution.distribution() is not None  # the job's data layout over the 8 devices
    keras.distribution.set_distribution(None)
    assert "moments" not in table and "second moment" not in table  # the defaults go unsaid
    state = dataclasses.replace(settings, moment_dtype="bfloat16", second_moment="factored")
    assert (
        format_report(state, [row])
        .splitlines()[0]
        .endswith(
            "loss in chunks of 16, moments bfloat16, second moment factored; a step: what a fit of 2 steps adds "
            "over one of 1, median of 2 interleaved pairs; "
            f"jax {jax.__version__}, keras {keras.__version__}"
        )
    )
    odd = dataclasses.replace(settings, batch_size=2)  # refused in one line, before anything is built
    with pytest.raises(
        ValueError, match="^--batch-size 2 does not split over this host's 8 devices .* a multiple of 8"
    ):
        run_benchmark(odd, report=lambda line: None)


def _event(name, ts, dur, tf_op=None, category="loop fusion", flops=0, tid=3):
    args = {} if tf_op is None else {"tf_op": tf_op, "hlo_category": category, "model_flops": str(flops)}
    return {"ph": "X", "pid": 1, "tid": tid, "name": name, "ts": ts, "dur": dur, "args": args}


def test_the_profile_counts_innermost_ops_per_part(tmp_path):
    """Two steps of 100 us; a while loop (20 us) around two attention ops (8 + 7 us): only
    the two inner ops count; matmul / Pallas / elementwise kinds; the host's share."""
    meta = [
        {"ph": "M", "pid": 1, "tid": tid, "name": "thread_name", "args": {"name": name}}
        for tid, name in ((1, "Steps"), (3, "XLA Ops"))
    ]
    steps = [_event("1", 0, 100, tid=1), _event("2", 100, 100, tid=1)]
    ops = []
    for start in (0, 100):
        ops += [
            _event(
                "fusion.1",
                start,
                30,
                "jit(train_step)/jvp(gpt_backbone)/block_0/mlp/up/dot_general",
                "convolution fusion",
                3e6,
            ),
            _event("while.2", start + 30, 20, "jit(train_step)/jvp(gpt_backbone)/block_0/attention/while"),
            _event(
                "fusion.3",
                start + 31,
                8,
                "jit(train_step)/block_0/attention/while/body/dot_general",
                "convolution fusion",
            ),
            _event("custom.4", start + 40, 7, "jit(train_step)/block_0/attention/splash", "custom-call"),
            _event("fusion.5", start + 60, 10, "jit(train_step)/adam_w/sub"),
            _event(
                "fusion.6", start + 70, 5, "jit(train_step)/transpose(jvp(lm_head))/dot_general", "convolution fusion"
            ),
        ]
    path = tmp_path / "plugins" / "profile" / "run" / profile.TRACE_FILE
    path.parent.mkdir(parents=True)
    with gzip.open(path, "wt") as handle:
        json.dump({"traceEvents": meta + steps + ops + [_event("host", 0, 50, tid=9)]}, handle)

    result = profile.device_profile(profile.read_trace(str(tmp_path)))
    assert result.steps == 2 and result.step_ms == pytest.approx(0.1)
    assert result.parts == pytest.approx(
        {"MLP": 0.03, "attention": 0.015, "optimizer update": 0.01, "LM head and loss": 0.005}
    )
    assert result.kinds == pytest.approx({"matmul": 0.043, "Pallas kernel": 0.007, "elementwise and other": 0.01})
    assert result.host_ms == pytest.approx(0.1 - 0.06)
    assert result.flops["MLP"] == 3e6
    text = profile.format_profile(result, step_s=1e-4)
    assert "| MLP | 0.0 | 30.0% |" in text and "| host and idle (no device op) | 0.0 | 40.0% | |" in text
    # the slowest ops: every block's same op one row, per step, its FLOP rate
    assert result.ops[("jit(train_step)/jvp(gpt_backbone)/block_*/mlp/up/dot_general", "convolution fusion")] == (
        pytest.approx(0.03),
        pytest.approx(3e6),
        0.0,
    )
    assert "| `jvp(gpt_backbone)/block_*/mlp/up/dot_general` | convolution fusion | 0.03 | 30.0% | 0.1 | 0 |" in text
    assert profile.device_profile(meta + steps) is None  # no op names (XLA:CPU's trace): no table

    # fit's other programs on the Steps line (3 more events) and an op whose rounded end
    # overlaps the next one's start: per traced step, and both ops are leaves
    extra = [_event("metrics", 200 + i, 0.5, tid=1) for i in range(3)]
    touching = [
        _event("fusion.7", 300, 10.004, "jit(train_step)/block_0/mlp/down/dot_general", "convolution fusion"),
        _event("fusion.8", 310, 10, "jit(train_step)/block_0/mlp/down/dot_general", "convolution fusion"),
    ]
    result = profile.device_profile(meta + steps + extra + ops + touching, steps=2)
    assert result.steps == 2 and result.parts["MLP"] == pytest.approx(0.03 + (10.004 + 10) / 2e3)
    assert result.step_ms == pytest.approx(0.1 + 0.00075)


def test_parts_and_kinds_are_named_by_the_op_path():
    assert profile.part_of("jit(train_step)/jvp(gpt_backbone)/blocks/while/body/attention/dot_general") == "attention"
    assert (
        profile.part_of("jit(train_step)/jvp(compile_loss)/sparse_categorical_crossentropy/exp") == "LM head and loss"
    )
    assert profile.part_of("jit(train_step)/jvp(gpt_backbone)/block_2/post_attention_norm/mul") == "norms"
    assert profile.part_of("jit(train_step)/convert_element_type") == "other"
    assert profile.kind_of("all-reduce") == "collective" and profile.kind_of("convolution fusion") == "matmul"
    assert at_depth(config_by_name("gpt_1b"), 8)["num_layers"] == 8


def test_the_peers_error_is_its_exception_line_and_its_parameters_are_checked():
    """A worker's failure is reported by its exception line, not by what JAX printed
    after it (on a TPU the peer once showed only "For simplicity, JAX has removed ...")."""
    import subprocess

    from zoo.bench._step_peer import ParameterMismatch, check_same_parameters, error_line

    stderr = (
        "Traceback (most recent call last):\n  File 'x.py', line 1\n"
        "jax.errors.JaxRuntimeError: UNAVAILABLE: TPU in use by process 7\n"
        "--------------------\nFor simplicity, JAX has removed its internal frames from the traceback\n"
    )
    done = subprocess.CompletedProcess([], 1, "", stderr)
    assert error_line(done) == "jax.errors.JaxRuntimeError: UNAVAILABLE: TPU in use by process 7"
    assert error_line(subprocess.CompletedProcess([], -9, "", "")) == "exit -9"
    check_same_parameters({"parameters": 5}, {"parameters": 5})
    check_same_parameters({"error": "x"}, {"parameters": 5})
    with pytest.raises(ParameterMismatch, match="keras-hub's Llama has 4 parameters, the zoo's 5"):
        check_same_parameters({"parameters": 4}, {"parameters": 5})


def test_a_step_is_what_more_steps_add_and_the_fits_own_cost_is_apart(monkeypatch):
    """``time_fits`` on a fake clock: each fit takes 50 ms (its start and end) + 100 ms a step,
    the compiling one 2 s more; in the third pair noise makes the 6-step fit shorter than the
    3-step one, and that pair's step falls back to the 6-step fit's mean."""
    from zoo.bench import _step_timing

    # calls: the compiling fit(1), the warm fit(3), then (fit(3), fit(6)) x 3
    durations = iter([2.15, 0.35, 0.35, 0.65, 0.35, 0.65, 0.35, 0.25])
    clock = {"now": 0.0}
    monkeypatch.setattr(_step_timing.time, "perf_counter", lambda: clock["now"])

    def fit(steps):
        clock["now"] += next(durations)

    settings = dataclasses.make_dataclass("Settings", ["steps", "repeats"])(steps=3, repeats=3)
    compile_s, steps, overhead = _step_timing.time_fits(fit, settings)
    assert steps == pytest.approx([0.1, 0.1, 0.25 / 6])
    assert compile_s == pytest.approx(2.15 - 0.1)  # the first fit less one (median) step
    assert overhead == pytest.approx(0.35 - 3 * 0.1)  # the 3-step fit less its steps


def test_device_memory_reports_every_counter_the_device_keeps(monkeypatch):
    """On an accelerator the bench logs all of the device's memory counters in one line, and
    its peak is the buffers in use plus what the runtime reserved for the program's
    temporaries (the TPU keeps them apart); CPU keeps none."""
    import jax

    from zoo.bench._step_timing import device_memory

    class Device:  # the counters a TPU's PJRT client reports, as JAX returns them
        def memory_stats(self):
            return {
                "bytes_limit": 16_910_123_008,
                "peak_bytes_in_use": 3_066_302_464,
                "peak_bytes_reserved": 1_940_078_592,
            }

    lines = []
    assert device_memory(lines.append) == {"peak_bytes": None, "limit_bytes": None} and lines == []  # CPU
    monkeypatch.setattr(jax, "devices", lambda: [Device()])
    assert device_memory(lines.append) == {"peak_bytes": 3_066_302_464 + 1_940_078_592, "limit_bytes": 16_910_123_008}
    assert lines == [
        "device memory counters: bytes_limit 16,910,123,008, peak_bytes_in_use 3,066,302,464, "
        "peak_bytes_reserved 1,940,078,592"
    ]
    monkeypatch.setattr(Device, "memory_stats", lambda self: {"bytes_limit": 8_000_000, "peak_bytes_in_use": 5_000_000})
    assert device_memory() == {"peak_bytes": 5_000_000, "limit_bytes": 8_000_000}  # no reservation counter (a GPU)
