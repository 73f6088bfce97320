"""Shared inputs and runners for the kernel tests: sharded kernel vs single-device reference."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from zoo.kernels import attention_reference, reorder, restore
from zoo.measure.hlo import FAST_COMPILE  # correctness tests need no optimised machine code

AXIS = "seq"
SEQ = P(None, AXIS)  # [B, T, ...] split along T


def mesh_of(n):
    return Mesh(np.array(jax.devices()[:n]), (AXIS,))


def padding_mask(batch, length):
    """bool[B, T]: example 0 is left-padded by 5 (its first 5 causal rows see no key at
    all), example 1 right-padded by 20, the rest keep everything."""
    pos = np.arange(length)[None]
    starts = np.zeros((batch, 1), int)
    ends = np.full((batch, 1), length)
    starts[0], ends[min(1, batch - 1)] = 5, length - 20
    return jnp.asarray((pos >= starts) & (pos < ends))


PACKED_DOCUMENTS = ((11, 7, 9), (5, 19))  # per row of a packed batch: document lengths, then padding


def packed_segment_ids(length=32, documents=PACKED_DOCUMENTS):
    """i32[B, T]: 1, 2, ... per document of each row, 0 on the trailing padding (packing)."""
    ids = np.zeros((len(documents), length), np.int32)
    for row, start, size, number in _documents(documents):
        ids[row, start : start + size] = number
    return ids


def packed_documents(documents=PACKED_DOCUMENTS):
    """[(row, start, length)] of every document of ``packed_segment_ids``."""
    return [(row, start, size) for row, start, size, _ in _documents(documents)]


def documents_alone(x, documents=PACKED_DOCUMENTS):
    """[n, T, ...] numpy: document i of the packed batch x [B, T, ...] at the start of row i,
    zeros after it (hidden from it by causality or a key mask; give them a zero cotangent)."""
    x = np.asarray(x)
    rows = np.zeros((sum(map(len, documents)), *x.shape[1:]), x.dtype)
    for i, (row, start, size, _) in enumerate(_documents(documents)):
        rows[i, :size] = x[row, start : start + size]
    return rows


def documents_packed(rows, batch, documents=PACKED_DOCUMENTS):
    """The inverse of ``documents_alone``: rows [n, T, ...] back at their packed places in
    [B, T, ...], zeros on the padding."""
    rows = np.asarray(rows)
    x = np.zeros((batch, *rows.shape[1:]), rows.dtype)
    for i, (row, start, size, _) in enumerate(_documents(documents)):
        x[row, start : start + size] = rows[i, :size]
    return x


def _documents(documents):
    for row, lengths in enumerate(documents):
        starts = np.cumsum(lengths) - lengths
        for number, (start, size) in enumerate(zip(starts, lengths), start=1):
            yield row, int(start), int(size), number


@functools.cache
def inputs(*, heads, kv_heads, batch=2, length=64, head_dim=16, dtype="float32", masked=True):
    """(q, k, v, key_mask, cotangent) from a fixed seed; key_mask None unless masked."""
    keys = jax.random.split(jax.random.key(heads * 10 + kv_heads), 4)
    q = jax.random.normal(keys[0], (batch, length, heads, head_dim), dtype)
    k = jax.random.normal(keys[1], (batch, length, kv_heads, head_dim), dtype)
    v = jax.random.normal(keys[2], (batch, length, kv_heads, head_dim), dtype)
    cotangent = jax.random.normal(keys[3], (batch, length, heads, head_dim), jnp.float32)
    mask = padding_mask(batch, length) if masked else None
    return q, k, v, mask, cotangent


def sharded(kernel, *, n, balance=None, **options):
    """f(q, k, v, key_mask) on global arrays in *shard order* (reordered if balanced)."""
    mesh = mesh_of(n)

    def run(q, k, v, key_mask):
        def body(q, k, v, key_mask):
            return kernel(q, k, v, axis_name=AXIS, key_mask=key_mask, balance=balance, **options)

        mask_spec = None if key_mask is None else SEQ
        f = jax.shard_map(body, mesh=mesh, in_specs=(SEQ, SEQ, SEQ, mask_spec), out_specs=SEQ)
        return f(q, k, v, key_mask)

    run.num_shards, run.balance = n, balance
    return run


def reference(*, causal, sliding_window=None):
    def run(q, k, v, key_mask):
        return attention_reference(q, k, v, causal=causal, key_mask=key_mask, sliding_window=sliding_window)

    return run


def executions(closed_jaxpr, primitive):
    """How often ``primitive`` (e.g. "ppermute") runs per call: its outputs, times scan lengths.

    Walks a traced program (``jax.jit(f).trace(...).jaxpr``) into every nested jaxpr
    (jit, shard_map, scan, custom rules); a loop of unknown trip count (``while``) or a
    ``cond`` around the primitive would make the count a guess, so it raises there.
    """
    return _executions(closed_jaxpr.jaxpr, primitive)


def _executions(jaxpr, primitive):
    total = 0
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name == primitive:
            total += len(eqn.outvars)
        inner = 0
        for value in eqn.params.values():
            for sub in value if isinstance(value, (tuple, list)) else (value,):
                sub = getattr(sub, "jaxpr", sub)  # ClosedJaxpr -> Jaxpr
                if hasattr(sub, "eqns"):
                    inner += _executions(sub, primitive)
        if inner and name in ("while", "cond"):
            raise ValueError(f"{primitive} inside a {name}: its execution count is not static")
        total += inner * (eqn.params["length"] if name == "scan" else 1)
    return total


def output_and_grads(attention, q, k, v, key_mask, cotangent):
    """(out, dq, dk, dv), gradients of sum(out * cotangent), in the original order.

    A balanced kernel gets inputs reordered outside jit (numpy) and its output and
    gradients restored: reordering is a permutation, so its gradient is the inverse one.
    """
    return outputs_and_grads([attention], q, k, v, key_mask, cotangent)[0]


def outputs_and_grads(attentions, q, k, v, key_mask, cotangent):
    """``output_and_grads`` of several attentions (one balance) in one compiled program.

    One program compiles in about half the time of one per attention.
    """
    (balance,) = {getattr(attention, "balance", None) for attention in attentions}
    move, back = lambda x: x, lambda x: x
    if balance is not None:
        num_shards = attentions[0].num_shards
        move = functools.partial(reorder, num_shards=num_shards, axis=1, balance=balance)
        back = functools.partial(restore, num_shards=num_shards, axis=1, balance=balance)
    q, k, v, cotangent = (move(np.asarray(x)) for x in (q, k, v, cotangent))
    key_mask = None if key_mask is None else move(np.asarray(key_mask))

    @functools.partial(jax.jit, compiler_options=FAST_COMPILE)
    def each(q, k, v, key_mask, cotangent):
        results = []
        for attention in attentions:
            out, pullback = jax.vjp(lambda q, k, v: attention(q, k, v, key_mask), q, k, v)  # noqa: B023 (used in this iteration)
            results.append((out, *pullback(cotangent.astype(out.dtype))))
        return results

    return [tuple(back(np.asarray(x)) for x in result) for result in each(q, k, v, key_mask, cotangent)]


def assert_close(actual, expected, *, rtol, atol, names=("out", "dq", "dk", "dv")):
    for name, a, e in zip(names, actual, expected):
        a, e = np.asarray(a, np.float32), np.asarray(e, np.float32)
        assert np.all(np.isfinite(a)), f"{name} has non-finite values"
        np.testing.assert_allclose(a, e, rtol=rtol, atol=atol, err_msg=name)
