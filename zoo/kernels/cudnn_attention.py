"""cuDNN's fused attention on a CUDA GPU, as ``jax.nn.dot_product_attention(implementation="cudnn")`` runs it.

What it takes (``supports``): bfloat16 or float16 inputs, a head dim that is a multiple of
8 and at most 128 (256 from Hopper on; 128 is what every SM80+ GPU takes), no key mask and
no segment ids (a boolean mask would cost cuDNN a [T, S] bias; ``jax.nn.dot_product_attention``
takes no document ids), no soft-capping, and under causal masking tokens in natural order
with T == S (cuDNN's causal mask is by array index). A sliding window W reaches it as
``local_window_size=(W - 1, 0)`` (keys p - W + 1 .. p).
"""

import jax

from zoo.kernels import _checks
from zoo.kernels._attention_spec import LocalKernel

__all__ = ["CUDNN", "DTYPES", "MAX_HEAD_DIM", "PLATFORMS"]

DTYPES = ("bfloat16", "float16")
MAX_HEAD_DIM = 128
PLATFORMS = ("gpu", "cuda")  # as jax.default_backend() names a CUDA GPU


def _supports(query):
    return (
        query.platform in PLATFORMS
        and not query.sequence_split
        and query.dtype in DTYPES
        and query.head_dim % 8 == 0
        and query.head_dim <= MAX_HEAD_DIM
        and not (query.key_masked or query.segmented)
        and not query.softcapped
        and (not query.causal or (query.natural_order and query.q_len == query.kv_len))
    )


def _run(q, k, v, spec, *, key_mask, q_positions, k_positions, segment_ids, kv_segment_ids):
    del key_mask, q_positions, k_positions, segment_ids, kv_segment_ids  # none, by _supports
    _checks.check_shapes(q.shape, k.shape, v.shape)
    window = _checks.check_sliding_window(spec.sliding_window, causal=spec.causal)
    local_window = None if window is None else (window - 1, 0)
    return jax.nn.dot_product_attention(
        q, k, v, scale=spec.scale, is_causal=spec.causal, local_window_size=local_window, implementation="cudnn"
    )


CUDNN = LocalKernel("cudnn", _supports, _run, lambda query, block_size: "cudnn")
