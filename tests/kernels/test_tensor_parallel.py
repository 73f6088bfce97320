"""Tensor-parallel kernels match single-device dense layers: outputs and gradients.

Each kernel runs inside ``jax.shard_map`` on meshes data=2,model=4 and data=1,model=8
(the batch split over ``data``, features or the sequence over ``model``); its output
and the gradients of sum(output * cotangent) with respect to the input, kernels and
biases must match ``dense_reference`` / ``mlp_reference`` on one device. On a model
axis of one device (data=4,model=1) the kernels emit no collective at all.
"""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from tests.kernels._harness import FAST_COMPILE
from zoo.kernels import (
    all_gather_matmul,
    check_divisible,
    column_parallel_matmul,
    dense_reference,
    matmul_reduce_scatter,
    mlp_reference,
    row_parallel_matmul,
    sequence_parallel_column_matmul,
    sequence_parallel_row_matmul,
    tensor_parallel_mlp,
)
from zoo.measure.comms_report import parse_collectives

B, T, D, F = 4, 16, 8, 32  # batch, sequence, model width, hidden features
MESHES = {"data2-model4": (2, 4), "data1-model8": (1, 8)}
SIZE_ONE = {"data4-model1": (4, 1)}  # a model axis of one device
X, XSEQ = P("data", None, None), P("data", "model", None)  # (B, T, D): replicated / sequence-split over model
XFEAT = P("data", None, "model")  # (B, T, F) split on features
COL, ROW = P(None, "model"), P("model", None)  # kernels [D, F] / [F, D]


def mesh_of(name):
    data, model = (MESHES | SIZE_ONE)[name]
    return Mesh(np.array(jax.devices()[: data * model]).reshape(data, model), ("data", "model"))


def _normal(key, shape, scale=1.0):
    return scale * jax.random.normal(jax.random.key(key), shape, jnp.float32)


def output_and_grads(f, args, cotangent):
    """(out, d args...) of sum(f(*args) * cotangent), jitted."""

    @functools.partial(jax.jit, compiler_options=FAST_COMPILE)
    def both(args, cotangent):
        out, pullback = jax.vjp(f, *args)
        return (out, *pullback(cotangent))

    return jax.tree.map(np.asarray, both(args, cotangent))


def assert_matches(actual, expected, names):
    for name, a, e in zip(names, actual, expected):
        np.testing.assert_allclose(a, e, rtol=1e-5, atol=2e-5, err_msg=name)


def sharded(body, mesh_name, in_specs, out_specs):
    return jax.shard_map(body, mesh=mesh_of(mesh_name), in_specs=in_specs, out_specs=out_specs)


# (name, body(x, w, b), x shape, w shape, x spec, w spec, b spec, out spec)
DENSE_CASES = {
    "column": (lambda x, w, b: column_parallel_matmul(x, w, axis_name="model", bias=b), (B, T, D), (D, F), X, COL, P("model"), XFEAT),
    "row": (lambda x, w, b: row_parallel_matmul(x, w, axis_name="model", bias=b), (B, T, F), (F, D), XFEAT, ROW, P(), X),
    "row-scatter": (
        lambda x, w, b: row_parallel_matmul(x, w, axis_name="model", bias=b, scatter_axis=1), (B, T, F), (F, D), XFEAT, ROW, P(), XSEQ,
    ),
    "sp-column": (lambda x, w, b: sequence_parallel_column_matmul(x, w, axis_name="model", bias=b), (B, T, D), (D, F), XSEQ, COL, P("model"), XFEAT),
    "sp-row": (lambda x, w, b: sequence_parallel_row_matmul(x, w, axis_name="model", bias=b), (B, T, F), (F, D), XFEAT, ROW, P(), XSEQ),
    "collective-column": (
        lambda x, w, b: sequence_parallel_column_matmul(x, w, axis_name="model", bias=b, collective=True), (B, T, D), (D, F), XSEQ, COL, P("model"), XFEAT,
    ),
    "collective-row": (
        lambda x, w, b: sequence_parallel_row_matmul(x, w, axis_name="model", bias=b, collective=True), (B, T, F), (F, D), XFEAT, ROW, P(), XSEQ,
    ),
}  # fmt: skip


# Every kernel on data=2,model=4; on data=1,model=8 all but the ring versions (they
# compile slowly; the next tests and the layer tests run them on 8 devices).
DENSE_PAIRS = [(c, "data2-model4") for c in sorted(DENSE_CASES)] + [
    (c, "data1-model8") for c in sorted(DENSE_CASES) if not c.startswith("collective")
]


@pytest.mark.parametrize("case, mesh_name", DENSE_PAIRS)
def test_dense_kernels_match_one_device(case, mesh_name):
    body, x_shape, w_shape, x_spec, w_spec, b_spec, out_spec = DENSE_CASES[case]
    x, w, b = _normal(1, x_shape), _normal(2, w_shape, 0.3), _normal(3, w_shape[1:])
    cotangent = _normal(4, x_shape[:-1] + w_shape[1:])
    f = sharded(body, mesh_name, (x_spec, w_spec, b_spec), out_spec)
    expected = output_and_grads(lambda x, w, b: dense_reference(x, w, bias=b), (x, w, b), cotangent)
    assert_matches(output_and_grads(f, (x, w, b), cotangent), expected, ["out", "dx", "dkernel", "dbias"])


MLP_MODES = {"tp": (False, False), "sp": (True, False), "collective": (True, True)}
# Each mode, plain and gated, each mesh: a covering selection (the layer tests add more).
MLP_CASES = [
    ("tp", True, "data2-model4"),
    ("tp", False, "data1-model8"),
    ("sp", True, "data1-model8"),
    ("sp", False, "data2-model4"),
    ("collective", True, "data2-model4"),
]


@pytest.mark.parametrize("mode, gated, mesh_name", MLP_CASES)
def test_mlp_matches_one_device(mode, gated, mesh_name):
    sequence_parallel, collective = MLP_MODES[mode]
    x, cotangent = _normal(5, (B, T, D)), _normal(6, (B, T, D))
    weights = {
        "up_kernel": _normal(7, (D, F), 0.3),
        "down_kernel": _normal(8, (F, D), 0.2),
        "up_bias": _normal(9, (F,)),
        "down_bias": _normal(10, (D,)),
    }
    specs = {"up_kernel": COL, "down_kernel": ROW, "up_bias": P("model"), "down_bias": P()}
    if gated:
        weights.update(gate_kernel=_normal(11, (D, F), 0.3), gate_bias=_normal(12, (F,)))
        specs.update(gate_kernel=COL, gate_bias=P("model"))
    x_spec = XSEQ if sequence_parallel else X

    def body(x, w):
        return tensor_parallel_mlp(
            x, **w, activation=jax.nn.gelu, axis_name="model", megatron_sp=sequence_parallel, collective=collective
        )

    got = output_and_grads(sharded(body, mesh_name, (x_spec, specs), x_spec), (x, weights), cotangent)
    expected = output_and_grads(lambda x, w: mlp_reference(x, **w, activation=jax.nn.gelu), (x, weights), cotangent)
    out, dx, dw = got[0], got[1], got[2]
    assert_matches([out, dx], expected[:2], ["out", "dx"])
    assert_matches([dw[k] for k in sorted(dw)], [expected[2][k] for k in sorted(dw)], [f"d{k}" for k in sorted(dw)])


@pytest.mark.parametrize("mesh_name", sorted(MESHES))
def test_collective_matmuls_equal_the_collectives_they_overlap(mesh_name):
    x_seq, x_feat = _normal(13, (B, T, D)), _normal(14, (B, T, F))
    w_col, w_row = _normal(15, (D, F)), _normal(16, (F, D))

    def gathered(x, w):
        return jnp.matmul(jax.lax.all_gather(x, "model", axis=1, tiled=True), w)

    def scattered(x, w):
        return jax.lax.psum_scatter(jnp.matmul(x, w), "model", scatter_dimension=1, tiled=True)

    pairs = [
        (lambda x, w: all_gather_matmul(x, w, axis_name="model"), gathered, (x_seq, w_col), (XSEQ, COL), XFEAT),
        (lambda x, w: matmul_reduce_scatter(x, w, axis_name="model"), scattered, (x_feat, w_row), (XFEAT, ROW), XSEQ),
    ]
    for overlapped, plain, args, in_specs, out_spec in pairs:
        run = jax.jit(sharded(overlapped, mesh_name, in_specs, out_spec), compiler_options=FAST_COMPILE)
        want = jax.jit(sharded(plain, mesh_name, in_specs, out_spec), compiler_options=FAST_COMPILE)
        np.testing.assert_allclose(np.asarray(run(*args)), np.asarray(want(*args)), rtol=1e-5, atol=1e-5)


def _dot_types(hlo):
    """The result type of every dot in compiled HLO text, e.g. ['bf16', 'f32']."""
    return re.findall(r"= (\w+)\[[^\]]*\]\S* dot\(", hlo)


@functools.cache
def _bf16_dots_stay_bf16():
    """Whether this XLA:CPU runs a plain bfloat16 matmul in bfloat16 (JAX 0.12's does;
    JAX 0.10's runs every bf16 dot in float32)."""
    x = jnp.ones((8, 8), jnp.bfloat16)
    return _dot_types(jax.jit(jnp.matmul).lower(x, x).compile(FAST_COMPILE).as_text()) == ["bf16"]


@pytest.mark.parametrize("case", ["column", "row"])
def test_bfloat16_weight_gradients_run_in_bfloat16(case):
    """A bf16 kernel's forward and backward compile to bf16 dots only, on data=2,model=4
    (x split over data, so d(kernel) is summed over it). The weight gradient written as
    x^T materialised, then a 2-D dot (before) came out as a float32 dot with both
    operands upcast: XLA's float normalisation refused the transposed x's layout."""
    if not _bf16_dots_stay_bf16():
        pytest.skip("this XLA:CPU runs every bfloat16 dot in float32")
    body, x_shape, w_shape, x_spec, w_spec, _, out_spec = DENSE_CASES[case]
    f = sharded(lambda x, w: body(x, w, None), "data2-model4", (x_spec, w_spec), out_spec)
    x, w = _normal(1, x_shape).astype(jnp.bfloat16), _normal(2, w_shape, 0.3)

    def loss(x, w):  # f32 weights cast to the compute dtype, as mixed precision does
        return jnp.sum(f(x, w.astype(jnp.bfloat16)).astype(jnp.float32) ** 2)

    hlo = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(x, w).compile(FAST_COMPILE).as_text()
    assert _dot_types(hlo) == ["bf16"] * 3, _dot_types(hlo)  # y, d(x), d(kernel)


def test_an_axis_of_one_device_emits_no_collective():
    """Over model=1 the all-gathers, reduce-scatters, psums and ring hops are skipped (XLA
    would keep them as copies); the numbers are the one-device ones. ``row`` is left out:
    a kernel split over a size-1 axis varies over it, and JAX's types need the psum."""
    cases = {name: case for name, case in DENSE_CASES.items() if name != "row"}
    cases["row, nothing split"] = (DENSE_CASES["row"][0], (B, T, F), (F, D), X, P(), P(), X)
    for name, (body, x_shape, w_shape, x_spec, w_spec, b_spec, out_spec) in cases.items():
        args = (_normal(1, x_shape), _normal(2, w_shape, 0.3), _normal(3, w_shape[1:]))
        f = jax.jit(sharded(body, "data4-model1", (x_spec, w_spec, b_spec), out_spec))
        hlo = f.lower(*args).compile(FAST_COMPILE).as_text()
        assert parse_collectives(hlo) == [], (name, [op.kind for op in parse_collectives(hlo)])
        np.testing.assert_allclose(
            np.asarray(f(*args)), dense_reference(*args[:2], bias=args[2]), rtol=1e-5, atol=1e-5, err_msg=name
        )


def test_divisibility_errors_name_the_numbers():
    check_divisible(32, axis_size=8)
    with pytest.raises(ValueError, match="hidden features 30 is not divisible by the 'model' mesh axis of size 4"):
        check_divisible(30, axis_size=4, what="hidden features")
    f = sharded(
        lambda x: matmul_reduce_scatter(x, jnp.ones((F // 4, D)), axis_name="model"), "data2-model4", (XFEAT,), XSEQ
    )
    with pytest.raises(ValueError, match="sequence length 10 is not divisible by the 'model' mesh axis of size 4"):
        jax.eval_shape(f, jax.ShapeDtypeStruct((B, 10, F), jnp.float32))


def test_kernel_shard_that_does_not_fit_the_input_is_named():
    f = sharded(lambda x, w: column_parallel_matmul(x, w, axis_name="model"), "data2-model4", (XFEAT, COL), XFEAT)
    with pytest.raises(ValueError, match=r"input features 2 on this shard do not match the kernel shard \(8, 8\)"):
        jax.eval_shape(f, jax.ShapeDtypeStruct((B, T, D), jnp.float32), jax.ShapeDtypeStruct((D, F), jnp.float32))


def test_collective_needs_sequence_parallel():
    with pytest.raises(ValueError, match="needs megatron_sp=True"):
        tensor_parallel_mlp(
            jnp.ones((B, T, D)),
            up_kernel=None,
            down_kernel=None,
            activation=jax.nn.gelu,
            axis_name="model",
            collective=True,
        )
