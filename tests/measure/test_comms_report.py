"""The collectives/memory report: HLO parsing, a program with known collectives, train steps, ``zoo comms``."""

import argparse

import jax
import jax.numpy as jnp
import keras
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from zoo.cli import comms
from zoo.distribution import CheckedModelParallel, make_mesh
from zoo.layers.parallel_mlp import ParallelMLP
from zoo.measure.comms_report import (
    FAST_COMPILE,
    CommsReport,
    MemoryUsage,
    comms_report,
    loop_multiplicities,
    parse_collectives,
    train_step_comms_report,
)
from zoo.planning.comms import CommsSettings, comms_for


def _mesh():
    return Mesh(np.array(jax.devices()).reshape(2, 4), ("data", "model"))


# --- parsing optimised HLO text -------------------------------------------------------

HLO = """HloModule jit_step, num_partitions=8
  %ar = (f32[2,16,8]{2,1,0}, bf16[4]{0}) all-reduce(%a, %b), channel_id=1, replica_groups={{0,1,2,3},{4,5,6,7}}, use_global_device_ids=true, to_apply=%add
  %ag = f32[4,16]{1,0} all-gather(%c), channel_id=2, replica_groups=[2,4]<=[8], dimensions={1}, use_global_device_ids=true
  %rs = f32[4,4]{1,0} reduce-scatter(%d), channel_id=3, replica_groups=[4,2]<=[2,4]T(1,0), dimensions={1}, to_apply=%add
  %ar2 = f32[] all-reduce(%e), channel_id=4, replica_groups=mesh['axis_0'=2,'axis_1'=4] {'axis_0'}, to_apply=%add
  %ar3 = f32[8]{0} all-reduce(%f), channel_id=5, replica_groups={}, to_apply=%add
  %ar4 = f32[8]{0} all-reduce(%f), channel_id=8, replica_groups=mesh['axis_0'=1,'axis_1'=4,'axis_2'=2], device_ids=([2,4]T(1,0)) {'axis_1'}, to_apply=%add
  %cp = f32[4,4]{1,0} collective-permute(%g), channel_id=6, source_target_pairs={{0,1},{1,2},{2,3},{3,0},{4,5},{5,6},{6,7},{7,4}}
  %ags = (f32[4,4]{1,0}, f32[4,16]{1,0}) all-gather-start(%h), channel_id=7, replica_groups={{0,1,2,3},{4,5,6,7}}, dimensions={1}
  %agd = f32[4,16]{1,0} all-gather-done(%ags)
  %dot = f32[4,4]{1,0} dot(%x, %y), lhs_contracting_dims={1}, rhs_contracting_dims={0}
"""


def test_every_kind_and_replica_group_form_is_read():
    ops = {op.name: op for op in parse_collectives(HLO, _mesh())}
    assert list(ops) == ["ar", "ag", "rs", "ar2", "ar3", "ar4", "cp", "ags"]  # -done and non-collectives skipped
    ar = ops["ar"]
    assert (ar.kind, ar.buffers, ar.elements, ar.bytes, ar.axes) == (
        "all-reduce",
        2,
        2 * 16 * 8 + 4,
        4 * 256 + 2 * 4,
        ("model",),
    )
    assert ar.sent_bytes == pytest.approx(2 * 3 / 4 * ar.bytes)  # ring all-reduce: 2 (n-1)/n
    assert ops["ag"].replica_groups == ((0, 1, 2, 3), (4, 5, 6, 7)) and ops["ag"].axes == ("model",)
    assert ops["ag"].bytes == 4 * 64 and ops["ag"].sent_bytes == pytest.approx(3 / 4 * 256)
    # iota with a transpose: the groups run down the columns of the 2 x 4 mesh
    assert ops["rs"].replica_groups == ((0, 4), (1, 5), (2, 6), (3, 7)) and ops["rs"].axes == ("data",)
    assert ops["rs"].bytes == 2 * 4 * 16  # the buffer reduced: result x group size
    assert ops["ar2"].replica_groups == ((0, 4), (1, 5), (2, 6), (3, 7)) and ops["ar2"].axes == ("data",)
    assert ops["ar3"].replica_groups == (tuple(range(8)),) and ops["ar3"].axes == ("data", "model")
    # mesh axes over an iota device order (XLA prints it so from 32 devices up): ids 0 4 1 5 2 6 3 7
    assert ops["ar4"].replica_groups == ((0, 1, 2, 3), (4, 5, 6, 7)) and ops["ar4"].axes == ("model",)
    assert ops["cp"].axes == ("model",) and ops["cp"].sent_bytes == 64
    assert ops["ags"].kind == "all-gather" and ops["ags"].shape == "f32[4,16]"  # the output, not the input


def test_without_a_mesh_axes_are_unknown_and_odd_formats_are_refused():
    assert {op.axes for op in parse_collectives(HLO)} == {None}
    with pytest.raises(ValueError, match="unrecognised replica_groups format"):
        parse_collectives("  %x = f32[2] all-reduce(%a), replica_groups=mesh['a'=8] {'a':(1)2}, to_apply=%add\n")


LOOP_HLO = """\
%body (p: (s32[], f32[4])) -> (s32[], f32[4]) {
  %p = (s32[], f32[4]) parameter(0)
  %hop = f32[4]{0} collective-permute(%x), channel_id=1, source_target_pairs={{0,1},{1,0}}
}

%cond (p: (s32[], f32[4])) -> pred[] {
  %lt = pred[] compare(%a, %b), direction=LT
}

ENTRY %main (x: f32[4]) -> f32[4] {
  %loop = (s32[], f32[4]) while(%t), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"7"}}
  %last = f32[4]{0} collective-permute(%y), channel_id=2, source_target_pairs={{0,1},{1,0}}
}
"""


def test_loop_multiplicities_follow_known_trip_counts():
    times, lower_bounds = loop_multiplicities(LOOP_HLO)
    assert (times["hop"], times["last"], times["loop"], lower_bounds) == (7, 1, 1, set())
    times, lower_bounds = loop_multiplicities(LOOP_HLO.replace(', backend_config={"known_trip_count":{"n":"7"}}', ""))
    assert (times["hop"], lower_bounds) == (1, {"p", "hop"})


def test_collectives_in_loops_count_once_per_trip_and_unknown_trips_give_a_lower_bound():
    memory = MemoryUsage(None, None, None, None)
    report = CommsReport(parse_collectives(LOOP_HLO), memory, {})
    assert [(op.name, op.executions, op.exact) for op in report.collectives] == [("hop", 7, True), ("last", 1, True)]
    assert (report.count(), report.instructions(), report.sent_bytes(), report.exact) == (8, 2, 8 * 16, True)
    assert report.per_axis() == [
        {"axes": None, "kind": "collective-permute", "count": 8, "bytes": 8 * 16, "sent_bytes": 8 * 16.0}
    ]
    unknown = CommsReport(
        parse_collectives(LOOP_HLO.replace(', backend_config={"known_trip_count":{"n":"7"}}', "")), memory, {}
    )
    assert (unknown.count(), unknown.total_bytes(), unknown.exact) == (2, 2 * 16, False)
    text = "\n".join(unknown.format())
    assert "lower bound: a loop around a collective has no known trip count" in text
    assert "total over ?: 2 collective(s), 32 B sent per device (lower bound)" in text


# --- compiled programs ------------------------------------------------------------------


def test_a_collective_in_a_fori_loop_counts_once_per_trip():
    """A ring of 8 ppermute hops in a fori_loop: one instruction in a while body that XLA
    knows runs 8 times; each device sends its f32[2] block 8 times and sums every block."""
    mesh = Mesh(np.array(jax.devices()), ("ring",))

    def body(x):  # one shard: f32[2]
        def hop(_, carry):
            total, block = carry
            block = jax.lax.ppermute(block, "ring", [(i, (i + 1) % 8) for i in range(8)])
            return total + block, block

        return jax.lax.fori_loop(0, 8, hop, (jnp.zeros_like(x), x))[0]

    f = jax.shard_map(body, mesh=mesh, in_specs=P("ring"), out_specs=P("ring"))
    x = jax.device_put(jnp.arange(16.0), NamedSharding(mesh, P("ring")))
    report = comms_report(f, x, mesh=mesh, compiler_options=FAST_COMPILE)
    [op] = report.collectives
    assert (op.kind, op.axes, op.bytes, op.executions, report.exact) == ("collective-permute", ("ring",), 8, 8, True), (
        "\n".join(report.format())
    )
    assert (report.instructions(), report.count(), report.count("collective-permute", "ring")) == (1, 8, 8)
    assert report.sent_bytes() == 8 * op.sent_bytes == 8 * 8 and report.total_bytes() == 64
    assert report.per_axis() == [
        {"axes": ("ring",), "kind": "collective-permute", "count": 8, "bytes": 64, "sent_bytes": 64.0}
    ]
    text = "\n".join(report.format())
    assert (
        "| collective-permute | ring | 8 | f32[2] | 8 B | 64 B |" in text
        and "total over ring: 8 collective(s), 64 B sent per device" in text
    )
    np.testing.assert_allclose(
        np.asarray(report.compiled(x)), np.tile([56.0, 64.0], 8)
    )  # sums of the even, odd elements


def test_a_program_with_known_collectives():
    mesh = _mesh()

    def body(x):  # one shard: f32[4, 4]
        a = jax.lax.psum(x, "data")
        b = jax.lax.all_gather(a, "model", axis=1, tiled=True)  # f32[4, 16]
        c = jax.lax.psum_scatter(b * 2, "model", scatter_dimension=1, tiled=True)  # f32[4, 4]
        return jax.lax.ppermute(c, "model", [(i, (i + 1) % 4) for i in range(4)])

    f = jax.shard_map(body, mesh=mesh, in_specs=P("data", "model"), out_specs=P("data", "model"))
    x = jax.device_put(jnp.arange(128.0).reshape(8, 16), NamedSharding(mesh, P("data", "model")))
    report = comms_report(f, x, mesh=mesh, compiler_options=FAST_COMPILE)
    assert [(op.kind, op.axes, op.elements) for op in report.collectives] == [
        ("all-reduce", ("data",), 16),
        ("all-gather", ("model",), 64),
        ("reduce-scatter", ("model",), 64),
        ("collective-permute", ("model",), 16),
    ], "\n".join(report.format())
    assert report.memory.argument_bytes == 4 * 16 and report.memory.output_bytes == 4 * 16  # f32[4, 4] each
    assert report.memory.peak_bytes >= 128
    assert report.mesh_axes == {"data": 2, "model": 4}
    text = "\n".join(report.format())
    assert "| all-gather | model | 1 | f32[4,16] | 256 B | 192 B | {0,1,2,3},{4,5,6,7} |" in text
    assert "total over model: 3 collective(s)" in text and "memory per device: arguments 64 B" in text
    np.testing.assert_allclose(np.asarray(report.compiled(x)), np.asarray(jax.jit(f)(x)))


def _tp_model():
    mesh = make_mesh("data=2,model=4")
    keras.distribution.set_distribution(
        CheckedModelParallel(layout_map=keras.distribution.LayoutMap(mesh), batch_dim_name="data")
    )
    model = keras.Sequential([keras.Input((16, 8)), ParallelMLP(32, name="mlp")], name="tp")
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss=keras.losses.MeanSquaredError())
    return model


def test_train_step_of_a_tensor_parallel_mlp():
    """The MLP is the first layer: its input needs no gradient, so the step's only
    activation collective is the forward all-reduce; gradients are summed over data."""
    model = _tp_model()
    x = np.random.default_rng(0).standard_normal((8, 16, 8)).astype("float32")
    report = train_step_comms_report(model, x, x, compiler_options=FAST_COMPILE)
    activations = [op for op in report.select(axes="model") if op.elements > 1]  # not the loss scalar
    assert [(op.kind, op.elements) for op in activations] == [("all-reduce", 4 * 16 * 8)], "\n".join(report.format())
    gradients = report.select("all-reduce", "data")
    assert sum(op.elements for op in gradients) >= sum(
        int(np.prod(v.value.addressable_shards[0].data.shape)) for v in model.trainable_variables
    )


def test_train_step_needs_a_compiled_model():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)], name="bare")
    with pytest.raises(ValueError, match="model 'bare' is not compiled"):
        train_step_comms_report(model, np.ones((2, 4)), np.ones((2, 2)))


# --- zoo comms ----------------------------------------------------------------------------


def _run(argv, capsys):
    parser = argparse.ArgumentParser()
    comms.add_arguments(parser)
    assert comms.run(parser.parse_args(argv)) == 0
    return capsys.readouterr().out


def test_zoo_comms_mlp_sequence_parallel(capsys):
    small = ["--batch-size", "4", "--sequence-length", "16", "--dim", "8", "--hidden", "32"]
    out = _run(
        ["mlp", "--mesh", "data=2,model=4", "--megatron-sp", "--step", "forward", "--fast-compile", *small], capsys
    )
    assert "MLP (explicit, sequence-parallel)" in out and "mesh data=2,model=4" in out
    assert "| all-gather | model | 1 | f32[2,16,8] | 1.0 KiB | 768 B | {0,1,2,3},{4,5,6,7} |" in out
    assert "| reduce-scatter | model | 1 | f32[2,4,8] | 1.0 KiB | 768 B |" in out
    assert "total over model: 2 collective(s), 1.5 KiB sent per device" in out
    assert keras.distribution.distribution() is None


def test_zoo_comms_cnn_model_parallel_train_step(capsys):
    out = _run(["cnn", "--layout", "model", "--mesh", "data=2,model=4", "--image-size", "8", "--fast-compile"], capsys)
    assert "SmallCNN, layout model" in out and "step train" in out
    assert "| all-reduce | data |" in out  # gradients of the data-parallel replicas
    assert "total over model:" in out and "memory per device: arguments" in out


def test_zoo_comms_rejects_contradictory_options():
    with pytest.raises(ValueError, match="--collective-matmul is a feature of the explicit implementation"):
        comms_for(CommsSettings(implementation="gspmd", megatron_sp=True, collective_matmul=True))
