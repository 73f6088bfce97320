"""``GPTBackbone``: token ids -> hidden states of a decoder-only (GPT-style) Transformer."""

import keras

from zoo.distribution.axes import DATA, MODEL
from zoo.layers import PipelinedBlocks, TransformerBlock
from zoo.layers.offset_rms_normalization import OffsetRMSNormalization
from zoo.layers.rotary_embedding import check_rope_scaling
from zoo.layers.transformer_block import check_remat
from zoo.models.gpt import _backbone_checks as _checks
from zoo.models.gpt import _gpt_layouts
from zoo.models.gpt.gpt_configs import GPT_CONFIGS, backbone_config, with_depth_pattern
from zoo.models.zoo_model import ZooModel


@keras.saving.register_keras_serializable(package="zoo")
class GPTBackbone(ZooModel):
    """Token embedding, ``num_layers`` causal pre-norm ``TransformerBlock``s, final norm.

    ``token_ids (B, T) int32 -> hidden states (B, T, C)``; T may vary between calls (the
    functional graph has a None sequence length). Packed rows (several documents per row,
    ``zoo.data.pack_examples``): ``{"token_ids": (B, T), "segment_ids": (B, T)}``, the
    document of each token (1, 2, ...; 0 = padding), and every block's attention stays
    within a document, on every layout. Positions need not restart per document: the
    rotary embedding makes a query-key score depend on their distance only, so each
    document computes what it computes alone (to float32 rounding of the angles). Attention is causal with rotary
    position embedding (no learned positions) and grouped-query heads when
    ``num_key_value_heads < num_query_heads``. Argument names are keras-hub's
    ``LlamaBackbone``'s where the idea is the same.

    Args:
        vocabulary_size: V, rows of the token embedding.
        num_layers: L, Transformer blocks ``block_0`` .. ``block_{L-1}``.
        num_query_heads: H, query heads.
        hidden_dim: C, the residual stream's width.
        intermediate_dim: F, the MLP's hidden width.
        num_key_value_heads: K, key/value heads (divides H); None means H.
        head_dim: D; None means C // H (then H must divide C).
        mlp: ``"swiglu"``, ``"geglu"`` (gated), ``"gelu"`` or ``"relu"``.
        norm: ``"rms"`` (RMSNorm), ``"rms_offset"`` (RMSNorm times 1 + weight, Gemma's) or
            ``"layer"`` (LayerNorm), for the blocks, the qk-norm and the final norm.
        layer_norm_epsilon: the norms' epsilon.
        dropout: rate after the embedding and on each block's two residual branches.
        max_sequence_length: the longest sequence ``generate`` accepts (prompt plus new
            tokens); rotary positions need no table, so training is not limited by it.
        rope_max_wavelength: RoPE's base wavelength.
        rope_scaling: None, or Llama 3's frequency scaling (Llama 3.1 / 3.2 checkpoints):
            ``{"rope_type": "llama3", "factor", "low_freq_factor", "high_freq_factor",
            "original_max_position_embeddings"}``; other types are refused.
        qkv_bias: biases on the query, key and value projections (Qwen2), none on the
            attention output or the MLP.
        qk_norm: RMSNorm (epsilon ``layer_norm_epsilon``) over D of every query and key
            head, after the projections and before rotary embedding (Qwen3's ``q_norm`` /
            ``k_norm``): ``block_<i>/attention/query_norm/scale`` and ``key_norm/scale`` (D,).
        post_norms: each block also normalises its attention and MLP outputs before the
            residual adds (Gemma 2/3; ``TransformerBlock(post_norms=True)``).
        scale_embeddings: multiply the token embeddings by sqrt(C) in the compute dtype
            (Gemma), layer ``embedding_scale``; the tied head uses the unscaled table.
        attention_scale: multiplies q.k (None: 1 / sqrt(D); Gemma: ``query_pre_attn_scalar ** -0.5``).
        attention_logit_softcap: None, or c: attention scores c * tanh(scores / c)
            before the mask, in every kernel (Gemma 2's ``attn_logit_softcapping``).
        final_logit_softcap: None, or c: the causal LM's logits c * tanh(logits / c)
            (Gemma 2's ``final_logit_softcapping``).
        local_rope_max_wavelength: None (every block ``rope_max_wavelength`` with
            ``rope_scaling``), or the RoPE base of the windowed blocks
            (``sliding_window_layers``), which then take no ``rope_scaling`` (Gemma 3's
            ``rope_local_base_freq``; the global blocks keep ``rope_max_wavelength``).
        sliding_window: None (full causal attention), or W >= 1: a token at position p
            attends only to positions p - W < k <= p (Mistral's window), in training and
            in KV-cache decoding.
        sliding_window_layers: which blocks use the window: None (every block, when
            ``sliding_window`` is set), or a list of block indices (Qwen2's blocks
            ``max_window_layers``..L-1, say); the others attend fully. Needs
            ``sliding_window``; a pipelined backbone takes the window in every block only
            (and then ``local_rope_max_wavelength`` in every block too).
        tie_word_embeddings: the causal LM's head is the token embedding used in reverse
            (``x @ E^T``) instead of its own ``lm_head``; the backbone's weights are the same.
        seed: seeds the dropout streams (embedding: seed, block i: seed + 1 + 2i and + 2i + 2).
        megatron_sp: Megatron sequence parallelism in every block (layout tp+sp).
        context_attention: every attention's sequence-parallel kernel (None, ``"gather"``,
            ``"ring"``, ``"ulysses"``); None lets a context-parallel distribution choose.
        remat: every block's rematerialisation in training: ``"none"``, ``"full"`` or
            ``"dots_saveable"`` (see ``TransformerBlock``); the numbers are the same,
            only memory and compute change.
        schedule: None (blocks ``block_0`` .. ``block_{L-1}``), or ``"gpipe"`` /
            ``"circular"``: the L blocks are one ``PipelinedBlocks`` named ``blocks``
            (weights stacked, layout pipeline splits them over a ``stage`` mesh
            axis); see docs/pipeline_parallel.md.
        micro_batches: M, the pieces a pipelined batch is cut into.
        scan_layers: the L blocks are one ``PipelinedBlocks`` named ``blocks`` (weights
            stacked (1, L, ...), as a gpipe pipeline holds them) run by one ``lax.scan``
            on every device: one block's program, so compile time does not grow with
            depth, and under ``fsdp`` each block's weights are gathered inside the loop
            (MaxText's ``scan_layers``), under ``tp`` each keeps Megatron's split over
            ``model``, under ``tp+sp`` (``megatron_sp``) and ``context`` the loop runs
            the layers' own sequence-parallel kernels (Megatron's all-gather and
            reduce-scatter over ``model``; the ring, gather or Ulysses attention over
            ``seq``), and under the expert layouts MoE blocks (every block sparse: no
            ``moe_layers`` subset) their exchange, the router losses summed over the
            blocks. Layouts ``choices.SCANNED_LAYOUTS``; no ``schedule``.
            The numbers are those of the L-layer form, and checkpoints and ``.keras``
            files of either form load into the other (``with_block_form``).
        repeats: R, how often a micro-batch goes round the stages (``"circular"``: >= 2).
        num_experts: E; > 0 makes the blocks' MLPs sparse Mixture-of-Experts layers
            (``zoo.layers.MoEFeedForward``: SwiGLU experts, top-k routing, expert
            parallelism under the ``expert`` layouts; docs/moe.md). 0: dense.
        num_experts_per_token: k, experts each token is routed to.
        moe_intermediate_dim: each expert's hidden width (None: ``intermediate_dim``).
        shared_expert_dim: width of a shared SwiGLU expert every token also runs,
            gated by a sigmoid (Qwen2-MoE); 0: none.
        moe_layers: the indices of the sparse blocks (None: every block when
            ``num_experts`` > 0); the others keep a dense MLP of ``intermediate_dim``.
        normalize_router_weights: renormalise the k routing weights to sum 1 (Mixtral).
        router_aux_loss_coefficient, router_z_loss_coefficient: weights of the
            load-balancing loss and router z-loss added in training.
        capacity_factor: None (dropless) or the expert exchange's capacity
            (``zoo.kernels.moe``; dropped assignments are counted in ``logs``).
        expert_exchange: ``"all_to_all"`` or ``"ragged"`` (GPU/TPU; see ``MoEFeedForward``).

    Named sizes: ``GPTBackbone.from_config_name("gpt_tiny")`` (``gpt_configs.GPT_CONFIGS``).

    Variable paths (see ``get_layout_map`` for layouts): ``token_embedding/embeddings``
    (V, C), ``block_<i>/...`` (``TransformerBlock``), ``final_norm/scale`` (C,) for RMS
    or ``final_norm/gamma``, ``final_norm/beta`` for LayerNorm.
    """

    CONFIGS = GPT_CONFIGS

    def __init__(
        self,
        vocabulary_size,
        num_layers,
        num_query_heads,
        hidden_dim,
        intermediate_dim,
        num_key_value_heads=None,
        head_dim=None,
        mlp="swiglu",
        norm="rms",
        layer_norm_epsilon=1e-5,
        dropout=0.0,
        max_sequence_length=1024,
        rope_max_wavelength=10000.0,
        rope_scaling=None,
        qkv_bias=False,
        qk_norm=False,
        post_norms=False,
        scale_embeddings=False,
        attention_scale=None,
        attention_logit_softcap=None,
        final_logit_softcap=None,
        local_rope_max_wavelength=None,
        sliding_window=None,
        sliding_window_layers=None,
        tie_word_embeddings=False,
        seed=None,
        megatron_sp=False,
        context_attention=None,
        remat="none",
        schedule=None,
        micro_batches=1,
        repeats=1,
        scan_layers=False,
        num_experts=0,
        num_experts_per_token=2,
        moe_intermediate_dim=None,
        shared_expert_dim=0,
        moe_layers=None,
        normalize_router_weights=True,
        router_aux_loss_coefficient=0.01,
        router_z_loss_coefficient=0.0,
        capacity_factor=None,
        expert_exchange="all_to_all",
        name="gpt_backbone",
        **kwargs,
    ):
        num_key_value_heads = num_query_heads if num_key_value_heads is None else num_key_value_heads
        head_dim = _checks.default_head_dim(hidden_dim, num_query_heads) if head_dim is None else head_dim
        remat = check_remat(remat)
        _checks.check_config(
            vocabulary_size=vocabulary_size, num_layers=num_layers, num_query_heads=num_query_heads,
            hidden_dim=hidden_dim, intermediate_dim=intermediate_dim, num_key_value_heads=num_key_value_heads,
            head_dim=head_dim, mlp=mlp, norm=norm, dropout=dropout, max_sequence_length=max_sequence_length,
        )  # fmt: skip
        token_ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")  # (B, T)
        x = _embedded(token_ids, vocabulary_size, hidden_dim, scale_embeddings, dropout, seed)  # (B, T, C)
        block = dict(
            num_heads=num_query_heads, head_dim=head_dim, hidden_dim=intermediate_dim, num_kv_heads=num_key_value_heads,
            causal=True, rotary=True, rotary_base=rope_max_wavelength, rope_scaling=rope_scaling, qkv_bias=qkv_bias,
            qk_norm=bool(qk_norm), post_norms=bool(post_norms), attention_scale=attention_scale,
            attention_softcap=attention_logit_softcap, mlp=mlp, norm=norm, norm_epsilon=layer_norm_epsilon, dropout=dropout, context_attention=context_attention,
            megatron_sp=megatron_sp, remat=remat,
        )  # fmt: skip
        moe_layers = _checks.check_moe_layers(moe_layers, num_layers, num_experts)
        window_layers = _checks.check_sliding_window_layers(sliding_window, sliding_window_layers, num_layers)
        moe = dict(
            num_experts_per_token=num_experts_per_token, moe_intermediate_dim=moe_intermediate_dim,
            shared_expert_dim=shared_expert_dim, normalize_router_weights=normalize_router_weights,
            router_aux_loss_coefficient=router_aux_loss_coefficient, router_z_loss_coefficient=router_z_loss_coefficient,
            capacity_factor=capacity_factor, expert_exchange=expert_exchange,
        )  # fmt: skip
        stacked = _checks.stacked_form(schedule, scan_layers)
        if stacked:
            x = _stacked_blocks(
                x, stacked, block, moe, num_layers=num_layers, num_experts=num_experts, moe_layers=moe_layers,
                sliding_window=sliding_window, window_layers=window_layers, local_rope=local_rope_max_wavelength,
                schedule=schedule, micro_batches=micro_batches, repeats=repeats, seed=seed,
            )  # fmt: skip
        for index in range(0 if stacked else num_layers):
            sparse = dict(num_experts=num_experts if index in moe_layers else 0, **moe) if num_experts else {}
            window = sliding_window if index in window_layers else None
            x = TransformerBlock(
                **{**block, **_local_rope(local_rope_max_wavelength, window)}, **sparse, sliding_window=window,
                seed=None if seed is None else seed + 1 + 2 * index, name=f"block_{index}",
            )(x)  # (B, T, C)  # fmt: skip
        x = _norm(norm, layer_norm_epsilon, "final_norm")(x)  # (B, T, C)
        super().__init__(inputs=token_ids, outputs=x, name=name, **kwargs)
        self.keep_arguments(
            vocabulary_size=vocabulary_size, num_layers=num_layers, num_query_heads=num_query_heads,
            hidden_dim=hidden_dim, intermediate_dim=intermediate_dim, num_key_value_heads=num_key_value_heads,
            head_dim=head_dim, mlp=mlp, norm=norm, layer_norm_epsilon=layer_norm_epsilon, dropout=dropout,
            max_sequence_length=max_sequence_length, rope_max_wavelength=rope_max_wavelength,
            rope_scaling=check_rope_scaling(rope_scaling), qkv_bias=bool(qkv_bias), qk_norm=bool(qk_norm),
            post_norms=bool(post_norms), scale_embeddings=bool(scale_embeddings),
            attention_scale=None if attention_scale is None else float(attention_scale),
            attention_logit_softcap=None if attention_logit_softcap is None else float(attention_logit_softcap),
            final_logit_softcap=None if final_logit_softcap is None else float(final_logit_softcap),
            local_rope_max_wavelength=local_rope_max_wavelength, sliding_window=sliding_window,
            sliding_window_layers=None if len(window_layers) in (0, num_layers) else sorted(window_layers),
            tie_word_embeddings=bool(tie_word_embeddings), seed=seed, megatron_sp=bool(megatron_sp),
            context_attention=context_attention, remat=remat, schedule=schedule, micro_batches=micro_batches,
            repeats=repeats, scan_layers=bool(scan_layers), num_experts=num_experts or 0, moe_layers=None if moe_layers is None or len(moe_layers) == num_layers else sorted(moe_layers),
            **{**moe, "shared_expert_dim": shared_expert_dim or 0, "normalize_router_weights": bool(normalize_router_weights)},
        )  # fmt: skip

    def call(self, inputs, training=None, mask=None):
        """The functional graph on token_ids (B, T); on a dict with ``segment_ids`` the
        same layers, each block told the documents (B, T, C)."""
        if not isinstance(inputs, dict):
            return super().call(inputs, training=training, mask=mask)
        token_ids, segment_ids = packed_inputs(inputs, self.name)
        x = self.token_embedding(token_ids)  # (B, T, C)
        if self.scale_embeddings:
            x = self.get_layer("embedding_scale")(x)
        x = self.get_layer("embedding_dropout")(x, training=training)
        if self.stacked:
            x = self.pipelined_blocks(x, training=training, segment_ids=segment_ids)
        else:
            for block in self.blocks:
                x = block(x, training=training, segment_ids=segment_ids)  # (B, T, C)
        return self.final_norm(x)  # (B, T, C)

    def set_remat(self, remat):
        """Rematerialise every block as ``remat`` (``__init__``'s choices) from the next
        traced training step on; the weights are untouched and ``get_config`` saves it.
        ``--remat auto`` (``zoo.training.remat_choice``) compiles one built model's step
        under each policy it tries."""
        self.remat = check_remat(remat)
        if self.stacked:
            self.pipelined_blocks.set_remat(self.remat)
        else:
            for block in self.blocks:
                block.remat = self.remat

    def get_config(self):
        """The ``__init__`` arguments, with ``context_attention`` the kernel the blocks use:
        one recorded under a ``ContextParallel`` (``ring``, say) is saved, not ``None``."""
        config = super().get_config()
        if self.num_layers and not self.stacked:
            config["context_attention"] = self.blocks[0].context_attention
        return config

    # --- sublayers by their stable names ---------------------------------------------

    @property
    def token_embedding(self):
        return self.get_layer("token_embedding")

    @property
    def stacked(self):
        """True when the blocks are one ``PipelinedBlocks`` with stacked weights (a
        ``schedule`` or ``scan_layers``), False for the layers ``block_0`` ..."""
        return _checks.stacked_form(self.schedule, self.scan_layers) is not None

    @property
    def blocks(self):
        """The ``TransformerBlock``s ``block_0`` .. (a pipelined or scanned backbone has one
        ``PipelinedBlocks`` instead: ``pipelined_blocks``)."""
        if self.stacked:
            raise ValueError(
                f"{self.name} holds its blocks stacked ({_checks.stacked_form(self.schedule, self.scan_layers)}): its "
                f"{self.num_layers} blocks are one PipelinedBlocks layer, backbone.pipelined_blocks"
            )
        return [self.get_layer(f"block_{index}") for index in range(self.num_layers)]

    @property
    def pipelined_blocks(self):
        """The ``PipelinedBlocks`` of a backbone built with a ``schedule`` or ``scan_layers``."""
        return self.get_layer("blocks")

    @property
    def final_norm(self):
        return self.get_layer("final_norm")

    # --- KV-cache decoding -----------------------------------------------------------

    def empty_caches(self, batch_size, cache_length):
        """One zero cache (B, 2, S, K, D) per block, S = ``cache_length``."""
        return [block.attention.empty_cache(batch_size, cache_length) for block in self.blocks]

    def call_with_cache(self, token_ids, caches, cache_index, start_positions=None):
        """Inference forward pass of T new tokens at positions cache_index..cache_index+T-1.

        token_ids (B, T) int32; caches: ``empty_caches`` or a previous call's;
        start_positions: i32[B] first real position of each left-padded row (None: 0);
        returns ``(hidden (B, T, C), new caches)``. Dropout is off.
        """
        x = self.token_embedding(token_ids)  # (B, T, C)
        if self.scale_embeddings:
            x = self.get_layer("embedding_scale")(x)  # (B, T, C)
        updated = []
        for block, cache in zip(self.blocks, caches):
            x, cache = block(
                x, cache=cache, cache_index=cache_index, start_positions=start_positions
            )  # (B, T, C), (B, 2, S, K, D)
            updated.append(cache)
        return self.final_norm(x), updated  # (B, T, C)

    # --- config and layouts ----------------------------------------------------------

    @classmethod
    def named_config(cls, name, layout=None, **overrides):
        """``ZooModel.named_config``; a ``num_layers`` override keeps the config's per-layer
        pattern (``gpt_configs.depth_overrides``: gemma3_1b at 12 blocks is two 5:1
        local/global periods) unless ``overrides`` sets it."""
        return super().named_config(name, layout, **with_depth_pattern(name, overrides))

    @classmethod
    def get_layout_map(cls, mesh, layout="tp", config=None, *, data_axis=DATA, model_axis=MODEL):
        """``LayoutMap`` for a layout (``data``, ``fsdp``, ``tp``, ``tp+sp``, ``fsdp+tp``).

        The block rules of ``zoo.models._transformer_layouts`` plus the token embedding;
        ``GPTCausalLM.get_layout_map`` documents the full table. With ``config`` (any
        config ``gpt_configs.backbone_config`` reads) the sizes are checked against the
        mesh first and a ``LayoutError`` names e.g. ``num_key_value_heads=2`` and the
        ``model`` axis of size 4.
        """
        config = None if config is None else backbone_config(config)
        return _gpt_layouts.layout_map(
            mesh, layout, config, with_head=False, data_axis=data_axis, model_axis=model_axis
        )


def _stacked_blocks(x, stacked, block, moe, *, num_layers, num_experts, moe_layers, sliding_window, window_layers,
                    local_rope, schedule, micro_batches, repeats, seed):  # fmt: skip
    """x (B, T, C) through the L blocks as one ``PipelinedBlocks`` named ``blocks`` (weights
    stacked; a ``schedule`` or ``scan_layers``), after checking the blocks are identical:
    every block windowed or none (each then takes the local RoPE base), all dense or all MoE."""
    _checks.check_pipeline(
        stacked, megatron_sp=block["megatron_sp"], context_attention=block["context_attention"],
        sparse_blocks=len(moe_layers) if num_experts else 0, num_layers=num_layers, pipelined=schedule is not None,
    )  # fmt: skip
    _checks.check_pipeline_window(stacked, sliding_window, window_layers, num_layers)
    sparse = dict(num_experts=num_experts, **moe) if num_experts else {}  # every block's MoE (checked)
    arguments = {**block, **sparse, **_local_rope(local_rope, sliding_window), "sliding_window": sliding_window}
    return PipelinedBlocks(
        num_layers, arguments, schedule=schedule or "gpipe", micro_batches=micro_batches, repeats=repeats,
        seed=None if seed is None else seed + 1, name="blocks",
    )(x)  # (B, T, C)  # fmt: skip


def _embedded(token_ids, vocabulary_size, hidden_dim, scale_embeddings, dropout, seed):
    """token ids (B, T) -> embeddings (B, T, C): ``token_embedding`` (reversible: ``reverse=True``
    gives x @ E^T for a tied head), times sqrt(C) in the compute dtype where
    ``scale_embeddings`` (Gemma, as transformers' does), then ``embedding_dropout``."""
    x = keras.layers.ReversibleEmbedding(vocabulary_size, hidden_dim, tie_weights=True, name="token_embedding")(
        token_ids
    )  # (B, T, C)
    if scale_embeddings:
        x = keras.layers.Rescaling(hidden_dim**0.5, name="embedding_scale")(x)  # (B, T, C)
    return keras.layers.Dropout(dropout, seed=seed, name="embedding_dropout")(x)  # (B, T, C)


def _norm(kind, epsilon, name):
    if kind == "rms_offset":
        return OffsetRMSNormalization(epsilon=epsilon, name=name)
    if kind == "rms":
        return keras.layers.RMSNormalization(epsilon=epsilon, name=name)
    return keras.layers.LayerNormalization(epsilon=epsilon, name=name)


def _local_rope(local_rope_max_wavelength, window):
    """The ``TransformerBlock`` arguments a block with ``window`` (None: global) takes over
    the backbone's RoPE: the local base, unscaled (Gemma 3), on windowed blocks only."""
    if local_rope_max_wavelength is None or window is None:
        return {}
    return {"rotary_base": local_rope_max_wavelength, "rope_scaling": None}


PACKED_KEYS = ("token_ids", "segment_ids")


def packed_inputs(inputs, name):
    """``(token_ids, segment_ids)`` of a packed batch ``{"token_ids", "segment_ids"}``, both
    (B, T); raises naming the keys or the shapes that do not fit."""
    if set(inputs) != set(PACKED_KEYS):
        raise ValueError(
            f"{name}: a dict input holds exactly {list(PACKED_KEYS)} (packed rows), got keys {sorted(inputs)}"
        )
    token_ids, segment_ids = inputs["token_ids"], inputs["segment_ids"]
    if tuple(token_ids.shape) != tuple(segment_ids.shape) or len(token_ids.shape) != 2:
        raise ValueError(
            f"{name}: token_ids {tuple(token_ids.shape)} and segment_ids {tuple(segment_ids.shape)} must both be (B, T)"
        )
    return token_ids, segment_ids
