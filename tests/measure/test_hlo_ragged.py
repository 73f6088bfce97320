"""The HLO parser reads ragged-all-to-all (the MoE's ragged exchange): its receive buffer,
its send buffer and so the most a device sends, in a TPU compiler's text (copied from
the fit step recipes/tpu-v5e-8/moe_exchange_aot.py compiled for v5e:2x4) and in the
program the ragged MoE kernel lowers to here (XLA:CPU cannot compile the op)."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from zoo.kernels import moe
from zoo.measure.hlo import CommsReport, MemoryUsage, parse_collectives

# The dispatch of one MoE block as the TPU compiler prints it (trimmed): operands
# untyped, tiled layouts; the send buffer's type is that of the instruction defining it.
# In a loop of 3 trips, beside a fixed all-to-all of the counts.
TPU_HLO = """HloModule jit_train_step, num_partitions=8

%body (p: (s32[], f32[1024,1,256])) -> (s32[], f32[1024,1,256]) {
  %p = (s32[], f32[1024,1,256]{2,1,0}) parameter(0)
  %copy.386 = f32[1024,1,256]{2,1,0:T(1,128)S(1)} copy(%gte.1)
  %buffer.77 = f32[4096,1,256]{2,1,0:T(1,128)S(1)} broadcast(%zero), dimensions={}
  %all_to_all.81 = s32[4,1,2]{2,1,0:T(1,128)S(1)} all-to-all(%bitcast.690), channel_id=1, replica_groups={{0,1,2,3},{4,5,6,7}}, dimensions={0}
  %ragged_all_to_all.78 = f32[4096,1,256]{2,1,0:T(1,128)S(1)} ragged-all-to-all(%copy.386, %buffer.77, %bitcast_subtract_fusion.3, %copy-done.191, %get-tuple-element.1546, /*index=5*/%copy-done.210), channel_id=1, replica_groups={{0,1,2,3},{4,5,6,7}}, backend_config={"flag_configs":[],"collective_algorithm_config":{"emitter":"RaggedAllToAllEmitter"}}
  ROOT %t = (s32[], f32[1024,1,256]) tuple(%i, %copy.386)
}

ENTRY %main (x: f32[1024,1,256]) -> f32[1024,1,256] {
  %loop = (s32[], f32[1024,1,256]) while(%t0), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"3"}}
  ROOT %r = f32[1024,1,256] get-tuple-element(%loop), index=1
}
"""


def _mesh():
    return Mesh(np.array(jax.devices()).reshape(2, 4), ("data", "expert"))


def test_a_ragged_all_to_all_is_read_with_its_receive_and_send_buffers():
    ops = parse_collectives(TPU_HLO, _mesh())
    assert [(op.kind, op.axes, op.executions) for op in ops] == [
        ("all-to-all", ("expert",), 3),
        ("ragged-all-to-all", ("expert",), 3),
    ]  # not also read as an all-to-all
    ragged = ops[1]
    assert (ragged.shape, ragged.group_size, ragged.buffers) == ("f32[4096,1,256]", 4, 1)
    assert ragged.bytes == 4096 * 256 * 4  # the receive buffer: the most a device can receive
    assert ragged.operand_bytes == 1024 * 256 * 4  # the send buffer, from %copy.386's type
    assert ragged.sent_bytes == 1024 * 256 * 4  # a bound: every row of the send buffer to another device
    report = CommsReport(ops, MemoryUsage(0, 0, 0, 0), {"data": 2, "expert": 4})
    assert report.sent_bytes("ragged-all-to-all", "expert") == 3 * 1024 * 256 * 4
    assert report.total_bytes("ragged-all-to-all") == 3 * 4096 * 256 * 4
    assert report.count("all-to-all") == 3  # the counts' exchange only
    unknown = TPU_HLO.replace("  %copy.386 = f32[1024,1,256]{2,1,0:T(1,128)S(1)} copy(%gte.1)\n", "")
    assert parse_collectives(unknown)[1].sent_bytes == 4096 * 256 * 4  # send buffer not in the text: the receive buffer


def test_the_ragged_kernels_forward_and_backward_have_four_ragged_exchanges():
    """Lowered (XLA:CPU has no ragged-all-to-all to compile): dispatch and combine, and
    their transposes in the backward, each a ragged-all-to-all over the 4 devices, the
    dispatch receiving into N_e x N x min(k, E_l) rows and the combine into N x k."""
    n, c, f, e, k, axis = 16, 8, 16, 8, 2, 4
    mesh = Mesh(np.array(jax.devices()[:axis]), ("expert",))
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((axis * n, c)), jnp.float32)
    ids = jnp.asarray(rng.integers(0, e, (axis * n, k)), jnp.int32)
    weights = jnp.full((axis * n, k), 0.5, jnp.float32)
    experts = [jnp.ones(shape, jnp.float32) for shape in ((e, c, f), (e, c, f), (e, f, c))]

    def body(x, weights, ids, gate, up, down):
        return moe.ragged_expert_parallel_moe(
            x, weights, ids, expert_gate=gate, expert_up=up, expert_down=down,
            axis_name="expert", axis_size=axis, num_experts=e,
        )[0]  # fmt: skip

    layer = jax.shard_map(body, mesh=mesh, in_specs=(P("expert"),) * 6, out_specs=P("expert"))
    loss = lambda x, *rest: jnp.sum(layer(x, *rest) ** 2)  # noqa: E731
    text = jax.jit(jax.grad(loss)).lower(x, weights, ids, *experts).as_text(dialect="hlo")
    ragged = [op for op in parse_collectives(text, mesh) if op.kind == "ragged-all-to-all"]
    received, returned = axis * n * min(k, e // axis), n * k
    assert sorted((op.bytes // (c * 4), op.operand_bytes // (c * 4)) for op in ragged) == sorted(
        [(received, returned), (returned, received)] * 2
    )  # (receive rows, send rows): dispatch and the combine's transpose; combine and the dispatch's transpose
    assert {op.axes for op in ragged} == {("expert",)}
