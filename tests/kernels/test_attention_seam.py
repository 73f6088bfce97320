"""The attention seam (``zoo.kernels.attention_seam``): every local attention call is chosen
by one selector, and a kernel added to its registry runs wherever it says it applies:
plain calls, the local step of the all-gather and Ulysses context kernels, and a layer's
cached decoding. The registry's own kernels are checked against the float64 reference in
their modules' tests (blockwise, splash in Pallas' interpreter, cuDNN's choice)."""

import pathlib

import jax
import numpy as np
import pytest

from tests.kernels import _harness as h
from zoo.kernels import (
    attention_implementation,
    attention_seam,
    blockwise_attention,
    describe_local_attention,
    gather_kv_attention,
    local_attention,
    ulysses_attention,
)
from zoo.kernels._attention_spec import LocalKernel
from zoo.layers import MultiHeadAttention

HEAD_DIM = 16  # the test kernel's own; the tiled kernel takes any other


@pytest.fixture
def dense_kernel(monkeypatch):
    """A kernel that materialises the scores (the reference kernel's ``run``) for head dim
    16 on this CPU, whatever the call, put first in the registry: the list of the specs it
    was run with."""
    calls = []

    def run(q, k, v, spec, **arrays):
        calls.append(spec)
        return attention_seam.REFERENCE.run(q, k, v, spec, **arrays)  # the registry's own, under another rule

    dense = LocalKernel(
        "dense", lambda query: query.platform == "cpu" and query.head_dim == HEAD_DIM, run, lambda *_: "dense"
    )
    monkeypatch.setattr(attention_seam, "LOCAL_KERNELS", (dense, *attention_seam.LOCAL_KERNELS))
    return calls


def _value_and_grads(attend, q, k, v, mask, cotangent):
    out, pullback = jax.vjp(lambda q, k, v: attend(q, k, v, mask), q, k, v)
    return out, pullback(cotangent)


def test_a_registered_kernel_runs_the_calls_it_supports_with_the_tiled_kernels_numbers(dense_kernel):
    """Causal, windowed and soft-capped, with a key mask: the added kernel runs the call
    and its output and gradients are the tiled kernel's (which runs it unregistered); a
    head dim it does not take still goes to the tiled kernel."""
    options = dict(causal=True, sliding_window=12, softcap=20.0, block_size=8)
    q, k, v, mask, cotangent = h.inputs(heads=4, kv_heads=2, length=32)

    def seam(q, k, v, mask):
        return local_attention(q, k, v, key_mask=mask, **options)

    def tiled(q, k, v, mask):
        return blockwise_attention(q, k, v, key_mask=mask, **options)

    got, want = _value_and_grads(seam, q, k, v, mask, cotangent), _value_and_grads(tiled, q, k, v, mask, cotangent)
    assert [(s.causal, s.sliding_window, s.softcap) for s in dense_kernel] == [(True, 12, 20.0)]
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5)
    wide = h.inputs(heads=2, kv_heads=2, length=16, head_dim=32)
    jax.eval_shape(lambda q, k, v: local_attention(q, k, v, causal=True), *wide[:3])  # the choice is made tracing
    assert len(dense_kernel) == 1
    described = dict(platform="cpu", dtype="float32", q_len=32, kv_len=32, block_size=8)
    assert describe_local_attention(head_dim=HEAD_DIM, **described) == "dense"
    assert describe_local_attention(head_dim=32, **described) == "blockwise (tile 8)"


@pytest.mark.parametrize("context_kernel", [gather_kv_attention, ulysses_attention], ids=lambda f: f.__name__)
def test_the_context_kernels_run_the_selected_kernel_as_their_local_step(dense_kernel, context_kernel):
    """On 4 devices: the all-gather and Ulysses kernels run the registered kernel for their
    local step, once per device program, and still equal the reference."""
    q, k, v, mask, _ = h.inputs(heads=4, kv_heads=4, length=32)
    out = h.sharded(context_kernel, n=4, causal=True, block_size=8)(q, k, v, mask)
    assert len(dense_kernel) == 1
    want = h.reference(causal=True)(q, k, v, mask)
    np.testing.assert_allclose(out, want, rtol=2e-5, atol=2e-5)


def test_cached_decoding_asks_the_seam(dense_kernel):
    """A layer's cached call (generation) gets its kernel from the same selector as
    training, and its output is the uncached call's."""
    layer = MultiHeadAttention(num_heads=4, head_dim=HEAD_DIM, num_kv_heads=2, causal=True, rotary=True)
    x = np.random.default_rng(0).normal(size=(2, 8, 32)).astype("float32")
    whole = layer(x)
    trained = len(dense_kernel)
    cache = layer.empty_cache(2, 8)
    out, _ = layer(x, cache=cache, cache_index=0)
    assert trained == 1 and len(dense_kernel) == 2
    np.testing.assert_allclose(out, whole, rtol=2e-5, atol=2e-5)


def test_a_decoding_step_no_bigger_than_a_tile_materialises_its_scores():
    """No gradient and T x S <= 512 x 512 (one new token over the cache): the reference;
    the same call where a gradient may be taken, or a long prompt's prefill: the tiles."""
    call = dict(platform="cpu", dtype="float32", head_dim=32, causal=True, natural_order=False)
    assert attention_implementation(q_len=1, kv_len=8192, inference=True, **call) == "reference"
    assert attention_implementation(q_len=1, kv_len=8192, **call) == "blockwise"
    assert attention_implementation(q_len=2048, kv_len=2048, inference=True, **call) == "blockwise"
    assert attention_implementation(q_len=1, kv_len=8192, inference=True, **{**call, "platform": "tpu"}) == "reference"


def test_one_selector_chooses_every_local_kernel():
    """Only the seam reads the registry or asks a kernel whether it applies, and no layer,
    model or context kernel calls a local kernel by name."""
    zoo = pathlib.Path(attention_seam.__file__).parents[1]
    sources = {path: path.read_text() for path in zoo.rglob("*.py")}
    asking = {path.name for path, text in sources.items() if "LOCAL_KERNELS" in text or ".supports(query" in text}
    assert asking == {"attention_seam.py"}
    by_name = ("blockwise_attention(", "splash_attention(", 'implementation="cudnn"')
    for folder in ("layers", "models", "training"):
        for path in (zoo / folder).rglob("*.py"):
            assert not [name for name in by_name if name in sources[path]], path
    for path in ("kernels/gather_attention.py", "kernels/ulysses_attention.py"):
        assert not [name for name in by_name if name in sources[zoo / path]], path
