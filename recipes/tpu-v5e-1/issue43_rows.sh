#!/usr/bin/env bash
# The rows of issue 43's table on one TPU v5e chip, each one `zoo bench step` in its own
# process (the device's peak counter is then the row's own), reports appended to
# $OUT/step.md and the log to $OUT/log.txt. About 60-120 s a row (the compile dominates:
# 33-41 s at 8 layers before this change); under the device tool's 10 minutes a call, run
# it in two halves: `issue43_rows.sh 1` then `issue43_rows.sh 2`.
#
#   source .device/tpu-env.sh && OUT=/tmp/out bash recipes/tpu-v5e-1/issue43_rows.sh 1
set -uo pipefail
half=${1:-1}
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
if [ "$half" = 1 ]; then
    row 150 --config-name gpt_1b --num-layers 8 --batch-size 2 --profile --plan
    row 150 --config-name gpt_1b --num-layers 8 --batch-size 4 --profile
    row 120 --config-name gpt_1b --num-layers 8 --batch-size 4 --remat save_attention
    row 120 --config-name qwen3_0.6b --method full --batch-size 4 --remat full --loss-chunk-size 512 --scan-layers
else
    row 170 --config-name llama_3_2_1b --method lora --lora-rank 16 --batch-size 4 --remat full --loss-chunk-size 512
    row 150 --config-name gpt_350m --sequence-length 1024 --batch-size 8
    row 240 --config-name gpt_1b --num-layers 8 --batch-size 2 --peer keras-hub
fi
