"""Splash attention on one TPU device: JAX's own Pallas kernel, grouped-query without repeating K/V.

``jax.experimental.pallas.ops.tpu.splash_attention`` is the flash-attention kernel MaxText
runs on TPUs: a fused forward and a fused backward (dq, dk and dv in one pass), each tile's
mask decided ahead of time from a mask object, so causal and sliding-window tiles that no
query may see are never visited. The zoo calls its multi-query form once per KV head
(``vmap`` over B and K): the G = H / K query heads of a group share their K/V tile, which is
read once, never repeated to H heads.

Why this kernel on a TPU rather than the tiled one (``blockwise_attention``): XLA compiles
the tiled kernel's loops with a ``conditional`` per tile (the causal skip) whose operands are
the whole float32 accumulators, copied in and out on each run; on one TPU v5e chip a
gpt_1b-sized block's attention took 15 ms per layer at batch 4 x 2048 tokens, three times
its batch-2 time for twice the work (docs/performance.md, "The training step on a TPU v5e").

What it takes (``supports``): T and S multiples of 128, natural token order (its causal
mask is by array index), head dim a multiple of 64, and a key mask (padding) or segment
ids (packing) but not both. Soft-capping, sliding windows and segment ids are its own
options (a padding query, id 0, gets 0 as in the reference). A key mask reaches it as
segment ids: every query id 1, each key its mask (a padded key, id 0, is seen by no
query). A query that then sees no key at all (the first rows of a left-padded causal
batch) would get the mean of the masked values from the kernel, whose mask is a finite
large negative number; it gets 0, as the reference gives (``_sees_no_key``). Scores are ``scale * q.k``: q is multiplied by the scale before the
kernel, in q's dtype (bf16 under mixed precision), as MaxText does.

Block sizes were measured on the chip, forward + backward, bf16, causal, at the shapes of
gpt_1b, llama_3_2_1b, qwen3_0.6b (T = 2,048) and gpt_350m (T = 1,024), 11 candidates each
(``recipes/tpu-v5e-1/splash_blocks.py``, docs/performance.md): query and key blocks of
1,024 with keys computed 512 at a time (forward and fused backward alike) were the best
or within 1% of it at every shape and head dim: 8% faster than blocks of 512 at gpt_1b's
batch 4, 12% at llama_3_2_1b's; 2,048-token blocks ran out of the core's VMEM. The fused
backward was faster than the split one (dq apart from dk, dv) in every case. From 8,192
keys on (``LONG_KEYS``), causal attention takes key blocks of 2,048 (queries still 1,024,
keys computed 512 at a time): at issue 44's rows (``recipes/tpu-v5e-1/splash_long.py``)
131.1 against 122.3 TFLOP/s at 32,768 tokens and head dim 128, 66.1 against 61.1 at head
dim 64, equal within 1% at 8,192, and slower at 2,048 (one key block leaves the causal mask
nothing to skip). Only the causal mask was measured: a sliding window or a full mask keeps
square blocks.

Layouts (``LAYOUTS``): splash reads q, k and v in (T, D) or (D, T) blocks; at head dim 64,
where a (T, 64) block fills half of the TPU's 128 lanes, (D, T) blocks for all three were
the fastest of five layouts at 5 of 6 shapes (``recipes/tpu-v5e-1/splash_layouts.py``).

Letters: B batch, T queries, S keys, H query heads, K KV heads, G = H / K, D head dim.
"""

import functools

import jax
import jax.numpy as jnp

from zoo.config.choices import ATTENTION_OUT
from zoo.kernels import _checks
from zoo.kernels._attention_spec import LocalKernel
from zoo.kernels._masking import segment_pair

__all__ = ["PLATFORMS", "SPLASH", "block_edge", "block_edges", "splash_attention", "supports"]

PLATFORMS = ("tpu",)  # where the seam runs it (a test widens it to the CPU: Pallas' interpreter)
LANES = 128  # the TPU's vector lane width: every block edge is a multiple of it
EDGES = (1024, 512, 256, 128)  # block edges tried, largest first
LONG_KEYS, LONG_KEY_EDGE = 8192, 2048  # from 8,192 keys on, key blocks of 2,048 (module docstring)
COMPUTE_EDGE = 512  # keys per inner step of a block (block_kv_compute): the measured best
HEAD_DIM_MINOR, SEQ_MINOR = "HEAD_DIM_MINOR", "SEQ_MINOR"  # splash's QKVLayout: (T, D) or (D, T) blocks
# head dim -> (q, k, v) layouts splash reads; HEAD_DIM_MINOR for all three where absent (module
# docstring; at 128 no layout was faster by more than 0.8%)
LAYOUTS = {64: (SEQ_MINOR,) * 3}


def supports(*, q_len, kv_len, head_dim, natural_order=True, key_masked=False, segmented=False):
    """Whether ``splash_attention`` takes these shapes and options (module docstring)."""
    shapes = q_len % LANES == 0 and kv_len % LANES == 0 and head_dim % 64 == 0
    return shapes and natural_order and not (key_masked and segmented)


def block_edge(length):
    """The block edge for ``length`` tokens: the measured best, 1,024 (module docstring),
    lowered to the largest of ``EDGES`` that divides ``length``."""
    return next(edge for edge in EDGES if length % edge == 0)


def block_edges(q_len, kv_len, *, causal=True, windowed=False):
    """(query block edge, key block edge): ``block_edge`` of each, but key blocks of
    ``LONG_KEY_EDGE`` from ``LONG_KEYS`` keys on, where that edge divides them, for the mask
    they were measured on (causal, no sliding window)."""
    long_keys = causal and not windowed and kv_len >= LONG_KEYS and kv_len % LONG_KEY_EDGE == 0
    return block_edge(q_len), LONG_KEY_EDGE if long_keys else block_edge(kv_len)


def _mask(q_len, kv_len, groups, causal, sliding_window):
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as masks

    shape = (q_len, kv_len)
    if sliding_window is not None:  # keys p - W < k <= p
        one = masks.LocalMask(shape, window_size=(sliding_window - 1, 0), offset=0)
    elif causal:
        one = masks.CausalMask(shape)
    else:
        one = masks.FullMask(shape)
    return masks.MultiHeadMask([one] * groups)


def layouts(head_dim):
    """The (q, k, v) layouts splash reads at ``head_dim`` (``LAYOUTS``); each changes how the
    kernel holds a block in its memory, never the result."""
    return LAYOUTS.get(head_dim, (HEAD_DIM_MINOR,) * 3)


@functools.lru_cache(maxsize=64)
def _kernel(q_len, kv_len, groups, causal, sliding_window, softcap, interpret, qkv_layouts):
    """The multi-query kernel for one KV head's G query heads: (G, T, D), (S, D), (S, D) -> (G, T, D)."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash

    bq, bkv = block_edges(q_len, kv_len, causal=causal, windowed=sliding_window is not None)
    compute = min(COMPUTE_EDGE, bkv)
    q_layout, k_layout, v_layout = (splash.QKVLayout[name] for name in qkv_layouts)
    sizes = splash.BlockSizes(
        block_q=bq,
        block_kv=bkv,
        block_kv_compute=compute,
        block_q_dkv=bq,
        block_kv_dkv=bkv,
        block_kv_dkv_compute=compute,
        use_fused_bwd_kernel=True,
        q_layout=q_layout,
        k_layout=k_layout,
        v_layout=v_layout,
    )
    with jax.ensure_compile_time_eval():  # its mask tables as concrete arrays: the cached kernel serves every trace
        return splash.make_splash_mqa_single_device(
            _mask(q_len, kv_len, groups, causal, sliding_window),
            block_sizes=sizes,
            attn_logits_soft_cap=softcap,
            residual_checkpoint_name=ATTENTION_OUT,  # its output and log-sum-exp, for remat save_attention
            interpret=interpret,
        )


def splash_attention(
    q,
    k,
    v,
    *,
    causal=False,
    scale=None,
    sliding_window=None,
    softcap=None,
    segment_ids=None,
    kv_segment_ids=None,
    key_mask=None,
    interpret=False,
):
    """Attention of q [B, T, H, D] over k, v [B, S, K, D] -> [B, T, H, D], in q's dtype.

    Arguments as ``blockwise_attention``'s (natural order, not both a key mask and segment
    ids: ``supports``); ``interpret=True`` runs the kernel in Pallas' interpreter (any
    backend; for tests).
    """
    b, t, h, d = q.shape
    s, kv_heads = k.shape[1], k.shape[2]
    groups = h // kv_heads
    if not supports(q_len=t, kv_len=s, head_dim=d):
        raise ValueError(
            f"splash attention takes lengths that are multiples of {LANES} and a head dim that is a multiple of 64, "
            f"got T={t}, S={s}, D={d}"
        )
    if key_mask is not None and segment_ids is not None:
        raise ValueError("splash attention takes a key mask or segment ids, not both; the tiled kernel takes both")
    if key_mask is not None:  # padding as segment ids: every query 1, each key its mask
        segment_ids = jnp.ones((b, t), jnp.int32)
        kv_segment_ids = key_mask.astype(jnp.int32)  # i32[B, S]
    q_ids, kv_ids = segment_pair(segment_ids, kv_segment_ids, q_shape=q.shape, k_shape=k.shape)
    kernel = _kernel(t, s, groups, causal, sliding_window, softcap, interpret, layouts(d))
    scale = d**-0.5 if scale is None else scale
    qh = (
        (q * jnp.asarray(scale, q.dtype)).reshape(b, t, kv_heads, groups, d).transpose(0, 2, 3, 1, 4)
    )  # [B, K, G, T, D]
    kh, vh = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)  # [B, K, S, D]
    per_head = jax.vmap(lambda qg, kg, vg, seg: kernel(qg, kg, vg, segment_ids=seg), in_axes=(0, 0, 0, None))
    if q_ids is None:
        out = jax.vmap(lambda qb, kb, vb: per_head(qb, kb, vb, None))(qh, kh, vh)  # [B, K, G, T, D]
    else:
        from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash

        ids = splash.SegmentIds(q=q_ids.astype(jnp.int32), kv=kv_ids.astype(jnp.int32))  # i32[B, T], i32[B, S]
        out = jax.vmap(per_head)(qh, kh, vh, ids)  # [B, K, G, T, D]
    out = out.transpose(0, 3, 1, 2, 4).reshape(b, t, h, d)  # [B, T, H, D]
    if q_ids is not None:  # a padding query (id 0) sees no key: 0, as the reference gives (splash: its own ids)
        out = jnp.where((q_ids == 0)[:, :, None, None], 0, out)
    if key_mask is not None:
        blind = _sees_no_key(key_mask, q_len=t, causal=causal or sliding_window is not None, window=sliding_window)
        out = jnp.where(blind[:, :, None, None], 0, out)
    return out.astype(q.dtype)


def _sees_no_key(key_mask, *, q_len, causal, window):
    """bool[B, T]: the queries that no kept key is visible to, from the key mask [B, S]
    alone (natural order): none kept at all; causal, none of keys 0..t; a window W, none
    of keys t - W + 1 .. t."""
    kept = jnp.cumsum(key_mask.astype(jnp.int32), axis=-1)  # i32[B, S]: kept keys among 0..j
    if not causal:
        return jnp.broadcast_to(kept[:, -1:] == 0, (kept.shape[0], q_len))
    last = jnp.minimum(jnp.arange(q_len), kept.shape[1] - 1)  # the last key query t may see
    seen = kept[:, last]  # i32[B, T]
    if window is not None:  # less the kept keys before t - W + 1
        before = jnp.arange(q_len) - window
        seen = seen - jnp.where(before >= 0, kept[:, jnp.maximum(before, 0)], 0)
    return seen == 0


def _supports(query):
    """Splash runs a call on a TPU where a Pallas kernel may run (``query.pallas``) and
    ``supports`` takes its lengths, head dim, order and masks."""
    return (
        query.platform in PLATFORMS
        and query.pallas
        and not query.sequence_split
        and query.q_len is not None
        and query.kv_len is not None
        and supports(
            q_len=query.q_len,
            kv_len=query.kv_len,
            head_dim=query.head_dim,
            natural_order=query.natural_order,
            key_masked=query.key_masked,
            segmented=query.segmented,
        )
    )


def _run(q, k, v, spec, *, key_mask, q_positions, k_positions, segment_ids, kv_segment_ids):
    del q_positions, k_positions  # None: natural order, by _supports
    _checks.check_shapes(q.shape, k.shape, v.shape, None if key_mask is None else key_mask.shape)
    return splash_attention(
        q,
        k,
        v,
        causal=spec.causal,
        scale=spec.scale,
        sliding_window=_checks.check_sliding_window(spec.sliding_window, causal=spec.causal),
        softcap=_checks.check_softcap(spec.softcap),
        segment_ids=segment_ids,
        kv_segment_ids=kv_segment_ids,
        key_mask=key_mask,
        interpret=jax.default_backend() != "tpu",  # only where a test adds this platform to PLATFORMS
    )


def _describe(query, block_size):
    del block_size  # splash's blocks are its own (block_edges)
    q_edge, k_edge = block_edges(query.q_len, query.kv_len, causal=query.causal, windowed=query.windowed)
    return f"splash (blocks {q_edge})" if q_edge == k_edge else f"splash (blocks {q_edge}x{k_edge})"


SPLASH = LocalKernel("splash", _supports, _run, _describe)
