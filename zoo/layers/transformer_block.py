"""``TransformerBlock``: a pre-norm Transformer block built from the zoo's parallel layers."""

import jax
import keras

from zoo._compat import sublayers
from zoo.config.choices import MLPS, NORMS
from zoo.config.renamed import ATTENTION_KEYS, renamed_keys
from zoo.distribution.axes import MODEL
from zoo.layers._activations import gelu_tanh
from zoo.layers._parallel_plan import resolve_plan
from zoo.layers._quantized import is_built_quantized
from zoo.layers._remat import REMAT_POLICIES, check_remat  # noqa: F401 (check_remat: the models import it from here)
from zoo.layers._tensor_parallel import activation_spec, tensor_parallel_plan
from zoo.layers.moe_feed_forward import MoEFeedForward
from zoo.layers.multi_head_attention import MultiHeadAttention
from zoo.layers.offset_rms_normalization import OffsetRMSNormalization
from zoo.layers.parallel_mlp import ParallelMLP

MLP_ACTIVATIONS = {
    # mlp name (one of MLPS): (activation, gated)
    "gelu": ("gelu", False),  # exact: an erf per element
    "gelu_tanh": (gelu_tanh, False),  # GPT-2's gelu_new: a tanh per element
    "relu": ("relu", False),
    "geglu": ("gelu", True),
    "geglu_tanh": (gelu_tanh, True),  # Gemma's GeGLU: tanh-approximate GELU
    "swiglu": ("silu", True),
}


def check_block_options(*, mlp, norm, dropout):
    """Raise ``ValueError`` naming the value for an unknown MLP or norm, or a dropout outside [0, 1)."""
    if mlp not in MLPS:
        raise ValueError(f"mlp must be one of {list(MLPS)}, got {mlp!r}")
    if norm not in NORMS:
        raise ValueError(f"norm must be one of {list(NORMS)}, got {norm!r}")
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout must be in [0, 1), got {dropout}")


def _sequence_is_split():
    """Whether the global distribution splits the sequence (a ``ContextParallel``)."""
    return resolve_plan().sequence_axis is not None


@keras.saving.register_keras_serializable(package="zoo")
class TransformerBlock(keras.layers.Layer):
    """``x + dropout(attention(norm(x)))`` then ``x + dropout(mlp(norm(x)))``.

    The attention is ``zoo.layers.MultiHeadAttention`` (GQA, rotary, causal, and the
    sequence-parallel kernels under a distribution that splits the sequence); the MLP
    is ``zoo.layers.ParallelMLP`` (Megatron column/row split under a mesh with a
    ``model`` axis, plain Dense layers otherwise).

    Args:
        num_heads, head_dim, num_kv_heads, causal, rotary, rotary_base, rope_scaling,
            qkv_bias, sliding_window: as in ``MultiHeadAttention`` (sliding_window: None,
            or W with ``causal``: each query sees its W most recent keys, itself included).
        qk_norm: the attention's qk-norm (Qwen3: RMSNorm over D of each query and key
            head before rotary embedding), with ``norm_epsilon``.
        hidden_dim: F, the MLP's hidden features.
        mlp: ``"gelu"``, ``"relu"`` (two matrices) or ``"geglu"``, ``"swiglu"`` (gated,
            three matrices).
        norm: ``"layer"`` (LayerNorm), ``"rms"`` (RMSNorm) or ``"rms_offset"`` (RMSNorm
            times 1 + weight, ``OffsetRMSNormalization``: Gemma's; the qk-norm too).
        post_norms: also normalise each sublayer's output before its residual add
            (Gemma 2/3: ``x + norm(attention(norm(x)))``): ``attention_post_norm``,
            ``mlp_post_norm``.
        attention_scale, attention_softcap: the attention's ``attention_scale`` and
            ``softcap`` (Gemma's ``query_pre_attn_scalar ** -0.5`` and ``attn_logit_softcapping``).
        norm_epsilon: the norms' epsilon.
        dropout: rate applied to the attention and the MLP outputs before each
            residual add (0 disables it).
        use_bias: biases on the attention projections and the MLP.
        context_attention: the attention's ``context_attention`` (None, ``"gather"``,
            ``"ring"``, ``"ulysses"``); None lets a ``ContextParallel`` distribution
            choose (and the block's config then records its kernel).
        megatron_sp: Megatron sequence parallelism for tensor parallelism: the
            MLP takes and returns activations split on the sequence over ``model_axis``
            (one all-gather and one reduce-scatter instead of one all-reduce), so the
            norms and dropout run on 1/N of the tokens.
        model_axis: the mesh axis tensor parallelism splits over.
        kernel_initializer: for every projection.
        seed: seed of the dropout layers' random streams.
        remat: rematerialisation of the block in training: ``"none"`` (or None; keep
            every activation for the backward pass), ``"full"`` (keep only the block's
            inputs and recompute the rest in the backward pass:
            ``jax.checkpoint_policies.nothing_saveable``) or ``"dots_saveable"`` (keep
            the outputs of the weight matmuls, recompute the norms, activations,
            attention and dropout masks: ``dots_with_no_batch_dims_saveable``, which
            leaves the attention kernel's O(T^2) score tiles out), ``"save_attention"``
            (keep the attention's q, k, v and its kernel's output and log-sum-exp, named
            ``attention_qkv`` / ``attention_out``: the backward pass re-runs the output
            projection, norms and MLP, never the attention kernel) or
            ``"offload_attention"`` (the same tensors, kept in host memory between the
            passes). Inference calls are never rematerialised (there is no backward pass).
        num_experts: E > 0 replaces the MLP by a ``MoEFeedForward`` named ``mlp`` (SwiGLU
            experts; ``mlp`` must be ``"swiglu"``, no ``megatron_sp``); 0: the dense MLP.
        num_experts_per_token, moe_intermediate_dim (None: ``hidden_dim``),
            shared_expert_dim, normalize_router_weights, router_aux_loss_coefficient,
            router_z_loss_coefficient, capacity_factor, expert_exchange: the ``MoEFeedForward``'s
            (its ``intermediate_dim`` is ``moe_intermediate_dim``). Its losses and
            router statistics are recorded after the (possibly rematerialised) block.

    Call: ``block(x, key_mask=None, training=None, segment_ids=None)``; x (B, T, C) ->
    (B, T, C); segment_ids int (B, T) or None: the document of each token of a packed
    row (0 = padding), passed to the attention (``MultiHeadAttention``): no token
    attends across documents. The MLP and norms are per token, so a packed row computes
    what each document computes alone (with RoPE, up to the positions' offset, which
    rotary scores do not depend on).

    Dropout and remat: the two dropout seeds are drawn from the dropout layers' seed
    generators before the block's computation, which takes them as arguments; the
    computation itself assigns no variable, so ``jax.checkpoint`` can recompute it, and
    a block with and without remat draws the same masks (the same numbers in training).

    Cached call (decoding): ``block(x, cache=cache, cache_index=i)`` with the
    attention's cache (B, 2, S, K, D) (``attention.empty_cache(B, S)``) returns
    ``(y (B, T, C), new cache)``; see ``MultiHeadAttention``. Under a mesh whose model
    axis splits (size > 1) it needs ``megatron_sp=False``: a decode step's
    T = 1 token cannot split over the sequence.

    Sublayers (variable paths under ``<name>/``, C = channels, H/K heads/KV heads,
    D = head_dim, F = hidden_dim; the MLP's ``gate`` only when gated):

    =====================================  ===========
    path                                   shape
    =====================================  ===========
    attention_norm/gamma, beta (or scale)  (C,)
    attention/query/kernel                 (C, H, D)
    attention/key/kernel, value/kernel     (C, K, D)
    attention/output/kernel                (H, D, C)
    attention/query_norm/scale, key_norm/  (D,), with ``qk_norm``
    mlp_norm/gamma, beta (or scale)        (C,)
    attention_post_norm/, mlp_post_norm/   (C,), with ``post_norms``
    mlp/gate/kernel, mlp/up/kernel         (C, F)
    mlp/down/kernel                        (F, C)
    =====================================  ===========
    """

    def __init__(
        self,
        num_heads,
        head_dim,
        hidden_dim,
        num_kv_heads=None,
        causal=False,
        rotary=False,
        rotary_base=10000.0,
        rope_scaling=None,
        mlp="gelu",
        norm="layer",
        norm_epsilon=1e-5,
        dropout=0.0,
        use_bias=False,
        qkv_bias=False,
        sliding_window=None,
        qk_norm=False,
        post_norms=False,
        attention_scale=None,
        attention_softcap=None,
        context_attention=None,
        megatron_sp=False,
        model_axis=MODEL,
        kernel_initializer="glorot_uniform",
        seed=None,
        remat="none",
        num_experts=0,
        num_experts_per_token=2,
        moe_intermediate_dim=None,
        shared_expert_dim=0,
        normalize_router_weights=True,
        router_aux_loss_coefficient=0.01,
        router_z_loss_coefficient=0.0,
        capacity_factor=None,
        expert_exchange="all_to_all",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.remat = check_remat(remat)
        check_block_options(mlp=mlp, norm=norm, dropout=dropout)
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.hidden_dim = hidden_dim
        self.num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        self.causal = causal
        self.rotary = rotary
        self.rotary_base = rotary_base
        self.mlp_kind = mlp
        self.norm = norm
        self.norm_epsilon = norm_epsilon
        self.post_norms = bool(post_norms)
        self.dropout = dropout
        self.use_bias = use_bias
        self.megatron_sp = bool(megatron_sp)
        self.model_axis = model_axis
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.seed = seed
        self.attention = self._make_attention(
            rope_scaling=rope_scaling, qkv_bias=qkv_bias, sliding_window=sliding_window, qk_norm=qk_norm,
            attention_scale=attention_scale, softcap=attention_softcap, context_attention=context_attention,
        )  # fmt: skip
        self.num_experts = num_experts or 0
        self.moe = dict(
            num_experts_per_token=num_experts_per_token, moe_intermediate_dim=moe_intermediate_dim,
            shared_expert_dim=shared_expert_dim or 0, normalize_router_weights=bool(normalize_router_weights),
            router_aux_loss_coefficient=router_aux_loss_coefficient, router_z_loss_coefficient=router_z_loss_coefficient,
            capacity_factor=capacity_factor, expert_exchange=expert_exchange,
        )  # fmt: skip
        self.mlp = self._make_mlp(mlp, moe_intermediate_dim)
        self.attention_norm = self._norm("attention_norm")
        self.mlp_norm = self._norm("mlp_norm")
        self.attention_post_norm = self._norm("attention_post_norm") if self.post_norms else None
        self.mlp_post_norm = self._norm("mlp_post_norm") if self.post_norms else None
        # The block's dtype policy, as every sublayer: a float32 Dropout would cast the
        # cached call's output back to float32 under a mixed policy.
        self.attention_dropout = keras.layers.Dropout(
            dropout, seed=seed, dtype=self.dtype_policy, name="attention_dropout"
        )
        self.mlp_dropout = keras.layers.Dropout(
            dropout, seed=None if seed is None else seed + 1, dtype=self.dtype_policy, name="mlp_dropout"
        )

    def _make_attention(self, **options):
        """The block's ``MultiHeadAttention`` (named ``attention``): its heads, RoPE, norm and
        parallelism from the block, ``options`` (the attention's own arguments) as given."""
        return MultiHeadAttention(
            num_heads=self.num_heads,
            head_dim=self.head_dim,
            num_kv_heads=self.num_kv_heads,
            causal=self.causal,
            rotary=self.rotary,
            rotary_base=self.rotary_base,
            use_bias=self.use_bias,
            qk_norm_epsilon=self.norm_epsilon,
            qk_norm_offset=self.norm == "rms_offset",
            megatron_sp=self.megatron_sp,
            model_axis=self.model_axis,
            kernel_initializer=self._initializer(),
            dtype=self.dtype_policy,
            name="attention",
            **options,
        )

    def _make_mlp(self, mlp, moe_intermediate_dim):
        """The block's MLP (named ``mlp``): a ``MoEFeedForward`` of ``num_experts`` experts, or
        a dense ``ParallelMLP`` of width ``hidden_dim``."""
        if self.num_experts:
            self._check_moe_mlp(mlp, self.megatron_sp)
            options = {key: value for key, value in self.moe.items() if key != "moe_intermediate_dim"}
            return MoEFeedForward(
                self.num_experts, intermediate_dim=moe_intermediate_dim or self.hidden_dim, model_axis=self.model_axis,
                kernel_initializer=self._initializer(), dtype=self.dtype_policy, name="mlp", **options,
            )  # fmt: skip
        activation, gated = MLP_ACTIVATIONS[mlp]
        return ParallelMLP(
            self.hidden_dim,
            activation=activation,
            gated=gated,
            use_bias=self.use_bias,
            megatron_sp=self.megatron_sp,
            model_axis=self.model_axis,
            kernel_initializer=self._initializer(),
            dtype=self.dtype_policy,
            name="mlp",
        )

    def _initializer(self):
        return keras.initializers.get(keras.initializers.serialize(self.kernel_initializer))

    def _check_moe_mlp(self, mlp, megatron_sp):
        if mlp != "swiglu" or megatron_sp:
            raise ValueError(
                f"TransformerBlock {self.name!r}: a Mixture-of-Experts block (num_experts={self.num_experts}) has "
                f"SwiGLU experts and no Megatron sequence parallelism; got mlp={mlp!r}, megatron_sp={megatron_sp!r}"
            )

    def _norm(self, name):
        if self.norm == "rms_offset":
            return OffsetRMSNormalization(epsilon=self.norm_epsilon, dtype=self.dtype_policy, name=name)
        if self.norm == "rms":
            return keras.layers.RMSNormalization(epsilon=self.norm_epsilon, dtype=self.dtype_policy, name=name)
        return keras.layers.LayerNormalization(epsilon=self.norm_epsilon, dtype=self.dtype_policy, name=name)

    def build(self, input_shape):
        if len(input_shape) != 3 or input_shape[-1] is None:
            raise ValueError(
                f"TransformerBlock expects inputs (batch, length, channels) with channels known, got {tuple(input_shape)}"
            )
        for layer in (self.attention_norm, self.attention, self.mlp_norm, self.mlp):
            layer.build(input_shape)
        for layer in (self.attention_post_norm, self.mlp_post_norm) if self.post_norms else ():
            layer.build(input_shape)

    def call(
        self, x, key_mask=None, training=None, cache=None, cache_index=None, start_positions=None, segment_ids=None
    ):
        if cache is not None:
            if segment_ids is not None:
                raise ValueError(f"TransformerBlock {self.name!r}: segment_ids are not supported with cache")
            return self._call_with_cache(x, cache, cache_index, start_positions, training)
        seeds = self._dropout_seeds(training)  # u32[2] each, or None: drawn here, outside any jax.checkpoint
        after_input = training and (_sequence_is_split() or self._holds_quantized_weights())
        forward = self._forward_after_input if after_input else self.forward_with_aux
        if training and self.remat != "none":
            forward = jax.checkpoint(forward, policy=REMAT_POLICIES[self.remat])
        y, aux = forward(x, key_mask, seeds, segment_ids)  # (B, T, C), the MoE's losses and statistics (None: dense)
        if training and aux is not None:  # outside jax.checkpoint: adds losses, assigns the statistics
            self.mlp.record(aux)
        return y

    def _holds_quantized_weights(self):
        return any(is_built_quantized(layer) for layer in sublayers(self))

    def _forward_after_input(self, x, key_mask, seeds, segment_ids):
        """``forward_with_aux`` on the block's weights passed through one
        ``optimization_barrier`` together with x: nothing computed from a weight (a
        layout's all-gather of it, its cast to the compute dtype) can be scheduled
        before the block's input exists. Without it XLA:CPU's scheduler ran every
        block's weight all-gathers at the start of the fit step and held them
        through the forward pass (context layout, Llama-3.2-1B, T = 128k on 8
        devices: 3 GiB of 14.6 at the peak). The values are those the sublayers
        read (a float weight in the compute dtype under a mixed policy, as their
        autocast gives it); the numbers are the same.

        Training calls take it when the sequence is split (the context layouts: long
        sequences, where memory binds and a block's compute dwarfs its weights'
        all-gathers), and when the block holds int8 / int4 kernels (QLoRA's base: each
        kernel's dequantized form is 2-8x what is stored, and XLA:CPU held every block's,
        gathered, through the step: a Llama-3-70B-shaped int4 step under fsdp on 8
        devices planned 328 GiB of temporaries a device). Elsewhere it would also stop
        XLA from gathering the next block's weights during this block's compute (FSDP's
        prefetch, which a GPU's or TPU's latency-hiding scheduler does within its memory
        limit), so it is not taken."""
        weights = self.weights
        _, values = jax.lax.optimization_barrier((x, [weight.value for weight in weights]))  # x itself goes on as is
        with keras.StatelessScope(state_mapping=list(zip(weights, values))):
            return self.forward_with_aux(x, key_mask, seeds, segment_ids)

    def forward(self, x, key_mask, seeds, segment_ids=None):
        """The block on x (B, T, C) with dropout seeds ``(attention, mlp)`` (u32[2] each,
        or u32[B, 2]: one per row) or None (no dropout), segment_ids i32 (B, T) or None.
        Assigns no variable: safe to run under ``jax.checkpoint``, or on other weights in
        a ``keras.StatelessScope`` (``PipelinedBlocks`` runs it on each block's slice of
        its stacked weights)."""
        return self.forward_with_aux(x, key_mask, seeds, segment_ids)[0]

    def forward_with_aux(self, x, key_mask, seeds, segment_ids=None):
        """``forward``, and the MoE feed-forward's aux (losses and router statistics; None
        for a dense block), which ``MoEFeedForward.record`` adds once outside."""
        attention_seed, mlp_seed = (None, None) if seeds is None else seeds
        x = self._split_sequence(x)  # (B, T, C), T split over the model axis with megatron_sp
        attended = self._post_norm(
            self.attention_post_norm,
            self.attention(self.attention_norm(x), key_mask=key_mask, segment_ids=segment_ids),
        )  # (B, T, C)
        x = self._split_sequence(x + self._dropout(attended, attention_seed))  # (B, T, C)
        if self.num_experts:
            transformed, aux = self.mlp.forward(self.mlp_norm(x))  # (B, T, C), MoE aux
        else:
            transformed, aux = self.mlp(self.mlp_norm(x)), None  # (B, T, C)
        transformed = self._post_norm(self.mlp_post_norm, transformed)  # (B, T, C)
        return x + self._dropout(transformed, mlp_seed), aux  # (B, T, C)

    def _post_norm(self, norm, y):
        """``norm(y)`` with ``post_norms`` (a sublayer's output before the residual add), else y."""
        return y if norm is None else norm(y)

    def _dropout_seeds(self, training):
        """``(attention seed, mlp seed)`` from the dropout layers' seed generators (one
        draw each, as ``keras.layers.Dropout`` makes), or None when dropout is off."""
        if not training or self.dropout == 0:
            return None
        return self.attention_dropout.seed_generator.next(), self.mlp_dropout.seed_generator.next()

    def _dropout(self, x, seed):
        """``keras.layers.Dropout``'s computation with a given seed u32[2] (None: identity),
        or with one seed per row of x, u32[B, 2] (``PipelinedBlocks``: masks that do not
        depend on how the batch is cut into micro-batches)."""
        if seed is None:
            return x
        if seed.ndim == 2:
            return jax.vmap(lambda row, row_seed: keras.random.dropout(row, self.dropout, seed=row_seed))(x, seed)
        return keras.random.dropout(x, self.dropout, seed=seed)

    def _call_with_cache(self, x, cache, cache_index, start_positions, training):
        """x (B, T, C) at positions cache_index.. -> ((B, T, C), cache (B, 2, S, K, D));
        start_positions i32[B] or None as ``MultiHeadAttention``'s cached call takes it."""
        plan = tensor_parallel_plan(self.model_axis) if self.megatron_sp else None
        if plan is not None:
            raise ValueError(
                f"TransformerBlock {self.name!r}: a cached (decoding) call cannot split its {x.shape[1]} "
                f"token(s) over the {plan.model_axis!r} mesh axis of size {plan.model_size}; build the "
                f"block with megatron_sp=False for decoding (the weights are the same)"
            )
        attended, cache = self.attention(
            self.attention_norm(x), cache=cache, cache_index=cache_index, start_positions=start_positions
        )  # (B, T, C)
        x = x + self.attention_dropout(
            self._post_norm(self.attention_post_norm, attended), training=training
        )  # (B, T, C)
        transformed = self._post_norm(self.mlp_post_norm, self.mlp(self.mlp_norm(x)))  # (B, T, C)
        return x + self.mlp_dropout(transformed, training=training), cache  # (B, T, C)

    def _split_sequence(self, x):
        """With ``megatron_sp`` under a model axis of size N > 1, lay the residual
        stream out as (B/data, T/N, C): the norms, dropout and residual adds then run on
        1/N of the tokens, and GSPMD turns the attention output's all-reduce into a
        reduce-scatter (Megatron sequence parallelism). Otherwise x is returned as is."""
        plan = tensor_parallel_plan(self.model_axis) if self.megatron_sp else None
        if plan is None:
            return x
        layout = plan.layout(tuple(activation_spec(plan, 3, sequence=True)))
        return keras.distribution.distribute_tensor(x, layout)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def compute_output_spec(
        self, x, key_mask=None, training=None, cache=None, cache_index=None, start_positions=None, segment_ids=None
    ):
        """(B, T, C) in the compute dtype; with ``cache``, ``(that, the cache's spec)`` as
        the cached call returns."""
        output = keras.KerasTensor(tuple(x.shape), dtype=self.compute_dtype)  # (B, T, C)
        if cache is None:
            return output
        return output, keras.KerasTensor(cache.shape, dtype=cache.dtype)  # (B, 2, S, K, D)

    def get_config(self):
        config = super().get_config()
        config.update(
            num_heads=self.num_heads,
            head_dim=self.head_dim,
            hidden_dim=self.hidden_dim,
            num_kv_heads=self.num_kv_heads,
            causal=self.causal,
            rotary=self.rotary,
            rotary_base=self.rotary_base,
            rope_scaling=self.rope_scaling,
            mlp=self.mlp_kind,
            norm=self.norm,
            norm_epsilon=self.norm_epsilon,
            dropout=self.dropout,
            use_bias=self.use_bias,
            qkv_bias=self.qkv_bias,
            sliding_window=self.sliding_window,
            qk_norm=self.qk_norm,
            post_norms=self.post_norms,
            attention_scale=self.attention.attention_scale,
            attention_softcap=self.attention.softcap,
            context_attention=self.context_attention,
            megatron_sp=self.megatron_sp,
            model_axis=self.model_axis,
            kernel_initializer=keras.initializers.serialize(self.kernel_initializer),
            seed=self.seed,
            remat=self.remat,
            num_experts=self.num_experts,
            **self.moe,
        )
        return config

    @property
    def rope_scaling(self):
        """The attention's checked Llama 3 ``rope_scaling`` dict, or None."""
        return self.attention.rope_scaling

    @property
    def qkv_bias(self):
        return self.attention.qkv_bias

    @property
    def qk_norm(self):
        return self.attention.qk_norm

    @property
    def sliding_window(self):
        """The attention's window W (checked), or None for full attention."""
        return self.attention.sliding_window

    @property
    def context_attention(self):
        """The attention's kernel: the one given, or the ``ContextParallel``'s it recorded."""
        return self.attention.context_attention

    @classmethod
    def from_config(cls, config):
        return super().from_config(renamed_keys(config, ATTENTION_KEYS))
