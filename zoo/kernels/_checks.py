"""Input checks for the attention kernels, raising ``ValueError``s that name the numbers.

Kernels run on one shard inside ``jax.shard_map``, where a bad global shape shows up
only as an odd per-shard shape. So every check here takes *global* sizes and the mesh
axis size: a layer calls them before ``shard_map``, and the kernels call them again
with the sizes they reconstruct inside (``local length x axis size``).
"""

import math

import numpy as np

from zoo.config.choices import BALANCES, CONTEXT_ATTENTIONS


def check_balance(balance):
    """Raises if ``balance`` is not one of ``None``, ``"zigzag"``, ``"striped"``."""
    if balance not in BALANCES:
        raise ValueError(f"balance must be one of {BALANCES}, got {balance!r}")


def check_sliding_window(sliding_window, *, causal):
    """``sliding_window`` as an int W >= 1 (or None); raises on anything else, or without causal.

    With window W a query at position p sees the keys at positions k with
    p - W < k <= p: the W most recent keys, itself included (Mistral's and transformers'
    sliding window). The window is defined for causal attention only.
    """
    if sliding_window is None:
        return None
    if isinstance(sliding_window, bool) or not isinstance(sliding_window, (int, np.integer)):
        raise ValueError(f"sliding_window must be a positive int or None, got {sliding_window!r}")
    if sliding_window < 1:
        raise ValueError(
            f"sliding_window must be >= 1 (the number of keys each query sees, itself included), got {sliding_window}"
        )
    if not causal:
        raise ValueError(
            f"sliding_window={sliding_window} needs causal=True: a window is the W most recent keys "
            f"up to the query's own position, which non-causal attention does not have"
        )
    return int(sliding_window)


def sequence_multiple(axis_size, balance=None):
    """How many equal pieces the sequence is cut into: N, or 2N for zig-zag."""
    check_balance(balance)
    return 2 * axis_size if balance == "zigzag" else axis_size


def check_shard_lengths(q_len, kv_len, *, axis_size, axis_name, balance=None):
    """Inside ``shard_map``: the global query and key lengths (local x N) split evenly."""
    for what, length in (("sequence length", q_len), ("key sequence length", kv_len)):
        check_sequence_divisible(
            length * axis_size, axis_size=axis_size, axis_name=axis_name, balance=balance, what=what
        )


def check_sequence_divisible(seq_len, *, axis_size, axis_name="seq", balance=None, what="sequence length"):
    """Raises unless ``seq_len`` splits evenly over the mesh axis (2N chunks for zig-zag)."""
    multiple = sequence_multiple(axis_size, balance)
    if seq_len % multiple == 0:
        return
    if multiple == axis_size:
        raise ValueError(f"{what} {seq_len} is not divisible by the {axis_name!r} mesh axis of size {axis_size}")
    raise ValueError(
        f"{what} {seq_len} is not divisible by 2 x the {axis_name!r} mesh axis of size "
        f"{axis_size} = {multiple}: zig-zag load balancing cuts the sequence into "
        f"2N = {multiple} chunks"
    )


def check_kv_heads(num_heads, num_kv_heads):
    """Raises unless the KV heads divide the query heads (MHA, GQA, MQA)."""
    if num_kv_heads < 1 or num_heads % num_kv_heads:
        raise ValueError(
            f"num_kv_heads {num_kv_heads} does not divide num_heads {num_heads}: each KV head "
            f"must serve a whole group of query heads"
        )


def check_heads_divisible(num_heads, *, axis_size, axis_name="seq", what="number of heads"):
    """Raises unless the heads split evenly over the mesh axis (Ulysses)."""
    if num_heads % axis_size:
        raise ValueError(
            f"{what} {num_heads} is not divisible by the {axis_name!r} mesh axis of size "
            f"{axis_size}: Ulysses attention splits heads across that axis"
        )


def check_shapes(q_shape, k_shape, v_shape, key_mask_shape=None):
    """Raises unless q (B, T, H, D), k/v (B, S, K, D) and key_mask (B, S) agree."""
    if len(q_shape) != 4 or len(k_shape) != 4:
        raise ValueError(f"q and k must be rank 4 (B, T, H, D), got {tuple(q_shape)} and {tuple(k_shape)}")
    if tuple(k_shape) != tuple(v_shape):
        raise ValueError(f"k and v must have the same shape, got {tuple(k_shape)} and {tuple(v_shape)}")
    if q_shape[0] != k_shape[0] or q_shape[3] != k_shape[3]:
        raise ValueError(f"q {tuple(q_shape)} and k {tuple(k_shape)} must agree on batch (dim 0) and head dim (dim 3)")
    check_kv_heads(q_shape[2], k_shape[2])
    if key_mask_shape is not None and tuple(key_mask_shape) != (k_shape[0], k_shape[1]):
        raise ValueError(
            f"key_mask shape {tuple(key_mask_shape)} must be (batch, kv length) = {(k_shape[0], k_shape[1])}"
        )


def check_segment_ids(shape, dtype, *, expected, name="segment_ids", what="(batch, length)"):
    """Raises unless document ids (packing: 0 = padding, 1.. = documents) are integers of
    shape ``expected``; the message names both shapes (or the dtype)."""
    if tuple(shape) != tuple(expected):
        raise ValueError(f"{name} shape {tuple(shape)} must be {what} = {tuple(expected)}")
    if not np.issubdtype(np.dtype(dtype), np.integer):
        raise ValueError(
            f"{name} must be an integer array (document ids: 0 = padding, 1, 2, ... documents), "
            f"got dtype {np.dtype(dtype)} of shape {tuple(shape)}"
        )


def check_sequence_parallel(
    context_attention, *, seq_len, num_heads, num_kv_heads, axis_size, axis_name="seq", balance=None
):
    """All checks for one sequence-parallel attention kernel, on global sizes (call before shard_map).

    Args:
        context_attention: ``"gather"``, ``"ring"`` or ``"ulysses"`` (``CONTEXT_ATTENTIONS``).
        seq_len: global sequence length T.
        num_heads, num_kv_heads: H and K.
        axis_size, axis_name: the mesh axis the sequence is split over.
        balance: ``None``, ``"zigzag"`` or ``"striped"`` reordering of the sequence.
    """
    if context_attention not in CONTEXT_ATTENTIONS:
        raise ValueError(f"context_attention must be one of {list(CONTEXT_ATTENTIONS)}, got {context_attention!r}")
    check_kv_heads(num_heads, num_kv_heads)
    check_sequence_divisible(seq_len, axis_size=axis_size, axis_name=axis_name, balance=balance)
    if context_attention == "ulysses":
        check_heads_divisible(num_heads, axis_size=axis_size, axis_name=axis_name)


def ulysses_kv_heads(num_kv_heads, axis_size):
    """KV heads after repeating them so they split over the axis: lcm(K, N)."""
    return math.lcm(num_kv_heads, axis_size)


def check_softcap(softcap):
    """``softcap`` as a float > 0, or None (no soft-capping); raises naming a bad one."""
    if softcap is None:
        return None
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float)) or not softcap > 0 or softcap == float("inf"):
        raise ValueError(
            f"softcap must be None or a finite number > 0 (scores -> softcap * tanh(scores / softcap)), got {softcap!r}"
        )
    return float(softcap)
