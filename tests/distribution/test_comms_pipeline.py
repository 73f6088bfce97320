"""``comms_report`` on the pipeline kernel (``zoo.kernels.pipeline``) under shard_map,
forward and backward: the stage loop's collective-permutes are counted with the loop's
trip count, R*M + S - 1 ticks forward and as many backward, each one micro-batch's
activations (b, T, C); the planner's analytic figure (``zoo.planning.analytic.pipeline_figures``)
is the same. (The pipelined GPT's whole fit step, by ``zoo plan``, shows the same
counts: docs/planning.md.)"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from zoo.kernels.pipeline import num_ticks, pipeline
from zoo.measure.comms_report import FAST_COMPILE, comms_report
from zoo.planning import PlanRequest
from zoo.planning.analytic import pipeline_figures
from zoo.planning.search import Candidate

STAGES, B, T, C, LAYERS = 4, 16, 8, 32, 8  # mesh data=2,stage=4; a global batch of 16


def _stage_fn(group_params, x, extras, group):
    def block(h, w):  # one "block": h @ w, w [C, C]
        return jnp.tanh(jnp.einsum("btc,cd->btd", h, w)), None

    return jax.lax.scan(block, x, group_params["w"])[0]


def _loss(params, x, repeats, mesh):
    """Sum of the pipeline's outputs; x [M, b, T, C] split over data on dimension 1."""

    def body(params, x):
        y, _ = pipeline(_stage_fn, params, x, axis_name="stage", repeats=repeats)
        return y

    run = jax.shard_map(body, mesh=mesh, in_specs=(P(None, "stage"), P(None, "data")), out_specs=P(None, "data"))
    return run(params, x).sum()


@pytest.mark.parametrize("micro_batches, repeats", [(4, 1), (4, 2)])
def test_pipeline_permutes_are_counted_per_tick_forward_and_backward(micro_batches, repeats):
    mesh = Mesh(np.array(jax.devices()).reshape(2, STAGES), ("data", "stage"))
    params = {
        "w": jnp.ones((repeats, LAYERS // repeats, C, C), jnp.float32) / C
    }  # (R, L/R, C, C): L/(S*R) blocks per stage and repeat
    x = jnp.ones((micro_batches, B // micro_batches, T, C), jnp.float32)
    loss = functools.partial(_loss, repeats=repeats, mesh=mesh)
    report = comms_report(jax.grad(loss), params, x, mesh=mesh, compiler_options=FAST_COMPILE)
    ticks = num_ticks(num_stages=STAGES, micro_batches=micro_batches, repeats=repeats)
    micro_bytes = B // (2 * micro_batches) * T * C * 4  # one micro-batch's rows on one data shard: f32[b/2, T, C]
    rows = {(row["axes"], row["kind"]): row for row in report.per_axis()}
    permutes = rows[(("stage",), "collective-permute")]
    assert report.exact
    assert permutes["count"] == 2 * ticks  # forward, and its transpose in the backward loop
    assert permutes["bytes"] == permutes["sent_bytes"] == 2 * ticks * micro_bytes
    request = PlanRequest(
        "pretrain_gpt",
        {"config_name": "gpt_tiny", "sequence_length": T, "precision": "float32"},
        devices=8,
        device="cpu",
    )
    candidate = Candidate(
        "pipeline", f"data=2,stage={STAGES}", "none", B, 1, micro_batches=micro_batches, repeats=repeats
    )
    figures = pipeline_figures(candidate, request)  # gpt_tiny's C is 32, as here
    assert (figures["ticks"], figures["sent"]) == (ticks, permutes["sent_bytes"])
    assert figures["useful"] == repeats * micro_batches / ticks
