"""The ops a compiled program runs, and their time at a device's measured rates.

The hand-written module below is in the form a TPU's compiler prints (tiled layouts, dots
as windowed convolutions, an async copy, a splash kernel with its block mask, a scanned
stack sliced in a loop), small enough to count by hand; a real XLA:CPU compile checks the
counts against XLA's own cost analysis.
"""

import dataclasses

import jax
import jax.numpy as jnp
import pytest

from zoo._compat import hlo_text_with_constants, reprinted_hlo
from zoo.measure.hardware import device_spec
from zoo.measure.hlo_ops import executed_ops
from zoo.planning import roofline
from zoo.planning.measure import StepMeasure, extrapolate

TPU_LIKE = """HloModule jit_train_step, entry_computation_layout={()->f32[]}

%fused_projection (param_0: bf16[2,16,32], param_1: bf16[32,4,8]) -> bf16[2,16,4,8] {
  %param_0 = bf16[2,16,32]{2,1,0:T(8,128)(2,1)} parameter(0)
  %param_1 = bf16[32,4,8]{2,1,0:T(8,128)(2,1)} parameter(1)
  %bitcast.1 = bf16[2,16,32,1]{2,1,3,0:T(8,128)(2,1)} bitcast(%param_0)
  %bitcast.2 = bf16[32,4,8,1]{0,2,1,3:T(8,128)(2,1)} bitcast(%param_1)
  ROOT %convolution.1 = bf16[2,16,4,8]{3,1,2,0:T(8,128)(2,1)} convolution(%bitcast.1, %bitcast.2), window={size=1x4 pad=0_0x3_3 rhs_reversal=0x1}, dim_labels=0bf1_i1o0->0b1f
}

%fused_halves (param_0.2: f32[8,128,64]) -> bf16[8,128,32] {
  %param_0.2 = f32[8,128,64]{2,1,0:T(8,128)} parameter(0)
  %slice.1 = f32[8,128,32]{2,1,0:T(8,128)} slice(%param_0.2), slice={[0:8], [0:128], [0:32]}
  ROOT %convert.1 = bf16[8,128,32]{2,1,0:T(8,128)(2,1)} convert(%slice.1)
}

%fused_block (param_0.3: f32[3,64,64], param_1.3: s32[]) -> f32[64,64] {
  %param_0.3 = f32[3,64,64]{2,1,0:T(8,128)} parameter(0)
  %param_1.3 = s32[] parameter(1)
  %constant.9 = s32[] constant(0)
  %dynamic-slice.1 = f32[1,64,64]{2,1,0:T(8,128)} dynamic-slice(%param_0.3, %param_1.3, %constant.9, %constant.9), dynamic_slice_sizes={1,64,64}
  ROOT %bitcast.3 = f32[64,64]{1,0:T(8,128)} bitcast(%dynamic-slice.1)
}

%async_slice (param_0.4: f32[8,128,64]) -> f32[4,128,64] {
  %param_0.4 = f32[8,128,64]{2,1,0:T(8,128)} parameter(0)
  ROOT %slice.2 = f32[4,128,64]{2,1,0:T(8,128)} slice(%param_0.4), slice={[0:4], [0:128], [0:64]}
}

%body (state: (s32[], f32[3,64,64])) -> (s32[], f32[3,64,64]) {
  %state = (s32[], f32[3,64,64]{2,1,0:T(8,128)}) parameter(0)
  %i = s32[] get-tuple-element(%state), index=0
  %stack = f32[3,64,64]{2,1,0:T(8,128)} get-tuple-element(%state), index=1
  %fusion.3 = f32[64,64]{1,0:T(8,128)} fusion(%stack, %i), kind=kLoop, calls=%fused_block
  ROOT %tuple.1 = (s32[], f32[3,64,64]{2,1,0:T(8,128)}) tuple(%i, %stack)
}

%condition (state.1: (s32[], f32[3,64,64])) -> pred[] {
  %state.1 = (s32[], f32[3,64,64]{2,1,0:T(8,128)}) parameter(0)
  ROOT %constant.10 = pred[] constant(true)
}

ENTRY %main (p0: bf16[2,16,32], p1: bf16[32,4,8], p2: f32[8,128,64], p3: f32[3,64,64], q: bf16[1,2,4,256,64], k: bf16[1,2,256,64], v: bf16[1,2,256,64]) -> f32[] {
  %p0 = bf16[2,16,32]{2,1,0:T(8,128)(2,1)} parameter(0)
  %p1 = bf16[32,4,8]{2,1,0:T(8,128)(2,1)} parameter(1)
  %p2 = f32[8,128,64]{2,1,0:T(8,128)} parameter(2)
  %p3 = f32[3,64,64]{2,1,0:T(8,128)} parameter(3)
  %q = bf16[1,2,4,256,64]{4,3,2,1,0:T(8,128)(2,1)} parameter(4)
  %k = bf16[1,2,256,64]{3,2,1,0:T(8,128)(2,1)} parameter(5)
  %v = bf16[1,2,256,64]{3,2,1,0:T(8,128)(2,1)} parameter(6)
  %fusion.1 = bf16[2,16,4,8]{3,1,2,0:T(8,128)(2,1)} fusion(%p0, %p1), kind=kOutput, calls=%fused_projection, metadata={op_name="jit(train_step)/block_0/attention/query/dot_general"}
  %fusion.2 = bf16[8,128,32]{2,1,0:T(8,128)(2,1)} fusion(%p2), kind=kLoop, calls=%fused_halves
  %copy-start.1 = (f32[8,128,64]{2,1,0:T(8,128)}, f32[8,128,64]{2,1,0:T(8,128)S(1)}, u32[]) copy-start(%p2)
  %copy-done.1 = f32[8,128,64]{2,1,0:T(8,128)S(1)} copy-done(%copy-start.1)
  %slice-start.1 = ((f32[8,128,64]{2,1,0:T(8,128)}), f32[4,128,64]{2,1,0:T(8,128)S(1)}, s32[]) async-start(%p2), calls=%async_slice
  %slice-done.1 = f32[4,128,64]{2,1,0:T(8,128)S(1)} async-done(%slice-start.1)
  %constant.1 = s8[1,2,2]{2,1,0:T(4,128)(4,1)} constant({ { { 0, 0 }, { 0, 1 } } })
  %constant.2 = s8[1,2,2]{2,1,0:T(4,128)(4,1)} constant({ { { 1, 0 }, { 2, 1 } } })
  %splash_mqa_fwd_residuals.1 = (f32[1,2,256,128]{3,2,1,0:T(8,128)}, bf16[1,2,4,256,64]{4,3,2,1,0:T(8,128)(2,1)}) custom-call(%constant.1, %constant.2, %q, %k, %v), custom_call_target="tpu_custom_call"
  %custom-call.1 = f32[8,128,64]{2,1,0:T(8,128)} custom-call(%copy-done.1), custom_call_target="ConcatBitcast"
  %zero = s32[] constant(0)
  %init = (s32[], f32[3,64,64]{2,1,0:T(8,128)}) tuple(%zero, %p3)
  %while.1 = (s32[], f32[3,64,64]{2,1,0:T(8,128)}) while(%init), condition=%condition, body=%body, backend_config={"known_trip_count":{"n":"3"}}
  ROOT %constant.11 = f32[] constant(0)
}
"""


@pytest.fixture(scope="module")
def ops():
    return {op.name: op for op in executed_ops(TPU_LIKE)}


def test_only_the_ops_that_do_work_are_listed(ops):
    # parameters, constants, tuples, the loop and its bookkeeping, an async op's end and ConcatBitcast run nothing
    names = ["copy-start.1", "fusion.1", "fusion.2", "fusion.3", "slice-start.1", "splash_mqa_fwd_residuals.1"]
    assert sorted(ops) == names
    assert {name: op.kind for name, op in ops.items()} == {
        "copy-start.1": "async",
        "slice-start.1": "async",
        "fusion.1": "matmul",
        "fusion.2": "memory",
        "fusion.3": "memory",
        "splash_mqa_fwd_residuals.1": "kernel",
    }
    assert ops["fusion.3"].runs == 3 and ops["fusion.1"].runs == 1  # the loop body's trip count


def test_a_dot_written_as_a_windowed_convolution_counts_one_tap_per_output(ops):
    # btc,chd->bthd, b 2, t 16, c 32, h 4, d 8: the window of 4 over a padded size-1 input lands once per output
    assert ops["fusion.1"].flops == 2 * 2 * 16 * 32 * 4 * 8
    assert ops["fusion.1"].op_name == "jit(train_step)/block_0/attention/query/dot_general"


def test_bytes_are_counted_as_the_layout_tiles_hold_them(ops):
    # f32[8,128,64] read (minor 64 padded to 128), bf16[8,128,32] written (minor 32 padded to 128)
    assert ops["fusion.2"].bytes == 8 * 128 * 128 * 4 + 8 * 128 * 128 * 2
    # bf16[2,16,32] in: minor 32 -> 128, rows 16 stay (a multiple of 8 x 2); bf16[32,4,8]: minor 8 -> 128,
    # rows 4 -> 16; out bf16[2,16,4,8] laid out {3,1,2,0}: minor 8 -> 128, next (16) stays
    assert ops["fusion.1"].bytes == (2 * 16 * 128 + 32 * 16 * 128 + 2 * 16 * 4 * 128) * 2


def test_a_stack_sliced_in_a_loop_counts_its_slice(ops):
    # the (3, 64, 64) stack is only dynamic-sliced: one (1, 64, 64) block read (padded 64 -> 128), 64x64
    # written, and the s32 index
    assert ops["fusion.3"].bytes == 64 * 128 * 4 + 64 * 128 * 4 + 4


def test_a_splash_kernel_reads_its_block_mask_and_shapes(ops):
    op = ops["splash_mqa_fwd_residuals.1"]
    assert op.block_fraction == 0.75  # {{1, 0}, {2, 1}}: one pair of blocks of four skipped
    assert roofline.kernel_scores(op) == 1 * 2 * 4 * 256 * 256 * 0.75
    # the same kernel reading (D, T) blocks (splash's SEQ_MINOR, the zoo's layout at head dim 64): q as
    # [..., G, D, T], k and v as [..., D, S]
    minor = tuple(
        (dtype, dims[:-2] + dims[-2:][::-1]) if len(dims) >= 2 else (dtype, dims) for dtype, dims in op.operands
    )
    assert roofline.kernel_scores(dataclasses.replace(op, operands=minor)) == roofline.kernel_scores(op)


def test_a_block_mask_copied_into_the_core_and_printed_whole_is_read():
    # at T = 8,192 the chip's program feeds splash its (1, 8, 8) mask through copy-start / copy-done, and
    # as_text() printed it as {...}: the kernel was counted as visiting every pair of blocks (1.78x)
    causal = [[2 if k < q else 1 if k == q else 0 for k in range(8)] for q in range(8)]
    values = "{ { " + ", ".join("{ " + ", ".join(map(str, row)) + " }" for row in causal) + " } }"
    text = TPU_LIKE.replace(
        "  %splash_mqa_fwd_residuals.1 = ",
        f"  %mask = s8[1,8,8]{{2,1,0:T(8,128)(4,1)}} constant({values})\n"
        "  %copy-start.9 = (s8[1,8,8]{2,1,0:T(8,128)(4,1)S(1)}, s8[1,8,8]{2,1,0:T(8,128)(4,1)}, u32[]) copy-start(%mask)\n"
        "  %copy-done.9 = s8[1,8,8]{2,1,0:T(8,128)(4,1)S(1)} copy-done(%copy-start.9)\n"
        "  %splash_mqa_fwd_residuals.1 = ",
    ).replace("custom-call(%constant.1, %constant.2, %q", "custom-call(%constant.1, %copy-done.9, %q")
    ops = {op.name: op for op in executed_ops(text)}
    assert ops["splash_mqa_fwd_residuals.1"].block_fraction == 36 / 64  # 8 x 9 / 2 of 64 pairs
    elided = text.replace(values, "{...}")
    assert {op.name: op for op in executed_ops(elided)}["splash_mqa_fwd_residuals.1"].block_fraction is None
    # a compiled program printed with its large constants whole, as zoo plan reads it
    mask = jnp.asarray(causal, jnp.int8)[None]
    compiled = jax.jit(lambda x: x * mask).lower(jnp.ones((1, 8, 8), jnp.int8)).compile()
    assert "{...}" in compiled.as_text() and "{...}" not in hlo_text_with_constants(compiled)


def test_the_printer_s_spelling_of_the_same_program_reads_the_same():
    # compiled.as_text() prints through XLA's printer, which writes async slices as slice-start /
    # slice-done: on the chip that text once read as 3.5x the ops of XLA's dump of the same step
    reprinted = reprinted_hlo(TPU_LIKE)
    assert " async-start(" in TPU_LIKE and " slice-start(" in reprinted and " async-start(" not in reprinted

    def read(text):  # all but the opcode's spelling
        return sorted((op.name, op.kind, op.flops, op.bytes, op.runs, op.block_fraction) for op in executed_ops(text))

    assert read(reprinted) == read(TPU_LIKE)


def test_op_time_is_each_op_at_its_bound_plus_a_gap_per_op(ops):
    rates = roofline.OpRates(
        matmul_flops=1e12, bandwidth=1e9, op_gap_s=1e-6, kernel_score_s=(("splash_mqa_fwd", 1e-12),), source="test"
    )
    time = roofline.op_step_time(list(ops.values()), rates)
    fusion_1 = ops["fusion.1"]
    assert time.matmul_s == pytest.approx(max(fusion_1.flops / 1e12, fusion_1.bytes / 1e9))
    assert time.memory_s == pytest.approx(ops["fusion.2"].bytes / 1e9 + 3 * ops["fusion.3"].bytes / 1e9)
    assert time.kernel_s == pytest.approx(2 * 4 * 256 * 256 * 0.75 * 1e-12)
    assert time.ops == 1 + 1 + 3 + 1 and time.gaps_s == pytest.approx(6e-6)  # the async copy is not on the timeline
    assert time.unknown_kernels == ()
    no_rate = roofline.op_step_time(list(ops.values()), dataclasses.replace(rates, kernel_score_s=()))
    assert no_rate.unknown_kernels == ("splash_mqa_fwd_residuals",)  # then timed by its bytes
    assert no_rate.kernel_s == pytest.approx(ops["splash_mqa_fwd_residuals.1"].bytes / 1e9)


def test_a_real_program_counts_what_xla_counts():
    def step(w, x):
        def body(carry, _):
            return jnp.tanh(carry @ w), None

        return jax.lax.scan(body, x, None, length=3)[0].sum()

    w, x = jnp.ones((64, 64), jnp.float32), jnp.ones((16, 64), jnp.float32)
    compiled = jax.jit(step).lower(w, x).compile()
    ops = executed_ops(compiled.as_text())
    matmuls = [op for op in ops if op.kind == "matmul"]
    assert sum(op.flops * op.runs for op in matmuls) == 3 * 2 * 16 * 64 * 64  # the loop's dot, each of 3 trips
    single = jax.jit(lambda a, b: a @ b).lower(x, w).compile()
    (dot,) = [op for op in executed_ops(single.as_text()) if op.kind == "matmul"]
    analysis = single.cost_analysis()
    analysis = analysis[0] if isinstance(analysis, (list, tuple)) else analysis
    assert dot.flops == analysis["flops"] and dot.bytes == analysis["bytes accessed"]


def test_op_time_extrapolates_per_block_and_sets_the_plan_s_step():
    def measure(layers, seconds):
        op_time = {"matmul_s": seconds, "memory_s": 0.0, "kernel_s": 0.0, "gaps_s": 0.0, "ops": 10 * layers}
        memory = dict.fromkeys(("weights", "gradients", "optimizer", "temp", "argument", "output", "alias", "host"), 0)
        return StepMeasure(layers, None, 1, memory, 0.0, 0.0, [], True, 0.0, {**op_time, "unknown_kernels": []})

    deep = extrapolate(measure(1, 1.0), measure(2, 1.5), 8)
    assert deep.op_time["matmul_s"] == pytest.approx(4.5) and deep.op_time["ops"] == 80
    time = roofline.estimate_step_time(
        flops=1.0, bytes_accessed=1.0, collectives=[], mesh_axes=[], spec=device_spec("tpu-v5e"), op_time=deep.op_time
    )
    assert time.step_s == pytest.approx(4.5) and time.ops_s == pytest.approx(4.5)  # the ops', not the roofline's
