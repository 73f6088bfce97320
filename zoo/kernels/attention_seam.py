"""The attention seam: one spec, one registry of local kernels, one selector.

A local attention call (one device's q, k, v) is described by an ``AttentionSpec`` (causal,
scale, window, soft-cap, tile edge) and asks ``select_local_kernel`` which kernel runs it,
with a ``KernelQuery`` (the platform, the call's shapes, which masks and positions it has).
``LOCAL_KERNELS`` lists the kernels in order of preference, each a ``LocalKernel`` built in
its own module; the first whose ``supports`` takes the query runs:

- ``splash`` (``splash_attention.py``): JAX's Pallas flash-attention kernel on a TPU,
  grouped-query without repeating K/V; not where GSPMD partitions the call.
- ``cudnn`` (``cudnn_attention.py``): cuDNN's fused attention on a CUDA GPU.
- ``reference`` (``attention_reference.py``): the materialised scores, for a cached
  decoding step no bigger than one tile (one new token over the cache, say).
- ``blockwise`` (``blockwise_attention.py``): the tiled online-softmax kernel, every
  platform, shape and option; the float64-checkable ``attention_reference`` is its oracle.

``select_local_kernel`` is the only place a local kernel is chosen: ``local_attention``
(training, decoding, and the local step of the all-gather and Ulysses context kernels) and
``describe_local_attention`` (what a layer says it runs) both ask it. Adding a kernel is a
module with its ``LocalKernel`` and one line in ``LOCAL_KERNELS`` (docs/attention.md).
"""

import jax
import jax.numpy as jnp

from zoo.kernels._attention_spec import AttentionSpec, KernelQuery, LocalKernel
from zoo.kernels.attention_reference import REFERENCE
from zoo.kernels.blockwise_attention import BLOCKWISE
from zoo.kernels.cudnn_attention import CUDNN
from zoo.kernels.splash_attention import SPLASH

__all__ = [
    "LOCAL_KERNELS",
    "AttentionSpec",
    "KernelQuery",
    "LocalKernel",
    "attention_implementation",
    "describe_local_attention",
    "local_attention",
    "select_local_kernel",
]

LOCAL_KERNELS = (SPLASH, CUDNN, REFERENCE, BLOCKWISE)  # in order of preference; the last takes every call


def select_local_kernel(query):
    """The first of ``LOCAL_KERNELS`` that supports ``query`` (a ``KernelQuery``)."""
    return next(kernel for kernel in LOCAL_KERNELS if kernel.supports(query))


def _query(*, platform, dtype, head_dim, masked=False, key_masked=None, **features):
    """A ``KernelQuery`` from a call's features (``masked``: a key mask, where ``key_masked``
    is not given)."""
    key_masked = masked if key_masked is None else key_masked
    return KernelQuery(
        platform=platform, dtype=str(jnp.dtype(dtype)), head_dim=head_dim, key_masked=key_masked, **features
    )


def attention_implementation(**features):
    """The name of the kernel ``select_local_kernel`` picks for a call with these features:
    ``KernelQuery``'s fields (``platform``, ``dtype``, ``head_dim``, ``q_len``, ...), and
    ``masked`` for a key mask."""
    return select_local_kernel(_query(**features)).name


def describe_local_attention(*, block_size=512, **features):
    """``"cudnn"``, ``"splash (blocks 512)"``, ``"blockwise (tile 512)"`` or ``"blockwise
    (tile 256x512)"`` (query x key tiles): the selected kernel in words; ``features`` as
    ``attention_implementation``'s."""
    query = _query(**features)
    return select_local_kernel(query).describe(query, block_size)


def local_attention(
    q,
    k,
    v,
    *,
    causal=False,
    key_mask=None,
    scale=None,
    q_positions=None,
    k_positions=None,
    block_size=512,
    sliding_window=None,
    softcap=None,
    segment_ids=None,
    kv_segment_ids=None,
    pallas=True,
    sequence_split=False,
    inference=False,
):
    """Attention on one device's arrays, by the kernel ``select_local_kernel`` picks.

    Same arguments, shapes and result as ``blockwise_attention``; ``pallas=False`` where
    GSPMD partitions the call over several devices (no Pallas kernel then),
    ``sequence_split=True`` where it may split T (the tiled kernel then), ``inference=True``
    where no gradient is taken (a cached decoding step). Positions given
    as None mean natural order; they only matter under causal masking.
    """
    spec = AttentionSpec(
        causal=causal, scale=scale, sliding_window=sliding_window, softcap=softcap, block_size=block_size
    )
    query = KernelQuery.of_call(
        spec,
        q,
        k,
        key_mask=key_mask,
        segment_ids=segment_ids,
        natural_order=q_positions is None and k_positions is None,
        platform=jax.default_backend(),
        pallas=pallas,
        sequence_split=sequence_split,
        inference=inference,
    )
    return select_local_kernel(query).run(
        q,
        k,
        v,
        spec,
        key_mask=key_mask,
        q_positions=q_positions,
        k_positions=k_positions,
        segment_ids=segment_ids,
        kv_segment_ids=kv_segment_ids,
    )
