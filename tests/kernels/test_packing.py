"""Packed rows (several documents per row, ``segment_ids``) in every attention kernel.

A row of documents of unequal length plus trailing padding must give, at each
document's positions, exactly what that document gives alone (outputs and gradients
with respect to q, k and v), and zeros at the padding. Every kernel runs in one compiled
program per token order (natural on N = 4; zig-zag on N = 8), against one program of
the documents alone. The reference with segment ids also equals plain softmax
attention under an explicit [T, S] mask built from the ids.

Shapes: B = 2, T = 32, H = 4 query heads, K = 2 KV heads (GQA), D = 8.
"""

import functools
import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.kernels import _harness as h
from zoo.kernels import (
    attention_reference,
    blockwise_attention,
    gather_kv_attention,
    reorder,
    restore,
    ring_attention,
    ulysses_attention,
)

BATCH, T, HEADS, KV_HEADS, HEAD_DIM = 2, 32, 4, 2, 8
PREFIX = 29  # the blockwise case runs on the first 29 tokens: tiles of 8 over 32 padded rows
WINDOW = 5  # below a shard of 8: the ring drops steps


def segment_ids():
    """i32[B, T]: row 0 holds documents of 11, 7, 9 tokens and 5 padding; row 1 of 5, 19 and 8."""
    return h.packed_segment_ids(T)


def documents():
    """(row, start, length) of every document."""
    return h.packed_documents()


def key_mask():
    """bool[B, T]: the padding, and the first 2 keys of row 0's second document (both must apply)."""
    mask = segment_ids() > 0
    mask[0, 11:13] = False  # its first query (causal) then sees no key at all
    return mask


@functools.cache
def _inputs():
    q, k, v, _, cotangent = h.inputs(heads=HEADS, kv_heads=KV_HEADS, batch=BATCH, length=T, head_dim=HEAD_DIM)
    return q, k, v, cotangent


# config name -> (causal, key mask used, sliding window)
CONFIGS = {
    "causal-mask": (True, True, None),
    "causal": (True, False, None),
    "window": (True, False, WINDOW),
    "full": (False, False, None),
}


@functools.cache
def _alone():
    """{config: (out, dq, dk, dv)}: each document alone, placed at its packed positions
    (zeros at the padding); all configs in one program. Alone, document i is row i of a
    batch of 5, at positions 0..L-1, the rest of the row hidden by the key mask (and by
    causality) and given a zero cotangent."""
    q, k, v, cotangent = (h.documents_alone(x) for x in _inputs())
    alone_mask = h.documents_alone(np.ones((BATCH, T), bool))  # bool[5, T]: the document's own tokens
    own_mask = h.documents_alone(key_mask())  # the document's part of the key mask, False after it

    @functools.partial(jax.jit, compiler_options=h.FAST_COMPILE)
    def each(q, k, v, cotangent):
        results = {}
        for name, (causal, masked, window) in CONFIGS.items():

            def alone(q, k, v, causal=causal, window=window, mask=own_mask if masked else alone_mask):
                return attention_reference(q, k, v, causal=causal, key_mask=mask, sliding_window=window)

            out, pullback = jax.vjp(alone, q, k, v)
            results[name] = (out, *pullback(cotangent))
        return results

    results = each(q, k, v, cotangent * alone_mask[..., None, None])
    return {name: [h.documents_packed(x, BATCH) for x in r] for name, r in results.items()}


def _sharded(kernel, n, balance, **options):
    """f(q, k, v, key_mask, ids) on global arrays in shard order, the kernel under shard_map."""
    mesh, seq = h.mesh_of(n), h.SEQ

    def run(q, k, v, mask, ids):
        def body(q, k, v, mask, ids):
            return kernel(q, k, v, axis_name=h.AXIS, key_mask=mask, segment_ids=ids, balance=balance, **options)

        specs = (seq, seq, seq, None if mask is None else seq, seq)
        return jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=seq)(q, k, v, mask, ids)

    return run


def _blockwise_prefix(q, k, v, mask, ids, **options):
    """blockwise on the first PREFIX tokens (tile_plan pads 29 to 32: padded ids are 0),
    zeros after them: the documents end before PREFIX, so the expected values are the same."""
    cut = lambda x: None if x is None else x[:, :PREFIX]  # noqa: E731
    out = blockwise_attention(
        cut(q), cut(k), cut(v), key_mask=cut(mask), segment_ids=cut(ids), block_size=8, **options
    )  # [B, PREFIX, H, D]
    return jnp.pad(out, ((0, 0), (0, T - PREFIX), (0, 0), (0, 0)))


def _reference(q, k, v, mask, ids, **options):
    return attention_reference(q, k, v, key_mask=mask, segment_ids=ids, **options)


def _natural_kernels():
    """name -> (config, f(q, k, v, key_mask, ids)): every kernel in natural order, N = 4."""
    causal = {"causal": True}
    return {
        "reference": ("causal-mask", functools.partial(_reference, **causal)),
        "blockwise": ("causal-mask", functools.partial(_blockwise_prefix, **causal)),
        "ring": ("causal-mask", _sharded(ring_attention, 4, None, block_size=4, **causal)),
        "gather": ("causal-mask", _sharded(gather_kv_attention, 4, None, block_size=4, **causal)),
        "ulysses": ("causal-mask", _sharded(ulysses_attention, 4, None, block_size=8, **causal)),
        "ring-window": ("window", _sharded(ring_attention, 4, None, block_size=4, sliding_window=WINDOW, **causal)),
        "ring-full": ("full", _sharded(ring_attention, 4, None, block_size=4)),
    }


def _explicit_mask(causal, masked):
    """bool[B, T, S] built by hand from the ids: same document, key not padding (and the key
    mask; and causal)."""
    ids = segment_ids()
    mask = (ids[:, :, None] == ids[:, None, :]) & (ids[:, None, :] > 0)
    if masked:
        mask &= key_mask()[:, None, :]
    return mask & np.tril(np.ones((T, T), bool)) if causal else mask


def _oracles():
    """name -> (config, f) run in the natural program but not against the documents alone:
    the explicit-mask attention and the reference beside it, and the reference without ids."""
    return {
        "explicit-mask": (
            "causal-mask",
            lambda q, k, v, m, i: _explicit_mask_attention(q, k, v, _explicit_mask(True, True)),
        ),
        "explicit-mask-full": (
            "full",
            lambda q, k, v, m, i: _explicit_mask_attention(q, k, v, _explicit_mask(False, False)),
        ),
        "reference-full": ("full", _reference),
        "no-ids": ("causal-mask", lambda q, k, v, m, i: attention_reference(q, k, v, causal=True, key_mask=m)),
    }


def _zigzag_kernels():
    """name -> (config, f): the load-balanced ring on N = 8 (chunks of 2 tokens)."""
    return {"ring-zigzag": ("causal", _sharded(ring_attention, 8, "zigzag", block_size=2, causal=True))}


@functools.cache
def _packed(order):
    """{name: (out, dq, dk, dv)} of every kernel of one token order, in one program; outputs
    and gradients back in natural order."""
    kernels, n = (_natural_kernels() | _oracles(), 4) if order == "natural" else (_zigzag_kernels(), 8)
    move = back = lambda x: x  # noqa: E731
    if order == "zigzag":
        move = functools.partial(reorder, num_shards=n, axis=1, balance="zigzag")
        back = functools.partial(restore, num_shards=n, axis=1, balance="zigzag")
    q, k, v, cotangent = (move(np.asarray(x)) for x in _inputs())
    mask, ids = move(key_mask()), move(segment_ids())

    @functools.partial(jax.jit, compiler_options=h.FAST_COMPILE)
    def each(q, k, v, cotangent, mask, ids):
        results = {}
        for name, (config, attention) in kernels.items():
            used = mask if CONFIGS[config][1] else None
            out, pullback = jax.vjp(lambda q, k, v: attention(q, k, v, used, ids), q, k, v)  # noqa: B023
            results[name] = (out, *pullback(cotangent))
        return results

    return {name: [back(np.asarray(x)) for x in r] for name, r in each(q, k, v, cotangent, mask, ids).items()}


CASES = [("natural", name) for name in _natural_kernels()] + [("zigzag", name) for name in _zigzag_kernels()]


@pytest.mark.parametrize("order, name", CASES, ids=[name for _, name in CASES])
def test_packed_row_equals_each_document_alone(order, name):
    config = (_natural_kernels() if order == "natural" else _zigzag_kernels())[name][0]
    names = tuple(f"{x} ({name}, {config})" for x in ("out", "dq", "dk", "dv"))
    h.assert_close(_packed(order)[name], _alone()[config], rtol=1e-4, atol=1e-5, names=names)


def test_a_key_masked_in_its_document_hides_it_and_padding_gives_zeros():
    """Guards the test above: row 0's query at 11 sees no key (its one causal key is masked),
    padding queries give 0, and without segment ids the documents would mix."""
    results = _packed("natural")
    out, dq, dk, dv = results["ring"]
    np.testing.assert_array_equal(out[0, 11], 0.0)
    for x in (out, dq, dk, dv):
        np.testing.assert_array_equal(x[segment_ids() == 0], 0.0)
    assert not np.allclose(results["no-ids"][0][1, 5:24], out[1, 5:24], atol=1e-3)


def _explicit_mask_attention(q, k, v, mask):
    """Softmax attention under a dense bool[B, T, S] mask (rows with no key give 0), written
    independently of the zoo's kernels: K/V heads repeated, one einsum, one softmax."""
    groups = q.shape[2] // k.shape[2]
    k, v = (jnp.repeat(x, groups, axis=2) for x in (k, v))  # [B, S, H, D]
    scores = jnp.einsum("bthd,bshd->bhts", q, k) * q.shape[-1] ** -0.5
    scores = jnp.where(mask[:, None], scores, -jnp.inf)
    seen = mask.any(-1)[:, None, :, None]  # bool[B, 1, T, 1]
    probs = jax.nn.softmax(jnp.where(seen, scores, 0.0), axis=-1) * seen
    return jnp.einsum("bhts,bshd->bthd", probs, v)


@pytest.mark.parametrize("config", ["causal-mask", "full"])
def test_reference_equals_an_explicit_mask(config):
    """Outputs and gradients of the reference with segment ids (and the key mask) equal
    plain softmax attention under the [T, S] mask built from the ids by hand."""
    suffix = "" if config == "causal-mask" else "-full"
    results = _packed("natural")
    names = tuple(f"{x} ({config})" for x in ("out", "dq", "dk", "dv"))
    h.assert_close(results[f"reference{suffix}"], results[f"explicit-mask{suffix}"], rtol=1e-5, atol=1e-6, names=names)


@pytest.mark.parametrize(
    "ids, kv_ids, message",
    [
        (
            np.zeros((BATCH, T + 1), np.int32),
            None,
            r"segment_ids shape \(2, 33\) must be \(batch, q length\) = \(2, 32\)",
        ),
        (np.zeros((BATCH, T), np.float32), None, "segment_ids must be an integer array.*float32"),
        (np.zeros((BATCH, T), np.int32), np.zeros((BATCH, 8), np.int32), r"kv_segment_ids shape \(2, 8\)"),
        (None, np.zeros((BATCH, T), np.int32), "kv_segment_ids needs segment_ids"),
    ],
    ids=["shape", "dtype", "kv-shape", "kv-alone"],
)
def test_bad_segment_ids_are_named(ids, kv_ids, message):
    q, k, v, _ = _inputs()
    with pytest.raises(ValueError, match=message):
        attention_reference(q, k, v, segment_ids=ids, kv_segment_ids=kv_ids)
    with pytest.raises(ValueError, match=message):
        blockwise_attention(q, k, v, segment_ids=ids, kv_segment_ids=kv_ids)


def test_ring_refuses_ids_of_another_shard_shape():
    q, k, v, _ = _inputs()
    ring = _sharded(ring_attention, 4, None, block_size=4)
    with pytest.raises(ValueError, match=r"segment_ids shape \(2, 4\) must be \(batch, q length\) = \(2, 8\)"):
        jax.eval_shape(lambda ids: ring(q, k, v, None, ids), jax.ShapeDtypeStruct((BATCH, 16), jnp.int32))


def test_local_attention_runs_the_tiles_with_ids_where_cudnn_would_apply(monkeypatch):
    """On a GPU, bfloat16 causal self-attention in natural order goes to cuDNN, which takes
    no document ids: with ids the tiled kernel runs instead (cuDNN stubbed out here; the
    tiled kernel's numbers with ids: the tests above)."""
    module = importlib.import_module("zoo.kernels.attention_seam")  # the package exports the function

    def no_cudnn(*args, **kwargs):
        raise AssertionError("cuDNN was called")

    monkeypatch.setattr(module.jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(module.jax.nn, "dot_product_attention", no_cudnn)
    q, k, v, _ = (x.astype(jnp.bfloat16) for x in _inputs())
    ids = segment_ids()
    # traced, not compiled: the choice of kernel is made while tracing
    out = jax.eval_shape(lambda q, k, v: module.local_attention(q, k, v, causal=True, segment_ids=ids), q, k, v)
    assert (out.shape, out.dtype) == (q.shape, jnp.bfloat16)
    with pytest.raises(AssertionError, match="cuDNN was called"):  # without ids: the cuDNN branch
        jax.eval_shape(lambda q, k, v: module.local_attention(q, k, v, causal=True), q, k, v)
