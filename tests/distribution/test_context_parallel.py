"""``ContextParallel``: ``model.fit`` on batch- and sequence-split inputs trains to the one-device numbers,
with the weights split over the sequence axis too (FSDP over ``seq``, the default).

A tiny causal language model (Embedding -> ``TransformerBlock`` (causal, rotary, padding
mask from token 0) -> Dense head; per-token sparse cross-entropy from logits) is trained
for 3 SGD steps on one device (once, shared) and under ``ContextParallel`` on the mesh
data=2,seq=4: per-step losses, final weights (they carry every gradient) and
predictions must agree at float32 tolerances. The layers are never told about the
sequence split: the distribution's data layout splits the inputs and its
``context_attention`` picks each attention layer's kernel (which the layer records in its
config). ``describe(model)`` says, per layer, what runs.
"""

import jax
import keras
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from zoo.distribution import MeshError, distribution_for, make_distribution, make_mesh
from zoo.distribution.context_parallel import ContextParallel
from zoo.distribution.describe import describe
from zoo.distribution.parity import StepLosses, compare
from zoo.kernels import reorder
from zoo.layers import (
    MultiHeadAttention,
    ParallelMLP,
    TransformerBlock,
    _parallel_plan,
    _tensor_parallel,
)
from zoo.measure.comms_report import FAST_COMPILE, train_step_comms_report
from zoo.models import _transformer_layouts as layouts

VOCAB, LENGTH, WIDTH, HEADS, STEPS, BATCH = 16, 32, 16, 4, 3, 8
RTOL, ATOL = 1e-4, 1e-5  # float32: sums split across devices change order


def _tokens(count=BATCH * STEPS, seed=0):
    """(tokens i32[N, T], labels i32[N, T]): next-token labels; token 0 pads the end."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, VOCAB, size=(count, LENGTH)).astype("int32")
    lengths = rng.integers(LENGTH // 2, LENGTH + 1, size=count)
    tokens[np.arange(LENGTH)[None, :] >= lengths[:, None]] = 0
    return tokens, np.roll(tokens, -1, axis=1)


def build_model(megatron_sp=False):
    tokens = keras.Input((LENGTH,), dtype="int32", name="tokens")  # (B, T)
    key_mask = keras.ops.not_equal(tokens, 0)  # bool (B, T)
    x = keras.layers.Embedding(VOCAB, WIDTH, name="embed")(tokens)  # (B, T, C)
    x = TransformerBlock(
        num_heads=HEADS,
        head_dim=4,
        hidden_dim=32,
        causal=True,
        rotary=True,
        megatron_sp=megatron_sp,
        name="block",
    )(x, key_mask=key_mask)  # (B, T, C)
    return keras.Model(tokens, keras.layers.Dense(VOCAB, name="head")(x))  # (B, T, V)


def compile_model(model):
    model.compile(
        optimizer=keras.optimizers.SGD(learning_rate=0.5),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )


def train(distribution, initial, fit_data, predict_x=None, build=build_model):
    """(model, per-step losses, {path: weight}, predict output or None) after ``fit`` under ``distribution``.

    ``fit_data``: ``(x, y)`` arrays (batches of ``BATCH`` in order) or a ``PyDataset``.
    The distribution stays set (the caller's fixture clears it).
    """
    keras.distribution.set_distribution(distribution)
    model = build()
    compile_model(model)
    model.set_weights(initial)
    steps = StepLosses()
    fit_args = fit_data if isinstance(fit_data, tuple) else (fit_data,)
    options = dict(batch_size=BATCH) if isinstance(fit_data, tuple) else {}
    model.fit(*fit_args, epochs=1, shuffle=False, verbose=0, callbacks=[steps], **options)
    logits = None if predict_x is None else model.predict(predict_x, batch_size=BATCH, verbose=0)
    return model, steps.losses, {v.path: np.asarray(v.numpy()) for v in model.weights}, logits


@pytest.fixture(scope="module")
def reference():
    """One-device training, predictions and evaluation: the gold numbers."""
    tokens, labels = _tokens()
    keras.utils.set_random_seed(0)
    keras.distribution.set_distribution(None)
    initial = build_model().get_weights()
    _, losses, weights, logits = train(None, initial, (tokens, labels), tokens[:BATCH])
    assert losses[0] != losses[-1]  # training moved
    return dict(tokens=tokens, labels=labels, initial=initial, losses=losses, weights=weights, logits=logits)


def assert_matches(reference, losses, weights, logits=None):
    np.testing.assert_allclose(losses, reference["losses"], rtol=RTOL, atol=ATOL)
    difference = compare(reference["weights"], weights, rtol=RTOL, atol=ATOL)
    assert difference.within_tolerance, difference
    if logits is not None:
        np.testing.assert_allclose(logits, reference["logits"], rtol=RTOL, atol=1e-4)


def token_cross_entropy(logits, labels):
    """Mean over tokens of -log softmax(logits)[label], in float64 (the compiled loss's maths)."""
    logits = np.asarray(logits, dtype=np.float64)
    shifted = logits - logits.max(axis=-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    return -np.take_along_axis(log_probs, labels[..., None], axis=-1).mean()


# --- model.fit parity ---------------------------------------------------------------------


@pytest.mark.parametrize("context_attention", ["gather", "ring", "ulysses"])
def test_fit_matches_one_device(reference, context_attention):
    """Losses and final weights; the ring run also predicts (the others' forward is in
    every step's loss)."""
    distribution = ContextParallel("data=2,seq=4", context_attention=context_attention)
    tokens, labels = reference["tokens"], reference["labels"]
    predict_x = tokens[:BATCH] if context_attention == "ring" else None
    model, losses, weights, logits = train(distribution, reference["initial"], (tokens, labels), predict_x)
    assert_matches(reference, losses, weights, logits)
    # the kernel that ran is saved with the model: the block was built with context_attention=None
    assert model.get_layer("block").get_config()["context_attention"] == context_attention
    if context_attention != "ring":
        return
    # The compiled step runs the ring: K/V hops are collective-permutes over 'seq', and
    # nothing all-gathers the sequence (an MLP or norm on gathered tokens would): what is
    # gathered over 'seq' are weights (FSDP over seq), whole, where they are used.
    report = train_step_comms_report(model, tokens[:BATCH], labels[:BATCH], compiler_options=FAST_COMPILE)
    assert report.count("collective-permute", axes="seq") > 0, report.format()
    weight_shapes = {f"f32[{','.join(map(str, v.shape))}]" for v in model.weights}
    assert report.count("all-gather", axes="seq") > 0, report.format()
    assert {op.shape for op in report.select("all-gather", "seq")} <= weight_shapes, report.format()


def test_weights_are_split_over_the_sequence_axis_by_default():
    """FSDP over 'seq': every weight of rank >= 2 on its first free dimension that divides;
    vectors stay replicated; ``shard_weights=False`` keeps the layout map's (none) layouts."""
    keras.distribution.set_distribution(ContextParallel("data=2,seq=4"))
    model = build_model()
    specs = {v.path: tuple(v.value.sharding.spec) for v in model.weights}
    assert specs["embed/embeddings"] == ("seq", None)  # (V, C)
    assert specs["block/attention/query/kernel"][:1] == ("seq",)  # (C, H, D)
    assert specs["block/mlp/down/kernel"][:1] == ("seq",)  # (F, C)
    assert all(entry is None for entry in specs["block/attention_norm/gamma"])
    assert {s.data.shape for s in model.get_layer("head").kernel.value.addressable_shards} == {(WIDTH // 4, VOCAB)}
    keras.distribution.set_distribution(ContextParallel("data=2,seq=4", shard_weights=False))
    assert all(all(e is None for e in v.value.sharding.spec) for v in build_model().weights)
    assert distribution_for(None, "context", "data=2,seq=4", shard_weights=False).weight_shard_axis is None


def test_fit_places_token_inputs_split_on_batch_and_sequence():
    distribution = ContextParallel("data=2,seq=4")
    assert distribution.get_data_layout((BATCH, LENGTH)).axes == ("data", "seq")
    assert distribution.get_data_layout((BATCH, LENGTH, 5)).axes == ("data", "seq", None)
    assert distribution.get_data_layout((BATCH,)).axes == ("data",)
    tokens, labels = _tokens(BATCH)
    # Keras' own placement of a fit batch (keras/src/backend/jax/trainer.py).
    from keras.src.backend.jax.trainer import _distribute_data

    keras.distribution.set_distribution(distribution)
    placed_x, placed_y, _ = _distribute_data((tokens, labels, None))
    for array in (placed_x, placed_y):
        assert array.sharding.spec == P("data", "seq")
        assert array.addressable_shards[0].data.shape == (BATCH // 2, LENGTH // 4)


def test_zigzag_pipeline_trains_predicts_and_evaluates_to_the_natural_order_numbers(reference):
    """Balanced ring: ``dataset`` reorders each batch, ``restore_outputs`` undoes it.

    A per-token mean loss is unchanged by the permutation; causality and RoPE follow the
    global positions the attention layer reads from the distribution's balance.
    """
    distribution = ContextParallel("data=2,seq=4", context_attention="ring", balance="zigzag")
    tokens, labels = reference["tokens"], reference["labels"]
    np.testing.assert_array_equal(distribution.prepare(tokens), reorder(tokens, num_shards=4, balance="zigzag"))
    batches = _Batches(tokens, labels)
    model, losses, weights, logits = train(
        distribution, reference["initial"], distribution.dataset(batches), distribution.prepare(tokens[:BATCH])
    )
    assert_matches(reference, losses, weights, distribution.restore_outputs(logits))
    evaluated = model.evaluate(*distribution.prepare(tokens[:BATCH], labels[:BATCH]), batch_size=BATCH, verbose=0)
    np.testing.assert_allclose(evaluated, token_cross_entropy(reference["logits"], labels[:BATCH]), rtol=RTOL)
    # Predicting natural-order tokens under zig-zag gives other numbers: the order matters.
    wrong = model.predict(tokens[:BATCH], batch_size=BATCH, verbose=0)
    assert not np.allclose(distribution.restore_outputs(wrong), reference["logits"], rtol=RTOL, atol=1e-4)


class _Batches(keras.utils.PyDataset):
    def __init__(self, x, y):
        super().__init__()
        self.x, self.y = x, y

    def __len__(self):
        return len(self.x) // BATCH

    def __getitem__(self, index):
        cut = slice(index * BATCH, (index + 1) * BATCH)
        return self.x[cut], self.y[cut]


def test_tensor_parallel_rules_on_a_data_seq_model_mesh(reference):
    """data=2,seq=2,model=2: TP attention rules + ParallelMLP (Megatron sequence parallel
    inside each seq shard, dim 1 split over ('seq', 'model')); same numbers."""
    mesh = make_mesh("data=2,seq=2,model=2")
    layout_map = layouts.build_layout_map(mesh, "tp", layouts.block_rules("tp"))
    distribution = ContextParallel(mesh, layout_map, context_attention="ring")
    tokens, labels = reference["tokens"], reference["labels"]
    build = lambda: build_model(megatron_sp=True)  # noqa: E731
    model, losses, weights, logits = train(distribution, reference["initial"], (tokens, labels), tokens[:BATCH], build)
    assert_matches(reference, losses, weights, logits)
    by_path = {v.path: v.value.sharding.spec for v in model.weights}
    # placed by the layers: heads / features over model, C also over seq (FSDP over seq)
    assert by_path["block/attention/query/kernel"] == P("seq", "model", None)
    assert by_path["block/mlp/up/kernel"] == P("seq", "model")
    assert by_path["block/mlp/down/kernel"] == P("model", "seq")
    assert not distribution.unmatched_rules()


def test_tensor_parallel_activation_specs_keep_the_sequence_split():
    keras.distribution.set_distribution(ContextParallel("data=2,seq=2,model=2"))
    plan = _tensor_parallel.tensor_parallel_plan("model")
    assert (plan.sequence_axis, plan.sequence_size) == ("seq", 2)
    assert _tensor_parallel.activation_spec(plan, 3) == P("data", "seq", None)
    assert _tensor_parallel.activation_spec(plan, 3, features=True) == P("data", "seq", "model")
    assert _tensor_parallel.activation_spec(plan, 3, sequence=True) == P("data", ("seq", "model"), None)
    assert _tensor_parallel.activation_spec(plan, 2, features=True) == P("data", "model")  # (B, C): no sequence
    mlp = ParallelMLP(32, megatron_sp=True, name="mlp")
    with pytest.raises(
        ValueError,
        match=r"ParallelMLP 'mlp': sequence length 6 is not divisible by the 'seq' x 'model' mesh axes of size 2 x 2 = 4",
    ):
        _tensor_parallel.check_input(mlp, plan, (2, 6, 8), sequence=True)
    with pytest.raises(
        ValueError, match=r"ParallelMLP 'mlp': sequence length 5 is not divisible by the 'seq' mesh axis of size 2"
    ):
        _tensor_parallel.check_input(mlp, plan, (2, 5, 8), sequence=False)
    mesh = make_mesh("data=2,model=4")
    keras.distribution.set_distribution(make_distribution("model", mesh, keras.distribution.LayoutMap(mesh)))
    assert _tensor_parallel.activation_spec(_tensor_parallel.tensor_parallel_plan("model"), 3, sequence=True) == P(
        "data", "model", None
    )


# --- how attention layers follow the distribution -----------------------------------------


def _resolve(context_attention, balance, sequence_axis, batch_axis):
    """(kernel, balance, sequence axis, batch axis) of the plan an attention layer with these settings gets."""
    plan = _parallel_plan.resolve_plan(
        context_attention=context_attention, balance=balance, sequence_axis=sequence_axis, batch_axis=batch_axis
    )
    return plan.context_attention, plan.balance, plan.sequence_axis, plan.batch_axis


def test_attention_layers_take_kernel_axes_and_balance_from_the_distribution():
    resolve = _resolve
    keras.distribution.set_distribution(
        ContextParallel(
            "batch=2,context=4",
            batch_dim_name="batch",
            sequence_dim_name="context",
            context_attention="ulysses",
            balance="striped",
        )
    )
    assert resolve(None, None, "seq", "data") == ("ulysses", "striped", "context", "batch")
    assert resolve("gather", "striped", "context", "batch") == (
        "gather",
        "striped",
        "context",
        "batch",
    )  # explicit kernel wins
    with pytest.raises(
        ValueError, match=r"balance='zigzag' conflicts with the ContextParallel distribution's balance='striped'"
    ):
        resolve(None, "zigzag", "seq", "data")
    with pytest.raises(ValueError, match=r"sequence_axis='tokens' conflicts with .* sequence_dim_name='context'"):
        resolve(None, None, "tokens", "data")
    with pytest.raises(ValueError, match=r"batch_axis='rows' conflicts with .* batch_dim_name='batch'"):
        resolve(None, None, "seq", "rows")
    keras.distribution.set_distribution(None)
    assert resolve("ring", "zigzag", "tokens", "rows") == (
        None,
        "zigzag",
        None,
        None,
    )  # no mesh: nothing split, plain attention


def test_a_layer_with_a_conflicting_balance_fails_when_traced():
    keras.distribution.set_distribution(ContextParallel("data=2,seq=4", balance="zigzag"))
    layer = MultiHeadAttention(num_heads=4, head_dim=4, causal=True, balance="striped")
    layer.build((2, 16, 8))
    with pytest.raises(ValueError, match="balance='striped' conflicts"):
        jax.eval_shape(layer, jax.ShapeDtypeStruct((2, 16, 8), "float32"))  # traced, nothing compiled


def test_describe_says_what_each_layer_runs():
    """Kernel, axes and collectives per layer; a recorded kernel keeps running under another
    ContextParallel, and runs plain attention where the mesh has no sequence axis."""
    keras.distribution.set_distribution(ContextParallel("data=2,seq=4", context_attention="gather"))
    gather = build_model()
    assert describe(gather) == [
        "block/attention: gather attention over seq (4), K/V all-gather per call",
        "block/mlp: plain MLP, GSPMD (no 'model' axis to split over)",
    ]
    keras.distribution.set_distribution(ContextParallel("data=2,seq=4", context_attention="ring", balance="zigzag"))
    assert (
        describe(build_model())[0]
        == "block/attention: ring attention over seq (4), K/V ppermute x3 per call, zigzag order"
    )
    assert (
        describe(gather)[0] == "block/attention: gather attention over seq (4), K/V all-gather per call, zigzag order"
    )
    mesh = make_mesh("data=2,model=4")
    keras.distribution.set_distribution(make_distribution("model", mesh, keras.distribution.LayoutMap(mesh)))
    megatron = "one all-gather and one reduce-scatter over the sequence per call"
    assert describe(build_model(megatron_sp=True)) == [
        f"block/attention: tensor-parallel attention over model (4), 1 of 4 heads per device, {megatron}",
        f"block/mlp: tensor-parallel MLP over model (4), 8 of 32 hidden features per device, {megatron}",
    ]
    keras.distribution.set_distribution(keras.distribution.DataParallel())
    assert describe(gather)[0] == (
        "block/attention: plain attention, no collective (context_attention 'gather' runs only over a 'seq' mesh axis of size > 1)"
    )


# --- errors --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "options, shape, message",
    [
        (
            {},
            (8, 30),
            r"sequence length \(dim 1 of input shape \(8, 30\)\) 30 is not divisible by the 'seq' mesh axis of size 4",
        ),
        ({"balance": "zigzag"}, (8, 36), r"36 is not divisible by 2 x the 'seq' mesh axis of size 4 = 8"),
        ({}, (3, 32), r"batch size 3 is not divisible by the 'data' mesh axis of size 2"),
    ],
)
def test_shapes_that_do_not_split_are_rejected_at_data_layout_time(options, shape, message):
    with pytest.raises(ValueError, match=message):
        ContextParallel("data=2,seq=4", **options).get_data_layout(shape)


def test_bad_meshes_and_options_are_rejected():
    with pytest.raises(MeshError, match=r"mesh data=8 has axes \['data'\] \(missing \['seq'\]\)"):
        ContextParallel("data=8")
    with pytest.raises(
        MeshError,
        match=r"layout 'context' needs mesh axes \['data', 'seq'\], but the mesh data=2,model=4 has no \['seq'\]",
    ):
        make_distribution("context", "data=2,model=4")
    with pytest.raises(
        ValueError, match=r"context_attention must be one of \('gather', 'ring', 'ulysses'\), got 'flash'"
    ):
        ContextParallel("data=2,seq=4", context_attention="flash")
    with pytest.raises(ValueError, match=r"balance must be one of"):
        ContextParallel("data=2,seq=4", balance="spiral")
    with pytest.raises(ValueError, match="layout map was built for mesh data=2,seq=4, not for the mesh data=4,seq=2"):
        ContextParallel("data=4,seq=2", keras.distribution.LayoutMap(make_mesh("data=2,seq=4")))


# --- strategies -----------------------------------------------------------------------------


class _Transformer:
    """Stands in for a Transformer model class: ``get_layout_map(mesh, layout=...)``."""

    calls = []

    @classmethod
    def get_layout_map(cls, mesh, layout="tp", config=None):
        cls.calls.append(layout)
        return layouts.build_layout_map(mesh, layout, layouts.block_rules(layout, mesh=mesh))


class _Cnn:
    @classmethod
    def get_layout_map(cls, mesh):
        return keras.distribution.LayoutMap(mesh)


def test_context_layout_and_the_transformer_layouts():
    context = make_distribution("context", balance="zigzag")
    assert isinstance(context, ContextParallel) and context.balance == "zigzag" and context.context_attention == "ring"
    assert dict(zip(context.device_mesh.axis_names, context.device_mesh.shape)) == {
        "data": 2,
        "seq": len(jax.devices()) // 2,
    }
    _Transformer.calls.clear()
    with_tp = distribution_for(_Transformer, "context", "data=2,seq=2,model=2", context_attention="ulysses")
    assert with_tp.context_attention == "ulysses" and "model" in with_tp.device_mesh.axis_names
    assert distribution_for(_Transformer, "context", "data=2,seq=4").layout_map.keys() == set()
    fsdp = distribution_for(_Transformer, "fsdp", "data=8")
    assert fsdp.layout_map[r".*attention/output/kernel"].axes == (None, None, "data") and fsdp.weight_shard_axis is None
    for layout in ("tp", "tp+sp", "fsdp+tp"):  # the blocks' layers place their own weights: no block rule
        distribution = distribution_for(_Transformer, layout, "data=2,model=4")
        assert distribution.layout_map[r".*attention/output/kernel"] is None
        assert distribution.weight_shard_axis == ("data" if layout == "fsdp+tp" else None)
    assert _Transformer.calls == ["tp", "fsdp", "tp", "tp+sp", "fsdp+tp"]
    with pytest.raises(ValueError, match=r"layout 'tp' needs _Cnn.get_layout_map\(mesh, layout=...\)"):
        distribution_for(_Cnn, "tp", "data=2,model=4")
    with pytest.raises(ValueError, match="are options of layout 'context' .*, not of 'data'"):
        make_distribution("data", "data=8", balance="zigzag")
    with pytest.raises(
        ValueError,
        match=r"choose one of \['single', 'data', 'model'\] or, .* \['fsdp', 'tp', 'tp\+sp', 'fsdp\+tp', 'context', 'pipeline', 'expert', 'fsdp\+expert', 'expert\+tp'\]",
    ):
        make_distribution("zero")
