"""MultiHeadAttention on packed rows (``segment_ids``): each document as if alone.

A batch of two packed rows (documents of 11, 7, 9 tokens and 5 padding; 5, 19 and 8)
through the layer on one device, under tensor parallelism (``data=2,model=4``) and
under causal ring attention in zig-zag order (``data=2,seq=4``): the output and the
input gradient at each document's tokens equal the plain single-device layer run on
that document alone, zeros at the padding, and every weight gradient is the sum of the
documents' alone. Rotary embedding is on: the packed tokens sit at positions offset
from the document's own, which rotary scores do not depend on. (That the documents
would mix without the ids: tests/kernels/test_packing.py, on the same rows.)
"""

import functools

import jax
import keras
import numpy as np
import pytest

from tests.kernels._harness import FAST_COMPILE, documents_alone, documents_packed, packed_segment_ids
from tests.layers import _attention as a
from zoo.distribution import make_mesh
from zoo.kernels import reorder, restore
from zoo.layers import PipelinedBlocks

OPTIONS = dict(num_heads=4, num_kv_heads=2, causal=True, rotary=True)

# (name, mesh, extra layer options, balance)
CASES = [
    ("one-device", None, {}, None),
    ("tp", "data=2,model=4", {}, None),
    ("ring-zigzag", "data=2,seq=4", {"context_attention": "ring"}, "zigzag"),
    # tier 2 (tests/_tiers.py): further configurations of the three above
    ("tp-megatron-sp", "data=2,model=4", {"megatron_sp": True}, None),
    ("gather", "data=1,seq=4", {"context_attention": "gather"}, None),
    ("ulysses-zigzag", "data=2,seq=4", {"context_attention": "ulysses"}, "zigzag"),
]


@functools.cache
def _weights():
    return a.reference_weights(OPTIONS)


@functools.cache
def _alone():
    """(out, dx, {path: dweight}) of every document alone on one device, placed at its
    tokens (zeros at the padding), the weight gradients summed over the documents. Alone,
    document i is row i of a batch of 5 at positions 0..L-1, the rest of the row hidden
    by the key mask and given a zero cotangent (so it adds nothing to any gradient)."""
    x, _, cotangent = a.inputs(masked=False)
    own = documents_alone(np.ones((a.BATCH, a.LENGTH), bool))  # bool[5, T]
    x, cotangent = documents_alone(x), documents_alone(cotangent)  # zeros after each document
    out, dx, dw = a.output_and_grads(OPTIONS, _weights(), x, own, cotangent)
    return documents_packed(out, a.BATCH), documents_packed(dx, a.BATCH), dw


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_packed_rows_equal_each_document_alone(case):
    _, mesh, extra, balance = case
    x, _, cotangent = a.inputs(masked=False)
    ids = packed_segment_ids(a.LENGTH)
    move = back = lambda t: t  # noqa: E731
    if balance is not None:  # the data pipeline's job: reorder inputs (and ids), restore outputs
        n = a.mesh_size(mesh)
        move = functools.partial(reorder, num_shards=n, axis=1, balance=balance)
        back = functools.partial(restore, num_shards=n, axis=1, balance=balance)
    options = OPTIONS | extra | {"balance": balance}
    dist = None if mesh is None else a.distribution(mesh)
    out, dx, dw = a.output_and_grads(options, _weights(), move(x), None, move(cotangent), dist, segment_ids=move(ids))
    a.assert_same((back(out), back(dx), dw), _alone())


@pytest.mark.parametrize(
    "ids, message",
    [
        (np.zeros((a.BATCH, a.LENGTH - 1), np.int32), r"segment_ids shape \(2, 31\) must be .* = \(2, 32\)"),
        (np.zeros((a.BATCH, a.LENGTH), np.float32), r"segment_ids must be an integer array.*float32"),
        (np.zeros((a.BATCH, a.LENGTH), bool), r"segment_ids must be an integer array.*bool"),
    ],
    ids=["shape", "float", "bool"],
)
def test_bad_segment_ids_are_named(ids, message):
    layer = a.make_layer(**OPTIONS)
    with pytest.raises(ValueError, match=message):
        layer(a.inputs(masked=False)[0], segment_ids=ids)


def test_segment_ids_with_a_cache_are_refused():
    layer = a.make_layer(**OPTIONS)
    x = a.inputs(masked=False)[0][:, :4]
    ids = np.ones((a.BATCH, 4), np.int32)
    with pytest.raises(ValueError, match="segment_ids are not supported together with cache"):
        layer(x, cache=layer.empty_cache(a.BATCH, 8), segment_ids=ids)


# --- PipelinedBlocks: the ids cut into micro-batches with the rows, to every block ----------

PIPELINE_BLOCK = dict(
    num_heads=2, head_dim=8, hidden_dim=16, num_kv_heads=1, causal=True, rotary=True, mlp="swiglu", norm="rms"
)  # swiglu: JAX 0.12 cannot differentiate exact GELU inside shard_map (zoo/kernels/tensor_parallel.py)
PIPELINE_CASES = [("one-device", None, 1), ("stages", "data=1,stage=2", 2)]  # (name, mesh, micro-batches)
ROWS = 8  # one batch: the 2 packed rows, the 5 documents alone, 1 row of padding only


def _stage_layouts(mesh):
    """The stacked weights (R, L/R, ...) split over ``stage`` on dimension 1."""
    layouts = keras.distribution.LayoutMap(mesh)
    layouts[r"blocks/attention/.*/kernel"] = (None, "stage", None, None, None)  # (R, L/R, C, H|K, D) or (.., H, D, C)
    layouts[r"blocks/mlp/.*/kernel"] = (None, "stage", None, None)  # (R, L/R, C, F) or (R, L/R, F, C)
    layouts[r"blocks/.*_norm/.*"] = (None, "stage", None)  # (R, L/R, C)
    return layouts


def _one_batch():
    """(x, key_mask, segment_ids, packed cotangent, alone cotangent) of ROWS rows.

    Rows 0-1: the packed rows (ids; the key mask keeps all). Rows 2-6: each document
    alone at positions 0..L-1, one id for the whole row, the rest hidden by the key mask.
    Row 7: padding only. Each cotangent is zero outside its rows' documents (the loss
    ignores padding), so each pullback gives its own rows' gradients."""
    x, _, cotangent = a.inputs(masked=False)
    ids = packed_segment_ids(a.LENGTH)  # i32[2, T]
    filler = np.zeros((1, *x.shape[1:]), x.dtype)
    own = documents_alone(np.ones((a.BATCH, a.LENGTH), bool))  # bool[5, T]
    rows = lambda packed, alone, last: np.concatenate([packed, alone, last])  # noqa: E731
    x_all = rows(x, documents_alone(x), filler)
    key_mask = rows(np.ones_like(ids, bool), own, np.zeros((1, a.LENGTH), bool))
    segment_ids = rows(ids, np.ones_like(own, np.int32), np.zeros((1, a.LENGTH), np.int32))
    zeros_alone = np.zeros((len(own), *x.shape[1:]), x.dtype)
    packed_cot = rows(cotangent * (ids > 0)[..., None], zeros_alone, filler)
    alone_cot = rows(np.zeros_like(x), documents_alone(cotangent), filler)
    return x_all, key_mask, segment_ids, packed_cot, alone_cot


def _pipelined(mesh=None, micro_batches=1):
    """(out, (dx, [dweight]) of the packed rows, the same of the documents alone) of 2
    PipelinedBlocks on ``mesh`` (None: one device), weights seeded, one program."""
    reference = PipelinedBlocks(2, PIPELINE_BLOCK, name="blocks")
    reference.build((ROWS, a.LENGTH, a.CHANNELS))
    rng = np.random.default_rng(2)
    weights = [rng.standard_normal(w.shape).astype("float32") * 0.3 for w in reference.get_weights()]
    dist = None
    if mesh is not None:
        devices = jax.devices()[: a.mesh_size(mesh, "stage")]
        dist = keras.distribution.ModelParallel(layout_map=_stage_layouts(make_mesh(mesh, devices=devices)))
    keras.distribution.set_distribution(dist)
    try:
        layer = PipelinedBlocks(2, PIPELINE_BLOCK, micro_batches=micro_batches, name="blocks")
        layer.build((ROWS, a.LENGTH, a.CHANNELS))
        layer.set_weights(weights)
        seed = [v.value for v in layer.non_trainable_variables]  # the dropout seed (no dropout here)

        @functools.partial(jax.jit, compiler_options=FAST_COMPILE)
        def both(x, values, key_mask, segment_ids, packed_cot, alone_cot):
            forward = lambda x, v: layer.stateless_call(v, seed, x, key_mask=key_mask, segment_ids=segment_ids)[0]  # noqa: E731
            out, pullback = jax.vjp(forward, x, values)
            return out, pullback(packed_cot), pullback(alone_cot)

        x, key_mask, segment_ids, packed_cot, alone_cot = _one_batch()
        values = [v.value for v in layer.trainable_variables]
        return jax.tree.map(np.asarray, both(x, values, key_mask, segment_ids, packed_cot, alone_cot))
    finally:
        keras.distribution.set_distribution(None)


@pytest.mark.parametrize("case", PIPELINE_CASES, ids=[c[0] for c in PIPELINE_CASES])
def test_pipelined_blocks_on_packed_rows_equal_each_document_alone(case):
    """Outputs on the documents' tokens (the residual stream carries padding tokens
    through: they are not zero), and the gradients of x and of every weight."""
    _, mesh, micro_batches = case
    out, (dx, dw), (alone_dx, alone_dw) = _pipelined(mesh, micro_batches)
    docs = packed_segment_ids(a.LENGTH) > 0  # bool[2, T]
    alone_out = documents_packed(out[2:7], a.BATCH)
    np.testing.assert_allclose(out[:2][docs], alone_out[docs], rtol=a.RTOL, atol=a.ATOL, err_msg="output")
    np.testing.assert_allclose(dx[:2], documents_packed(alone_dx[2:7], a.BATCH), rtol=a.RTOL, atol=a.ATOL)
    for index, (g, e) in enumerate(zip(dw, alone_dw)):
        np.testing.assert_allclose(g, e, rtol=a.RTOL, atol=a.ATOL, err_msg=f"d weight {index}")
