#!/usr/bin/env bash
# maxtext_step_time.sh VENV fsdp|tp [STEPS]: MaxText's own pre-training loop on the
# side-by-side timing model (docs/performance.md: C=512, 4 layers, 8/4 heads of 64, F=2048,
# V=32,000 tied, T=512, global batch 8, remat full, bf16 compute, f32 weights), synthetic
# data, on 8 simulated CPU devices; prints MaxText's "completed step" lines (time between
# consecutive lines = the step time once the dispatch queue is full).
set -euo pipefail
venv=$1 layout=$2 steps=${3:-8}
case $layout in
    fsdp) parallelism="ici_fsdp_parallelism=8" ;;
    tp) parallelism="ici_data_parallelism=2 ici_tensor_parallelism=4" ;;
    *) echo "layout must be fsdp or tp, got $layout" >&2; exit 2 ;;
esac
configs=$("$venv/bin/python" -c "import maxtext, os; print(os.path.dirname(maxtext.__file__))")/configs
out=$(mktemp -d)
# shellcheck disable=SC2086
XLA_FLAGS=--xla_force_host_platform_device_count=8 JAX_PLATFORMS=cpu "$venv/bin/python" -m maxtext.trainers.pre_train.train \
    "$configs/base.yml" run_name="peers_$layout" base_output_directory="$out" hardware=cpu skip_jax_distributed_system=true \
    dataset_type=synthetic steps="$steps" per_device_batch_size=1 enable_checkpointing=false attention=dot_product \
    base_emb_dim=512 base_num_decoder_layers=4 base_num_query_heads=8 base_num_kv_heads=4 head_dim=64 base_mlp_dim=2048 \
    vocab_size=32000 max_target_length=512 logits_via_embedding=true remat_policy=full dtype=bfloat16 weight_dtype=float32 \
    $parallelism 2>&1 | grep -E "completed step|number parameters"
rm -rf "$out"
