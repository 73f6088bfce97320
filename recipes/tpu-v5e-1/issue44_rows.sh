#!/usr/bin/env bash
# Issue 44's MoE and loss rows on one TPU v5e chip, reports under $OUT.
#   part 1: the sparse layer's grouped matmul, ragged_dot vs megablox at several tilings
#           (moe_tiles.py), then `zoo bench moe --sections time` at E = 8, k = 2 and
#           E = 64, k = 8, bf16, each grouped matmul against the dense-masked computation.
#   part 2: the loss at V = 128,256 in llama_3_2_1b's LoRA step: in chunks of 512 (the
#           head and cross-entropy per chunk, gradient in the forward pass) vs whole logits.
#   part 3: part 1's `zoo bench moe` rows alone (run once for an experiment not kept: the
#           sorted rows moved by permutations whose backward is a gather; no gain).
#
#   source .device/tpu-env.sh && OUT=/tmp/out bash recipes/tpu-v5e-1/issue44_rows.sh 1
set -uo pipefail
part=${1:-1}
export JAX_COMPILATION_CACHE_DIR=/tmp/jax-cache
moe_row() {  # moe_row E K F: zoo bench moe's time rows for both TPU grouped matmuls
    echo "### zoo bench moe --sections time, E=$1 k=$2 F=$3" >> "$OUT/moe.md"
    timeout 240 python3 -m zoo bench moe --sections time --time-tokens 4096 --time-width 2048 \
        --time-intermediate-dim "$3" --time-experts "$1" --time-experts-per-token "$2" \
        --time-grouped-matmuls ragged_dot,megablox --time-precision mixed_bfloat16 --steps 5 --repeats 5 \
        --output /tmp/moe.md >> "$OUT/log.txt" 2>&1 && cat /tmp/moe.md >> "$OUT/moe.md" || echo "FAILED (exit $?)" >> "$OUT/moe.md"
    echo >> "$OUT/moe.md"
}
case $part in
    1)
        timeout 240 python3 recipes/tpu-v5e-1/moe_tiles.py >> "$OUT/log.txt" 2>&1 || echo "moe_tiles failed (exit $?)" >> "$OUT/log.txt"
        moe_row 8 2 4096
        moe_row 64 8 1024
        ;;
    3)
        moe_row 8 2 4096
        moe_row 64 8 1024
        ;;
    2)
        for chunk in "--loss-chunk-size 512" ""; do  # chunks of 512, then the whole logits (the default)
            echo "### zoo bench step llama_3_2_1b lora 16 b4 remat full $chunk" >> "$OUT/step.md"
            # shellcheck disable=SC2086
            timeout 280 python3 -m zoo bench step --config-name llama_3_2_1b --method lora --lora-rank 16 --batch-size 4 \
                --remat full $chunk --output /tmp/row.md >> "$OUT/log.txt" 2>&1 \
                && cat /tmp/row.md >> "$OUT/step.md" || echo "FAILED or timed out (exit $?)" >> "$OUT/step.md"
            echo >> "$OUT/step.md"
        done
        ;;
esac
