"""The suite's second tier: further configurations of properties the first tier checks.

The README's test command (``python -m pytest -q``) runs tier 1: every property of the
zoo at least once (each parity, oracle and fault check, each kernel, layer, layout and
model family, the README example). The test ids below carry the ``matrix`` marker
(tests/conftest.py adds it) and are left out of that command; ``.ci/run`` runs them after
it (``python -m pytest -q -m matrix``), on the same compilation cache. Each entry names
the tier-1 test that checks its property on another configuration. docs/testing.md says
what each tier covers.

A listed id that no longer exists is an error when its module is collected (so the list
cannot rot silently).
"""

DOCS = "tests/test_docs.py::test_example_runs"
GPT_MOE = "tests/models/test_gpt_moe.py::test_three_steps_of_fit_match_one_device"
GPT_MOE_GENERATE = "tests/models/test_gpt_moe.py::test_cached_generation_under_the_expert_layouts_equals_one_device"
GPT_PARITY = "tests/models/test_gpt_parity.py::test_three_steps_of_fit_match_one_device"
GEMMA_PARITY = "tests/models/test_gpt_parity.py::test_gemma_pieces_train_to_the_one_device_numbers"
GPT_REMAT = "tests/models/test_gpt_remat.py::test_fit_with_remat_matches_one_device_without"
MHA_SP = "tests/layers/test_multi_head_attention_parallel.py::test_output_and_gradients_match_plain_layer"
MHA_TP = (
    "tests/layers/test_multi_head_attention_parallel.py::test_tensor_parallel_output_and_gradients_match_plain_layer"
)
MHA_PACKING = "tests/layers/test_multi_head_attention_packing.py::test_packed_rows_equal_each_document_alone"
SP_KERNELS = "tests/kernels/test_sequence_parallel.py::test_matches_reference"
WINDOW_KERNELS = "tests/kernels/test_sliding_window.py::test_matches_masked_reference"
MOE_KERNELS = "tests/kernels/test_moe.py"
FINETUNE = "tests/training/test_finetune.py"
RESUME = "tests/training/checkpoints/test_resume_anywhere.py"
RESUME_TIER_1 = f"{RESUME}::test_the_pipelines_stacked_blocks_resume_as_layers_and_back (data -> pipeline)"

QLORA = "tests/training/lora/test_qlora.py"

# test id -> the tier-1 test that checks the same property
MATRIX = {
    # QLoRA: tier 1 keeps fsdp and fsdp+tp over int4 (a kernel sharded by the layout map, and one the
    # tensor-parallel layers split and dequantize per shard, its parts gathered over data), int4 in fit
    # through zoo finetune, both modes against their bound layer by layer, and each tensor-parallel layer's
    # quantized shards against one device (tests/layers/test_tensor_parallel_layers.py)
    **{
        f"{QLORA}::test_qlora_under_a_layout_trains_like_one_device[{case}]": reference
        for case, reference in {
            "data-int4": "[fsdp-int4]",
            "fsdp-int8": "[fsdp-int4]",
            "tp-int8": "[fsdp+tp-int4]",
            "tp+sp-int4": "[fsdp+tp-int4]",
            "context-int8": "[fsdp-int4] (context's weights split over seq by the same map)",
            "pipeline-int4": "[fsdp-int4] and test_lora_stacked.py's int4 stack (the stage's stacked int4 parts)",
            "expert-int8": "[fsdp-int4] (the attention quantized, the experts float)",
            "fsdp+expert-int4": "[fsdp-int4] (the attention quantized, the experts float)",
            "expert+tp-int4": "[fsdp+tp-int4] (the tensor-parallel attention quantized, the experts float)",
            "model-int8": "[fsdp+tp-int4] (the model's own map: the tensor-parallel layers split the kernels)",
        }.items()
    },
    f"{QLORA}::test_int8_logits_stay_within_ten_percent_of_the_float_models": "test_a_quantized_layer_stays_within_its_bound",
    # LoRA on stacked blocks: tier 1 keeps QLoRA on the scanned form under fsdp (the same loop and factors
    # over an int8 stack)
    "tests/training/lora/test_lora_stacked.py::test_lora_on_stacked_blocks_trains_like_the_layers[pipelined]": (
        "test_qlora_on_stacked_blocks_trains_like_the_layers[int8-fsdp-data=8] (the same PipelinedBlocks loop as one stage)"
    ),
    "tests/training/lora/test_lora_stacked.py::test_lora_on_stacked_blocks_trains_like_the_layers[scanned-fsdp]": (
        "test_qlora_on_stacked_blocks_trains_like_the_layers[int8-fsdp-data=8] (LoRA on the scanned stack under fsdp, its base int8)"
    ),
    "tests/training/lora/test_lora_stacked.py::test_qlora_on_stacked_blocks_trains_like_the_layers[int4-fsdp-data=8]": (
        "[int8-fsdp-data=8] (the same stack); int4's packed parts under fsdp: test_qlora.py [fsdp-int4] as layers"
    ),
    "tests/training/lora/test_lora_stacked.py::test_qlora_on_stacked_blocks_trains_like_the_layers"
    "[int4-fsdp+tp-data=2,model=4]": (
        "[int8-fsdp-data=8] (the same stack) and test_qlora.py [fsdp+tp-int4] (the int4 parts split over data and model)"
    ),
    "tests/models/test_gpt_moe.py::test_experts_are_split_and_the_router_statistics_reach_the_logs": (
        "test_stacked_moe_blocks_train_to_the_layers_numbers (the statistics in fit's logs), "
        "test_stacked_moe_fit_matches_one_device (E split over expert) and the layers' expert parity"
    ),
    # the seam's inner kernel under a context kernel: tier 1 keeps Ulysses (the same local_attention call)
    "tests/kernels/test_attention_seam.py::test_the_context_kernels_run_the_selected_kernel_as_their_local_step"
    "[gather_kv_attention]": "[ulysses_attention]",
    # GPT fit parity: tier 1 keeps fsdp+tp (fsdp and tp together), tp+sp and context-ring
    f"{GPT_PARITY}[data-data=8]": "every other case's batch split over data",
    f"{GPT_PARITY}[fsdp-data=8]": "fsdp+tp-data=2,model=4",
    f"{GPT_PARITY}[tp-data=2,model=4]": "tp+sp-data=2,model=4, fsdp+tp-data=2,model=4",
    # the Gemma 2/3 pieces under fit: tier 1 keeps tp+sp (heads and MLP over model, the sequence split)
    f"{GEMMA_PARITY}[tp-data=2,model=4]": "tp+sp-data=2,model=4",
    f"{GEMMA_PARITY}[fsdp+tp-data=2,model=4]": "tp+sp-data=2,model=4; fsdp+tp in test_three_steps_of_fit_match_one_device",
    f"{GEMMA_PARITY}[context-ring-data=2,seq=4]": "tp+sp-data=2,model=4; windows under the ring: tests/kernels/test_sliding_window.py",
    "tests/models/test_lm_head_gather.py::test_fit_gathering_the_table_matches_one_device": (
        "test_the_compiled_step_gathers_what_the_sizes_choose (compile-only); fsdp+tp-data=2,model=4"
    ),
    # MoE GPT fit parity: tier 1 keeps expert+tp (experts split, shared expert, F over model)
    f"{GPT_MOE}[k2_shared-expert-data=2,expert=4]": "k2_shared-expert+tp-data=2,expert=2,model=2",
    f"{GPT_MOE}[k2_shared-fsdp+expert-data=2,expert=4]": "k2_shared-expert+tp; fsdp in test_gpt_parity",
    f"{GPT_MOE}[k1-expert-data=4,expert=2]": "k2_shared-expert+tp (expert); k = 1: tests/kernels/test_moe.py [True-2-1]",
    f"{GPT_MOE}[k1-context-data=2,seq=4]": "k2_shared-expert+tp; the context layout under fit: test_gpt_parity context-ring",
    f"{GPT_MOE}[k1_shared-expert-data=2,expert=4]": "k2_shared-expert+tp (k = 2); k = 1: k1-expert-data=4,expert=2",
    f"{GPT_MOE}[k1_shared-fsdp+expert-data=4,expert=2]": "k2_shared-expert+tp; fsdp in test_gpt_parity",
    f"{GPT_MOE}[k1_shared-expert+tp-data=1,expert=4,model=2]": "k2_shared-expert+tp-data=2,expert=2,model=2",
    f"{GPT_MOE}[k2-expert-data=4,expert=2]": "k2_shared-expert+tp (the routed experts; the shared one on top)",
    f"{GPT_MOE}[k2-fsdp+expert-data=2,expert=4]": "k2_shared-expert+tp; fsdp in test_gpt_parity",
    f"{GPT_MOE}[k2-expert+tp-data=2,expert=2,model=2]": "k2_shared-expert+tp-data=2,expert=2,model=2",
    # MoE GPT generation against one device: tier 1 keeps expert+tp at 2 prompts (split over data
    # alone, whole over expert: each device's own experts summed; the shared expert over model)
    **{
        f"{GPT_MOE_GENERATE}[{case}]": "expert+tp-data=2,expert=2,model=2-2"
        for case in (
            "expert+tp-data=2,expert=2,model=2-1",
            "expert+tp-data=2,expert=2,model=2-4",
            "expert-data=2,expert=4-2",
            "fsdp+expert-data=2,expert=4-2",
            "fsdp+expert-data=2,expert=4-1",
            "fsdp+expert-data=2,expert=4-8",
        )
    },
    # the loss in chunks: tier 1 keeps the function's parity (sample weights, soft-cap) and the tp fit
    "tests/models/test_chunked_loss.py::test_fit_evaluate_and_predict_tied_softcapped_moe": (
        "test_vocabulary_parallel_under_tp_equals_the_plain_loss_and_gathers_no_logits (fit), "
        "test_the_function_equals_the_plain_loss_and_its_gradients[mean_with_sample_weight-True-3.0] (soft-cap, weights)"
    ),
    # the chunked loss manual over data: tier 1 keeps tp (fsdp+tp adds the table's split over data)
    "tests/models/test_chunked_loss.py::test_vocabulary_parallel_under_tp_equals_the_plain_loss_and_gathers_no_logits[fsdp+tp]": (
        "test_vocabulary_parallel_under_tp_equals_the_plain_loss_and_gathers_no_logits[tp]"
    ),
    # bfloat16 moments alone under fsdp: tier 1 keeps them with a factored second moment (and in
    # host memory), and the rounding's own checks
    "tests/training/test_optimizers.py::test_bfloat16_moments_train_like_float32_under_fsdp": (
        "test_factored_second_moments_train_like_adamw_under_fsdp, "
        "test_moments_in_host_memory_train_as_on_the_device_under_fsdp, "
        "test_a_decaying_second_moment_keeps_decaying_in_bfloat16"
    ),
    # scanned blocks under fsdp, tp, tp+sp and fsdp+tp: tier 1 keeps their numbers (the layers' on one
    # device), context's against one device, the fsdp program's bytes, the tp program's split and
    # tp+sp's sequence-parallel collectives
    **{
        f"tests/models/test_gpt_scan.py::test_scanned_fit_matches_one_device[{case}]": (
            "test_the_scanned_blocks_train_to_the_numbers_of_the_same_layers, [context-data=2,seq=4], "
            "test_a_scanned_fsdp_step_moves_no_more_bytes_than_the_layers, "
            "test_a_scanned_tp_step_splits_the_blocks_as_the_layers_do, "
            "test_a_scanned_step_splits_the_tokens_as_the_layers_do[tp+sp-...]"
        )
        for case in ("fsdp-data=8", "tp-data=2,model=4", "tp+sp-data=2,model=4", "fsdp+tp-data=2,model=4")
    },
    # stacked MoE blocks: tier 1 keeps expert+tp (the exchange and the tensor-parallel shared expert in the loop)
    **{
        f"tests/models/test_gpt_moe.py::test_stacked_moe_fit_matches_one_device[{case}]": (
            "[expert+tp-data=2,expert=2,model=2]; fsdp+expert's gather of the experts' C: "
            "test_three_steps_of_fit_match_one_device[k2_shared-fsdp+expert-...] as layers"
        )
        for case in ("expert-data=2,expert=4", "fsdp+expert-data=2,expert=4")
    },
    "tests/models/test_gpt_scan.py::test_a_scanned_step_splits_the_tokens_as_the_layers_do"
    "[context-data=2,seq=4-seq-collective-permute-1.0]": (
        "[tp+sp-data=2,model=4-model-reduce-scatter-1.0] (the layers' kernels in the loop); "
        "test_scanned_fit_matches_one_device[context-data=2,seq=4] (the ring in the loop, against one device)"
    ),
    # greedy decoding of two more MoE families against transformers: tier 1 keeps Qwen3-MoE's
    # (equal and unequal prompts) and every family's logits
    **{
        f"tests/models/test_hf_checkpoints.py::test_greedy_equals_transformers[{name}]": (
            "test_greedy_equals_transformers[qwen3_moe], test_greedy_of_unequal_prompts_equals_transformers[qwen3_moe], "
            f"test_logits_equal_transformers[{name}]"
        )
        for name in ("mixtral", "qwen2_moe")
    },
    # a windowed GPT's fit under ring context parallelism: tier 1 keeps the ring kernels with windows
    # reaching past a shard (outputs and gradients), the windowed layer split over the sequence, and the
    # GPT's fit under context-ring
    "tests/models/test_gpt.py::test_a_windowed_gpt_trains_under_ring_context_parallelism_as_on_one_device": (
        "tests/kernels/test_sliding_window.py::test_matches_masked_reference[ring], [ring-zigzag]; "
        "tests/layers/test_multi_head_attention.py::test_a_sliding_window_matches_one_device_when_split[ulysses]; "
        f"{GPT_PARITY}[context-ring-data=2,seq=4]"
    ),
    # windowed decoding on a zoo config: tier 1 decodes past the window against transformers
    "tests/models/test_gpt.py::test_decoding_with_a_window_matches_the_full_forward_pass": (
        "tests/models/test_hf_checkpoints.py::test_greedy_equals_transformers[mistral_window], [gemma2]"
    ),
    # the CNN benchmark over every layout: tier 1 runs the harness's check on the real step
    "tests/bench/test_cnn_fit.py::test_tiny_benchmark_reports_every_layout": (
        "test_same_maths_check_passes_the_real_step_and_catches_a_different_one; tests/bench/test_gpt_fit.py"
    ),
    # pipelined GPT fit parity: tier 1 keeps gpipe; the circular schedule's outputs and
    # gradients: tests/layers/test_pipelined_blocks.py (circular-6-2-data=2,stage=4)
    "tests/models/test_gpt_pipeline.py::test_three_steps_of_fit_match_one_device[circular-2-data=2,stage=2,model=2]": (
        "tests/layers/test_pipelined_blocks.py circular case"
    ),
    # remat under fit: tier 1 keeps context-ring-full and tp+sp-dots_saveable
    f"{GPT_REMAT}[single-None-full]": "context-ring-data=2,seq=4-full",
    f"{GPT_REMAT}[fsdp-data=8-dots_saveable]": "tp+sp-data=2,model=4-dots_saveable",
    f"{GPT_REMAT}[tp-data=2,model=4-full]": "context-ring-data=2,seq=4-full, tp+sp-dots_saveable",
    f"{GPT_REMAT}[tp-data=2,model=4-offload_attention]": (
        "single-None-save_attention (the same names kept); tests/models/test_gpt_remat.py::"
        "test_offload_attention_moves_the_named_tensors_to_host_memory_and_back"
    ),
    # splash (the TPU's attention kernel) through fit, in Pallas' interpreter: tier 1 keeps the kernel
    # against the float64 reference with every option, and save_attention's fit parity on the tiles
    "tests/models/test_gpt_splash.py::test_fit_through_splash_under_remat_equals_the_tiled_kernel": (
        "tests/kernels/test_splash_attention.py::test_matches_the_float64_reference, "
        f"{GPT_REMAT}[single-None-save_attention]"
    ),
    "tests/presets/test_permissions.py::test_exports_honour_the_umask[umask 077]": "[umask 022]",
    # a fixture's logits with its config.json in transformers 5's form: tier 1 keeps Llama 3's rope_parameters,
    # Gemma 3's nested one and Qwen3-MoE's renamed key; every family's two forms map to the same arguments in tier 1
    **{
        f"tests/models/test_hf_checkpoints.py::test_both_config_forms_compute_the_same_logits[{name}]": (
            "[llama_gqa_rope_scaling], [gemma3_text], [qwen3_moe]; tests/models/test_hf_config_forms.py::"
            f"test_both_forms_map_to_the_same_arguments[{name}]"
        )
        for name in (
            "llama_mha_tied",
            "qwen2",
            "mixtral",
            "qwen2_moe",
            "mistral_window",
            "qwen3",
            "gemma2",
            "qwen2_5",
        )
    },
    # the remat caveat of a plan: tier 1 keeps --depth full (the uncorrected upper bound)
    "tests/planning/test_remat_caveat.py::test_the_verdict_says_what_a_remat_peak_is[auto]": (
        "tests/planning/test_remat_caveat.py::test_the_verdict_says_what_a_remat_peak_is[full]"
    ),
    "tests/planning/test_remat_caveat.py::test_a_tpu_plan_carries_the_compiler_caveat_in_its_verdict": (
        "tests/planning/test_remat_caveat.py::test_a_tpu_step_compiled_by_xla_cpu_says_whose_figure_it_is "
        "(the caveat), test_the_verdict_says_what_a_remat_peak_is[full] (a caveat in the verdict)"
    ),
    "tests/planning/test_remat_caveat.py::test_no_caveat_without_remat": (
        "tests/planning/test_remat_caveat.py::test_the_verdict_says_what_a_remat_peak_is[full] (the caveat where "
        "remat runs; this case: none without it)"
    ),
    # attention layer, sequence parallel: tier 1 keeps one causal and one full case per kernel
    f"{MHA_SP}[gather-data=2_seq=4-causal-h4k2-mask-rope]": "gather-seq=8-causal-h8k8-mask-rope-striped",
    f"{MHA_SP}[ring-data=2_seq=4-causal-h4k4-mask]": "ring-data=2_seq=4-causal-h4k2-mask-rope-zigzag",
    f"{MHA_SP}[ring-seq=8-causal-h8k2-mask-rope]": "ring-data=2_seq=4-causal-h4k2-mask-rope-zigzag",
    f"{MHA_SP}[ulysses-seq=8-causal-h8k1-mask-rope]": "ulysses-data=2_seq=4-causal-h4k2-mask-rope-zigzag",
    f"{MHA_SP}[ring-data=1_seq=4-full-h4k2-mask-rope]": (
        "ring-data=2_seq=4-causal-h4k2-mask-rope-zigzag; non-causal: gather-data=1_seq=4-full-h4k4"
    ),
    # attention layer, tensor parallel: tier 1 keeps sp (replicated KV heads), fsdp and data=1,model=8
    f"{MHA_TP}[data=2_model=4-h4k4-bias]": "data=2_model=4-h4k2-sp-bias",
    f"{MHA_TP}[data=2_model=4-h8k2]": "data=2_model=4-h4k2-sp-bias (2 KV heads on 4 devices)",
    # sequence-parallel kernels: tier 1 keeps n8 causal GQA and n4 full per kernel, and every balance
    f"{SP_KERNELS}[gather-n8-full-h8k8-mask]": "gather-n4-full-h8k2-mask",
    f"{SP_KERNELS}[gather-n4-causal-h4k4-mask]": "gather-n8-causal-h8k2-mask",
    f"{SP_KERNELS}[ring-n8-full-h8k8-mask]": "ring-n4-full-h8k2-mask",
    f"{SP_KERNELS}[ring-n4-causal-h4k4-mask]": "ring-n8-causal-h8k2-mask",
    f"{SP_KERNELS}[ulysses-n8-full-h8k8-mask]": "ulysses-n4-full-h8k2-mask",
    f"{SP_KERNELS}[ulysses-n4-causal-h4k4-mask]": "ulysses-n8-causal-h8k2-mask",
    f"{SP_KERNELS}[ring-striped-n4-causal-h4k4-mask]": "ring-striped-n8-causal-h8k2-mask",
    f"{SP_KERNELS}[ring-zigzag-n4-causal-h4k4-mask]": "ring-zigzag-n8-causal-h8k2-mask",
    "tests/training/test_packing.py::test_a_step_on_packed_rows_computes_the_step_on_one_example_a_row[single]": (
        "[context]; one device's packed logits, and the same rows without ids differing: "
        "test_a_packed_row_gives_each_example_its_logits_alone"
    ),
    "tests/bench/test_lm_head.py::test_rows_choose_the_cheaper_gather_and_write_the_table": (
        "the head's choice in the compiled step: tests/models/test_lm_head_gather.py (compile-only, both choices)"
    ),
    "tests/training/test_packing.py::test_a_step_on_packed_rows_computes_the_step_on_one_example_a_row[pipeline]": (
        "[context]; PipelinedBlocks on packed rows: tests/layers/test_multi_head_attention_packing.py"
    ),
    "tests/training/test_packing.py::test_a_step_on_packed_rows_computes_the_step_on_one_example_a_row[tp]": (
        "[context]; the TP attention on packed rows: tests/layers/test_multi_head_attention_packing.py [tp]"
    ),
    # the attention layer on packed rows: tier 1 keeps one device, tp and ring-zigzag;
    # gather and Ulysses with segment ids: tests/kernels/test_packing.py
    f"{MHA_PACKING}[tp-megatron-sp]": "[tp]",
    f"{MHA_PACKING}[gather]": "[ring-zigzag]; gather's ids: tests/kernels/test_packing.py [gather]",
    f"{MHA_PACKING}[ulysses-zigzag]": "[ring-zigzag]; Ulysses' ids: tests/kernels/test_packing.py [ulysses]",
    "tests/layers/test_multi_head_attention_packing.py::test_pipelined_blocks_on_packed_rows_equal_each_document_alone"
    "[stages]": "[one-device] (the same pipeline loop, one stage)",
    # sliding-window kernels: tier 1 keeps blockwise, ring-zigzag, gather, ulysses-zigzag
    f"{WINDOW_KERNELS}[ring]": "ring-zigzag",
    f"{WINDOW_KERNELS}[ring-striped]": "ring-zigzag; striped balance: tests/kernels/test_sequence_parallel.py",
    # MoE kernels: tier 1 keeps the renormalised k = 2 cases and the 4-expert split
    f"{MOE_KERNELS}::test_sparse_moe_equals_dense[False-blocks]": "test_sparse_moe_equals_dense[True-blocks]",
    f"{MOE_KERNELS}::test_sparse_moe_equals_dense[False-megablox]": (
        "[True-megablox] (empty groups), test_megablox_under_remat_equals_dense (a random routing)"
    ),
    f"{MOE_KERNELS}::test_expert_parallel_dropless_equals_dense[False-2-1]": "[True-2-1], [False-4-2]",
    f"{MOE_KERNELS}::test_expert_parallel_dropless_equals_dense[True-4-2]": "[False-4-2], [True-2-1]",
    f"{MOE_KERNELS}::test_ragged_exchange_equals_dense[False-2-1]": "[True-2-1], [False-4-2]",
    f"{MOE_KERNELS}::test_ragged_exchange_equals_dense[True-4-2]": "[False-4-2], [True-2-1]",
    # models: tier 1 keeps the tp case with dropout (ViT: data=8 with dropout)
    "tests/models/test_encoder.py::test_three_steps_of_fit_match_one_device[data=8]": "[tp data=2,model=4 dropout]",
    "tests/models/test_vit.py::test_three_steps_of_fit_match_one_device[tp data=2,model=4]": (
        "[data=8 dropout]; the ViT's tp layout: tests/models/test_vit.py's sharding checks"
    ),
    # the ViT against the paper's equations: tier 1 keeps the class token (the default pooling)
    "tests/models/test_vit.py::test_outputs_and_gradients_match_the_papers_vit[mean]": (
        "[cls]; mean pooling: tests/layers/test_classifier_layers.py::test_token_pooling_averages_kept_tokens_or_takes_the_first"
    ),
    # the attention layer under fit: tier 1 keeps ring (causal, GQA, key mask); gather and
    # Ulysses under fit: tests/distribution/test_context_parallel.py's [gather], [ulysses]
    "tests/layers/test_multi_head_attention_fit.py::test_fit_matches_one_device[gather-data=1,seq=4-False]": (
        "tests/distribution/test_context_parallel.py::test_fit_matches_one_device[gather]; full attention: "
        + MHA_SP
        + " full cases"
    ),
    "tests/layers/test_multi_head_attention_fit.py::test_fit_matches_one_device[ulysses-data=2,seq=4-True]": (
        "tests/distribution/test_context_parallel.py::test_fit_matches_one_device[ulysses]"
    ),
    # the CNN under fit: tier 1 keeps the model axis at data=2,model=4 (sharded
    # weights at data=1,model=8: test_weights_are_really_sharded[data=1,model=8])
    "tests/models/test_small_cnn.py::test_three_steps_of_fit_match_one_device[model-data=1,model=8]": "[model-data=2,model=4]",
    "tests/models/test_small_cnn.py::test_three_steps_of_fit_match_one_device[data-data=8]": (
        "[model-data=2,model=4] (its batch split over data=2); DataParallel on 8: tests/training/checkpoints/test_kill_resume.py"
    ),
    # fine-tuning: tier 1 keeps lora and full on the model axis, frozen on data
    f"{FINETUNE}::test_finetuning_beats_the_zero_shot_head[data-lora]": "[model-lora]",
    f"{FINETUNE}::test_finetuning_beats_the_zero_shot_head[data-full]": "[model-full]",
    f"{FINETUNE}::test_finetuning_beats_the_zero_shot_head[model-frozen]": "[data-frozen]",
    f"{FINETUNE}::test_lora_on_transformer_layers_matches_one_device[fsdp-data=8]": (
        "[tp-data=2,model=4]; test_lora_under_fsdp_trains_like_one_device"
    ),
    "tests/training/test_lm_finetune.py::test_lora_finetuning_matches_one_device_and_lowers_the_held_out_loss[tp]": (
        "[context]; LoRA under tp: tests/training/test_finetune.py [tp-data=2,model=4]"
    ),
    # recipes end to end: tier 1 keeps pretrain_gpt; the CNN and fine-tuning jobs: tests/cli, tests/training
    "tests/recipes/test_run_cpu.py::test_cpu_recipe_runs_end_to_end[cpu-sim-8/train_cnn.toml]": (
        "[cpu-sim-8/pretrain_gpt.toml]; tests/cli/test_cli.py trains the CNN"
    ),
    "tests/recipes/test_run_cpu.py::test_cpu_recipe_runs_end_to_end[cpu-sim-8/finetune.toml]": (
        "[cpu-sim-8/pretrain_gpt.toml]; tests/training/test_lm_finetune.py"
    ),
    "tests/training/test_lm_finetune.py::test_zoo_finetune_of_a_mixtral_folder_under_an_expert_layout[full-fsdp+expert]": (
        "[lora-expert]; full fine-tuning: test_finetune.py"
    ),
    "tests/recipes/test_run_cpu.py::test_cpu_recipe_runs_end_to_end[cpu-sim-8/pretrain_moe.toml]": (
        "[cpu-sim-8/pretrain_gpt.toml]; the MoE GPT under expert: tests/models/test_gpt_moe.py"
    ),
    # the real process groups' failures: tier 1 keeps the agreement check in-process and a real 2-process group
    **{
        f"tests/distribution/test_multihost.py::{test}": (
            "test_mismatches_name_the_process_and_the_values, test_waiting_for_a_silent_coordinator_is_bounded_and_"
            "names_the_address (in-process); a real group: test_two_processes_train_like_one"
        )
        for test in (
            "test_disagreeing_processes_get_a_clear_error[device-counts]",
            "test_disagreeing_processes_get_a_clear_error[config]",
            "test_a_coordinator_whose_peers_never_come_fails_within_bounded_time",
        )
    },
    # zoo bench window's tables at the tiny size (one fixture of 5 s): tier 1 keeps the windowed kernels' numbers
    # and the bench's settings checks
    **{
        f"tests/bench/test_sliding_window_bench.py::{test}": (
            "tests/kernels/test_sliding_window.py (the windowed kernels against the masked reference); "
            "test_goal_misses_when_a_windowed_hop_sends_more, test_bad_settings_are_refused_before_any_work"
        )
        for test in (
            "test_blockwise_tiles_are_the_closed_form_counted_through_the_kernel",
            "test_ring_sends_hops_times_one_hop_and_less_with_the_window",
            "test_report_lists_every_row",
            "test_gather_and_ulysses_send_the_same_with_a_window",
        )
    },
    # the GPT's held-out loss on 8 devices: tier 1 keeps the CNN's padded last batch on 8 devices and the GPT's
    # held-out loss under a layout against one device
    "tests/training/test_validation_loss.py::test_gpt_validation_loss_is_the_same_on_8_devices_and_one": (
        "test_cnn_validation_metrics_are_the_same_on_8_devices_and_one[loss]; tests/training/test_lm_finetune.py::"
        "test_lora_finetuning_matches_one_device_and_lowers_the_held_out_loss[context]"
    ),
    # the stacked LoRA's files: tier 1 writes them through the job (PEFT, the merged Hugging Face folder)
    "tests/training/lora/test_lora_stacked.py::test_a_stacked_lora_model_writes_the_layers_adapter_and_merged_files": (
        "tests/training/test_lm_finetune.py::test_zoo_finetune_scan_layers_trains_the_stacked_blocks_and_writes_the_"
        "layers_files"
    ),
    # a worker process that cannot reach its coordinator: tier 1 keeps the same bounded wait in-process
    "tests/distribution/test_multihost.py::test_unreachable_coordinator_fails_clearly_within_bounded_time": (
        "test_waiting_for_a_silent_coordinator_is_bounded_and_names_the_address; a real 2-process group: "
        "test_a_coordinator_whose_peers_never_come_fails_within_bounded_time"
    ),
    # splash in Pallas' interpreter: tier 1 keeps non-causal with padding, causal with segments and softcap
    "tests/kernels/test_splash_attention.py::test_matches_the_float64_reference[non-causal]": "[non-causal-padding]",
    # the block's weights read after its input: tier 1 keeps remat full under mixed_bfloat16 and no remat in float32
    **{
        f"tests/layers/test_transformer_block_weights_after_input.py::test_training_call_equals_the_untied_forward[{case}]": (
            "[full-mixed_bfloat16], [none-float32]"
        )
        for case in ("none-mixed_bfloat16", "full-float32")
    },
    # the installed entry point in a fresh process with no device count set: tier 1 keeps the simulation
    # in a fresh process (tests/distribution/test_devices.py) and zoo train cnn in-process
    "tests/cli/test_cli.py::test_command_line_simulates_8_devices_on_a_cpu_host": (
        "tests/distribution/test_devices.py::test_simulation_before_jax_starts_in_a_fresh_process; "
        "test_train_end_to_end_in_process"
    ),
    "tests/data/test_load.py::test_short_fit_on_8_devices[python_docs_topics]": "[python_docs]",
    "tests/kernels/test_blockwise_attention.py::test_matches_reference[full-mha-8tiles]": "[causal-gqa-4tiles]",
    # doc examples that train or compile for several seconds: what they run is checked in
    # tier 1 by the tests of their feature; tier 2 checks the pages say what runs
    f"{DOCS}[docs/distribution.md#4]": "tests/distribution",
    f"{DOCS}[docs/models.md#2]": "tests/models/test_small_cnn.py::test_keras_file_round_trip_reproduces_outputs",
    f"{DOCS}[docs/models.md#5]": (
        "tests/training/test_optimizers.py::test_moments_in_host_memory_train_as_on_the_device_under_fsdp"
    ),
    f"{DOCS}[docs/models.md#8]": "tests/models/test_encoder.py::test_padding_does_not_change_the_logits",
    f"{DOCS}[docs/models.md#9]": "tests/models/test_vit.py::test_tensor_parallel_shards_the_weights",
    f"{DOCS}[docs/sequence_parallel.md#0]": "tests/kernels/test_blockwise_attention.py (outputs and gradients vs the reference)",
    f"{DOCS}[docs/moe.md#1]": "tests/kernels/test_moe.py::test_sparse_moe_equals_dense (every grouped matmul, outputs and gradients)",
    "tests/models/test_gpt_scan.py::test_a_scanned_fsdp_step_moves_no_more_bytes_than_the_layers": (
        "test_a_scanned_tp_step_splits_the_blocks_as_the_layers_do (the scanned step's collectives against the layers')"
    ),
    f"{DOCS}[docs/sequence_parallel.md#3]": "tests/layers/test_multi_head_attention_fit.py",
    f"{DOCS}[docs/finetuning.md#4]": "tests/training/test_lm_finetune.py",
    f"{DOCS}[docs/context_parallel.md#1]": "tests/distribution/test_context_parallel.py",
    f"{DOCS}[docs/models.md#4]": "tests/models",
    f"{DOCS}[docs/models.md#3]": "tests/training/test_optimizers.py",
    f"{DOCS}[docs/pipeline_parallel.md#0]": "tests/models/test_gpt_pipeline.py",
    f"{DOCS}[docs/moe.md#0]": "tests/models/test_gpt_moe.py",
    f"{DOCS}[docs/checkpoints.md#0]": "tests/training/checkpoints/test_checkpoints.py",
    f"{DOCS}[docs/planning.md#0]": "tests/planning",
    f"{DOCS}[docs/finetuning.md#0]": "tests/training/test_finetune.py",
    f"{DOCS}[docs/finetuning.md#5]": "tests/training/lora/test_peft_adapters.py",
    f"{DOCS}[docs/finetuning.md#2]": "tests/training/test_chat_finetune.py, tests/tokenizers/test_chat_template.py",
    f"{DOCS}[docs/finetuning.md#7]": QLORA,
    f"{DOCS}[docs/finetuning.md#6]": "tests/models/test_chunked_loss.py::test_the_function_equals_the_plain_loss_and_its_gradients",
    f"{DOCS}[docs/generation.md#1]": "tests/models/test_gpt_generate.py",
    # the examples of 1.2-4.2 s each (about 22 s together): a model built, fit or compiled
    # on the simulated devices; tier 1 runs what they show in the tests named, and every
    # page's blocks pass the static import-order check (test_docs.py)
    f"{DOCS}[docs/models.md#0]": "tests/models",
    f"{DOCS}[docs/models.md#1]": "tests/models",
    f"{DOCS}[docs/models.md#6]": "tests/models",
    f"{DOCS}[docs/checkpoints-hf.md#0]": "tests/models/test_hf_checkpoints.py",
    f"{DOCS}[docs/data.md#3]": "tests/data",
    f"{DOCS}[docs/distribution.md#5]": "tests/distribution",
    f"{DOCS}[docs/tensor_parallel.md#0]": "tests/layers/test_tensor_parallel_layers.py",
    f"{DOCS}[docs/tensor_parallel.md#1]": "tests/layers/test_tensor_parallel_layers.py",
    f"{DOCS}[docs/tensor_parallel.md#3]": "tests/layers/test_tensor_parallel_layers.py",
    f"{DOCS}[docs/sequence_parallel.md#1]": "tests/layers/test_multi_head_attention_parallel.py",
    f"{DOCS}[docs/sequence_parallel.md#2]": "tests/layers/test_multi_head_attention_packing.py",
    f"{DOCS}[docs/presets.md#1]": "tests/presets",
    f"{DOCS}[docs/context_parallel.md#2]": "tests/distribution/test_context_parallel.py",
    # Resume anywhere: tier 1 resumes across the block-form change (a layout change with the
    # most to convert); the rest goes round every GPT and CNN layout, and onto 4 devices
    **{
        f"{RESUME}::test_a_gpt_checkpoint_resumes_under_another_layout[{pair}]": RESUME_TIER_1
        for pair in (
            "single-to-data",
            "data-to-fsdp",
            "fsdp-to-tp",
            "tp-to-tp+sp",
            "tp+sp-to-context",
            "context-to-pipeline",
            "pipeline-to-single",
        )
    },
    **{
        f"{RESUME}::test_a_cnn_checkpoint_resumes_under_another_layout[{pair}]": (
            "tests/training/checkpoints/test_checkpoints.py::test_restore_puts_arrays_back_in_their_sharded_layout"
        )
        for pair in ("data-to-model", "model-to-single", "single-to-data")
    },
    f"{RESUME}::test_a_checkpoint_of_8_devices_resumes_on_4[gpt-tp-fsdp]": RESUME_TIER_1,
    f"{RESUME}::test_a_checkpoint_of_8_devices_resumes_on_4[cnn-model-model]": RESUME_TIER_1,
}


def module_of(test_id):
    return test_id.split("::")[0]
