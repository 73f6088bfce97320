"""MultiHeadAttention under a sequence-splitting (or a model-splitting) distribution
matches the plain layer.

For each strategy, on 8 devices (``data=2,seq=4`` and ``seq=8``) and on 4
(``data=1,seq=4`` on the first four): forward output and the gradients with respect to
the input and every weight equal the layer with no distribution, at float32
tolerance. Cases pair the factors (causal or not, MHA / GQA / MQA, padding mask,
rotary embedding, load balancing) rather than take their full product. Under tensor
parallelism (a ``model`` axis of size > 1) the same comparison for split and replicated
KV heads, Megatron sequence parallelism and FSDP inside TP, and the collectives read
from the compiled program. qk-norm once on each path (ring, tensor-parallel).
"""

import functools

import jax
import keras
import numpy as np
import pytest

from tests.layers import _attention as a
from zoo.distribution import CheckedModelParallel
from zoo.distribution.context_parallel import ContextParallel
from zoo.kernels import reorder, restore
from zoo.layers import MultiHeadAttention
from zoo.layers._parallel_plan import program_cache_info
from zoo.measure.comms_report import layer_comms_report

# (strategy, mesh, causal, heads, kv_heads, masked, rotary, balance). Striped balance is
# checked with gather, non-causal attention with gather and ring (Ulysses runs plain
# attention after its all-to-all, so the mask type adds nothing there): suite budget.
CASES = [
    ("gather", "data=2,seq=4", True, 4, 2, True, True, None),
    ("gather", "data=1,seq=4", False, 4, 4, False, False, None),
    ("gather", "seq=8", True, 8, 8, True, True, "striped"),
    ("ring", "data=2,seq=4", True, 4, 4, True, False, None),
    ("ring", "data=1,seq=4", False, 4, 2, True, True, None),
    ("ring", "seq=8", True, 8, 2, True, True, None),
    ("ring", "data=2,seq=4", True, 4, 2, True, True, "zigzag"),
    ("ulysses", "data=1,seq=4", True, 4, 4, False, False, None),
    ("ulysses", "seq=8", True, 8, 1, True, True, None),
    ("ulysses", "data=2,seq=4", True, 4, 2, True, True, "zigzag"),
    # no kernel: plain attention that GSPMD partitions, inputs in zig-zag order
    (None, "data=2,seq=4", True, 4, 2, True, True, "zigzag"),
]


def _case_id(case):
    strategy, mesh, causal, heads, kv_heads, masked, rotary, balance = case
    parts = [str(strategy), mesh.replace(",", "_"), "causal" if causal else "full", f"h{heads}k{kv_heads}"]
    parts += ["mask"] * masked + ["rope"] * rotary + [balance] * (balance is not None)
    return "-".join(parts)


def _options(case):
    strategy, _, causal, heads, kv_heads, _, rotary, balance = case
    return dict(
        num_heads=heads,
        num_kv_heads=kv_heads,
        causal=causal,
        rotary=rotary,
        context_attention=strategy,
        balance=balance,
    )


@functools.cache
def _reference(causal, heads, kv_heads, masked, rotary):
    options = dict(num_heads=heads, num_kv_heads=kv_heads, causal=causal, rotary=rotary)
    weights = a.reference_weights(options)
    x, mask, cotangent = a.inputs(masked)
    return weights, a.output_and_grads(options, weights, x, mask, cotangent)


@pytest.mark.parametrize("case", CASES, ids=[_case_id(c) for c in CASES])
def test_output_and_gradients_match_plain_layer(case):
    strategy, mesh, causal, heads, kv_heads, masked, rotary, balance = case
    weights, expected = _reference(causal, heads, kv_heads, masked, rotary)
    x, mask, cotangent = a.inputs(masked)
    n = a.mesh_size(mesh)
    move, back = (lambda t: t), (lambda t: t)
    if balance is not None:  # the data pipeline's job: reorder inputs, restore outputs
        move = functools.partial(reorder, num_shards=n, axis=1, balance=balance)
        back = functools.partial(restore, num_shards=n, axis=1, balance=balance)
    x, cotangent = move(x), move(cotangent)
    mask = None if mask is None else move(mask)
    out, dx, dw = a.output_and_grads(_options(case), weights, x, mask, cotangent, a.distribution(mesh))
    # weight gradients sum over tokens: the order of the tokens does not change them
    a.assert_same((back(out), back(dx), dw), expected)


def test_balance_changes_the_numbers_when_positions_matter():
    """Guards the test above against vacuity: zig-zag inputs read in natural order differ."""
    case = ("ring", "data=1,seq=4", True, 4, 4, True, True, "zigzag")
    weights, expected = _reference(True, 4, 4, True, True)
    x, mask, cotangent = a.inputs(True)
    x, mask, cotangent = (reorder(t, num_shards=4, axis=1) for t in (x, mask, cotangent))
    options = _options(case) | {"balance": None}
    out, _, _ = a.output_and_grads(options, weights, x, mask, cotangent, a.distribution("data=1,seq=4"))
    assert not np.allclose(restore(out, num_shards=4, axis=1), expected[0], rtol=1e-2, atol=1e-3)


def _jaxpr_text(options, dist, x):
    import keras

    keras.distribution.set_distribution(dist)
    try:
        layer = a.make_layer(**options)
        values = [v.value for v in layer.trainable_variables]
        return str(jax.make_jaxpr(lambda v, x: layer.stateless_call(v, [], x)[0])(values, x))
    finally:
        keras.distribution.set_distribution(None)


@pytest.mark.parametrize(
    "mesh, strategy",
    [("data=8", "ring"), ("data=8,seq=1", "ring"), ("data=2,seq=4", None), (None, "ulysses")],
    ids=["no-seq-axis", "seq-size-1", "no-strategy", "no-distribution"],
)
def test_plain_path_gives_the_plain_numbers(mesh, strategy):
    """No distribution, no kernel, or no sequence axis of size > 1 (a kernel named anyway
    runs plain attention): no shard_map, same numbers."""
    options = dict(causal=True, rotary=True, num_kv_heads=2)
    weights, expected = _reference(True, 4, 2, True, True)
    x, mask, cotangent = a.inputs(True)
    dist = None if mesh is None else a.distribution(mesh)
    assert "shard_map" not in _jaxpr_text(options | {"context_attention": strategy}, dist, x)
    got = a.output_and_grads(options | {"context_attention": strategy}, weights, x, mask, cotangent, dist)
    a.assert_same(got, expected)


def test_sharded_path_does_use_shard_map():
    text = _jaxpr_text({"context_attention": "ring"}, a.distribution("data=2,seq=4"), a.inputs(False)[0])
    assert "shard_map" in text and "ppermute" in text


def test_a_second_call_reuses_the_cached_shard_map():
    """The jitted shard_map is kept per (kernel, mesh, specs, settings): a second trace hits it."""
    keras.distribution.set_distribution(a.distribution("data=2,seq=4"))
    try:
        layer = a.make_layer(context_attention="ring")
        values, x = [v.value for v in layer.trainable_variables], a.inputs(False)[0]
        trace = lambda: jax.make_jaxpr(lambda v, x: layer.stateless_call(v, [], x)[0])(values, x)  # noqa: E731
        trace()
        before = program_cache_info()
        trace()
        after = program_cache_info()
        assert (after.hits, after.misses) == (before.hits + 1, before.misses)
    finally:
        keras.distribution.set_distribution(None)


def test_the_kernel_in_use_is_saved_and_the_saved_layer_gives_the_plain_numbers():
    """Built with context_attention=None under ContextParallel(context_attention="ring"), the
    layer's config says "ring"; rebuilt from it on one device it is the plain layer. Configs
    saved with the old keys still load."""
    options = dict(num_heads=4, num_kv_heads=2, causal=True, rotary=True)
    keras.distribution.set_distribution(ContextParallel("data=2,seq=4", context_attention="ring"))
    try:
        config = a.make_layer(**options).get_config()
    finally:
        keras.distribution.set_distribution(None)
    assert config["context_attention"] == "ring"
    restored = MultiHeadAttention.from_config(config).get_config()
    assert restored["context_attention"] == "ring" and "sequence_parallel" not in restored
    old = {k: v for k, v in config.items() if k not in ("context_attention", "megatron_sp")}
    old |= {"sequence_parallel": "ulysses", "tp_sequence_parallel": True}  # written before issue 16
    renamed = MultiHeadAttention.from_config(old)
    assert (renamed.context_attention, renamed.megatron_sp) == ("ulysses", True)
    weights, expected = _reference(True, 4, 2, True, True)
    x, mask, cotangent = a.inputs(True)
    saved = {k: restored[k] for k in (*options, "context_attention")}
    a.assert_same(a.output_and_grads(saved, weights, x, mask, cotangent), expected)


# --- tensor parallelism: the whole layer in one shard_map over 'model' ------------------------

# (mesh, heads, kv_heads, megatron_sp, fsdp, use_bias): KV heads split (K % M == 0)
# or replicated (M % K == 0, Megatron's rule), Megatron SP, FSDP inside TP, biases.
TP_CASES = [
    ("data=2,model=4", 4, 4, False, False, True),
    ("data=2,model=4", 8, 2, False, False, False),  # 2 KV heads on 4 devices: replicated
    ("data=2,model=4", 4, 2, True, False, True),  # replicated KV heads, sequence-parallel
    ("data=1,model=8", 8, 8, True, False, False),
    ("data=2,model=4", 4, 1, False, True, True),  # fsdp+tp: weights also split over data
]


def _tp_distribution(mesh, fsdp):
    dist = a.distribution(mesh)
    if not fsdp:
        return dist
    return CheckedModelParallel(layout_map=dist.layout_map, batch_dim_name="data", weight_shard_axis="data")


def _tp_options(heads, kv_heads, use_bias):
    return dict(num_heads=heads, num_kv_heads=kv_heads, causal=True, rotary=True, use_bias=use_bias)


@functools.cache
def _tp_reference(heads, kv_heads, use_bias):
    options = _tp_options(heads, kv_heads, use_bias)
    weights = a.reference_weights(options)
    x, mask, cotangent = a.inputs(True)
    return weights, a.output_and_grads(options, weights, x, mask, cotangent)


@pytest.mark.parametrize(
    "case",
    TP_CASES,
    ids=lambda c: f"{c[0].replace(',', '_')}-h{c[1]}k{c[2]}" + "-sp" * c[3] + "-fsdp" * c[4] + "-bias" * c[5],
)
def test_tensor_parallel_output_and_gradients_match_plain_layer(case):
    mesh, heads, kv_heads, megatron_sp, fsdp, use_bias = case
    weights, expected = _tp_reference(heads, kv_heads, use_bias)
    x, mask, cotangent = a.inputs(True)
    options = _tp_options(heads, kv_heads, use_bias) | {"megatron_sp": megatron_sp}
    a.assert_same(a.output_and_grads(options, weights, x, mask, cotangent, _tp_distribution(mesh, fsdp)), expected)


# qk-norm (Qwen3): one case per parallel path against one plain reference. The norm runs on
# q, k before the ring's shard_map (on [B, T/N, heads, D] shards) and inside the tensor-parallel
# one (each device's H/M query heads and its replicated KV head, the (D,) scales replicated).
QK_NORM = dict(num_heads=4, num_kv_heads=2, causal=True, rotary=True, qk_norm=True)


@functools.cache
def _qk_norm_reference():
    weights = a.reference_weights(QK_NORM)
    x, mask, cotangent = a.inputs(True)
    return weights, a.output_and_grads(QK_NORM, weights, x, mask, cotangent)


@pytest.mark.parametrize(
    ("mesh", "strategy"), [("data=2,seq=4", "ring"), ("data=2,model=4", None)], ids=["context-ring", "tp"]
)
def test_qk_norm_output_and_gradients_match_plain_layer(mesh, strategy):
    weights, expected = _qk_norm_reference()
    assert {"mha/query_norm/scale", "mha/key_norm/scale"} <= set(expected[2])  # their gradients are compared too
    x, mask, cotangent = a.inputs(True)
    got = a.output_and_grads(
        QK_NORM | {"context_attention": strategy}, weights, x, mask, cotangent, a.distribution(mesh)
    )
    a.assert_same(got, expected)


def _built(options, dist):
    keras.distribution.set_distribution(dist)
    return a.make_layer(**options)


@pytest.mark.parametrize(
    "kv_heads, fsdp, expected",
    [
        (4, False, {"query": (None, "model", None), "key": (None, "model", None), "output": ("model", None, None)}),
        (2, False, {"query": (None, "model", None), "key": (None, None, None), "output": ("model", None, None)}),
        (
            4,
            True,
            {"query": ("data", "model", None), "value": ("data", "model", None), "output": ("model", None, "data")},
        ),
    ],
    ids=["kv-split", "kv-replicated", "fsdp"],
)
def test_tensor_parallel_weights_are_placed_at_creation(kv_heads, fsdp, expected):
    """Layouts set when the weights are created: an empty layout map cannot leave them replicated."""
    try:
        layer = _built({"num_kv_heads": kv_heads, "use_bias": True}, _tp_distribution("data=2,model=4", fsdp))
        specs = {v.path.split("/")[1]: tuple(v.value.sharding.spec) for v in layer.weights if v.path.endswith("kernel")}
        for name, spec in expected.items():
            assert specs[name] + (None,) * (3 - len(specs[name])) == spec, (name, specs[name])
        assert tuple(layer.query.bias.value.sharding.spec) == ("model", None)
    finally:
        keras.distribution.set_distribution(None)


def _tp_report(mesh, **options):
    layer = _built(options, a.distribution(mesh))
    try:
        return layer_comms_report(layer, a.inputs(False)[0], backward=True, compiler_options=a.FAST_COMPILE)
    finally:
        keras.distribution.set_distribution(None)


def test_tensor_parallel_attention_is_megatrons_two_all_reduces():
    """Forward + backward over 'model': the output's all-reduce and ONE of d(x) (not q, k, v
    separately): Megatron's minimum. Megatron SP: two all-gathers and two reduce-scatters."""
    local = a.BATCH // 2 * a.LENGTH * a.CHANNELS  # elements of (B/data, T, C)
    report = _tp_report("data=2,model=4")
    model_ops = report.select(axes="model")  # XLA may combine the two into one op of two buffers
    assert {op.kind for op in model_ops} == {"all-reduce"}, "\n".join(report.format())
    assert report.buffers(axes="model") == 2 and sum(op.elements for op in model_ops) == 2 * local
    sp = _tp_report("data=2,model=4", megatron_sp=True)
    for kind in ("all-gather", "reduce-scatter"):
        assert sp.buffers(kind, "model") == 2 and sum(op.elements for op in sp.select(kind, "model")) == 2 * local, (
            "\n".join(sp.format())
        )
    assert sp.buffers(axes="model") == 4
    assert sp.sent_bytes(axes="model") == report.sent_bytes(axes="model")


def test_tensor_parallel_heads_that_do_not_split_are_refused():
    try:
        with pytest.raises(
            ValueError,
            match="MultiHeadAttention 'mha': num_heads 6 is not divisible by the 'model' mesh axis of size 4",
        ):
            _built({"num_heads": 6, "num_kv_heads": 6}, a.distribution("data=2,model=4"))
        with pytest.raises(
            ValueError, match="num_kv_heads 3 and the 'model' mesh axis of size 4 do not divide each other"
        ):
            _built({"num_heads": 12, "num_kv_heads": 3}, a.distribution("data=2,model=4"))
    finally:
        keras.distribution.set_distribution(None)
