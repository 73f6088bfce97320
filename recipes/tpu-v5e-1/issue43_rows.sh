#!/usr/bin/env bash
# The rows of issue 43's table on one TPU v5e chip, each one `zoo bench step` in its own
# process (the device's peak counter is then the row's own), reports appended to
# $OUT/step.md and the log to $OUT/log.txt. About 100-150 s a row (two compiles of the
# step, 33-41 s each at 8 layers before this change: fit's, and the compiled footprint's);
# under the device tool's 10 minutes a call, run it in parts: `issue43_rows.sh 1`,
# `2`, `3` (the keras-hub rows, two more processes), `4` (gpt_350m), `5` (zoo plan on the chip
# for part 1's and part 4's steps: memory from the chip's compiler, time from XLA:CPU's count;
# on any other machine zoo plan compiles them on simulated CPU devices, an upper bound),
# `6` (part 1's gpt_1b rows with AdamW's moments in bfloat16), `7` (llama_3_2_1b's LoRA under
# lighter remat policies), `8` (qwen3_0.6b's full fine-tune: other remat policies and batches),
# `9` (`--remat auto` choosing on the chip, for part 7's and part 8's steps), `10` (part 6's
# gpt_1b batch-2 row, bfloat16 moments, with the loss in chunks: the keras-hub comparison's step),
# `11` (the loss in chunks with its gradient in the forward pass, on qwen3_0.6b's best row; 8 vs
# 28 scanned layers' compile; llama_3_2_1b's full fine-tune with AdamW's state in bfloat16 and
# factored, issue 48), `12` (gpt_1b with bfloat16 and factored moments), `13` (gpt_350m profiled), `14` (part 12's rows and qwen3_0.6b's best, a step timed
# apart from the fit's start and end), `15` (keras-hub beside gpt_1b, timed as part 14), `16` (scanned vs unscanned steps), `17` (AdamW's
# moments in host memory, and the plan of the 1B full fine-tune), `18` (part 17's host-memory row
# again; qwen3_0.6b at batch 8, unscanned), `19` (gpt_1b b2 profiled with its trace kept in
# $OUT for a per-op reading, then b2 and b4 with XLA's scoped VMEM raised to 96 MiB), `20`
# (an experiment run at e85b2df, not kept), `21` (gpt_350m profiled op by op), `22` (part 21 with the tanh GELU), `23` and `24` (issue 48: qwen3_8b's QLoRA, int8 base, remat save_attention / full), `25` (part 23 with
# fewer steps timed and every compile's seconds in log.txt: part 23 ran past a call's 590 s twice), `26`
# (part 7's LoRA rows with the blocks stacked: LoRA on scanned blocks), `27` (part 26 at batch 8, and
# without remat at batch 4), `28` (part 25's QLoRA with the int8 blocks stacked, batch 1 and 2), `29` (gpt_1b b2, gpt_350m b8 and
# llama_3_2_1b's LoRA profiled with their optimised HLO and device ops kept: the per-op time model's inputs),
# `30` and `31` (zoo plan's op-by-op time beside the measured step, on rows it was not calibrated on),
# `32` (the attention sublayer written six ways; part 31's qwen3_0.6b row again), `33` (RoPE four ways,
# then gpt_350m's and the LoRA's rows with the fastest), `36` (part 15 with the library's RoPE by matmul),
# `37` (gpt_350m with the library's RoPE by matmul, and gpt_1b b4 under remat full, with --plan), `38` (splash's q, k, v
# layouts, then gpt_1b b2 and b4 with the fastest), `39` (part 37's remat-full row, its plan reading (D, T) blocks),
# `40` (which memory counter sees a program's temporaries, memory_counters.py; gpt_350m's plan reading (D, T) blocks),
# `41` (an experiment: splash's forward with its P.V product in bfloat16, splash_pv_dtype.py; gpt_1b b2 and b4 with it),
# `42` (the LoRA row and the remat-full row with --plan, the device's peak read as in use + reserved),
# `43` (gpt_1b b2 and b4 with bfloat16 weights: --precision bfloat16, AdamW rounding each update stochastically),
# `44` (qwen3_0.6b's best full fine-tune row and issue 43's 1 x 8192 remat-full row, each with --plan),
# `45` (part 44's 1 x 8192 row alone: its plan's compile ran past part 44's limit),
# `46` (part 45's row profiled as part 29's rows: its device ops and optimised HLO, for splash's time per score at T = 8,192),
# `47` (issue 44's attention rows at 2k, 8k and 32k: the library's splash and other blocks, splash_long.py), `48` (part 47 with
# blocks of 2,048 under a raised scoped VMEM), `49` (the 1 x 8192 row with the long keys' blocks and with square ones).
# Parts 7 to 9 keep JAX's persistent compilation cache in /tmp/jax-cache: the compiled
# footprint's compile is then the same program as fit's, read back instead of compiled again.
#
#   source .device/tpu-env.sh && OUT=/tmp/out bash recipes/tpu-v5e-1/issue43_rows.sh 1
set -uo pipefail
part=${1:-1}
row() {  # row SECONDS ARGS...: one zoo bench step, its report appended whatever happens
    local limit=$1
    shift
    echo "### zoo bench step $*" >> "$OUT/step.md"
    if timeout "$limit" python3 -m zoo bench step "$@" --output /tmp/row.md >> "$OUT/log.txt" 2>&1; then
        cat /tmp/row.md >> "$OUT/step.md"
    else
        echo "FAILED or timed out (exit $?); see log.txt" >> "$OUT/step.md"
    fi
    echo >> "$OUT/step.md"
}
plan() {  # plan SECONDS ARGS...: zoo plan of one chip's step, whole depth, appended whatever happens
    local limit=$1
    shift
    echo "### zoo plan --devices 1 --device tpu-v5e --layout single --precision mixed_bfloat16 --depth full $*" >> "$OUT/step.md"
    timeout "$limit" python3 -m zoo plan --devices 1 --device tpu-v5e --layout single --precision mixed_bfloat16 \
        --depth full "$@" >> "$OUT/step.md" 2>> "$OUT/log.txt" || echo "FAILED or timed out (exit $?)" >> "$OUT/step.md"
    echo >> "$OUT/step.md"
}
case "$part" in
1)
    row 150 --config-name gpt_1b --num-layers 8 --batch-size 2 --profile
    row 150 --config-name gpt_1b --num-layers 8 --batch-size 4 --profile
    row 150 --config-name gpt_1b --num-layers 8 --batch-size 4 --remat save_attention
    ;;
2)
    row 150 --config-name qwen3_0.6b --method full --batch-size 4 --remat full --loss-chunk-size 512 --scan-layers
    row 200 --config-name llama_3_2_1b --method lora --lora-rank 16 --batch-size 4 --remat full --loss-chunk-size 512
    row 200 --config-name gpt_350m --sequence-length 1024 --batch-size 8
    ;;
3)
    row 500 --config-name gpt_1b --num-layers 8 --batch-size 2 --peer keras-hub
    ;;
4)
    row 300 --config-name gpt_350m --sequence-length 1024 --batch-size 8
    ;;
5)  # zoo plan on the chip itself (compiles_here: memory from the TPU compiler, FLOPs and bytes
    # from an XLA:CPU compile of the same step), beside the "compiled step" of parts 1 and 4
    plan 170 --config-name gpt_1b --num-layers 8 --sequence-length 2048 --batch-size 2
    plan 170 --config-name gpt_1b --num-layers 8 --sequence-length 2048 --batch-size 4
    plan 170 --config-name gpt_350m --sequence-length 1024 --batch-size 8
    ;;
6)  # AdamW's moments in bfloat16 (zoo.training.optimizers), against part 1's float32 rows
    row 150 --config-name gpt_1b --num-layers 8 --batch-size 2 --moment-dtype bfloat16
    row 150 --config-name gpt_1b --num-layers 8 --batch-size 4 --moment-dtype bfloat16
    ;;
7)  # llama_3_2_1b LoRA: full remat recomputes a forward that LoRA's backward (no weight gradients) barely outweighs
    export JAX_COMPILATION_CACHE_DIR=/tmp/jax-cache JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=1
    row 260 --config-name llama_3_2_1b --method lora --lora-rank 16 --batch-size 4 --remat none --loss-chunk-size 512
    row 260 --config-name llama_3_2_1b --method lora --lora-rank 16 --batch-size 4 --remat save_attention --loss-chunk-size 512
    ;;
8)  # qwen3_0.6b full fine-tune, float32 AdamW (issue 43's row): remat policies and the largest batch
    export JAX_COMPILATION_CACHE_DIR=/tmp/jax-cache JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=1
    row 120 --config-name qwen3_0.6b --method full --batch-size 4 --remat dots_saveable --loss-chunk-size 512 --scan-layers
    row 120 --config-name qwen3_0.6b --method full --batch-size 8 --remat full --loss-chunk-size 512 --scan-layers
    row 120 --config-name qwen3_0.6b --method full --batch-size 8 --remat save_attention --loss-chunk-size 512 --scan-layers
    ;;
9)  # --remat auto (zoo.training.remat_choice): the policy each step gets, and fit's compile read back from the cache
    export JAX_COMPILATION_CACHE_DIR=/tmp/jax-cache JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=1
    row 280 --config-name llama_3_2_1b --method lora --lora-rank 16 --batch-size 4 --remat auto --loss-chunk-size 512
    row 250 --config-name qwen3_0.6b --method full --batch-size 8 --remat auto --loss-chunk-size 512 --scan-layers
    grep "^remat " "$OUT/log.txt" >> "$OUT/step.md"
    ;;
10)  # gpt_1b b2 with bf16 moments: the loss in chunks of 1,024 and 512 positions (no (B, T, V) float32 logits)
    row 170 --config-name gpt_1b --num-layers 8 --batch-size 2 --moment-dtype bfloat16 --loss-chunk-size 1024
    row 170 --config-name gpt_1b --num-layers 8 --batch-size 2 --moment-dtype bfloat16 --loss-chunk-size 512
    ;;
11)  # the loss in chunks with its gradient in the forward pass, on qwen3_0.6b's best row; compile
    # time in depth (8 vs 28 scanned layers); llama_3_2_1b's full fine-tune with AdamW's state in
    # bfloat16 and factored (issue 48), scanned
    export JAX_COMPILATION_CACHE_DIR=/tmp/jax-cache JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=1
    row 150 --config-name qwen3_0.6b --method full --batch-size 4 --remat save_attention --loss-chunk-size 512 --scan-layers
    row 120 --config-name qwen3_0.6b --num-layers 8 --method full --batch-size 4 --remat save_attention --loss-chunk-size 512 --scan-layers
    row 300 --config-name llama_3_2_1b --method full --batch-size 2 --remat auto --loss-chunk-size 512 \
        --moment-dtype bfloat16 --second-moment factored --scan-layers
    grep "^remat " "$OUT/log.txt" >> "$OUT/step.md"
    ;;
12)  # gpt_1b b2 and b4 with AdamW's first moment in bfloat16 and its second factored (a weight's
    # rows and columns, issue 48): the update's bytes a parameter 28 -> 16; b2 profiled
    export JAX_COMPILATION_CACHE_DIR=/tmp/jax-cache JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=1
    row 200 --config-name gpt_1b --num-layers 8 --batch-size 2 --moment-dtype bfloat16 --second-moment factored --profile
    row 170 --config-name gpt_1b --num-layers 8 --batch-size 4 --moment-dtype bfloat16 --second-moment factored
    ;;
13)  # gpt_350m profiled, AdamW's moments in bfloat16: where its 38% goes
    export JAX_COMPILATION_CACHE_DIR=/tmp/jax-cache JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=1
    row 400 --config-name gpt_350m --sequence-length 1024 --batch-size 8 --moment-dtype bfloat16 --profile
    ;;
14)  # a step timed as what a fit's 10 more steps add (zoo.bench._step_timing.time_fits), a
    # fit's own start and end apart: gpt_1b b2 (float32, and bfloat16 + factored AdamW), b4, qwen3
    export JAX_COMPILATION_CACHE_DIR=/tmp/jax-cache JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=1
    row 150 --config-name gpt_1b --num-layers 8 --batch-size 2
    row 150 --config-name gpt_1b --num-layers 8 --batch-size 2 --moment-dtype bfloat16 --second-moment factored
    row 150 --config-name gpt_1b --num-layers 8 --batch-size 4 --moment-dtype bfloat16 --second-moment factored
    row 120 --config-name qwen3_0.6b --method full --batch-size 4 --remat save_attention --loss-chunk-size 512 --scan-layers
    ;;
15)  # keras-hub side by side, both timed as part 14 times a step
    row 500 --config-name gpt_1b --num-layers 8 --batch-size 2 --peer keras-hub
    ;;
16)  # is the scanned step slower per step? (issue 43 item 4: scan as the default
    # where it is not) gpt_1b b2 scanned, against part 14's unscanned row; qwen3_0.6b b4 unscanned,
    # against part 14's scanned row
    export JAX_COMPILATION_CACHE_DIR=/tmp/jax-cache JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=1
    row 150 --config-name gpt_1b --num-layers 8 --batch-size 2 --moment-dtype bfloat16 --second-moment factored --scan-layers
    row 400 --config-name qwen3_0.6b --method full --batch-size 4 --remat save_attention --loss-chunk-size 512
    ;;
17)  # AdamW's moments in host memory on the chip (issue 48): the HBM they free and
    # the transfer's cost a step, llama_3_2_1b full fine-tune (part 11's row) and gpt_1b b4
    export JAX_COMPILATION_CACHE_DIR=/tmp/jax-cache JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=1
    row 300 --config-name llama_3_2_1b --method full --batch-size 2 --remat auto --loss-chunk-size 512 \
        --moment-dtype bfloat16 --second-moment factored --state-memory host --scan-layers
    row 170 --config-name gpt_1b --num-layers 8 --batch-size 4 --state-memory host
    plan 170 --config-name llama_3_2_1b --sequence-length 2048 --batch-size 2 --remat save_attention \
        --loss-chunk-size 512 --moment-dtype bfloat16 --second-moment factored --scan-layers
    grep "^remat " "$OUT/log.txt" >> "$OUT/step.md"
    ;;
18)  # run once with an experiment not kept (each host moment fetched behind an optimization barrier
    # with its gradient; no change on the chip: docs/performance.md, sixth session): part 17's
    # llama_3_2_1b row again; qwen3_0.6b's float32 AdamW at batch 8, unscanned, full remat
    export JAX_COMPILATION_CACHE_DIR=/tmp/jax-cache JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=1
    row 250 --config-name llama_3_2_1b --method full --batch-size 2 --remat auto --loss-chunk-size 512 \
        --moment-dtype bfloat16 --second-moment factored --state-memory host --scan-layers
    grep "^remat " "$OUT/log.txt" >> "$OUT/step.md"
    row 330 --config-name qwen3_0.6b --method full --batch-size 8 --remat full --loss-chunk-size 512
    ;;
19)  # where gpt_1b's b2 step goes op by op: the profiler's trace copied to $OUT (read with
    # recipes/tpu-v5e-1/top_ops.py); then b2 and b4 compiled with the TPU compiler's scoped
    # VMEM limit raised from its default to 96 MiB (a flag MaxText's v6e recipes set), each in
    # its own compilation cache: the persistent cache's key does not hold LIBTPU_INIT_ARGS
    export JAX_COMPILATION_CACHE_DIR=/tmp/jax-cache JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=1
    rm -rf /tmp/zoo-bench-step-trace-*
    row 200 --config-name gpt_1b --num-layers 8 --batch-size 2 --moment-dtype bfloat16 --second-moment factored --profile
    find /tmp/zoo-bench-step-trace-* \( -name "*.trace.json.gz" -o -name perfetto_trace.json.gz \) | head -2 |
        while read -r f; do cp "$f" "$OUT/gpt_1b_b2_$(basename "$f")"; done
    export JAX_COMPILATION_CACHE_DIR=/tmp/jax-cache-vmem LIBTPU_INIT_ARGS="--xla_tpu_scoped_vmem_limit_kib=98304"
    row 150 --config-name gpt_1b --num-layers 8 --batch-size 2 --moment-dtype bfloat16 --second-moment factored
    row 150 --config-name gpt_1b --num-layers 8 --batch-size 4 --moment-dtype bfloat16 --second-moment factored
    ;;
20)  # part 19's profile showed the output projection's einsum over (h, d) at 126-131 TFLOP/s
    # where the query projection's ran at 179-188; run at e85b2df, where it was one matmul over
    # H*D (not kept: docs/performance.md, eighth session); at any later commit it measures the einsum
    export JAX_COMPILATION_CACHE_DIR=/tmp/jax-cache JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=1
    row 240 --config-name gpt_1b --num-layers 8 --batch-size 2 --moment-dtype bfloat16 --second-moment factored --profile
    row 230 --config-name gpt_1b --num-layers 8 --batch-size 4 --moment-dtype bfloat16 --second-moment factored
    ;;
21)  # gpt_350m's step op by op (part 13 profiled it by part: MLP at 116 TFLOP/s, 24 ms of gaps)
    export JAX_COMPILATION_CACHE_DIR=/tmp/jax-cache JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=1
    row 420 --config-name gpt_350m --sequence-length 1024 --batch-size 8 --moment-dtype bfloat16 --profile
    ;;
22)  # part 21's row with GPT-2's tanh GELU (gpt_350m's mlp is now gelu_tanh; it was the exact erf GELU)
    export JAX_COMPILATION_CACHE_DIR=/tmp/jax-cache JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=1
    row 420 --config-name gpt_350m --sequence-length 1024 --batch-size 8 --moment-dtype bfloat16 --profile
    ;;
23)  # issue 48: qwen3_8b's LoRA over an int8 base built quantized (8.2B parameters; 16.4 GB in bf16)
    export JAX_COMPILATION_CACHE_DIR=/tmp/jax-cache JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=1
    row 540 --config-name qwen3_8b --method qlora --quantize int8 --batch-size 1 --remat save_attention \
        --loss-chunk-size 512 --steps 5 --repeats 2
    ;;
24)  # part 23's row under remat full (if save_attention's does not fit)
    export JAX_COMPILATION_CACHE_DIR=/tmp/jax-cache JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=1
    row 540 --config-name qwen3_8b --method qlora --quantize int8 --batch-size 1 --remat full \
        --loss-chunk-size 512 --steps 5 --repeats 2
    ;;
25)  # part 23's row in one call's time: 2 + 2 x 2 steps timed, each compile logged with its seconds
    export JAX_COMPILATION_CACHE_DIR=/tmp/jax-cache JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=1
    export JAX_LOG_COMPILES=1 PYTHONUNBUFFERED=1
    row 570 --config-name qwen3_8b --method qlora --quantize int8 --batch-size 1 --remat save_attention \
        --loss-chunk-size 512 --steps 2 --repeats 1
    ;;
26)  # part 7's LoRA rows with the blocks stacked (--scan-layers: one block's program, compile flat in depth)
    export JAX_COMPILATION_CACHE_DIR=/tmp/jax-cache JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=1
    row 260 --config-name llama_3_2_1b --method lora --lora-rank 16 --batch-size 4 --remat save_attention \
        --loss-chunk-size 512 --scan-layers
    row 260 --config-name llama_3_2_1b --method lora --lora-rank 16 --batch-size 4 --remat full \
        --loss-chunk-size 512 --scan-layers
    ;;
27)  # part 26's LoRA with the room scanning left: batch 8, and no remat at batch 4
    export JAX_COMPILATION_CACHE_DIR=/tmp/jax-cache JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=1
    row 260 --config-name llama_3_2_1b --method lora --lora-rank 16 --batch-size 8 --remat save_attention \
        --loss-chunk-size 512 --scan-layers
    row 260 --config-name llama_3_2_1b --method lora --lora-rank 16 --batch-size 4 --remat none \
        --loss-chunk-size 512 --scan-layers
    ;;
28)  # part 25's qwen3_8b QLoRA with its int8 blocks stacked (--scan-layers): one block's compile; then batch 2
    export JAX_COMPILATION_CACHE_DIR=/tmp/jax-cache JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=1 PYTHONUNBUFFERED=1
    row 300 --config-name qwen3_8b --method qlora --quantize int8 --batch-size 1 --remat save_attention \
        --loss-chunk-size 512 --scan-layers --steps 5 --repeats 2
    row 240 --config-name qwen3_8b --method qlora --quantize int8 --batch-size 2 --remat save_attention \
        --loss-chunk-size 512 --scan-layers --steps 5 --repeats 2
    ;;
29)  # the per-op time model's inputs (issue 43 item 5): each row profiled with XLA's optimised HLO
    # dumped; its trace's device ops (recipes/tpu-v5e-1/trace_ops.py) and the HLO come back in two
    # archives; then the keys of the TPU's cost analysis of one matmul
    export JAX_COMPILATION_CACHE_DIR=/tmp/jax-cache-29 JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=1
    mkdir -p /tmp/ops-29 /tmp/hlo-29
    traced() {  # traced TAG SECONDS ARGS...: one profiled row, its HLO dumped and its ops kept
        local tag=$1 limit=$2
        shift 2
        rm -rf /tmp/zoo-bench-step-trace-*
        XLA_FLAGS="--xla_dump_to=/tmp/hlo-29/$tag --xla_dump_hlo_as_text --xla_dump_hlo_module_re=.*train_step.*" \
            row "$limit" "$@" --profile
        local trace
        trace=$(find /tmp/zoo-bench-step-trace-* -maxdepth 0 2>/dev/null | head -1)
        [ -n "$trace" ] && python3 recipes/tpu-v5e-1/trace_ops.py "$trace" "/tmp/ops-29/$tag.jsonl.gz" >> "$OUT/log.txt" 2>&1
    }
    traced gpt_1b_b2 170 --config-name gpt_1b --num-layers 8 --batch-size 2 --moment-dtype bfloat16 --second-moment factored
    traced gpt_350m_b8 260 --config-name gpt_350m --sequence-length 1024 --batch-size 8 --moment-dtype bfloat16
    traced llama_lora_b4 150 --config-name llama_3_2_1b --method lora --lora-rank 16 --batch-size 4 --remat none \
        --loss-chunk-size 512
    tar -czf "$OUT/ops.tar.gz" -C /tmp/ops-29 .
    find /tmp/hlo-29 -name '*after_optimizations.txt' > /tmp/hlo-29/files
    tar -czf "$OUT/hlo.tar.gz" -C / -T /tmp/hlo-29/files
    timeout 60 python3 -c "import jax, jax.numpy as jnp; a = jnp.ones((4096, 4096), jnp.bfloat16); \
print(jax.jit(lambda x: jnp.tanh(x @ x)).lower(a).compile().cost_analysis())" >> "$OUT/cost_keys.txt" 2>&1
    ;;
30)  # zoo plan's op-by-op time beside the measured step (issue 43 item 5), on rows it was not
    # calibrated on: gpt_1b at batch 4, gpt_350m (first run with the full-width RoPE experiment, since reverted)
    export JAX_COMPILATION_CACHE_DIR=/tmp/jax-cache JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=1
    row 200 --config-name gpt_1b --num-layers 8 --batch-size 4 --moment-dtype bfloat16 --second-moment factored --plan
    row 330 --config-name gpt_350m --sequence-length 1024 --batch-size 8 --moment-dtype bfloat16 --plan
    ;;
31)  # part 30 on the fine-tune rows: qwen3_0.6b's full fine-tune (layers, batch 4, save_attention) and
    # llama_3_2_1b's LoRA (the calibration's row, re-measured), each with the plan's time of its own program
    export JAX_COMPILATION_CACHE_DIR=/tmp/jax-cache JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=1
    row 250 --config-name qwen3_0.6b --method full --batch-size 4 --remat save_attention --loss-chunk-size 512 --plan
    row 170 --config-name llama_3_2_1b --method lora --lora-rank 16 --batch-size 4 --remat none \
        --loss-chunk-size 512 --plan
    ;;
32)  # the attention sublayer's projections and RoPE written six ways (recipes/tpu-v5e-1/attention_layouts.py),
    # then part 31's qwen3_0.6b row with the plan's time (a row the op rates were not read from)
    export JAX_COMPILATION_CACHE_DIR=/tmp/jax-cache JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=1
    timeout 280 python3 recipes/tpu-v5e-1/attention_layouts.py >> "$OUT/log.txt" 2>&1 || echo "attention_layouts.py: exit $?" >> "$OUT/log.txt"
    row 290 --config-name qwen3_0.6b --method full --batch-size 4 --remat save_attention --loss-chunk-size 512 --plan
    ;;
33)  # RoPE written four ways in the attention sublayer, then gpt_350m's and the LoRA's rows with the
    # fastest form at their shapes (recipes/tpu-v5e-1/rope_row.py: the library's RoPE replaced in that process)
    export JAX_COMPILATION_CACHE_DIR=/tmp/jax-cache JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=1
    VARIANTS=zoo,rope_bf16,matmul_f32,matmul_bf16,no_rope timeout 200 python3 recipes/tpu-v5e-1/attention_layouts.py \
        >> "$OUT/log.txt" 2>&1 || echo "attention_layouts.py: exit $?" >> "$OUT/log.txt"
    rope_row() {  # rope_row SECONDS SHAPE ARGS...: one bench row with the fastest RoPE form at SHAPE
        local limit=$1 shape=$2
        shift 2
        echo "### rope_row.py best:$shape -- $*" >> "$OUT/step.md"
        timeout "$limit" python3 recipes/tpu-v5e-1/rope_row.py "best:$shape" -- "$@" --output /tmp/row.md >> "$OUT/log.txt" 2>&1 \
            && cat /tmp/row.md >> "$OUT/step.md" || echo "FAILED or timed out (exit $?)" >> "$OUT/step.md"
        echo >> "$OUT/step.md"
    }
    rope_row 260 "gpt_350m b8" --config-name gpt_350m --sequence-length 1024 --batch-size 8 --moment-dtype bfloat16
    rope_row 170 "llama_3_2_1b b4" --config-name llama_3_2_1b --method lora --lora-rank 16 --batch-size 4 --remat none \
        --loss-chunk-size 512
    ;;
36)  # part 15 again with the library's RoPE by matmul (e6f0438): zoo / keras-hub in one call, the zoo
    # with float32 AdamW (keras-hub's optimizer) beside keras-hub, then with bfloat16 + factored AdamW
    row 420 --config-name gpt_1b --num-layers 8 --batch-size 2 --peer keras-hub
    row 150 --config-name gpt_1b --num-layers 8 --batch-size 2 --moment-dtype bfloat16 --second-moment factored
    ;;
37)  # gpt_350m with the library's RoPE by matmul and splash's (D, T) blocks, and issue 43's remat-full
    # row (gpt_1b b4), each with --plan (a remat-full step zoo plan had not been checked against)
    export JAX_COMPILATION_CACHE_DIR=/tmp/jax-cache JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=1
    row 300 --config-name gpt_350m --sequence-length 1024 --batch-size 8 --moment-dtype bfloat16 --plan
    row 220 --config-name gpt_1b --num-layers 8 --batch-size 4 --remat full --moment-dtype bfloat16 \
        --second-moment factored --plan
    ;;
39)  # part 37's remat-full gpt_1b b4 row again, its plan reading splash's (D, T) operands (kernel_scores)
    row 250 --config-name gpt_1b --num-layers 8 --batch-size 4 --remat full --moment-dtype bfloat16 \
        --second-moment factored --plan
    ;;
38)  # splash's q, k, v layouts at each head dim (recipes/tpu-v5e-1/splash_layouts.py), then gpt_1b b2 and b4
    # with the fastest at gpt_1b's shape
    export JAX_COMPILATION_CACHE_DIR=/tmp/jax-cache JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=1
    timeout 240 python3 recipes/tpu-v5e-1/splash_layouts.py >> "$OUT/log.txt" 2>&1
    for b in 2 4; do
        echo "### splash_layouts.py row 'gpt_1b b$b' -- gpt_1b 8 layers b$b, bfloat16 + factored AdamW" >> "$OUT/step.md"
        timeout 165 python3 recipes/tpu-v5e-1/splash_layouts.py row "gpt_1b b$b" -- --config-name gpt_1b --num-layers 8 --batch-size $b \
            --moment-dtype bfloat16 --second-moment factored --output /tmp/row.md >> "$OUT/log.txt" 2>&1 \
            && cat /tmp/row.md >> "$OUT/step.md" || echo "FAILED or timed out (exit $?)" >> "$OUT/step.md"
        echo >> "$OUT/step.md"
    done
    ;;
40)  # which of the device's counters sees temporaries, and whether a step that runs out of memory
    # keeps its donated arguments (memory_counters.py); then gpt_350m with --plan, which part 37's plan
    # read without splash's (D, T) operands
    timeout 60 python3 recipes/tpu-v5e-1/memory_counters.py >> "$OUT/counters.txt" 2>&1
    export JAX_COMPILATION_CACHE_DIR=/tmp/jax-cache JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=1
    row 330 --config-name gpt_350m --sequence-length 1024 --batch-size 8 --moment-dtype bfloat16 --plan
    ;;
41)  # an experiment: splash's forward multiplies P by V in float32; the kernel both ways, then
    # gpt_1b b2 and b4 (bfloat16 + factored AdamW) with the bfloat16 product (splash_pv_dtype.py)
    export JAX_COMPILATION_CACHE_DIR=/tmp/jax-cache JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=1
    (cd recipes/tpu-v5e-1 && timeout 150 python3 splash_pv_dtype.py) >> "$OUT/log.txt" 2>&1
    for b in 2 4; do
        echo "### splash_pv_dtype.py row -- gpt_1b 8 layers b$b, bfloat16 + factored AdamW" >> "$OUT/step.md"
        (cd recipes/tpu-v5e-1 && timeout 170 python3 splash_pv_dtype.py row -- --config-name gpt_1b --num-layers 8 \
            --batch-size $b --moment-dtype bfloat16 --second-moment factored --output /tmp/row.md) >> "$OUT/log.txt" 2>&1 \
            && cat /tmp/row.md >> "$OUT/step.md" || echo "FAILED or timed out (exit $?)" >> "$OUT/step.md"
        echo >> "$OUT/step.md"
    done
    ;;
42)  # the device's peak as its buffers in use plus the runtime's reservation for temporaries (part 40),
    # beside the plan: llama_3_2_1b's LoRA row and gpt_1b b4 under remat full
    export JAX_COMPILATION_CACHE_DIR=/tmp/jax-cache JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=1
    row 230 --config-name llama_3_2_1b --method lora --lora-rank 16 --batch-size 4 --remat none --loss-chunk-size 512 --plan
    row 250 --config-name gpt_1b --num-layers 8 --batch-size 4 --remat full --moment-dtype bfloat16 \
        --second-moment factored --plan
    ;;
43)  # bfloat16 weights (--precision bfloat16: the zoo's AdamW computes each update in float32 and
    # rounds the weight stochastically), bfloat16 + factored moments: gpt_1b b2 and b4
    export JAX_COMPILATION_CACHE_DIR=/tmp/jax-cache JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=1
    for b in 2 4; do
        row 170 --config-name gpt_1b --num-layers 8 --batch-size $b --precision bfloat16 --moment-dtype bfloat16 \
            --second-moment factored
    done
    ;;
44)  # the device's peak beside the plan on two rows never read that way: qwen3_0.6b's best full
    # fine-tune (float32 AdamW, batch 4, save_attention) and gpt_1b at 1 x 8192 under remat full
    export JAX_COMPILATION_CACHE_DIR=/tmp/jax-cache JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=1
    row 260 --config-name qwen3_0.6b --method full --batch-size 4 --remat save_attention --loss-chunk-size 512 --plan
    row 230 --config-name gpt_1b --num-layers 8 --batch-size 1 --sequence-length 8192 --remat full \
        --moment-dtype bfloat16 --second-moment factored --plan
    ;;
45)  # part 44's gpt_1b 1 x 8192 remat-full row with --plan, alone (its plan's compile ran past 230 s there)
    export JAX_COMPILATION_CACHE_DIR=/tmp/jax-cache JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=1
    row 540 --config-name gpt_1b --num-layers 8 --batch-size 1 --sequence-length 8192 --remat full \
        --moment-dtype bfloat16 --second-moment factored --plan
    ;;
46)  # part 45's row (planned +28.4% over the measured step) profiled as part 29's: splash's time per
    # visited score at T = 8,192, where the rates were read at T <= 2,048
    mkdir -p /tmp/ops-46 /tmp/hlo-46
    rm -rf /tmp/zoo-bench-step-trace-*
    XLA_FLAGS="--xla_dump_to=/tmp/hlo-46/gpt_1b_t8192 --xla_dump_hlo_as_text --xla_dump_hlo_module_re=.*train_step.*" \
        row 420 --config-name gpt_1b --num-layers 8 --batch-size 1 --sequence-length 8192 --remat full \
        --moment-dtype bfloat16 --second-moment factored --profile
    trace=$(find /tmp/zoo-bench-step-trace-* -maxdepth 0 2>/dev/null | head -1)
    [ -n "$trace" ] && python3 recipes/tpu-v5e-1/trace_ops.py "$trace" /tmp/ops-46/gpt_1b_t8192.jsonl.gz >> "$OUT/log.txt" 2>&1
    tar -czf "$OUT/ops.tar.gz" -C /tmp/ops-46 .
    find /tmp/hlo-46 -name '*after_optimizations.txt' > /tmp/hlo-46/files
    tar -czf "$OUT/hlo.tar.gz" -C / -T /tmp/hlo-46/files
    ;;
47)  # issue 44's attention rows at 2k, 8k and 32k tokens: the library's splash beside other blocks
    python3 recipes/tpu-v5e-1/splash_long.py >> "$OUT/log.txt" 2>&1
    ;;
48)  # part 47's shapes with blocks of 2,048, the TPU compiler's scoped VMEM raised to 96 MiB
    LIBTPU_INIT_ARGS="--xla_tpu_scoped_vmem_limit_kib=98304" python3 recipes/tpu-v5e-1/splash_long.py --large \
        >> "$OUT/log.txt" 2>&1
    ;;
49)  # issue 43's 1 x 8192 remat-full row with the long keys' blocks (1,024 x 2,048) and with square
    # ones (1,024 x 1,024, the library before them), each in its own process
    for blocks in library square; do
        echo "### $blocks blocks: zoo bench step (part 45's row)" >> "$OUT/step.md"
        timeout 280 python3 recipes/tpu-v5e-1/splash_long.py row $blocks -- --config-name gpt_1b --num-layers 8 \
            --batch-size 1 --sequence-length 8192 --remat full --moment-dtype bfloat16 --second-moment factored \
            --output /tmp/row.md >> "$OUT/log.txt" 2>&1 && cat /tmp/row.md >> "$OUT/step.md"
        echo >> "$OUT/step.md"
    done
    ;;
*)
    echo "issue43_rows.sh: no part $part (parts 1 to 33, 36 to 49; 'part 35' in docs/performance.md was a command of its own)" >&2
    exit 2
    ;;
esac
