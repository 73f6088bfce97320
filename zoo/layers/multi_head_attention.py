"""Multi-head self-attention (MHA, GQA, MQA) that can split the sequence across devices."""

import jax.numpy as jnp
import keras
from jax.ad_checkpoint import checkpoint_name

from zoo.config.choices import ATTENTION_QKV
from zoo.config.renamed import ATTENTION_KEYS, renamed_keys
from zoo.distribution.axes import DATA, MODEL, SEQ
from zoo.kernels import (
    AttentionSpec,
    check_kv_heads,
    check_segment_ids,
    check_sliding_window,
    check_softcap,
    local_attention,
)
from zoo.layers import _sequence_parallel, _tensor_parallel_attention
from zoo.layers._kv_cache import write_linear, write_ring
from zoo.layers._parallel_plan import (
    check_choices,
    distribution_context_attention,
    resolve_plan,
)
from zoo.layers.offset_rms_normalization import OffsetRMSNormalization
from zoo.layers.rotary_embedding import Rope, check_rope_scaling, check_rotary_head_dim


@keras.saving.register_keras_serializable(package="zoo")
class MultiHeadAttention(keras.layers.Layer):
    """Self-attention with optional rotary embedding, sequence and tensor parallelism.

    Projections ``query`` (C -> H x D), ``key`` and ``value`` (C -> K x D) and
    ``output`` (H x D -> C), softmax attention in float32, causal or not, with an
    optional key padding mask. With a ``context_attention`` kernel (the layer's, or a
    ``ContextParallel`` distribution's) and a mesh that splits the sequence axis over
    N > 1 devices, attention runs as a ``jax.shard_map`` kernel on [B, T/N, ...] shards
    (see ``docs/sequence_parallel.md``); with no distribution, or no sequence axis of size
    > 1 (one device, ``DataParallel``, tensor parallelism alone), it runs plain attention
    on whole arrays and gives the same numbers, whatever the kernel.

    The kernel in use is saved: a layer built with ``context_attention=None`` under a
    ``ContextParallel`` records the distribution's kernel (``get_config`` returns it), so
    a model trained with ring attention saves ``context_attention: "ring"`` and, loaded
    under another ``ContextParallel``, keeps running ring (an explicit kernel wins).
    ``zoo.distribution.describe(model)`` says what each layer runs.

    Tensor parallelism: under a distribution whose mesh has ``model_axis`` with size
    N > 1, and no split sequence, the whole layer is one ``shard_map`` (Megatron): each
    device projects its H/N query heads and their KV heads (column-parallel), attends,
    and multiplies by its rows of ``output`` (row-parallel) before one all-reduce; the
    backward all-reduces d(x) once. Fewer KV heads than N (N % K == 0) are replicated,
    each device using the one its query heads share. The weights are created with their
    layouts (heads over ``model``; under ``fsdp+tp`` also C over ``data``). See
    ``zoo.layers._tensor_parallel_attention`` and ``docs/tensor_parallel.md``.

    Args:
        num_heads: H, query heads.
        head_dim: D, features per head.
        num_kv_heads: K, key/value heads; must divide H. None means H (MHA); 1 is MQA.
        causal: a token attends only to tokens at global positions <= its own.
        sliding_window: None (full attention), or W >= 1 with ``causal``: a query at
            global position p attends only to keys p - W < k <= p (Mistral's and
            transformers' window), on every path (plain, tensor-parallel, the
            sequence-parallel kernels, and the cached call over the cache's positions).
        rotary: apply rotary position embedding (RoPE) to queries and keys, at each
            token's global position. Needs an even ``head_dim``.
        rotary_base: RoPE's base wavelength.
        rope_scaling: None, or Llama 3's ``rope_scaling`` dict (``rope_type`` ``"llama3"``,
            see ``zoo.layers.rotary_embedding.check_rope_scaling``).
        use_bias: add biases to the four projections.
        qkv_bias: add biases to ``query``, ``key`` and ``value`` only (Qwen2's attention);
            ``use_bias`` wins when both are set.
        qk_norm: RMSNorm over D of every query head and every key head, after the
            projections and before rotary embedding (Qwen3's ``q_norm`` / ``k_norm``):
            one scale (D,) for all query heads, one for all key heads. On every path
            (the norm is per token and head, so each shard and each tensor-parallel
            device normalises its own heads with the replicated scales).
        qk_norm_epsilon: that norm's epsilon (Qwen3: ``rms_norm_eps``).
        qk_norm_offset: the qk-norm multiplies by ``1 + scale`` (zero-initialised scales,
            ``OffsetRMSNormalization``: Gemma 3's ``q_norm`` / ``k_norm``).
        attention_scale: multiplies q.k; None: 1 / sqrt(head_dim) (Gemma:
            ``query_pre_attn_scalar ** -0.5``).
        softcap: None, or c > 0: scores become c * tanh(scores / c) before the mask
            (Gemma 2's ``attn_logit_softcapping``), inside every kernel's tiles, on
            every path (plain, gather, ring, Ulysses, tensor-parallel, cached).
        context_attention: None (plain attention, GSPMD partitions it; under a
            ``ContextParallel`` its kernel), ``"gather"`` (all-gather K/V), ``"ring"``
            (K/V travel around a ring, O(T/N) memory) or ``"ulysses"`` (all-to-all to a
            head split; H must divide by N).
        sequence_axis: mesh axis the sequence is split over (a ``ContextParallel``'s
            ``sequence_dim_name`` decides under one).
        batch_axis: mesh axis the batch is split over inside ``shard_map``: the
            distribution's ``batch_dim_name`` (a different value is an error; ignored
            if the mesh has no such axis).
        balance: None, ``"zigzag"`` or ``"striped"``: the inputs are already in that
            load-balanced order for the ``sequence_axis`` size N
            (``zoo.kernels.reorder``); positions for causality and RoPE follow it.
            With no sequence axis (N = 1) the order is the natural one.
        ring_block_size: tile edge of ring attention's inner blocking (and of the
            blockwise kernel on the plain and tensor-parallel paths).
        megatron_sp: Megatron sequence parallelism on the tensor-parallel
            path: x arrives and the output leaves split on the sequence over
            ``model_axis`` (one all-gather and one reduce-scatter instead of one
            all-reduce). Ignored elsewhere (no model axis: x is whole).
        model_axis: the mesh axis tensor parallelism splits the heads over.
        kernel_initializer, bias_initializer: for the four projections.

    Call: ``layer(x, key_mask=None, segment_ids=None)``; x (B, T, C); key_mask bool
    (B, T), True keeps the key (padding = False); segment_ids int (B, T), the document
    id of each token of a packed row (0 = padding, 1, 2, ... documents): a token attends
    only to tokens of its own document, and no token to one of id 0 (with a key_mask
    both apply). On every path: plain, tensor-parallel, and the gather, ring and
    Ulysses kernels (the ids are split over the sequence like x, and reordered with it
    under ``balance``). Causality and RoPE still use each token's position in the row;
    RoPE's scores depend only on position differences, so within a document they are
    those of the document alone. Returns (B, T, C).

    Cached call (autoregressive decoding): ``layer(x, cache=cache, cache_index=i,
    start_positions=None)`` with cache (B, 2, S, K, D) holding the rotated keys and the values of positions
    0..S-1 (``cache[:, 0]`` keys, ``cache[:, 1]`` values; ``empty_cache`` makes one).
    The T tokens of x sit at positions i..i+T-1 (i may be a traced scalar): their keys
    and values are written into the cache there, rotary embedding uses those absolute
    positions, and the queries attend to the cache's filled keys 0..i+T-1 (causally if
    ``causal``; with ``sliding_window`` W only keys p - W < k <= p of a query at cache
    position p). With a ``sliding_window`` the cache is a ring buffer of S = W slots
    (``empty_cache``: min(length, W)), position p in slot p % S: a windowed layer's cache
    is the window's size whatever the generation length, and T may exceed S (a long
    prefill attends to the buffer and to its own keys). Returns
    ``(output (B, T, C), new cache)``. ``start_positions`` i32[B]
    (None: zeros) is each row's first real cache position, for left-padded prompts of
    different lengths: keys before it are masked and RoPE counts positions from it, so a
    padded row computes what the same prompt alone would. This path always runs plain
    attention on whole arrays in natural token order (no ``context_attention`` kernel,
    no ``balance``) and takes no key_mask and no segment_ids.

    Variable paths: ``<name>/query/kernel`` (C, H, D), ``<name>/key/kernel`` and
    ``<name>/value/kernel`` (C, K, D), ``<name>/output/kernel`` (H, D, C); with
    ``use_bias`` also ``query/bias`` (H, D), ``key/bias``, ``value/bias`` (K, D) and
    ``output/bias`` (C,); with ``qkv_bias`` the first three only; with ``qk_norm``
    ``<name>/query_norm/scale`` and ``<name>/key_norm/scale`` (D,).

    Dropout on the attention weights is not offered: it would need the same random
    stream on every sequence shard to match the single-device layer.
    """

    def __init__(
        self,
        num_heads,
        head_dim,
        num_kv_heads=None,
        causal=False,
        rotary=False,
        rotary_base=10000.0,
        rope_scaling=None,
        use_bias=False,
        sliding_window=None,
        qkv_bias=False,
        qk_norm=False,
        qk_norm_epsilon=1e-6,
        qk_norm_offset=False,
        attention_scale=None,
        softcap=None,
        context_attention=None,
        sequence_axis=SEQ,
        batch_axis=DATA,
        balance=None,
        ring_block_size=512,
        megatron_sp=False,
        model_axis=MODEL,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        **kwargs,
    ):
        super().__init__(**kwargs)
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        _check_config(num_heads, head_dim, num_kv_heads, rotary, ring_block_size)
        check_choices(context_attention, balance)
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.num_kv_heads = num_kv_heads
        self.causal = causal
        self.sliding_window = check_sliding_window(sliding_window, causal=causal)
        self.rotary = rotary
        self.rotary_base = rotary_base
        self.rope_scaling = check_rope_scaling(rope_scaling)
        self.use_bias = use_bias
        self.qkv_bias = bool(qkv_bias)
        self.qk_norm = bool(qk_norm)
        self.qk_norm_epsilon = qk_norm_epsilon
        self.qk_norm_offset = bool(qk_norm_offset)
        self.attention_scale = None if attention_scale is None else float(attention_scale)
        self.softcap = check_softcap(softcap)
        self.context_attention = context_attention
        self.sequence_axis = sequence_axis
        self.batch_axis = batch_axis
        self.balance = balance
        self.ring_block_size = ring_block_size
        self.megatron_sp = bool(megatron_sp)
        self.model_axis = model_axis
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)

    def build(self, input_shape):
        if len(input_shape) != 3 or input_shape[-1] is None:
            raise ValueError(
                f"MultiHeadAttention expects inputs (batch, length, channels) with channels "
                f"known, got shape {tuple(input_shape)}"
            )
        channels = input_shape[-1]
        heads, kv_heads, head_dim = self.num_heads, self.num_kv_heads, self.head_dim
        self._record_context_attention()
        plan = resolve_plan(model_axis=self.model_axis)  # the attention settings are checked per call
        if plan.tensor_parallel:  # the projections are created split over the model axis
            _tensor_parallel_attention.check_heads(
                f"MultiHeadAttention {self.name!r}", plan, num_heads=heads, num_kv_heads=kv_heads, channels=channels
            )
        # (B, T, C) -> (B, T, H, D) and (B, T, K, D)
        qkv_bias = self.use_bias or self.qkv_bias
        self.query = self._projection("btc,chd->bthd", (None, heads, head_dim), "hd", "query", "heads_out", qkv_bias)
        self.key = self._projection("btc,ckd->btkd", (None, kv_heads, head_dim), "kd", "key", "heads_out", qkv_bias)
        self.value = self._projection("btc,ckd->btkd", (None, kv_heads, head_dim), "kd", "value", "heads_out", qkv_bias)
        # (B, T, H, D) -> (B, T, C); "output" is Layer.output's name, hence the attribute
        self.output_dense = self._projection(
            "bthd,hdc->btc", (None, channels), "c", "output", "heads_in", self.use_bias
        )
        for projection in (self.query, self.key, self.value):
            projection.build(input_shape)
        self.output_dense.build((input_shape[0], input_shape[1], heads, head_dim))
        if self.qk_norm:  # scales (D,): replicated under every layout, the norm is per head
            self.query_norm = self._head_norm("query_norm", (input_shape[0], input_shape[1], heads, head_dim))
            self.key_norm = self._head_norm("key_norm", (input_shape[0], input_shape[1], kv_heads, head_dim))

    def _head_norm(self, name, shape):
        kind = OffsetRMSNormalization if self.qk_norm_offset else keras.layers.RMSNormalization
        norm = kind(epsilon=self.qk_norm_epsilon, dtype=self.dtype_policy, name=name)
        norm.build(shape)
        return norm

    def normalize_qk(self, q, k):
        """qk-norm (when ``qk_norm``) of q (B, T, H, D) and k (B, T, K, D): RMSNorm over D."""
        if not self.qk_norm:
            return q, k
        return self.query_norm(q), self.key_norm(k)

    def _projection(self, equation, output_shape, bias_axes, name, role, use_bias):
        return _tensor_parallel_attention.AttentionProjection(
            equation,
            role=role,
            model_axis=self.model_axis,
            output_shape=output_shape,
            bias_axes=bias_axes if use_bias else None,
            kernel_initializer=keras.initializers.get(keras.initializers.serialize(self.kernel_initializer)),
            bias_initializer=keras.initializers.get(keras.initializers.serialize(self.bias_initializer)),
            dtype=self.dtype_policy,
            name=name,
        )

    @property
    def rope(self):
        """The rotary settings (a hashable ``Rope``), or None without rotary embedding."""
        return Rope.of(self.rotary_base, self.rope_scaling) if self.rotary else None

    def call(self, x, key_mask=None, cache=None, cache_index=None, start_positions=None, segment_ids=None):
        if cache is not None:
            if key_mask is not None or segment_ids is not None:
                raise ValueError(
                    f"MultiHeadAttention {self.name!r}: key_mask and segment_ids are not supported together "
                    f"with cache (left padding is given as start_positions)"
                )
            return self._call_with_cache(x, cache, 0 if cache_index is None else cache_index, start_positions)
        batch, length = x.shape[0], x.shape[1]
        if key_mask is not None:
            if tuple(key_mask.shape) != (batch, length):
                raise ValueError(
                    f"key_mask shape {tuple(key_mask.shape)} must be (batch, length) = "
                    f"{(batch, length)} of x {tuple(x.shape)}"
                )
            key_mask = keras.ops.cast(key_mask, "bool")
        segment_ids = self._checked_segment_ids(segment_ids, x.shape)  # i32 (B, T) or None
        self._record_context_attention()
        plan = self.parallel_plan()
        if _tensor_parallel_attention.takes_this_path(
            plan
        ):  # Megatron: the whole layer in one shard_map over the model axis
            return _tensor_parallel_attention.attention(self, plan, x, key_mask, segment_ids)  # (B, T, C)
        q, k = self.normalize_qk(self.query(x), self.key(x))  # (B, T, H, D), (B, T, K, D)
        q, k, v = (checkpoint_name(t, ATTENTION_QKV) for t in (q, k, self.value(x)))  # v: (B, T, K, D)
        out = _sequence_parallel.attention(
            q, k, v, plan=plan, spec=self.attention_spec, key_mask=key_mask, rope=self.rope, segment_ids=segment_ids
        )  # (B, T, H, D)
        return self.output_dense(out)  # (B, T, C)

    @property
    def attention_spec(self):
        """What every call's attention computes (``kernels.AttentionSpec``), whichever path
        and kernel runs it: causal, scale, sliding window, soft-cap, tile edge."""
        return AttentionSpec(
            causal=self.causal,
            scale=self.attention_scale,
            sliding_window=self.sliding_window,
            softcap=self.softcap,
            block_size=self.ring_block_size,
        )

    def _checked_segment_ids(self, segment_ids, x_shape):
        """segment_ids as int32 (B, T), or None; raises naming the shapes (or the dtype)."""
        if segment_ids is None:
            return None
        check_segment_ids(
            segment_ids.shape,
            keras.backend.standardize_dtype(segment_ids.dtype),
            expected=x_shape[:2],
            name=f"MultiHeadAttention {self.name!r}: segment_ids",
            what=f"(batch, length) of x {tuple(x_shape)}",
        )
        return keras.ops.cast(segment_ids, "int32")

    def parallel_plan(self):
        """This layer's ``ParallelPlan`` under the current distribution (resolved now)."""
        return resolve_plan(
            model_axis=self.model_axis,
            sequence_axis=self.sequence_axis,
            batch_axis=self.batch_axis,
            context_attention=self.context_attention,
            balance=self.balance,
        )

    def _record_context_attention(self):
        """A layer with no kernel of its own takes the active ``ContextParallel``'s, for
        good: it is then saved in the config, and wins as an explicit kernel would."""
        if self.context_attention is None:
            self.context_attention = distribution_context_attention()

    def describe_parallelism(self):
        """What a call runs under the current distribution, in words, e.g. ``"ring attention
        over seq (4), K/V ppermute x3 per call"`` (``zoo.distribution.describe``)."""
        plan = self.parallel_plan()
        if _tensor_parallel_attention.takes_this_path(plan):
            return _tensor_parallel_attention.describe(self, plan)
        text = _sequence_parallel.describe_plan(plan)
        kernel = self.context_attention or distribution_context_attention()
        if kernel is not None and plan.context_attention is None:
            text += f" (context_attention {kernel!r} runs only over a {self.sequence_axis!r} mesh axis of size > 1)"
        return text

    def describe_implementation(self, seq_len):
        """What a training call on ``seq_len`` tokens runs under the current distribution,
        in words, e.g. ``"blockwise (tile 512)"``, ``"cudnn"``, ``"ring over 'seq' (N=4,
        tile 256)"``, or, tensor-parallel, ``"one shard_map over 'model' (M=4: 8 of 32
        heads per device), then blockwise (tile 512)"``."""
        plan = self.parallel_plan()
        local = _sequence_parallel.describe_local(
            plan, seq_len=seq_len, head_dim=self.head_dim, dtype=self.compute_dtype, causal=self.causal,
            masked=False, block_size=self.ring_block_size, windowed=self.sliding_window is not None,
            pallas=False if _tensor_parallel_attention.takes_this_path(plan) else None,  # TP: inside its shard_map
        )  # fmt: skip
        if not _tensor_parallel_attention.takes_this_path(plan):
            return local
        per_device = self.num_heads // plan.model_size
        return f"one shard_map over {plan.model_axis!r} (M={plan.model_size}: {per_device} of {self.num_heads} heads per device), then {local}"

    def empty_cache(self, batch_size, cache_length, dtype=None):
        """Zeros (B, 2, S, K, D) for ``cache_length`` positions, in the compute dtype; with
        a ``sliding_window`` W, S = min(cache_length, W): a window-sized ring buffer (the
        cached call's doc)."""
        if self.sliding_window is not None:
            cache_length = min(cache_length, self.sliding_window)
        shape = (batch_size, 2, cache_length, self.num_kv_heads, self.head_dim)
        return jnp.zeros(shape, dtype or self.compute_dtype)

    def _call_with_cache(self, x, cache, cache_index, start_positions=None):
        """x (B, T, C) at positions cache_index..cache_index+T-1 -> ((B, T, C), cache (B, 2, S, K, D)).

        start_positions: i32[B] first real cache position of each row (left padding
        before it), or None for 0."""
        self._check_cache(x.shape, cache.shape)
        batch, length = x.shape[0], x.shape[1]
        positions = cache_index + jnp.arange(length, dtype=jnp.int32)  # i32[T], cache positions
        start = jnp.zeros((batch,), jnp.int32) if start_positions is None else jnp.asarray(start_positions, jnp.int32)
        q, k = self.normalize_qk(self.query(x), self.key(x))  # (B, T, H, D), (B, T, K, D)
        v = self.value(x)  # (B, T, K, D)
        if self.rotary:
            token_positions = positions[None, :] - start[:, None]  # i32[B, T]: positions within each row's own text
            q, k = (self.rope.apply(t, token_positions) for t in (q, k))
        new = jnp.stack([k, v], axis=1).astype(cache.dtype)  # (B, 2, T, K, D)
        write = write_ring if self.sliding_window is not None else write_linear
        keys, key_positions, cache = write(
            cache, new, cache_index, positions
        )  # (B, 2, S', K, D), i32[S'], (B, 2, S, K, D)
        filled = (key_positions[None, :] >= start[:, None]) & (key_positions[None, :] >= 0)  # bool[B, S']
        filled = filled & (key_positions[None, :] < cache_index + length)
        out = local_attention(  # the seam's kernel for these cache positions (zoo.kernels.attention_seam)
            q,
            keys[:, 0].astype(q.dtype),
            keys[:, 1].astype(q.dtype),
            key_mask=filled,
            q_positions=positions,
            k_positions=key_positions,
            inference=True,  # no gradient: one new token's scores are no bigger than a tile
            **self.attention_spec.options(),
        )  # window over cache positions: left padding shifts queries and keys alike  # (B, T, H, D)
        return self.output_dense(out), cache  # (B, T, C)

    def _check_cache(self, x_shape, cache_shape):
        expected = (x_shape[0], 2, None, self.num_kv_heads, self.head_dim)
        if len(cache_shape) != 5 or any(e is not None and e != c for e, c in zip(expected, cache_shape)):
            raise ValueError(
                f"MultiHeadAttention {self.name!r}: cache shape {tuple(cache_shape)} must be (batch, 2, "
                f"cache length, num_kv_heads, head_dim) = ({x_shape[0]}, 2, S, {self.num_kv_heads}, {self.head_dim})"
            )
        if x_shape[1] > cache_shape[2] and self.sliding_window is None:  # a ring buffer takes any T (write_ring)
            raise ValueError(
                f"MultiHeadAttention {self.name!r}: {x_shape[1]} new tokens do not fit a cache of length {cache_shape[2]}"
            )

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def compute_output_spec(
        self, x, key_mask=None, cache=None, cache_index=None, start_positions=None, segment_ids=None
    ):
        """(B, T, C) in the compute dtype; with ``cache``, ``(that, cache (B, 2, S, K, D)
        in the cache's dtype)``, as the cached call returns."""
        output = keras.KerasTensor(self.compute_output_shape(x.shape), dtype=self.compute_dtype)  # (B, T, C)
        if cache is None:
            return output
        return output, keras.KerasTensor(cache.shape, dtype=cache.dtype)  # (B, 2, S, K, D)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "head_dim": self.head_dim,
                "num_kv_heads": self.num_kv_heads,
                "causal": self.causal,
                "rotary": self.rotary,
                "rotary_base": self.rotary_base,
                "rope_scaling": self.rope_scaling,
                "use_bias": self.use_bias,
                "qkv_bias": self.qkv_bias,
                "qk_norm": self.qk_norm,
                "qk_norm_epsilon": self.qk_norm_epsilon,
                "qk_norm_offset": self.qk_norm_offset,
                "attention_scale": self.attention_scale,
                "softcap": self.softcap,
                "sliding_window": self.sliding_window,
                "context_attention": self.context_attention,
                "sequence_axis": self.sequence_axis,
                "batch_axis": self.batch_axis,
                "balance": self.balance,
                "ring_block_size": self.ring_block_size,
                "megatron_sp": self.megatron_sp,
                "model_axis": self.model_axis,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
            }
        )
        return config

    @classmethod
    def from_config(cls, config):
        return super().from_config(renamed_keys(config, ATTENTION_KEYS))


def _check_config(num_heads, head_dim, num_kv_heads, rotary, ring_block_size):
    sizes = {
        "num_heads": num_heads,
        "head_dim": head_dim,
        "num_kv_heads": num_kv_heads,
        "ring_block_size": ring_block_size,
    }
    for name, value in sizes.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    check_kv_heads(num_heads, num_kv_heads)
    if rotary:
        check_rotary_head_dim(head_dim)
