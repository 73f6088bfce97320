"""ColumnParallelDense, RowParallelDense and ParallelMLP: parity, placement, communication, LoRA.

Every distributed run is checked against the same layer built without a distribution
(the same weights copied in): outputs and gradients with respect to the inputs and
every trainable weight, on meshes data=2,model=4 and data=1,model=8, and with FSDP
inside TP (``fsdp+tp``: kernels also split over data, gathered just in time).
"""

import functools

import jax
import keras
import numpy as np
import pytest

from tests.layers.harness import check_layer_contract
from zoo.distribution import CheckedModelParallel, LayoutError, make_mesh
from zoo.distribution.parity import check_parity
from zoo.layers._parallel_plan import program_cache_info
from zoo.layers._quantized import weight_only_config
from zoo.layers._tensor_parallel_attention import AttentionProjection
from zoo.layers.column_parallel_dense import ColumnParallelDense
from zoo.layers.parallel_mlp import ParallelMLP
from zoo.layers.row_parallel_dense import RowParallelDense
from zoo.measure.comms_report import FAST_COMPILE, layer_comms_report

B, T, D, F = 4, 16, 8, 32  # batch, sequence, model width, hidden features
MESHES = ["data=2,model=4", "data=1,model=8"]


def tensor_parallel(mesh_spec, fsdp=False):
    """ModelParallel over ``mesh_spec`` with no layout rules: the layers place their own
    weights (with ``fsdp``, also split over data: ``fsdp+tp``'s ``weight_shard_axis``)."""
    mesh = make_mesh(mesh_spec)
    return CheckedModelParallel(
        layout_map=keras.distribution.LayoutMap(mesh), batch_dim_name="data", weight_shard_axis="data" if fsdp else None
    )


def inputs(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype("float32")


def build(make_layer, x_shape, distribution=None, weights=None, lora_rank=None):
    """A built layer under ``distribution`` (set globally, and left set)."""
    keras.distribution.set_distribution(distribution)
    keras.utils.set_random_seed(0)
    layer = make_layer()
    layer.build(x_shape)
    if lora_rank:
        layer.enable_lora(lora_rank)
    if weights is not None:
        layer.set_weights(weights)
    return layer


def output_and_grads(layer, x, cotangent):
    """(out, d trainable weights, d x) of sum(layer(x) * cotangent), x placed as fit places it."""
    distribution = keras.distribution.distribution()
    if distribution is not None:
        x = keras.distribution.distribute_tensor(x, distribution.get_data_layout(x.shape))
    trainable = [v.value for v in layer.trainable_variables]
    non_trainable = [v.value for v in layer.non_trainable_variables]

    @functools.partial(jax.jit, compiler_options=FAST_COMPILE)
    def run(trainable, x, cotangent):
        out, pullback = jax.vjp(lambda t, x: layer.stateless_call(t, non_trainable, x)[0], trainable, x)
        return out, *pullback(cotangent)

    return jax.tree.map(np.asarray, run(trainable, x, cotangent))


def assert_same(got, expected, names):
    np.testing.assert_allclose(got[0], expected[0], rtol=1e-5, atol=1e-5, err_msg="output")
    np.testing.assert_allclose(got[2], expected[2], rtol=1e-5, atol=1e-5, err_msg="d input")
    for name, g, e in zip(names, got[1], expected[1]):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=2e-5, err_msg=f"d {name}")


LAYERS = {
    "column": (lambda: ColumnParallelDense(F, activation="relu", name="up"), (B, T, D)),
    "column-sp": (lambda: ColumnParallelDense(F, megatron_sp=True, name="up"), (B, T, D)),
    # Exact GELU (erf): JAX 0.12 cannot differentiate it inside a shard_map body.
    "column-gelu": (lambda: ColumnParallelDense(F, activation="gelu", name="up"), (B, T, D)),
    "row": (lambda: RowParallelDense(D, activation="tanh", name="down"), (B, T, F)),
    "row-sp": (lambda: RowParallelDense(D, megatron_sp=True, name="down"), (B, T, F)),
    "mlp": (lambda: ParallelMLP(F, name="mlp"), (B, T, D)),
    "gated-mlp": (lambda: ParallelMLP(F, gated=True, activation="silu", name="mlp"), (B, T, D)),
    "gated-mlp-sp": (lambda: ParallelMLP(F, gated=True, megatron_sp=True, name="mlp"), (B, T, D)),
    "mlp-sp-collective": (lambda: ParallelMLP(F, megatron_sp=True, collective_matmul=True, name="mlp"), (B, T, D)),
}


@functools.cache
def reference(kind):
    """(weights, x, cotangent, (out, grads, dx)) of the layer on one device."""
    make_layer, shape = LAYERS[kind]
    layer = build(make_layer, shape)
    x = inputs(shape, 1)
    cotangent = inputs(layer.compute_output_shape(shape), 2)
    return layer.get_weights(), x, cotangent, output_and_grads(layer, x, cotangent)


@pytest.mark.parametrize("mesh", MESHES)
@pytest.mark.parametrize("kind", sorted(LAYERS))
def test_outputs_and_gradients_match_one_device(kind, mesh):
    make_layer, shape = LAYERS[kind]
    weights, x, cotangent, expected = reference(kind)
    layer = build(make_layer, shape, tensor_parallel(mesh), weights)
    assert_same(output_and_grads(layer, x, cotangent), expected, [v.path for v in layer.trainable_variables])


MLP_SPECS = {
    "mlp/gate/kernel": (None, "model"),
    "mlp/gate/bias": ("model",),
    "mlp/up/kernel": (None, "model"),
    "mlp/up/bias": ("model",),
    "mlp/down/kernel": ("model", None),
    "mlp/down/bias": (None,),
    "mlp/gate/lora_kernel_a": (None, None),
    "mlp/gate/lora_kernel_b": (None, "model"),
    "mlp/up/lora_kernel_a": (None, None),
    "mlp/up/lora_kernel_b": (None, "model"),
    "mlp/down/lora_kernel_a": ("model", None),
    "mlp/down/lora_kernel_b": (None, None),
}


@pytest.mark.parametrize("mesh", MESHES)
def test_every_weight_is_placed_as_the_kernels_slice_it(mesh):
    layer = build(lambda: ParallelMLP(F, gated=True, name="mlp"), (B, T, D), tensor_parallel(mesh), lora_rank=2)
    model_size = int(mesh.split("model=")[1])
    assert {v.path: tuple(v.value.sharding.spec) for v in layer.weights} == MLP_SPECS
    shards = {s.data.shape for s in layer.up._kernel.value.addressable_shards}
    assert shards == {(D, F // model_size)}
    assert {s.data.shape for s in layer.down._kernel.value.addressable_shards} == {(F // model_size, D)}


def test_without_a_model_axis_they_are_plain_dense_layers():
    x = inputs((B, T, D), 3)
    dense = keras.layers.Dense(F, activation="gelu")
    expected = np.asarray(dense(x))
    column = ColumnParallelDense(F, activation="gelu")
    column.build(x.shape)
    column.set_weights(dense.get_weights())
    np.testing.assert_array_equal(np.asarray(column(x)), expected)
    # DataParallel: the mesh has no 'model' axis; weights replicated, same numbers.
    keras.distribution.set_distribution(keras.distribution.DataParallel(device_mesh=make_mesh("data=8")))
    row = RowParallelDense(D)
    row.build((8, F))
    assert tuple(row._kernel.value.sharding.spec) in ((), (None, None))
    h = inputs((8, F), 4)
    np.testing.assert_allclose(
        np.asarray(row(h)), h @ row.get_weights()[0] + row.get_weights()[1], rtol=1e-5, atol=1e-5
    )


def test_model_axis_of_size_one_is_plain_dense():
    distribution = CheckedModelParallel(
        layout_map=keras.distribution.LayoutMap(make_mesh("data=8,model=1")), batch_dim_name="data"
    )
    layer = build(lambda: ParallelMLP(F, name="mlp"), (8, T, D), distribution)
    assert all(all(e is None for e in v.value.sharding.spec) for v in layer.weights)
    x = inputs((8, T, D), 5)
    assert np.asarray(layer(x)).shape == (8, T, D)


def test_a_second_call_reuses_the_cached_shard_maps():
    """The jitted shard_maps are kept per (body, mesh, specs, settings): a second trace hits both."""
    layer = build(lambda: ParallelMLP(F, name="mlp"), (B, T, D), tensor_parallel("data=2,model=4"))
    values, x = [v.value for v in layer.trainable_variables], inputs((B, T, D), 3)
    trace = lambda: jax.make_jaxpr(lambda v, x: layer.stateless_call(v, [], x)[0])(values, x)  # noqa: E731
    trace()
    before = program_cache_info()
    trace()
    after = program_cache_info()
    assert (after.hits, after.misses) == (before.hits + 2, before.misses)  # the up and the down shard_map


# --- FSDP inside tensor parallelism (fsdp+tp) --------------------------------------------

FSDP_KINDS = ["column", "row-sp", "gated-mlp", "mlp-sp-collective"]


@pytest.mark.parametrize("kind", FSDP_KINDS)
def test_fsdp_inside_tensor_parallelism_matches_one_device(kind):
    make_layer, shape = LAYERS[kind]
    weights, x, cotangent, expected = reference(kind)
    layer = build(make_layer, shape, tensor_parallel("data=2,model=4", fsdp=True), weights)
    assert_same(output_and_grads(layer, x, cotangent), expected, [v.path for v in layer.trainable_variables])


def test_fsdp_splits_kernels_over_data_and_reduce_scatters_their_gradients():
    layer = build(
        lambda: ParallelMLP(F, gated=True, name="mlp"),
        (B, T, D),
        tensor_parallel("data=2,model=4", fsdp=True),
        lora_rank=2,
    )
    specs = {v.path: tuple(v.value.sharding.spec) for v in layer.weights}
    assert specs == MLP_SPECS | {
        "mlp/gate/kernel": ("data", "model"),
        "mlp/up/kernel": ("data", "model"),
        "mlp/down/kernel": ("model", "data"),
    }
    assert {s.data.shape for s in layer.up._kernel.value.addressable_shards} == {(D // 2, F // 4)}
    fresh = build(
        lambda: ParallelMLP(F, gated=True, name="mlp"), (B, T, D), tensor_parallel("data=2,model=4", fsdp=True)
    )
    report = layer_comms_report(fresh, inputs((B, T, D), 7), backward=True, compiler_options=FAST_COMPILE)
    shard = D // 2 * F // 4  # elements of one kernel's (D/2, F/4) shard
    assert report.buffers("all-gather", "data") == 3  # each kernel gathered once, just in time
    assert report.buffers("reduce-scatter", "data") == 3 and {
        op.elements for op in report.select("reduce-scatter", "data")
    } == {2 * shard}
    # only the biases' gradients are all-reduced over data, never a kernel's
    assert all(op.elements <= 2 * F // 4 + D for op in report.select("all-reduce", "data")), "\n".join(report.format())


# --- a mesh axis of size 1 splits nothing and communicates nothing ---------------------------


def test_a_data_axis_of_size_one_emits_no_collective():
    for fsdp in (False, True):  # not even the weight gather of fsdp+tp over data=1
        layer = build(
            lambda: ParallelMLP(F, gated=True, name="mlp"), (B, T, D), tensor_parallel("data=1,model=8", fsdp=fsdp)
        )
        report = layer_comms_report(layer, inputs((B, T, D), 7), backward=True, compiler_options=FAST_COMPILE)
        assert all(op.group_size > 1 for op in report.collectives), "\n".join(report.format())
        assert {op.axes for op in report.collectives} == {("model",)}


# --- errors that name the numbers -----------------------------------------------------


@pytest.mark.parametrize(
    "make_layer, shape, message",
    [
        (
            lambda: ColumnParallelDense(30, name="up"),
            (B, T, D),
            "ColumnParallelDense 'up': units 30 is not divisible by the 'model' mesh axis of size 4",
        ),
        (
            lambda: RowParallelDense(D, name="down"),
            (B, T, 30),
            "RowParallelDense 'down': input features 30 is not divisible by the 'model' mesh axis of size 4",
        ),
        (
            lambda: ParallelMLP(30, name="mlp"),
            (B, T, D),
            "units 30 is not divisible by the 'model' mesh axis of size 4",
        ),
    ],
)
def test_features_that_do_not_split_are_rejected_at_build(make_layer, shape, message):
    with pytest.raises(ValueError, match=message):
        build(make_layer, shape, tensor_parallel("data=2,model=4"))


def test_a_sequence_that_does_not_split_is_rejected_and_a_batch_that_does_not_runs_whole():
    """A sequence that does not divide the model axis (megatron_sp) is refused, naming it; a
    batch that does not divide 'data' (3 rows, a few prompts decoding) runs whole on every
    device, to the plain layer's numbers."""
    layer = build(lambda: ParallelMLP(F, megatron_sp=True, name="mlp"), (B, 10, D), tensor_parallel("data=2,model=4"))
    with pytest.raises(
        ValueError, match="ParallelMLP 'mlp': sequence length 10 is not divisible by the 'model' mesh axis of size 4"
    ):
        layer(inputs((B, 10, D), 6))
    x = inputs((3, T, D), 6)
    split = np.asarray(layer(x))
    keras.distribution.set_distribution(None)
    np.testing.assert_allclose(split, np.asarray(layer(x)), rtol=1e-5, atol=1e-6)


def test_bad_options_are_rejected():
    with pytest.raises(ValueError, match="collective_matmul .* needs megatron_sp=True"):
        ColumnParallelDense(F, collective_matmul=True)
    with pytest.raises(ValueError, match="collective_matmul needs megatron_sp=True"):
        ParallelMLP(F, collective_matmul=True)


# --- quantized kernels: each device dequantizes its own shard ----------------------------


def _quantized(make, x_shape, mode, distribution=None, weights=None):
    """``make()`` built (with ``weights``, float), quantized to ``mode`` for its weights alone, LoRA
    of rank 2 on it with random factors (seeded: the same on every build), under ``distribution``."""
    layer = build(make, x_shape, distribution, weights=weights)
    layer.quantize(mode, config=weight_only_config(mode))
    layer.enable_lora(2)
    rng = np.random.default_rng(3)
    for variable in layer.trainable_variables:
        variable.assign(0.1 * rng.standard_normal(variable.shape).astype("float32"))
    return layer


QUANTIZED = {  # row: 1,024 input rows over model=4, two of int4's blocks of 128 rows on each device
    "column": (lambda: ColumnParallelDense(512, name="up"), (B, T, 256), (B, T, 512)),
    "row": (lambda: RowParallelDense(256, name="down"), (B, T, 1024), (B, T, 256)),
    "query": (
        lambda: AttentionProjection("btc,chd->bthd", role="heads_out", output_shape=(None, 8, 32), name="query"),
        (B, T, 256),
        (B, T, 8, 32),
    ),
}


@pytest.mark.parametrize(
    "kind, mode, fsdp",
    [("row", "int4", False), ("column", "int4", True), ("column", "int8", False), ("query", "int8", True)],
)
def test_a_quantized_kernel_split_over_devices_computes_the_one_device_layer(kind, mode, fsdp):
    """A quantized layer under tp (fsdp+tp with ``fsdp``) against the same quantized layer on one
    device: the output, d(input) and the LoRA factors' gradients. Each quantized weight is split
    as the float kernel's shard (int4's scales with their row blocks where they split whole)."""
    make, x_shape, y_shape = QUANTIZED[kind]
    float_weights = build(make, x_shape).get_weights()
    reference = _quantized(make, x_shape, mode, weights=float_weights)
    x, cotangent = inputs(x_shape, 1), inputs(y_shape, 2)
    expected = output_and_grads(reference, x, cotangent)
    layer = _quantized(make, x_shape, mode, tensor_parallel("data=2,model=4", fsdp=fsdp), float_weights)
    split = {v.name: tuple(v.value.sharding.spec) for v in layer.weights}
    assert "model" in split["kernel"] and ("data" in split["kernel"]) == fsdp
    if kind == "row":  # int4 (1024, 128) packed: rows over model, each shard two blocks of 128 rows
        assert split["kernel_scale"] == ("model", None) and split["g_idx"] == ("model",)
    got = output_and_grads(layer, x, cotangent)
    assert_same(got, expected, [v.name for v in layer.trainable_variables])
    assert np.abs(expected[0]).max() > 1  # not a vacuous comparison


def test_int4_columns_that_split_into_half_bytes_are_refused_by_name():
    """int4 packs two columns a byte: 12 columns over model=4 leave 3 a device (1.5 bytes a row)."""
    with pytest.raises(ValueError, match=r"'up': int4 packs two columns a byte, and its 12 columns \(6 bytes a row\) "):
        _quantized(lambda: ColumnParallelDense(12, name="up"), (B, T, 256), "int4", tensor_parallel("data=2,model=4"))


# --- communication, read from the compiled programs --------------------------------------


def _mlp_report(mesh, backward=False, **options):
    layer = build(lambda: ParallelMLP(F, name="mlp", **options), (B, T, D), tensor_parallel(mesh))
    return layer_comms_report(layer, inputs((B, T, D), 7), backward=backward, compiler_options=FAST_COMPILE)


@pytest.mark.parametrize("mesh", MESHES)
def test_mlp_forward_is_one_all_reduce_of_the_output(mesh):
    report = _mlp_report(mesh)
    local = B // int(mesh.split(",")[0].split("=")[1]) * T * D  # elements of (B/data, T, D)
    assert [(op.kind, op.axes, op.buffers, op.elements, op.bytes) for op in report.collectives] == [
        ("all-reduce", ("model",), 1, local, 4 * local)
    ], "\n".join(report.format())


def test_mlp_backward_adds_only_the_transpose_and_the_data_parallel_gradient_sum():
    report = _mlp_report("data=2,model=4", backward=True)
    local = B // 2 * T * D
    model_ops = report.select(axes="model")
    assert {op.kind for op in model_ops} == {"all-reduce"}, "\n".join(report.format())
    # forward output + d(input): two (B/2, T, D) buffers (XLA may combine them into one op)
    assert report.buffers("all-reduce", "model") == 2 and report.total_bytes(axes="model") == 2 * 4 * local
    assert {op.kind for op in report.select(axes="data")} == {"all-reduce"}  # weight gradients over data
    assert report.count() == report.count(axes="model") + report.count(axes="data")


def test_megatron_sp_mlp_is_one_all_gather_and_one_reduce_scatter():
    forward = _mlp_report("data=2,model=4", megatron_sp=True)
    local = B // 2 * T * D
    rows = sorted((op.kind, op.axes, op.buffers, op.elements) for op in forward.collectives)
    assert rows == [("all-gather", ("model",), 1, local), ("reduce-scatter", ("model",), 1, local)], "\n".join(
        forward.format()
    )
    both = _mlp_report("data=2,model=4", backward=True, megatron_sp=True)
    assert both.buffers("all-gather", "model") == 2 and both.buffers("reduce-scatter", "model") == 2
    assert both.total_bytes(axes="model") == 4 * 4 * local
    assert both.count("all-reduce", "model") == 0
    # the replicated down bias sums its gradient over every token: all devices, D floats
    assert [op.elements for op in both.select(axes=("data", "model"))] == [D]


def test_collective_matmul_replaces_the_gather_and_scatter_by_ring_hops():
    report = _mlp_report("data=2,model=4", megatron_sp=True, collective_matmul=True)
    hop = B // 2 * T // 4 * D
    assert report.count("collective-permute", "model") == 2 * 3 and report.count() == 6, "\n".join(report.format())
    assert {op.elements for op in report.collectives} == {hop}
    # the same bytes leave each device as with all-gather + reduce-scatter
    assert report.sent_bytes() == pytest.approx(_mlp_report("data=2,model=4", megatron_sp=True).sent_bytes())


# --- LoRA -------------------------------------------------------------------------------


def _lora_mlp(distribution, weights=None):
    layer = build(lambda: ParallelMLP(F, gated=True, name="mlp"), (B, T, D), distribution, lora_rank=2)
    if weights is not None:
        layer.set_weights(weights)
    return layer


@functools.cache
def _lora_reference():
    layer = _lora_mlp(None)
    for sub in layer.projections:  # LoRA B starts at zero; make the update count
        sub.lora_kernel_b.assign(inputs(sub.lora_kernel_b.shape, 8) * 0.1)
    x, cotangent = inputs((B, T, D), 9), inputs((B, T, D), 10)
    return layer.get_weights(), x, cotangent, output_and_grads(layer, x, cotangent)


def test_lora_freezes_kernels_and_trains_only_the_factors_and_biases():
    layer = _lora_mlp(tensor_parallel("data=2,model=4"))
    trainable = sorted(v.path for v in layer.trainable_variables)
    assert trainable == sorted(
        [f"mlp/{p}/{w}" for p in ("gate", "up", "down") for w in ("bias", "lora_kernel_a", "lora_kernel_b")]
    )
    r = 2
    assert sum(int(np.prod(v.shape)) for v in layer.trainable_variables) == 2 * (D * r + r * F + F) + (
        F * r + r * D + D
    )
    assert {v.path for v in layer.non_trainable_variables} == {f"mlp/{p}/kernel" for p in ("gate", "up", "down")}


@pytest.mark.parametrize("mesh", MESHES)
def test_lora_under_model_parallel_matches_one_device(mesh):
    weights, x, cotangent, expected = _lora_reference()
    layer = _lora_mlp(tensor_parallel(mesh), weights)
    assert_same(output_and_grads(layer, x, cotangent), expected, [v.path for v in layer.trainable_variables])


def test_lora_keeps_the_forward_at_one_all_reduce():
    layer = _lora_mlp(tensor_parallel("data=2,model=4"))
    report = layer_comms_report(layer, inputs((B, T, D), 11), compiler_options=FAST_COMPILE)
    assert [(op.kind, op.axes) for op in report.collectives] == [("all-reduce", ("model",))]


def test_greedy_layout_rules_cannot_capture_lora_factors():
    """keras-team/keras#19496: a rule written for kernels also matched ``lora_kernel_a``."""
    mesh = make_mesh("data=2,model=4")
    layout_map = keras.distribution.LayoutMap(mesh)
    layout_map[r".*kernel.*"] = (None, "model")  # meant for head/kernel (D, 8)
    keras.distribution.set_distribution(CheckedModelParallel(layout_map=layout_map, batch_dim_name="data"))
    inputs_ = keras.Input((T, D))
    mlp = ParallelMLP(F, gated=True, name="mlp")
    head = keras.layers.Dense(8, name="head")
    model = keras.Model(inputs_, head(mlp(inputs_)))
    mlp.enable_lora(2)
    specs = {v.path: tuple(v.value.sharding.spec) for v in mlp.weights}
    assert specs == MLP_SPECS
    assert tuple(head.kernel.value.sharding.spec) == (None, "model")
    # fit trains the factors in place: frozen kernels, factors moved and still placed as before
    kernel = np.asarray(mlp.up._kernel.value)
    lora_b = np.asarray(mlp.up.lora_kernel_b.value)
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    model.fit(inputs((B, T, D), 13), inputs((B, T, 8), 14), batch_size=B, epochs=1, verbose=0)
    np.testing.assert_array_equal(np.asarray(mlp.up._kernel.value), kernel)
    assert not np.array_equal(np.asarray(mlp.up.lora_kernel_b.value), lora_b)
    assert {v.path: tuple(v.value.sharding.spec) for v in mlp.weights} == MLP_SPECS
    # The same rule on a plain Dense layer puts (None, 'model') on lora_kernel_a (D, 2).
    with pytest.raises(LayoutError, match=r"lora_kernel_a' \(8, 2\).*dimension 1 of size 2 is not divisible"):
        head.enable_lora(2)


# --- the shared layer harness, and fit -----------------------------------------------------


HARNESS_CASES = [
    (
        ColumnParallelDense,
        {"units": F, "activation": "relu", "megatron_sp": True, "model_axis": "model"},
        (B, T, D),
        (B, T, F),
        2,
    ),
    (
        RowParallelDense,
        {"units": D, "use_bias": False, "megatron_sp": True, "collective_matmul": True},
        (B, T, F),
        (B, T, D),
        1,
    ),
    (
        ParallelMLP,
        {"hidden_dim": F, "output_dim": 4, "gated": True, "activation": "silu", "megatron_sp": True},
        (B, T, D),
        (B, T, 4),
        6,
    ),
]


# Under the distribution the collective row layer is left out: its ring compiles slowly,
# and the parity tests above cover it.
@pytest.mark.parametrize(
    "layer_cls, init_kwargs, input_shape, output_shape, num_trainable, mesh",
    [(*case, None) for case in HARNESS_CASES]
    + [(*case, "data=2,model=4") for case in HARNESS_CASES if "collective_matmul" not in case[1]],
    ids=lambda v: v.__name__ if isinstance(v, type) else None,
)
def test_layer_harness(layer_cls, init_kwargs, input_shape, output_shape, num_trainable, mesh, tmp_path):
    keras.distribution.set_distribution(None if mesh is None else tensor_parallel(mesh))
    check_layer_contract(
        layer_cls,
        init_kwargs=init_kwargs,
        input_shape=input_shape,
        expected_output_shape=output_shape,
        expected_num_trainable_weights=num_trainable,
        save_dir=tmp_path,
    )


def test_lora_mlp_saves_and_reloads_with_its_update_merged(tmp_path):
    weights, x, _, expected = _lora_reference()
    keras.distribution.set_distribution(None)
    model = keras.Sequential([keras.Input((T, D)), ParallelMLP(F, gated=True, lora_rank=2, name="mlp")])
    model.get_layer("mlp").set_weights(weights)
    model.save(tmp_path / "mlp.keras")
    loaded = keras.saving.load_model(tmp_path / "mlp.keras", safe_mode=True)
    assert loaded.get_layer("mlp").get_config()["lora_rank"] == 2
    np.testing.assert_allclose(np.asarray(loaded(x)), expected[0], rtol=1e-5, atol=1e-5)


def test_two_fit_steps_match_one_device():
    rng = np.random.default_rng(12)
    x, y = rng.standard_normal((16, T, D)).astype("float32"), rng.standard_normal((16, T, D)).astype("float32")

    def build_model():
        return keras.Sequential(
            [keras.Input((T, D)), ParallelMLP(F, gated=True, megatron_sp=True, name="mlp")], name="tp"
        )

    def compile_model(model):
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss=keras.losses.MeanSquaredError())

    report = check_parity(build_model, compile_model, tensor_parallel("data=2,model=4"), x, y, steps=2, batch_size=8)
    assert report.passed, "\n".join(report.format())
    assert report.reference_losses[0] != report.reference_losses[1]
