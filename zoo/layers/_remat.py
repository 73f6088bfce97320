"""What a Transformer block keeps for its backward pass: the ``remat`` choices
(``zoo.config.choices.REMATS``) and the ``jax.checkpoint`` policy of each."""

import jax

from zoo.config.choices import ATTENTION_OUT, ATTENTION_QKV, REMATS

# remat value -> what jax.checkpoint keeps from the forward pass for the backward pass
REMAT_POLICIES = {
    "full": jax.checkpoint_policies.nothing_saveable,  # the block's inputs only: recompute everything
    # "save matmuls": the outputs of the weight matmuls (q, k, v, output, MLP projections).
    # Not jax's dots_saveable, which also saves the batched matmuls *inside* the attention
    # kernel: the blockwise kernel's score tiles, O(T^2) stacked over its loop (at gpt_1b's
    # shape 2,864 MiB per block, more than the 1,874 MiB of no remat; this policy 560 MiB).
    "dots_saveable": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    # the attention's q, k, v and its kernel's output and log-sum-exp: the backward pass
    # never re-runs the attention kernel, only the output projection, norms and MLP
    "save_attention": jax.checkpoint_policies.save_only_these_names(ATTENTION_QKV, ATTENTION_OUT),
    # the same tensors, held in the host's memory between the passes (memory kind
    # pinned_host): the device keeps what "full" keeps, the backward pass what
    # "save_attention" keeps, for the copies' time
    "offload_attention": jax.checkpoint_policies.save_and_offload_only_these_names(
        names_which_can_be_saved=[],
        names_which_can_be_offloaded=[ATTENTION_QKV, ATTENTION_OUT],
        offload_src="device",
        offload_dst="pinned_host",
    ),
}
assert REMATS == ("none", *REMAT_POLICIES), "remat 'none' (every activation kept) and one jax policy per other choice"


def check_remat(remat):
    """``remat`` as one of ``REMATS`` (None means ``"none"``); anything else raises naming it."""
    if remat is None:
        return "none"
    if not isinstance(remat, str) or remat not in REMATS:
        raise ValueError(f"remat must be one of {list(REMATS)} (or None for 'none'), got {remat!r}")
    return remat
